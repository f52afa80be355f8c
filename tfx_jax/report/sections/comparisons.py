"""The report's section "Comparisons": every value against its base.

Per axis and per combination of the other axes (the context), each value
against the axis's base value, and each pair the sweep declares
(``Sweep.comparisons``: a value against another, which plays the base), per
metric: a paired t interval over the seeds both sides have, else Welch's;
Holm-Bonferroni over every comparison of the report (one family); a verdict
``better``, ``worse``, ``equivalent`` (TOST within +-margin) or
``unresolved``. A sweep with adaptive seeds tests each at its look
(``sections.sequential``). A comparison whose side never learned
(``failed``) is listed with its counts; one whose side's confirmation is
stale (``sections.choices``) is listed with the reason and not made, nor
counted in the family. report.json's ``comparisons``, ``failed`` and
``stale_comparisons``; the verdicts in words are ``sections.verdicts``'.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Sequence

from tfx_jax.records.sweep import AxisRecord, SweepRecord
from tfx_jax.report import stats
from tfx_jax.report import stats_sequential
from tfx_jax.report.context import (Context, adjust, compared_at, compared_by, context_axes,
                                    exploratory, lower_is_better, margin_for, reserved_seed,
                                    sequential_design, tuned_key)
from tfx_jax.report.points import context_label, contexts, value_label
from tfx_jax.report.schema import (Comparison, Counts, FailedComparison, Look, Options, Point,
                                   Report, StaleComparison)
from tfx_jax.report.sections import choices, provenance, selection, sequential
from tfx_jax.report.sections.selection import compared_metrics
from tfx_jax.report.tables import Lines, markdown_table, outcome_cells
from tfx_jax.report.tuning import grid_text


def rows(ctx: Context) -> list[Comparison]:
  """The report's comparisons, computed once per report."""
  return ctx.once("comparisons", lambda: comparisons(ctx.record, selection.points(ctx),
                                                     ctx.options))


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``comparisons``, ``failed`` and ``stale_comparisons``."""
  points = selection.points(ctx)
  return {"comparisons": tuple(rows(ctx)),
          "failed": tuple(failed_comparisons(ctx.record, points)),
          "stale_comparisons": tuple(stale_comparisons(ctx.record, points))}


def _by_key(points: Sequence[Point]) -> dict[tuple[int, ...], Point]:
  return {p.key: p for p in points}


def point_at(ctx: Sequence[int | None], axis_index: int, value_index: int) -> tuple[int, ...]:
  """The point key of ``value_index`` of axis ``axis_index`` in context ``ctx``."""
  return tuple(value_index if j == axis_index else c for j, c in enumerate(ctx))


def _against_base(record: SweepRecord, points: Sequence[Point]
                  ) -> Iterator[tuple[int, AxisRecord, tuple, int, int, Point, Point]]:
  """(axis index, axis, context, value index, base index, point, base point)
  for every value of every axis against the axis's base value, then for each
  pair the axis declares (``AxisRecord.comparisons``) its value against its
  base, in each context; an axis that is only a context (``context_axes``:
  a ladder's rungs and budgets) compares nothing."""
  by_key = _by_key(points)
  for ai, axis in enumerate(record.axes):
    if len(axis.values) < 2 or ai in context_axes(record):
      continue
    pairs = [(vi, axis.reference) for vi in range(len(axis.values)) if vi != axis.reference]
    for ctx in contexts(record.axes, ai):
      for vi, bi in [*pairs, *axis.comparisons]:
        point, base = by_key.get(point_at(ctx, ai, vi)), by_key.get(point_at(ctx, ai, bi))
        if point is not None and base is not None:
          yield ai, axis, ctx, vi, bi, point, base


def comparisons(record: SweepRecord, points: Sequence[Point], options: Options
                ) -> list[Comparison]:
  """Every (axis, context, value, metric) against the axis's base value, and
  every declared pair's (its value against its base), with Holm-adjusted
  p-values over the whole report and a verdict each.

  A sweep with adaptive seeds (``sequential_design``) is tested at its
  current look (``stats_sequential.sequential_look``: the seeds both sides learned,
  paired); the Holm adjustment then runs twice, over the differences' and
  over the equivalence tests' sequential p-values, so that neither a false
  better/worse nor a false equivalent verdict anywhere in the report has
  more than alpha chance, whatever look each comparison stopped at.
  Otherwise each comparison is the paired (or Welch) t over the seeds it
  has, and its equivalence test is the unadjusted TOST (``stats.verdict``).
  """
  design = sequential_design(record)
  metrics = compared_metrics(points, record)
  untested = []  # every comparison with its interval, before the family's test
  looks: list[stats_sequential.SequentialLook | None] = []
  for ai, axis, ctx, vi, bi, point, base in _against_base(record, points):
    if point.stale or base.stale:
      continue  # listed by ``stale_comparisons``, outside the family
    for metric in metrics:
      a = {s: v[metric] for s, v in point.compared.items() if metric in v}
      b = {s: v[metric] for s, v in base.compared.items() if metric in v}
      if not a or not b:
        continue
      margin = margin_for(metric, record.select_by, options)
      look = (None if design is None else
              sequential.look_at(design, sequential.look_of(record, point, base), a, b, margin,
                               options.alpha))
      looks.append(look)
      untested.append(Comparison(
          axis=axis.label, axis_index=ai, value=value_label(axis.values[vi], axis),
          value_index=vi, base_index=bi, base_value=value_label(axis.values[bi], axis),
          context=context_label(record.axes, ctx, ai), context_key=tuple(ctx),
          metric=metric, split=record.report_split, seeds=tuple(sorted(a)),
          base_seeds=tuple(sorted(b)),
          interval=stats.compare(a, b) if look is None else look.interval,
          margin=margin, chosen=compared_at(point), base_chosen=compared_at(base),
          counts=_counted(record, point)[0], base_counts=_counted(record, base)[0],
          p_adjusted=None, verdict="unresolved", seeds_needed=None,
          text=""))  # rendered when report.json is written (``sections.verdicts``)
  if design is None:
    adjusted = adjust(record, [r.interval.p_value for r in untested])  # None: not testable
    equivalences = [None] * len(untested)  # the verdict's own TOST, unadjusted
  else:
    adjusted = adjust(record, [look.p_difference for look in looks])
    equivalences = [
        dataclasses.replace(look.equivalence, p_value=p, alpha=options.alpha,
                            equivalent=p is not None and p < options.alpha)
        for look, p in zip(looks, adjust(record, [look.p_equivalence for look in looks]))]
  rows = []
  for row, p_adj, look, eq in zip(untested, adjusted, looks, equivalences):
    iv = row.interval
    verdict = stats.verdict(iv, p_adj, row.margin, options.alpha,
                            lower_is_better(row.metric), equivalence=eq)
    needed = None
    if verdict == "unresolved":
      needed = (seeds_to_resolve(iv, options.alpha / len(untested), options.power)
                if design is None else
                sequential.sequential_seeds_to_resolve(iv, design, options.alpha / len(untested),
                                            options.power))
    row = dataclasses.replace(
        row, p_adjusted=p_adj, verdict=verdict, seeds_needed=needed,
        look=None if look is None else Look(look.look, look.looks, look.share,
                                            None if eq is None else eq.p_value))
    rows.append(row)
  return rows


def seeds_to_resolve(iv: stats.Interval, alpha: float, power: float) -> int | None:
  """Seeds (pairs, or per side) at which a true difference of the size seen
  would be detected with ``power``, given the seed-to-seed spread seen: a
  planning figure. ``alpha`` is the family's divided by its size (Bonferroni,
  which Holm never rejects less often than). None when not known or above 64."""
  if iv.se is None or not iv.se or iv.diff == 0.0:
    return None
  paired = iv.method == "paired"
  sd = iv.se * (iv.n_a ** 0.5 if paired else (1 / iv.n_a + 1 / iv.n_b) ** -0.5)
  return stats.seeds_needed(iv.diff, sd, paired, alpha, power)


def _counted(record: SweepRecord, point: Point) -> tuple[Counts, int, str | None]:
  """The runs a point's comparisons count: (outcome counts, runs, the tuned
  values they ran at as a label where they are confirmation runs). A sweep
  with confirmation seeds counts a point's confirmation runs (none yet: no
  finished run), or its tuning stage where it has no value to confirm."""
  if record.confirm and (point.chosen is not None or point.confirmed is not None):
    label = None if point.confirmed is None else tuned_key(point.confirmed)
    return point.confirmation_counts, len(point.confirmation), label
  return point.counts, point.runs, None


def failed_comparisons(record: SweepRecord, points: Sequence[Point]
                       ) -> list[FailedComparison]:
  """The comparisons that ``comparisons`` cannot make because a side has no
  learned run (every run stalled or diverged, at every tuned value, or every
  confirmation run): a failure is a result, so each is listed with its counts
  instead of dropped."""
  out = []
  for ai, axis, ctx, vi, bi, point, base in _against_base(record, points):
    if (point.compared and base.compared) or point.stale or base.stale:
      continue
    (counts, runs, confirmed), (base_counts, base_runs, base_confirmed) = (
        _counted(record, point), _counted(record, base))
    if not counts.finished or not base_counts.finished:
      continue  # a side with no finished run: nothing to say yet
    row = FailedComparison(
        axis=axis.label, value=value_label(axis.values[vi], axis),
        base_value=value_label(axis.values[bi], axis),
        context=context_label(record.axes, ctx, ai), counts=counts,
        base_counts=base_counts, runs=runs, base_runs=base_runs,
        verdict=("both failed" if not point.compared and not base.compared
                 else "failed" if not point.compared else "base failed"),
        text="",  # rendered when report.json is written (``sections.verdicts``)
        confirmed=confirmed, base_confirmed=base_confirmed)
    out.append(row)
  return out


def stale_comparisons(record: SweepRecord, points: Sequence[Point]
                      ) -> list[StaleComparison]:
  """The comparisons that ``comparisons`` leaves out because a side's
  confirmation is stale (``Point.stale``): each listed with the reason, in
  the order the comparisons would have had."""
  out = []
  for ai, axis, ctx, vi, bi, point, base in _against_base(record, points):
    value, base_value = value_label(axis.values[vi], axis), value_label(axis.values[bi], axis)
    sides = [(name, p) for name, p in ((value, point), (base_value, base)) if p.stale]
    if sides:
      out.append(choices.stale_comparison(axis.label, value, base_value,
                                          context_label(record.axes, ctx, ai), sides))
  return out


def _seeds_text(seeds: Sequence[int]) -> str:
  """``seed 0``, ``seeds 1-4`` (consecutive), ``seeds 1, 3, 5``."""
  seeds = sorted(seeds)
  if len(seeds) == 1:
    return f"seed {seeds[0]}"
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"seeds {seeds[0]}-{seeds[-1]}"
  return "seeds " + ", ".join(map(str, seeds))


def design_line(record: SweepRecord, row: Comparison) -> str:
  """One comparison's design in a line: where its compared values were chosen,
  which seeds and split its verdict reads, and how it is tested, e.g.

    tuned on seed 0 over learning_rate {0.001, 0.003, 0.01}; confirmed on
    seeds 1-4 (paired, test split); sequential: <method>, look 3 of 4

  A tuned sweep without confirmation seeds says that its verdicts read the
  seeds that chose the values (selection-biased), unless a seed was reserved
  for the choice.
  """
  parts = []
  reserved = reserved_seed(record)
  if record.tune:
    # Each side's own grid (per-point grids), once where both have the same.
    grid, base_grid = (record.point_grid(row.key_of(row.value_index)),
                       record.point_grid(row.base_key))
    over = (f" over {grid_text(grid)}" if grid == base_grid else
            f": {row.value} over {grid_text(grid)}, {row.base_value} over "
            f"{grid_text(base_grid)}")
    tuning = list(record.seeds) if reserved is None else [reserved]
    parts.append(f"tuned on {_seeds_text(tuning)}{over}")
  paired = row.interval.method == "paired"
  seeds = (set(row.seeds) & set(row.base_seeds)) if paired else (
      set(row.seeds) | set(row.base_seeds))
  parts.append(f"{'confirmed' if record.confirm else 'compared'} on {_seeds_text(seeds)} "
               f"({'paired' if paired else 'Welch, unpaired'}, {row.split} split)")
  if record.tune_at:  # where each side's value came from: tuned, or transferred
    parts.append(provenance.comparison_text(record, row))
  if record.tune and not record.confirm and reserved is None:
    parts.append("selection-biased: the seeds that chose the values are compared")
  if row.look is not None:
    parts.append(f"sequential: {stats_sequential.SEQUENTIAL_METHOD}, look {row.look.look} of "
                 f"{row.look.looks}")
  else:
    parts.append("fixed seeds: t test, " + ("exploratory, unadjusted" if exploratory(record)
                                            else "Holm over the report"))
  return "; ".join(parts)



def failed_keys(record: SweepRecord, row: FailedComparison
                ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
  """The keys of a failed comparison's two points, found by its labels (an
  axis label, a value label and a context label each name one); None where
  the record has no such axis, values or context."""
  for ai, axis in enumerate(record.axes):
    labels = [value_label(v, axis) for v in axis.values]
    if axis.label != row.axis or row.value not in labels or row.base_value not in labels:
      continue
    for ctx in contexts(record.axes, ai):
      if context_label(record.axes, ctx, ai) == row.context:
        return (point_at(ctx, ai, labels.index(row.value)),
                point_at(ctx, ai, labels.index(row.base_value)))
  return None


# ------------------------------------------------------------------ report.md
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
  counts = lambda c: " / ".join(outcome_cells(c))
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


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Per axis, the table of its comparisons and its loss curves."""
  record = ctx.record
  if not report.comparisons:
    return []
  declared = any(a.comparisons for a in record.axes)
  out = ["## Comparisons", "",
         "Each value against its axis's base value within each combination of the "
         "other axes" + (", and each pair the sweep declares (`a vs b`: a against b, "
                         "b in the base's place)" if declared else "")
         + ". Paired: differences per seed (same seeds, same data order); "
         "Welch: unpaired. " + ("Exploratory: p unadjusted and no verdict labelled; the "
                                "sweep's claims are the report's one family (Claims)."
                                if exploratory(record) else
                                "p adjusted by Holm-Bonferroni over every comparison "
                                "below."), ""]
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
    designs = [r for r in rows if r.metric == compared_by(record)]
    if designs:
      out += [markdown_table([["comparison", "context", "design"]] + [
          [f"{r.value} vs {r.base_value}", r.context, design_line(record, r)]
          for r in designs]), ""]
    if plots.get(f"curves:{ai}"):
      out += [f"![loss curves, {axis.label}]({plots[f'curves:{ai}']})", ""]
  return out



def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The loss curves of each axis."""
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  out = {}
  for ai, axis in enumerate(ctx.record.axes):
    if ai in context_axes(ctx.record):
      continue  # compared along no axis of its own: no comparison's curves
    name = plots_lib.file_name("curves", axis.label)
    if plots_lib.curves_plot(sweep_dir / name, ctx.record, ctx.groups, ai, palette, report):
      out[f"curves:{ai}"] = name
  return out
