"""What a tuned sweep's report says about each point's own grid.

A tuned field's grid may differ from point to point (``sweep_record.TunedGrid``:
each optimizer its own learning rates, Muon alone its Adam ratio), so every
check of a grid reads the point's own (``SweepRecord.point_grid``):

- **Grid edges.** A chosen value at the end of its point's numeric grid: the
  best value may lie beyond what was tried (``grid_edges``).
- **Sensitivity** (Wortsman et al. 2023, "Small-scale proxies for large-scale
  Transformer training instabilities", section 3.2): per point
  E_eta[min(l(eta), l0) - min_eta l(eta)] over the tuned values, each run at
  its own final loss capped at l0, a diverged run at l0, l(eta) the mean over
  the value's declared seeds (``stats.lr_sensitivity``). eta is the learning
  rate: where a point tunes it beside other fields (Muon's Adam ratio), the
  number reads its learning rates with the other fields at the point's chosen
  values, so a second tuned field's bad values do not count as learning-rate
  sensitivity and points with and without it compare on one footing; a point
  that does not tune the learning rate reads its whole grid. A point that
  took a transferred value (``tune_at``) ran one value and has no number;
  its proxy's is the sensitivity of that choice.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tfx_jax.records import transfer as transfer_lib
from tfx_jax.report import stats
from tfx_jax.report.points import fmt_value
from tfx_jax.report.schema import CurvePoint, Point, Sensitivity
from tfx_jax.records.sweep import SweepRecord, Tune

# The field whose sensitivity Wortsman et al. define (eta).
LEARNING_RATE = "optim.learning_rate"


def grid_text(grid: Mapping[str, Sequence[Any]]) -> str:
  """``learning_rate {0.001, 0.003} x adam_learning_rate_ratio {0.1, 0.3}``
  (their product; "nothing tuned" for an empty grid)."""
  return " x ".join(f"{field.split('.')[-1]} {{{', '.join(fmt_value(v) for v in values)}}}"
                   for field, values in grid.items()) or "nothing tuned"


def declared_text(tune: Tune) -> str:
  """The sweep's tuned grids in a line: ```learning_rate` in [0.001, 0.003]
  where optimizer=adamw; `learning_rate` in [0.0001, 0.0003] where
  optimizer=lion``."""
  parts = []
  for field, grids in tune.items():
    for grid in grids:
      where = ", ".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in grid.when.items())
      parts.append(f"`{field}` in {list(grid.values)}" + (f" where {where}" if where else ""))
  return "; ".join(parts)


def grid_edges(grid: Mapping[str, Sequence[Any]], tuned: Mapping[str, Any]) -> dict[str, str]:
  """{field: "lowest" | "highest"} for each tuned field whose chosen value is
  the end of its numeric grid (the point's own, ``SweepRecord.point_grid``):
  the best value may lie beyond what was tried."""
  out = {}
  for field, value in tuned.items():
    values = grid.get(field, ())
    if (len(values) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                for v in values)):
      if value == min(values):
        out[field] = "lowest"
      elif value == max(values):
        out[field] = "highest"
  return out


def sensitivity_labels(point: Point) -> set[str]:
  """The tuned values the point's sensitivity number reads: its learning
  rates at its other tuned fields' chosen values, where it tunes the
  learning rate beside other fields and has a choice; else all of them."""
  labels = {row.label for row in point.tuned}
  tuned_fields = {k for row in point.tuned for k in row.tuned}
  if LEARNING_RATE not in tuned_fields or len(tuned_fields) < 2 or not point.chosen:
    return labels
  others = {k: v for k, v in point.chosen.items() if k != LEARNING_RATE}
  return {row.label for row in point.tuned
          if all(row.tuned.get(k) == v for k, v in others.items())}


def sensitivity(record: SweepRecord, points: Sequence[Point],
                l0s: Mapping[tuple[int, ...], Any]) -> list[Sensitivity]:
  """Per point: the selection metric at every tuned value of its own grid and
  its learning-rate sensitivity number (``sensitivity_labels``).

  Each tuned value's curve point holds every finished seed's final value (a
  stalled seed's too; None for a diverged one), the mean of the learned
  seeds, the failures, and l(eta): the mean over the declared seeds of
  min(value, l0), a diverged seed at l0. The number reads the declared seeds
  only, which every tuned value ran (seeds added later run at the chosen
  value alone). ``l0s``: {point key: ``sections.selection.InitialLoss`` or None}.
  """
  select_by = record.select_by
  declared = set(record.seeds)
  out = []
  if not record.tune:
    return out
  plan = transfer_lib.record_sources(record)
  for point in points:
    if transfer_lib.source_key(plan, point.key) != point.key:
      continue  # a transferred value: one value run, no curve (its proxy's is)
    l0 = l0s.get(point.key)
    read = sensitivity_labels(point)
    curve, counted = [], {}
    for row in point.tuned:
      finished = {seed: s for seed, s in row.seeds.items() if s.outcome is not None}
      seeds = {seed: (None if s.outcome == "diverged" else s.validation.get(select_by))
               for seed, s in finished.items()}
      learned = [s.validation[select_by] for s in finished.values()
                 if s.outcome == "learned" and select_by in s.validation]
      runs = [seeds[seed] for seed in finished if seed in declared]
      value = None
      if l0 is not None and runs:
        value = stats.capped_mean(runs, l0.value)
        if row.label in read:
          counted[row.label] = runs
      curve.append(CurvePoint(
          tuned=row.tuned, label=row.label, seeds=seeds,
          mean=stats.mean_std(learned)[0] if learned else None,
          failed=sum(s.outcome != "learned" for s in finished.values()), value=value))
    number, all_failed = None, False
    if counted:
      # A point none of whose runs learned gets no number: its stalled runs,
      # all near the unigram loss, would read as "insensitive".
      all_failed = (not any(c.mean is not None for c in curve)
                    or min(c.value for c in curve if c.value is not None) >= l0.value)
      number = None if all_failed else stats.lr_sensitivity(counted, l0.value)
    out.append(Sensitivity(
        point=point.values, key=point.key, curve=tuple(curve),
        initial_loss=None if l0 is None else l0.value, sensitivity=number,
        all_failed=all_failed, initial_loss_source=None if l0 is None else l0.source,
        initial_loss_runs=0 if l0 is None else l0.runs))
  return out
