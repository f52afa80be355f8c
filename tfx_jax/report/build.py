"""A sweep's report: ``runs/<sweep>/report.md``, ``report.json``,
``report.csv`` and PNG plots.

``report.json`` is ``analysis.analyze`` (the numbers: points, chosen tuned
values, outcomes, comparisons with verdicts); ``report.md`` renders it:

- the headline figure (``forest.png``: every comparison, its interval and
  verdict against the equivalence band), or why the sweep has no comparison;
- the verdicts in words;
- one row per point: its chosen tuned values, learned / stalled / diverged
  counts, metrics on the compared split (mean +- std over seeds), tokens/s;
- per tuned value of each point: the selection metric and outcomes;
- learning-rate sensitivity curves and numbers;
- per axis, each value against the axis's base value within each combination
  of the other axes: the method (paired or Welch), the difference with its
  95% interval, the Holm-adjusted p and the verdict;
- the noise floor and the smallest detectable difference per axis; the
  effects against model size where an axis changes it;
- loss curves per axis, the length-extrapolation table (position sweeps) and
  per-layer gradient norms near initialisation (``train.log_layer_stats``);
- the command that reproduces the sweep.

``render`` is one function per section, each reading the typed record
(``sweep_record.SweepRecord``) and report (``schema.Report``). Everything
below ``write_report`` is a pure function of ``collect.collect``'s output and
the datasets' baselines (``baselines``).
"""

from __future__ import annotations

import csv
import math
import pathlib
from typing import Any, Mapping, Sequence

from tfx_jax import files
from tfx_jax.report import analysis
from tfx_jax.report import collect as collect_lib
from tfx_jax.report import stats
from tfx_jax.report.points import Points, at_chosen, fmt_value, group_points, value_label
from tfx_jax.report.schema import Comparison, Counts, Report
from tfx_jax.sweep_record import SweepRecord

METRIC_ORDER = ("eval/loss", "eval/perplexity", "eval/accuracy", "eval/bleu", "train/nll")
lower_is_better = analysis.lower_is_better
Lines = list[str]  # a section of report.md, line by line


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


def _pm(values: Sequence[float], digits: int = 4) -> str:
  if not values:
    return "-"
  mean, std = stats.mean_std(values)
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _fmt(x: float | None, digits: int = 4) -> str:
  return "-" if x is None else f"{x:.{digits}f}"


def _point_cells(record: SweepRecord, key: Sequence[int]) -> list[str]:
  return [value_label(a.values[i], a) for a, i in zip(record.axes, key)]


def _outcome_cells(counts: Counts) -> list[str]:
  return [str(counts.learned), str(counts.stalled), str(counts.diverged)]


# ------------------------------------------------------------------ tables
def lengths_table(record: SweepRecord, points: Points) -> list[list[str]] | None:
  multiples = sorted({k for runs in points.values() for _, s in runs for k in s["lengths"]})
  if not multiples:
    return None
  scaled = any(s.get("scaled_lengths") for runs in points.values() for _, s in runs)
  rows = [[a.label for a in record.axes] + (["positions at evaluation"] if scaled else [])
          + [f"{k}x" for k in multiples]]
  for key, runs in points.items():
    labels = _point_cells(record, key)
    for scaling, table in [("", lambda s: s["lengths"])] + [
        (tag, lambda s, tag=tag: s.get("scaled_lengths", {}).get(tag, {}))
        for tag in sorted({t for _, s in runs for t in s.get("scaled_lengths", {})})]:
      cells = []
      for k in multiples:
        vals = [table(s)[k] for _, s in runs if table(s).get(k) is not None]
        cells.append(_pm(vals, 2) if vals else "n/a")
      # RoPE runs evaluated with scaled positions: a row each, e.g. "yarn-x8-from64".
      how = [scaling.removeprefix("rope-") if scaling else "as trained"] if scaled else []
      rows.append(labels + how + cells)
  return rows


