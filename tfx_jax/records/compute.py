"""report.json's ``compute``: what a sweep's runs cost, per point and in total,
as the report's compute section computes it (``tfx_jax.report.sections.compute``,
which says how)."""

from __future__ import annotations

import dataclasses

from tfx_jax.records import serial


def _rounded(value: float | None) -> float | None:
  return None if value is None else round(value, 4)


# report.json rounds the seconds to the millisecond and writes the train
# steps' share and the evaluations' time per train-step second (to 4 places)
# beside them; those are not read back.
@serial.layout(order=("key", "runs", "core_seconds", "train_fraction", "eval_per_train_step",
                      "phases"),
               written={"core_seconds": lambda v: round(v, 3),
                        "phases": lambda phases: {p: round(v, 3) for p, v in phases.items()}},
               derived={"train_fraction": lambda row: _rounded(row.train_fraction),
                        "eval_per_train_step": lambda row: _rounded(row.eval_per_train_step)})
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

  @property
  def eval_per_train_step(self) -> float | None:
    """The evaluations' core-seconds over the train steps' (issue 53 holds a
    shipped ladder to at most 0.15); None: no train-step time recorded."""
    train = self.phases.get("train_steps", 0.0)
    if train <= 0:
      return None
    return self.phases.get("evaluations", 0.0) / train


@serial.layout(omit_none=("trunks",))
@dataclasses.dataclass(frozen=True)
class Compute:
  """Each point's row, the trunk runs' of a branched ladder (None: none),
  and the total (trunks included)."""
  points: tuple[ComputeRow, ...]
  total: ComputeRow
  trunks: ComputeRow | None = None
