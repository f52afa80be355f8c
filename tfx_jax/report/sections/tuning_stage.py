"""The report's section "Tuning stage", on a sweep with confirmation seeds:
each point's chosen value and its tuning seeds' results there (selected on
those seeds, so for reference only) beside the confirmation seeds' that the
verdicts read."""

from __future__ import annotations

from typing import Mapping

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report.context import Context, compared_at
from tfx_jax.report.schema import Report
from tfx_jax.report.tables import Lines, markdown_table, pm, seeds_range


def tuning_stage_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """Per point: the chosen value, its tuning seeds' results there (validation,
  which chose it, and the compared split) and its confirmation seeds'."""
  metric, split = report.select_by, report.report_split
  rows = [[a.label for a in record.axes]
          + ["chosen", "tuning seeds (learned)", f"{metric} (validation, tuning seeds)",
             f"{metric} ({split}, tuning seeds)",
             f"{metric} ({split}, confirmation seeds)"]]
  for point in report.points:
    row = next((r for r in point.tuned if r.label == point.chosen_label), None)
    learned = [s for s in row.seeds.values() if s.outcome == "learned"] if row else []
    # A stale point's confirmation runs, shown though no verdict reads them.
    confirmed = [s.on(split)[metric] for s in point.confirmation.values()
                 if s.outcome == "learned" and metric in s.on(split)]
    # A stale confirmation: its runs at the value chosen before, which no verdict reads.
    kept = f" (confirmed at {compared_at(point)}, chosen before)" if point.stale else ""
    rows.append(list(point.values.values())
                + [(point.chosen_label or "none learned") + kept,
                   # No tuning run of its own: a transferred point's value
                   # came from its proxy (``sections.provenance``).
                   f"{len(learned)} of {len(row.seeds) if row else 0}" if point.tuned
                   else "none (transferred)",
                   pm([s.validation[metric] for s in learned if metric in s.validation]),
                   pm([s.on(split)[metric] for s in learned if metric in s.on(split)]),
                   pm(confirmed)])
  return rows


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """A sweep with confirmation seeds: its tuning stage, for reference."""
  if report.verdict_runs != "confirmation":
    return []
  return ["## Tuning stage (for reference: selected on these seeds)", "",
          f"Each point's value was chosen on the validation split of the tuning seeds "
          f"({seeds_range(report.tuning_seeds)}), so their results at that value are biased in "
          "the point's favour (a seed lucky at a value is lucky on every split) and no "
          "verdict reads them; the confirmation seeds beside them are the runs the "
          "verdicts read. The tuned values, the grid-edge check and the sensitivity below "
          "are the tuning stage's.", "",
          markdown_table(tuning_stage_table(ctx.record, report)), ""]

