"""The report's section "Ladder": does the effect hold at scale?

A laddered sweep (``Sweep(ladder=Ladder(...))``, ``records.ladder``) runs
every variant (each combination of the declared axes' values; the base:
every declared axis at its base value) at every rung (a model size) and
budget (tokens per parameter). Per variant, on the runs its verdicts read
(``Point.compared``: the learned confirmation runs where the sweep confirms,
else the learned runs at each point's chosen tuned value), the final loss
on the report's split against each run's training compute C (the plan's
tokens x training FLOPs per token, ``PointCount.flops``):

- the fit ``L(C) = E + A C^-alpha`` (``scaling.fit_ladder``: Chinchilla's
  approach 3, the paired bootstrap over seeds, the identifiability rules and
  the lack-of-fit test against the seed noise), and ``L(N, D)`` in the
  non-embedding parameters and tokens where the ladder has two budgets at
  three sizes (else the library's reason);
- each variant's compute multiplier over the base at its rungs, with its
  interval, its trend per e-fold of compute with its label (constant, grows
  with scale, shrinks with scale, unresolved) and the crossover where the
  curves cross inside the range (``multiplier.multipliers``);
- the backtest: every variant refitted without the largest rung, which it
  predicts (``multiplier.backtest``).

Where a curve is refused (not identifiable, or the form does not fit) the
section says so and the per-rung comparisons (the report's family: the
variants within each rung and budget, ``context.context_axes``) are what is
read. Nothing past the largest rung is claimed: the figure's projection is
dashed and labelled "extrapolation", and no label reads it.

A rung's cost is its runs' core-seconds (``sections.compute``) and the share
of their trunks (a branched ladder's stable phases): each trunk's
core-seconds split equally among the budgets that branch from it.
report.json's ``ladder`` (``ladder_schema``); the figure ``ladder.png``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from tfx_jax.records.ladder import BUDGET_AXIS, RUNG_AXIS
from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import multiplier as mult
from tfx_jax.report import scaling
from tfx_jax.report.context import Context, compared_by, lower_is_better, verdict_runs
from tfx_jax.report.ladder_schema import Ladder, LadderRow, LadderVariant
from tfx_jax.report.points import value_label
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.sections import compute as compute_section
from tfx_jax.report.sections import selection
from tfx_jax.report.tables import Lines, markdown_table, pm

PLOT = "ladder.png"
# The bootstrap's resamples and each form's starts (None: the paper's grid);
# a test sets fewer.
RESAMPLES = scaling.RESAMPLES
STARTS: dict[str, np.ndarray | None] = {"compute": None, "params_tokens": None}


# ------------------------------------------------------------------ numbers
def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``ladder`` (None: the sweep has no ladder)."""
  found = analysis(ctx)
  return {"ladder": None if found is None else found[0]}


def analysis(ctx: Context) -> tuple[Ladder, dict | None] | None:
  """(the section's record, the compute form's fits in memory, {budget (None:
  every budget): fit}, which the figure's bands read), computed once per
  report; None without a ladder."""
  if ctx.record.ladder is None:
    return None
  return ctx.once("ladder", lambda: analyze(ctx.record, selection.points(ctx), ctx.summaries))


def declared_axes(record: SweepRecord) -> list[int]:
  """The axes of the variants: every axis after the ladder's two."""
  return [i for i in range(len(record.axes)) if i not in (RUNG_AXIS, BUDGET_AXIS)]


def variant_label(record: SweepRecord, key: Sequence[int]) -> str:
  """A variant's label: its declared axes' value labels ("base": none declared)."""
  axes = declared_axes(record)
  return ", ".join(value_label(record.axes[i].values[key[i]], record.axes[i])
                   for i in axes) or "base"


def _trunk_shares(record: SweepRecord, summaries: RunSummaries) -> dict[str, float]:
  """{run name: its share of its trunk's core-seconds}: each trunk's split
  equally among the budgets that branch from it."""
  branches: dict[str, list[str]] = {}
  for entry in record.runs:
    if entry.trunk:
      branches.setdefault(entry.trunk, []).append(entry.name)
  out = {}
  for entry, summary in compute_section.trunk_runs(record, summaries):
    cost = compute_section.core_seconds(entry, summary)
    for name in branches.get(entry.name, []):
      if cost is not None:
        out[name] = cost / len(branches[entry.name])
  return out


