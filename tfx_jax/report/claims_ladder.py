"""The claims on a ladder (``report.claims`` dispatches here), each a
quantity of one variant (compare=(variant, None); the variant named as a
point is, over the declared axes, without the ladder's rung and budget
axes), read from report.json's ``ladder`` (``sections.ladder``):

  ladder/multiplier  the variant's compute multiplier over the base
      (``multiplier.multiplier``), as ln multiplier against 0 (1x), at every
      rung read inside the base's measured compute: an intersection-union
      test (Berger 1982) as ``every_rate/`` has it, so "higher" (the variant
      is worth more than its compute of the base) holds only where it holds
      at each rung. At each rung the bootstrap's interval of ln multiplier
      with its standard error (``multiplier.Range.se``), t with seeds - 1
      degrees of freedom; the one-sided p of the expected direction at
      each; the test rests on the rung with the largest (the least evidence
      for the claim), whose estimate, interval and two-sided p are the
      claim's. With Equivalent(band) (ln units: log(1.05) is 5% either
      way), the largest TOST p over the rungs. A rung whose multiplier is a
      bound (outside the base's measured compute) is left out, and the
      design line names it. The default band is 1% (a log ratio's).
  ladder/trend  the slope of ln multiplier against ln compute per e-fold
      (``multiplier.MultiplierTrend``), against 0, with its bootstrap
      standard error: "lower": the multiplier shrinks with scale; "higher":
      it grows; Equivalent(band): constant within +-band, by default the
      trend label's own band (``multiplier.BAND``).

Both read report.json alone, so a committed report is relabelled without its
runs; the label is the one rule's (``claims.label``), Holm over the family.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records.claims import Claim, Equivalent
from tfx_jax.records.ladder import BUDGET_AXIS, RUNG_AXIS
from tfx_jax.records.sweep import AxisRecord, SweepRecord
from tfx_jax.report import multiplier as mult
from tfx_jax.report import stats
from tfx_jax.report.claim_test import Test, Untested
from tfx_jax.report.claims_transfer import one_sided, weakest
from tfx_jax.report.ladder_schema import LadderVariant
from tfx_jax.report.schema import Point, Report

MULTIPLIER = "ladder/multiplier"
TREND = "ladder/trend"
METRICS = (MULTIPLIER, TREND)


def handles(metric: str) -> bool:
  """Whether the metric is one of this module's (``ladder/...``; ``check``
  names the valid ones)."""
  return metric.startswith("ladder/")


def band(claim: Claim, default: float) -> float:
  """The claim's own band, else the multiplier's ``default`` (a log ratio's)
  or the trend label's constant band."""
  if isinstance(claim.expect, Equivalent):
    return float(claim.expect.band)
  return mult.BAND if claim.metric == TREND else default


def variants(report: Report, where: str) -> list[LadderVariant]:
  """The ladder's variants other than the base, which a claim names
  (ConfigError where the report has no ladder)."""
  if report.ladder is None:
    raise ConfigError(f"{where}: {', '.join(METRICS)} read a ladder; the sweep has none "
                      "(Sweep(ladder=Ladder(...))).")
  # One per variant: a ladder of several budgets has a curve per budget, all
  # of one variant (``_of`` finds them all).
  seen: dict[str, LadderVariant] = {}
  for v in report.ladder.variants:
    if v.variant != report.ladder.base:
      seen.setdefault(v.variant, v)
  return list(seen.values())


def variant(v: LadderVariant, report: Report) -> tuple[Point, list[Point]]:
  """(the variant's first point, relabelled by the variant's values alone so
  that the claim's point_a reads as the variant; its points at every rung)."""
  by_key = {p.key: p for p in report.points}
  points = [by_key[k] for k in v.keys if k in by_key]
  return dataclasses.replace(points[0], values=dict(v.values)), points


def named(claim: Claim, report: Report) -> Point:
  """The claim's variant as a point while the ladder has no curves (its
  confirmation runs not yet run): the report's first point, labelled by the
  claim's own words for the variant."""
  spec = claim.compare[0]
  values = ({"variant": spec} if isinstance(spec, str)
            else {field: str(value) for field, value in dict(spec).items()})
  return dataclasses.replace(report.points[0], values=values)


def _of(report: Report, a: Point) -> list[LadderVariant]:
  """The variant's curves: one, or one per budget where each has its own."""
  return [v for v in (report.ladder.variants if report.ladder else ())
          if v.values == a.values]


def _interval(estimate: float, low: float, high: float, se: float, seeds: int,
              level: float) -> stats.Interval:
  """The bootstrap's interval as a t interval: df = seeds - 1, p two-sided."""
  df = float(seeds - 1)
  p = (2.0 * stats.t_sf(abs(estimate) / se, df) if se > 0 else (0.0 if estimate else 1.0))
  return stats.Interval(estimate, low, high, df, se, p, "paired", seeds, seeds, level)


# ------------------------------------------------------------------- tests
def test(claim: Claim, report: Report, a: Point, band_: float) -> Test | Untested:
  """The claim's estimate and raw tests (``claims.test_claim``), or why none."""
  if claim.metric not in METRICS:
    return Untested(f"{claim.metric} is not a ladder's quantity: {', '.join(METRICS)}")
  found = _of(report, a)
  if not found or any(v.multiplier is None for v in found):
    return Untested(f"no multiplier of {', '.join(a.values.values())} over the base")
  seeds = len(report.ladder.seeds)
  noted = next((v for v in found if v.multiplier.note), None)
  if noted is not None:
    return Untested(noted.multiplier.note)
  if claim.metric == TREND:
    # One trend per budget: the claim holds where it holds at each
    # (intersection-union), resting on the least favourable budget's.
    tests = [(v, _trend(v.multiplier, seeds, band_, report)) for v in found]
    untested = next((t for _, t in tests if isinstance(t, Untested)), None)
    if untested is not None:
      return untested
    worst = max(tests, key=lambda vt: (vt[1].p_equivalence if claim.equivalence
                                       else one_sided(vt[1].interval, claim.expect)))
    v, t = worst
    if len(found) > 1:
      t = dataclasses.replace(t, how=f"{t.how}; at {v.tokens_per_param:g} tokens per "
                              f"parameter, the least favourable of {len(found)} budgets' "
                              "trends (intersection-union)")
    return t
  return _multiplier(claim, [v.multiplier for v in found], seeds, band_, report)


def _trend(m: mult.Multiplier, seeds: int, band_: float, report: Report) -> Test | Untested:
  t = m.trend
  if t is None or t.slope is None or t.interval is None or t.interval.se is None:
    why = "no trend" if t is None else (t.reason or "no bootstrap interval")
    return Untested(f"no trend of the multiplier: {why}",
                    None if t is None or t.slope is None else f"{t.slope:+.3f} per e-fold")
  iv = _interval(t.slope, t.interval.low, t.interval.high, t.interval.se, seeds, t.interval.level)
  eq = stats.tost(iv, band_, report.options.alpha)
  return Test(iv, iv.p_value, eq.p_value, seeds,
              f"the slope of ln multiplier over {m.base} against ln compute, over {t.rungs} "
              "rungs, paired bootstrap over seeds")


def _multiplier(claim: Claim, ms: Sequence[mult.Multiplier], seeds: int, band_: float,
                report: Report) -> Test | Untested:
  tested, left_out = [], []
  m = ms[0]
  for row in (row for m_ in ms for row in m_.rungs):
    iv_ = row.interval
    if row.multiplier is None or iv_ is None or iv_.se is None:
      left_out.append(row)
      continue
    tested.append((row, _interval(math.log(row.multiplier), math.log(iv_.low),
                                  math.log(iv_.high), iv_.se, seeds, iv_.level)))
  if not tested:
    bounds = [f"{r.bound} {r.bound_value:.3g}x" for r in left_out if r.bound is not None]
    return Untested(f"no rung's multiplier over {m.base} is read inside its measured compute",
                    ", ".join(bounds) or None)
  row, iv, p_eq = weakest(claim, tested, band_, report.options.alpha)
  how = (f"ln multiplier over {m.base} at each of {len(tested)} rungs, paired bootstrap over "
         f"seeds; intersection-union over the rungs, resting on C = {row.compute:.3g}")
  if left_out:
    how += (f" ({', '.join(f'{r.compute:.3g}' for r in left_out)} left out: a bound outside "
            "the base's measured compute, or no interval)")
  return Test(iv, iv.p_value, p_eq, seeds, how)


# ------------------------------------------------------------ before a run
def check(record: SweepRecord, claim: Claim, where: str) -> list[AxisRecord]:
  """The axes a ladder claim's variant is named over, known before any run
  (``claim_checks.check_sweep``): the declared ones (ConfigError where the
  sweep has no ladder, or no declared axis to name a variant by)."""
  if claim.metric not in METRICS:
    raise ConfigError(f"{where}: {claim.metric!r} is not a ladder's quantity; a claim on a "
                      f"ladder reads {list(METRICS)}.")
  if record.ladder is None:
    raise ConfigError(f"{where}: {claim.metric} reads a ladder's multiplier; the sweep has "
                      "no ladder (Sweep(ladder=Ladder(rungs=[...], tokens_per_param=[...]))).")
  declared = [a for i, a in enumerate(record.axes) if i not in (RUNG_AXIS, BUDGET_AXIS)]
  if not declared:
    raise ConfigError(f"{where}: {claim.metric} compares a variant with the base; the ladder "
                      "has no declared axis, so no variant.")
  return declared


def names_base(declared: Sequence[AxisRecord], index: int) -> bool:
  """Whether the variant a claim names (``index`` among ``declared``'s
  points) is the base, which has no multiplier over itself."""
  keys = list(itertools.product(*(range(len(a.values)) for a in declared)))
  return keys[index] == tuple(a.reference for a in declared)
