"""The report's PNG plots (matplotlib, Agg backend: no display needed).

Every plot colours an axis value the same way (``style.Palette``, built once
per report: the base value near-black), shows each seed faintly behind the
mean, labels its axes with units and its ticks with plain numbers.

- ``forest.png`` (``forest.py``): the headline, every comparison's
  difference from the base with its intervals and verdict;
- ``curves_<axis>.png``: training NLL and validation loss against the step (the
  evaluation at step 0, before training, left out), one line per value of
  the axis (the mean over seeds, each seed a faint line; a tuned sweep shows
  each point at its chosen tuned value), one column per combination of the
  other axes (at most ``MAX_PANELS``);
- ``sensitivity_<field>_<axis>.png`` (tuned sweeps): per axis, the final
  validation metric against each tuned value (log x, ticks at the tuned
  values), one curve per axis value (l(eta) of the sensitivity, the chosen
  value ringed), one panel per combination of the other axes, every finished
  seed a faint point, stalled runs a hollow square under a line at the
  unigram loss, diverged runs an x at l0;
- ``scale.png``: each axis's difference from its base value against the
  parameter count, with its interval (where an axis changes the model size);
- ``lengths.png``: perplexity against the evaluation window, one line per point;
- ``layers.png``: gradient norm per layer at the first logged step.

Each is written by the section it belongs to (its ``plots``, ``sections/``).
"""

from __future__ import annotations

import pathlib
import re
from typing import Any, Sequence

import numpy as np

from tfx_jax.report import collect as collect_lib
from tfx_jax.report import points as points_lib
from tfx_jax.report import style
from tfx_jax.report.points import Points, at_chosen, fmt_value
from tfx_jax.report.schema import Report
from tfx_jax.records.summary import RunSummary
from tfx_jax.records.sweep import AxisRecord, SweepRecord

MAX_PANELS = 8
# Training curves read train/nll, the unsmoothed NLL: train/loss is the
# objective, which label smoothing (its KL form) and z-loss put on other
# scales, so rows that differ in either would not compare on it. Logs without
# train/nll fall back to train/loss.
CURVE_TAGS = ((("train/nll", "train/loss"), "training NLL"),
              (("eval/loss",), "validation loss"))
STOPPED = ("diverged", "failed")  # runs whose curves end early


def file_name(*parts: str) -> str:
  return "_".join(re.sub(r"[^A-Za-z0-9_.+-]", "_", p) for p in parts) + ".png"


def _mean_curve(curves: list[list[tuple[int, float]]]):
  """Steps and the mean over the curves present at each step."""
  by_step: dict[int, list[float]] = {}
  for curve in curves:
    for step, value in curve:
      if np.isfinite(value):
        by_step.setdefault(step, []).append(value)
  steps = sorted(by_step)
  return np.array(steps), np.array([np.mean(by_step[s]) for s in steps])


def _finite(curve):
  return [(s, v) for s, v in curve if np.isfinite(v)]


def _tuned_text(tuned: dict[str, Any] | None) -> str:
  """``learning rate 0.003`` ("" untuned)."""
  return ", ".join(f"{style.tuned_name(k)} {fmt_value(v)}" for k, v in (tuned or {}).items())


def _axis_title(record: SweepRecord, axis_index: int, ctx) -> str:
  """``model.norm_position`` plus the other axes' values where there are any."""
  label = record.axes[axis_index].label
  context = points_lib.context_label(record.axes, ctx, axis_index)
  return label if context == "-" else f"{label}, {context}"


def _shown_runs(record: SweepRecord, points: Points, report: Report | None, key):
  """The runs a curve shows: a tuned sweep's at the point's chosen tuned
  value, its confirmation seeds where it ran them (none when nothing
  learned), every run otherwise."""
  runs = points.get(key, [])
  if not record.tune or report is None:
    return runs, None
  point = report.point(key)
  chosen = None if point is None else point.chosen
  if chosen is None:
    return [], None
  return at_chosen({key: runs}, {key: chosen})[key], chosen


