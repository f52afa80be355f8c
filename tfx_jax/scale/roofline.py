"""A roofline estimate of a step's time from its counts and a chip's peaks.

Three lower bounds on the step time of one device (Williams et al. 2009,
"Roofline"; the accounting of Austin et al. 2025, "How to Scale Your Model"):

  compute       FLOPs / peak FLOP/s
  memory        bytes read and written in HBM / HBM bandwidth
  interconnect  bytes each device sends in the collectives / ICI bandwidth

A collective over a group of n devices moves, per device, with ring
algorithms: (n - 1) / n of the whole buffer for an all-gather, a
reduce-scatter or an all-to-all; twice that for an all-reduce (a
reduce-scatter then an all-gather); the buffer for a collective-permute.

The estimate is the largest bound (perfect overlap of the three), so it is a
lower bound on the step time and the MFU it implies an upper bound: real
steps reach a fraction of it. Only the counts under it (FLOPs, bytes,
collectives) are the compiler's own; the time and MFU are estimates.
"""

from __future__ import annotations

import dataclasses

from tfx_jax.scale import chips as chips_lib
from tfx_jax.scale import hlo


@dataclasses.dataclass(frozen=True)
class Roofline:
  compute_s: float
  memory_s: float
  interconnect_s: float
  model_flops_per_device: float
  peak_tflops: float

  @property
  def step_s(self) -> float:
    return max(self.compute_s, self.memory_s, self.interconnect_s)

  @property
  def bound(self) -> str:
    times = {"compute": self.compute_s, "memory": self.memory_s,
             "interconnect": self.interconnect_s}
    return max(times, key=times.get)

  @property
  def mfu(self) -> float:
    """Model FLOPs per second over the peak, at the estimated step time."""
    return self.model_flops_per_device / (self.step_s * self.peak_tflops * 1e12)


def sent_bytes(c: hlo.Collective) -> float:
  """Bytes one device sends for one collective (module docstring)."""
  if c.group <= 1:
    return 0.0
  share = (c.group - 1) / c.group
  if c.kind == "all-reduce":
    return 2.0 * share * c.bytes
  if c.kind == "collective-permute":
    return float(c.bytes)
  return share * c.bytes


def estimate(counts: hlo.ProgramCounts, chip: chips_lib.Chip, dtype: str, *,
             step_flops: float, model_flops: float) -> Roofline:
  """The bounds of one device's step: ``step_flops`` the FLOPs it executes
  (at least the compiled count), ``model_flops`` its share of the model's."""
  peak = chip.peak_tflops(dtype) or chip.bf16_tflops
  comm = sum(c.count * sent_bytes(c) for c in counts.collectives)
  return Roofline(
      compute_s=step_flops / (peak * 1e12),
      memory_s=counts.bytes_accessed / (chip.hbm_gbps * 1e9),
      interconnect_s=comm / (chip.ici_gbps * 1e9) if chip.ici_gbps else 0.0,
      model_flops_per_device=model_flops, peak_tflops=peak)
