"""The report's section "Noise floor and power": per axis, the base point's
seed-to-seed standard deviation and the smallest difference its comparisons
can detect at 80% power with the seeds they have (report.json's ``noise``)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import Context, compared_by, context_axes
from tfx_jax.report.points import value_label
from tfx_jax.report.schema import Comparison, Noise, Options, Point, Report
from tfx_jax.report.sections import comparisons, selection
from tfx_jax.report.tables import Lines, fmt, markdown_table


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``noise``."""
  return {"noise": tuple(noise_and_power(ctx.record, selection.points(ctx),
                                         comparisons.rows(ctx), ctx.options))}


def noise_and_power(record: SweepRecord, points: Sequence[Point],
                    rows: Sequence[Comparison], options: Options) -> list[Noise]:
  """Per compared axis: the base point's seed standard deviation (``compared_by``, report
  split) and the smallest difference detectable at ``options.power``, by
  the test its comparisons have: at alpha, or with adaptive seeds at the
  current look's share of it (the smallest of the rows with fewest seeds)."""
  select_by = compared_by(record)  # the metric the comparisons lead with
  by_key = {p.key: p for p in points}
  out = []
  for ai, axis in enumerate(record.axes):
    if ai in context_axes(record):
      continue  # no comparisons along it (a ladder's rungs and budgets)
    base_points = [p for k, p in by_key.items() if k[ai] == axis.reference]
    values = [v[select_by] for p in base_points[:1] for v in p.compared.values()
              if select_by in v]
    sd = stats.mean_std(values)[1] if len(values) > 1 else None
    mine = [r for r in rows if r.axis_index == ai and r.metric == select_by]
    paired = [r for r in mine if r.interval.method == "paired" and r.interval.se]
    if paired:
      # The standard deviation of the per-seed differences: se * sqrt(n).
      sds = sorted(r.interval.se * math.sqrt(r.interval.n_a) for r in paired)
      n = min(r.interval.n_a for r in paired)
      alpha = min(options.alpha * r.look.share if r.look is not None else options.alpha
                  for r in paired if r.interval.n_a == n)
      mdd = (stats.min_detectable_difference(sds[len(sds) // 2], n, True, alpha,
                                             options.power) if alpha > 0 else None)
      method = "paired"
    elif sd is not None and len(values) > 1:
      n = len(values)
      mdd = stats.min_detectable_difference(sd, n, False, options.alpha, options.power)
      method = "welch"
    else:
      n, mdd, method = len(values), None, None
    out.append(Noise(axis=axis.label, metric=select_by,
                     base_value=value_label(axis.values[axis.reference], axis),
                     base_sd=sd, seeds=n, min_detectable_difference=mdd, method=method,
                     power=options.power))
  return out



# ------------------------------------------------------------------ report.md
def noise_table(report: Report) -> list[list[str]]:
  rows = [["axis", "base value", "seeds", "seed std (base point)",
           f"smallest detectable Δ at {report.options.power:.0%} power", "method"]]
  for n in report.noise:
    rows.append([n.axis, n.base_value, str(n.seeds), fmt(n.base_sd),
                 fmt(n.min_detectable_difference), n.method or "-"])
  return rows


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  if not report.noise:
    return []
  return ["## Noise floor and power", "",
          f"The base point's seed-to-seed standard deviation of `{report.noise[0].metric}` and "
          "the smallest true difference the current seeds detect with a two-sided t test "
          "at α = 0.05 (noncentral t); more seeds where it exceeds the effects that "
          "matter (`python -m tfx_jax.sweep ... --until-resolved MAX_SEEDS`).", "",
          markdown_table(noise_table(report)), ""]