# ------------------------------------------------------------------- curves
def curve_tags(summaries: Sequence[RunSummary]) -> list[tuple[str, str]]:
  """[(tag, name)] of the curves plot's rows: of each row's candidates in
  ``CURVE_TAGS``, the first that every run with curves logged and some run
  logged after step 0 more than once."""
  tags = []
  for candidates, name in CURVE_TAGS:
    logged = [t for t in candidates
              if all(t in s.curves for s in summaries if s.curves)
              and any(sum(step > 0 for step, _ in s.curves.get(t, [])) > 1
                      for s in summaries)]
    if logged:
      tags.append((logged[0], name if logged[0] == candidates[0] else "training loss"))
  return tags


def curves_plot(path: pathlib.Path, record: SweepRecord, points: Points, axis_index: int,
                palette: style.Palette, report: Report | None = None) -> bool:
  """Training NLL (and validation loss) against the step per value of one axis."""
  plt = style.pyplot()
  axis = record.axes[axis_index]
  ctxs = points_lib.contexts(record.axes, axis_index)[:MAX_PANELS]
  tags = curve_tags([s for runs in points.values() for _, s in runs])
  if not tags:
    return False
  fig, panels = plt.subplots(len(tags), len(ctxs), figsize=(5.2 * len(ctxs), 3.6 * len(tags)),
                             squeeze=False)
  drawn = False
  for row, (tag, name) in enumerate(tags):
    for col, ctx in enumerate(ctxs):
      ax = panels[row][col]
      tops: list[float] = []  # the finished runs' highest loss and every run's first
      for vi in range(len(axis.values)):
        key = tuple(vi if j == axis_index else c for j, c in enumerate(ctx))
        runs, chosen = _shown_runs(record, points, report, key)
        # The evaluation at initialisation (step 0, the report's l0) is left
        # out: near ln |V|, it would flatten the curves where they differ.
        shown = [(s.state, [(step, v) for step, v in _finite(s.curves.get(tag, []))
                               if step > 0]) for _, s in runs]
        shown = [(state, c) for state, c in shown if c]
        if not shown:
          continue
        colour = palette.colour(axis_index, vi)
        for state, curve in shown:
          ax.plot(*zip(*curve), color=colour, alpha=style.SEED_ALPHA, linewidth=0.8)
          if state in STOPPED:
            ax.scatter(*curve[-1], marker="x", color=colour, s=30, zorder=3)
        # The mean of the finished runs (of every run while none has finished):
        # one that stopped early would make the mean jump where it ends.
        finished = [c for state, c in shown if state == "finished"]
        averaged = finished or [c for _, c in shown]
        steps, mean = _mean_curve(averaged)
        tops += [v for c in averaged for _, v in c] + [c[0][1] for _, c in shown]
        label = palette.label(axis_index, vi)
        if chosen:
          label += f" at {_tuned_text(chosen)}"
        stopped = sum(state in STOPPED for state, _ in shown)
        counted = len(finished) or len(shown) - stopped  # runs still going count
        seeds = "; ".join(
            ([f"{counted} seed{'s' if counted != 1 else ''}"] if counted else [])
            + ([f"× {stopped} stopped early"] if stopped else []))
        ax.plot(steps, mean, color=colour, linewidth=2.0, label=f"{label} ({seeds})",
                marker="o" if len(steps) < 6 else None, markersize=4)
        drawn = True
      if tops and ax.get_ylim()[1] > max(tops):
        # A run that blew up before it diverged would flatten every other curve.
        low = ax.get_ylim()[0]
        ax.set_ylim(low, max(tops) + 0.05 * (max(tops) - low))
      ax.set_title(f"{name[0].upper() + name[1:]} by {_axis_title(record, axis_index, ctx)}",
                   fontsize=9)
      ax.set_xlabel("training step")
      ax.set_ylabel(style.with_unit(name, tag))
      style.plain_axis(ax.xaxis, integer=True)
      style.plain_axis(ax.yaxis)
      ax.grid(color="#eeeeee")
      if ax.lines:
        ax.legend(fontsize=7, title="mean of the finished seeds (faint: each seed)",
                  title_fontsize=7)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)


