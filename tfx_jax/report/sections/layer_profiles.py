"""The report's section "Gradient norm per layer": per point and layer, the
statistic the runs logged (the gradient norm at initialisation,
``train.layer_stats_init_batches``, or at the first logged step,
``train.log_layer_stats``), and per point and stack its profile: whether it
grows or falls from the first layer to the last, paired by seed on the log
scale (Xiong et al. 2020, Figure 3; report.json's ``layer_profiles``). It
applies where runs logged per-layer statistics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import collect as collect_lib
from tfx_jax.report import stats
from tfx_jax.report.context import Context, adjust, exploratory
from tfx_jax.report.points import Points, at_chosen, group_points
from tfx_jax.report.schema import LayerProfile, Options, Point, Report
from tfx_jax.report.sections import selection
from tfx_jax.report.tables import (Lines, markdown_table, mean_interval_cell, point_cells,
                                   shown_seeds)


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``layer_profiles`` (none where no run logged layer statistics)."""
  return {"layer_profiles": tuple(layer_profiles(ctx.record, selection.points(ctx),
                                                 ctx.summaries, ctx.options))}


def layer_profiles(record: SweepRecord, points: Sequence[Point], summaries: RunSummaries,
                   options: Options) -> list[LayerProfile]:
  """Each point's per-layer statistic, the one the report's per-layer table
  shows (``collect.shown_layer_kind``: the gradient norm at initialisation
  where runs logged it), over the runs that table shows (``points.at_chosen``:
  a tuned point's runs at its chosen value, its confirmation runs where it
  has them), per stack: each layer's mean over seeds with its 95%
  t-interval, and last over first, paired by seed on the log scale; p
  adjusted by Holm over these rows alone (a profile is a question apart from
  the comparisons between points). A run counts where it logged every layer
  of the stack with a positive value. A profile equal on every seed to an
  earlier point's (a measurement the axis between them cannot touch: the
  gradient at initialisation does not depend on the warmup that follows) is
  tested once: it takes that profile's p and trend and names it
  (``same_as``), and Holm counts it once."""
  shown = at_chosen(group_points(record, summaries), {p.key: p.chosen for p in points})
  kind = collect_lib.shown_layer_kind([s for runs in shown.values() for _, s in runs])
  if kind is None:
    return []
  untested, first_seen = [], {}
  for point in points:
    runs = [(e.seed, s.layer_stats.get(kind, {})) for e, s in shown.get(point.key, [])]
    for stack in sorted({st for _, values in runs for st, _ in values}):
      layers = sorted({i for _, values in runs for st, i in values if st == stack})
      by_seed = {seed: [values[(stack, i)] for i in layers] for seed, values in runs
                 if all(values.get((stack, i), 0.0) > 0.0 for i in layers)}
      if not by_seed or len(layers) < 2:
        continue
      seeds = sorted(by_seed)
      columns = list(zip(*(by_seed[seed] for seed in seeds)))
      means, halves = zip(*(stats.mean_half_width(list(c)) for c in columns))
      interval = stats.paired_interval([math.log(by_seed[s][-1]) for s in seeds],
                                       [math.log(by_seed[s][0]) for s in seeds])
      label = ", ".join(point.values.values()) or "base config"
      measured = (stack, tuple((seed, tuple(by_seed[seed])) for seed in seeds))
      same_as = first_seen.setdefault(measured, label)
      untested.append(LayerProfile(
          key=point.key, point=label, statistic=kind, stack=stack, seeds=tuple(seeds),
          means=tuple(means), half_widths=tuple(halves), interval=interval,
          p_adjusted=None, trend="unresolved", same_as=None if same_as == label else same_as))
  tested = [row for row in untested if row.same_as is None]
  adjusted = dict(zip([(row.point, row.stack) for row in tested],
                      adjust(record, [row.interval.p_value for row in tested])))
  rows = []
  for row in untested:
    p_adj = adjusted[(row.same_as or row.point, row.stack)]
    diff = row.interval.diff
    resolved = p_adj is not None and p_adj < options.alpha and diff != 0.0
    rows.append(dataclasses.replace(
        row, p_adjusted=p_adj,
        trend=("grows" if diff > 0.0 else "falls") if resolved else "unresolved"))
  return rows



