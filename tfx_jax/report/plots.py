"""The report's PNG plots (matplotlib, Agg backend: no display needed).

- ``curves_<axis>.png``: train/loss against step, one line per value of the
  axis (mean over seeds, band = min..max over seeds), one panel per
  combination of the other axes (at most ``MAX_PANELS``);
- ``lengths.png``: perplexity against window length, one line per point;
- ``layers.png``: gradient norm per layer at the first logged step;
- ``sensitivity_<field>_<axis>.png`` (tuned sweeps): per axis, the final
  validation metric against each tuned value (log x), one curve per axis
  value (the mean of its learned runs), one panel per combination of the
  other axes, every seed a faint point, failed runs marked at l0;
- ``scale.png``: each axis's difference from its base value against the
  parameter count, with its interval (where an axis changes the model size).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np

from tfx_jax.report import points as points_lib

MAX_PANELS = 8


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt

def _save(plt, fig, path: pathlib.Path, drawn: bool) -> bool:
  """Writes the figure when something was drawn; closes it either way."""
  fig.tight_layout()
  if drawn:
    fig.savefig(path, dpi=100)
  plt.close(fig)
  return drawn



def _mean_band(curves: list[list[tuple[int, float]]]):
  """Steps, mean, min, max over the curves present at each step."""
  by_step: dict[int, list[float]] = {}
  for curve in curves:
    for step, value in curve:
      if np.isfinite(value):
        by_step.setdefault(step, []).append(value)
  steps = sorted(by_step)
  vals = [by_step[s] for s in steps]
  return (np.array(steps), np.array([np.mean(v) for v in vals]),
          np.array([np.min(v) for v in vals]), np.array([np.max(v) for v in vals]))


def _point_label(record, key) -> str:
  return ", ".join(points_lib.value_label(a["values"][i]) for a, i in zip(record["axes"], key))


def curves_plot(path: pathlib.Path, record, points, axis_index: int,
                tag: str = "train/loss") -> bool:
  plt = _pyplot()
  axis = record["axes"][axis_index]
  ctxs = points_lib.contexts(record, axis_index)[:MAX_PANELS]
  fig, axes = plt.subplots(1, len(ctxs), figsize=(5 * len(ctxs), 3.6), squeeze=False)
  drawn = False
  for panel, ctx in zip(axes[0], ctxs):
    for vi, value in enumerate(axis["values"]):
      key = tuple(vi if j == axis_index else c for j, c in enumerate(ctx))
      curves = [s["curves"][tag] for _, s in points.get(key, []) if tag in s["curves"]]
      if not curves:
        continue
      steps, mean, lo, hi = _mean_band(curves)
      if not len(steps):
        continue
      line, = panel.plot(steps, mean, label=points_lib.value_label(value))
      panel.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
      drawn = True
    panel.set_title(points_lib.context_label(record, ctx, axis_index), fontsize=9)
    panel.set_xlabel("step")
    panel.set_ylabel(tag)
    panel.legend(fontsize=8, title=axis["label"].split(".")[-1], title_fontsize=8)
  return _save(plt, fig, path, drawn)


def lengths_plot(path: pathlib.Path, record, points) -> bool:
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  drawn = False
  for key, runs in points.items():
    mults = sorted({k for _, s in runs for k in s["lengths"]})
    xs, ys = [], []
    for k in mults:
      vals = [s["lengths"][k] for _, s in runs if s["lengths"].get(k) is not None]
      if vals:
        xs.append(k)
        ys.append(float(np.mean(vals)))
    if xs:
      ax.plot(xs, ys, marker="o", label=_point_label(record, key))
      drawn = True
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("window / training length")
  ax.set_ylabel("validation perplexity")
  if drawn:
    ax.legend(fontsize=8)
  return _save(plt, fig, path, drawn)


def layers_plot(path: pathlib.Path, record, points, kind: str = "grad_norm") -> bool:
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  drawn = False
  for key, runs in points.items():
    layers = sorted({k for _, s in runs for k in s["layer_stats"].get(kind, {})})
    if not layers:
      continue
    ys = [float(np.mean([s["layer_stats"][kind][l] for _, s in runs
                         if l in s["layer_stats"].get(kind, {})])) for l in layers]
    ax.plot(range(len(layers)), ys, marker="o", label=_point_label(record, key))
    ax.set_xticks(range(len(layers)), [f"{st[:3]} {i}" for st, i in layers],
                  rotation=45, fontsize=7)
    drawn = True
  ax.set_yscale("log")
  ax.set_ylabel(f"{kind.replace('_', ' ')} at the first logged step")
  if drawn:
    ax.legend(fontsize=7)
  return _save(plt, fig, path, drawn)


def sensitivity_plot(path: pathlib.Path, record, report, field: str,
                     axis_index: int | None) -> bool:
  """The selection metric against the tuned ``field`` (other tuned fields at
  the point's chosen values): one panel per combination of the other axes,
  one curve per value of the axis (the mean of its learned runs), each seed
  a faint point, each failed run an x at l0. ``axis_index`` None: a sweep
  without axes, its one point."""
  plt = _pyplot()
  if axis_index is None:
    axis, ctxs = {"label": "base config", "values": [{}]}, [()]
  else:
    axis = record["axes"][axis_index]
    ctxs = points_lib.contexts(record, axis_index)[:MAX_PANELS]
  fig, panels = plt.subplots(1, len(ctxs), figsize=(5.5 * len(ctxs), 4), squeeze=False)
  by_key = {tuple(s["key"]): s for s in report["sensitivity"]}
  points = {tuple(p["key"]): p for p in report["points"]}
  select_by = report["select_by"]
  drawn = False
  for panel, ctx in zip(panels[0], ctxs):
    for vi, value in enumerate(axis["values"]):
      key = tuple(vi if j == axis_index else c for j, c in enumerate(ctx))
      s = by_key.get(key)
      if s is None:
        continue
      others = {k: v for k, v in (points[key]["chosen"] or {}).items() if k != field}
      curve = sorted((c for c in s["curve"]
                      if all(c["tuned"].get(k) == v for k, v in others.items())),
                     key=lambda c: c["tuned"][field])
      xs = [c["tuned"][field] for c in curve if c["mean"] is not None]
      ys = [c["mean"] for c in curve if c["mean"] is not None]
      line, = panel.plot(xs, ys, marker="o", label=points_lib.value_label(value))
      for c in curve:
        seeds = [v for v in c["seeds"].values() if v is not None]
        panel.scatter([c["tuned"][field]] * len(seeds), seeds, color=line.get_color(),
                      alpha=0.3, s=12)
        if c["failed"] and s["initial_loss"] is not None:
          panel.scatter([c["tuned"][field]], [s["initial_loss"]], color=line.get_color(),
                        marker="x", s=40)
      drawn = drawn or bool(curve)
    context = ("-" if axis_index is None
               else points_lib.context_label(record, ctx, axis_index))
    panel.set_title(f"{axis['label']}" + (f" ({context})" if context != "-" else ""),
                    fontsize=9)
    panel.set_xscale("log")
    panel.set_xlabel(f"{field} (tuned)")
    panel.set_ylabel(f"final {select_by} (validation)")
    panel.legend(fontsize=8, title="x: failed run, at l0", title_fontsize=7)
  return _save(plt, fig, path, drawn)


def scale_plot(path: pathlib.Path, report) -> bool:
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  groups: dict[str, list] = {}
  for row in report["scale"]:
    groups.setdefault(f"{row['value']} vs {row['base_value']}", []).append(row)
  for label, rows in groups.items():
    rows.sort(key=lambda r: r["num_params"])
    xs = [r["num_params"] for r in rows]
    ys = [r["diff"] for r in rows]
    err = [[r["diff"] - r["low"] if r["low"] is not None else 0 for r in rows],
           [r["high"] - r["diff"] if r["high"] is not None else 0 for r in rows]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
  ax.axhline(0.0, color="grey", linewidth=0.8)
  ax.set_xscale("log")
  ax.set_xlabel("parameters")
  ax.set_ylabel(f"Δ {report['select_by']} vs base (95% CI)")
  if groups:
    ax.legend(fontsize=8)
  return _save(plt, fig, path, bool(groups))


def write_plots(sweep_dir: pathlib.Path, record, points, report=None) -> dict[str, str]:
  """Writes every plot that has data; returns {plot key: file name}."""
  out: dict[str, str] = {}
  if report is not None:
    for field, values in record.get("tune", {}).items():
      if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                 for v in values):
        continue  # a non-numeric tuned field has no log axis; its table stays
      for ai in range(len(record["axes"])) or [None]:
        label = "base" if ai is None else record["axes"][ai]["label"]
        name = ("sensitivity_" + re.sub(r"[^A-Za-z0-9_.+-]", "_", field) + "_"
                + re.sub(r"[^A-Za-z0-9_.+-]", "_", label) + ".png")
        if report["sensitivity"] and sensitivity_plot(sweep_dir / name, record, report,
                                                      field, ai):
          out[f"sensitivity:{field}:{ai}"] = name
    if report["scale"] and scale_plot(sweep_dir / "scale.png", report):
      out["scale:"] = "scale.png"
  for ai, axis in enumerate(record["axes"]):
    name = "curves_" + re.sub(r"[^A-Za-z0-9_.+-]", "_", axis["label"]) + ".png"
    if curves_plot(sweep_dir / name, record, points, ai):
      out[f"curves:{ai}"] = name
  if lengths_plot(sweep_dir / "lengths.png", record, points):
    out["lengths"] = "lengths.png"
  if layers_plot(sweep_dir / "layers.png", record, points):
    out["layers"] = "layers.png"
  return out