# -------------------------------------------------------------- sensitivity
def sensitivity_plot(path: pathlib.Path, record: SweepRecord, report: Report, field: str,
                     axis_index: int | None, palette: style.Palette) -> bool:
  """The selection metric against the tuned ``field`` (other tuned fields at
  the point's chosen values): one panel per combination of the other axes,
  one curve per value of the axis (l(eta) of the sensitivity, each run capped
  at l0 and a diverged one at l0; the mean of the learned runs where l0 is not
  known; the chosen value ringed), each finished seed a faint point, a stalled
  one also a hollow square at its own loss, under a line at the unigram loss
  (the loss a stalled run sits at) where the metric is the loss, each
  diverged run an x at l0.
  ``axis_index`` None: a sweep without axes, its one point."""
  plt = style.pyplot()
  if axis_index is None:
    axis, ctxs = AxisRecord("base config", (), ({},)), [()]
  else:
    axis = record.axes[axis_index]
    ctxs = points_lib.contexts(record.axes, axis_index)[:MAX_PANELS]
  fig, panels = plt.subplots(1, len(ctxs), figsize=(5.5 * len(ctxs), 4.2), squeeze=False)
  by_key = {s.key: s for s in report.sensitivity}
  select_by = report.select_by
  name = style.tuned_name(field)
  metric = style.metric_name(select_by)
  drawn = False
  for panel, ctx in zip(panels[0], ctxs):
    xs_all, failed_any, l0, l0_from = [], False, None, None
    stalled_any, unigram = False, []
    for vi in range(len(axis.values)):
      key = tuple(vi if j == axis_index else c for j, c in enumerate(ctx))
      s = by_key.get(key)
      if s is None:
        continue
      chosen = report.point(key).chosen or {}
      others = {k: v for k, v in chosen.items() if k != field}
      # A point whose own grid does not tune ``field`` has no curve over it.
      curve = sorted((c for c in s.curve if field in c.tuned
                      and all(c.tuned.get(k) == v for k, v in others.items())),
                     key=lambda c: c.tuned[field])
      colour = palette.colour(axis_index, vi)
      label = "base config" if axis_index is None else palette.label(axis_index, vi)
      height = {c.label: c.value if c.value is not None else c.mean for c in curve}
      xs = [c.tuned[field] for c in curve if height[c.label] is not None]
      ys = [height[c.label] for c in curve if height[c.label] is not None]
      panel.plot(xs, ys, marker="o", color=colour, linewidth=2.0, label=label, zorder=3)
      stalled = stalled_runs(report, key)
      unigram += _unigram_losses(report, key)
      for c in curve:
        seeds = [v for v in c.seeds.values() if v is not None]
        panel.scatter([c.tuned[field]] * len(seeds), seeds, color=colour,
                      alpha=style.SEED_ALPHA + 0.1, s=14, linewidths=0, zorder=2)
        if stalled.get(c.label):
          panel.scatter([c.tuned[field]] * len(stalled[c.label]), stalled[c.label],
                        marker="s", s=40, facecolors="none", edgecolors=colour,
                        linewidths=1.2, zorder=3)
          stalled_any = True
        if any(v is None for v in c.seeds.values()):  # a diverged run
          # At l0; where it is not known, at the top edge of the panel.
          known = s.initial_loss is not None
          panel.scatter([c.tuned[field]], [s.initial_loss if known else 0.97],
                        color=colour, marker="x", s=50, zorder=3, clip_on=False,
                        transform=(panel.transData if known
                                   else panel.get_xaxis_transform()))
          failed_any, l0 = True, s.initial_loss if known else l0
          l0_from = s.initial_loss_source if known else l0_from
        if (chosen and c.tuned.get(field) == chosen.get(field)
            and height[c.label] is not None):
          panel.scatter([c.tuned[field]], [height[c.label]], s=220, facecolors="none",
                        edgecolors=colour, linewidths=1.5, zorder=4)
      xs_all += [c.tuned[field] for c in curve]
      drawn = drawn or bool(curve)
    if not xs_all:  # no point of this panel tunes ``field`` (AdamW's Adam ratio)
      panel.set_axis_off()
      continue
    if unigram and select_by == "eval/loss":
      panel.axhline(float(np.mean(unigram)), color="#999999", linestyle="--", linewidth=1.0)
      panel.text(1.0, float(np.mean(unigram)), " unigram loss",
                 transform=panel.get_yaxis_transform(),
                 va="center", ha="left", fontsize=7, color="#666666")
    if l0 is not None:
      panel.axhline(l0, color="#999999", linestyle=":", linewidth=1.0)
      panel.text(1.0, l0, " l0 (step 0)" if l0_from == "step 0" else " l0 = ln|V|",
                 transform=panel.get_yaxis_transform(),
                 va="center", ha="left", fontsize=7, color="#666666")
    title = (f"Final validation {metric} against {name}"
             + ("" if axis_index is None
                else f"\nby {_axis_title(record, axis_index, ctx)}"))
    panel.set_title(title, fontsize=9)
    panel.set_xscale("log")
    if xs_all:  # every tuned value on the axis, those with no learned run too
      panel.set_xlim(min(xs_all) / 1.5, max(xs_all) * 1.5)
    style.plain_axis(panel.xaxis, log=True, ticks=xs_all or None)
    style.plain_axis(panel.yaxis)
    panel.set_xlabel(f"{name} (log scale)")
    panel.set_ylabel(style.with_unit(f"final validation {metric}", select_by))
    panel.grid(color="#eeeeee")
    from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel
    handles, _ = panel.get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", linestyle="", markersize=10,
                       markerfacecolor="none", markeredgecolor="#555555",
                       label="chosen value"),
                Line2D([], [], marker="o", linestyle="", markersize=4, color="#555555",
                       alpha=0.35, label="one seed")]
    if stalled_any:
      handles.append(Line2D([], [], marker="s", linestyle="", markersize=6,
                            markerfacecolor="none", markeredgecolor="#555555",
                            label="stalled run (at its own loss)"))
    if failed_any:
      handles.append(Line2D([], [], marker="x", linestyle="", color="#555555",
                            label="diverged run (at l0)" if l0 is not None
                            else "diverged run (l0 unknown)"))
    panel.legend(handles=handles, fontsize=7)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)


