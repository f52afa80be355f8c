"""The report's section "Learning-rate transfer": for a sweep with a size
axis (``transfer_schema.size_axes``: d_model, or num_layers, zipped with
whatever goes with it) and a tuned learning rate, per variant (each
combination of the other axes' values) the optimum learning rate at each
size, fitted from the tuning curve, and its shift per doubling of size with
the label the sweep's band gives (``optimum``: transfers, drifts,
unresolved), report.json's ``transfer``; and the figure of Yang et al. 2022
(Tensor Programs V, Figure 1): the loss against the learning rate, a curve
per size, a panel per variant, each fitted optimum marked.

The curve is each run's final selection metric on validation (what chose
the point's learning rate) at the point's learning rates, its other tuned
fields at their chosen values (``tuning.sensitivity_labels``); a diverged run
has no loss (+inf in the fit), a run not finished no value.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import optimum
from tfx_jax.report import style
from tfx_jax.report import tuning
from tfx_jax.report.context import Context, lower_is_better
from tfx_jax.report.points import contexts, fmt_value
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.sections import selection
from tfx_jax.report.tables import Lines, markdown_table
from tfx_jax.report.transfer_schema import LEARNING_RATE, Optimum, Transfer, size_axes

PLOT = "transfer.png"


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``transfer`` (none where no axis changes the size, or the
  learning rate is not tuned)."""
  return {"transfer": tuple(transfers(ctx.record, selection.points(ctx)))}


def curve(record: SweepRecord, point: Point) -> tuple[list[float], dict[int, list[float | None]]]:
  """(the point's learning rates ascending, {seed: its loss at each}): the
  selection metric on validation (negated where higher is better, so the
  optimum is a minimum), +inf for a diverged run, None for one not finished."""
  read = tuning.sensitivity_labels(point)
  rows = sorted((r for r in point.tuned if r.label in read and LEARNING_RATE in r.tuned),
                key=lambda r: r.tuned[LEARNING_RATE])
  rates = [float(r.tuned[LEARNING_RATE]) for r in rows]
  if len(set(rates)) != len(rates):  # other tuned fields, none chosen: no one curve
    return [], {}
  sign = 1.0 if lower_is_better(record.select_by) else -1.0
  seeds = sorted({s for r in rows for s in r.seeds})
  losses: dict[int, list[float | None]] = {s: [] for s in seeds}
  for row in rows:
    for seed in seeds:
      run = row.seeds.get(seed)
      value = None
      if run is not None and run.outcome == "diverged":
        value = math.inf
      elif run is not None and run.outcome is not None:
        found = run.validation.get(record.select_by)
        value = None if found is None else sign * found
      losses[seed].append(value)
  return rates, losses


def _optimum(record: SweepRecord, point: Point, size: float) -> tuple[Optimum, optimum.Fit]:
  rates, losses = curve(record, point)
  if not rates:
    fit = optimum.Fit(None, None, reason="no learning-rate curve (the learning rate is not "
                      "tuned here, or tuned beside another field with nothing chosen)")
  else:
    fit = optimum.fit_optimum(rates, losses)
  def rate(u):
    return None if u is None else float(2.0 ** u)
  return Optimum(point=dict(point.values), key=point.key, size=size, best=fit.best,
                 learning_rate=rate(fit.log2_lr), low=rate(fit.low), high=rate(fit.high),
                 se_log2=fit.se, seeds=len(fit.influence), window=fit.window,
                 reason=fit.reason), fit


def transfers(record: SweepRecord, points: Sequence[Point]) -> list[Transfer]:
  """Per size axis and variant: each size's optimum and the shift per
  doubling (``optimum.fit_shift``) against the sweep's band."""
  if LEARNING_RATE not in record.tune:
    return []
  by_key = {p.key: p for p in points}
  band = math.log2(record.transfer_band)
  out = []
  for ai, field in size_axes(record.axes):
    axis = record.axes[ai]
    for ctx in contexts(record.axes, ai):
      found = [(float(axis.values[vi][field]), by_key[key]) for vi in range(len(axis.values))
               if (key := tuple(vi if j == ai else c for j, c in enumerate(ctx))) in by_key]
      if len(found) < 2:
        continue
      found.sort(key=lambda sp: sp[0])
      fitted = [_optimum(record, p, size) for size, p in found]
      shift = optimum.fit_shift([size for size, _ in found], [f for _, f in fitted], band)
      variant = {k: v for k, v in found[0][1].values.items() if k != axis.label}
      out.append(Transfer(
          size_axis=axis.label, size_field=field, variant=variant,
          optima=tuple(o for o, _ in fitted), shift=shift.slope, low=shift.low,
          high=shift.high, se=shift.se, df=shift.df, p=shift.p, seeds=len(shift.seeds),
          band=band, label=shift.label, reason=shift.reason))
  return out


# ------------------------------------------------------------------ report.md
def _rate(x: float | None) -> str:
  return "-" if x is None else f"{x:.3g}"


