"""A sweep's report: ``runs/<sweep>/report.md``, ``report.csv`` and PNG plots.

- one row per point (a combination of axis values): seeds finished / total,
  diverged count, final eval metrics as mean +- std over seeds, tokens/s,
  wall time;
- per axis, each value's difference from the axis's base value (the value
  the base config has) within each combination of the other axes, with a
  95% Welch t interval over seeds (``stats.welch_interval``); the best value
  per metric is marked only where it is distinguishable from the runner-up;
- loss curves per axis, the length-extrapolation table (position sweeps) and
  per-layer gradient norms near initialisation (runs with
  ``train.log_layer_stats``);
- the command that reproduces the sweep.

Everything below ``write_report`` is a pure function of ``collect.collect``'s
output.
"""

from __future__ import annotations

import csv
import math
import pathlib
from typing import Any, Sequence

from tfx_jax.report import collect as collect_lib
from tfx_jax.report import stats
from tfx_jax.report.points import (context_label, contexts, group_points,
                                    value_label)

LOWER_IS_BETTER = ("loss", "perplexity", "nll", "ppl")
METRIC_ORDER = ("eval/loss", "eval/perplexity", "eval/accuracy", "eval/bleu", "train/nll")


def lower_is_better(metric: str) -> bool:
  return any(word in metric for word in LOWER_IS_BETTER)






def run_metrics(summary: dict[str, Any]) -> dict[str, float]:
  """Final metrics of one run, length extrapolation included as ``ppl@Kx``."""
  out = {k: v for k, v in summary["final"].items() if v is not None and math.isfinite(v)}
  for k, ppl in summary["lengths"].items():
    if ppl is not None:
      out[f"ppl@{k}x"] = ppl
  return out


def metric_names(summaries: Sequence[dict[str, Any]]) -> list[str]:
  names = {m for s in summaries for m in run_metrics(s)}
  ordered = [m for m in METRIC_ORDER if m in names]
  rest = sorted(n for n in names if n not in METRIC_ORDER and not n.startswith("ppl@"))
  ppl = sorted((n for n in names if n.startswith("ppl@")), key=lambda n: int(n[4:-1]))
  return ordered + rest + ppl






def finished_values(runs, metric: str) -> list[float]:
  return [run_metrics(s)[metric] for _, s in runs
          if s["state"] == "finished" and metric in run_metrics(s)]


def _pm(values: Sequence[float], digits: int = 4) -> str:
  if not values:
    return "-"
  mean, std = stats.mean_std(values)
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


# ------------------------------------------------------------------ tables
def points_table(record, points, metrics) -> list[list[str]]:
  head = [a["label"] for a in record["axes"]] + ["seeds", "diverged", *metrics,
                                                 "tokens/s", "wall s/run"]
  rows = [head]
  for key, runs in points.items():
    finished = sum(s["state"] == "finished" for _, s in runs)
    diverged = sum(s["state"] == "diverged" for _, s in runs)
    tps = [s["tokens_per_sec"] for _, s in runs if s["tokens_per_sec"]]
    wall = [s["wall_seconds"] for _, s in runs if s["wall_seconds"]]
    rows.append([value_label(a["values"][i]) for a, i in zip(record["axes"], key)]
                + [f"{finished}/{len(runs)}", str(diverged)]
                + [_pm(finished_values(runs, m)) for m in metrics]
                + [f"{stats.mean_std(tps)[0]:,.0f}" if tps else "-",
                   f"{stats.mean_std(wall)[0]:.0f}" if wall else "-"])
  return rows






