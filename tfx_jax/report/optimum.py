"""The optimum of a loss-against-learning-rate curve and how it moves with
size: the numbers of the report's transfer check (``sections.transfer``).
Pure functions of per-seed losses (NumPy).

**The optimum** (``fit_optimum``). On the grid of learning rates eta_1 <
... < eta_k, the loss at each rate is the mean over the seeds. The grid's
best rate and its ``window`` neighbours on either side (3 values by
default) are fitted with a parabola in u = log2(eta),

  L(u) = a + b (u - u0) + c (u - u0)^2,     u* = u0 - b / (2 c)

by least squares (with 3 values: the parabola through them), and the
optimum is its vertex 2^u*. Refused, with the reason, where the grid has
fewer than 3 rates, where the best is the grid's lowest or highest rate (the
optimum may lie beyond what was tried), where a run beside the best diverged
(a diverged run's loss is +inf: no value to fit), or where the fitted
curvature c is not positive (no minimum).

**Its interval: the delta method over seeds**, not a bootstrap. The fit is a
smooth function of the mean losses at the window's rates, so to first order
u* - u*_true = g . (mean_y - y_true), with g the gradient of u* in the means
(from the least-squares coefficients). Each seed i has the linearised value
psi_i = g . (y_i - mean_y); the standard error of u* is sd(psi) / sqrt(n)
(n - 1 in the sd: g' S g / n, S the seeds' covariance of the window's
losses, so a seed's noise shared across rates counts as it is), and the
interval is u* +- t_{0.975, n-1} se. A bootstrap over seeds was not used:
with the 2 or 3 tuning seeds of a sweep it has 3 or 10 distinct resamples,
and its percentile interval is about the range of the per-seed values,
which covers the optimum far less often than 95% of the time; the t
quantile with n - 1 degrees of freedom keeps the nominal level where the
seeds' noise is small beside the curve's rise over one grid step (0.94-0.95
over simulated sweeps of 2 to 5 seeds with the noise a fifth of that rise:
tests/report/test_transfer.py). With noise 0.6 of the rise it covers about
0.92: the window the noise picks and the vertex's curvature then matter
beyond the linearisation.

**The shift per doubling** (``fit_shift``): the least-squares slope of
log2(optimum) against log2(size) over the sizes whose optimum was fitted,
s = sum_j w_j u*_j with w_j = (x_j - mean x) / sum (x - mean x)^2, x_j =
log2(size_j). Its interval is the same delta method paired by seed: each
seed's linearised slope sum_j w_j psi_{j,i} (a seed's runs at every size
share its noise, so its deviations at each size are summed before the
spread over seeds is taken), over the seeds fitted at every size, with
n - 1 degrees of freedom. Its two-sided p is that of s = 0, and its label
(``label``): **transfers** where the 95% interval lies inside +-band (the
sweep's ``transfer_band``, log2 units per doubling), **drifts** where it
excludes 0, **unresolved** otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Mapping, Sequence

import numpy as np

from tfx_jax.report import stats

Label = Literal["transfers", "drifts", "unresolved", "not fitted"]
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Fit:
  """The fitted optimum of one curve, in log2 learning rate.

  ``log2_lr``: the vertex (None: not fitted, ``reason`` says why);
  ``best``: the grid's best rate (mean over the seeds; None: none learned);
  ``se``, ``low``, ``high``, ``df``: the delta method's standard error and
  interval (None: fewer than 2 seeds); ``influence``: {seed: psi_i}, each
  seed's linearised deviation of the vertex; ``window``: the rates fitted."""
  log2_lr: float | None
  best: float | None
  se: float | None = None
  low: float | None = None
  high: float | None = None
  df: float | None = None
  influence: Mapping[int, float] = dataclasses.field(default_factory=dict)
  window: tuple[float, ...] = ()
  reason: str = ""

  @property
  def fitted(self) -> bool:
    return self.log2_lr is not None


@dataclasses.dataclass(frozen=True)
class Shift:
  """The slope of log2(optimum) against log2(size), with its interval.

  ``slope`` None: fewer than 2 sizes fitted (``reason``); ``low``/``high``/
  ``se``/``p`` None: fewer than 2 seeds fitted at every size."""
  slope: float | None
  low: float | None
  high: float | None
  se: float | None
  df: float | None
  p: float | None
  seeds: tuple[int, ...]
  sizes: tuple[float, ...]  # the sizes fitted
  label: Label
  reason: str = ""


def _interval(estimate: float, psi: np.ndarray, level: float = LEVEL
              ) -> tuple[float | None, float | None, float | None, float | None]:
  """(se, low, high, df) of ``estimate`` from its seeds' linearised values."""
  n = len(psi)
  if n < 2:
    return None, None, None, None
  se = float(np.std(psi, ddof=1) / math.sqrt(n))
  half = stats.t_quantile(0.5 + level / 2, n - 1) * se
  return se, estimate - half, estimate + half, float(n - 1)


