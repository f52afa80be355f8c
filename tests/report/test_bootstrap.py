"""The paired bootstrap's seed draws and the intervals read from them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfx_jax.report import bootstrap
from tfx_jax.report import stats


def test_seed_draws_are_fixed_by_their_seed_and_count_every_seed():
  one = list(bootstrap.seed_draws(5, 50, seed=3))
  assert all(d.sum() == 5 and len(d) == 5 for d in one)
  np.testing.assert_array_equal(one, list(bootstrap.seed_draws(5, 50, seed=3)))
  assert not np.array_equal(one, list(bootstrap.seed_draws(5, 50, seed=4)))


def test_the_percentile_interval_is_the_quantiles_without_the_missing_draws():
  draws = np.array([np.nan, *np.linspace(0.0, 1.0, 101)])
  low, high = bootstrap.interval(draws, 0.5, 0.9, seeds=5, method="percentile")
  assert (low, high) == pytest.approx((0.05, 0.95))
  # An infinite draw is kept, past every finite one.
  assert bootstrap.interval(np.array([1.0, 2.0, np.inf]), 2.0, 0.5, 3, "percentile")[1] \
      == np.inf


def test_the_student_interval_of_a_mean_is_about_its_t_interval():
  """The bootstrap of a mean over n seeds: sd(draws)^2 -> (n - 1) / n * s^2 / n,
  so the corrected interval tends to the t interval of the mean."""
  values = np.random.default_rng(0).normal(3.0, 0.1, 6)
  draws = np.array([values[np.repeat(np.arange(6), counts)].mean()
                    for counts in bootstrap.seed_draws(6, 20000, seed=1)])
  low, high = bootstrap.interval(draws, float(values.mean()), 0.95, 6, "student")
  mean, half = stats.mean_half_width(list(values), 0.95)
  assert (low, high) == pytest.approx((mean - half, mean + half), rel=2e-3)


def test_the_student_interval_on_the_log_scale_and_with_an_infinite_draw():
  draws = np.exp(np.random.default_rng(2).normal(0.0, 0.1, 400))
  low, high = bootstrap.interval(draws, 1.0, 0.95, 4, "student", log=True)
  assert low * high == pytest.approx(1.0)  # symmetric in log around the estimate
  scale = stats.t_quantile(0.975, 3) * math.sqrt(4 / 3)
  assert math.log(high) == pytest.approx(scale * np.std(np.log(draws), ddof=1))
  with_inf = bootstrap.interval(np.append(draws, np.inf), 1.0, 0.95, 4, "student", log=True)
  assert with_inf[1] == np.inf and with_inf[0] == pytest.approx(low, rel=0.05)
  assert bootstrap.interval(draws, 1.0, 0.95, 1, "student") is None  # one seed: no interval
