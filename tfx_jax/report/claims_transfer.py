"""The claims on hyperparameter transfer (``report.claims`` dispatches here):

  transfer/shift[/<size field>]  a quantity of one variant (compare=(variant,
      None); a variant is named as a point is, without the size axis): the
      shift of log2(optimum learning rate) per doubling of size
      (``sections.transfer``, report.json's ``transfer``) against 0, with
      its delta-method interval paired by seed (``optimum``). "lower": the
      optimum falls with size; "higher": it rises; Equivalent(band): it stays
      within +-band (log2 units per doubling: 0.5 is a factor sqrt(2)). The
      default band (of "not reproduced: equivalent") is the sweep's
      ``transfer_band``. Where the sweep has two size axes (width and depth),
      the metric names the one it reads: ``transfer/shift/num_layers``.
  every_rate/<metric>  two points (e.g. the largest and the smallest size of
      one variant): a's metric against b's at every learning rate both ran,
      as an intersection-union test (Berger 1982): "a lower at every rate"
      holds only where it holds at each. At each shared rate the paired (by
      seed) difference a - b of the tuning runs' final metric on validation
      (the runs that learned on both sides; a rate with fewer than 2 such
      pairs is left out, and the design line names it); the one-sided p of
      the expected direction at each; the test rests on the rate with the
      largest (the least evidence for the claim), whose difference, interval
      and two-sided p are the claim's estimate, interval and p, so that
      "resolved" means resolved at every rate on the paper's side, and a rate
      resolved against it reads "not reproduced". Its equivalence p is that
      rate's TOST. With Equivalent(band): the largest TOST p over the rates
      (equivalent at every rate), at the rate that has it.

Both read report.json alone, so a committed report is relabelled without its runs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records.claims import Claim, Equivalent
from tfx_jax.records.sweep import TRANSFER_BAND, AxisRecord, SweepRecord
from tfx_jax.report import stats
from tfx_jax.report import tuning
from tfx_jax.report.claim_test import Test, Untested
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.transfer_schema import LEARNING_RATE, Transfer, size_axes

SHIFT = "transfer/shift"
EVERY_RATE = "every_rate/"


def reads_variant(metric: str) -> bool:
  """Whether the claim's point_a names a variant (all sizes of the size axis)."""
  return metric == SHIFT or metric.startswith(SHIFT + "/")


def handles(metric: str) -> bool:
  """Whether the metric is one of this module's."""
  return reads_variant(metric) or metric.startswith(EVERY_RATE)


def _size_name(metric: str) -> str | None:
  """The size field a shift metric names (``num_layers``), None: not named."""
  rest = metric[len(SHIFT):].lstrip("/")
  return rest.split(".")[-1] or None


def _candidates(claim: Claim, fields: Sequence[str], where: str) -> str:
  """The size field the claim reads among ``fields`` (ConfigError where none
  or several fit)."""
  named = _size_name(claim.metric)
  names = [f.split(".")[-1] for f in fields]
  if named is not None and named not in names:
    raise ConfigError(f"{where}: {claim.metric!r} names the size field {named!r}; the sweep's "
                      f"size axes change {names or 'nothing'} ({SHIFT}/<one of them>).")
  if named is None and len(set(names)) > 1:
    raise ConfigError(f"{where}: the sweep has size axes over {names}: name the one the "
                      f"claim reads, e.g. {SHIFT}/{names[0]}.")
  if not names:
    raise ConfigError(f"{where}: {claim.metric} needs an axis that changes model.d_model "
                      "or model.num_layers (a size axis) and a tuned optim.learning_rate.")
  return fields[names.index(named)] if named is not None else fields[0]


def band(claim: Claim, report: Report | None) -> float:
  """The band of a transfer claim: its own, else log2 of the sweep's
  ``transfer_band`` (report.json's ``transfer``) for a shift; a rate's
  metric takes its kind's default (``claims.band_of``)."""
  if isinstance(claim.expect, Equivalent):
    return float(claim.expect.band)
  found = [t.band for t in (report.transfer if report is not None else ())]
  return found[0] if found else math.log2(TRANSFER_BAND)


# ------------------------------------------------------------------ points
def records(claim: Claim, report: Report, where: str) -> list[Transfer]:
  """The transfer records a shift claim chooses its variant from: those of
  the size field it reads (ConfigError where none or several fit)."""
  field = _candidates(claim, list(dict.fromkeys(t.size_field for t in report.transfer)), where)
  return [t for t in report.transfer if t.size_field == field]


def variant(t: Transfer, report: Report) -> tuple[Point, list[Point]]:
  """(the variant's first point, relabelled by the variant's values alone so
  that the claim's point_a reads as the variant; its points at every size)."""
  by_key = {p.key: p for p in report.points}
  points = [by_key[o.key] for o in t.optima if o.key in by_key]
  return dataclasses.replace(points[0], values=dict(t.variant)), points


def _transfer_of(report: Report, point: Point, metric: str) -> Transfer | None:
  named = _size_name(metric)
  return next((t for t in report.transfer if any(o.key == point.key for o in t.optima)
               and (named is None or t.size_field.split(".")[-1] == named)), None)


