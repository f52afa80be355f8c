"""The report's section "Verdicts": the headline figure (``forest.png``:
every comparison, its interval and verdict against the equivalence band, or
why the sweep has none), how the points were chosen and compared, and every
verdict in words. The sentences are rendered here from the comparisons'
numbers (``sections.comparisons``); report.json keeps them as each
comparison's ``text`` and ``design`` and each failed one's ``text``, written
by ``with_sentences`` when the report is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import tuning
from tfx_jax.report.context import (Context, compared_by, lower_is_better,
                                    sequential_design, tokenizer_axes)
from tfx_jax.report.schema import Comparison, Counts, FailedComparison, Report
from tfx_jax.report.sections import sequential, trends
from tfx_jax.report.sections.comparisons import design_line, failed_keys
from tfx_jax.report.tables import Lines, seeds_range


def with_sentences(record: SweepRecord, report: Report) -> Report:
  """``report`` with each comparison's verdict and design as sentences and
  each failed comparison's account (report.json's ``text`` and ``design``),
  rendered from their numbers."""
  return dataclasses.replace(
      report,
      comparisons=tuple(dataclasses.replace(r, text=verdict_text(record, r),
                                            design=design_line(record, r))
                        for r in report.comparisons),
      failed=tuple(dataclasses.replace(r, text=failed_text(record, r, failed_grids(record, r)))
                   for r in report.failed))


def failed_grids(record: SweepRecord, row: FailedComparison
                 ) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
  """Each side's own tuned grid (value, base) of a failed comparison."""
  keys = failed_keys(record, row)
  return None if keys is None else tuple(record.point_grid(k) for k in keys)


def verdict_text(record: SweepRecord, row: Comparison) -> str:
  """"swiglu vs gelu: better by 0.039 nats [0.012, 0.066], 5 seeds paired, ..."."""
  iv = row.interval
  unit = " nats" if "loss" in row.metric else ""
  size = abs(iv.diff)
  if iv.low is not None:
    level = "" if row.look is None else f" ({iv.level:.1%} interval)"
    bounds = f" [{iv.low:+.3f}, {iv.high:+.3f}]{level}"
  else:
    bounds = " (no interval: fewer than two seeds)"
  seeds = "confirmation seeds" if record.confirm else "seeds"
  how = (f"{iv.n_a} {seeds} paired" if iv.method == "paired"
         else f"{iv.n_a} vs {iv.n_b} {seeds}, unpaired (Welch)")
  tuned = ""
  # The fields either side tunes (its own grid: a point may tune fewer).
  fields = list(dict.fromkeys(
      [*record.point_grid(row.key_of(row.value_index)),
       *record.point_grid(row.base_key)]))
  if fields:
    tuned = f", {', '.join(f.split('.')[-1].replace('_', ' ') for f in fields)} tuned per point"
  where = f" ({row.context})" if row.context != "-" else ""
  metric = "" if row.metric == record.select_by else f" {row.metric}"
  verdict = row.verdict
  if verdict in ("better", "worse"):
    head = f"{verdict} by {size:.3f}{unit}"
  elif verdict == "equivalent":
    head = f"equivalent within ±{row.margin:g}{unit} (difference {iv.diff:+.3f})"
  else:
    head = f"unresolved (difference {iv.diff:+.3f}{unit})"
  p = "-" if row.p_adjusted is None else f"{row.p_adjusted:.3g}"
  look = ("" if row.look is None else
          f"; sequential, look {row.look.look} of {row.look.looks}")
  need = ""
  if verdict == "unresolved" and row.seeds_needed and row.look is not None:
    design = sequential_design(record)
    need = (f"; about {row.seeds_needed} {seeds} paired would detect a difference of "
            f"this size, as the last look of a sequential design from {design.first} "
            f"(this sweep's last look has {design.last})")
  elif verdict == "unresolved" and row.seeds_needed:
    need = (f"; about {row.seeds_needed} seeds"
            f"{' paired' if iv.method == 'paired' else ' per side'} would detect a "
            "difference of this size")
  elif verdict == "unresolved" and iv.se:
    need = "; more than 64 seeds would be needed to detect a difference of this size"
  return (f"{row.value} vs {row.base_value}{where}{metric}: {head}{bounds}, {how}"
          f"{tuned}{look}; adjusted p = {p}{need}")


