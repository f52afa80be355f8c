"""How firm each point's choice of tuned values is: a stale confirmation, and
a choice made within the noise. Computed inside the points
(``selection.points``), as ``trends`` is; read by the points, tuning-stage
and tuned-values tables, the comparisons (a stale point is no side of one)
and the verdicts.

- **Stale** (``is_stale``): on a sweep with confirmation seeds, a point whose
  confirmation runs ran at other tuned values than the finished tuning runs
  choose now: its grid was widened in the experiment file, tuning runs were
  added, the margins that classify a run changed. Those runs confirm a value
  nothing chooses, so nothing is compared at the point (its ``compared`` is
  empty) and every comparison it is a side of is listed with the reason
  (``Report.stale_comparisons``) instead of made, until the sweep, run again,
  re-confirms it at its new choice (``sweep.confirm``).
- **Within the noise** (``choice_margins``): the chosen value's lead over the
  next best, on what chose it (``TunedValue.selection_score``: ``select_by``
  on validation over the choosing seeds), against the point's seed spread,
  the standard deviation of ``select_by`` over the runs its verdicts read
  (its confirmation runs; without them the base point's, as ``Trend``'s seed
  noise falls back). A lead below the spread is smaller than what a change
  of seed does to one run, so the tuning seeds decided the choice: another
  seed could have chosen the runner-up (``Point.choice``). A budget of a
  ladder that shares its tuned value across budgets, chosen at another value
  than its own best, has no margin: the budgets chose together.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import point_verdict_runs, tuned_key
from tfx_jax.report.schema import ChoiceMargin, Point, Report, StaleComparison, TunedValue
from tfx_jax.report.tables import Lines, seeds_range


def is_stale(confirmed: dict | None, chosen: dict | None) -> bool:
  """A point's confirmation runs ran at ``confirmed`` and it chooses
  ``chosen`` (None: nothing, no tuning run learned): stale where they differ."""
  return confirmed is not None and confirmed != chosen


def lead(chosen: TunedValue, runner_up: TunedValue) -> float | None:
  """How much lower the chosen value's selection score is than the runner-up's,
  in ``select_by``'s units (>= 0); None where the scores differ before the
  metric (``selection._selection_score``: the value with fewer failed runs
  won, whatever the metric says)."""
  a, b = chosen.selection_score, runner_up.selection_score
  if a is None or b is None or a[:-1] != b[:-1]:
    return None
  return b[-1] - a[-1]


def seed_spread(record: SweepRecord, point: Point) -> float | None:
  """The standard deviation (n - 1) of ``select_by`` on validation over the
  point's learned runs that its verdicts read (``point_verdict_runs``); None
  with fewer than two."""
  values = [s.validation[record.select_by] for s in point_verdict_runs(record, point).values()
            if s.outcome == "learned" and record.select_by in s.validation]
  return stats.mean_std(values)[1] if len(values) > 1 else None


def choice_margins(record: SweepRecord, points: Sequence[Point]) -> list[Point]:
  """``points``, each tuned one with two or more values that learned given its
  ``ChoiceMargin``: the chosen value's lead over the runner-up against its
  seed spread, or the base point's (every axis at its base value) where it
  has fewer than two runs to take one from."""
  spreads = {p.key: seed_spread(record, p) for p in points}
  base = tuple(a.reference for a in record.axes)
  out = []
  for point in points:
    # Ordered as the choice orders them; a stable sort keeps the chosen first.
    ranked = sorted((r for r in point.tuned if r.selection_score is not None),
                    key=lambda r: r.selection_score)
    # A ladder's budgets that share their value (``selection.shared_picks``)
    # may each be at another value than its own best: no lead of its own.
    margin = (lead(ranked[0], ranked[1]) if point.chosen is not None and len(ranked) > 1
              and ranked[0].label == point.chosen_label else None)
    if margin is None:
      out.append(point)
      continue
    spread, source = spreads[point.key], "point"
    if spread is None and point.key != base:
      spread, source = spreads.get(base), "base point"
    out.append(dataclasses.replace(point, choice=ChoiceMargin(
        runner_up=ranked[1].label, margin=margin, spread=spread,
        spread_from=None if spread is None else source,
        within_noise=None if spread is None else margin < spread)))
  return out


def stale_text(point: Point, name: str) -> str:
  """"pre is stale: its confirmation ran at learning_rate=0.01, learning_rate=0.03
  is chosen now"."""
  now = (f"{point.chosen_label} is chosen now" if point.chosen is not None
         else "nothing is chosen now (no tuning run learned)")
  return (f"{name}'s confirmation is stale: its confirmation runs ran at "
          f"{tuned_key(point.confirmed)}, {now}")


def stale_comparison(axis: str, value: str, base_value: str, context: str,
                     sides: Sequence[tuple[str, Point]]) -> StaleComparison:
  """The listing of a comparison left out because of its ``sides``' stale
  confirmations ((value label, point) of each stale side)."""
  where = f" ({context})" if context != "-" else ""
  return StaleComparison(
      axis=axis, value=value, base_value=base_value, context=context,
      stale=tuple(name for name, _ in sides),
      text=(f"{value} vs {base_value}{where}: left out: "
            + "; ".join(stale_text(point, name) for name, point in sides)
            + ". Running the sweep again re-confirms it at the new choice (the runs "
            "at the old value are kept, superseded)."))


# ------------------------------------------------------------------ report.md
def noise_lines(report: Report) -> Lines:
  """The sentence under the tuned-values table naming the choices made
  within the noise: the tuning seeds decided them."""
  flagged = [p for p in report.points if p.choice is not None and p.choice.within_noise]
  if not flagged:
    return []
  seeds = len(report.tuning_seeds)
  who = ("one tuning seed decided" if seeds == 1 else
         f"the luck of the tuning seeds ({seeds_range(report.tuning_seeds)}) decided"
         if seeds else "the luck of the tuning seeds decided")
  parts = []
  for p in flagged:
    c = p.choice
    spread = f"seed spread {c.spread:.4f}" + (
        " of the base point" if c.spread_from == "base point" else "")
    parts.append(f"{', '.join(p.values.values()) or 'base'} ({p.chosen_label} ahead of "
                 f"{c.runner_up} by {c.margin:.4f}, {spread})")
  return ["Chosen within the noise (✓ within the noise above): the chosen value's lead "
          f"over the next best on `{report.select_by}` (validation) is smaller than the "
          "point's seed spread (the standard deviation of that metric over the runs its "
          "verdicts read), so " + who + " which value won, and another seed could have "
          "chosen the runner-up: " + "; ".join(parts) + ". Such a point is compared at a "
          "value its runner-up may equal; more tuning seeds at its two best values "
          "would settle it.", ""]
