"""report.json's ``transfer``: per variant of a sweep with a size axis and a
tuned learning rate, the optimum at each size and its shift per doubling
(``optimum``; computed by ``sections.transfer``), and which axis is the
size axis (``size_axis``).

  Transfer   one variant (the other axes' values) along one size axis: its
             optima, the shift of log2(optimum) per doubling of the size
             field with its interval, the band and the label
  Optimum    the fitted optimum at one size, with its interval, or why none
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from tfx_jax.records.sweep import AxisRecord
from tfx_jax.report.optimum import Label

# The fields whose doubling "per doubling of size" counts, in the order a
# zipped axis setting several is read by: width, then depth.
SIZE_FIELDS = ("model.d_model", "model.num_layers")
LEARNING_RATE = "optim.learning_rate"


@dataclasses.dataclass(frozen=True)
class Optimum:
  """A point's fitted optimum learning rate (``optimum.fit_optimum``)."""
  point: dict[str, str]          # its {axis label: value label}
  key: tuple[int, ...]
  size: float                    # the size field's value (d_model 64)
  best: float | None             # the grid's best rate (mean over the seeds)
  learning_rate: float | None    # the fitted optimum, 2^u* (None: not fitted)
  low: float | None              # its 95% interval (None: fewer than 2 seeds)
  high: float | None
  se_log2: float | None          # the standard error of log2(optimum)
  seeds: int                     # the seeds in the fit
  window: tuple[float, ...]      # the rates fitted
  reason: str = ""               # why not fitted ("": fitted)


@dataclasses.dataclass(frozen=True)
class Transfer:
  """One variant's transfer check along a size axis (``optimum.fit_shift``).
  ``shift``: d log2(optimum) / d log2(size) (log2 units per doubling), with
  its 95% interval, standard error, degrees of freedom and two-sided p of
  0; ``band``: log2 of the sweep's ``transfer_band``; ``label``:
  transfers, drifts, unresolved, or not fitted (``reason``)."""
  size_axis: str                 # the axis's label
  size_field: str                # the field whose doubling is counted
  variant: dict[str, str]        # the other axes' {axis label: value label}
  optima: tuple[Optimum, ...]    # one per size, ascending
  shift: float | None
  low: float | None
  high: float | None
  se: float | None
  df: float | None
  p: float | None
  seeds: int
  band: float
  label: Label
  reason: str = ""

  @property
  def variant_label(self) -> str:
    return ", ".join(self.variant.values()) or "-"


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def size_field(axis: AxisRecord) -> str | None:
  """The size field an axis changes (``SIZE_FIELDS``, first found): one
  every value of the axis sets to a positive number, with 2 or more
  distinct values; None: the axis does not change the model's size."""
  for field in SIZE_FIELDS:
    values = [v.get(field) for v in axis.values]
    if all(_number(v) for v in values) and len(set(values)) > 1:
      return field
  return None


def size_axes(axes: Sequence[AxisRecord]) -> list[tuple[int, str]]:
  """(axis index, size field) of each axis that changes the model's width
  or depth (``size_field``). The report's size effects detect a size axis
  by its parameter counts (``sections.scale.size_axes``); the transfer check
  needs the field whose doubling it counts, known before any run (the
  claims' checks at ``--dry-run``)."""
  return [(i, f) for i, a in enumerate(axes) if (f := size_field(a)) is not None]
