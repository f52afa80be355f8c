"""The report's statistics against SciPy on synthetic seeds (fixed NumPy seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from tfx_jax.report import stats


def synthetic_pair(seed: int, n: int, effect: float, seed_sd: float = 0.05,
                   noise_sd: float = 0.01) -> tuple[list[float], list[float]]:
  """Two configurations over the same n seeds: a shared per-seed offset plus noise."""
  rng = np.random.default_rng(seed)
  offset = rng.normal(0.0, seed_sd, n)
  a = 3.0 + effect + offset + rng.normal(0.0, noise_sd, n)
  b = 3.0 + offset + rng.normal(0.0, noise_sd, n)
  return a.tolist(), b.tolist()


# ---------------------------------------------------------------- intervals
@pytest.mark.parametrize("seed,n,effect,level", [(0, 5, 0.02, 0.95), (1, 3, -0.01, 0.9),
                                                 (2, 8, 0.0, 0.99)])
def test_paired_interval_matches_scipy_ttest_rel(seed, n, effect, level):
  a, b = synthetic_pair(seed, n, effect)
  iv = stats.paired_interval(a, b, level)
  ref = scipy_stats.ttest_rel(a, b)
  ci = ref.confidence_interval(level)
  assert iv.method == "paired" and (iv.n_a, iv.n_b) == (n, n) and iv.level == level
  assert iv.df == ref.df == n - 1
  assert iv.diff == pytest.approx(np.mean(np.subtract(a, b)), rel=1e-12)
  assert iv.se == pytest.approx(iv.diff / ref.statistic, rel=1e-10)
  assert iv.p_value == pytest.approx(ref.pvalue, rel=1e-10)
  assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), rel=1e-10)


@pytest.mark.parametrize("seed,na,nb,level", [(3, 5, 5, 0.95), (4, 3, 6, 0.95), (5, 4, 2, 0.9)])
def test_welch_interval_matches_scipy_ttest_ind(seed, na, nb, level):
  rng = np.random.default_rng(seed)
  a = rng.normal(2.0, 0.1, na).tolist()
  b = rng.normal(2.05, 0.03, nb).tolist()
  iv = stats.welch_interval(a, b, level)
  ref = scipy_stats.ttest_ind(a, b, equal_var=False)
  ci = ref.confidence_interval(level)
  assert iv.method == "welch" and (iv.n_a, iv.n_b) == (na, nb)
  assert iv.df == pytest.approx(ref.df, rel=1e-10)
  assert iv.se == pytest.approx(iv.diff / ref.statistic, rel=1e-10)
  assert iv.p_value == pytest.approx(ref.pvalue, rel=1e-10)
  assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_compare_pairs_only_when_the_seed_sets_match():
  a, b = synthetic_pair(6, 4, 0.03)
  a_by, b_by = dict(zip([7, 1, 3, 5], a)), dict(zip([7, 1, 3, 5], b))
  paired = stats.compare(a_by, dict(reversed(list(b_by.items()))))  # order of keys is irrelevant
  assert paired.method == "paired"
  assert paired.p_value == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue, rel=1e-10)
  # The shared seed offset (sd 0.05) swamps a 0.03 effect for Welch, not for the pairs.
  assert paired.excludes_zero()
  assert not stats.welch_interval(a, b).excludes_zero()
  del b_by[5]
  welch = stats.compare(a_by, b_by)
  assert welch.method == "welch" and (welch.n_a, welch.n_b) == (4, 3)
  assert welch.p_value == pytest.approx(
      scipy_stats.ttest_ind(a, b[:3], equal_var=False).pvalue, rel=1e-10)
  # One shared seed is not a pair design: nothing but the difference is known.
  single = stats.compare({0: 1.0}, {0: 0.5})
  assert single.method == "welch" and single.diff == 0.5 and not single.known
  assert (single.low, single.high, single.df, single.se, single.p_value) == (None,) * 5


def test_degenerate_cases_give_numbers_not_nan():
  # Identical per-seed differences: no spread, the difference is certain.
  iv = stats.compare({0: 2.0, 1: 3.0, 2: 4.0}, {0: 1.5, 1: 2.5, 2: 3.5})
  assert (iv.method, iv.low, iv.high, iv.se, iv.p_value, iv.df) == ("paired", 0.5, 0.5, 0.0, 0.0, 2.0)
  iv = stats.paired_interval([1.0, 2.0], [1.0, 2.0])
  assert (iv.diff, iv.low, iv.high, iv.p_value) == (0.0, 0.0, 0.0, 1.0)
  iv = stats.welch_interval([1.0, 1.0], [1.0, 1.0, 1.0])
  assert (iv.diff, iv.p_value, iv.df) == (0.0, 1.0, 3.0)
  assert stats.welch_interval([2.0, 2.0], [1.0, 1.0]).p_value == 0.0
  assert not stats.paired_interval([1.0], [2.0]).known
  with pytest.raises(ValueError, match="non-finite"):
    stats.compare({0: 1.0, 1: math.nan}, {0: 1.0, 1: 2.0})
  with pytest.raises(ValueError, match="equal lengths"):
    stats.paired_interval([1.0, 2.0], [1.0])