def layer_table(record: SweepRecord, points: Points, kind: str = "grad_norm"
                ) -> list[list[str]] | None:
  layers = sorted({k for runs in points.values() for _, s in runs
                   for k in s["layer_stats"].get(kind, {})})
  if not layers:
    return None
  rows = [[a.label for a in record.axes] + [f"{st} {i}" for st, i in layers]]
  for key, runs in points.items():
    cells = []
    for layer in layers:
      vals = [s["layer_stats"][kind][layer] for _, s in runs
              if layer in s["layer_stats"].get(kind, {})]
      cells.append(f"{stats.mean_std(vals)[0]:.3g}" if vals else "-")
    rows.append(_point_cells(record, key) + cells)
  return rows


def markdown_table(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines)


def points_table(record: SweepRecord, report: Report, points: Points) -> list[list[str]]:
  """One row per point: chosen tuned values, outcomes, compared metrics."""
  metrics = analysis.compared_metrics(report.points, report.select_by)
  tuned = bool(record.tune)
  head = ([a.label for a in record.axes] + (["chosen"] if tuned else [])
          + ["runs", "learned", "stalled", "diverged"]
          + [f"{m} ({report.report_split})" for m in metrics] + ["tokens/s"])
  rows = [head]
  for point in report.points:
    values = {m: [v[m] for v in point.compared.values() if m in v] for m in metrics}
    tps = [s["tokens_per_sec"] for _, s in points.get(point.key, []) if s["tokens_per_sec"]]
    rows.append(list(point.values.values())
                + ([point.chosen_label or "none learned"] if tuned else [])
                + [str(point.runs)] + _outcome_cells(point.counts)
                + [_pm(values[m]) for m in metrics]
                + [f"{stats.mean_std(tps)[0]:,.0f}" if tps else "-"])
  return rows


def tuned_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """Each point at each tuned value: the selection metric (validation)."""
  head = [a.label for a in record.axes] + [
      "tuned", f"{report.select_by} (validation)", "learned", "stalled", "diverged",
      "chosen"]
  rows = [head]
  for point in report.points:
    for row in point.tuned:
      finished = [s.validation.get(report.select_by) for s in row.seeds.values()
                  if s.outcome in ("learned", "stalled")]
      finished = [v for v in finished if v is not None]
      mean = (_fmt(row.selection_mean) if row.selection_mean is not None
              else f"none learned ({_fmt(stats.mean_std(finished)[0])})" if finished
              else "-")
      rows.append(list(point.values.values()) + [row.label, mean]
                  + _outcome_cells(row.counts)
                  + ["✓" if row.label == point.chosen_label else ""])
  return rows


def comparisons_table(rows: Sequence[Comparison]) -> list[list[str]]:
  out = [["context", "value", "metric", "learned / stalled / diverged (value; base)",
          "method", "seeds", "Δ vs base [95% CI]", "adjusted p", "verdict"]]
  counts = lambda c: " / ".join(_outcome_cells(c))
  for r in rows:
    iv = r.interval
    interval = (f"{iv.diff:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]"
                if iv.low is not None else f"{iv.diff:+.4f} (no interval)")
    seeds = str(iv.n_a) if iv.method == "paired" else f"{iv.n_a} / {iv.n_b}"
    out.append([r.context, r.value, r.metric,
                f"{counts(r.counts)}; {counts(r.base_counts)}", iv.method, seeds, interval,
                "-" if r.p_adjusted is None else f"{r.p_adjusted:.3g}",
                f"**{r.verdict}**"])
  return out


def sensitivity_table(report: Report) -> list[list[str]]:
  rows = [["point", "sensitivity", "failed runs", "l0"]]
  for s in report.sensitivity:
    rows.append([", ".join(s.point.values()) or "base",
                 "all failed" if s.all_failed else _fmt(s.sensitivity),
                 str(sum(c.failed for c in s.curve)), _fmt(s.initial_loss, 3)])
  return rows


def noise_table(report: Report) -> list[list[str]]:
  rows = [["axis", "base value", "seeds", "seed std (base point)",
           f"smallest detectable Δ at {report.options.power:.0%} power", "method"]]
  for n in report.noise:
    rows.append([n.axis, n.base_value, str(n.seeds), _fmt(n.base_sd),
                 _fmt(n.min_detectable_difference), n.method or "-"])
  return rows


