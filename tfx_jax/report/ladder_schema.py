"""report.json's ``ladder``: a laddered sweep's fits, multipliers and
backtest (computed by ``sections.ladder``, whose docstring says how).

  Ladder        the whole: the runs it read, the base variant, the scale
                range, every rung's row and every variant's fits
  LadderRow     one rung at one budget, of one variant: its counts (the
                sweep's ``records.ladder.PointCount``), its cost and its
                losses by seed
  LadderVariant one variant's L(C) fit (and L(N, D) where the ladder has
                two budgets at three sizes), its multiplier over the base
                and the backtest of its largest rung

The fits and multipliers are the library's own records
(``scaling.CurveFit``, ``multiplier.Multiplier``, ``multiplier.Backtest``),
written as they are, so a claim on the multiplier (``report.claims_ladder``)
is labelled from report.json alone.
"""

from __future__ import annotations

import dataclasses

from tfx_jax.records import serial
from tfx_jax.report.multiplier import Backtest, Multiplier
from tfx_jax.report.scaling import CurveFit


@dataclasses.dataclass(frozen=True)
class LadderRow:
  """One variant's runs at one rung and budget (``key``: the point's key)."""
  key: tuple[int, ...]
  rung: int
  budget: int
  variant: str
  params: int
  non_embedding_params: int
  active_params: int
  tokens: int
  # tokens over the rung's non-embedding count (``LadderPlan.rung_params``:
  # the base variant's, so every variant of a rung trains on the same tokens)
  tokens_per_param: float
  epochs: float | None          # passes over the training split (None: size unknown)
  flops: float                  # tokens x training FLOPs per token: the run's compute C
  branch_step: int | None       # where its decay branched from its trunk (None: scratch)
  # Its runs' core-seconds and their trunks' share (``sections.ladder``);
  # None: no run recorded its time.
  core_seconds: float | None
  losses: dict[int, float]      # {seed: the loss the fit reads}


@serial.layout(omit_none=("params_tokens", "multiplier", "backtest", "budget",
                          "tokens_per_param"))
@dataclasses.dataclass(frozen=True)
class LadderVariant:
  """One variant (a combination of the declared axes' values) along the ladder."""
  variant: str                  # its label: the declared axes' value labels
  values: dict[str, str]        # {axis label: value label} of the declared axes
  keys: tuple[tuple[int, ...], ...]  # its points, rung by rung and budget by budget
  fit: CurveFit                 # L(C) = E + A C^-alpha
  params_tokens: CurveFit | None = None  # L(N, D); None: the ladder cannot fit it
  multiplier: Multiplier | None = None   # over the base; None: the base itself
  backtest: Backtest | None = None       # the largest rung held out; None: no fit
  # A ladder of several budgets fits L(C) along the rungs at each budget (a
  # curve's points then differ in size, not in how compute is split between
  # N and D): the budget's index and tokens per parameter; None: every run.
  budget: int | None = None
  tokens_per_param: float | None = None

  @property
  def series(self) -> str:
    """The curve's label: the variant, and its budget where each has its own."""
    if self.tokens_per_param is None:
      return self.variant
    return f"{self.variant} @ {self.tokens_per_param:g} tokens/param"


@dataclasses.dataclass(frozen=True)
class Ladder:
  """A laddered sweep's scaling analysis (``sections.ladder``)."""
  metric: str                   # the loss fitted ("eval/loss")
  split: str                    # the report's split
  runs: str                     # the runs read: ``schema.VerdictRuns``
  base: str                     # the base variant's label
  rung_fields: tuple[str, ...]
  seeds: tuple[int, ...]        # the seeds the bootstrap draws
  resamples: int
  level: float
  band: float                   # the trend's constant band, per e-fold of compute
  compute_range: tuple[float, float]
  params_range: tuple[int, int]  # non-embedding parameters, smallest and largest rung
  rows: tuple[LadderRow, ...]
  variants: tuple[LadderVariant, ...]
  note: str = ""                # why nothing is fitted ("": fitted)

  def variant(self, label: str, budget: int | None = None) -> LadderVariant | None:
    """The variant's curve (at ``budget`` where each budget has its own; None:
    its first)."""
    return next((v for v in self.variants if v.variant == label
                 and (budget is None or v.budget == budget)), None)
