"""Published peaks of the accelerators a run may be planned for.

Each row is one chip as its maker publishes it: the dense bf16 matrix rate,
the float32 rate (tf32 on NVIDIA's tensor cores; TPUs multiply float32 in
several bf16 passes, so their float32 rate is not published: None), the
high-bandwidth memory and its bandwidth, and the chip's inter-chip
interconnect bandwidth (all links together, one direction). The sources are
the makers' pages named in ``source``. These figures give the roofline's
bounds (``roofline``) and the MFU denominators (``benchmarks/mfu.py``); they
are peaks, which real steps do not reach.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  kind_substrings: tuple[str, ...]  # matched against jax Device.device_kind
  bf16_tflops: float
  f32_tflops: float | None
  hbm_gib: float
  hbm_gbps: float  # GB/s
  ici_gbps: float | None  # GB/s per chip, all inter-chip links, one direction
  source: str
  # What the compiler lets a program use (GiB): libtpu 0.0.42.1's "available
  # HBM" in its out-of-memory refusal (a program larger than the chip's HBM,
  # compiled for one chip of each generation); None: the whole ``hbm_gib``.
  usable_gib: float | None = None

  @property
  def limit_gib(self) -> float:
    """The memory a program may take per device: ``usable_gib`` or ``hbm_gib``."""
    return self.usable_gib if self.usable_gib is not None else self.hbm_gib

  def peak_tflops(self, dtype: str) -> float | None:
    """The dense peak for a computation dtype ("bfloat16", "float32", ...)."""
    return self.bf16_tflops if dtype in ("bfloat16", "float16") else self.f32_tflops


_CLOUD_TPU = "https://cloud.google.com/tpu/docs/"
CHIPS = (
    # Cloud TPU system architecture pages: "Peak compute per chip (bf16)",
    # "HBM capacity / bandwidth" and "Interchip Interconnect BW" (in Gbps there:
    # v5e 1,600, v5p 4,800, v6e 3,584; here / 8 in GB/s). The v4 page gives no
    # per-chip ICI figure: six links (Jouppi et al. 2023, "TPU v4"), taken as
    # 50 GB/s each way, the least certain number of this table.
    Chip("TPU v4", ("TPU v4",), 275.0, None, 32.0, 1200.0, 300.0, _CLOUD_TPU + "v4",
         usable_gib=30.75),
    Chip("TPU v5e", ("TPU v5 lite", "TPU v5e"), 197.0, None, 16.0, 819.0, 200.0,
         _CLOUD_TPU + "v5e", usable_gib=15.75),
    Chip("TPU v5p", ("TPU v5p", "TPU v5"), 459.0, None, 95.0, 2765.0, 600.0,
         _CLOUD_TPU + "v5p", usable_gib=95.74),
    Chip("TPU v6e", ("TPU v6 lite", "TPU v6e"), 918.0, None, 32.0, 1640.0, 448.0,
         _CLOUD_TPU + "v6e", usable_gib=31.25),
    # NVIDIA datasheets (dense, without sparsity): H100 SXM / H200 989.4 bf16,
    # 494.7 tf32 TFLOP/s; H100 PCIe 756 / 378; A100 312 / 156. NVLink 4: 900 GB/s
    # both directions (450 one way); A100 NVLink 3: 600 (300).
    Chip("NVIDIA H200", ("H200",), 989.4, 494.7, 141.0, 4800.0, 450.0,
         "https://www.nvidia.com/en-us/data-center/h200/"),
    Chip("NVIDIA H100 PCIe", ("H100 PCIe",), 756.0, 378.0, 80.0, 2000.0, 300.0,
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Chip("NVIDIA H100", ("H100",), 989.4, 494.7, 80.0, 3350.0, 450.0,
         "https://www.nvidia.com/en-us/data-center/h100/"),
    Chip("NVIDIA A100", ("A100",), 312.0, 156.0, 80.0, 2039.0, 300.0,
         "https://www.nvidia.com/en-us/data-center/a100/"),
)


def chip_of(device_kind: str) -> Chip | None:
  """The row whose substrings occur in a jax ``device_kind`` (first match,
  so the more specific rows come first), or None for an unknown device."""
  for chip in CHIPS:
    if any(s in device_kind for s in chip.kind_substrings):
      return chip
  return None


def by_name(name: str) -> Chip:
  return next(c for c in CHIPS if c.name == name)