def optima_table(t: Transfer) -> list[list[str]]:
  """A variant's optimum at each size: [interval], the grid's best, or why none."""
  name = t.size_field.split(".")[-1]
  rows = [[name, "optimum learning rate [95% interval]", "best on the grid", "seeds"]]
  for o in t.optima:
    if o.learning_rate is None:
      cell = f"not fitted: {o.reason}"
    elif o.low is None:
      cell = f"{_rate(o.learning_rate)} (one seed: no interval)"
    else:
      cell = f"{_rate(o.learning_rate)} [{_rate(o.low)}, {_rate(o.high)}]"
    rows.append([fmt_value(o.size) if o.size != int(o.size) else str(int(o.size)), cell,
                 _rate(o.best), str(o.seeds)])
  return rows


def shift_line(t: Transfer) -> str:
  """The shift per doubling with its interval, as factors too, and the label."""
  name = t.size_field.split(".")[-1]
  if t.shift is None:
    return f"Shift per doubling of {name}: none ({t.reason}); **{t.label}**."
  text = f"{t.shift:+.3f}"
  if t.low is not None:
    text += (f" [{t.low:+.3f}, {t.high:+.3f}] (the optimum x{2 ** t.shift:.3g} per doubling, "
             f"[{2 ** t.low:.3g}, {2 ** t.high:.3g}])")
  fitted = sum(o.learning_rate is not None for o in t.optima)
  return (f"Shift of log2(optimum) per doubling of {name}: {text}, over {fitted} of "
          f"{len(t.optima)} sizes, {t.seeds} seed{'s' * (t.seeds != 1)}; band +-{t.band:.3g} "
          f"(x{2 ** t.band:.3g}): **{t.label}** ({t.reason}).")


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  if not report.transfer:
    return []
  out = ["## Learning-rate transfer", "",
         "Per variant, the optimum learning rate at each size: the vertex of a parabola "
         "in log2(learning rate) through the grid's best rate (the mean over the seeds) "
         "and its neighbours, refused where the best is at the grid's end or beside a "
         "diverged run; its 95% interval by the delta method over seeds (t, seeds - 1 "
         "degrees of freedom). The shift is the slope of log2(optimum) against "
         "log2(size) over the fitted sizes, its interval the delta method paired by seed. "
         "A variant **transfers** where that interval lies inside the sweep's band, "
         "**drifts** where it excludes 0, and is **unresolved** otherwise.", ""]
  for t in report.transfer:
    out += [f"### {t.variant_label} (against {t.size_axis})", "",
            markdown_table(optima_table(t)), "", shift_line(t), ""]
  if PLOT in plots.values():
    out += [f"![loss against learning rate per size]({PLOT})", ""]
  return out


# ------------------------------------------------------------------ figure
def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The loss against the learning rate, one panel per variant."""
  if report.transfer and transfer_plot(sweep_dir / PLOT, ctx.record, report):
    return {"transfer:": PLOT}
  return {}


def transfer_plot(path, record: SweepRecord, report: Report) -> bool:
  """Yang et al.'s Figure 1: per variant (a panel, at most 8) the selection
  metric against the learning rate (log x), one curve per size coloured
  from small to large (the mean over the seeds that learned; each seed a
  faint dot), each fitted optimum a marker at the vertex's rate, on the
  curve's height there, with its interval as a horizontal bar."""
  plt = style.pyplot()
  shown = report.transfer[:8]
  fig, panels = plt.subplots(1, len(shown), figsize=(5.0 * len(shown), 4.0), squeeze=False)
  cmap = plt.get_cmap("viridis")
  by_key = {p.key: p for p in report.points}
  drawn = False
  for panel, t in zip(panels[0], shown):
    for i, o in enumerate(t.optima):
      colour = cmap(0.9 * i / max(1, len(t.optima) - 1))
      point = by_key.get(o.key)
      if point is None:
        continue
      rates, losses = curve(record, point)
      sign = 1.0 if lower_is_better(record.select_by) else -1.0
      means, xs = [], []
      for j, rate in enumerate(rates):
        values = [sign * v[j] for v in losses.values()
                  if v[j] is not None and math.isfinite(v[j])]
        panel.scatter([rate] * len(values), values, color=colour, alpha=style.SEED_ALPHA,
                      s=12, linewidths=0)
        if values:
          xs.append(rate)
          means.append(sum(values) / len(values))
      name = t.size_field.split(".")[-1]
      panel.plot(xs, means, marker="o", markersize=3, color=colour, linewidth=1.6,
                 label=f"{name}={fmt_value(o.size)}")
      if o.learning_rate is not None and len(xs) > 1:
        height = float(np.interp(math.log2(o.learning_rate), np.log2(xs), means))
        if o.low is not None:
          panel.plot([o.low, o.high], [height, height], color=colour, linewidth=1.2)
        panel.scatter([o.learning_rate], [height], marker="*", s=120, color=colour,
                      edgecolors="black", linewidths=0.5, zorder=4)
      drawn = drawn or bool(xs)
    shift = "" if t.shift is None else f"\nshift {t.shift:+.2f} per doubling: {t.label}"
    panel.set_title(f"{t.variant_label}{shift}", fontsize=9)
    panel.set_xscale("log")
    panel.set_xlabel("learning rate (log scale)")
    panel.set_ylabel(style.with_unit(f"final validation {style.metric_name(record.select_by)}",
                                     record.select_by))
    panel.grid(color="#eeeeee")
    panel.legend(fontsize=7)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)