def stalled_runs(report: Report, key: tuple[int, ...]) -> dict[str, list[float]]:
  """{tuned label: the selection metric of each of the point's tuning runs at
  that value that stalled (finished at the unigram loss: counted, not
  averaged)}: the sensitivity plot marks them."""
  point = report.point(key)
  if point is None:
    return {}
  found = {}
  for tuned in point.tuned:
    values = [r.validation[report.select_by] for r in tuned.seeds.values()
              if r.outcome == "stalled" and report.select_by in r.validation]
    if values:
      found[tuned.label] = values
  return found


def _unigram_losses(report: Report, key: tuple[int, ...]) -> list[float]:
  """The unigram entropy of each of the point's tuning runs, where known."""
  point = report.point(key)
  if point is None:
    return []
  baselines = (report.baselines.get(r.run) for t in point.tuned for r in t.seeds.values())
  return [b.unigram_entropy for b in baselines if b and b.unigram_entropy is not None]


# -------------------------------------------------------------------- scale
def _value_index(record: SweepRecord, axis_label: str, value: str) -> tuple[int, int] | None:
  for ai, axis in enumerate(record.axes):
    if axis.label == axis_label:
      for vi, v in enumerate(axis.values):
        if points_lib.value_label(v, axis) == value:
          return ai, vi
  return None


