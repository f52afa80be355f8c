"""The cells and tables of report.md that every section writes the same way."""

from __future__ import annotations

from typing import Sequence

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.points import value_label
from tfx_jax.report.schema import Counts

Lines = list[str]  # a section of report.md, line by line


def markdown_table(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines)


def pm(values: Sequence[float], digits: int = 4) -> str:
  """"mean ± std" over seeds (the mean alone for one; "-" for none)."""
  if not values:
    return "-"
  mean, std = stats.mean_std(values)
  return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def fmt(x: float | None, digits: int = 4) -> str:
  return "-" if x is None else f"{x:.{digits}f}"


def point_cells(record: SweepRecord, key: Sequence[int]) -> list[str]:
  """A point's value label on each axis."""
  return [value_label(a.values[i], a) for a, i in zip(record.axes, key)]


def outcome_cells(counts: Counts) -> list[str]:
  return [str(counts.learned), str(counts.stalled), str(counts.diverged)]


def seeds_range(seeds: Sequence[int]) -> str:
  """``1-3`` for three or more consecutive seeds, else ``1, 3``."""
  seeds = sorted(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def mean_interval_cell(values: list[float]) -> str:
  """"mean ± h" over seeds, h the half-width of the mean's 95% t-interval
  (the mean alone for one seed; "-" for none)."""
  if not values:
    return "-"
  mean, half = stats.mean_half_width(values)
  return f"{mean:.3g}" if half is None else f"{mean:.3g} ± {half:.2g}"


def shown_seeds(record: SweepRecord) -> str:
  """Whose runs the per-point tables show (``points.at_chosen``)."""
  if any(e.stage == "confirm" for e in record.runs):
    return "each point's confirmation seeds"
  return "the seeds at each point's chosen value" if record.tune else "seeds"
