"""The report's "Reproduce" lines: the command that ran the sweep, its base
config, and what became of its runs."""

from __future__ import annotations

from typing import Mapping

from tfx_jax.report.context import Context
from tfx_jax.report.schema import Counts, Report
from tfx_jax.report.tables import Lines


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The command, the base config, and what became of the runs."""
  record, summaries = ctx.record, ctx.summaries
  base = " ".join(f"--config.{k}={v}" for k, v in record.overrides.items())
  counts = sum((p.counts for p in report.points), Counts())
  states: dict[str, int] = {}
  for entry in record.runs:  # a ladder's trunk runs are counted in its compute
    state = summaries[entry.name].state
    states[state] = states.get(state, 0) + 1
  counts += sum((p.confirmation_counts for p in report.points), Counts())
  confirmation = (f"; confirmation seeds {list(record.confirmation_seeds())}"
                  if record.confirm else "")
  return ["Reproduce:", "", "```bash", record.command, "```", "",
          f"Base: `{record.config}`" + (f" `{base}`" if base else ""), "",
          f"{len(record.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in states.items())
          + f"; of the finished, {counts.learned} learned, {counts.stalled} "
          f"stalled, {counts.diverged} diverged; seeds {list(record.seeds)}"
          f"{confirmation}.", ""]