# ------------------------------------------------------------------ output
def write_csv(path: pathlib.Path, record: SweepRecord, summaries, metrics) -> None:
  fields = [f for a in record.axes for f in a.fields] + list(record.tune)
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "seed", *fields, "state", "step", *metrics, "tokens_per_sec",
                "wall_seconds", "compile_seconds"])
    for entry in record.runs:
      s = summaries[entry.name]
      values = {k: v for value in [*entry.values, entry.tuned] for k, v in value.items()}
      m = run_metrics(s)
      w.writerow([entry.name, entry.seed, *[values.get(f, "") for f in fields],
                  s["state"], s["step"], *[m.get(k, "") for k in metrics],
                  s["tokens_per_sec"] or "", s["wall_seconds"] or "",
                  s["compile_seconds"] if s["compile_seconds"] is not None else ""])


# ---------------------------------------------------------------- sections
def no_comparison(record: SweepRecord) -> str:
  """Why a report has no comparison."""
  if not any(len(a.values) > 1 for a in record.axes):
    return ("no comparison: the sweep has a single point (no axis with two values), so "
            "there is no base to set it against; its numbers are below.")
  return "no comparison has learned runs on both sides yet."


def headline(record: SweepRecord, report: Report, plots: Mapping[str, str]) -> Lines:
  """The forest plot of every comparison and how to read it, or why there is none."""
  if not plots.get("forest"):
    return [f"**{no_comparison(record).capitalize()}**", ""]
  # The selection metric first, then the others by name: the same sweep gives
  # the same text in every process (a set's order follows the hash seed).
  margins = sorted({(r.metric, r.margin) for r in report.comparisons},
                   key=lambda m: (m[0] != report.select_by, m))
  band = ", ".join(f"±{m:g} for {metric}" for metric, m in margins)
  tost = 1.0 - 2.0 * report.options.alpha
  return [f"![every comparison against its base]({plots['forest']})", "",
          f"Each row: a value minus its axis's base on the {report.report_split} split; "
          "the marker is the verdict, thin whiskers the 95% interval, the thick bar the "
          f"{tost:.0%} interval of the equivalence test, shaded the equivalence band "
          f"({band}), faint dots each seed's own difference (paired rows).", ""]


def _design(record: SweepRecord, report: Report) -> str:
  """How the points were chosen and compared, in a paragraph."""
  select_by, split = report.select_by, report.report_split
  if record.tune:
    tuned = ", ".join(f"`{k}` in {list(v)}" for k, v in record.tune.items())
    how = (f"Each point is compared at its own best tuned value ({tuned}), chosen by "
           f"the mean `{select_by}` of its runs on the validation split"
           + (", a stalled or diverged run counted as the loss at initialisation (l0)"
              if analysis.lower_is_better(select_by)
              else ", fewest stalled or diverged runs first"))
    if report.reserved_seed is not None:
      how += (f"; the dataset has no test split, so seed {report.reserved_seed} is "
              "reserved for that choice and the other seeds are compared on validation.")
    else:
      how += "; the comparisons read the test split, which the choice never saw."
  else:
    how = (f"Compared on the {split} split." if report.comparisons
           else f"Metrics on the {split} split.")
  n = len(report.comparisons)
  if n:
    how += (f" {n} comparison{'s form' if n != 1 else ' forms'} one family "
            "(Holm-Bonferroni); verdicts at α = 0.05, equivalence by two one-sided tests "
            "within the margin.")
  return how


def title_section(record: SweepRecord) -> Lines:
  return [f"# Sweep `{record.name}`", ""] + ([record.description, ""]
                                             if record.description else [])


def verdicts_section(record: SweepRecord, report: Report, plots: Mapping[str, str]) -> Lines:
  """The headline figure, the design, and every verdict in words."""
  out = ["## Verdicts", ""] + headline(record, report, plots) + [_design(record, report), ""]
  # The selection metric's verdicts; where the comparisons read other metrics
  # only (a translation sweep compares BLEU and chrF on test), theirs.
  main = [r for r in report.comparisons if r.metric == report.select_by] or list(
      report.comparisons)
  if main or report.failed:
    out += [f"- {r.text}" for r in main] + [f"- {r.text}" for r in report.failed] + [""]
  return out


