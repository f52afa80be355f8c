"""How the report's figures look: one colour per axis value, plain tick
labels, metric units, and the matplotlib set-up every plot shares.

Colours: ``Palette`` is built once per report from the sweep's axes, so an
axis value has the same colour in every plot (its loss curves, its
sensitivity curve, its extrapolation line). Each axis's base value is drawn
in near-black; the other values take Tableau colours in order, distinct
across all axes of the sweep while there are enough of them.

Tick labels are plain numbers (``0.0003``, ``290``, ``1.2M``): no
scientific offsets and no ``10^x`` powers, on linear and log axes alike.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any, Sequence

import numpy as np

from tfx_jax.report import points as points_lib
from tfx_jax.report.context import context_axes
from tfx_jax.records.sweep import SweepRecord

BASE_COLOUR = "#222222"
# Tableau 10, then the light halves of Tableau 20: distinct on white.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
           "#c5b0d5", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d")
# Line styles that tell apart the points of one colour (the other axes' values).
LINESTYLES = ("-", "--", ":", "-.")
SEED_ALPHA = 0.25  # each seed behind the mean


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save(plt, fig, path: pathlib.Path, drawn: bool) -> bool:
  """Writes the figure when something was drawn; closes it either way."""
  if drawn:
    fig.savefig(path, dpi=110, bbox_inches="tight")
  plt.close(fig)
  return drawn


class Palette:
  """{(axis index, value index): colour}, one per report."""

  def __init__(self, record: SweepRecord):
    self.axes = record.axes
    self._contexts = context_axes(record)
    self._colours: dict[tuple[int, int], str] = {}
    i = 0
    for ai, axis in enumerate(self.axes):
      for vi in range(len(axis.values)):
        if vi == axis.reference:
          self._colours[(ai, vi)] = BASE_COLOUR
        else:
          self._colours[(ai, vi)] = COLOURS[i % len(COLOURS)]
          i += 1

  def colour(self, axis_index: int | None, value_index: int) -> str:
    if axis_index is None:
      return BASE_COLOUR
    return self._colours[(axis_index, value_index)]

  def label(self, axis_index: int, value_index: int) -> str:
    """The value's legend entry: ``pre (base)``."""
    axis = self.axes[axis_index]
    text = points_lib.value_label(axis.values[value_index], axis)
    base = value_index == axis.reference and text != "base"
    return text + " (base)" if base else text

  def colour_axis(self) -> int | None:
    """The axis that colours a line per point: the first with two values
    that is compared (a ladder's variants, not its rungs: ``context_axes``),
    else the first with two values."""
    varied = [ai for ai, a in enumerate(self.axes) if len(a.values) > 1]
    return next((ai for ai in varied if ai not in self._contexts), varied[0] if varied else None)

  def point_style(self, key: Sequence[int]) -> dict[str, Any]:
    """A point's line: the colour of its value on ``colour_axis``, a line
    style per combination of the other axes (in declaration order)."""
    ai = self.colour_axis()
    if ai is None:
      return {"color": BASE_COLOUR, "linestyle": "-"}
    others = [(j, a) for j, a in enumerate(self.axes) if j != ai and len(a.values) > 1]
    index = 0
    for j, a in others:
      index = index * len(a.values) + key[j]
    return {"color": self.colour(ai, key[ai]),
            "linestyle": LINESTYLES[index % len(LINESTYLES)]}

  def point_label(self, key: Sequence[int]) -> str:
    """``post, position=rope``: the point's values, the varying axes only
    (an axis over several fields names its fields in its value already:
    ``post, num_layers=24,num_steps=1200``)."""
    parts = []
    for j, (a, i) in enumerate(zip(self.axes, key)):
      if len(a.values) < 2:
        continue
      text = points_lib.value_label(a.values[i], a)
      parts.append(text if j == self.colour_axis() or len(a.fields) > 1
                   else f"{a.label.split('.')[-1]}={text}")
    return ", ".join(parts) or "base config"


# ------------------------------------------------------------------ numbers
def plain(x: float, digits: int = 6) -> str:
  """A tick label without exponents: 0.0003, 290, 4.25, 12k, 1.5M."""
  if x is None or not math.isfinite(x):
    return ""
  if x == 0:
    return "0"
  for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e4, "k")):
    if abs(x) >= scale:  # a parameter count to three digits: 526k, 1.5M
      return plain(x / (1e3 if suffix == "k" else scale), 3) + suffix
  rounded = float(f"{x:.{digits}g}")
  return np.format_float_positional(rounded, trim="-")


def plain_axis(axis, log: bool = False, ticks: Sequence[float] | None = None,
               integer: bool = False) -> None:
  """Plain-number labels on a matplotlib x or y axis. ``ticks``: exactly
  these (e.g. the tuned learning rates); else a log axis gets 1-2-5 ticks,
  an ``integer`` one (steps) whole numbers."""
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel
  def label(v, _):
    # A tick at 0 computed as 0.1 + 0.2 - 0.3 is 0, not 5.6e-17.
    span = abs(float(np.diff(axis.get_view_interval())[0]))
    return plain(0.0 if not log and abs(v) < 1e-9 * span else v)
  formatter = ticker.FuncFormatter(label)
  if ticks is not None:
    axis.set_major_locator(ticker.FixedLocator(sorted(set(ticks))))
    axis.set_minor_locator(ticker.NullLocator())
  elif log:
    axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_minor_locator(ticker.NullLocator())
  elif integer:
    axis.set_major_locator(ticker.MaxNLocator(integer=True, steps=(1, 2, 5, 10)))
  axis.set_major_formatter(formatter)
  axis.set_minor_formatter(ticker.NullFormatter())


def unit(metric: str) -> str:
  """The unit of a metric, for axis labels ("" where it has none)."""
  if "loss" in metric or "nll" in metric:
    return "nats"
  if "bleu" in metric or "chrf" in metric:
    return "points"
  return ""


def metric_name(metric: str) -> str:
  """``eval/loss`` -> ``loss``, ``ppl@2x`` -> ``perplexity at 2x the training length``."""
  if metric.startswith("ppl@"):
    return f"perplexity at {metric[4:]} the training length"
  name = metric.split("/", 1)[-1].replace("_", " ")
  return {"nll": "training NLL", "bleu": "BLEU", "bpb": "bits per byte"}.get(name, name)


def with_unit(text: str, metric: str) -> str:
  u = unit(metric)
  return f"{text} ({u})" if u else text


def tuned_name(field: str) -> str:
  """``optim.learning_rate`` -> ``learning rate``."""
  return field.split(".")[-1].replace("_", " ")
