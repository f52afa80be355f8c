"""The ladder's figure (``sections.ladder``): loss against training compute
on log-log axes, a colour per variant, each seed a dot, each fit with its
band over the measured range and its projection past the largest rung
dashed and labelled "extrapolation" (``multiplier.project``); below, each
variant's compute multiplier over the base with its interval band."""

from __future__ import annotations

import math
import pathlib

import numpy as np

from tfx_jax.report import multiplier as mult
from tfx_jax.report import scaling
from tfx_jax.report import style
from tfx_jax.report.ladder_schema import Ladder

# The projection runs to this factor past the largest rung's compute.
PROJECT = 4.0
GRID = 64


def _plain_log(ax) -> None:
  """Plain-number ticks on a log y axis that spans less than a decade (the
  losses, the multipliers): evenly spaced values in its range."""
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel
  lo, hi = ax.get_ylim()
  ticks = [t for t in ticker.MaxNLocator(nbins=6).tick_values(lo, hi) if lo <= t <= hi and t > 0]
  style.plain_axis(ax.yaxis, log=True, ticks=ticks or None)


def _colours(ladder: Ladder) -> dict[str, str]:
  """The base in the base colour, the other variants in the palette's order."""
  others = list(dict.fromkeys(v.variant for v in ladder.variants if v.variant != ladder.base))
  return {ladder.base: style.BASE_COLOUR,
          **{v: style.COLOURS[i % len(style.COLOURS)] for i, v in enumerate(others)}}


# A budget's curve's line style (a ladder of several budgets has one per budget).
BUDGET_STYLES = ("-", "-.", ":", (0, (5, 1)))
MARKERS = ("o", "s", "^", "D")


def _loss_panel(ax, ladder: Ladder, fits: dict, colours) -> bool:
  drawn = projected = False
  for v in ladder.variants:
    colour = colours[v.variant]
    fit = fits[v.budget]
    which = 0 if v.budget is None else v.budget
    rows = [r for r in ladder.rows if r.variant == v.variant and r.losses
            and (v.budget is None or r.budget == v.budget)]
    xs = [r.flops for r in rows for _ in r.losses]
    ys = [loss for r in rows for loss in r.losses.values()]
    name = v.series + (" (base)" if v.variant == ladder.base else "")
    ax.scatter(xs, ys, s=14, color=colour, alpha=0.7, label=name, zorder=3,
               marker=MARKERS[which % len(MARKERS)])
    drawn = drawn or bool(xs)
    if not v.fit.usable:
      continue
    lo, hi = v.fit.compute_range
    inside = np.geomspace(lo, hi, GRID)
    curve = scaling.band(fit, v.variant, inside)
    ax.plot(inside, curve[0], color=colour, linewidth=1.5,
            linestyle=BUDGET_STYLES[which % len(BUDGET_STYLES)])
    if np.isfinite(curve[1]).any():
      ax.fill_between(inside, curve[1], curve[2], color=colour, alpha=style.SEED_ALPHA,
                      linewidth=0)
    past = mult.project(fit, v.variant, np.geomspace(hi, PROJECT * hi, GRID // 4))
    ax.plot([p.compute for p in past], [p.loss for p in past], color=colour, linestyle="--",
            linewidth=1.2, label=None if projected else "extrapolation (past the largest rung)")
    projected = projected or bool(past)
  ax.set_xscale("log")
  ax.set_yscale("log")
  _plain_log(ax)
  ax.set_ylabel(style.with_unit(f"{style.metric_name(ladder.metric)} ({ladder.split})",
                                ladder.metric))
  ax.set_title(f"Loss against training compute: fit with its {ladder.level:.0%} band, "
               "dashed past the largest rung", fontsize=9)
  ax.grid(color="#eeeeee", which="both")
  ax.legend(fontsize=8)
  return drawn


def _multiplier_panel(ax, ladder: Ladder, colours) -> None:
  for v in ladder.variants:
    m = v.multiplier
    if m is None or m.note:
      continue
    colour = colours[v.variant]
    which = 0 if v.budget is None else v.budget
    inside = [r for r in m.rungs if r.multiplier is not None]
    xs = [r.compute for r in inside]
    ax.plot(xs, [r.multiplier for r in inside], marker=MARKERS[which % len(MARKERS)],
            color=colour, linewidth=1.2, linestyle=BUDGET_STYLES[which % len(BUDGET_STYLES)],
            label=f"{v.series}: {m.trend.label}" if m.trend else v.series)
    banded = [r for r in inside if r.interval is not None]
    if banded:
      ax.fill_between([r.compute for r in banded], [r.interval.low for r in banded],
                      [r.interval.high for r in banded], color=colour,
                      alpha=style.SEED_ALPHA, linewidth=0)
    for r in m.rungs:  # a bound: a triangle pointing the way it goes
      if r.bound is not None and r.bound_value is not None and math.isfinite(r.bound_value):
        ax.scatter([r.compute], [r.bound_value], color=colour,
                   marker="^" if r.bound == "more than" else "v", s=24)
  ax.axhline(1.0, color="#444444", linewidth=1.0)
  ax.set_xscale("log")
  ax.set_yscale("log")
  _plain_log(ax)
  ax.set_xlabel("training compute C (FLOPs, log scale)")
  ax.set_ylabel(f"compute multiplier over {ladder.base}")
  ax.grid(color="#eeeeee", which="both")
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)


def ladder_plot(path: pathlib.Path, ladder: Ladder, fits: dict) -> bool:
  """Writes the figure (False: nothing to draw); ``fits``: {budget (None:
  every budget): the compute form's fit}."""
  plt = style.pyplot()
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.5, 6.5), sharex=True,
                                    gridspec_kw={"height_ratios": [2, 1]})
  colours = _colours(ladder)
  drawn = _loss_panel(top, ladder, fits, colours)
  _multiplier_panel(bottom, ladder, colours)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)
