"""A claim's test before the family's Holm (``report.claims.evaluate``
adjusts and labels): its estimate with its raw p-values (``Test``), or why
it has none (``Untested``). Every kind of claim's test returns one of the
two: ``report.claims`` for the split metrics, evaluation effects, layer
profiles, speedups and sensitivity, ``report.claims_transfer`` for the
transfer claims."""

from __future__ import annotations

import dataclasses

from tfx_jax.report import stats


@dataclasses.dataclass(frozen=True)
class Test:
  """A claim's estimate with its raw tests (before the family's Holm)."""
  interval: stats.Interval
  p: float | None
  p_equivalence: float | None
  seeds: int
  how: str   # the design, in words


@dataclasses.dataclass(frozen=True)
class Untested:
  """Why a claim has no test; ``descriptive``: its estimate, if any, in words."""
  reason: str
  descriptive: str | None = None
