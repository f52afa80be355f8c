"""A sweep's runs grouped into points (one combination of axis values each),
and how points, axis values and contexts are labelled in tables and plots."""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

from tfx_jax.records.summary import RunSummaries, RunSummary
from tfx_jax.records.sweep import AxisRecord, RunEntry, SweepRecord

# {point key: [(run, its summary), ...]}
Points = dict[tuple[int, ...], list[tuple[RunEntry, RunSummary]]]


def value_label(value: Mapping[str, Any], axis: AxisRecord | None = None) -> str:
  """An axis value as a table cell: ``swiglu``, ``num_heads=1,d_ff=256``, ``base``.

  On an axis whose values set different fields (a list of overrides such as
  ``[{}, {"model.dropout": 0.0}, {"train.label_smoothing": 0.0}]``), a
  one-field value names its field too (``dropout=0``), or two rows could read
  alike.
  """
  if not value:
    return "base"
  if len(value) == 1 and (axis is None or len(axis.fields) < 2):
    return fmt_value(next(iter(value.values())))
  return ",".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in value.items())


def fmt_value(v: Any) -> str:
  if isinstance(v, bool):
    return str(v).lower()
  return f"{v:g}" if isinstance(v, float) else str(v)


def group_points(record: SweepRecord, summaries: RunSummaries) -> Points:
  """{point key: [(run, run summary), ...]} in declaration order."""
  points: Points = {}
  for entry in record.runs:
    points.setdefault(record.point_key(entry), []).append((entry, summaries[entry.name]))
  return points


def at_chosen(points: Points, chosen: Mapping[tuple[int, ...], Mapping[str, Any] | None]
              ) -> Points:
  """``points`` with each point's runs at its ``chosen`` tuned values only
  (``Report.chosen``; all of them where nothing was tuned or no value was
  chosen): what the per-point tables and plots of a tuned sweep show, beside
  the comparisons. Where a point ran confirmation seeds, those runs alone:
  the tuning seeds at the chosen value were selected on, and the verdicts do
  not read them either."""
  out = {}
  for key, runs in points.items():
    pick = chosen.get(key)
    runs = [(e, s) for e, s in runs if e.tuned == pick] if pick else runs
    confirmed = [(e, s) for e, s in runs if e.stage == "confirm"]
    out[key] = confirmed or runs
  return out


def contexts(axes: Sequence[AxisRecord], axis_index: int) -> list[tuple[int | None, ...]]:
  """Every combination of the other axes' value indices (None at ``axis_index``)."""
  ranges = [[None] if j == axis_index else range(len(a.values)) for j, a in enumerate(axes)]
  return [tuple(c) for c in itertools.product(*ranges)]


def context_label(axes: Sequence[AxisRecord], ctx: Sequence[int | None], axis_index: int
                  ) -> str:
  """The other axes' values: ``position=rope, d_model=64,num_heads=4`` ("-": none).
  A zipped axis's value names its fields already."""
  parts = [value_label(a.values[i], a) if len(a.values[i]) > 1 or len(a.fields) > 1
           else f"{a.label.split('.')[-1]}={value_label(a.values[i])}"
           for j, (a, i) in enumerate(zip(axes, ctx)) if j != axis_index]
  return ", ".join(parts) or "-"
