"""Still improving? Per point, whether its validation loss still fell between
its last two evaluations by more than the seed noise (``Point.trend``): a
longer run may change a verdict resting on it. Read by the points table (its
"still improving" column) and the verdicts (a note on each verdict whose side
still falls); its numbers are each point's ``trend`` in report.json.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.run.metrics import SUBSET_LOSS
from tfx_jax.report.schema import Comparison, Point, Report, Trend


# The validation curve whose last evaluations say whether a run still improved.
TREND_METRIC = "eval/loss"


def _chosen_curves(point: Point, summaries: RunSummaries) -> list[list[tuple[int, float]]]:
  """The validation-loss curves (evaluations after step 0, the one at
  initialisation left out) of the point's learned runs that its verdicts
  read: its confirmation runs where it has some, else its runs at its chosen
  value."""
  row = next((r for r in point.tuned if r.label == point.chosen_label), None)
  results = point.confirmation or ({} if point.chosen is None or row is None
                                   else row.seeds)
  out = []
  for _, s in sorted(results.items()):
    if s.outcome == "learned":
      curves = summaries[s.run].curves
      subset = dict(curves.get(SUBSET_LOSS, []))
      # A last evaluation that read more than the subset the others read
      # (eval.final_batches) is compared on that subset, which it logged too:
      # else the drop would hold the two samples' difference.
      curve = [(step, subset.get(step, v)) for step, v in curves.get(TREND_METRIC, [])]
      out.append([(step, v) for step, v in curve if step > 0 and math.isfinite(v)])
  return [c for c in out if c]


def trends(record: SweepRecord, points: Sequence[Point], summaries: RunSummaries
           ) -> list[Point]:
  """``points``, each with its ``Trend``: still improving at its last evaluations?

  The runs: the point's learned runs that its verdicts read (its
  confirmation runs where it has some, else its runs at its chosen tuned
  value, seeds added by ``--until-resolved`` too), each with at least two
  evaluations after step 0.
  A run's drop is its validation loss at its second-to-last evaluation minus
  that at its last, both on the evaluations' subset (the last evaluation's
  eval_subset/loss where it read more, ``eval.final_batches``); the point's drop is the mean over its runs. The seed
  noise is the seed-to-seed standard deviation (n - 1) of the last of those
  losses of those runs; where the point has a single run, that of
  the base point (every axis at its base value); not known where that has a
  single run too. The point is still improving where drop > seed noise: the
  last interval of training alone moved its loss by more than a change of
  seed does, so a longer run may change a verdict resting on it.
  """
  curves = {p.key: _chosen_curves(p, summaries) for p in points}

  def noise(key: tuple[int, ...]) -> float | None:
    finals = [c[-1][1] for c in curves.get(key, [])]
    return stats.mean_std(finals)[1] if len(finals) > 1 else None

  base = tuple(a.reference for a in record.axes)
  out = []
  for point in points:
    runs = [c for c in curves[point.key] if len(c) > 1]
    if not runs:
      out.append(point)
      continue
    sd, source = noise(point.key), "point"
    if sd is None and point.key != base:
      sd, source = noise(base), "base point"
    drop = sum(c[-2][1] - c[-1][1] for c in runs) / len(runs)
    out.append(dataclasses.replace(point, trend=Trend(
        steps=(runs[0][-2][0], runs[0][-1][0]), drop=drop, runs=len(runs), seed_noise=sd,
        noise_from=None if sd is None else source,
        still_improving=None if sd is None else drop > sd)))
  return out



# ------------------------------------------------------------------ report.md
def trend_cell(trend: Trend | None) -> str:
  """"**yes** (fell 0.031, seed noise 0.012)": the point's ``Trend``."""
  if trend is None:
    return "-"
  fell = f"fell {trend.drop:.3f}"
  if trend.still_improving is None:
    return f"not known ({fell}; one seed, no seed noise)"
  noise = f"seed noise {trend.seed_noise:.3f}" + (
      " of the base point" if trend.noise_from == "base point" else "")
  return f"**yes** ({fell}, {noise})" if trend.still_improving else f"no ({fell}, {noise})"


def still_improving_note(report: Report, row: Comparison) -> str:
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