def _row_cost(record: SweepRecord, summaries: RunSummaries, key: tuple[int, ...],
              shares: Mapping[str, float]) -> float | None:
  """Every run of the point (each tuned value and seed) and its trunks' share."""
  costs = [c for e in record.runs if record.point_key(e) == key
           for c in (compute_section.core_seconds(e, summaries[e.name]), shares.get(e.name))
           if c is not None]
  return sum(costs) if costs else None


def rows(record: SweepRecord, points: Sequence[Point], summaries: RunSummaries
         ) -> list[LadderRow]:
  """Each point of the plan: its counts, its cost and the losses its verdicts read."""
  plan, metric = record.ladder, compared_by(record)
  shares = _trunk_shares(record, summaries)
  out = []
  for point in sorted(points, key=lambda p: p.key):
    count = plan.point(point.key)
    if count is None:
      continue
    losses = {seed: float(v[metric]) for seed, v in sorted(point.compared.items())
              if metric in v and math.isfinite(v[metric]) and v[metric] > 0}
    out.append(LadderRow(
        key=point.key, rung=point.key[RUNG_AXIS], budget=point.key[BUDGET_AXIS],
        variant=variant_label(record, point.key), params=count.params,
        non_embedding_params=count.non_embedding_params, active_params=count.active_params,
        tokens=count.tokens, tokens_per_param=count.tokens / plan.rung_params[point.key[RUNG_AXIS]],
        epochs=plan.epochs(count.tokens), flops=count.flops, branch_step=count.branch_step,
        core_seconds=_row_cost(record, summaries, point.key, shares), losses=losses))
  return out


def _rungs(table: Sequence[LadderRow], budget: int | None = None
           ) -> dict[str, list[scaling.Rung]]:
  """{variant: its rungs as the fitter reads them}, the rows with a loss (at
  ``budget``; None: every budget)."""
  out: dict[str, list[scaling.Rung]] = {}
  for row in table:
    if row.losses and (budget is None or row.budget == budget):
      out.setdefault(row.variant, []).append(scaling.Rung(
          row.flops, dict(row.losses), float(row.non_embedding_params), float(row.tokens)))
  return out


def analyze(record: SweepRecord, points: Sequence[Point], summaries: RunSummaries
            ) -> tuple[Ladder, dict | None]:
  """The section's record and its compute-form fit (module docstring)."""
  metric = compared_by(record)
  table = rows(record, points, summaries)
  base = variant_label(record, tuple(a.reference for a in record.axes))
  measured = [r for r in table if r.losses]
  common = dict(metric=metric, split=record.report_split, runs=verdict_runs(record), base=base,
                rung_fields=tuple(record.ladder.fields), resamples=RESAMPLES,
                level=scaling.LEVEL, band=mult.BAND, rows=tuple(table))
  spans = dict(
      compute_range=(min((r.flops for r in measured), default=0.0),
                     max((r.flops for r in measured), default=0.0)),
      params_range=(min((r.non_embedding_params for r in measured), default=0),
                    max((r.non_embedding_params for r in measured), default=0)))
  ladder = _rungs(table)
  seeds = sorted({s for r in measured for s in r.losses})
  if not lower_is_better(metric) or not ladder:
    note = (f"{metric} is not a loss: the ladder fits a loss" if not lower_is_better(metric)
            else "no rung has a learned run yet")
    return Ladder(**common, **spans, seeds=tuple(seeds), variants=(), note=note), None
  nd = scaling.fit_ladder(ladder, "params_tokens", resamples=RESAMPLES,
                          starts=STARTS["params_tokens"])
  # L(C) along the rungs at each budget: pooled over budgets, the runs of one
  # compute split it differently between N and D, and no L(C) fits them.
  budgets = sorted({r.budget for r in measured})
  plan = record.ladder
  fits: dict[int | None, scaling.LadderFit] = {}
  variants = []
  for budget in budgets if len(budgets) > 1 else [None]:
    series = _rungs(table, budget)
    fit = scaling.fit_ladder(series, "compute", resamples=RESAMPLES, starts=STARTS["compute"])
    fits[budget] = fit
    multipliers = mult.multipliers(fit, base) if base in fit.curves else {}
    sizes = {v: {r.params for r in rungs} for v, rungs in series.items()}
    tests = (mult.backtest(fit, base if base in fit.curves else None, RESAMPLES,
                           starts=STARTS["compute"])
             if all(len(s) > 1 for s in sizes.values()) else {})
    for label in series:
      keys = tuple(r.key for r in table if r.variant == label
                   and (budget is None or r.budget == budget))
      values = {record.axes[i].label: value_label(record.axes[i].values[keys[0][i]],
                                                  record.axes[i]) for i in declared_axes(record)}
      variants.append(LadderVariant(
          label, values, keys, fit.curves[label], nd.curves[label], multipliers.get(label),
          tests.get(label), budget=budget,
          tokens_per_param=None if budget is None else plan.tokens_per_param[budget]))
  return Ladder(**common, **spans, seeds=tuple(seeds), variants=tuple(variants)), fits


