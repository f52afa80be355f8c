"""The compute multiplier of a variant over the base, its trend with scale,
where the curves cross, the projection past the ladder, and the backtest of
its largest rung: all read from ``scaling.fit_ladder``'s compute-form fits
and their paired bootstrap.

**Multiplier** (REFERENCES.md, "Scaling laws"; Moonlight's "2x the
computational efficiency"): at each of the variant's rungs, at its own run
compute C, the compute the base would need to reach the variant's fitted loss,

  C_eff = L_base^-1(L_variant(C)) = ((L_variant(C) - E_b) / A_b)^(-1 / alpha_b),

and multiplier = C_eff / C (2: the variant's run is worth twice its compute of
the base). As ``sections.speedup`` reads AdamW's curve: **inside the base's
measured compute** [C_min, C_max] (its rungs) the value is read off the fit;
**outside it a bound**: C_eff above C_max (the variant beat the base's
largest rung, or its loss lies below the base's asymptote E_b, where C_eff is
infinite) gives "more than" C_max / C; below C_min, "at most" C_min / C.
Nothing is extrapolated: a larger (or smaller) base rung would bracket it.
The interval: from the multiplier's bootstrap resamples (both fits refitted
on the same seed draw), by the fit's method (``bootstrap.interval``, on log
multiplier), its ends clipped to the base's range: an end past it is a bound
there (``low_beyond``, ``high_beyond``), as in ``records.speedup.Interval``.

**Trend**: the least-squares slope of log multiplier against log C over the
rungs whose multiplier is read inside the base's range (two or more), with
its interval over the resamples (a resample where one of those
rungs falls outside the range has no slope; more than (1 - level) / 2 such
resamples: "unresolved"). The label, in this order (as ``stats.verdict``: a
resolved change wins over a small one):

  grows with scale     the interval lies above 0
  shrinks with scale   the interval lies below 0
  constant             the interval lies inside (-band, band)
  unresolved           otherwise

``BAND`` = 0.02 per e-fold of compute: a multiplier that changes by less than
4.7% per decade of compute (e^(0.02 ln 10) = 1.047) is constant. Wen et al.
2025's Muon speedup, 1.4x at 0.1B to 1.1x at 1.2B parameters (about 144x the
compute at a fixed tokens-per-parameter), is a slope of ln(1.1/1.4)/ln(144) =
-0.048: outside the band, so it reads as shrinking, not constant.

**Crossover**: where L_variant - L_base changes sign inside both curves'
measured range (on a grid of ``CROSS_GRID`` points, log-spaced; linear in log
C between them), the lowest such compute, with its interval over the
resamples that have a crossing (the one nearest the fit's) and the share of
resamples that have one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Mapping, Sequence

import numpy as np

from tfx_jax.records.speedup import Bound
from tfx_jax.report import scaling
from tfx_jax.report import bootstrap
from tfx_jax.report.scaling import LadderFit, Rung

BAND = 0.02
CROSS_GRID = 512
TrendLabel = Literal["constant", "grows with scale", "shrinks with scale", "unresolved"]


@dataclasses.dataclass(frozen=True)
class Range:
  """An interval from the bootstrap; an end ``beyond`` is a bound
  (the base's measured range stopped it)."""
  low: float
  high: float
  low_beyond: bool = False
  high_beyond: bool = False
  level: float = scaling.LEVEL
  resamples: int = 0  # the resamples it was read from
  # The standard error it was read with (of the log where the interval is a
  # ratio's): sqrt(n / (n - 1)) sd of the finite resamples, n the seeds, as
  # ``bootstrap.interval``'s "student" has it; a claim's test reads it.
  se: float | None = None


@dataclasses.dataclass(frozen=True)
class RungMultiplier:
  """The multiplier at one of the variant's rungs (its run compute)."""
  compute: float
  loss: float                 # the variant's measured mean over its seeds
  fitted_loss: float          # L_variant(compute)
  effective_compute: float | None  # C_eff inside the base's range; None: a bound
  multiplier: float | None    # C_eff / compute; None: a bound
  bound: Bound | None = None  # outside the base's range: more than / at most
  bound_value: float | None = None
  interval: Range | None = None


@dataclasses.dataclass(frozen=True)
class MultiplierTrend:
  """The slope of log multiplier against log compute (per e-fold) and its label."""
  slope: float | None
  interval: Range | None
  band: float
  rungs: int
  label: TrendLabel
  reason: str = ""  # why unresolved, where the interval does not say


@dataclasses.dataclass(frozen=True)
class Crossover:
  """Where the two fitted curves cross inside the measured range."""
  compute: float
  interval: Range | None
  share: float        # of the fitted resamples, those whose curves cross in range
  crossings: int      # sign changes of the fit's difference in range


@dataclasses.dataclass(frozen=True)
class Multiplier:
  """A variant's compute multiplier over ``base`` at its rungs, and its trend.
  ``note``: why there is none (a curve refused or not fitting), else ""."""
  variant: str
  base: str
  base_range: tuple[float, float]
  rungs: tuple[RungMultiplier, ...] = ()
  trend: MultiplierTrend | None = None
  crossover: Crossover | None = None
  note: str = ""


@dataclasses.dataclass(frozen=True)
class Projection:
  """The fitted loss at a compute and its band; ``extrapolation``: outside the
  variant's measured range (drawn dashed, never read by a label)."""
  compute: float
  loss: float
  low: float | None
  high: float | None
  extrapolation: bool


# ------------------------------------------------------------------- helpers
def effective_compute(base: np.ndarray, loss):
  """L_base^-1(loss) of the compute form (E, A, alpha): inf where loss <= E."""
  e, a, alpha = base[..., 0], base[..., 1], base[..., 2]
  loss = np.asarray(loss, float)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    out = ((loss - e) / a) ** (-1.0 / alpha)
  return np.where(loss > e, out, np.inf)


def _curve(theta: np.ndarray, compute) -> np.ndarray:
  """L(C) for rows of constants (..., 3) at ``compute`` (broadcast)."""
  return theta[..., 0:1] + theta[..., 1:2] * np.asarray(compute, float) ** -theta[..., 2:3]


def _rows(fit: LadderFit, base: str, variant: str) -> tuple[np.ndarray, np.ndarray]:
  """The resamples where both fits exist, (n, 3) each (paired: the same draws)."""
  b, v = fit.draws[base], fit.draws[variant]
  ok = np.isfinite(b[:, 0]) & np.isfinite(v[:, 0])
  return b[ok], v[ok]


def _range(fit: LadderFit, draws: np.ndarray, estimate: float, log: bool = False,
           edges: tuple[float, float] | None = None) -> Range | None:
  """The interval of ``estimate`` from its ``draws`` by the fit's method
  (``bootstrap.interval``), its ends clipped to ``edges`` as bounds."""
  found = bootstrap.interval(draws, estimate, fit.level, len(fit.seeds), fit.method, log)
  if found is None:
    return None
  low, high = found
  values = np.asarray(draws, float)
  used = int(np.sum(~np.isnan(values)))
  finite = values[np.isfinite(values)]
  n = len(fit.seeds)
  se = None
  if len(finite) > 1 and n > 1 and (not log or np.all(finite > 0)):
    with np.errstate(divide="ignore"):
      spread = float(np.std(np.log(finite) if log else finite, ddof=1))
    se = math.sqrt(n / (n - 1)) * spread
  if edges is None:
    return Range(low, high, level=fit.level, resamples=used, se=se)
  return Range(max(low, edges[0]), min(high, edges[1]), low < edges[0], high > edges[1],
               fit.level, used, se)


def _means(rungs: Sequence[Rung]) -> dict[float, float]:
  """{compute: the mean loss over every run at it}."""
  by: dict[float, list[float]] = {}
  for r in rungs:
    by.setdefault(r.compute, []).extend(r.losses.values())
  return {c: sum(v) / len(v) for c, v in sorted(by.items())}


# ---------------------------------------------------------------- multiplier
def multiplier(fit: LadderFit, variant: str, base: str, band: float = BAND) -> Multiplier:
  """``variant``'s compute multiplier over ``base`` (module docstring)."""
  if fit.form != "compute":
    raise ValueError(f"the multiplier reads the compute form's fits, got form {fit.form!r}")
  for name in (variant, base):
    if name not in fit.curves:
      raise ValueError(f"no variant {name!r} in the ladder; variants: {sorted(fit.curves)}")
  if not band > 0:
    raise ValueError(f"the constant band must be positive, got {band}")
  base_curve, curve = fit.curves[base], fit.curves[variant]
  span = base_curve.compute_range
  out = Multiplier(variant, base, span)
  for who, c in (("base", base_curve), ("variant", curve)):
    if not c.usable:
      why = c.reason or "the form does not fit its rungs (lack of fit against the seed noise)"
      return dataclasses.replace(out, note=f"the {who}'s curve is not read: {why}; "
                                 "read the per-rung comparisons")
  theta_b, theta_v = fit.constants[base], fit.constants[variant]
  rows_b, rows_v = _rows(fit, base, variant)
  lo, hi = span
  rungs = []
  for compute, loss in _means(fit.rungs[variant]).items():
    fitted = float(scaling.predict("compute", theta_v, compute))
    c_eff = float(effective_compute(theta_b, fitted))
    row = RungMultiplier(compute, loss, fitted, None, None)
    if c_eff > hi:
      row = dataclasses.replace(row, bound="more than", bound_value=hi / compute)
    elif c_eff < lo:
      row = dataclasses.replace(row, bound="at most", bound_value=lo / compute)
    else:
      row = dataclasses.replace(row, effective_compute=c_eff, multiplier=c_eff / compute)
      if len(rows_b):
        draws = effective_compute(rows_b, _curve(rows_v, compute)[:, 0]) / compute
        row = dataclasses.replace(row, interval=_range(
            fit, draws, c_eff / compute, log=True, edges=(lo / compute, hi / compute)))
    rungs.append(row)
  return dataclasses.replace(out, rungs=tuple(rungs),
                             trend=_trend(fit, rungs, rows_b, rows_v, span, band),
                             crossover=_crossover(fit, base, variant, rows_b, rows_v))


def _trend(fit: LadderFit, rungs: Sequence[RungMultiplier], rows_b, rows_v, span,
           band: float) -> MultiplierTrend:
  inside = [r for r in rungs if r.multiplier is not None]
  if len(inside) < 2:
    return MultiplierTrend(None, None, band, len(inside), "unresolved",
                           f"{len(inside)} rung(s) inside the base's measured compute: "
                           "a slope needs two")
  x = np.log([r.compute for r in inside])
  xc = x - x.mean()
  slope = float(xc @ np.log([r.multiplier for r in inside]) / (xc @ xc))
  if not len(rows_b):
    return MultiplierTrend(slope, None, band, len(inside), "unresolved", "no bootstrap")
  c_eff = effective_compute(rows_b[:, None, :], _curve(rows_v, np.exp(x)))  # (n, rungs)
  ok = np.all((c_eff >= span[0]) & (c_eff <= span[1]), axis=1)
  outside = 1.0 - ok.mean()
  if outside > (1 - fit.level) / 2:
    return MultiplierTrend(slope, None, band, len(inside), "unresolved",
                           f"in {outside:.0%} of the resamples a rung's multiplier lies outside "
                           "the base's measured compute")
  slopes = (np.log(c_eff[ok]) - x) @ xc / (xc @ xc)
  found = _range(fit, slopes, slope)
  if found is None:  # one seed (or one fitted resample): nothing to read an interval from
    return MultiplierTrend(slope, None, band, len(inside), "unresolved",
                           "fewer than two seeds or resamples: no interval")
  if found.low > 0:
    label = "grows with scale"
  elif found.high < 0:
    label = "shrinks with scale"
  elif -band < found.low and found.high < band:
    label = "constant"
  else:
    label = "unresolved"
  return MultiplierTrend(slope, found, band, len(inside), label)


def _crossings(diff: np.ndarray, logs: np.ndarray) -> list[float]:
  """The log computes where ``diff`` (on the grid ``logs``) changes sign."""
  sign = np.sign(diff)
  idx = np.nonzero(sign[:-1] * sign[1:] < 0)[0]
  return [float(logs[i] + (logs[i + 1] - logs[i]) * diff[i] / (diff[i] - diff[i + 1]))
          for i in idx]


def _crossover(fit, base, variant, rows_b, rows_v) -> Crossover | None:
  (lo_b, hi_b), (lo_v, hi_v) = fit.curves[base].compute_range, fit.curves[variant].compute_range
  lo, hi = max(lo_b, lo_v), min(hi_b, hi_v)
  if not lo < hi:
    return None
  logs = np.linspace(math.log(lo), math.log(hi), CROSS_GRID)
  grid = np.exp(logs)
  point = _crossings(scaling.predict("compute", fit.constants[variant], grid)
                     - scaling.predict("compute", fit.constants[base], grid), logs)
  if not point:
    return None
  found = []
  diffs = _curve(rows_v, grid) - _curve(rows_b, grid)
  for d in diffs:
    cross = _crossings(d, logs)
    if cross:
      found.append(min(cross, key=lambda c: abs(c - point[0])))
  share = len(found) / len(diffs) if len(diffs) else 0.0
  interval = None
  if found:
    interval = _range(fit, np.exp(np.array(found)), math.exp(point[0]), log=True)
  return Crossover(math.exp(point[0]), interval, share, len(point))


def multipliers(fit: LadderFit, base: str, band: float = BAND) -> dict[str, Multiplier]:
  """Every other variant's multiplier over ``base``."""
  return {v: multiplier(fit, v, base, band) for v in fit.curves if v != base}


# ---------------------------------------------------------------- projection
def project(fit: LadderFit, variant: str, compute: Sequence[float]) -> tuple[Projection, ...]:
  """The fitted loss and its band at ``compute``, each flagged ``extrapolation``
  outside the variant's measured range (a figure's dashed line; no label reads it)."""
  curve = fit.curves[variant]
  if not curve.usable:
    return ()
  values = scaling.band(fit, variant, compute)
  lo, hi = curve.compute_range
  return tuple(Projection(float(c), float(values[0, i]),
                          None if math.isnan(values[1, i]) else float(values[1, i]),
                          None if math.isnan(values[2, i]) else float(values[2, i]),
                          not lo <= c <= hi) for i, c in enumerate(compute))


# ------------------------------------------------------------------ backtest
@dataclasses.dataclass(frozen=True)
class HeldOut:
  """The largest rung's loss predicted by a fit that did not see it.

  ``interval``: the fitted curve's band there (the curve's, not a
  new rung mean's: ``measured_se`` is the seed noise of the measured mean).
  ``error``: predicted - measured; ``covered``: the measured mean lies in it."""
  compute: float
  measured: float
  measured_se: float | None
  predicted: float
  interval: Range | None
  error: float
  covered: bool | None


@dataclasses.dataclass(frozen=True)
class HeldOutMultiplier:
  """The multiplier at the held-out rung, extrapolated from the fits without
  it (``extrapolation`` is True: a backtest, never a verdict), against the
  full ladder's (None: a bound there, or no multiplier)."""
  compute: float
  predicted: float
  interval: Range | None
  full: float | None
  covered: bool | None
  extrapolation: bool = True


@dataclasses.dataclass(frozen=True)
class Backtest:
  """One variant fitted without the ladder's largest rung, predicting it."""
  variant: str
  fit: scaling.CurveFit
  held_out: tuple[HeldOut, ...] = ()
  multiplier: tuple[HeldOutMultiplier, ...] = ()
  note: str = ""


def largest(rungs: Sequence[Rung]) -> tuple[int, ...]:
  """The indices of the largest rung: every budget of the largest size where
  the rungs state their sizes (``params``), else the largest compute."""
  if all(r.params is not None for r in rungs):
    top = max(r.params for r in rungs)
    return tuple(i for i, r in enumerate(rungs) if r.params == top)
  top = max(r.compute for r in rungs)
  return tuple(i for i, r in enumerate(rungs) if r.compute == top)


def backtest(full: LadderFit, base: str | None = None, resamples: int = scaling.RESAMPLES,
             seed: int = scaling.SEED, starts: np.ndarray | None = None
             ) -> dict[str, Backtest]:
  """Every variant of ``full`` (a compute-form fit) refitted without its
  largest rung; the held-out rung's loss predicted with its band, and, with
  ``base``, each variant's multiplier there against the full ladder's."""
  kept = {v: tuple(r for i, r in enumerate(rungs) if i not in largest(rungs))
          for v, rungs in full.rungs.items()}
  short = scaling.fit_ladder(kept, full.form, resamples, seed, full.level, full.method,
                             starts)
  full_mult = multipliers(full, base) if base is not None else {}
  out = {}
  for variant, rungs in full.rungs.items():
    curve = short.curves[variant]
    result = Backtest(variant, curve)
    if not curve.usable:
      out[variant] = dataclasses.replace(result, note=curve.reason or "the form does not fit")
      continue
    theta, draws = short.constants[variant], short.draws[variant]
    draws = draws[np.isfinite(draws[:, 0])]
    held = []
    for i in largest(rungs):
      values = list(rungs[i].losses.values())
      mean = sum(values) / len(values)
      se = (float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1
            else None)
      predicted = float(scaling.predict("compute", theta, rungs[i].compute))
      interval = (_range(short, _curve(draws, rungs[i].compute)[:, 0], predicted)
                  if len(draws) else None)
      held.append(HeldOut(rungs[i].compute, mean, se, predicted, interval, predicted - mean,
                          None if interval is None else interval.low <= mean <= interval.high))
    result = dataclasses.replace(result, held_out=tuple(held))
    if base is not None and variant != base and short.curves[base].usable:
      result = dataclasses.replace(result, multiplier=_held_out_multiplier(
          short, full_mult[variant], variant, base, [rungs[i].compute for i in largest(rungs)]))
    out[variant] = result
  return out


def _held_out_multiplier(short: LadderFit, full: Multiplier, variant: str, base: str,
                         computes: Sequence[float]) -> tuple[HeldOutMultiplier, ...]:
  rows_b, rows_v = _rows(short, base, variant)
  at = {r.compute: r.multiplier for r in full.rungs}
  out = []
  for c in computes:
    predicted = float(effective_compute(
        short.constants[base], scaling.predict("compute", short.constants[variant], c))) / c
    interval = None
    if len(rows_b):
      # An infinite draw (the variant's loss below the base's asymptote) is kept.
      interval = _range(short, effective_compute(rows_b, _curve(rows_v, c)[:, 0]) / c,
                        predicted, log=True)
    value = at.get(c)
    out.append(HeldOutMultiplier(c, predicted, interval, value,
                                 None if value is None or interval is None
                                 else interval.low <= value <= interval.high))
  return tuple(out)


def ladder_multipliers(ladder: Mapping[str, Sequence[Rung]], base: str, **fit_options
                       ) -> tuple[LadderFit, dict[str, Multiplier]]:
  """Fit the ladder's compute form and read every variant's multiplier over ``base``."""
  fit = scaling.fit_ladder(ladder, "compute", **fit_options)
  return fit, multipliers(fit, base)