def reproduce_section(record: SweepRecord, summaries, report: Report) -> Lines:
  """The command, the base config, and what became of the runs."""
  base = " ".join(f"--config.{k}={v}" for k, v in record.overrides.items())
  counts = sum((p.counts for p in report.points), Counts())
  states: dict[str, int] = {}
  for s in summaries.values():
    states[s["state"]] = states.get(s["state"], 0) + 1
  return ["Reproduce:", "", "```bash", record.command, "```", "",
          f"Base: `{record.config}`" + (f" `{base}`" if base else ""), "",
          f"{len(record.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in states.items())
          + f"; of the finished, {counts.learned} learned, {counts.stalled} "
          f"stalled, {counts.diverged} diverged; seeds {list(record.seeds)}.", ""]


def points_section(record: SweepRecord, report: Report, points: Points) -> Lines:
  return ["## Points", "",
          f"Metrics on the {report.report_split} split at each point's chosen tuned value, "
          "mean ± standard deviation over its learned runs. Stalled: the final validation "
          "loss is not below the unigram entropy of the training targets (the best model "
          f"that ignores context) by {report.options.stall_margin} nats; stalled "
          "and diverged runs are counted, not averaged.", "",
          markdown_table(points_table(record, report, points)), ""]


def tuned_section(record: SweepRecord, report: Report, plots: Mapping[str, str]) -> Lines:
  """Each point at each tuned value, choices at a grid's end, the sensitivity."""
  if not record.tune:
    return []
  out = ["## Tuned values", "", markdown_table(tuned_table(record, report)), ""]
  edges = [(p, field, end) for p in report.points for field, end in p.chosen_at_edge.items()]
  if edges:
    out += ["Chosen at the end of the grid, so the best value may lie beyond what "
            "was tried (extend the grid to bracket it): "
            + "; ".join(f"{', '.join(p.values.values())} "
                        f"({field.split('.')[-1]} = {fmt_value(p.chosen[field])}, "
                        f"the {end} tried)" for p, field, end in edges) + ".", ""]
  if report.sensitivity:
    out += ["### Learning-rate sensitivity", "",
            "Wortsman et al. 2023: E_η[min(l(η), l0) − min_η l(η)] over the tuned "
            "values, l the mean final validation loss of the learned runs, a value "
            "whose runs all failed counted as l0 (the loss at initialisation, ln |V|). "
            "Lower: the point trains well over a wider range.", "",
            markdown_table(sensitivity_table(report)), ""]
    for key, name in plots.items():
      if key.startswith("sensitivity:"):
        out += [f"![sensitivity]({name})", ""]
  return out


def comparisons_section(record: SweepRecord, report: Report, plots: Mapping[str, str]
                        ) -> Lines:
  """Per axis, the table of its comparisons and its loss curves."""
  if not report.comparisons:
    return []
  out = ["## Comparisons", "",
         "Each value against its axis's base value within each combination of the "
         "other axes. Paired: differences per seed (same seeds, same data order); "
         "Welch: unpaired. p adjusted by Holm-Bonferroni over every comparison "
         "below.", ""]
  for ai, axis in enumerate(record.axes):
    rows = [r for r in report.comparisons if r.axis_index == ai]
    if not rows:
      continue
    out += [f"### {axis.label} (base value: "
            f"{value_label(axis.values[axis.reference], axis)})", "",
            markdown_table(comparisons_table(rows)), ""]
    if plots.get(f"curves:{ai}"):
      out += [f"![loss curves, {axis.label}]({plots[f'curves:{ai}']})", ""]
  return out


def noise_section(report: Report) -> Lines:
  if not report.noise:
    return []
  return ["## Noise floor and power", "",
          f"The base point's seed-to-seed standard deviation of `{report.select_by}` and "
          "the smallest true difference the current seeds detect with a two-sided t test "
          "at α = 0.05 (noncentral t); more seeds where it exceeds the effects that "
          "matter (`python -m tfx_jax.sweep ... --until-resolved MAX_SEEDS`).", "",
          markdown_table(noise_table(report)), ""]


def scale_section(report: Report, plots: Mapping[str, str]) -> Lines:
  if not report.scale:
    return []
  out = ["## Effects against model size", "",
         "Each axis's difference from its base value at each model size of the "
         "size axis, with its 95% interval.", ""]
  for key, name in plots.items():
    if key.startswith("scale:"):
      out += [f"![effects against size]({name})", ""]
  return out