# ------------------------------------------------------------------ report.md
def _count(n: float) -> str:
  for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= size:
      return f"{n / size:.3g}{unit}"
  return f"{n:.3g}"


def _ratio(x: float | None) -> str:
  return "-" if x is None else ("inf" if math.isinf(x) else f"{x:.3g}")


def rungs_table(record: SweepRecord, ladder: Ladder) -> list[list[str]]:
  """One row per rung, budget and variant: counts, cost and loss over the seeds."""
  rows_ = [[*(f.split(".")[-1] for f in ladder.rung_fields), "variant",
            "non-embedding params", "params", "tokens", "tokens / param", "epochs",
            "FLOPs", "core time", f"{ladder.metric} (mean ± sd)", "seeds"]]
  for r in ladder.rows:
    rung = record.ladder.rungs[r.rung]
    rows_.append([*(str(rung[f]) for f in ladder.rung_fields), r.variant,
                  _count(r.non_embedding_params), _count(r.params), _count(r.tokens),
                  f"{r.tokens_per_param:.3g}", "-" if r.epochs is None else f"{r.epochs:.3g}",
                  f"{r.flops:.3g}",
                  "-" if r.core_seconds is None else
                  compute_section.fmt_core_time(r.core_seconds),
                  pm(list(r.losses.values())), str(len(r.losses))])
  return rows_


def _parameter(p: scaling.Parameter) -> str:
  if p.low is None:
    return f"{p.value:.4g}"
  return f"{p.value:.4g} [{p.low:.4g}, {p.high:.4g}]"


def _status(curve: scaling.CurveFit) -> str:
  if not curve.identifiable:
    return f"refused: {curve.reason}"
  lof = curve.lack_of_fit
  if lof is not None and lof.rejected:
    return (f"**does not fit** (lack of fit against the seed noise: F = {lof.statistic:.3g}, "
            f"p = {lof.p_value:.3g}): read the per-rung comparisons")
  if lof is not None and lof.p_value is not None:
    return f"fits (lack of fit p = {lof.p_value:.3g})"
  return "fitted" + (f" (lack of fit untested: {lof.reason})" if lof is not None else "")


def constants_table(ladder: Ladder) -> list[list[str]]:
  """Each variant's fitted constants with their intervals, both forms."""
  out = [["variant", "form", "constants [95% interval]", "rungs (runs)", "status"]]
  for v in ladder.variants:
    for curve in (v.fit, v.params_tokens):
      if curve is None:
        continue
      form = "L = E + A C^-α" if curve.form == "compute" else "L = E + A N^-α + B D^-β"
      constants = ", ".join(f"{p.name} {_parameter(p)}" for p in curve.parameters) or "-"
      if not curve.identifiable and curve.parameters:
        constants = f"(refused optimum) {constants}"
      if curve.form != "compute" and v.budget not in (None, 0):
        continue  # L(N, D) is one fit over every budget: listed once
      out.append([v.variant if curve.form != "compute" else v.series, form, constants,
                  f"{curve.distinct} ({curve.points})", _status(curve)])
  return out


