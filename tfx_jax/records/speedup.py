"""report.json's effective speedups over AdamW (``speedups``): each row's
numbers, as the report's speedup section computes them
(``tfx_jax.report.sections.speedup``, which says how)."""

from __future__ import annotations

import dataclasses
from typing import Literal

LEVEL = 0.95
# Where X's loss lies against the reference curve: beyond its longest run
# ("more than": speedup above longest / steps) or at or above its shortest
# ("at most": speedup at most shortest / steps); None: within the curve.
Bound = Literal["more than", "at most"]


@dataclasses.dataclass(frozen=True)
class Interval:
  """A speedup's interval; an end ``beyond`` lies past the AdamW lengths run,
  so the true end is further out than the value given (a bound)."""
  low: float
  high: float
  low_beyond: bool
  high_beyond: bool
  se_log: float  # standard error of log speedup
  n: int
  level: float = LEVEL


@dataclasses.dataclass(frozen=True)
class Speedup:
  """One optimizer's effective speedup over AdamW in one context."""
  context: str                     # the other axes' values ("-": none)
  point: dict[str, str]            # the point's values, as ``Point.values``
  optimizer: str
  steps: int                       # its own
  metric: str
  split: str
  seeds: tuple[int, ...]           # paired: every point involved learned them
  loss: float | None               # its mean over ``seeds``
  reference_steps: tuple[int, ...]    # AdamW's lengths
  reference_losses: tuple[float, ...]  # their means over ``seeds``
  reference_steps_to_reach: float | None  # S*: AdamW steps to reach ``loss``
  speedup: float | None            # S* / steps; None: a bound, or not known
  bound: Bound | None = None       # outside AdamW's range: the speedup is
  bound_value: float | None = None  # more than / at most this
  interval: Interval | None = None
  not_decayed: tuple[int, ...] = ()  # AdamW lengths whose schedule does not end decayed
  note: str = ""                   # why there is no number, where there is none