def scale_plot(path: pathlib.Path, record: SweepRecord, report: Report,
               palette: style.Palette) -> bool:
  """Each axis value's difference from its base against the parameter count."""
  plt = style.pyplot()
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  groups: dict[tuple, list] = {}
  for row in report.scale:
    groups.setdefault((row.axis, row.value, row.base_value), []).append(row)
  sizes = []
  for (axis_label, value, base_value), rows in groups.items():
    rows.sort(key=lambda r: r.num_params)
    index = _value_index(record, axis_label, value)
    colour = palette.colour(*index) if index else style.BASE_COLOUR
    xs = [r.num_params for r in rows]
    ys = [r.diff for r in rows]
    err = [[r.diff - r.low if r.low is not None else 0 for r in rows],
           [r.high - r.diff if r.high is not None else 0 for r in rows]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colour,
                label=f"{axis_label}: {value} vs {base_value}")
    sizes += xs
  ax.axhline(0.0, color="#444444", linewidth=1.0)
  ax.set_xscale("log")
  style.plain_axis(ax.xaxis, log=True, ticks=sizes or None)
  style.plain_axis(ax.yaxis)
  metric = style.metric_name(report.select_by)
  ax.set_xlabel("parameters (log scale)")
  ax.set_ylabel(style.with_unit(f"difference in {metric}, value − base", report.select_by))
  ax.set_title(f"Effects against model size ({report.report_split} split, "
               "95% interval)", fontsize=9)
  ax.grid(color="#eeeeee")
  if groups:
    ax.legend(fontsize=8)
  fig.tight_layout()
  return style.save(plt, fig, path, bool(groups))


# ------------------------------------------------------------------ lengths
def lengths_plot(path: pathlib.Path, record: SweepRecord, points: Points,
                 palette: style.Palette) -> bool:
  """Validation perplexity against the evaluation window, one line per point."""
  plt = style.pyplot()
  fig, ax = plt.subplots(figsize=(8.5, 4.2))
  drawn = False
  tokens: dict[int, int] = {}
  for key, runs in points.items():
    mults = sorted({k for _, s in runs for k in s.lengths})
    xs, ys = [], []
    st = palette.point_style(key)
    for k in mults:
      vals = [s.lengths[k] for _, s in runs if s.lengths.get(k) is not None]
      for _, s in runs:
        if k in s.window_tokens:
          tokens[k] = s.window_tokens[k]
      if vals:
        xs.append(k)
        ys.append(float(np.mean(vals)))
        ax.scatter([k] * len(vals), vals, color=st["color"], alpha=style.SEED_ALPHA + 0.1,
                   s=14, linewidths=0)
    if xs:
      ax.plot(xs, ys, marker="o", label=palette.point_label(key), **st)
      drawn = True
    # The same runs evaluated with RoPE scaled: dashed, in the point's colour.
    tags = sorted({t for _, s in runs for t in s.scaled_lengths})
    for n, tag in enumerate(tags):
      pts = sorted((k, float(np.mean(v))) for k in mults if (v := [
          s.scaled_lengths[tag][k] for _, s in runs
          if s.scaled_lengths.get(tag, {}).get(k) is not None]))
      if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=st["color"],
                linestyle=("--", ":", "-.")[n % 3], marker=("s", "^", "v")[n % 3],
                markersize=4, label=f"{palette.point_label(key)} + "
                f"{tag.removeprefix('rope-')} (at evaluation)")
  multiples = sorted({k for runs in points.values() for _, s in runs for k in s.lengths})
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  if multiples:
    from matplotlib import ticker  # pylint: disable=import-outside-toplevel
    ax.xaxis.set_major_locator(ticker.FixedLocator(multiples))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.xaxis.set_major_formatter(ticker.FixedFormatter(
        [f"{k}×" + (f"\n{tokens[k]:,} tokens" if k in tokens else "") for k in multiples]))
  style.plain_axis(ax.yaxis, log=True)
  ax.set_xlabel("evaluation window (multiple of the training length)")
  splits = sorted({s.lengths_split or "validation"
                   for runs in points.values() for _, s in runs if s.lengths})
  ax.set_ylabel(f"{' / '.join(splits) or 'validation'} perplexity (log scale)")
  ax.set_title("Length extrapolation: mean over seeds (faint: each seed)", fontsize=9)
  ax.grid(color="#eeeeee")
  if drawn:  # beside the axes: the lines cross the whole plot
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)