def _multiplier_cell(row: mult.RungMultiplier) -> str:
  if row.multiplier is None:
    return f"{row.bound} {_ratio(row.bound_value)}x (outside the base's measured compute)"
  text = f"{row.multiplier:.3g}x"
  iv = row.interval
  if iv is not None:
    low = f"{'<=' if iv.low_beyond else ''}{iv.low:.3g}"
    high = f"{'>=' if iv.high_beyond else ''}{iv.high:.3g}"
    text += f" [{low}, {high}]"
  return text


def trend_line(v: LadderVariant, ladder: Ladder) -> str:
  """The trend of a variant's multiplier, its crossover, or why none."""
  m = v.multiplier
  if m is None:
    return ""
  if m.note:
    return f"- **{v.series}**: no multiplier: {m.note}."
  t = m.trend
  text = f"- **{v.series}** over {ladder.base}: d ln(multiplier) / d ln C = "
  if t.slope is None:
    text += f"none; **{t.label}** ({t.reason})"
  else:
    text += f"{t.slope:+.3f}"
    if t.interval is not None:
      text += f" [{t.interval.low:+.3f}, {t.interval.high:+.3f}]"
    text += (f" per e-fold of compute over {t.rungs} rungs (constant within ±{t.band:g}): "
             f"**{t.label}**" + (f" ({t.reason})" if t.reason else ""))
  c = m.crossover
  if c is not None:
    text += f"; the curves cross at C = {c.compute:.3g} FLOPs"
    if c.interval is not None:
      text += f" [{c.interval.low:.3g}, {c.interval.high:.3g}]"
    text += f" (in {c.share:.0%} of the resamples)"
  return text + "."


def multipliers_table(ladder: Ladder) -> list[list[str]]:
  out = [["variant", "compute (FLOPs)", "loss (measured / fitted)",
          f"multiplier over {ladder.base} [95% interval]"]]
  for v in ladder.variants:
    if v.multiplier is None or v.multiplier.note:
      continue
    for row in v.multiplier.rungs:
      out.append([v.series, f"{row.compute:.3g}", f"{row.loss:.4f} / {row.fitted_loss:.4f}",
                  _multiplier_cell(row)])
  return out


def backtest_table(ladder: Ladder) -> list[list[str]]:
  """Each variant's largest rung as predicted by the fit without it."""
  out = [["variant", "held-out compute", "measured (± se)", "predicted [95% interval]",
          "error", "covered", "multiplier predicted [interval] / measured"]]
  for v in ladder.variants:
    b = v.backtest
    if b is None:
      continue
    if b.note:
      out.append([v.series, "-", "-", f"no fit without the largest rung: {b.note}", "-", "-",
                  "-"])
      continue
    at = {m.compute: m for m in b.multiplier}
    for h in b.held_out:
      se = "" if h.measured_se is None else f" ± {h.measured_se:.4f}"
      iv = "" if h.interval is None else f" [{h.interval.low:.4f}, {h.interval.high:.4f}]"
      m = at.get(h.compute)
      mcell = "-"
      if m is not None:
        miv = ("" if m.interval is None
               else f" [{_ratio(m.interval.low)}, {_ratio(m.interval.high)}]")
        mcell = f"{_ratio(m.predicted)}x{miv} / " + (
            "a bound" if m.full is None else f"{m.full:.3g}x")
      out.append([v.series, f"{h.compute:.3g}", f"{h.measured:.4f}{se}",
                  f"{h.predicted:.4f}{iv}", f"{h.error:+.4f}",
                  "-" if h.covered is None else ("yes" if h.covered else "**no**"), mcell])
  return out