def lengths_section(record: SweepRecord, points: Points, shown: Points,
                    plots: Mapping[str, str]) -> Lines:
  """Perplexity at k x the training length (``evaluate --lengths``)."""
  lengths = lengths_table(record, shown)
  if not lengths:
    return []
  splits = sorted({s.get("lengths_split") or "validation"
                   for runs in points.values() for _, s in runs if s["lengths"]})
  out = ["## Length extrapolation", "",
         f"Perplexity on the {' / '.join(splits)} split in non-overlapping windows "
         "of k × the training length (`python -m tfx_jax.evaluate --lengths`), mean ± "
         "std over seeds.", "",
         markdown_table(lengths), ""]
  if plots.get("lengths"):
    out += [f"![length extrapolation]({plots['lengths']})", ""]
  return out


def layers_section(record: SweepRecord, shown: Points, plots: Mapping[str, str]) -> Lines:
  """Gradient norm per layer at the first logged step (``train.log_layer_stats``)."""
  layers = layer_table(record, shown)
  if not layers:
    return []
  steps = sorted({s["layer_stats_step"] for runs in shown.values() for _, s in runs
                  if s.get("layer_stats_step") is not None})
  if steps == [1]:
    title = "at initialisation"
    when = ("step 1, the first update, whose gradients are taken at the initial "
            "parameters")
  else:
    title = "at the first logged step"
    when = (f"step {', '.join(map(str, steps))}, after that many updates (runs "
            "made with `train.log_layer_stats` log step 1, at initialisation)")
  out = [f"## Gradient norm per layer {title}", "",
         "`layer_stats/grad_norm/<stack>_<layer>` at the first logged step, mean "
         f"over seeds: {when} (Xiong et al. 2020, Figure 3: post-norm's gradients "
         "at initialisation grow towards the last layers, pre-norm's stay flat).",
         "",
         markdown_table(layers), ""]
  if plots.get("layers"):
    out += [f"![gradient norm per layer]({plots['layers']})", ""]
  return out


def render(record: SweepRecord, summaries, report: Report, plots: Mapping[str, str]) -> str:
  """The report's markdown: its sections in order."""
  points = group_points(record, summaries)
  shown = at_chosen(points, report.chosen())  # a tuned point's runs at its chosen value
  sections = [title_section(record), verdicts_section(record, report, plots),
              reproduce_section(record, summaries, report),
              points_section(record, report, points), tuned_section(record, report, plots),
              comparisons_section(record, report, plots), noise_section(report),
              scale_section(report, plots), lengths_section(record, points, shown, plots),
              layers_section(record, shown, plots)]
  return "\n".join(line for section in sections for line in section)


def report_options(record: SweepRecord, stall_margin: float | None = None,
                   equivalence_margin: float | None = None) -> analysis.Options:
  """The given options, else the sweep's own (``--stall-margin`` and
  ``--equivalence-margin`` of ``python -m tfx_jax.sweep``), else the defaults."""
  saved = {k: v for k, v in record.report_options.to_json().items() if v is not None}
  given = {k: v for k, v in (("stall_margin", stall_margin),
                             ("equivalence_margin", equivalence_margin)) if v is not None}
  return analysis.Options(**{**saved, **given})


def write_report(sweep_dir: str | pathlib.Path, *, stall_margin: float | None = None,
                 equivalence_margin: float | None = None) -> pathlib.Path:
  """Writes report.md, report.json, report.csv and the PNG plots of
  ``sweep_dir``; returns report.md. Margins not given are the sweep's own
  (``report_options`` in sweep.json), else the defaults."""
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel  # matplotlib
  from tfx_jax.report import baselines  # pylint: disable=import-outside-toplevel  # data, tokenizers
  sweep_dir = pathlib.Path(sweep_dir)
  record, summaries = collect_lib.collect(sweep_dir)
  options = report_options(record, stall_margin, equivalence_margin)
  report = analysis.analyze(record, summaries, baselines.of_runs(sweep_dir, record), options)
  points = group_points(record, summaries)
  metrics = metric_names(list(summaries.values()))
  plots = plots_lib.write_plots(sweep_dir, record, points, report)
  write_csv(sweep_dir / "report.csv", record, summaries, metrics)
  files.write_json(sweep_dir / "report.json", report.to_json())
  path = sweep_dir / "report.md"
  path.write_text(render(record, summaries, report, plots))
  return path
