"""Loss against training compute, per variant of a ladder: the fit, its paired
bootstrap over seeds, whether it is identified, and whether it fits at all.

The forms (Hoffmann et al. 2022, "Training compute-optimal large language
models", section 3.3 and appendix D; REFERENCES.md, "Scaling laws"):

  "compute"        L(C) = E + A C^-alpha                    (E, A, alpha)
  "params_tokens"  L(N, D) = E + A N^-alpha + B D^-beta     (E, A, B, alpha, beta)

**Fit (Chinchilla's approach 3).** With e = log E, a = log A, b = log B, minimise

  sum_i Huber_delta(LSE(e, a - alpha log C_i) - log L_i),  delta = 1e-3

(LSE(u, v) = log(exp u + exp v); the (N, D) form adds b - beta log D_i) over
every run (each seed of each rung a point), by SciPy's L-BFGS-B from every
start of the paper's grid: alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ...,
1}, a, b in {0, 5, ..., 25} (150 starts for the compute form, 4,500 for the
(N, D) form), keeping the lowest final objective. Internally a is measured at
the geometric mean of the inputs (a' = a - alpha log C_ref: the same curve and
the same starts, better conditioned; the constants are given in the caller's
units). The optimiser works in a box, which only the degenerate fits reach:
alpha, beta in [0, 5]; e and a', b' from log(min L) - log(1e4) (an asymptote or
a term below 1e-4 of every loss: none measurable) to log(max L) (+ log(1e4)
for a', b').

**Identifiability** (the rule, in order):
  1. Too few inputs: fewer distinct compute values (or (N, D) pairs) than free
     parameters + 1 is refused before any fit (3 rungs with a free asymptote:
     three points fix any three-parameter curve exactly, and nothing is left
     to test it). The (N, D) form also needs >= 2 budgets at >= 3 sizes.
  2. The optimum on the box's edge: the data pull a parameter to a limit the
     form cannot reach with finite constants (alpha -> 0: E and A merge into
     one constant; e at its floor: no asymptote; alpha at 5: a step).
  3. The bootstrap runs to the edge: if more than (1 - level) / 2 of the
     resamples' fits end on the edge (2.5% at 95%), a percentile interval's
     end is the edge itself, so the seeds do not bound that parameter.

**Paired bootstrap over seeds** (``bootstrap``). Seed s of every variant and
rung is one draw (the same initialisation and data order): each resample
draws the ladder's seed indices with replacement, jointly for every variant
and rung, and every variant is refitted on the drawn runs (a seed drawn twice
weighs twice), from a fixed ``numpy.random.Generator`` seed. Intervals at
``level`` by ``method``: "student" (the default), the bootstrap's standard
error corrected for few seeds, with Student's t, or "percentile"
(``bootstrap.interval``): the percentile interval covers too rarely at a few
seeds (its variance is (n - 1) / n of the truth and only C(2n - 1, n)
resamples exist: 10 at 3 seeds). A resample is refitted from the full data's distinct local optima
(those the grid's starts ended in, at most ``WARM``), not from the whole
grid: its optimum lies near one of them, and a second basin the grid found
stays reachable. Besiroglu et al. 2024 resample whole runs for the same
reason (several points of one run are correlated): here a seed's runs at
every rung move together.

**Lack of fit against the seed noise.** The classic replicate F test (Draper
& Smith, "Applied Regression Analysis", 3rd ed. 1998, section 2.1, "pure
error"): the form is refitted by least squares in loss units (started at the
Huber optimum), and with R rungs (distinct inputs), n_r runs each, N in all
and k free parameters,

  SS_lack = sum_r n_r (mean_r - L_fit(C_r))^2,      df = R - k
  SS_pure = sum_r sum_i (L_ri - mean_r)^2,          df = N - R
  F = (SS_lack / (R - k)) / (SS_pure / (N - R)),   p = P(F_{R-k, N-R} > F)

the rung means' scatter about the curve against their seed-to-seed spread
(least squares, because F's null distribution is that of the least-squares
residuals; the robust Huber fit is the one reported). p < alpha: the form
does not fit (``LackOfFit.rejected``) and nothing downstream reads the curve.
Untested with one run per rung (no seed noise) or R = k.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import itertools
import math
import pathlib
from typing import Iterator, Literal, Mapping, Sequence

import numpy as np
import scipy
from scipy import optimize
from scipy import stats as scipy_stats

from tfx_jax.report.bootstrap import METHOD, IntervalMethod, interval, seed_draws

Form = Literal["compute", "params_tokens"]
PARAMETERS: dict[str, tuple[str, ...]] = {
    "compute": ("E", "A", "alpha"), "params_tokens": ("E", "A", "B", "alpha", "beta")}
DELTA = 1e-3
LEVEL = 0.95
RESAMPLES = 1000
SEED = 0
ALPHA = 0.05           # of the lack-of-fit test
# The paper's grid of starts (Hoffmann et al. 2022, appendix D.2).
EXPONENT_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)
E_GRID = (-1.0, -0.5, 0.0, 0.5, 1.0)
COEFFICIENT_GRID = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
EXPONENT_MAX = 5.0
LOG_FLOOR = math.log(1e4)  # a term below 1e-4 of every loss is not measurable
SCREEN = 150  # grid starts L-BFGS-B runs from, the lowest objectives (``_screened``)
WARM = 5                  # distinct full-data optima a resample starts from
EDGE_TOL = 1e-7


@dataclasses.dataclass(frozen=True)
class Rung:
  """One variant's runs at one point of a ladder: one size at one budget.

  ``compute``: the training FLOPs of each run; ``losses``: {seed: final loss},
  seed s the same draw at every variant and rung; ``params`` (N, non-embedding)
  and ``tokens`` (D): for the (N, D) form only."""
  compute: float
  losses: dict[int, float]
  params: float | None = None
  tokens: float | None = None


@dataclasses.dataclass(frozen=True)
class Parameter:
  """A fitted constant and its paired-bootstrap interval (None: no
  bootstrap, or the fit was refused)."""
  name: str
  value: float
  low: float | None = None
  high: float | None = None


@dataclasses.dataclass(frozen=True)
class LackOfFit:
  """The replicate F test of the curve against the seed noise (module docstring).
  ``rejected``: p < alpha, the form does not fit; False where untested
  (``reason`` says why)."""
  statistic: float | None
  df_lack: int
  df_pure: int
  p_value: float | None
  alpha: float
  rejected: bool
  reason: str = ""


@dataclasses.dataclass(frozen=True)
class CurveFit:
  """One variant's fit: its constants with intervals, or why it was refused.

  ``identifiable`` False: ``reason`` says which rule refused it (module
  docstring) and ``parameters`` is the refused optimum where one was found
  (rules 2, 3; () for rule 1). ``points``: runs fitted; ``distinct``: distinct
  inputs (rungs); ``seeds``: the ladder's seeds, which the bootstrap draws;
  ``optima``: distinct local optima the grid's starts ended in; ``failed``:
  resamples with no fit (too few rungs left); ``at_edge``: the share of the
  fitted resamples that ran to the box's edge."""
  variant: str
  form: Form
  identifiable: bool
  reason: str
  parameters: tuple[Parameter, ...]
  points: int
  distinct: int
  free: int
  seeds: int
  compute_range: tuple[float, float]
  objective: float | None = None
  starts: int = 0
  optima: int = 0
  resamples: int = 0
  failed: int = 0
  at_edge: float = 0.0
  lack_of_fit: LackOfFit | None = None
  level: float = LEVEL
  method: IntervalMethod = METHOD

  @property
  def usable(self) -> bool:
    """Identified, and not rejected by the lack-of-fit test: a curve to read."""
    return self.identifiable and not (self.lack_of_fit is not None and self.lack_of_fit.rejected)

  def value(self, name: str) -> float:
    """The fitted constant ``name`` ("E", "A", "alpha", ...)."""
    return next(p.value for p in self.parameters if p.name == name)