# ------------------------------------------------------------------- tests
def test(claim: Claim, report: Report, a: Point, b: Point | None, band_: float
         ) -> Test | Untested:
  """The claim's estimate and raw tests (``claims.test_claim``), or why none."""
  if reads_variant(claim.metric):
    return _shift(claim, report, a, band_)
  return _every_rate(claim, report, a, b, band_)


def _shift(claim: Claim, report: Report, a: Point, band_: float) -> Test | Untested:
  t = _transfer_of(report, a, claim.metric)
  if t is None:
    return Untested(f"no transfer check of {', '.join(a.values.values())}")
  if t.shift is None:
    return Untested(f"no shift: {t.reason}")
  if t.low is None or t.se is None:
    return Untested(f"one seed fitted at every size: no interval ({t.reason})",
                    f"{t.shift:+.3f} per doubling")
  iv = stats.Interval(t.shift, t.low, t.high, t.df, t.se, t.p, "paired", t.seeds, t.seeds,
                      0.95)
  eq = stats.tost(iv, band_, report.options.alpha)
  fitted = sum(o.learning_rate is not None for o in t.optima)
  name = t.size_field.split(".")[-1]
  return Test(iv, t.p, eq.p_value, t.seeds,
              f"log2(optimum learning rate) per doubling of {name} over {fitted} sizes, "
              "quadratic fits of the validation tuning curves, delta method paired by seed")


def _rows(point: Point) -> dict[float, Any]:
  """{learning rate: the point's tuned row}, other tuned fields at their chosen values."""
  read = tuning.sensitivity_labels(point)
  return {float(r.tuned[LEARNING_RATE]): r for r in point.tuned
          if r.label in read and LEARNING_RATE in r.tuned}


def one_sided(iv: stats.Interval, expect: Any) -> float:
  """The one-sided p of the expected direction ("lower": H0 a - b >= 0);
  with no spread, 0 on the expected side and 1 otherwise (the se -> 0 limit)."""
  diff = iv.diff if expect == "higher" else -iv.diff  # > 0: on the paper's side
  if iv.se == 0.0:
    return 0.0 if diff > 0 else 1.0
  return stats.t_sf(diff / iv.se, iv.df)


def weakest(claim: Claim, tested: Sequence[tuple[Any, stats.Interval]], band_: float,
            alpha: float) -> tuple[Any, stats.Interval, float]:
  """The intersection-union test over places (rates, rungs): the claim holds
  at every place only if it holds at the least favourable one, whose
  one-sided p in the claim's direction (TOST's for an equivalence claim) is
  the largest. (that place, its interval, the test's p: TOST's where the
  claim is an equivalence, else the TOST p the Test carries beside it)."""
  scored = []
  for place, iv in tested:
    eq = stats.tost(iv, band_, alpha).p_value
    scored.append((place, iv, eq if claim.equivalence else one_sided(iv, claim.expect), eq))
  place, iv, worst, eq = max(scored, key=lambda r: r[2])
  return place, iv, worst if claim.equivalence else eq


def _every_rate(claim: Claim, report: Report, a: Point, b: Point | None, band_: float
                ) -> Test | Untested:
  metric = claim.metric[len(EVERY_RATE):]
  if b is None:
    return Untested(f"{claim.metric} compares two points")
  rows_a, rows_b = _rows(a), _rows(b)
  shared = sorted(set(rows_a) & set(rows_b))
  tested, left_out = [], []
  for rate in shared:
    va, vb = ({seed: v for seed, run in rows[rate].seeds.items() if run.outcome == "learned"
               and (v := run.validation.get(metric)) is not None
               and math.isfinite(v)} for rows in (rows_a, rows_b))
    pairs = sorted(set(va) & set(vb))
    if len(pairs) < 2:
      left_out.append(rate)
      continue
    tested.append((rate, stats.compare({s: va[s] for s in pairs}, {s: vb[s] for s in pairs})))
  if not tested:
    return Untested(f"no learning rate that both ran with 2 seeds learned on each side "
                    f"({len(shared)} shared)")

  rate, iv, p_eq = weakest(claim, tested, band_, report.options.alpha)
  how = (f"{metric} on validation at each of the {len(tested)} learning rates both ran, paired "
         f"by seed; intersection-union over the rates, resting on {rate:g}")
  if left_out:
    how += (f" ({', '.join(f'{r:g}' for r in left_out)} left out: fewer than 2 seeds learned "
            "on both sides)")
  return Test(iv, iv.p_value, p_eq, iv.n_a, how)


# ------------------------------------------------------------ before a run
def check(record: SweepRecord, claim: Claim, where: str) -> list[AxisRecord]:
  """The axes a transfer claim's points are named over, known before any
  run (``claim_checks.check_sweep``, ``--dry-run`` included): every axis for
  ``every_rate/``, all but the size axis for a shift (ConfigError where the
  sweep tunes no learning rate, or has no size axis for a shift)."""
  if LEARNING_RATE not in record.tune:
    raise ConfigError(f"{where}: {claim.metric} reads the learning-rate curves: the sweep "
                      "tunes no optim.learning_rate (tune={'optim.learning_rate': [...]}).")
  if not reads_variant(claim.metric):
    return list(record.axes)
  found = size_axes(record.axes)
  field = _candidates(claim, [f for _, f in found], where)
  ai = next(i for i, f in found if f == field)
  return [axis for i, axis in enumerate(record.axes) if i != ai]