def failed_text(record: SweepRecord, row: FailedComparison,
                grids: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> str:
  """"post vs pre (num_layers=24): failed: post never learned (6 stalled of 6
  runs, at every learning rate); pre learned in 6 of 6"; a side counted on
  its confirmation runs says so ("3 stalled of 3 confirmation runs, at
  learning_rate=0.01"). ``grids``: each side's own tuned grid (value, base;
  default: every field the sweep tunes)."""
  own = dict(zip((row.value, row.base_value), grids or ()))

  def side(name: str, counts: Counts, runs: int, confirmed: str | None) -> str:
    kind = "confirmation runs" if confirmed is not None else "runs"
    if counts.learned:
      return (f"{name} learned in {counts.learned} of {runs}"
              + (" confirmation runs" if confirmed is not None else ""))
    failed = ", ".join(f"{getattr(counts, o)} {o}" for o in ("stalled", "diverged")
                       if getattr(counts, o))
    every = ""
    if confirmed is not None:
      every = f", at {confirmed}"
    elif own.get(name, record.tune):
      fields = ", ".join(f.split(".")[-1].replace("_", " ")
                         for f in own.get(name, record.tune))
      every = f", at every {fields}"
    return f"{name} never learned ({failed} of {runs} {kind}{every})"
  where = f" ({row.context})" if row.context != "-" else ""
  first, second = ((row.value, row.counts, row.runs, row.confirmed),
                   (row.base_value, row.base_counts, row.base_runs, row.base_confirmed))
  if row.verdict == "base failed":
    first, second = second, first
  return (f"{row.value} vs {row.base_value}{where}: {row.verdict}: "
          f"{side(*first)}; {side(*second)}")



# ------------------------------------------------------------------ report.md
def no_comparison(record: SweepRecord, report: Report | None = None) -> str:
  """Why a report has no comparison."""
  if not any(len(a.values) > 1 for a in record.axes):
    return ("no comparison: the sweep has a single point (no axis with two values), so "
            "there is no base to set it against; its numbers are below.")
  if report is not None and report.stale_comparisons and not report.comparisons:
    return ("no comparison: each has a side whose confirmation is stale (it ran at "
            "another tuned value than is chosen now; listed below); running the sweep "
            "again re-confirms those points at their new choices.")
  if report is not None and report.verdict_runs == "confirmation" and not any(
      p.confirmation_counts.finished for p in report.points):
    return ("no verdict yet: the verdicts read the confirmation seeds "
            f"({seeds_range(report.confirmation_seeds)}), and no confirmation run has "
            "finished; the tuning stage is below.")
  return "no comparison has learned runs on both sides yet."


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
              if lower_is_better(select_by)
              else ", fewest stalled or diverged runs first"))
    if report.verdict_runs == "confirmation":
      where = (f"the {split} split" if split == "test" else
               "the validation split (the dataset has no test split; the selection "
               "never read these seeds)")
      how += (f", over the tuning seeds ({seeds_range(report.tuning_seeds)}). Then each point "
              f"ran {record.confirm} fresh confirmation seeds "
              f"({seeds_range(report.confirmation_seeds)}, the same for every point) at its "
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
  axes = tokenizer_axes(record)
  if axes:
    how += (f" The points differ in tokenizer or vocabulary ({', '.join(axes)}), so they are "
            "compared in bits per byte (`eval/bpb`), never in nats per token, which a "
            "tokenizer's vocabulary changes.")
  n = len(report.comparisons)
  if n and report.sequential is not None:
    how += " " + sequential.design_text(report)
  elif n and record.claims:
    how += (f" {n} comparison{'s' if n != 1 else ''}, exploratory: unadjusted, at α = "
            "0.05, none labelled; the sweep's claims (above) are the report's one family.")
  elif n:
    how += (f" {n} comparison{'s form' if n != 1 else ' forms'} one family "
            "(Holm-Bonferroni); verdicts at α = 0.05, equivalence by two one-sided tests "
            "within the margin.")
  return how


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The headline figure, the design, and every verdict in words."""
  record = ctx.record
  title = "## Exploratory comparisons" if record.claims else "## Verdicts"
  out = [title, ""] + headline(record, report, plots) + [_design(record, report), ""]
  # The leading metric's verdicts (the selection metric's, or bits per byte
  # across tokenizers); where the comparisons read other metrics only (a
  # translation sweep compares BLEU and chrF on test), theirs.
  main = [r for r in report.comparisons if r.metric == compared_by(record)] or list(
      report.comparisons)
  if main or report.failed:
    out += ([f"- {verdict_text(record, r)}{trends.still_improving_note(report, r)}"
             for r in main]
            + [f"- {failed_text(record, r, failed_grids(record, r))}" for r in report.failed]
            + [""])
  if report.stale_comparisons:
    out += ["Left out, not compared and outside the family: a side's confirmation is "
            "stale, its confirmation runs confirming a tuned value it no longer chooses "
            "(its grid was widened or tuning runs were added after they started).", ""]
    out += [f"- {r.text}" for r in report.stale_comparisons] + [""]
  return out



def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The headline figure."""
  from tfx_jax.report import forest  # pylint: disable=import-outside-toplevel  # matplotlib
  if forest.forest_plot(sweep_dir / "forest.png", forest.forest_panels(ctx.record, report)):
    return {"forest": "forest.png"}
  return {}