@dataclasses.dataclass(frozen=True, eq=False)
class LadderFit:
  """Every variant's fit of one ladder, with the bootstrap's draws (in memory,
  not a record: the multiplier, the bands and the projections read them).

  ``constants[v]``: the fitted constants in ``PARAMETERS[form]`` order (None:
  refused); ``draws[v]``: (resamples, k), one row per resample (NaN: no fit
  there); the rows of every variant come from the same seed draws."""
  form: Form
  level: float
  method: IntervalMethod
  seeds: tuple[int, ...]
  rungs: Mapping[str, tuple[Rung, ...]]
  curves: Mapping[str, CurveFit]
  constants: Mapping[str, np.ndarray | None]
  draws: Mapping[str, np.ndarray]


# ------------------------------------------------------------------ the form
def predict(form: Form, constants: np.ndarray, compute=None, params=None, tokens=None):
  """The curve's loss: L(C) for the compute form, L(N, D) for the other."""
  if form == "compute":
    e, a, alpha = constants
    return e + a * np.asarray(compute, float) ** -alpha
  e, a, b, alpha, beta = constants
  return (e + a * np.asarray(params, float) ** -alpha + b * np.asarray(tokens, float) ** -beta)


@dataclasses.dataclass(frozen=True, eq=False)
class _Points:
  """One variant's runs as the fitter reads them: x (P, m) the log inputs
  minus their reference, y the log losses, the seed index and rung of each."""
  x: np.ndarray
  ref: np.ndarray
  y: np.ndarray
  loss: np.ndarray
  seed: np.ndarray
  group: np.ndarray
  lower: np.ndarray
  upper: np.ndarray


