"""The compute multiplier, its trend, the crossover, the projection and the
backtest, on planted curves with known multipliers (fixed NumPy Generators)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tfx_jax.records import serial
from tfx_jax.report import multiplier as mult
from tfx_jax.report import scaling

E, A, ALPHA = 2.0, 1e4, 0.3
COMPUTE = np.logspace(12, 15, 6)
STARTS = scaling.grid("compute")[::10]  # one basin here (test_scaling.py)


def curve(c, e=E, a=A, alpha=ALPHA):
  return e + a * np.asarray(c, float) ** -alpha


def ladder(rng, loss, seeds=8, sd=0.005, compute=COMPUTE):
  return [scaling.Rung(float(c), {s: float(loss(c) + rng.normal(0.0, sd)) for s in range(seeds)})
          for c in compute]


def fitted(seed, resamples=200, **losses):
  rng = np.random.default_rng(seed)
  return scaling.fit_ladder({name: ladder(rng, loss) for name, loss in losses.items()},
                            resamples=resamples, starts=STARTS)


def true_multiplier(loss, c):
  """C_eff / C of the planted base curve (E, A, ALPHA) at the variant's loss."""
  return ((loss(c) - E) / A) ** (-1.0 / ALPHA) / c


def test_a_constant_multiplier_is_recovered_at_every_rung_and_bounded_past_the_base():
  k = 2.0  # the variant is the base at twice the compute
  fit = fitted(0, base=curve, variant=lambda c: curve(k * c))
  m = mult.multiplier(fit, "variant", "base")
  assert m.note == "" and m.base_range == (1e12, 1e15)
  *inside, last = m.rungs
  for row in inside:
    assert row.bound is None and row.multiplier == pytest.approx(k, rel=0.05)
    assert row.interval.low < k < row.interval.high, row
    assert 1e12 <= row.effective_compute <= 1e15
  # 2 x 1e15 lies past the base's largest rung: a bound, not an extrapolation.
  assert last.multiplier is None and last.effective_compute is None
  assert (last.bound, last.bound_value) == ("more than", 1.0)
  trend = m.trend
  assert trend.label == "constant" and trend.rungs == 5
  assert -mult.BAND < trend.interval.low < 0.0 < trend.interval.high < mult.BAND
  assert m.crossover is None  # parallel curves never cross


@pytest.mark.parametrize("swap, label", [(False, "shrinks with scale"),
                                         (True, "grows with scale")])
def test_a_shrinking_multiplier_is_labelled_and_its_reverse_grows(swap, label):
  # alpha 0.28 against 0.3: m(C) = C_eff / C falls as C^(0.28 / 0.3 - 1) =
  # C^-0.067, from 1.9 at 1e12 to 1.2 at 1e15 (A chosen for that end).
  variant = lambda c: curve(c, a=0.475 * A, alpha=0.28)  # noqa: E731
  fit = fitted(1, base=variant if swap else curve, variant=curve if swap else variant)
  m = mult.multiplier(fit, "variant", "base")
  assert m.trend.label == label
  if not swap:
    assert m.trend.interval.low < 0.28 / 0.3 - 1.0 < m.trend.interval.high
    for row in m.rungs:
      if row.multiplier is not None:
        truth = true_multiplier(variant, row.compute)
        assert row.interval.low < truth < row.interval.high, (row, truth)


def test_outside_the_base_range_the_multiplier_is_a_bound():
  # Worse than the base at the smallest rung: the base needs less than its
  # smallest compute there ("at most"). A variant whose loss falls below the
  # base's asymptote needs infinite base compute ("more than").
  fit = fitted(2, base=curve, worse=lambda c: curve(0.5 * c), lower=lambda c: curve(c, e=1.5))
  worse = mult.multiplier(fit, "worse", "base")
  assert (worse.rungs[0].bound, worse.rungs[0].bound_value) == ("at most", 1.0)
  assert worse.rungs[-1].multiplier == pytest.approx(0.5, rel=0.05)
  lower = mult.multiplier(fit, "lower", "base")
  assert float(mult.effective_compute(fit.constants["base"], lower.rungs[-1].fitted_loss)) \
      == np.inf
  assert (lower.rungs[-1].bound, lower.rungs[-1].bound_value) == ("more than", 1.0)
  for row in worse.rungs + lower.rungs:
    assert (row.multiplier is None) == (row.bound is not None)
    if row.interval is not None:  # the interval never leaves the base's range
      assert 1e12 / row.compute <= row.interval.low <= row.interval.high <= 1e15 / row.compute