# ------------------------------------------------------------------- layers
STACK_ORDER = {"encoder": 0, "decoder": 1}
LAYER_STATS = {"grad_norm": "gradient norm", "param_norm": "parameter norm",
               "update_norm": "update norm", "init_grad_norm": "gradient norm"}


def layer_stat_name(kind: str) -> str:
  """``grad_norm/ffn_out`` -> "gradient norm of ffn_out"; ``init_grad_norm/all``
  -> "gradient norm of all arrays"."""
  stat, _, param = kind.partition("/")
  name = LAYER_STATS.get(stat, stat.replace("_", " "))
  if param:
    name += " of all arrays" if param == "all" else f" of {param}"
  return name


def layers_plot(path: pathlib.Path, record: SweepRecord, points: Points,
                palette: style.Palette, kind: str | None = None) -> bool:
  """A per-layer statistic at the first step it was logged, one line per point:
  ``kind``, or the one the report shows (``collect.shown_layer_kind``: the
  gradient norm at initialisation where runs logged it)."""
  summaries = [s for runs in points.values() for _, s in runs]
  kind = kind or collect_lib.shown_layer_kind(summaries)
  if kind is None:
    return False
  plt = style.pyplot()
  layers = sorted({k for runs in points.values() for _, s in runs
                   for k in s.layer_stats.get(kind, {})},
                  key=lambda sl: (STACK_ORDER.get(sl[0], 2), sl[0], sl[1]))
  fig, ax = plt.subplots(figsize=(max(6.5, 0.3 * len(layers) + 3), 4.2))
  position = {layer: i for i, layer in enumerate(layers)}
  drawn = False
  for key, runs in points.items():
    mine = [l for l in layers if any(l in s.layer_stats.get(kind, {}) for _, s in runs)]
    if not mine:
      continue
    st = palette.point_style(key)
    xs, ys = [], []
    for layer in mine:
      vals = [s.layer_stats[kind][layer] for _, s in runs
              if layer in s.layer_stats.get(kind, {})]
      ax.scatter([position[layer]] * len(vals), vals, color=st["color"],
                 alpha=style.SEED_ALPHA + 0.1, s=14, linewidths=0)
      xs.append(position[layer])
      ys.append(float(np.mean(vals)))
    ax.plot(xs, ys, marker="o", label=palette.point_label(key), **st)
    drawn = True
  step = max(1, len(layers) // 16)
  ax.set_xticks(range(0, len(layers), step),
                [f"{layers[i][0]} {layers[i][1]}" for i in range(0, len(layers), step)],
                rotation=45 if len(layers) > 6 else 0, fontsize=7, ha="right"
                if len(layers) > 6 else "center")
  ax.set_yscale("log")
  style.plain_axis(ax.yaxis, log=True)
  name = layer_stat_name(kind)
  title, _ = collect_lib.layer_kind_when(kind, summaries)
  ax.set_xlabel("layer")
  ax.set_ylabel(f"{name} {title} (log scale)", fontsize=8)
  ax.set_title(f"{name[0].upper() + name[1:]} per layer {title}: mean over seeds "
               "(faint: each seed)", fontsize=9)
  ax.grid(color="#eeeeee")
  if drawn:
    ax.legend(fontsize=7)
  fig.tight_layout()
  return style.save(plt, fig, path, drawn)