def _points(rungs: Sequence[Rung], form: Form, seeds: Sequence[int]) -> _Points:
  index = {s: i for i, s in enumerate(seeds)}
  cols, loss, seed, group = [], [], [], []
  for r, rung in enumerate(rungs):
    inputs = [rung.compute] if form == "compute" else [rung.params, rung.tokens]
    for s, value in sorted(rung.losses.items()):
      cols.append([math.log(v) for v in inputs])
      loss.append(value)
      seed.append(index[s])
      group.append(r)
  logs = np.array(cols, float)
  ref = logs.mean(axis=0)
  loss_a = np.array(loss, float)
  m = logs.shape[1]
  lo, hi = math.log(loss_a.min()) - LOG_FLOOR, math.log(loss_a.max())
  lower = np.array([lo] + [lo] * m + [0.0] * m)
  upper = np.array([hi] + [hi + LOG_FLOOR] * m + [EXPONENT_MAX] * m)
  return _Points(logs - ref, ref, np.log(loss_a), loss_a, np.array(seed), np.array(group),
                 lower, upper)


def _log_curve(theta: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """LSE(e, a'_j - alpha_j x_j) per point, and each term's share of the sum
  (the softmax weights: the gradient of the LSE in each term), (P, m + 1)."""
  m = x.shape[1]
  z = np.empty((x.shape[0], m + 1))
  z[:, 0] = theta[0]
  z[:, 1:] = theta[1:1 + m] - theta[1 + m:] * x
  pred = np.logaddexp(z[:, 0], z[:, 1])  # a ufunc: SciPy's logsumexp costs 10x here
  for j in range(2, m + 1):
    pred = np.logaddexp(pred, z[:, j])
  return pred, np.exp(z - pred[:, None])


def _objective(theta: np.ndarray, pts: _Points, w: np.ndarray) -> tuple[float, np.ndarray]:
  """sum w Huber(LSE - log L) / delta and its gradient in (e, a'_j, alpha_j)
  (divided by delta so that L-BFGS-B's tolerances see numbers of order 1)."""
  m = pts.x.shape[1]
  pred, soft = _log_curve(theta, pts.x)
  r = pred - pts.y
  abs_r = np.abs(r)
  huber = np.where(abs_r <= DELTA, 0.5 * r * r, DELTA * (abs_r - 0.5 * DELTA))
  grad_z = soft * (w * np.clip(r, -DELTA, DELTA) / DELTA)[:, None]
  grad = np.empty(2 * m + 1)
  grad[0] = grad_z[:, 0].sum()
  grad[1:1 + m] = grad_z[:, 1:].sum(axis=0)
  grad[1 + m:] = -(grad_z[:, 1:] * pts.x).sum(axis=0)
  return float(w @ huber) / DELTA, grad


def grid(form: Form) -> np.ndarray:
  """The paper's starts as rows (e, a[, b], alpha[, beta]) in the caller's units."""
  m = 1 if form == "compute" else 2
  rows = [(e, *coef, *exps) for e in E_GRID
          for coef in itertools.product(COEFFICIENT_GRID, repeat=m)
          for exps in itertools.product(EXPONENT_GRID, repeat=m)]
  return np.array(rows, float)


def _to_internal(starts: np.ndarray, pts: _Points) -> np.ndarray:
  m = pts.x.shape[1]
  out = starts.copy()
  out[:, 1:1 + m] = starts[:, 1:1 + m] - starts[:, 1 + m:] * pts.ref
  return np.clip(out, pts.lower, pts.upper)


def _constants(theta: np.ndarray, pts: _Points) -> np.ndarray:
  """Internal (e, a'_j, alpha_j) -> (E, A_j, alpha_j) in the caller's units."""
  m = pts.x.shape[1]
  coef = np.exp(theta[1:1 + m] + theta[1 + m:] * pts.ref)
  return np.concatenate([[math.exp(theta[0])], coef, theta[1 + m:]])


@functools.cache
def _scipy_openblas() -> ctypes.CDLL | None:
  """SciPy's bundled OpenBLAS (its wheels' ``scipy.libs``), or None where
  SciPy links another BLAS."""
  found = sorted((pathlib.Path(scipy.__file__).parent.parent / "scipy.libs").glob(
      "libscipy_openblas*.so*"))
  try:
    lib = ctypes.CDLL(str(found[0])) if found else None
    if lib is not None:
      lib.scipy_openblas_get_num_threads.restype = ctypes.c_int
    return lib
  except (OSError, AttributeError):
    return None


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
  """L-BFGS-B on 3 or 5 parameters calls LAPACK on matrices of that size,
  where OpenBLAS's threads only wait on each other: on a busy machine (a
  sweep on every core) a 3-parameter minimisation took 18x as long with them
  (58 ms against 3.2 ms, measured). One thread while fitting (what
  threadpoolctl does), restored after."""
  lib = _scipy_openblas()
  if lib is None:
    yield
    return
  before = lib.scipy_openblas_get_num_threads()
  lib.scipy_openblas_set_num_threads(1)
  try:
    yield
  finally:
    lib.scipy_openblas_set_num_threads(before)


def _minimise(pts: _Points, w: np.ndarray, starts: np.ndarray) -> list[tuple[float, np.ndarray]]:
  bounds = list(zip(pts.lower, pts.upper))
  out = []
  for start in starts:
    res = optimize.minimize(_objective, start, args=(pts, w), jac=True, method="L-BFGS-B",
                            bounds=bounds, options={"maxiter": 2000, "gtol": 1e-9,
                                                    "ftol": 1e-14})
    out.append((float(res.fun), np.asarray(res.x)))
  return out


def _screened(starts: np.ndarray, pts: _Points) -> np.ndarray:
  """The ``SCREEN`` starts of the grid with the lowest objective, where it has
  more (the L(C) grid's 150: all; the L(N, D) grid's 4,500, from each of which
  L-BFGS-B took minutes per variant: its best 150)."""
  if len(starts) <= SCREEN:
    return starts
  w = np.ones(len(pts.y))
  values = np.array([_objective(theta, pts, w)[0] for theta in starts])
  return starts[np.argsort(values, kind="stable")[:SCREEN]]


def _distinct(results: list[tuple[float, np.ndarray]], keep: int) -> list[np.ndarray]:
  """The best ``keep`` distinct optima (apart by > 1e-3 in some coordinate)."""
  found: list[np.ndarray] = []
  for _, theta in sorted(results, key=lambda r: r[0]):
    if all(np.max(np.abs(theta - f)) > 1e-3 for f in found):
      found.append(theta)
    if len(found) == keep:
      break
  return found


def _edge(theta: np.ndarray, pts: _Points, form: Form) -> str:
  """The first parameter on the box's edge, as a reason ("" where none is)."""
  names = ("E",) + ("A", "B")[:pts.x.shape[1]] + ("alpha", "beta")[:pts.x.shape[1]]
  for name, value, lo, hi in zip(names, theta, pts.lower, pts.upper):
    at_lo, at_hi = value - lo <= EDGE_TOL, hi - value <= EDGE_TOL
    if name in ("alpha", "beta") and at_lo:
      return f"{name} runs to 0: the curve does not fall, its constant and E are not separable"
    if name in ("alpha", "beta") and at_hi:
      return f"{name} runs to {EXPONENT_MAX:g}: the curve is a step, not a power law"
    if name == "E" and at_lo:
      return "E runs to 0: the runs show no asymptote"
    if at_lo or at_hi:
      return f"{name} runs to the edge of the fit's box: the term is not measured"
  return ""


# -------------------------------------------------------------- lack of fit
def lack_of_fit(pts: _Points, theta: np.ndarray, alpha: float = ALPHA) -> LackOfFit:
  """The replicate F test of the form's least-squares fit (module docstring)."""
  groups = np.unique(pts.group)
  r_count, n, k = len(groups), len(pts.y), len(theta)
  df_lack, df_pure = r_count - k, n - r_count
  if df_pure == 0:
    return LackOfFit(None, df_lack, 0, None, alpha, False,
                     "one run per rung: no seed noise to test the curve against")
  if df_lack <= 0:
    return LackOfFit(None, df_lack, df_pure, None, alpha, False,
                     "as many free parameters as rungs: nothing left to test")

  def residual(th):
    return np.exp(_log_curve(th, pts.x)[0]) - pts.loss

  fitted = optimize.least_squares(residual, theta, bounds=(pts.lower, pts.upper),
                                  xtol=1e-14, ftol=1e-14, gtol=1e-14).x
  curve = pts.loss + residual(fitted)
  ss_lack = ss_pure = 0.0
  for g in groups:
    sel = pts.group == g
    mean = pts.loss[sel].mean()
    ss_lack += sel.sum() * (mean - curve[sel][0]) ** 2
    ss_pure += ((pts.loss[sel] - mean) ** 2).sum()
  if ss_pure == 0.0:
    return LackOfFit(None, df_lack, df_pure, None, alpha, False,
                     "the seeds agree exactly: no seed noise to test the curve against")
  statistic = (ss_lack / df_lack) / (ss_pure / df_pure)
  p = float(scipy_stats.f.sf(statistic, df_lack, df_pure))
  return LackOfFit(float(statistic), df_lack, df_pure, p, alpha, p < alpha)


# ------------------------------------------------------------------ checks
def _check(rungs: Sequence[Rung], form: Form, variant: str) -> None:
  if form not in PARAMETERS:
    raise ValueError(f"form must be one of {sorted(PARAMETERS)}, got {form!r}")
  if not rungs:
    raise ValueError(f"variant {variant!r} has no rungs")
  for i, rung in enumerate(rungs):
    where = f"variant {variant!r}, rung {i}"
    if not (math.isfinite(rung.compute) and rung.compute > 0):
      raise ValueError(f"{where}: compute must be a positive number, got {rung.compute}")
    if not rung.losses:
      raise ValueError(f"{where}: no runs (losses by seed is empty)")
    bad = {s: v for s, v in rung.losses.items() if not (math.isfinite(v) and v > 0)}
    if bad:
      raise ValueError(f"{where}: losses must be positive and finite, got {bad}: leave "
                       "failed runs out and count them apart")
    if form == "params_tokens" and not all(
        v is not None and math.isfinite(v) and v > 0 for v in (rung.params, rung.tokens)):
      raise ValueError(f"{where}: the params_tokens form needs positive params and tokens, "
                       f"got {rung.params}, {rung.tokens}")


def params_tokens_reason(rungs: Sequence[Rung]) -> str:
  """Why the (N, D) form cannot be fitted to ``rungs`` ("" where it can):
  it needs at least two budgets (token counts) at each of at least three sizes."""
  budgets: dict[float, set[float]] = {}
  for rung in rungs:
    if rung.params is None or rung.tokens is None:
      return "a rung states no params or tokens"
    budgets.setdefault(rung.params, set()).add(rung.tokens)
  sizes = sum(1 for b in budgets.values() if len(b) >= 2)
  if sizes < 3:
    return (f"the (N, D) form needs >= 2 budgets at >= 3 sizes; the ladder has {sizes} "
            "size(s) with two budgets or more")
  return ""


def _refusal(variant, form, pts, rungs, seeds, reason, parameters=()) -> CurveFit:
  computes = [r.compute for r in rungs]
  return CurveFit(variant, form, False, reason, tuple(parameters), len(pts.y),
                  len(np.unique(pts.group)), len(PARAMETERS[form]), len(seeds),
                  (min(computes), max(computes)))


# ------------------------------------------------------------------ fitting
def fit_ladder(ladder: Mapping[str, Sequence[Rung]], form: Form = "compute",
               resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL,
               method: IntervalMethod = METHOD, starts: np.ndarray | None = None,
               alpha: float = ALPHA) -> LadderFit:
  """Every variant's fit with its paired-bootstrap intervals (module docstring).

  ``ladder``: {variant: its rungs}; ``resamples``: bootstrap resamples (0:
  none, no intervals); ``seed``: of the Generator that draws them;
  ``method``: how intervals are read from them (``interval``); ``starts``:
  rows (e, a[, b], alpha[, beta]) replacing the paper's grid; ``alpha``: of
  the lack-of-fit test."""
  if not 0.0 < level < 1.0:
    raise ValueError(f"level must lie in (0, 1), got {level}")
  if resamples < 0:
    raise ValueError(f"resamples must be >= 0, got {resamples}")
  if method not in ("percentile", "student"):
    raise ValueError(f"method must be 'percentile' or 'student', got {method!r}")
  for variant, rungs in ladder.items():
    _check(rungs, form, variant)
  with _one_blas_thread():
    return _fit_ladder(ladder, form, resamples, seed, level, method, starts, alpha)


def _fit_ladder(ladder, form, resamples, seed, level, method, starts, alpha) -> LadderFit:
  seeds = tuple(sorted({s for rungs in ladder.values() for r in rungs for s in r.losses}))
  grid_rows = grid(form) if starts is None else np.asarray(starts, float)
  k = len(PARAMETERS[form])
  curves, constants, draws, warm, data = {}, {}, {}, {}, {}
  for variant, rungs in ladder.items():
    rungs = tuple(rungs)
    pts = _points(rungs, form, seeds)
    data[variant] = pts
    draws[variant] = np.full((resamples, k), np.nan)
    constants[variant] = None
    distinct = len(np.unique(pts.group))
    reason = params_tokens_reason(rungs) if form == "params_tokens" else ""
    if not reason and distinct < k + 1:
      reason = (f"not identifiable: {distinct} distinct inputs for {k} free parameters "
                f"(needs {k + 1}: with {k} any curve of the form passes through them)")
    if reason:
      curves[variant] = _refusal(variant, form, pts, rungs, seeds, reason)
      continue
    results = _minimise(pts, np.ones(len(pts.y)),
                        _screened(_to_internal(grid_rows, pts), pts))
    objective, best = min(results, key=lambda r: r[0])
    optima = _distinct(results, len(results))
    point = _constants(best, pts)
    edge = _edge(best, pts, form)
    computes = [r.compute for r in rungs]
    curves[variant] = CurveFit(
        variant, form, not edge, "not identifiable: " + edge if edge else "",
        tuple(Parameter(n, float(v)) for n, v in zip(PARAMETERS[form], point)), len(pts.y),
        distinct, k, len(seeds), (min(computes), max(computes)), objective, len(grid_rows),
        len(optima), 0 if edge else resamples, lack_of_fit=lack_of_fit(pts, best, alpha),
        level=level, method=method)
    if not edge:
      constants[variant] = point
      warm[variant] = optima[:WARM]
  edges: dict[str, dict[str, int]] = {v: {} for v in warm}  # {variant: {edge: resamples}}
  # A draw's refit is a function of its seed counts alone: a ladder of n seeds
  # has only C(2n - 1, n) distinct draws (10 at 3 seeds, 35 at 4), so each is
  # fitted once and the resamples that repeat it read the same optimum.
  refits: dict[tuple[str, bytes], np.ndarray] = {}
  for b, counts in enumerate(seed_draws(len(seeds), resamples, seed)):
    for variant, starts_v in warm.items():
      pts = data[variant]
      w = counts[pts.seed].astype(float)
      if len(np.unique(pts.group[w > 0])) < k + 1:
        continue
      key = (variant, counts.tobytes())
      if key not in refits:
        refits[key] = min(_minimise(pts, w, np.array(starts_v)), key=lambda r: r[0])[1]
      theta = refits[key]
      edge = _edge(theta, pts, form)
      if edge:
        edges[variant][edge] = edges[variant].get(edge, 0) + 1
      draws[variant][b] = _constants(theta, pts)
  for variant in warm:
    curves[variant] = _with_intervals(curves[variant], draws[variant], edges[variant])
    if not curves[variant].identifiable:
      constants[variant] = None
  return LadderFit(form, level, method, seeds, {v: tuple(r) for v, r in ladder.items()},
                   curves, constants, draws)


def _with_intervals(curve: CurveFit, draws: np.ndarray, edges: Mapping[str, int]) -> CurveFit:
  """The curve with its intervals, refused by rule 3 where the resamples run
  to the edge too often (``edges``: {edge reached: resamples})."""
  if curve.resamples == 0 or not curve.identifiable:
    return curve
  level = curve.level
  fitted = int(np.isfinite(draws[:, 0]).sum())
  failed = curve.resamples - fitted
  share = sum(edges.values()) / fitted if fitted else 1.0
  parameters = []
  for j, p in enumerate(curve.parameters):
    found = interval(draws[:, j], p.value, level, curve.seeds, curve.method,
                     log=p.name in ("E", "A", "B"))
    parameters.append(dataclasses.replace(p, low=found and found[0], high=found and found[1]))
  out = dataclasses.replace(curve, parameters=tuple(parameters), failed=failed, at_edge=share)
  if share > (1 - level) / 2 or failed > (1 - level) / 2 * curve.resamples:
    common = max(edges, key=edges.get) if edges else ""
    why = (f"{share:.0%} of the fitted resamples run to the edge of the fit's box "
           f"(most often: {common})"
           if share > (1 - level) / 2 else f"{failed} of {curve.resamples} resamples leave "
           "too few rungs to fit")
    return dataclasses.replace(out, identifiable=False,
                               reason=f"not identifiable: {why}, more than the "
                               f"{(1 - level) / 2:.1%} a {level:.0%} interval can leave out, "
                               "so the seeds do not bound the constants")
  return out


def fit_curve(rungs: Sequence[Rung], form: Form = "compute", variant: str = "",
              starts: np.ndarray | None = None) -> CurveFit:
  """One variant's fit without a bootstrap (no intervals)."""
  return fit_ladder({variant: rungs}, form, resamples=0, starts=starts).curves[variant]


def band(fit: LadderFit, variant: str, compute: Sequence[float]) -> np.ndarray:
  """(3, len(compute)): the compute form's fitted loss and its band (rows:
  fit, low, high; ``interval`` by the fit's method) at ``compute``; NaN where
  there is no fit. A figure's band; past the measured range it is an
  extrapolation (``multiplier.project``)."""
  c = np.asarray(compute, float)
  point = fit.constants.get(variant)
  out = np.full((3, len(c)), np.nan)
  if fit.form != "compute" or point is None:
    return out
  out[0] = predict("compute", point, c)
  rows = fit.draws[variant]
  rows = rows[np.isfinite(rows[:, 0])]
  for i in range(len(c)):
    found = interval(predict("compute", rows.T, c[i]), out[0, i], fit.level, len(fit.seeds),
                     fit.method)
    if found is not None:
      out[1:, i] = found
  return out