def axis_comparisons(record, points, metrics) -> list[dict[str, Any]]:
  """Per axis, context, value and metric: the Welch interval against the base value.

  Each row: axis, context, value, reference, metric, interval (None for the
  reference itself), n, n_ref, best (the best mean in its context and
  distinguishable from the runner-up).
  """
  out = []
  for ai, axis in enumerate(record["axes"]):
    if len(axis["values"]) < 2:
      continue
    ref = axis["reference"]
    for ctx in contexts(record, ai):
      def runs_at(vi):
        key = tuple(vi if j == ai else c for j, c in enumerate(ctx))
        return points.get(key, [])
      for metric in metrics:
        samples = {vi: finished_values(runs_at(vi), metric)
                   for vi in range(len(axis["values"]))}
        ranked = sorted((vi for vi in samples if samples[vi]),
                        key=lambda vi: stats.mean_std(samples[vi])[0],
                        reverse=not lower_is_better(metric))
        best = None
        if len(ranked) >= 2 and stats.welch_interval(
            samples[ranked[0]], samples[ranked[1]]).excludes_zero():
          best = ranked[0]
        for vi in range(len(axis["values"])):
          interval = (None if vi == ref or not samples[vi] or not samples[ref]
                      else stats.welch_interval(samples[vi], samples[ref]))
          out.append({"axis": axis["label"], "axis_index": ai, "context": ctx,
                      "value": vi, "reference": ref, "metric": metric,
                      "interval": interval, "n": len(samples[vi]),
                      "n_ref": len(samples[ref]), "best": vi == best,
                      "diverged": sum(s["state"] == "diverged" for _, s in runs_at(vi))})
  return out


def comparison_cell(row) -> str:
  if row["n"] == 0:
    return "diverged" if row["diverged"] else "-"
  if row["value"] == row["reference"]:
    cell = "base"
  elif row["interval"] is None:
    cell = "-"
  else:
    iv = row["interval"]
    if iv.known:
      mark = " ✓" if iv.excludes_zero() else ""
      cell = f"{iv.diff:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]{mark}"
    else:
      cell = f"{iv.diff:+.4f} (1 seed)"
  return f"**{cell} best**" if row["best"] else cell


def comparison_tables(record, rows, metrics) -> dict[int, list[list[str]]]:
  """{axis index: table} with one row per (context, value), one column per metric."""
  tables: dict[int, list[list[str]]] = {}
  cells: dict[tuple, dict[str, str]] = {}
  for row in rows:
    cells.setdefault((row["axis_index"], row["context"], row["value"]), {})[
        row["metric"]] = comparison_cell(row)
  for (ai, ctx, vi), by_metric in cells.items():
    axis = record["axes"][ai]
    table = tables.setdefault(ai, [["context", axis["label"]] +
                                   [f"Δ {m} [95% CI]" for m in metrics]])
    table.append([context_label(record, ctx, ai), value_label(axis["values"][vi])]
                 + [by_metric.get(m, "-") for m in metrics])
  return tables


def lengths_table(record, points) -> list[list[str]] | None:
  multiples = sorted({k for runs in points.values() for _, s in runs for k in s["lengths"]})
  if not multiples:
    return None
  rows = [[a["label"] for a in record["axes"]] + [f"{k}x" for k in multiples]]
  for key, runs in points.items():
    cells = []
    for k in multiples:
      vals = [s["lengths"][k] for _, s in runs if s["lengths"].get(k) is not None]
      cells.append(_pm(vals, 2) if vals else "n/a")
    rows.append([value_label(a["values"][i]) for a, i in zip(record["axes"], key)] + cells)
  return rows


def layer_table(record, points, kind: str = "grad_norm") -> list[list[str]] | None:
  layers = sorted({k for runs in points.values() for _, s in runs
                   for k in s["layer_stats"].get(kind, {})})
  if not layers:
    return None
  rows = [[a["label"] for a in record["axes"]] + [f"{st} {i}" for st, i in layers]]
  for key, runs in points.items():
    cells = []
    for layer in layers:
      vals = [s["layer_stats"][kind][layer] for _, s in runs
              if layer in s["layer_stats"].get(kind, {})]
      cells.append(f"{stats.mean_std(vals)[0]:.3g}" if vals else "-")
    rows.append([value_label(a["values"][i]) for a, i in zip(record["axes"], key)] + cells)
  return rows


def markdown_table(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines)


