"""Seed statistics of a sweep report: pure functions of lists of floats.

Every comparison is ``value - base`` (a minus b) of one metric over seeds.

Paired t interval (Student 1908), when both sides ran the same seeds: the
seed fixes the initialisation and the data order, so the per-seed differences
d_i = a_i - b_i cancel the seed's share of the noise:

  d = mean(d_i),  se = s_d / sqrt(n),  df = n - 1,  d +- t_{(1+level)/2, df} * se

Welch's interval (Welch 1947), for independent samples with unequal variances
(different seeds, or a seed missing on one side):

  d = mean(a) - mean(b),  se = sqrt(s_a^2 / n_a + s_b^2 / n_b)
  df = se^4 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1))
  d +- t_{(1+level)/2, df} * se

(Welch-Satterthwaite degrees of freedom; s^2 the unbiased sample variance).
Both give the two-sided p-value of H0: the true difference is 0,
p = 2 * P(T_df > |d| / se). ``compare`` picks between them by the seeds.

Degenerate cases, so that no NaN reaches a table:
  - fewer than two values on a side (or pairs): only ``diff`` is known; low,
    high, df, se and p_value are None (``Interval.known`` is False);
  - zero spread (se = 0, e.g. identical per-seed differences): the interval is
    the point [d, d], and p_value is the limit of the test as se -> 0:
    0.0 when d != 0, 1.0 when d == 0;
  - an empty side or a non-finite value raises ValueError: a run that diverged
    has no loss to average; classify runs first (``classify_run``) and count
    failures apart.

The rest of the module builds verdicts from these: Holm-adjusted p-values
(``holm``), equivalence by two one-sided tests (``tost``), ``verdict``; the
power of the design (``t_test_power``, ``min_detectable_difference``,
``seeds_needed``); the tests of adaptive seeds, valid whatever look they are
read at (``SequentialDesign``, ``sequential_look``, ``sequential_p``,
``sequential_seeds_needed``); and per-point summaries of runs (``lr_sensitivity``,
``capped_mean``, ``classify_run``; the unigram entropy it compares with is
``tfx_jax.data.baselines.entropy_nats``). The tests of adaptive seeds, valid
whatever look they are read at, are ``stats_sequential``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal, Mapping, Sequence

from scipy import optimize
from scipy import special
from scipy import stats as scipy_stats

Method = Literal["paired", "welch"]


@dataclasses.dataclass(frozen=True)
class Interval:
  """mean difference a - b with its t interval at ``level`` and its test of d != 0.

  ``method``: "paired" (per-seed differences) or "welch" (independent samples).
  ``n_a``, ``n_b``: values on each side; for "paired" both are the number of pairs.
  low, high, df, se, p_value: None when a side has fewer than two values.
  """
  diff: float
  low: float | None
  high: float | None
  df: float | None
  se: float | None
  p_value: float | None
  method: Method
  n_a: int
  n_b: int
  level: float

  @property
  def known(self) -> bool:
    return self.low is not None

  def excludes_zero(self) -> bool:
    return self.known and (self.low > 0 or self.high < 0)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and unbiased (n - 1) standard deviation; std 0 for one value.

  The standard deviation of the base point's seeds is the axis's noise floor:
  differences well below it cannot be told apart from a change of seed.
  """
  n = len(values)
  if n == 0:
    return math.nan, math.nan
  mean = sum(values) / n
  if n == 1:
    return mean, 0.0
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var)


