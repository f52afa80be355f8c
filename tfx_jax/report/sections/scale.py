"""The report's section "Effects against model size", where an axis changes
the model's size (zipped d_model / num_heads): each other axis's difference
from its base against the parameter count of its context, with its interval
(report.json's ``scale``), and its plot."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report.context import Context, compared_by
from tfx_jax.report.points import contexts
from tfx_jax.report.schema import Comparison, Point, Report, ScaleEffect
from tfx_jax.report.sections import comparisons, selection
from tfx_jax.report.tables import Lines


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``scale`` (none where no axis changes the size)."""
  return {"scale": tuple(scale_effects(ctx.record, selection.points(ctx),
                                       comparisons.rows(ctx)))}


# An axis whose values change the parameter count by more than this factor
# (in some context) changes the model's size; matched variants (gated FFNs at
# 2/3 width, within 1%) do not.
SIZE_RATIO = 1.1


def size_axes(record: SweepRecord, points: Sequence[Point]) -> list[int]:
  """Axes whose values change the model size (e.g. zipped d_model/num_heads)."""
  by_key = {p.key: p for p in points}
  out = []
  for ai, axis in enumerate(record.axes):
    for ctx in contexts(record.axes, ai):
      sizes = [p.num_params for vi in range(len(axis.values))
               if (p := by_key.get(comparisons.point_at(ctx, ai, vi))) and p.num_params]
      if len(sizes) > 1 and max(sizes) >= SIZE_RATIO * min(sizes):
        out.append(ai)
        break
  return out


def scale_effects(record: SweepRecord, points: Sequence[Point], rows: Sequence[Comparison]
                  ) -> list[ScaleEffect]:
  """For a size axis: each other axis's difference from its base (``compared_by``)
  against the parameter count of the context, with its interval."""
  out = []
  for size_ai in size_axes(record, points):
    by_key = {p.key: p for p in points}
    for row in rows:
      if row.axis_index == size_ai or row.metric != compared_by(record):
        continue
      point = by_key.get(row.key_of(row.value_index))
      if point is None or not point.num_params:
        continue
      iv = row.interval
      out.append(ScaleEffect(size_axis=record.axes[size_ai].label, axis=row.axis,
                             value=row.value, base_value=row.base_value,
                             context=row.context, num_params=point.num_params,
                             diff=iv.diff, low=iv.low, high=iv.high, verdict=row.verdict))
  return out



# ------------------------------------------------------------------ report.md
def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  if not report.scale:
    return []
  out = ["## Effects against model size", "",
         "Each axis's difference from its base value at each model size of the "
         "size axis, with its 95% interval.", ""]
  for key, name in plots.items():
    if key.startswith("scale:"):
      out += [f"![effects against size]({name})", ""]
  return out



def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The effects against size."""
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  if report.scale and plots_lib.scale_plot(sweep_dir / "scale.png", ctx.record, report, palette):
    return {"scale:": "scale.png"}
  return {}