# ------------------------------------------------------------------ report.md
def layer_table(record: SweepRecord, points: Points, kind: str = "grad_norm"
                ) -> list[list[str]] | None:
  layers = sorted({k for runs in points.values() for _, s in runs
                   for k in s.layer_stats.get(kind, {})})
  if not layers:
    return None
  rows = [[a.label for a in record.axes] + [f"{st} {i}" for st, i in layers]]
  for key, runs in points.items():
    cells = []
    for layer in layers:
      vals = [s.layer_stats[kind][layer] for _, s in runs
              if layer in s.layer_stats.get(kind, {})]
      cells.append(mean_interval_cell(vals))
    rows.append(point_cells(record, key) + cells)
  return rows


def layer_trends_table(report: Report) -> list[list[str]]:
  """Each point's per-layer profile per stack: last layer over first with its
  interval, Holm-adjusted p and trend (``Report.layer_profiles``)."""
  rows = [["point", "stack", "layers", "seeds", "first", "last",
           "last / first [95% CI]", "adjusted p", "trend"]]
  for profile in report.layer_profiles:
    ratio, low, high = profile.ratio
    interval = f"{ratio:.2f}" + ("" if low is None else f" [{low:.2f}, {high:.2f}]")
    rows.append([profile.point, profile.stack, str(len(profile.means)),
                 str(len(profile.seeds)), f"{profile.means[0]:.3g}",
                 f"{profile.means[-1]:.3g}", interval,
                 "-" if profile.p_adjusted is None else f"{profile.p_adjusted:.3g}",
                 f"**{profile.trend}**" + ("" if profile.same_as is None else
                                           f" (equal to {profile.same_as}'s: tested once)")])
  return rows


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Gradient norm per layer at initialisation (``train.layer_stats_init_batches``)
  or at the first logged step (``train.log_layer_stats``)."""
  record, shown = ctx.record, at_chosen(ctx.groups, report.chosen())
  summaries = [s for runs in shown.values() for _, s in runs]
  kind = collect_lib.shown_layer_kind(summaries)
  layers = layer_table(record, shown, kind) if kind else None
  if not layers:
    return []
  title, when = collect_lib.layer_kind_when(kind, summaries)
  param = kind.partition("/")[2]
  tag = f"layer_stats/{kind}/<stack>_<layer>"
  arrays = ("every array of the layer" if param in ("", "all") else
            f"the layer's `{param}` arrays (`train.layer_stats_param`)")
  out = [f"## Gradient norm per layer {title}", "",
         f"`{tag}`, the norm over {arrays}: {when}. Each cell is the mean over "
         f"{shown_seeds(record)} "
         "± the half-width of its 95% t-interval. Xiong et al. 2020, Figure 3, plot "
         "the gradient norm of each layer's FFN output matrix W2 (`ffn_out`) at "
         "initialisation averaged over batches: post-norm's grows towards the last "
         "layers, pre-norm's stays flat.", "",
         markdown_table(layers), ""]
  if report.layer_profiles:
    out += ["From the first layer to the last: the last layer's value over the "
            "first's, the geometric mean over the same seeds with its 95% interval "
            "(paired by seed on the log scale); " + (
                "exploratory: p unadjusted (the sweep's claims are the report's one "
                "family). " if exploratory(record) else
                "p adjusted by Holm over this table's rows, a family of their own, a "
                "profile equal on every seed to an earlier row's counted once. ")
            + f"*grows* or *falls*: the p is below {report.options.alpha:g}.", "",
            markdown_table(layer_trends_table(report)), ""]
  if plots.get("layers"):
    out += [f"![gradient norm per layer]({plots['layers']})", ""]
  return out


def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The per-layer statistic against the layer."""
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  if plots_lib.layers_plot(sweep_dir / "layers.png", ctx.record,
                           at_chosen(ctx.groups, report.chosen()), palette):
    return {"layers": "layers.png"}
  return {}
