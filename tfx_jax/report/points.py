"""A sweep's runs grouped into points (one combination of axis values each),
and how points, axis values and contexts are labelled in tables and plots."""

from __future__ import annotations

import itertools
from typing import Any


def value_label(value: dict[str, Any], axis: dict[str, Any] | None = None) -> str:
  """An axis value as a table cell: ``swiglu``, ``num_heads=1,d_ff=256``, ``base``.

  On an axis whose values set different fields (a list of overrides such as
  ``[{}, {"model.dropout": 0.0}, {"train.label_smoothing": 0.0}]``), a
  one-field value names its field too (``dropout=0``), or two rows could read
  alike.
  """
  if not value:
    return "base"
  if len(value) == 1 and (axis is None or len(axis.get("fields", ())) < 2):
    return fmt_value(next(iter(value.values())))
  return ",".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in value.items())


def fmt_value(v: Any) -> str:
  if isinstance(v, bool):
    return str(v).lower()
  return f"{v:g}" if isinstance(v, float) else str(v)


def point_key(record: dict[str, Any], entry: dict[str, Any]) -> tuple[int, ...]:
  """The index of each of the run's axis values."""
  return tuple(axis["values"].index(value)
               for axis, value in zip(record["axes"], entry["values"]))


def group_points(record, summaries) -> dict[tuple[int, ...], list[tuple[dict, dict]]]:
  """{point key: [(sweep.json entry, run summary), ...]} in declaration order."""
  points: dict[tuple[int, ...], list] = {}
  for entry in record["runs"]:
    points.setdefault(point_key(record, entry), []).append((entry, summaries[entry["name"]]))
  return points


def at_chosen(points: dict[tuple[int, ...], list], report: dict[str, Any]
              ) -> dict[tuple[int, ...], list]:
  """``points`` with each point's runs at its chosen tuned values only (all of
  them where nothing was tuned or no value was chosen): what the per-point
  tables and plots of a tuned sweep show, beside the comparisons."""
  chosen = {tuple(p["key"]): p.get("chosen") for p in report.get("points", [])}
  out = {}
  for key, runs in points.items():
    pick = chosen.get(key)
    out[key] = [(e, s) for e, s in runs if e.get("tuned", {}) == pick] if pick else runs
  return out


def contexts(record, axis_index: int) -> list[tuple[int, ...]]:
  """Every combination of the other axes' value indices (None at ``axis_index``)."""
  ranges = [[None] if j == axis_index else range(len(a["values"]))
            for j, a in enumerate(record["axes"])]
  return [tuple(c) for c in itertools.product(*ranges)]


def context_label(record, ctx, axis_index) -> str:
  """The other axes' values: ``position=rope, d_model=64,num_heads=4`` ("-": none).
  A zipped axis's value names its fields already."""
  parts = [value_label(a["values"][i], a) if len(a["values"][i]) > 1
           or len(a.get("fields", ())) > 1
           else f"{a['label'].split('.')[-1]}={value_label(a['values'][i])}"
           for j, (a, i) in enumerate(zip(record["axes"], ctx)) if j != axis_index]
  return ", ".join(parts) or "-"
