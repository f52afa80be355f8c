"""The tests of adaptive seeds (``--until-resolved MAX_SEEDS``), valid
whatever look they are read at: the looks and their shares of alpha
(``SequentialDesign``), one look's tests (``sequential_look``), a look's
p-value valid over the looks (``sequential_p``) and the budget of seeds a
difference would need (``sequential_seeds_needed``). Built on the fixed-seed
statistics of ``stats`` (the paired t interval, TOST, the t test's power).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfx_jax.report import stats


# ------------------------------------------------------------ sequential looks
# Adaptive seeds (``--until-resolved MAX_SEEDS``) test the same comparison
# again after every seed added: at a fixed alpha, the chance that some look
# rejects a true null grows with the looks (about 0.15 at alpha 0.05 over
# looks at 2, 3, ..., 6 seeds). The looks are known in advance (seeds added
# one at a time up to MAX_SEEDS), so alpha is split between them beforehand.
SEQUENTIAL_METHOD = ("paired t and TOST at each look's share of alpha, Bonferroni over "
                     "the looks, alpha spent by the power family (n / N)^3")
SEQUENTIAL_REFERENCE = ("Kim and DeMets 1987, \"Design and analysis of group sequential "
                        "tests based on the type I error spending rate function\", "
                        "Biometrika 74:149-154; Lan and DeMets 1983, Biometrika 70:659-663")
RHO = 3.0  # the power family's exponent: O'Brien-Fleming-like, little alpha early


@dataclasses.dataclass(frozen=True)
class SequentialDesign:
  """The looks of adaptive seeds: look k tests ``first + k - 1`` seeds, the last ``last``.

  Alpha is spent over the looks by the power family of Kim and DeMets (1987):
  the looks with at most n seeds together spend alpha * (n / last)^rho, so
  look k spends its share

    w_k = (n_k / N)^rho - ((n_k - 1) / N)^rho   (the first look: (n_1 / N)^rho)

  with N = ``last`` and nothing spent below 2 seeds, where no t test exists;
  the shares sum to 1. Each look's tests run at alpha * w_k, and a rejection
  at any look counts: by the union bound (Bonferroni over the looks),

    P(some look rejects a true null) <= sum_k alpha * w_k = alpha,

  whatever the dependence between looks (they share seeds) and whatever rule
  decides to stop, since every look the rule could take is in the sum. It is
  conservative (at alpha 0.05 and looks at 4-8 seeds the simulated rate is
  0.03): the joint law of the looks' t statistics would spend alpha exactly
  (Lan and DeMets 1983), but it has no closed form for Student's t.
  rho = 3 keeps most of alpha for the last looks (early looks with 2-3 seeds
  have little power to spend it on): simulated at first look 2, N = 8, a true
  difference of 1.5 sd is found with probability 0.85, against 0.73 for
  equal shares and 0.58 for the anytime-valid safe t-test (Grunwald, de
  Heide and Koolen 2024, prior g = 1), which cannot reject at all with 4
  seeds or fewer; fixed-alpha re-testing finds it with 0.97 but rejects a
  true null with 0.18.
  """
  first: int
  last: int
  rho: float = RHO

  def __post_init__(self):
    if not 1 <= self.first <= self.last:
      raise ValueError(f"a sequential design needs 1 <= first <= last seeds, got "
                       f"first={self.first}, last={self.last}")
    if not self.rho > 0.0:
      raise ValueError(f"rho must be positive, got {self.rho}")

  @property
  def looks(self) -> int:
    return self.last - self.first + 1

  def seeds(self, look: int) -> int:
    """The seeds of look ``look`` (1-based)."""
    return self.first + look - 1

  def spent(self, n: int) -> float:
    """The share of alpha the looks with at most ``n`` seeds spend together."""
    return 0.0 if n < 2 else min(1.0, n / self.last) ** self.rho

  def share(self, look: int) -> float:
    """w_k of look ``look`` (1-based); 0 past the last look (no alpha is left)."""
    if look < 1:
      raise ValueError(f"looks count from 1, got {look}")
    if look > self.looks:
      return 0.0
    n = self.seeds(look)
    return self.spent(n) - (self.spent(n - 1) if look > 1 else 0.0)


def sequential_p(p_value: float | None, share: float) -> float | None:
  """A look's p-value made valid over every look of its design: min(1, p / w_k).

  P(p_k / w_k <= a for some look k) <= sum_k a * w_k = a under the null, so it
  is a p-value whichever look it is read at, and Holm's adjustment applies
  to it as to any (``holm``). None stays None (no test); a look with no
  share (w_k = 0) can reject nothing: 1.
  """
  if p_value is None:
    return None
  return 1.0 if share <= 0.0 else min(1.0, p_value / share)


@dataclasses.dataclass(frozen=True)
class SequentialLook:
  """One look of a comparison under a ``SequentialDesign``.

  ``interval``: the paired t interval at level 1 - alpha * w_k (over every
  look together, the mean lies outside at most alpha of the time: a
  confidence sequence by the union bound), its ``p_value`` the look's own;
  ``equivalence``: the TOST at alpha * w_k; ``p_difference`` and
  ``p_equivalence``: their p-values made valid over the looks
  (``sequential_p``), to be Holm-adjusted across the report's comparisons.
  """
  look: int
  looks: int
  share: float
  interval: stats.Interval
  equivalence: stats.Equivalence
  p_difference: float | None
  p_equivalence: float | None


def sequential_look(a: Sequence[float], b: Sequence[float], design: SequentialDesign,
                    look: int, delta: float, alpha: float = 0.05) -> SequentialLook:
  """The tests of look ``look`` on the pairs (a[i], b[i]) it has (``SequentialLook``).

  The equivalence null (the true difference is at least delta away from 0) is
  a shifted mean in the metric's units, not a standardised effect, so the
  anytime-valid safe t-test, built on the scale invariance of d = 0, does not
  apply to it as it stands; the union bound does, to TOST as to the paired t.
  """
  share = design.share(look)
  if share <= 0.0:  # no alpha at this look: shown at 1 - alpha, tests nothing
    interval = stats.paired_interval(a, b, 1.0 - alpha)
    eq = stats.tost(interval, delta, alpha)
    eq = dataclasses.replace(eq, p_value=None if eq.p_value is None else 1.0,
                             equivalent=False)
  else:
    interval = stats.paired_interval(a, b, 1.0 - alpha * share)
    eq = stats.tost(interval, delta, alpha * share)
  return SequentialLook(look, design.looks, share, interval, eq,
                        sequential_p(interval.p_value, share),
                        sequential_p(eq.p_value, share))


def sequential_seeds_needed(diff: float, sd: float, first: int, alpha: float = 0.05,
                            power: float = 0.8, rho: float = RHO,
                            max_n: int = 64) -> int | None:
  """The smallest last look N of a design from ``first`` seeds whose last look
  alone detects ``diff`` with ``power``: a paired t test of N pairs at
  alpha * w_N (``SequentialDesign(first, N).share`` of its last look).

  The design's earlier looks can only add rejections, so its power is at
  least this; N is a budget for ``--until-resolved`` (MAX_SEEDS, counted in
  seeds that enter the verdict). ``alpha`` is the level the design spends
  (the family's, divided by the comparisons it is adjusted with). None when
  no N up to ``max_n`` reaches it, or diff = 0.

  The smallest N, max(first, 2), is a design of one look, which spends all
  of alpha; from the next N on the last look's share falls as the power of
  its extra seeds rises, and "reaches ``power``" (>= 0.5) holds from some N
  on, which bisection finds (checked against a scan of every N in the tests).
  """
  if diff == 0.0:
    return None

  def reaches(n: int) -> bool:
    design = SequentialDesign(first, n, rho)
    return stats.t_test_power(diff, sd, n, True, alpha * design.share(design.looks)) >= power

  single = max(first, 2)
  if single <= max_n and reaches(single):
    return single
  return stats.first_n(reaches, single + 1, max_n)
