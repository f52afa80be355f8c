"""The report's statistics against SciPy on synthetic seeds (fixed NumPy seeds)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import special
from scipy import stats as scipy_stats

from tfx_jax.report import stats
from tfx_jax.report import stats_sequential


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
  with pytest.raises(ValueError, match="no values"):
    stats.compare({}, {0: 1.0, 1: 2.0})
  with pytest.raises(ValueError, match="equal lengths"):
    stats.paired_interval([1.0, 2.0], [1.0])


# ------------------------------------------------------- multiple comparisons
def holm_by_rejection(pvalues: list[float]) -> list[float]:
  """Slow Holm: the adjusted p is the smallest alpha at which the step-down rejects.

  The procedure at level alpha: going up the sorted p-values, reject while
  p_(k) <= alpha / (m - k + 1), stop at the first that is not. The smallest
  rejecting alpha is one of the values (m - k + 1) p_(k), or 1.
  """
  m = len(pvalues)
  order = sorted(range(m), key=lambda i: pvalues[i])

  def rejected(alpha):
    out = set()
    for k, i in enumerate(order):
      if pvalues[i] > alpha / (m - k):
        break
      out.add(i)
    return out

  candidates = sorted({min(1.0, (m - k) * pvalues[i]) for k, i in enumerate(order)} | {1.0})
  return [next(a for a in candidates if i in rejected(a)) for i in range(m)]


def test_holm_matches_the_step_down_procedure():
  rng = np.random.default_rng(7)
  for m in (1, 2, 5, 12):
    p = rng.uniform(0, 0.2, m).tolist()
    p[0] = p[-1]  # a tie
    assert stats.holm(p) == pytest.approx(holm_by_rejection(p), rel=1e-12)


def test_holm_textbook_example_and_untested_entries():
  # m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04,
  # then the running max makes the last 0.06.
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
  # None (fewer than two seeds) stays None and does not enlarge the family.
  assert stats.holm([0.01, None, 0.04]) == pytest.approx([0.02, None, 0.04])
  assert stats.holm([]) == []


# ---------------------------------------------------------------- equivalence
@pytest.mark.parametrize("seed,effect,delta", [(8, 0.002, 0.02), (9, 0.015, 0.02), (10, -0.03, 0.01)])
def test_tost_matches_two_one_sided_scipy_tests_on_paired_differences(seed, effect, delta):
  a, b = synthetic_pair(seed, 6, effect)
  d = np.subtract(a, b)
  eq = stats.tost(stats.paired_interval(a, b), delta)
  p_low = scipy_stats.ttest_1samp(d + delta, 0.0, alternative="greater").pvalue
  p_high = scipy_stats.ttest_1samp(d - delta, 0.0, alternative="less").pvalue
  assert eq.p_value == pytest.approx(max(p_low, p_high), rel=1e-10)
  ci90 = scipy_stats.ttest_rel(a, b).confidence_interval(0.90)
  assert (eq.low, eq.high) == pytest.approx((ci90.low, ci90.high), rel=1e-10)
  assert eq.equivalent == (-delta < ci90.low and ci90.high < delta) == (eq.p_value < 0.05)


def test_tost_on_welch_matches_shifted_scipy_welch_tests():
  rng = np.random.default_rng(11)
  a, b = rng.normal(1.0, 0.01, 5), rng.normal(1.001, 0.02, 7)
  delta = 0.03
  eq = stats.tost(stats.welch_interval(a.tolist(), b.tolist()), delta)
  p_low = scipy_stats.ttest_ind(a + delta, b, equal_var=False, alternative="greater").pvalue
  p_high = scipy_stats.ttest_ind(a - delta, b, equal_var=False, alternative="less").pvalue
  assert eq.p_value == pytest.approx(max(p_low, p_high), rel=1e-10)
  assert eq.equivalent
  assert not stats.tost(stats.welch_interval([1.0], [1.0, 1.1]), delta).equivalent


# ---------------------------------------------------------------- verdicts
@pytest.mark.parametrize("lower_is_better", [True, False])
def test_verdict_better_and_worse_follow_the_metric_direction(lower_is_better):
  a, b = synthetic_pair(12, 5, -0.05)  # value 0.05 below base, clearly
  down = stats.paired_interval(a, b)
  up = stats.paired_interval(b, a)
  p_down, p_up = stats.holm([down.p_value, up.p_value])
  assert p_down < 0.05
  assert stats.verdict(down, p_down, 0.01, lower_is_better=lower_is_better) == (
      "better" if lower_is_better else "worse")
  assert stats.verdict(up, p_up, 0.01, lower_is_better=lower_is_better) == (
      "worse" if lower_is_better else "better")


def test_verdict_equivalent_and_unresolved():
  a, b = synthetic_pair(13, 8, 0.0, noise_sd=0.002)
  iv = stats.paired_interval(a, b)
  (p,) = stats.holm([iv.p_value])
  assert p >= 0.05
  assert stats.verdict(iv, p, delta=0.01) == "equivalent"
  # The same data cannot rule out a difference of 0.0005: neither shown nor excluded.
  assert stats.verdict(iv, p, delta=0.0005) == "unresolved"
  # Three noisy seeds a side: no decision either way.
  rng = np.random.default_rng(14)
  noisy = stats.welch_interval(rng.normal(3.0, 0.1, 3).tolist(), rng.normal(3.02, 0.1, 3).tolist())
  assert stats.verdict(noisy, noisy.p_value, delta=0.01) == "unresolved"
  # A single seed: nothing to test.
  one = stats.compare({0: 2.9}, {0: 3.0})
  assert stats.verdict(one, stats.holm([one.p_value])[0], delta=0.5) == "unresolved"
  # Significant beats equivalent: a real 0.002 difference inside delta = 0.01.
  tiny = stats.paired_interval([1.002, 2.0021, 3.0019], [1.0, 2.0, 3.0])
  assert stats.tost(tiny, 0.01).equivalent and tiny.p_value < 0.05
  assert stats.verdict(tiny, tiny.p_value, 0.01, lower_is_better=False) == "better"


# ---------------------------------------------------------------- power
def power_by_nct(diff: float, sd: float, n: int, paired: bool, alpha: float = 0.05) -> float:
  df = n - 1 if paired else 2 * n - 2
  ncp = diff / sd * (math.sqrt(n) if paired else math.sqrt(n / 2))
  c = scipy_stats.t.ppf(1 - alpha / 2, df)
  return scipy_stats.nct.sf(c, df, ncp) + scipy_stats.nct.cdf(-c, df, ncp)


def power_by_simulation(diff: float, sd: float, n: int, paired: bool, draws: int,
                        seed: int, alpha: float = 0.05) -> float:
  """The share of simulated experiments whose two-sided t test rejects d = 0."""
  rng = np.random.default_rng(seed)
  if paired:
    d = rng.normal(diff, sd, (draws, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    df = n - 1
  else:
    a, b = rng.normal(diff, sd, (draws, n)), rng.normal(0.0, sd, (draws, n))
    pooled = np.sqrt((a.var(1, ddof=1) + b.var(1, ddof=1)) / 2)
    t = (a.mean(1) - b.mean(1)) / (pooled * math.sqrt(2 / n))
    df = 2 * n - 2
  return float(np.mean(np.abs(t) > scipy_stats.t.ppf(1 - alpha / 2, df)))


@pytest.mark.parametrize("sd,n,paired", [(0.01, 5, True), (0.03, 3, True), (0.02, 4, False),
                                         (1.0, 10, False)])
def test_min_detectable_difference_has_the_requested_power(sd, n, paired):
  mdd = stats.min_detectable_difference(sd, n, paired)
  assert power_by_nct(mdd, sd, n, paired) == pytest.approx(0.8, abs=1e-9)
  assert stats.t_test_power(mdd, sd, n, paired) == pytest.approx(0.8, abs=1e-9)
  # 200,000 simulated experiments: the standard error of the share is
  # sqrt(0.8 * 0.2 / 2e5) = 0.0009; 0.004 is 4.5 standard errors.
  assert power_by_simulation(mdd, sd, n, paired, 200_000, seed=n) == pytest.approx(0.8, abs=0.004)


def test_min_detectable_difference_edge_cases():
  assert stats.min_detectable_difference(0.01, 1, paired=True) == math.inf
  assert stats.min_detectable_difference(0.0, 5, paired=False) == 0.0
  # More seeds, smaller detectable differences; pairs beat two samples at equal sd.
  mdds = [stats.min_detectable_difference(1.0, n, paired=True) for n in range(2, 12)]
  assert all(x > y for x, y in zip(mdds, mdds[1:]))
  assert stats.min_detectable_difference(1.0, 5, True) < stats.min_detectable_difference(1.0, 5, False)
  with pytest.raises(ValueError):
    stats.min_detectable_difference(1.0, 5, True, alpha=0.05, power=0.01)


def test_seeds_needed_is_monotone_and_agrees_with_the_detectable_difference():
  # Cohen (1988), table 2.4.1: 64 per group for d = 0.5, 26 for d = 0.8 (two-sided, 0.05, 0.8).
  assert stats.seeds_needed(0.5, 1.0, paired=False, max_n=100) == 64
  assert stats.seeds_needed(0.8, 1.0, paired=False) == 26
  sd = 0.02
  for paired in (True, False):
    needed = [stats.seeds_needed(diff, sd, paired, max_n=80) for diff in (0.01, 0.015, 0.02, 0.04, 0.1)]
    assert all(x >= y for x, y in zip(needed, needed[1:]))
    for diff, n in zip((0.01, 0.015, 0.02, 0.04, 0.1), needed):
      assert stats.min_detectable_difference(sd, n, paired) <= diff
      if n > 2:
        assert stats.min_detectable_difference(sd, n - 1, paired) > diff
  assert stats.seeds_needed(0.001, sd, paired=True, max_n=10) is None
  assert stats.seeds_needed(0.0, sd, paired=True) is None


def test_power_deep_in_the_lower_tail_where_nctdtr_has_no_value():
  """The power takes P(T'_ncp < -c) as 0 where SciPy's nctdtr (its fast cdf)
  is NaN: nct.sf(c, df, -ncp) is 0 at every such point, and the power equals
  the one computed with nct.sf alone."""
  nan_points = 0
  for df in (1.0, 1.5, 2.0, 3.0, 5.0, 20.0):
    for alpha in (0.001, 0.01, 0.05, 0.2):
      c = scipy_stats.t.ppf(1 - alpha / 2, df)
      for ncp in np.geomspace(0.01, 200.0, 120):
        if not np.isfinite(special.nctdtr(df, ncp, -c)):
          nan_points += 1
          assert scipy_stats.nct.sf(c, df, -ncp) == 0.0
        ref = scipy_stats.nct.sf(c, df, ncp) + scipy_stats.nct.sf(c, df, -ncp)
        assert stats._power_at_ncp(ncp, df, alpha) == pytest.approx(ref, rel=1e-9, abs=1e-12)
  assert nan_points > 0


# ---------------------------------------------------------------- sequential looks
def test_sequential_design_spends_alpha_by_the_power_family():
  design = stats_sequential.SequentialDesign(2, 4)
  # (2/4)^3, (3/4)^3 - (2/4)^3, 1 - (3/4)^3: most of alpha at the last look.
  assert [design.share(k) for k in (1, 2, 3)] == pytest.approx([0.125, 0.296875, 0.578125])
  assert design.looks == 3 and design.seeds(3) == 4 and design.share(4) == 0.0
  # One seed at the first look: no t test, no alpha; the rest from 2 seeds on.
  one = stats_sequential.SequentialDesign(1, 3)
  assert [one.share(k) for k in (1, 2, 3)] == pytest.approx([0.0, 8 / 27, 19 / 27])
  assert stats_sequential.SequentialDesign(3, 3).share(1) == 1.0  # one look: the fixed test
  for first, last in [(2, 8), (4, 8), (1, 6), (3, 5), (2, 2)]:
    design = stats_sequential.SequentialDesign(first, last)
    assert sum(design.share(k) for k in range(1, design.looks + 1)) == pytest.approx(1.0)
  for first, last in [(4, 3), (0, 3)]:
    with pytest.raises(ValueError, match="first <= last"):
      stats_sequential.SequentialDesign(first, last)
  with pytest.raises(ValueError):
    design.share(0)


def test_sequential_p_is_the_look_p_over_its_share():
  assert stats_sequential.sequential_p(0.01, 0.25) == pytest.approx(0.04)
  assert stats_sequential.sequential_p(0.5, 0.25) == 1.0
  assert stats_sequential.sequential_p(None, 0.25) is None
  assert stats_sequential.sequential_p(0.0, 0.0) == 1.0  # a look with no alpha rejects nothing


def test_sequential_look_is_the_paired_t_and_tost_at_the_looks_share_of_alpha():
  a, b = synthetic_pair(15, 5, 0.02)
  design = stats_sequential.SequentialDesign(3, 6)  # looks at 3, 4, 5, 6 seeds: look 3 has 5
  share = (5 / 6) ** 3 - (4 / 6) ** 3
  look = stats_sequential.sequential_look(a, b, design, 3, delta=0.05)
  assert (look.look, look.looks) == (3, 4) and look.share == pytest.approx(share)
  ref = scipy_stats.ttest_rel(a, b)
  ci = ref.confidence_interval(1 - 0.05 * share)
  assert look.interval.level == pytest.approx(1 - 0.05 * share)
  assert (look.interval.low, look.interval.high) == pytest.approx((ci.low, ci.high), rel=1e-10)
  assert look.p_difference == pytest.approx(min(1.0, ref.pvalue / share), rel=1e-10)
  d = np.subtract(a, b)
  p_tost = max(scipy_stats.ttest_1samp(d + 0.05, 0.0, alternative="greater").pvalue,
               scipy_stats.ttest_1samp(d - 0.05, 0.0, alternative="less").pvalue)
  assert look.p_equivalence == pytest.approx(min(1.0, p_tost / share), rel=1e-10)
  tost_ci = ref.confidence_interval(1 - 2 * 0.05 * share)
  assert (look.equivalence.low, look.equivalence.high) == pytest.approx(
      (tost_ci.low, tost_ci.high), rel=1e-10)
  # A look past the design's last has no alpha left: it rejects nothing.
  late = stats_sequential.sequential_look(a, b, stats_sequential.SequentialDesign(2, 4), 4,
                                          delta=0.05)
  assert late.p_difference == 1.0 and late.p_equivalence == 1.0
  assert not late.equivalence.equivalent


def power_at_level(diff: float, sd: float, n: int, level: float) -> float:
  """The paired t test's power at a two-sided ``level``, both tails by nct.sf."""
  df, ncp = n - 1, diff / sd * math.sqrt(n)
  c = scipy_stats.t.ppf(1 - level / 2, df)
  return scipy_stats.nct.sf(c, df, ncp) + scipy_stats.nct.sf(c, df, -ncp)


def test_sequential_seeds_needed_is_the_first_budget_whose_last_look_has_the_power():
  """Against a scan of every budget N, each design's last look at its share."""
  sd = 0.02
  for first in (1, 2, 4):
    for diff in (0.01, 0.02, 0.05, 0.2):
      for alpha in (0.05, 0.0125):
        want = None
        for n in range(max(first, 2), 65):
          share = stats_sequential.SequentialDesign(first, n).share(n - first + 1)
          if power_at_level(diff, sd, n, alpha * share) >= 0.8:
            want = n
            break
        assert stats_sequential.sequential_seeds_needed(diff, sd, first, alpha) == want
  # Looking more often costs seeds: more than one fixed test at alpha needs.
  assert (stats_sequential.sequential_seeds_needed(0.02, sd, 2)
          > stats.seeds_needed(0.02, sd, paired=True))
  assert stats_sequential.sequential_seeds_needed(0.0, sd, 2) is None
  assert stats_sequential.sequential_seeds_needed(0.001, sd, 2, max_n=10) is None


def test_verdict_reads_the_equivalence_test_it_is_given():
  a, b = synthetic_pair(13, 8, 0.0, noise_sd=0.002)
  iv = stats.paired_interval(a, b)
  eq = stats.tost(iv, 0.01)
  assert eq.equivalent and stats.verdict(iv, 1.0, 0.01) == "equivalent"
  # The sequential analysis passes its own (Holm-adjusted) equivalence test.
  refused = dataclasses.replace(eq, p_value=0.2, equivalent=False)
  assert stats.verdict(iv, 1.0, 0.01, equivalence=refused) == "unresolved"
  wide = stats.paired_interval([1.0, 2.0, 3.3], [1.2, 1.9, 3.0])
  assert not stats.tost(wide, 0.01).equivalent
  granted = dataclasses.replace(stats.tost(wide, 0.01), p_value=0.01, equivalent=True)
  assert stats.verdict(wide, 1.0, 0.01, equivalence=granted) == "equivalent"


# ----------------------------------------------------- learning-rate sensitivity
def test_lr_sensitivity_hand_computed_with_a_failed_run():
  l0 = 10.0  # ln V at initialisation, say
  losses = {1e-4: [3.5], 3e-4: [3.1], 1e-3: [3.0], 3e-3: [None], 1e-2: [math.inf],
            3e-2: [12.0]}
  # capped: 3.5, 3.1, 3.0, 10, 10, 10; best 3.0; excess 0.5, 0.1, 0, 7, 7, 7.
  assert stats.lr_sensitivity(losses, l0) == pytest.approx((0.5 + 0.1 + 0 + 7 * 3) / 6)
  assert stats.lr_sensitivity({1e-3: [3.0]}, l0) == 0.0
  assert stats.lr_sensitivity({1e-3: [3.0], 1e-2: [4.0]}, l0) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="below l0"):
    stats.lr_sensitivity({1e-3: [None], 1e-2: [11.0]}, l0)
  with pytest.raises(ValueError):
    stats.lr_sensitivity({}, l0)
  with pytest.raises(ValueError):
    stats.lr_sensitivity({1e-3: []}, l0)