# ------------------------------------------------------------------ output
def write_csv(path: pathlib.Path, record, summaries, metrics) -> None:
  fields = [f for a in record["axes"] for f in a["fields"]]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "seed", *fields, "state", "step", *metrics, "tokens_per_sec",
                "wall_seconds", "compile_seconds"])
    for entry in record["runs"]:
      s = summaries[entry["name"]]
      values = {k: v for value in entry["values"] for k, v in value.items()}
      m = run_metrics(s)
      w.writerow([entry["name"], entry["seed"], *[values.get(f, "") for f in fields],
                  s["state"], s["step"], *[m.get(k, "") for k in metrics],
                  s["tokens_per_sec"] or "", s["wall_seconds"] or "",
                  s["compile_seconds"] if s["compile_seconds"] is not None else ""])


def render(record, summaries, plots: dict[str, str]) -> str:
  """The report's markdown."""
  points = group_points(record, summaries)
  metrics = metric_names(list(summaries.values()))
  states: dict[str, int] = {}
  for s in summaries.values():
    states[s["state"]] = states.get(s["state"], 0) + 1
  base = " ".join(f"--config.{k}={v}" for k, v in record["overrides"].items())
  out = [f"# Sweep `{record['name']}`", ""]
  if record.get("description"):
    out += [record["description"], ""]
  out += ["Reproduce:", "", "```bash", record["command"], "```", "",
          f"Base: `{record['config']}` {('`' + base + '`') if base else ''}", "",
          f"{len(record['runs'])} runs: " + ", ".join(f"{n} {k}" for k, n in states.items())
          + f"; seeds {record['seeds']}.", "", "## Results per point", "",
          "Final evaluation metrics, mean ± standard deviation over the finished seeds "
          "(diverged runs are counted, not averaged).", "",
          markdown_table(points_table(record, points, metrics)), ""]
  compared = [m for m in metrics if m != "eval/perplexity"]
  rows = axis_comparisons(record, points, compared)
  tables = comparison_tables(record, rows, compared)
  if tables:
    out += ["## Differences from the base value", "",
            "Difference of the mean over seeds (value − base value) within each "
            "combination of the other axes, with a 95% confidence interval from "
            "Welch's unequal-variance t test (Welch–Satterthwaite degrees of freedom; "
            "needs two finished seeds per side). ✓: the interval excludes 0 (an effect, "
            "not seed noise). **best**: the best mean of its context, marked only "
            "where its interval against the runner-up excludes 0.", ""]
    for ai, table in tables.items():
      axis = record["axes"][ai]
      out += [f"### {axis['label']} (base value: "
              f"{value_label(axis['values'][axis['reference']])})", "",
              markdown_table(table), ""]
      if plots.get(f"curves:{ai}"):
        out += [f"![loss curves, {axis['label']}]({plots[f'curves:{ai}']})", ""]
  lengths = lengths_table(record, points)
  if lengths:
    out += ["## Length extrapolation", "",
            "Perplexity on non-overlapping windows of k × the training length "
            "(`python -m tfx_jax.evaluate --lengths`), mean ± std over seeds.", "",
            markdown_table(lengths), ""]
    if plots.get("lengths"):
      out += [f"![length extrapolation]({plots['lengths']})", ""]
  layers = layer_table(record, points)
  if layers:
    out += ["## Gradient norm per layer near initialisation", "",
            "`layer_stats/grad_norm/<stack>_<layer>` at the first logged step, mean "
            "over seeds (Xiong et al. 2020, Figure 3: post-norm's gradients grow "
            "towards the last layers, pre-norm's stay flat).", "",
            markdown_table(layers), ""]
    if plots.get("layers"):
      out += [f"![gradient norm per layer]({plots['layers']})", ""]
  return "\n".join(out)


def write_report(sweep_dir: str | pathlib.Path) -> pathlib.Path:
  """Writes report.md, report.csv and the PNG plots of ``sweep_dir``; returns report.md."""
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel  # matplotlib
  sweep_dir = pathlib.Path(sweep_dir)
  record, summaries = collect_lib.collect(sweep_dir)
  points = group_points(record, summaries)
  metrics = metric_names(list(summaries.values()))
  plots = plots_lib.write_plots(sweep_dir, record, points)
  write_csv(sweep_dir / "report.csv", record, summaries, metrics)
  path = sweep_dir / "report.md"
  path.write_text(render(record, summaries, plots))
  return path