def fit_optimum(rates: Sequence[float], losses: Mapping[int, Sequence[float | None]],
                window: int = 1, level: float = LEVEL) -> Fit:
  """The optimum of a loss curve (see the module docstring).

  ``rates``: the grid, ascending and positive; ``losses``: {seed: the loss
  at each rate}, +inf where the run diverged, None (or NaN) where it has no
  value (not finished). ``window``: the neighbours of the best on each side
  that enter the fit (1: three values).
  """
  rates = [float(r) for r in rates]
  if any(not r > 0 for r in rates) or rates != sorted(set(rates)):
    raise ValueError(f"the learning rates are positive and ascending, got {rates}")
  seeds = sorted(losses)
  y = np.array([[np.nan if v is None else float(v) for v in losses[s]] for s in seeds],
               dtype=float).reshape(len(seeds), len(rates))
  with np.errstate(invalid="ignore"):
    has = ~np.isnan(y)
    diverged = np.isinf(y).any(axis=0)
    means = np.array([np.mean(y[has[:, j], j]) if has[:, j].any() else np.nan
                      for j in range(len(rates))])
  usable = ~np.isnan(means) & ~diverged
  if not usable.any():
    return Fit(None, None, reason="no rate with a finished run that did not diverge")
  best_j = int(np.argmin(np.where(usable, means, np.inf)))
  best = rates[best_j]
  if len(rates) < 3:
    return Fit(None, best, reason=f"{len(rates)} learning rates: a fit needs at least 3")
  if best_j == 0 or best_j == len(rates) - 1:
    end = "lowest" if best_j == 0 else "highest"
    return Fit(None, best, reason=f"the best is the grid's {end} rate ({best:g}): the "
               "optimum may lie beyond it")
  lo, hi = max(0, best_j - window), min(len(rates), best_j + window + 1)
  bad = [rates[j] for j in range(lo, hi) if not usable[j]]
  if bad:
    return Fit(None, best, reason="beside the best, no value at " + ", ".join(
        f"{r:g}" for r in bad) + " (a run diverged or did not finish)")
  complete = [i for i in range(len(seeds)) if has[i, lo:hi].all()]
  u = np.log2(rates[lo:hi])
  u0 = float(np.mean(u))
  design = np.stack([np.ones_like(u), u - u0, (u - u0) ** 2], axis=1)
  solve = np.linalg.pinv(design)  # rows: a, b, c in the window's means
  ys = y[complete, lo:hi]
  mean = ys.mean(axis=0)
  _, b, c = solve @ mean
  if not c > 0:
    return Fit(None, best, window=tuple(rates[lo:hi]),
               reason=f"the fitted curvature is not positive ({c:.3g}): no minimum")
  vertex = u0 - b / (2 * c)
  # d vertex / d mean = -(db)/(2c) + b (dc) / (2 c^2)
  grad = -solve[1] / (2 * c) + b * solve[2] / (2 * c * c)
  psi = (ys - mean) @ grad
  se, low, high, df = _interval(float(vertex), psi, level)
  return Fit(float(vertex), best, se, low, high, df,
             {seeds[i]: float(p) for i, p in zip(complete, psi)}, tuple(rates[lo:hi]))


def fit_shift(sizes: Sequence[float], fits: Sequence[Fit], band: float,
              level: float = LEVEL) -> Shift:
  """The shift of the optimum per doubling of size, its interval and label
  (see the module docstring). ``sizes``: each curve's size (the size field's
  value); ``fits``: their ``fit_optimum``s; ``band``: the equivalence band
  in log2 units per doubling (log2 of the sweep's ``transfer_band``)."""
  kept = [(float(s), f) for s, f in zip(sizes, fits) if f.fitted]
  if len({s for s, _ in kept}) < 2:
    return Shift(None, None, None, None, None, None, (), tuple(s for s, _ in kept),
                 "not fitted", f"{len(kept)} size{'s' * (len(kept) != 1)} with a fitted "
                 "optimum: a shift needs at least 2")
  x = np.log2([s for s, _ in kept])
  w = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
  slope = float(np.sum(w * np.array([f.log2_lr for _, f in kept])))
  common = sorted(set.intersection(*(set(f.influence) for _, f in kept)))
  psi = np.array([sum(wj * f.influence[seed] for wj, (_, f) in zip(w, kept))
                  for seed in common])
  se, low, high, df = _interval(slope, psi, level)
  p = None
  if se is not None:
    p = 2.0 * stats.t_sf(abs(slope / se), df) if se > 0 else (0.0 if slope else 1.0)
  name, reason = label(low, high, band)
  return Shift(slope, low, high, se, df, p, tuple(common), tuple(s for s, _ in kept),
               name, reason)


def label(low: float | None, high: float | None, band: float) -> tuple[Label, str]:
  """The transfer label of a shift's interval [low, high] (log2 per
  doubling) against +-``band``, and its reason."""
  if low is None or high is None:
    return "unresolved", "fewer than 2 seeds fitted at every size: no interval"
  if -band < low and high < band:
    return "transfers", f"the interval lies inside +-{band:.3g}"
  if low > 0 or high < 0:
    return "drifts", "the interval excludes 0"
  return "unresolved", f"the interval holds 0 and reaches beyond +-{band:.3g}"
