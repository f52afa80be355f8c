"""Sequential looks: how a sweep with adaptive seeds (``--until-resolved
MAX_SEEDS``) is tested. A comparison tested again after every seed added
would, at a fixed alpha, find a false verdict well above alpha of the time;
each look instead tests at its share of alpha (Bonferroni over the looks,
shares by the power family of Kim and DeMets 1987: ``stats_sequential``),
paired on the seeds both sides learned. This section holds which look a
comparison is at (``look_of``), its tests there (``look_at``), the seeds an
unresolved one would need (``sequential_seeds_to_resolve``), report.json's
``sequential`` and the design's paragraph in the verdicts (``design_text``);
the comparisons (``sections.comparisons``) apply them. ``unresolved_points``
tells ``sweep.adaptive`` where to add seeds.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report import stats_sequential
from tfx_jax.report.context import (Context, first_look_seeds, point_verdict_runs,
                                    sequential_design)
from tfx_jax.report.schema import Point, Report, Sequential


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``sequential`` (None: fixed seeds)."""
  return {"sequential": sequential(ctx.record)}


def look_of(record: SweepRecord, point: Point, base: Point) -> int:
  """The look a comparison of ``point`` and ``base`` is at: 1 + the seeds
  added to both (beyond ``first_look_seeds``) whose runs have finished on
  both sides, whatever their outcome. Both points take added seeds in the
  same order (``adaptive.add_seeds``), so these are the first rounds of each."""
  first = first_look_seeds(record)

  def added(p: Point) -> set[int]:
    return {seed for seed, s in point_verdict_runs(record, p).items()
            if seed not in first and s.outcome is not None}

  return 1 + len(added(point) & added(base))


def look_at(design: stats_sequential.SequentialDesign, look: int, a: Mapping[int, float],
                     b: Mapping[int, float], margin: float, alpha: float
                     ) -> stats_sequential.SequentialLook:
  """``stats_sequential.sequential_look`` on the seeds that both sides learned (paired:
  the sequential test is one of per-seed differences); with no such seed, an
  interval that is not known (nothing to test)."""
  pairs = sorted(set(a) & set(b))
  if pairs:
    return stats_sequential.sequential_look([a[s] for s in pairs], [b[s] for s in pairs], design,
                                 look, margin, alpha)
  diff = stats.mean_std(list(a.values()))[0] - stats.mean_std(list(b.values()))[0]
  unknown = stats.Interval(diff, None, None, None, None, None, "paired", 0, 0, 1.0 - alpha)
  return stats_sequential.SequentialLook(look, design.looks, design.share(look), unknown,
                              stats.tost(unknown, margin, alpha), None, None)


def sequential_seeds_to_resolve(iv: stats.Interval, design: stats_sequential.SequentialDesign,
                                alpha: float, power: float) -> int | None:
  """``seeds_to_resolve`` for adaptive seeds: the seeds per point (in a
  verdict: confirmation seeds, or declared ones but a reserved seed) at the
  last look of a design from the same first look whose last look alone
  detects a difference of the size seen with ``power``
  (``stats_sequential.sequential_seeds_needed``); as MAX_SEEDS it is one more where a
  seed is reserved for the choice. None when not known or above 64."""
  if iv.se is None or not iv.se or iv.diff == 0.0:
    return None
  sd = iv.se * iv.n_a ** 0.5  # the sequential test is paired
  return stats_sequential.sequential_seeds_needed(iv.diff, sd, design.first, alpha, power,
                                                  design.rho)


def sequential(record: SweepRecord) -> Sequential | None:
  """The report's account of its sequential test (None: fixed seeds)."""
  design = sequential_design(record)
  return None if design is None else Sequential(record.until_resolved, design)


def unresolved_points(report: Report) -> list[tuple[int, ...]]:
  """The point keys on either side of an unresolved comparison (a declared
  pair's too: both its points take the added seeds)."""
  keys = []
  for row in report.comparisons:
    if row.verdict != "unresolved":
      continue
    for key in (row.key_of(row.value_index), row.base_key):
      if key not in keys:
        keys.append(key)
  return keys



# ------------------------------------------------------------------ report.md
def design_text(report: Report) -> str:
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