def mean_half_width(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
  """The mean and the half-width of its t-interval at ``level`` (None for one value)."""
  mean, std = mean_std(values)
  if len(values) < 2:
    return mean, None
  return mean, t_quantile(0.5 + level / 2, len(values) - 1) * std / math.sqrt(len(values))


def t_quantile(p: float, df: float) -> float:
  """The p-quantile of Student's t with ``df`` (possibly fractional) degrees of freedom."""
  # SciPy's t.ppf is this function behind its argument checks, which cost
  # 30 times the computation (a report with adaptive seeds computes thousands).
  return float(special.stdtrit(df, p))


def t_sf(x: float, df: float) -> float:
  """P(T_df > x) for Student's t (SciPy's t.sf without its argument checks)."""
  return float(special.stdtr(df, -x))


def _check_inputs(a: Sequence[float], b: Sequence[float], level: float) -> None:
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must lie in (0, 1), got {level}")
  _check_values(a, "a")
  _check_values(b, "b")


def _check_values(values: Sequence[float], side: str) -> None:
  if len(values) == 0:
    raise ValueError(f"{side} has no values: there is nothing to compare")
  bad = [v for v in values if not math.isfinite(v)]
  if bad:
    raise ValueError(f"{side} holds non-finite values {bad}: leave failed runs out "
                     "of the comparison and count them apart (classify_run)")


def _interval(diff: float, se2: float, df: float, method: Method, n_a: int, n_b: int,
              level: float) -> Interval:
  """The t interval and two-sided p-value from d, se^2 and df (shared by both tests)."""
  if se2 == 0.0:  # no spread: the interval is the point; p is the se -> 0 limit
    return Interval(diff, diff, diff, df, 0.0, 0.0 if diff != 0.0 else 1.0,
                    method, n_a, n_b, level)
  se = math.sqrt(se2)
  half = t_quantile(0.5 + level / 2, df) * se
  p_value = 2.0 * t_sf(abs(diff) / se, df)
  return Interval(diff, diff - half, diff + half, df, se, min(p_value, 1.0),
                  method, n_a, n_b, level)


def welch_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
  """mean(a) - mean(b) with its Welch t interval at ``level`` (independent samples)."""
  _check_inputs(a, b, level)
  ma, sa = mean_std(a)
  mb, sb = mean_std(b)
  diff = ma - mb
  na, nb = len(a), len(b)
  if na < 2 or nb < 2:
    return Interval(diff, None, None, None, None, None, "welch", na, nb, level)
  va, vb = sa * sa / na, sb * sb / nb
  se2 = va + vb
  # With no spread at all Welch-Satterthwaite is 0/0; the pooled df stands in.
  df = float(na + nb - 2) if se2 == 0.0 else se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
  return _interval(diff, se2, df, "welch", na, nb, level)


def paired_interval(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Interval:
  """mean(a_i - b_i) with its paired t interval at ``level``; a[i] and b[i] share a seed."""
  if len(a) != len(b):
    raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
  _check_inputs(a, b, level)
  d = [x - y for x, y in zip(a, b)]
  n = len(d)
  diff, sd = mean_std(d)
  if n < 2:
    return Interval(diff, None, None, None, None, None, "paired", n, n, level)
  return _interval(diff, sd * sd / n, float(n - 1), "paired", n, n, level)


def compare(a_by_seed: Mapping[int, float], b_by_seed: Mapping[int, float],
            level: float = 0.95) -> Interval:
  """a - b over seeds: paired when both sides have the same (>= 2) seeds, else Welch.

  ``result.method`` says which. Values are taken in seed order. When the seed
  sets differ (a seed failed on one side), the pairing is dropped rather than
  the unmatched seeds: Welch on all finished values.
  """
  seeds = sorted(a_by_seed)
  if set(a_by_seed) == set(b_by_seed) and len(seeds) >= 2:
    return paired_interval([a_by_seed[s] for s in seeds], [b_by_seed[s] for s in seeds], level)
  return welch_interval([a_by_seed[s] for s in sorted(a_by_seed)],
                        [b_by_seed[s] for s in sorted(b_by_seed)], level)


# ------------------------------------------------------- multiple comparisons
def holm(pvalues: Sequence[float | None]) -> list[float | None]:
  """Holm-Bonferroni adjusted p-values, in input order (Holm 1979).

  Holm, "A simple sequentially rejective multiple test procedure", Scand. J.
  Statist. 6 (1979) 65-70. With the m p-values sorted, p_(1) <= ... <= p_(m):

    p~_(i) = min(1, max_{j <= i} (m - j + 1) * p_(j))

  (step-down: the smallest p is multiplied by m, the next by m - 1, ...; the
  running max keeps the adjusted values in the order of the raw ones).
  Rejecting where p~ < alpha controls the family-wise error rate at alpha for
  any dependence between the tests. Ties keep their input order (the result
  does not depend on it). ``None`` (a comparison that could not be tested,
  ``Interval.p_value`` None) stays None and is not counted in m.
  """
  tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
  m = len(tested)
  adjusted: list[float | None] = [None] * len(pvalues)
  running = 0.0
  for rank, (p, i) in enumerate(tested):
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"p-value {p} at index {i} is not in [0, 1]")
    running = max(running, min(1.0, (m - rank) * p))
    adjusted[i] = running
  return adjusted


# ---------------------------------------------------------------- equivalence
@dataclasses.dataclass(frozen=True)
class Equivalence:
  """Two one-sided tests of |true difference| < delta.

  ``p_value``: max of the two one-sided p-values (None when the comparison has
  fewer than two values a side); ``low``, ``high``: the (1 - 2 alpha) interval
  (90% at alpha 0.05); ``equivalent``: p_value < alpha, i.e. that interval lies
  strictly inside (-delta, +delta).
  """
  p_value: float | None
  low: float | None
  high: float | None
  delta: float
  alpha: float
  equivalent: bool


def tost(result: Interval, delta: float, alpha: float = 0.05) -> Equivalence:
  """Equivalence of a comparison within +-delta by two one-sided t tests (Schuirmann 1987).

  Schuirmann, "A comparison of the two one-sided tests procedure and the power
  approach for assessing the equivalence of average bioavailability",
  J. Pharmacokinet. Biopharm. 15 (1987) 657-680. With d, se, df of ``result``
  (paired or Welch alike):

    p_low  = P(T_df > (d + delta) / se)    H0: true difference <= -delta
    p_high = P(T_df < (d - delta) / se)    H0: true difference >= +delta
    p_TOST = max(p_low, p_high)

  Equivalent at level alpha iff p_TOST < alpha, which is the same as
  d -+ t_{1-alpha, df} * se, the (1 - 2 alpha) interval, lying inside
  (-delta, +delta). delta is in the metric's units (e.g. nats of eval loss).
  With se = 0 each one-sided p is 0 or 1 (the se -> 0 limit).
  """
  if not delta > 0.0:
    raise ValueError(f"the equivalence margin delta must be positive, got {delta}")
  if not 0.0 < alpha < 0.5:
    raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")
  if not result.known:
    return Equivalence(None, None, None, delta, alpha, False)
  d, se, df = result.diff, result.se, result.df
  if se == 0.0:
    p_low = 0.0 if d > -delta else 1.0
    p_high = 0.0 if d < delta else 1.0
    half = 0.0
  else:
    p_low = t_sf((d + delta) / se, df)
    p_high = t_sf((delta - d) / se, df)
    half = t_quantile(1.0 - alpha, df) * se
  p_value = max(p_low, p_high)
  return Equivalence(p_value, d - half, d + half, delta, alpha, p_value < alpha)


Verdict = Literal["better", "worse", "equivalent", "unresolved"]


def verdict(result: Interval, p_adjusted: float | None, delta: float, alpha: float = 0.05,
            lower_is_better: bool = True, equivalence: Equivalence | None = None) -> Verdict:
  """What the seeds say about value vs base (``result`` is value - base).

  In order of precedence:
    1. "better" / "worse": the Holm-adjusted p-value of d != 0 is below alpha;
       the sign of d decides, read through ``lower_is_better`` (loss: d < 0 is
       better; accuracy: d > 0 is better). A significant difference wins even
       when it also lies within +-delta: it is real, if perhaps small.
    2. "equivalent": not significant, and the equivalence test says so:
       ``equivalence`` where given (the sequential analysis passes its
       Holm-adjusted one, ``SequentialLook``), else the TOST of ``result``
       (``tost``, unadjusted, at alpha) puts the difference inside +-delta.
    3. "unresolved": neither; the data cannot decide (too few seeds, too much
       noise for delta, or a single seed a side, where ``p_adjusted`` is None).
  """
  if p_adjusted is not None and p_adjusted < alpha and result.diff != 0.0:
    return "better" if (result.diff < 0.0) == lower_is_better else "worse"
  if (equivalence if equivalence is not None else tost(result, delta, alpha)).equivalent:
    return "equivalent"
  return "unresolved"


# ---------------------------------------------------------------- power
def _design(n: int, paired: bool) -> tuple[float, float]:
  """(df, se per unit sd) of the two-sided t test: paired n pairs, or n per side."""
  if paired:
    return float(n - 1), 1.0 / math.sqrt(n)  # se = sd_d / sqrt(n)
  return float(2 * n - 2), math.sqrt(2.0 / n)  # se = sd * sqrt(1/n + 1/n)


def _power_at_ncp(ncp: float, df: float, alpha: float) -> float:
  c = t_quantile(1.0 - alpha / 2, df)
  # P(T'_ncp > c) = P(T'_-ncp < -c) and P(T'_ncp < -c) by SciPy's nctdtr, the
  # cdf (nct.sf is 40 times slower behind its checks). nctdtr is NaN deep in
  # the lower tail (e.g. df=1, ncp=8), where the probability is below double
  # precision: nct.sf(c, df, -ncp) returns 0 at every such point (tests).
  lower = float(special.nctdtr(df, ncp, -c))
  return float(special.nctdtr(df, -ncp, -c)) + (lower if math.isfinite(lower) else 0.0)


def t_test_power(diff: float, sd: float, n: int, paired: bool, alpha: float = 0.05) -> float:
  """Probability that a two-sided t test at ``alpha`` rejects d = 0 when the truth is ``diff``.

  Under a true difference diff the statistic d / se follows the noncentral t
  with df degrees of freedom and noncentrality ncp = diff / (sd * k):

    paired      n pairs, sd of the per-seed differences:  df = n - 1,   k = sqrt(1/n)
    two-sample  n per side, common sd:                    df = 2n - 2,  k = sqrt(2/n)

    power = P(T'_{df,ncp} > c) + P(T'_{df,ncp} < -c),  c = t_{1 - alpha/2, df}

  (e.g. Cohen, Statistical Power Analysis for the Behavioral Sciences, 1988,
  ch. 2). Needs n >= 2; with sd = 0 any nonzero difference is certain (power 1).
  """
  if n < 2:
    raise ValueError(f"a t test needs n >= 2, got {n}")
  if sd < 0.0:
    raise ValueError(f"sd must be >= 0, got {sd}")
  if sd == 0.0:
    return 1.0 if diff != 0.0 else alpha
  df, k = _design(n, paired)
  return _power_at_ncp(abs(diff) / (sd * k), df, alpha)


def min_detectable_difference(sd: float, n: int, paired: bool, alpha: float = 0.05,
                              power: float = 0.8) -> float:
  """The smallest true difference that the two-sided t test at ``alpha`` detects with ``power``.

  Solves t_test_power(diff) = power for diff exactly, with the noncentral t
  (no normal approximation, which is far off at a handful of seeds): the
  noncentrality is found by root finding (Brent), diff = ncp * sd * k (see
  ``t_test_power`` for df and k of the paired and the two-sample design).
  ``sd`` is the seed-to-seed standard deviation: of the per-seed differences
  for a paired design, of one point's values (the base's, ``mean_std``) for
  two samples. Returns inf for n < 2 (no test is possible), 0 for sd = 0.
  """
  if not 0.0 < alpha < power < 1.0:
    raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
  if sd < 0.0:
    raise ValueError(f"sd must be >= 0, got {sd}")
  if n < 2:
    return math.inf
  if sd == 0.0:
    return 0.0
  df, k = _design(n, paired)
  # The power rises from alpha at ncp = 0 towards 1; widen the bracket until it holds.
  high = 8.0
  while _power_at_ncp(high, df, alpha) < power:
    high *= 2.0
  ncp = optimize.brentq(lambda x: _power_at_ncp(x, df, alpha) - power, 0.0, high,
                        xtol=1e-12, rtol=1e-12)
  return ncp * sd * k


def seeds_needed(diff: float, sd: float, paired: bool, alpha: float = 0.05,
                 power: float = 0.8, max_n: int = 64) -> int | None:
  """The smallest n (pairs, or seeds per side) at which ``t_test_power`` reaches ``power``.

  None when even ``max_n`` does not (or diff = 0, which no n detects). The
  power grows with n (both df and the noncentrality do), so the answer is
  found by bisection: the n with min_detectable_difference(sd, n) <= |diff|
  < min_detectable_difference(sd, n - 1).
  """
  if diff == 0.0:
    return None
  return first_n(lambda n: t_test_power(diff, sd, n, paired, alpha) >= power, 2, max_n)


def first_n(reaches, low: int, high: int) -> int | None:
  """The smallest n in [low, high] where the monotone predicate ``reaches``
  holds (False below it, True from it on); None where it holds nowhere."""
  if high < low or not reaches(high):
    return None
  while low < high:
    mid = (low + high) // 2
    if reaches(mid):
      high = mid
    else:
      low = mid + 1
  return low


# ----------------------------------------------------- learning-rate sensitivity
def capped_mean(losses: Sequence[float | None], l0: float) -> float:
  """The mean of min(l, l0) over runs: each run at its own final loss, capped at l0.

  A run with no finite loss (None, NaN, inf: it diverged) counts as l0, the
  loss of a model that learned nothing; a run that stalled counts at its own
  loss (capped at l0 like any other). This is l(eta) of ``lr_sensitivity``
  and the score by which a tuned value is chosen.
  """
  if not losses:
    raise ValueError("capped_mean needs at least one run")
  if not math.isfinite(l0):
    raise ValueError(f"l0 must be finite, got {l0}")
  capped = [l0 if loss is None or not math.isfinite(loss) else min(loss, l0)
            for loss in losses]
  return sum(capped) / len(capped)


def lr_sensitivity(losses_by_lr: Mapping[Any, Sequence[float | None]], l0: float) -> float:
  """How much a point loses by not having its learning rate tuned (Wortsman et al. 2023).

  Wortsman et al., "Small-scale proxies for large-scale Transformer training
  instabilities" (arXiv:2309.14322), section 2.2:

    LR sensitivity = E_eta[ min(l(eta), l0) - min_eta' l(eta') ]

  the mean, over the learning rates swept (each equally weighted: the grid is
  the measure, log-spaced in the paper), of the final loss's excess over the
  point's best learning rate. ``losses_by_lr`` maps each rate to the final
  losses of its runs (its seeds); the cap applies per run, each at its own
  final loss, and l(eta) is their mean (``capped_mean``): a run that stalled
  counts at its real loss, one that diverged (None or non-finite: no loss) at
  l0. l0 is the loss at initialisation (measured by an evaluation before
  the first update, or ln V for a uniform prediction over V tokens); capping
  at l0 keeps a run from counting for more than "learned nothing".

  Raises ValueError when no rate ended below l0: the formula would give 0,
  which would read as "insensitive" for a point that never trained.
  """
  if not losses_by_lr:
    raise ValueError("lr_sensitivity needs at least one learning rate")
  values = {lr: capped_mean(losses, l0) for lr, losses in losses_by_lr.items()}
  best = min(values.values())
  if best >= l0:
    raise ValueError(f"no learning rate of {sorted(losses_by_lr)} ended below l0={l0}")
  return sum(v - best for v in values.values()) / len(values)


# ---------------------------------------------------------------- run outcomes
Outcome = Literal["learned", "stalled", "diverged"]
OUTCOMES: tuple[Outcome, ...] = typing.get_args(Outcome)


def classify_run(final_loss: float | None, diverged: bool, unigram_entropy: float,
                 margin: float = 0.05) -> Outcome:
  """What became of a run: "diverged", "stalled" or "learned", in that order of checks.

    diverged  the run was flagged as diverged, or its final loss is None or not finite;
    stalled   final_loss > unigram_entropy - margin: it did not beat the
              context-free model (``unigram_entropy`` of the training targets,
              in nats) by ``margin`` nats;
    learned   otherwise (final_loss <= unigram_entropy - margin).

  Only "learned" runs carry a loss to compare; count the other two apart (as
  failures). In ``lr_sensitivity`` a stalled run counts at its own loss and a
  diverged one at l0.
  """
  if diverged or final_loss is None or not math.isfinite(final_loss):
    return "diverged"
  if final_loss > unigram_entropy - margin:
    return "stalled"
  return "learned"