def scope_line(ladder: Ladder) -> str:
  """The range of scale the fits cover, and what is not claimed."""
  (n0, n1), (c0, c1) = ladder.params_range, ladder.compute_range
  ratios = [r.tokens_per_param for r in ladder.rows if r.losses]
  return (f"These fits and labels cover {_count(n0)}-{_count(n1)} non-embedding parameters "
          f"({n1 / n0:.3g}x), {min(ratios):.3g}-{max(ratios):.3g} tokens per parameter and "
          f"{c0:.3g}-{c1:.3g} training FLOPs. Nothing past the largest rung is claimed: the "
          "figure's dashed projection is an extrapolation, and no label reads it.")


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The rungs, the fitted constants, the multipliers and their trends, the backtest."""
  ladder = report.ladder
  if ladder is None:
    return []
  plan = ctx.record.ladder
  out = ["## Ladder: loss against training compute", "",
         f"{len(plan.rungs)} rungs x {len(plan.tokens_per_param)} budgets (tokens per "
         f"parameter {', '.join(f'{b:g}' for b in plan.tokens_per_param)}) x "
         f"{len({r.variant for r in ladder.rows})} variants; `{ladder.metric}` on the "
         f"{ladder.split} split of the runs the verdicts read ({ladder.runs}; seeds "
         f"{', '.join(map(str, ladder.seeds)) or '-'}). Per variant, L(C) = E + A C^-α over "
         "its runs along the rungs, at each budget where the ladder has several (C: tokens x "
         "training FLOPs per token; pooled over budgets, runs of one compute split it "
         "differently between N and D), Chinchilla's approach 3 (Huber on "
         "log L, L-BFGS-B from a grid of starts), and L(N, D) in the non-embedding parameters "
         "and tokens where the ladder has two budgets at three sizes; intervals at "
         f"{ladder.level:.0%} from a paired bootstrap over seeds ({ladder.resamples} "
         "resamples, every variant and rung resampled together). A rung's core time is its "
         "runs' and its share of their trunks. The variants' per-rung comparisons are the "
         "report's (Comparisons): the rungs and budgets are their contexts.", "",
         markdown_table(rungs_table(ctx.record, ladder)), ""]
  if ladder.note:
    return out + [f"No fit: {ladder.note}.", ""]
  out += ["### Fitted constants", "", markdown_table(constants_table(ladder)), ""]
  refused = [v.series for v in ladder.variants if not v.fit.usable]
  if refused:
    out += [f"The compute curve of {', '.join(refused)} is not read (refused, or the form "
            "does not fit): only the per-rung comparisons speak for "
            f"{'it' if len(refused) == 1 else 'them'}.", ""]
  lines = [trend_line(v, ladder) for v in ladder.variants if v.multiplier is not None]
  if lines:
    out += ["### Compute multiplier over the base", "",
            f"At each of a variant's runs' compute C, the compute {ladder.base} would need to "
            "reach the variant's fitted loss, over C, read inside the base's measured compute "
            "(outside it, a bound); its trend is the slope of ln multiplier against ln C.", ""]
    table = multipliers_table(ladder)
    if len(table) > 1:
      out += [markdown_table(table), ""]
    out += [*lines, ""]
  if any(v.backtest is not None for v in ladder.variants):
    out += ["### Backtest: the largest rung predicted without it", "",
            "Every variant refitted on all rungs but the largest, whose loss (and "
            "multiplier) it predicts, an extrapolation one rung out: how far this ladder's "
            "own fit can be trusted.", "", markdown_table(backtest_table(ladder)), ""]
  out += [scope_line(ladder), ""]
  if plots.get("ladder:"):
    out += [f"![loss against training compute per variant]({plots['ladder:']})", ""]
  return out


def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The loss against compute per variant, and the multiplier below it."""
  found = analysis(ctx)
  if found is None or found[1] is None:
    return {}
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import ladder_plot  # pylint: disable=import-outside-toplevel
  if ladder_plot.ladder_plot(sweep_dir / PLOT, found[0], found[1]):
    return {"ladder:": PLOT}
  return {}