def test_the_crossover_of_crossing_curves_is_found():
  cross = 10 ** 13.5
  a_variant = A * cross ** (0.25 - ALPHA)  # equal losses at `cross`
  fit = fitted(3, base=curve, variant=lambda c: curve(c, a=a_variant, alpha=0.25))
  found = mult.multiplier(fit, "variant", "base").crossover
  assert found is not None and found.crossings == 1
  assert found.compute == pytest.approx(cross, rel=0.3)
  assert found.interval.low < cross < found.interval.high
  assert found.share > 0.95


def test_a_curve_that_does_not_fit_gives_no_multiplier():
  kinked = lambda c: curve(np.maximum(c, 10 ** 13.5))  # noqa: E731
  rng = np.random.default_rng(4)
  fit = scaling.fit_ladder({"base": ladder(rng, curve, compute=np.logspace(12, 15, 8)),
                            "kinked": ladder(rng, kinked, compute=np.logspace(12, 15, 8))},
                           resamples=20, starts=STARTS)
  assert not fit.curves["kinked"].usable  # no asymptote, or lack of fit
  m = mult.multiplier(fit, "kinked", "base")
  assert m.rungs == () and m.trend is None
  assert "the variant's curve is not read" in m.note and "per-rung comparisons" in m.note


def test_the_projection_past_the_ladder_is_flagged_extrapolation():
  fit = fitted(5, resamples=50, base=curve)
  inside, past = mult.project(fit, "base", [1e13, 1e16])
  assert not inside.extrapolation and past.extrapolation
  assert inside.loss == pytest.approx(float(curve(1e13)), abs=0.01)
  assert past.low <= past.loss <= past.high


def test_the_backtest_covers_the_true_form_and_misses_a_bend_at_the_top():
  rng = np.random.default_rng(16)
  bent = lambda c: curve(c) + (0.05 if c >= 1e15 else 0.0)  # noqa: E731
  full = scaling.fit_ladder({"base": ladder(rng, curve), "bent": ladder(rng, bent),
                             "worse": ladder(rng, lambda c: curve(0.5 * c))},
                            resamples=100, starts=STARTS)
  tests = mult.backtest(full, base="base", resamples=100, starts=STARTS)
  assert tests["base"].fit.distinct == 5  # the largest rung held out
  (held,) = tests["base"].held_out
  assert held.compute == 1e15 and held.covered
  assert abs(held.error) < 0.02
  (bent_held,) = tests["bent"].held_out
  assert not bent_held.covered and bent_held.error == pytest.approx(-0.05, abs=0.02)
  (worse_m,) = tests["worse"].multiplier
  assert worse_m.extrapolation and worse_m.full == pytest.approx(0.5, rel=0.05)
  assert worse_m.covered and worse_m.predicted == pytest.approx(0.5, rel=0.1)
  assert tests["base"].multiplier == ()


def test_records_read_back_from_json():
  fit = fitted(7, resamples=30, base=curve, variant=lambda c: curve(2.0 * c))
  m = mult.multiplier(fit, "variant", "base")
  assert serial.from_json(mult.Multiplier, json.loads(json.dumps(serial.to_json(m)))) == m
  tests = mult.backtest(fit, base="base", resamples=20, starts=STARTS)
  data = json.loads(json.dumps(serial.to_json(tests["variant"])))
  assert serial.from_json(mult.Backtest, data) == tests["variant"]


def test_bad_requests_are_named():
  fit = fitted(8, resamples=0, base=curve)
  with pytest.raises(ValueError, match="no variant 'other'"):
    mult.multiplier(fit, "other", "base")
  with pytest.raises(ValueError, match="band must be positive"):
    mult.multiplier(fit, "base", "base", band=0.0)
