"""A sweep's report: ``runs/<sweep>/report.md``, ``report.json``,
``report.csv`` and PNG plots.

``report.json`` is ``analysis.analyze`` (the numbers: points, chosen tuned
values, outcomes, comparisons with verdicts); ``report.md`` renders it:

- the headline figure (``forest.png``: every comparison, its interval and
  verdict against the equivalence band), or why the sweep has no comparison;
- the verdicts in words;
- one row per point: its chosen tuned values, learned / stalled / diverged
  counts, metrics on the compared split (mean +- std over seeds) each with its
  evaluation standard error beside it (in bold, and named, above a quarter of
  the seed std), whether its validation loss was still falling by more than
  the seed noise, tokens/s;
- a sweep with confirmation seeds: the tuning stage, for reference (each
  point's chosen value and its tuning seeds' results there, beside the
  confirmation seeds' that the verdicts read);
- per tuned value of each point: the selection metric and outcomes;
- learning-rate sensitivity curves and numbers;
- per axis, each value against the axis's base value within each combination
  of the other axes, and each pair the sweep declares (``Sweep.comparisons``,
  a value against another in the base's place): the method (paired or
  Welch), the difference with its 95% interval, the Holm-adjusted p and the
  verdict;
- the effective speedup over AdamW, where the sweep ran AdamW at several
  lengths beside other optimizers (``speedup``);
- the noise floor and the smallest detectable difference per axis; the
  effects against model size where an axis changes it;
- loss curves per axis, the length-extrapolation table (position sweeps) and
  per-layer gradient norms near initialisation (``train.log_layer_stats``);
- the command that reproduces the sweep;
- what the runs cost: core time per point and in total, and the share spent
  in train steps (``compute``).

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

from tfx_jax.core import atomic as files
from tfx_jax.report import analysis
from tfx_jax.report import collect as collect_lib
from tfx_jax.report import compute as compute_lib
from tfx_jax.report import speedup
from tfx_jax.report import stats
from tfx_jax.report import tuning
from tfx_jax.report.points import Points, at_chosen, fmt_value, group_points, value_label
from tfx_jax.report.schema import Comparison, Counts, Report, Trend
from tfx_jax.records.sweep import SweepRecord

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
      cells.append(_mean_interval_cell(vals))
    rows.append(_point_cells(record, key) + cells)
  return rows


def _mean_interval_cell(values: list[float]) -> str:
  """"mean ± h" over seeds, h the half-width of the mean's 95% t-interval
  (the mean alone for one seed; "-" for none)."""
  if not values:
    return "-"
  mean, half = stats.mean_half_width(values)
  return f"{mean:.3g}" if half is None else f"{mean:.3g} ± {half:.2g}"


def markdown_table(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines)


def points_table(record: SweepRecord, report: Report, points: Points) -> list[list[str]]:
  """One row per point: chosen tuned values, outcomes, compared metrics (a
  sweep with confirmation seeds: its confirmation runs')."""
  metrics = analysis.compared_metrics(report.points, report.select_by)
  tuned = bool(record.tune)
  confirmed = report.verdict_runs == "confirmation"
  head = ([a.label for a in record.axes] + (["chosen"] if tuned else [])
          + ["confirmation runs" if confirmed else "runs", "learned", "stalled", "diverged"]
          + _metric_head(report, metrics) + ["still improving"]
          + ["tokens/s"])
  rows = [head]
  for point in report.points:
    tps = [s["tokens_per_sec"] for _, s in points.get(point.key, []) if s["tokens_per_sec"]]
    counts, runs = ((point.confirmation_counts, len(point.confirmation)) if confirmed
                    else (point.counts, point.runs))
    rows.append(list(point.values.values())
                + ([analysis.compared_at(point) or "none learned"] if tuned else [])
                + [str(runs)] + _outcome_cells(counts)
                + _metric_cells(report, point, metrics) + [_trend_cell(point.trend)]
                + [f"{stats.mean_std(tps)[0]:,.0f}" if tps else "-"])
  return rows


# The evaluation's standard error should be at most this fraction of the
# seed-to-seed standard deviation: it then adds at most 1/16 to the seed
# variance (3% to the standard deviation).
EVAL_NOISE_LIMIT = 0.25


def _with_se(report: Report, metrics: Sequence[str]) -> list[str]:
  """The compared metrics whose evaluations logged a standard error."""
  return [m for m in metrics if any(m in p.eval_se for p in report.points)]


def _metric_head(report: Report, metrics: Sequence[str]) -> list[str]:
  """Each compared metric's column, and its evaluation SE's where it has one."""
  with_se = _with_se(report, metrics)
  return [c for m in metrics for c in [f"{m} ({report.report_split})"]
          + ([f"{m} eval SE"] if m in with_se else [])]


def _metric_cells(report: Report, point, metrics: Sequence[str]) -> list[str]:
  """Mean ± seed std of each compared metric, and beside it the evaluation SE,
  in bold where it is more than ``EVAL_NOISE_LIMIT`` of the seed std."""
  with_se = _with_se(report, metrics)
  cells = []
  for m in metrics:
    cells.append(_pm([v[m] for v in point.compared.values() if m in v]))
    if m in with_se:
      se, sd = point.eval_se.get(m), point.seed_sd.get(m)
      noisy = se is not None and sd is not None and se > EVAL_NOISE_LIMIT * sd
      cells.append(f"**{se:.4f}**" if noisy else _fmt(se))
  return cells


def eval_noise_lines(report: Report) -> Lines:
  """What the eval SE column means, and the points whose evaluation noise is
  more than ``EVAL_NOISE_LIMIT`` of their seed spread."""
  metrics = _with_se(report, analysis.compared_metrics(report.points, report.select_by))
  if not metrics:
    return []
  out = ["Eval SE: the standard error of each evaluation's own estimate, the sampling "
         "error of the evaluated sample (across its rows for losses and accuracy, "
         "sacreBLEU's bootstrap over sentences for BLEU and chrF), root mean square over "
         "the runs. Beside the seed-to-seed standard deviation it bounds how much of that "
         "spread the evaluated sample could make (runs evaluated on the same sample share "
         "part of its error, which cancels in their differences); at most a quarter of "
         "it adds at most 3% to the spread.", ""]
  noisy = [(p, m) for p in report.points for m in metrics
           if m in p.eval_se and m in p.seed_sd
           and p.eval_se[m] > EVAL_NOISE_LIMIT * p.seed_sd[m]]
  if noisy:
    out += ["Evaluation noise above a quarter of the seed spread (in bold above): "
            + "; ".join(f"{', '.join(p.values.values()) or 'base'} {m} (eval SE "
                        f"{p.eval_se[m]:.4f}, seed std {p.seed_sd[m]:.4f})"
                        for p, m in noisy)
            + ". Part of those points' seed-to-seed spread, and of their differences, "
            "may be the evaluated sample: evaluate more data (`eval.num_batches`; 0 "
            "evaluates the whole split).", ""]
  return out


def _trend_cell(trend: Trend | None) -> str:
  """"**yes** (fell 0.031, seed noise 0.012)": the point's ``Trend``."""
  if trend is None:
    return "-"
  fell = f"fell {trend.drop:.3f}"
  if trend.still_improving is None:
    return f"not known ({fell}; one seed, no seed noise)"
  noise = f"seed noise {trend.seed_noise:.3f}" + (
      " of the base point" if trend.noise_from == "base point" else "")
  return f"**yes** ({fell}, {noise})" if trend.still_improving else f"no ({fell}, {noise})"


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


def comparisons_table(rows: Sequence[Comparison], reference: int | None = None
                      ) -> list[list[str]]:
  """One axis's comparisons; a row whose base is not the axis's base value
  (``reference``; a declared pair) names its base: ``moe_shared vs moe``."""
  # Adaptive seeds: each row's interval is at its look's level (1 - alpha * w_k).
  sequential = any(r.look is not None for r in rows)
  out = [["context", "value", "metric", "learned / stalled / diverged (value; base)",
          "method", "seeds",
          "Δ vs base [interval, level]" if sequential else "Δ vs base [95% CI]",
          "adjusted p", "verdict"]]
  counts = lambda c: " / ".join(_outcome_cells(c))
  for r in rows:
    iv = r.interval
    level = f" {iv.level:.1%}" if r.look is not None else ""
    interval = (f"{iv.diff:+.4f} [{iv.low:+.4f}, {iv.high:+.4f}]{level}"
                if iv.low is not None else f"{iv.diff:+.4f} (no interval)")
    seeds = str(iv.n_a) if iv.method == "paired" else f"{iv.n_a} / {iv.n_b}"
    method = (iv.method if r.look is None
              else f"{iv.method}, look {r.look.look} of {r.look.looks}")
    value = r.value if r.base_index == reference else f"{r.value} vs {r.base_value}"
    out.append([r.context, value, r.metric,
                f"{counts(r.counts)}; {counts(r.base_counts)}", method, seeds, interval,
                "-" if r.p_adjusted is None else f"{r.p_adjusted:.3g}",
                f"**{r.verdict}**"])
  return out


def sensitivity_table(report: Report) -> list[list[str]]:
  rows = [["point", "sensitivity", "failed runs", "l0", "l0 from"]]
  source = {"step 0": lambda s: f"step 0 (mean of {s.initial_loss_runs} runs)",
            "uniform": lambda s: "uniform prediction (no run evaluated at step 0)",
            None: lambda s: "-"}
  for s in report.sensitivity:
    rows.append([", ".join(s.point.values()) or "base",
                 "all failed" if s.all_failed else _fmt(s.sensitivity),
                 str(sum(c.failed for c in s.curve)), _fmt(s.initial_loss, 3),
                 source[s.initial_loss_source](s)])
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
    w.writerow(["run", "seed", "stage", *fields, "state", "step", *metrics,
                "tokens_per_sec", "wall_seconds", "compile_seconds"])
    for entry in record.runs:
      s = summaries[entry.name]
      values = {k: v for value in [*entry.values, entry.tuned] for k, v in value.items()}
      m = run_metrics(s)
      w.writerow([entry.name, entry.seed, entry.stage, *[values.get(f, "") for f in fields],
                  s["state"], s["step"], *[m.get(k, "") for k in metrics],
                  s["tokens_per_sec"] or "", s["wall_seconds"] or "",
                  s["compile_seconds"] if s["compile_seconds"] is not None else ""])


# ---------------------------------------------------------------- sections
def no_comparison(record: SweepRecord, report: Report | None = None) -> str:
  """Why a report has no comparison."""
  if not any(len(a.values) > 1 for a in record.axes):
    return ("no comparison: the sweep has a single point (no axis with two values), so "
            "there is no base to set it against; its numbers are below.")
  if report is not None and report.verdict_runs == "confirmation" and not any(
      p.confirmation_counts.finished for p in report.points):
    return ("no verdict yet: the verdicts read the confirmation seeds "
            f"({_seeds(report.confirmation_seeds)}), and no confirmation run has "
            "finished; the tuning stage is below.")
  return "no comparison has learned runs on both sides yet."


def _seeds(seeds: Sequence[int]) -> str:
  """``1-3`` for three or more consecutive seeds, else ``1, 3``."""
  seeds = sorted(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def headline(record: SweepRecord, report: Report, plots: Mapping[str, str]) -> Lines:
  """The forest plot of every comparison and how to read it, or why there is none."""
  if not plots.get("forest"):
    text = no_comparison(record, report)
    return [f"**{text[0].upper() + text[1:]}**", ""]
  # The selection metric first, then the others by name: the same sweep gives
  # the same text in every process (a set's order follows the hash seed).
  margins = sorted({(r.metric, r.margin) for r in report.comparisons},
                   key=lambda m: (m[0] != report.select_by, m))
  band = ", ".join(f"±{m:g} for {metric}" for metric, m in margins)
  tost = 1.0 - 2.0 * report.options.alpha
  levels = (f"the 95% interval, the thick bar the {tost:.0%} interval of the "
            "equivalence test" if report.sequential is None else
            "the interval at the row's look (1 − α·w, w its share of α), the thick bar "
            "the equivalence test's (1 − 2α·w)")
  return [f"![every comparison against its base]({plots['forest']})", "",
          f"Each row: a value minus its base (the value after \"vs\": its axis's base "
          f"value, or a declared pair's second) on the {report.report_split} split; "
          f"the marker is the verdict, thin whiskers {levels}, shaded the equivalence "
          f"band ({band}), faint dots each seed's own difference (paired rows).", ""]


def _design(record: SweepRecord, report: Report) -> str:
  """How the points were chosen and compared, in a paragraph."""
  select_by, split = report.select_by, report.report_split
  if record.tune:
    tuned = tuning.declared_text(record.tune)
    how = (f"Each point is compared at its own best tuned value ({tuned}), chosen by "
           f"the mean `{select_by}` of its runs on the validation split"
           + (", each run at its own final value capped at the loss at initialisation "
              "l0 and a diverged run at l0, as in the sensitivity"
              if analysis.lower_is_better(select_by)
              else ", fewest stalled or diverged runs first"))
    if report.verdict_runs == "confirmation":
      where = (f"the {split} split" if split == "test" else
               "the validation split (the dataset has no test split; the selection "
               "never read these seeds)")
      how += (f", over the tuning seeds ({_seeds(report.tuning_seeds)}). Then each point "
              f"ran {record.confirm} fresh confirmation seeds "
              f"({_seeds(report.confirmation_seeds)}, the same for every point) at its "
              "chosen value, and the verdicts, differences and intervals read those runs "
              f"only, on {where}. The tuning stage is reported separately, for "
              "reference: it is selected on its own seeds.")
    elif report.reserved_seed is not None:
      how += (f"; the dataset has no test split, so seed {report.reserved_seed} is "
              "reserved for that choice and the other seeds are compared on validation.")
    else:
      how += (f"; the comparisons read the {split} split of the same seeds. "
              "**These verdicts are selection-biased:** the seeds compared are the "
              "seeds that chose each point's value, so a seed that happened to be lucky "
              "at a value (on every split alike) favours its point, by more where a "
              "point's results vary more over the tuned values. Confirmation seeds "
              "(`--confirm N`: fresh seeds at each chosen value) give verdicts without "
              "that bias.")
  else:
    how = (f"Compared on the {split} split." if report.comparisons
           else f"Metrics on the {split} split.")
  n = len(report.comparisons)
  if n and report.sequential is not None:
    how += " " + sequential_design_text(report)
  elif n:
    how += (f" {n} comparison{'s form' if n != 1 else ' forms'} one family "
            "(Holm-Bonferroni); verdicts at α = 0.05, equivalence by two one-sided tests "
            "within the margin.")
  return how


def sequential_design_text(report: Report) -> str:
  """The sequential test of a sweep with adaptive seeds, in sentences."""
  seq, alpha = report.sequential, report.options.alpha
  design, n = seq.design, len(report.comparisons)
  return (f"Seeds were added adaptively (`--until-resolved {seq.max_seeds}`: "
          f"{design.looks} look{'s' if design.looks != 1 else ''}, from {design.first} to "
          f"{design.last} seeds in a verdict), and each comparison was tested again at "
          f"every look, so it is tested sequentially: {seq.method} ({seq.reference}). "
          f"The chance of any false better or worse verdict in this report is at most "
          f"α = {alpha:g}, and so is that of any false equivalent one, whatever look "
          f"each comparison stopped at; the {n} comparison{'s' if n != 1 else ''} "
          f"form{'' if n != 1 else 's'} one family for each (Holm-Bonferroni). Each "
          "verdict names its look; its interval is at 1 − α × the look's share of α. "
          "Fewer verdicts resolve than a fixed number of seeds would give at α: where "
          "one does not, its line says the seeds it would need.")


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
    out += ([f"- {r.text}{_still_improving_note(report, r)}" for r in main]
            + [f"- {r.text}" for r in report.failed] + [""])
  return out


def _still_improving_note(report: Report, row: Comparison) -> str:
  """" (still improving: ...)" where either side's validation loss was still
  falling by more than the seed noise (``Point.trend``)."""
  sides = [(row.value, report.point(row.key_of(row.value_index))),
           (row.base_value, report.point(row.base_key))]
  falling = [name for name, point in sides
             if point is not None and point.trend is not None and point.trend.still_improving]
  if not falling:
    return ""
  return (f" (still improving: a longer run may change this verdict; "
          f"{' and '.join(falling)} still falling by more than the seed noise)")


def reproduce_section(record: SweepRecord, summaries, report: Report) -> Lines:
  """The command, the base config, and what became of the runs."""
  base = " ".join(f"--config.{k}={v}" for k, v in record.overrides.items())
  counts = sum((p.counts for p in report.points), Counts())
  states: dict[str, int] = {}
  for s in summaries.values():
    states[s["state"]] = states.get(s["state"], 0) + 1
  counts += sum((p.confirmation_counts for p in report.points), Counts())
  confirmation = (f"; confirmation seeds {list(record.confirmation_seeds())}"
                  if record.confirm else "")
  return ["Reproduce:", "", "```bash", record.command, "```", "",
          f"Base: `{record.config}`" + (f" `{base}`" if base else ""), "",
          f"{len(record.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in states.items())
          + f"; of the finished, {counts.learned} learned, {counts.stalled} "
          f"stalled, {counts.diverged} diverged; seeds {list(record.seeds)}"
          f"{confirmation}.", ""]


def points_section(record: SweepRecord, report: Report, points: Points) -> Lines:
  where = (f"of each point's confirmation runs (seeds {_seeds(report.confirmation_seeds)}"
           "), at the tuned value its tuning stage chose" if report.verdict_runs ==
           "confirmation" else "at each point's chosen tuned value")
  return ["## Points", "",
          f"Metrics on the {report.report_split} split {where}, "
          "mean ± standard deviation over its learned runs. Stalled: the final validation "
          "loss is not below the unigram entropy of the training targets (the best model "
          f"that ignores context) by {report.options.stall_margin} nats; stalled "
          "and diverged runs are counted, not averaged. Still improving: the validation "
          "loss of those runs fell between their last two evaluations (the mean over "
          "the runs) by more than the seed noise, the seed-to-seed standard deviation "
          "of their final validation loss (the base point's where a point has one run): "
          "a longer run may change the verdicts on that point.", "",
          markdown_table(points_table(record, report, points)), ""] + eval_noise_lines(report)


def tuning_stage_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """Per point: the chosen value, its tuning seeds' results there (validation,
  which chose it, and the compared split) and its confirmation seeds'."""
  metric, split = report.select_by, report.report_split
  rows = [[a.label for a in record.axes]
          + ["chosen", "tuning seeds (learned)", f"{metric} (validation, tuning seeds)",
             f"{metric} ({split}, tuning seeds)",
             f"{metric} ({split}, confirmation seeds)"]]
  for point in report.points:
    row = next((r for r in point.tuned if r.label == point.chosen_label), None)
    learned = [s for s in row.seeds.values() if s.outcome == "learned"] if row else []
    confirmed = [v[metric] for v in point.compared.values() if metric in v]
    kept = ("" if point.confirmed is None or point.confirmed == point.chosen else
            f" (confirmed at {analysis.compared_at(point)}, chosen before)")
    rows.append(list(point.values.values())
                + [(point.chosen_label or "none learned") + kept,
                   f"{len(learned)} of {len(row.seeds) if row else 0}",
                   _pm([s.validation[metric] for s in learned if metric in s.validation]),
                   _pm([s.on(split)[metric] for s in learned if metric in s.on(split)]),
                   _pm(confirmed)])
  return rows


def tuning_stage_section(record: SweepRecord, report: Report) -> Lines:
  """A sweep with confirmation seeds: its tuning stage, for reference."""
  if report.verdict_runs != "confirmation":
    return []
  return ["## Tuning stage (for reference: selected on these seeds)", "",
          f"Each point's value was chosen on the validation split of the tuning seeds "
          f"({_seeds(report.tuning_seeds)}), so their results at that value are biased in "
          "the point's favour (a seed lucky at a value is lucky on every split) and no "
          "verdict reads them; the confirmation seeds beside them are the runs the "
          "verdicts read. The tuned values, the grid-edge check and the sensitivity below "
          "are the tuning stage's.", "",
          markdown_table(tuning_stage_table(record, report)), ""]


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
            "values, l(η) the mean over the value's runs (the declared seeds) of each "
            "run's final validation loss capped at l0: a stalled run at its own loss, "
            "a diverged run at l0. l0 is the loss at initialisation: the mean of the "
            "point's evaluations at step 0 (`eval.at_start`), or, for runs that did "
            "not evaluate at step 0, the loss of the uniform prediction (ln |V|; ln "
            "of the classes for classification); the last column says which. Lower: "
            "the point trains well over a wider range.", "",
            markdown_table(sensitivity_table(report)), ""]
    for key, name in plots.items():
      if key.startswith("sensitivity:"):
        out += [f"![sensitivity]({name})", ""]
  return out


def shows_training_signals(record: SweepRecord, report: Report) -> bool:
  """Whether the report has a stability section: some run logged attention
  logits (``train.log_layer_stats``) or trained with z-loss. (Every run logs
  its output log Z; a sweep that asks neither is not about stability.)"""
  results = [r for p in report.points
             for r in [*p.confirmation.values(), *(r for t in p.tuned for r in t.seeds.values())]]
  return (any("max_attention_logit" in r.training for r in results)
          or any(e.overrides.get("train.z_loss") for e in record.runs))


def training_signals_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """Each point at each tuned value (its confirmation runs on a row of their
  own): the output log Z from first to last logged step, its range, and the
  largest attention logit, means over the runs (a diverged run's values up to
  its divergence)."""
  keys = ("output_log_z_first", "output_log_z_last", "output_log_z_min",
          "output_log_z_max", "max_attention_logit", "max_attention_logit_last")
  rows = [[a.label for a in record.axes] + [
      "tuned", "runs", "log Z first", "log Z last", "log Z min", "log Z max",
      "largest attention logit", "at the last step"]]

  def cells(results) -> list[str]:
    out = []
    for key in keys:
      values = [r.training[key] for r in results if key in r.training]
      out.append(f"{stats.mean_std(values)[0]:.4g}" if values else "-")
    return [str(len(results))] + out

  for point in report.points:
    for row in point.tuned:
      rows.append(list(point.values.values()) + [row.label or "-"]
                  + cells(list(row.seeds.values())))
    if point.confirmation:
      rows.append(list(point.values.values()) + [f"{point.chosen_label} (confirmation)"]
                  + cells(list(point.confirmation.values())))
  return rows


def training_signals_section(record: SweepRecord, report: Report) -> Lines:
  """The output log Z and attention logits per tuned value (Wortsman et al.
  2023's two instabilities), where the sweep is about them."""
  if not shows_training_signals(record, report):
    return []
  return ["## Output log Z and attention logits", "",
          "What training logged of the two instabilities of Wortsman et al. 2023, "
          "mean over each row's runs: the output softmax's mean log Z "
          "(`train/output_log_z`; z-loss pulls it towards 0, and without it the "
          "output logits can drift) at the first and last logged steps and its range "
          "over them, and the largest self-attention logit of any layer "
          "(`layer_stats/max_attention_logit/*`, with `train.log_layer_stats`; its "
          "growth is what qk-layernorm prevents) over the run and at its last logged "
          "step. A diverged run counts with its values up to the divergence. In "
          "`report.json`: each run's `training`.", "",
          markdown_table(training_signals_table(record, report)), ""]


def comparisons_section(record: SweepRecord, report: Report, plots: Mapping[str, str]
                        ) -> Lines:
  """Per axis, the table of its comparisons and its loss curves."""
  if not report.comparisons:
    return []
  declared = any(a.comparisons for a in record.axes)
  out = ["## Comparisons", "",
         "Each value against its axis's base value within each combination of the "
         "other axes" + (", and each pair the sweep declares (`a vs b`: a against b, "
                         "b in the base's place)" if declared else "")
         + ". Paired: differences per seed (same seeds, same data order); "
         "Welch: unpaired. p adjusted by Holm-Bonferroni over every comparison "
         "below.", ""]
  for ai, axis in enumerate(record.axes):
    rows = [r for r in report.comparisons if r.axis_index == ai]
    if not rows:
      continue
    pairs = ", ".join(f"{value_label(axis.values[v], axis)} vs "
                      f"{value_label(axis.values[b], axis)}" for v, b in axis.comparisons)
    out += [f"### {axis.label} (base value: "
            f"{value_label(axis.values[axis.reference], axis)}"
            + (f"; declared pairs: {pairs}" if pairs else "") + ")", "",
            markdown_table(comparisons_table(rows, axis.reference)), ""]
    designs = [r for r in rows if r.metric == report.select_by and r.design]
    if designs:
      out += [markdown_table([["comparison", "context", "design"]] + [
          [f"{r.value} vs {r.base_value}", r.context, r.design] for r in designs]), ""]
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


def _shown_seeds(record: SweepRecord) -> str:
  """Whose runs the per-point tables show (``at_chosen``)."""
  if any(e.stage == "confirm" for e in record.runs):
    return "each point's confirmation seeds"
  return "the seeds at each point's chosen value" if record.tune else "seeds"


def evaluation_effects_table(report: Report) -> list[list[str]]:
  rows = [["point", "positions at evaluation", "metric", "seeds",
           "Δ vs as trained [95% CI]", "adjusted p", "verdict"]]
  for e in report.evaluation_effects:
    iv = e.interval
    interval = (f"{iv.diff:+.2f} [{iv.low:+.2f}, {iv.high:+.2f}]" if iv.low is not None
                else f"{iv.diff:+.2f} (no interval)")
    rows.append([e.point, e.evaluation, e.metric, str(iv.n_a), interval,
                 "-" if e.p_adjusted is None else f"{e.p_adjusted:.3g}", f"**{e.verdict}**"])
  return rows


def lengths_section(record: SweepRecord, points: Points, shown: Points,
                    plots: Mapping[str, str], report: Report | None = None) -> Lines:
  """Perplexity at k x the training length (``evaluate --lengths``)."""
  lengths = lengths_table(record, shown)
  if not lengths:
    return []
  splits = sorted({s.get("lengths_split") or "validation"
                   for runs in points.values() for _, s in runs if s["lengths"]})
  out = ["## Length extrapolation", "",
         f"Perplexity on the {' / '.join(splits)} split in non-overlapping windows "
         "of k × the training length (`python -m tfx_jax.evaluate --lengths`), mean ± "
         f"std over {_shown_seeds(record)}.", "",
         markdown_table(lengths), ""]
  if plots.get("lengths"):
    out += [f"![length extrapolation]({plots['lengths']})", ""]
  if report is not None and report.evaluation_effects:
    out += ["Scaled at evaluation only against the positions the model was trained "
            f"with: the same models ({_shown_seeds(record)}), paired by seed, "
            "perplexity scaled minus as trained. p adjusted by Holm over this "
            "table's rows, a family of its own: two evaluations of the same models, "
            "not two models.", "",
            markdown_table(evaluation_effects_table(report)), ""]
  return out


def layer_trends_table(report: Report) -> list[list[str]]:
  """Each point's per-layer profile per stack: last layer over first with its
  interval, Holm-adjusted p and trend (``Report.layer_profiles``)."""
  rows = [["point", "stack", "layers", "seeds", "first", "last",
           "last / first [95% CI]", "adjusted p", "trend"]]
  for profile in report.layer_profiles:
    ratio, low, high = profile.ratio
    interval = f"{ratio:.2f}" + ("" if low is None else f" [{low:.2f}, {high:.2f}]")
    rows.append([profile.point, profile.stack, str(len(profile.means)),
                 str(len(profile.seeds)), f"{profile.means[0]:.3g}",
                 f"{profile.means[-1]:.3g}", interval,
                 "-" if profile.p_adjusted is None else f"{profile.p_adjusted:.3g}",
                 f"**{profile.trend}**" + ("" if profile.same_as is None else
                                           f" (equal to {profile.same_as}'s: tested once)")])
  return rows


def layers_section(record: SweepRecord, shown: Points, plots: Mapping[str, str],
                   report: Report | None = None) -> Lines:
  """Gradient norm per layer at initialisation (``train.layer_stats_init_batches``)
  or at the first logged step (``train.log_layer_stats``)."""
  summaries = [s for runs in shown.values() for _, s in runs]
  kind = collect_lib.shown_layer_kind(summaries)
  layers = layer_table(record, shown, kind) if kind else None
  if not layers:
    return []
  title, when = collect_lib.layer_kind_when(kind, summaries)
  param = kind.partition("/")[2]
  tag = f"layer_stats/{kind}/<stack>_<layer>"
  arrays = ("every array of the layer" if param in ("", "all") else
            f"the layer's `{param}` arrays (`train.layer_stats_param`)")
  out = [f"## Gradient norm per layer {title}", "",
         f"`{tag}`, the norm over {arrays}: {when}. Each cell is the mean over "
         f"{_shown_seeds(record)} "
         "± the half-width of its 95% t-interval. Xiong et al. 2020, Figure 3, plot "
         "the gradient norm of each layer's FFN output matrix W2 (`ffn_out`) at "
         "initialisation averaged over batches: post-norm's grows towards the last "
         "layers, pre-norm's stays flat.", "",
         markdown_table(layers), ""]
  if report is not None and report.layer_profiles:
    out += ["From the first layer to the last: the last layer's value over the "
            "first's, the geometric mean over the same seeds with its 95% interval "
            "(paired by seed on the log scale); p adjusted by Holm over this table's "
            "rows, a family of their own, a profile equal on every seed to an earlier "
            "row's counted once. *grows* or *falls*: the adjusted p is below "
            f"{report.options.alpha:g}.", "",
            markdown_table(layer_trends_table(report)), ""]
  if plots.get("layers"):
    out += [f"![gradient norm per layer]({plots['layers']})", ""]
  return out


def compute_section(record: SweepRecord, compute: compute_lib.Compute | None) -> Lines:
  """What the runs cost (``compute``): core time per point and in total, the
  share of it in train steps (nothing where no run recorded its time)."""
  if compute is None:
    return []
  total = compute.total
  share = ("" if total.train_fraction is None
           else f", {100 * total.train_fraction:.0f}% of it in train steps")
  return ["## Compute", "",
          f"{total.runs} runs took {compute_lib.fmt_core_time(total.core_seconds)}{share}. "
          "Core time is each run's wall time (from its process's start, every attempt) "
          "times the cores it had; the phases are those its status.json records "
          "(startup: interpreter, imports, data, state; evaluations: in training and "
          "after it, their compilation included).", "",
          markdown_table(compute_lib.compute_table(record, compute)), ""]


def render(record: SweepRecord, summaries, report: Report, plots: Mapping[str, str]) -> str:
  """The report's markdown: its sections in order."""
  points = group_points(record, summaries)
  shown = at_chosen(points, report.chosen())  # a tuned point's runs at its chosen value
  sections = [title_section(record), verdicts_section(record, report, plots),
              reproduce_section(record, summaries, report),
              points_section(record, report, points), tuning_stage_section(record, report),
              tuned_section(record, report, plots), training_signals_section(record, report),
              comparisons_section(record, report, plots), speedup.section(report.speedups),
              noise_section(report),
              scale_section(report, plots), lengths_section(record, points, shown, plots, report),
              layers_section(record, shown, plots, report),
              compute_section(record, report.compute)]
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
