"""report.json's ``compute``: what a sweep's runs cost, per point and in total,
as the report's compute section computes it (``tfx_jax.report.sections.compute``,
which says how); and its ``step_costs``: each point's train step time and
memory against its base point's (``tfx_jax.report.sections.step_costs``)."""

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


# report.json's ``step_costs``: the times to the microsecond, the ratios to 4
# places, the bytes whole.
def _whole(value: float | None) -> float | None:
  return None if value is None else round(value)


@serial.layout(order=("key", "base", "runs", "step_ms", "step_ms_ratio", "step_bytes",
                      "step_bytes_ratio", "peak_rss_bytes"),
               written={"step_ms": lambda v: None if v is None else round(v, 3),
                        "step_ms_ratio": _rounded, "step_bytes": _whole,
                        "step_bytes_ratio": _rounded, "peak_rss_bytes": _whole})
@dataclasses.dataclass(frozen=True)
class StepCost:
  """One point's train step at its chosen settings, the median over its runs
  (``tfx_jax.report.sections.step_costs``, which says how); None: no run
  recorded it. The ratios are over the ``base`` point's (its own key: the
  base itself; None: the base recorded none)."""
  key: tuple[int, ...]
  base: tuple[int, ...]
  runs: int                      # runs that recorded any of the three
  step_ms: float | None          # milliseconds per train step
  step_ms_ratio: float | None
  step_bytes: float | None       # the compiled train step's bytes per device
  step_bytes_ratio: float | None
  peak_rss_bytes: float | None   # the training process's peak resident bytes
