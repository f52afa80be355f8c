"""Seed statistics of a sweep report: mean +- std, and the difference of two
configurations with a 95% Welch t confidence interval.

Welch's interval (Welch 1947) for the difference of means of two independent
samples with unequal variances:

  d = mean(a) - mean(b),  se = sqrt(s_a^2 / n_a + s_b^2 / n_b)
  df = se^4 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))
  d +- t_{0.975, df} * se

(Welch-Satterthwaite degrees of freedom; s^2 the unbiased sample variance).
Runs with different seeds are independent samples; it needs at least two
finished seeds on each side.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from scipy import stats as scipy_stats


@dataclasses.dataclass(frozen=True)
class Interval:
  diff: float
  low: float | None  # None: fewer than two seeds on a side
  high: float | None
  df: float | None

  @property
  def known(self) -> bool:
    return self.low is not None

  def excludes_zero(self) -> bool:
    return self.known and (self.low > 0 or self.high < 0)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and unbiased (n - 1) standard deviation; std 0 for one value."""
  n = len(values)
  if n == 0:
    return math.nan, math.nan
  mean = sum(values) / n
  if n == 1:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var)


def t_quantile(p: float, df: float) -> float:
  """The p-quantile of Student's t with ``df`` (possibly fractional) degrees of freedom."""
  return float(scipy_stats.t.ppf(p, df))


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
  """mean(a) - mean(b) with its Welch t interval at ``level``."""
  ma, sa = mean_std(a)
  mb, sb = mean_std(b)
  diff = ma - mb
  na, nb = len(a), len(b)
  if na < 2 or nb < 2:
    return Interval(diff, None, None, None)
  va, vb = sa * sa / na, sb * sb / nb
  se2 = va + vb
  if se2 == 0.0:  # identical values on both sides: no spread to speak of
    return Interval(diff, diff, diff, float(na + nb - 2))
  df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
  half = t_quantile(0.5 + level / 2, df) * math.sqrt(se2)
  return Interval(diff, diff - half, diff + half, df)
