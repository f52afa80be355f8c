"""The report's title: the sweep's name and description; report.json's
identity (the sweep, what it selects by, its tuned grids, the compared split)
and what it was judged with (the options, each run's baseline).
"""

from __future__ import annotations

from typing import Any, Mapping

from tfx_jax.report.context import Context
from tfx_jax.report.schema import Report
from tfx_jax.report.tables import Lines


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's sweep, selection metric, tuned grids, split, options and baselines."""
  record = ctx.record
  return {"sweep": record.name, "select_by": record.select_by, "tune": dict(record.tune),
          "report_split": record.report_split, "options": ctx.options,
          "baselines": dict(sorted(ctx.baselines.items()))}


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """``# Sweep `name` `` and the sweep's description."""
  record = ctx.record
  return [f"# Sweep `{record.name}`", ""] + ([record.description, ""]
                                             if record.description else [])
