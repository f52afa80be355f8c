"""Evaluated another way: RoPE scaled at evaluation only (``evaluate --lengths
--rope_scaling``) against the same models as trained, paired by seed, at each
length (report.json's ``evaluation_effects``). It applies where some run was
evaluated with scaled positions; its table follows the length extrapolation
(``sections.lengths``), whose numbers it tests."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import (Context, adjust, exploratory, lower_is_better, margin_for,
                                    point_verdict_runs)
from tfx_jax.report.points import at_chosen
from tfx_jax.report.schema import EvaluationEffect, Options, Point, Report
from tfx_jax.report.sections import lengths, selection
from tfx_jax.report.tables import Lines, markdown_table, shown_seeds


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``evaluation_effects`` (none where no run was evaluated scaled)."""
  return {"evaluation_effects": tuple(evaluation_effects(
      ctx.record, selection.points(ctx), ctx.summaries, ctx.options))}


def evaluation_effects(record: SweepRecord, points: Sequence[Point], summaries: RunSummaries,
                       options: Options) -> list[EvaluationEffect]:
  """Each point's length perplexities with RoPE scaled at evaluation only
  (``evaluate --lengths --rope_scaling``) against the same models' as trained,
  paired by seed over the runs its verdicts read, at each length; p adjusted
  by Holm over these rows alone (two evaluations of the same models are a
  question apart from the comparisons between models)."""
  untested = []
  for point in points:
    verdict_runs = point_verdict_runs(record, point)
    runs = {seed: summaries[verdict_runs[seed].run] for seed in point.compared
            if seed in verdict_runs}
    tags = sorted({tag for s in runs.values() for tag in s.scaled_lengths})
    for tag in tags:
      multiples = sorted({k for s in runs.values()
                          for k in s.scaled_lengths.get(tag, {})})
      for k in multiples:
        metric = f"ppl@{k}x"
        scaled = {seed: float(v) for seed, s in runs.items()
                  if (v := s.scaled_lengths.get(tag, {}).get(k)) is not None
                  and math.isfinite(v) and metric in point.compared[seed]}
        if not scaled:
          continue
        trained = {seed: point.compared[seed][metric] for seed in scaled}
        untested.append((point, tag.removeprefix("rope-"), metric, tuple(sorted(scaled)),
                         stats.compare(scaled, trained)))
  adjusted = adjust(record, [iv.p_value for *_, iv in untested])
  rows = []
  for (point, how, metric, seeds, iv), p_adj in zip(untested, adjusted):
    margin = margin_for(metric, record.select_by, options)
    rows.append(EvaluationEffect(
        key=point.key, point=", ".join(point.values.values()) or "base config",
        evaluation=how, metric=metric, seeds=seeds, interval=iv, margin=margin,
        p_adjusted=p_adj,
        verdict=stats.verdict(iv, p_adj, margin, options.alpha, lower_is_better(metric))))
  return rows



# ------------------------------------------------------------------ report.md
def evaluation_effects_table(report: Report) -> list[list[str]]:
  rows = [["point", "positions at evaluation", "metric", "seeds",
           "Δ vs as trained [95% CI]", "adjusted p", "verdict"]]
  for e in report.evaluation_effects:
    iv = e.interval
    interval = (f"{iv.diff:+.2f} [{iv.low:+.2f}, {iv.high:+.2f}]" if iv.low is not None
                else f"{iv.diff:+.2f} (no interval)")
    rows.append([e.point, e.evaluation, e.metric, str(iv.n_a), interval,
                 "-" if e.p_adjusted is None else f"{e.p_adjusted:.3g}", f"**{e.verdict}**"])
  return rows



def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The effects' table, under the length extrapolation's (none without it)."""
  record = ctx.record
  if not report.evaluation_effects or not lengths.lengths_table(
      record, at_chosen(ctx.groups, report.chosen())):
    return []
  return ["Scaled at evaluation only against the positions the model was trained "
          f"with: the same models ({shown_seeds(record)}), paired by seed, "
          "perplexity scaled minus as trained. " + (
              "Exploratory: p unadjusted (the sweep's claims are the report's one "
              "family)." if exploratory(record) else
              "p adjusted by Holm over this table's rows, a family of its own: two "
              "evaluations of the same models, not two models."), "",
          markdown_table(evaluation_effects_table(report)), ""]
