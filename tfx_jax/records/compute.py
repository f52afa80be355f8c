"""report.json's ``compute``: what a sweep's runs cost, per point and in total,
as the report's compute section computes it (``tfx_jax.report.sections.compute``,
which says how)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class ComputeRow:
  """The runs of one point (``key``; None: the whole sweep) and their cost."""
  key: tuple[int, ...] | None
  runs: int                     # runs with a recorded time
  core_seconds: float           # wall time x cores, summed over the runs
  phases: dict[str, float]      # {status.PHASES: core-seconds}

  @property
  def train_fraction(self) -> float | None:
    """The share of the core-seconds spent in train steps."""
    if self.core_seconds <= 0:
      return None
    return self.phases.get("train_steps", 0.0) / self.core_seconds

  def to_json(self) -> dict[str, Any]:
    return {"key": None if self.key is None else list(self.key), "runs": self.runs,
            "core_seconds": round(self.core_seconds, 3),
            "train_fraction": (None if self.train_fraction is None
                               else round(self.train_fraction, 4)),
            "phases": {p: round(v, 3) for p, v in self.phases.items()}}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> ComputeRow:
    return cls(None if data["key"] is None else tuple(data["key"]), int(data["runs"]),
               float(data["core_seconds"]),
               {p: float(v) for p, v in data["phases"].items()})


@dataclasses.dataclass(frozen=True)
class Compute:
  """Each point's row and the total."""
  points: tuple[ComputeRow, ...]
  total: ComputeRow

  def to_json(self) -> dict[str, Any]:
    return {"points": [p.to_json() for p in self.points], "total": self.total.to_json()}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Compute:
    return cls(tuple(ComputeRow.from_json(p) for p in data["points"]),
               ComputeRow.from_json(data["total"]))