def test_lr_sensitivity_caps_each_run_a_stalled_one_at_its_loss_a_diverged_one_at_l0():
  """Wortsman et al. 2023: min(l, l0) per run with its own final loss, l(eta)
  the mean over the rate's seeds."""
  l0 = 6.9
  losses = {1e-3: [3.0, 3.2, 3.1],          # every seed learned: 3.1
            1e-2: [2.9, 5.67, None],        # one stalled (5.67), one diverged (l0)
            1e-1: [7.5, None, math.nan]}    # above l0 (capped), diverged twice
  at = {1e-3: 3.1, 1e-2: (2.9 + 5.67 + 6.9) / 3, 1e-1: 6.9}
  assert {lr: stats.capped_mean(v, l0) for lr, v in losses.items()} == pytest.approx(at)
  best = 3.1
  assert stats.lr_sensitivity(losses, l0) == pytest.approx(
      (0.0 + (at[1e-2] - best) + (6.9 - best)) / 3)
  # Each rate is weighed once, however many seeds it has.
  assert stats.lr_sensitivity({1e-3: [3.0], 1e-2: [4.0, 4.0, 4.0, 4.0]}, l0) == (
      pytest.approx(0.5))
  with pytest.raises(ValueError, match="finite"):
    stats.capped_mean([3.0], math.inf)


# ---------------------------------------------------------------- run outcomes
def test_classify_run_edges():
  h = 4.0
  assert stats.classify_run(3.0, diverged=False, unigram_entropy=h) == "learned"
  assert stats.classify_run(3.0, diverged=True, unigram_entropy=h) == "diverged"  # flagged wins
  for loss in (None, math.nan, math.inf, -math.inf):
    assert stats.classify_run(loss, diverged=False, unigram_entropy=h) == "diverged"
  assert stats.classify_run(h, diverged=False, unigram_entropy=h) == "stalled"
  assert stats.classify_run(h - 0.04, diverged=False, unigram_entropy=h) == "stalled"
  assert stats.classify_run(h - 0.25, diverged=False, unigram_entropy=h, margin=0.25) == "learned"
  assert stats.classify_run(h - 0.2, diverged=False, unigram_entropy=h, margin=0.25) == "stalled"
  assert stats.classify_run(h + 1.0, diverged=False, unigram_entropy=h) == "stalled"
