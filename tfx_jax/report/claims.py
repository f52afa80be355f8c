"""Each declared claim's test and label, from the report's numbers alone.

The claims of a sweep (``records.claims.Claim``) are the report's
confirmatory family: each is tested once, on the runs its points' verdicts
read (their confirmation seeds where the sweep has them), and Holm adjusts
over all of them whatever kind of test each needs (a paired difference, an
evaluation effect, a layer profile, a speedup interval). Nothing else in a
report with claims is labelled.

The label rule (``label``), the only place a label is assigned:

  difference claims ("lower", "higher"):
    reproduced      resolved in the expected direction
    not reproduced  resolved against it, or equivalent within the band
    in direction    unresolved, the estimate on the paper's side
    inconclusive    unresolved, the estimate against it
  equivalence claims (``Equivalent(band)``):
    reproduced      equivalent (TOST)
    not reproduced  resolved different, the estimate outside the band
    in direction    neither, the estimate inside the band
    inconclusive    neither, the estimate outside it
  not tested here   an unmet precondition (``requires``), or a quantity with
                    no test (one run per value): the estimate, if any, is
                    shown as descriptive, never labelled

"Resolved" is the Holm-adjusted p of the difference below alpha, over the
family; "equivalent" the Holm-adjusted TOST p below alpha, over the family
(the two kinds of test each adjusted over all the claims, as the report's
comparisons are). A design outside the claim's ``regime`` keeps its label,
marked as outside the paper's regime with both regimes stated.

Everything is read from a ``schema.Report`` (report.json), so a committed
report is relabelled without its runs (``relabel``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Literal, Mapping, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records.claims import Claim, Equivalent, Regime, Requires
from tfx_jax.records.sweep import AxisRecord
from tfx_jax.report import claims_ladder, claims_transfer
from tfx_jax.report import stats, stats_sequential
from tfx_jax.report.claim_test import Test, Untested
from tfx_jax.report.context import DEFAULT_MARGINS
from tfx_jax.report.points import fmt_value, value_label
from tfx_jax.report.schema import Point, Report, SeedResult

Label = Literal["reproduced", "not reproduced", "in direction", "inconclusive",
                "not tested here"]
LABELS: tuple[Label, ...] = ("reproduced", "not reproduced", "in direction", "inconclusive",
                             "not tested here")
TRAINING_SIGNALS = ("output_log_z_first", "output_log_z_last", "output_log_z_min",
                    "output_log_z_max", "max_attention_logit", "max_attention_logit_last")
SPLIT_METRICS = ("loss", "perplexity", "accuracy", "bleu", "chrf", "bpb")
# The equivalence band of a difference claim on a log-ratio quantity
# (a length effect, a layer profile, a speedup): 1% either way.
LOG_BAND = math.log(1.01)


@dataclasses.dataclass(frozen=True)
class ClaimResult:
  """A claim's test and label (report.json's ``claims``)."""
  id: str
  source: str
  statement: str
  metric: str
  expect: str            # "lower", "higher", "equivalent within +-0.01"
  point_a: str           # the points' labels ("alibi"; "d_model=128, qk_norm=none")
  point_b: str | None    # None: against the quantity's reference (flat, 1x)
  label: Label
  reason: str            # why the label (the rule's words, or why not tested)
  estimate: float | None  # point_a - point_b in the metric's units (log ratios: ln)
  low: float | None
  high: float | None
  level: float | None
  band: float
  seeds: int             # pairs (or runs) the test read
  p: float | None        # the difference's p (sequential where seeds were added)
  p_adjusted: float | None   # Holm over the family
  p_equivalence: float | None
  p_equivalence_adjusted: float | None
  family: int            # claims tested in the family
  design: str            # the design in one line, naming the family
  outside_regime: str | None = None  # both regimes, where the design is outside the paper's
  descriptive: str | None = None     # an untested quantity's estimate, in words

  @property
  def counts(self) -> bool:
    """Whether a summary counts this label for or against the paper."""
    return self.outside_regime is None and self.label != "not tested here"


# ------------------------------------------------------------------ points
def point_label(point: Point) -> str:
  return ", ".join(point.values.values()) or "-"


def _matches(values: Mapping[str, str], field: str, value: Any) -> bool | None:
  """Whether a point with axis values ``values`` has ``field`` at ``value``;
  None where no axis sets ``field``."""
  for axis, label in values.items():
    fields = axis.split("+")
    if axis == field and isinstance(value, str) and label == value:
      return True
    if field not in fields and axis != field:
      continue
    wanted = fmt_value(value)
    if len(fields) == 1 and label == wanted:
      return True
    return f"{field.split('.')[-1]}={wanted}" in label.split(",")
  return None


def _conditions(spec: Any, context: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
  out = [] if isinstance(spec, str) else list(dict(spec).items())
  return out + [(k, v) for k, v in (context or {}).items() if k not in dict(out)]


def find_point(spec: Any, context: Mapping[str, Any] | None,
               values: Sequence[Mapping[str, str]], where: str) -> int:
  """The index in ``values`` (each point's {axis: value label}) of the one
  point ``spec`` names in ``context`` (ConfigError naming the valid ones)."""
  found = []
  for i, point in enumerate(values):
    ok = not isinstance(spec, str) or spec in point.values()
    for field, value in _conditions(spec, context):
      hit = _matches(point, field, value)
      if hit is None:
        axes = sorted({f for v in values for a in v for f in [a, *a.split("+")]})
        raise ConfigError(f"{where}: no axis of the sweep sets {field!r}; its axes and "
                          f"fields: {axes}.")
      ok = ok and hit
    if ok:
      found.append(i)
  if len(found) != 1:
    labels = sorted({", ".join(v.values()) for v in values})
    named = spec if isinstance(spec, str) else dict(spec)
    raise ConfigError(
        f"{where}: {named!r}{' in context ' + repr(dict(context)) if context else ''} names "
        f"{'no point' if not found else f'{len(found)} points'} of the sweep (a point is a "
        f"value label or {{axis field: value}}, with context fixing the other axes); its "
        f"points: {labels}.")
  return found[0]


def axis_points(axes: Sequence[AxisRecord]) -> list[dict[str, str]]:
  """Every point's {axis label: value label} of a sweep with ``axes``, as
  the report labels them."""
  return [{a.label: value_label(a.values[i], a) for a, i in zip(axes, key)}
          for key in itertools.product(*(range(len(a.values)) for a in axes))]


def is_stale(point: Point) -> bool:
  """The point's confirmation runs ran at other tuned values than its tuning
  stage chooses now (a grid widened or tuning runs added after they started)."""
  return (point.confirmed is not None and point.chosen is not None
          and dict(point.confirmed) != dict(point.chosen))


def _values(tuned: Mapping[str, Any] | None) -> str:
  return ", ".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in (tuned or {}).items())


# ------------------------------------------------------------------ values
def band_of(claim: Claim, report: Report | None = None) -> float:
  """The claim's equivalence band: its own, else 1% for a log ratio, else the
  metric kind's default margin (0.01 nats of loss, 0.5 BLEU); a shift of the
  optimum's, the sweep's transfer band (``claims_transfer.band``)."""
  if claims_transfer.reads_variant(claim.metric):
    return claims_transfer.band(claim, report)
  if claims_ladder.handles(claim.metric):
    return claims_ladder.band(claim, LOG_BAND)
  if isinstance(claim.expect, Equivalent):
    return float(claim.expect.band)
  if log_ratio(claim.metric):
    return LOG_BAND
  return next((m for word, m in DEFAULT_MARGINS if word in claim.metric), 0.01)


def length_keys(metric: str) -> list[str]:
  """The lengths a length metric reads: ``ppl@8x/1x`` -> [ppl@8x, ppl@1x]."""
  first, *rest = metric.split("/")
  return [first, *(r if r.startswith("ppl@") else f"ppl@{r}" for r in rest)]


def log_ratio(metric: str) -> bool:
  return ("/" in metric and metric.startswith("ppl@")) or metric.startswith(
      ("layer_profile/", "speedup", claims_ladder.MULTIPLIER))


def seed_value(seed: SeedResult, metric: str, split: str) -> float | None:
  """The run's value of a per-run metric (None: it did not log it)."""
  if metric.startswith("training/"):
    return seed.training.get(metric.split("/", 1)[1])
  if metric.startswith("ppl@"):
    values = [seed.lengths.get(p) for p in length_keys(metric)]
    if any(v is None or not v > 0 for v in values):
      return None
    return values[0] if len(values) == 1 else math.log(values[0]) - math.log(values[1])
  return seed.on(split).get(metric)


def verdict_seeds(report: Report, point: Point) -> dict[int, SeedResult]:
  """{seed: run} of the runs a point's verdicts read (finished or not)."""
  if report.verdict_runs == "confirmation":
    return dict(point.confirmation)
  row = next((r for r in point.tuned if r.label == point.chosen_label), None)
  if row is None:
    return {}
  return {s: r for s, r in row.seeds.items() if s != report.reserved_seed}


def all_runs(point: Point) -> list[SeedResult]:
  return [*(s for row in point.tuned for s in row.seeds.values()),
          *point.confirmation.values()]


def per_seed(report: Report, point: Point, metric: str) -> dict[int, float]:
  """{seed: value}: the learned runs for a split metric, every finished run
  for what training logged (a run that ran away is the point there)."""
  out = {}
  for seed, run in verdict_seeds(report, point).items():
    keep = run.outcome is not None if metric.startswith("training/") else (
        run.outcome == "learned")
    value = seed_value(run, metric, report.report_split) if keep else None
    if value is not None and math.isfinite(value):
      out[seed] = value
  return out


# ------------------------------------------------------------------- tests
def _share(report: Report, n: int) -> float:
  """The alpha share of a look with ``n`` seeds (1: fixed seeds)."""
  if report.sequential is None:
    return 1.0
  design = report.sequential.design
  look = n - design.first + 1
  return design.share(look) if look >= 1 else 0.0


def _tested(report: Report, iv: stats.Interval, band: float, how: str) -> Test:
  share = _share(report, iv.n_a) if iv.method == "paired" else 1.0
  eq = stats.tost(iv, band, report.options.alpha)
  return Test(iv, stats_sequential.sequential_p(iv.p_value, share),
              stats_sequential.sequential_p(eq.p_value, share), iv.n_a, how)


def _paired(report: Report, a: Mapping[int, float], b: Mapping[int, float], band: float,
            how: str) -> Test | Untested:
  if len(a) < 2 or len(b) < 2:
    return Untested(f"fewer than 2 runs a side ({len(a)} and {len(b)})",
                    _describe(a, b))
  share = _share(report, len(set(a) & set(b)))
  level = 1.0 - report.options.alpha * share if share < 1.0 else 0.95
  iv = stats.compare(a, b, level)
  return _tested(report, iv, band, how)


def _describe(a: Mapping[int, float], b: Mapping[int, float] | None) -> str | None:
  def mean(v):
    return sum(v.values()) / len(v) if v else None
  if not a:
    return None
  text = f"{mean(a):.4g} ({len(a)} run{'s' * (len(a) != 1)})"
  if b is not None and b:
    text += f" against {mean(b):.4g} ({len(b)} run{'s' * (len(b) != 1)})"
  return text


def test_claim(claim: Claim, report: Report, a: Point, b: Point | None) -> Test | Untested:
  """The claim's estimate and raw tests, or why it has none."""
  band, metric = band_of(claim, report), claim.metric
  if claims_transfer.handles(metric):
    return claims_transfer.test(claim, report, a, b, band)
  if claims_ladder.handles(metric):
    return claims_ladder.test(claim, report, a, band)
  if metric.startswith("evaluation/"):
    _, how, length = metric.split("/")
    found = next((e for e in report.evaluation_effects
                  if e.key == a.key and e.evaluation == how and e.metric == length), None)
    if found is None or not found.interval.known:
      return Untested(f"no {how} evaluation of {point_label(a)} at {length} with 2 seeds")
    return _tested(report, found.interval, band,
                   f"{how} against as trained, the same models paired by seed")
  if metric.startswith("layer_profile/"):
    # The statistic may hold a slash (``init_grad_norm/ffn_out``); the stack is last.
    statistic, stack = metric.removeprefix("layer_profile/").rsplit("/", 1)
    found = next((p for p in report.layer_profiles if p.key == a.key
                  and p.statistic == statistic and p.stack == stack), None)
    if found is None or not found.interval.known:
      return Untested(f"no {statistic} profile of the {stack} at {point_label(a)} with 2 seeds")
    return _tested(report, found.interval, band,
                   "ln(last layer / first), paired by seed")
  if metric == "speedup":
    return _speedup(report, a, b, band)
  if metric == "sensitivity":
    return _sensitivity(report, a, b, band)
  va, vb = per_seed(report, a, metric), per_seed(report, b, metric)
  return _paired(report, va, vb, band,
                 "paired by seed" if set(va) == set(vb) else "unpaired (Welch)")


def _speedup_of(report: Report, point: Point) -> tuple[float, float, int] | Untested:
  """(ln speedup, its standard error, seeds) of a point, or why there is none."""
  found = next((s for s in report.speedups if s.point == point.values), None)
  if found is None:
    return Untested(f"no effective speedup of {point_label(point)} (no reference runs)")
  if found.speedup is None or found.interval is None or found.interval.se_log is None:
    bound = (f" ({found.bound} {found.bound_value:.3g}x)"
             if found.bound_value is not None else "")
    return Untested("the speedup lies beyond the reference runs' range: a bound, not an "
                    f"estimate{bound}")
  if found.interval.n < 2:
    return Untested("one seed: no interval", f"{found.speedup:.3g}x")
  return math.log(found.speedup), found.interval.se_log, found.interval.n


def _speedup(report: Report, a: Point, b: Point | None, band: float) -> Test | Untested:
  """ln speedup against 0 (1x), or a's against b's (Welch over the two
  standard errors, each with its seeds - 1 degrees of freedom)."""
  sa = _speedup_of(report, a)
  if isinstance(sa, Untested):
    return sa
  diff, se, n = sa
  df, how = float(n - 1), "ln effective speedup over AdamW"
  if b is not None:
    sb = _speedup_of(report, b)
    if isinstance(sb, Untested):
      return sb
    diff, va, vb = diff - sb[0], se * se, sb[1] * sb[1]
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (n - 1) + vb * vb / (sb[2] - 1)) if va + vb else float(
        n + sb[2] - 2)
    how = "ln effective speedups over AdamW, Welch"
  if se > 0:
    p = 2.0 * stats.t_sf(abs(diff / se), df)
    half = stats.t_quantile(0.975, df) * se
  else:
    p, half = (0.0 if diff else 1.0), 0.0
  interval = stats.Interval(diff, diff - half, diff + half, df, se, p,
                            "paired" if b is None else "welch", n, n, 0.95)
  return _tested(report, interval, band, how)


def _sensitivity(report: Report, a: Point, b: Point | None, band: float) -> Test | Untested:
  rows = {s.key: s for s in report.sensitivity}
  sa, sb = rows.get(a.key), rows.get(b.key) if b is not None else None
  if sa is None or (b is not None and sb is None):
    return Untested("no learning-rate curve for these points")
  def per_seed_sensitivity(row):
    seeds = set.intersection(*(set(c.seeds) for c in row.curve)) if row.curve else set()
    if row.initial_loss is None:
      return {}
    out = {}
    for seed in seeds:
      out[seed] = stats.lr_sensitivity({c.label: [c.seeds[seed]] for c in row.curve},
                                       row.initial_loss)
    return out
  va = per_seed_sensitivity(sa)
  vb = per_seed_sensitivity(sb) if sb is not None else {}
  described = (f"{sa.sensitivity:.3g}" if sa.sensitivity is not None else "-") + (
      f" against {sb.sensitivity:.3g}" if sb is not None and sb.sensitivity is not None else "")
  if len(va) < 2 or (sb is not None and len(vb) < 2):
    return Untested("one run per rate: a sensitivity needs at least 2 seeds per rate to be "
                    "tested", f"sensitivity {described}")
  return _paired(report, va, vb, band, "per-seed sensitivity, paired by seed")


# ------------------------------------------------------------ requirements
def requirement_met(req: Requires, point: Point, split: str) -> bool:
  if req.converged:
    return point.trend is not None and point.trend.still_improving is False
  for run in all_runs(point):
    value = seed_value(run, req.metric, split)
    if value is None:
      continue
    if (req.above is not None and value > req.above) or (
        req.below is not None and value < req.below):
      return True
  return False


def outside_regime(regime: Regime | None, points: Sequence[Point],
                   tokens: Mapping[tuple[int, ...], float] | None = None) -> str | None:
  """Both regimes in words, where the design lies outside the paper's (None: inside)."""
  if regime is None:
    return None
  outside, here = [], []
  params = [p.num_params for p in points if p.num_params]
  if regime.params is not None and params:
    lo, hi = regime.params
    here.append(f"{_count(min(params))}-{_count(max(params))} parameters"
                if min(params) != max(params) else f"{_count(params[0])} parameters")
    if min(params) < lo or max(params) > hi:
      outside.append(f"{_count(lo)}-{_count(hi)} parameters")
  if regime.tokens_per_param is not None and tokens and params:
    ratios = [tokens[p.key] / p.num_params for p in points
              if p.key in tokens and p.num_params]
    if ratios:
      lo, hi = regime.tokens_per_param
      here.append(f"{min(ratios):.3g}-{max(ratios):.3g} tokens per parameter")
      if min(ratios) < lo or max(ratios) > hi:
        outside.append(f"{lo:g}-{hi:g} tokens per parameter")
  if regime.converged:
    improving = [p for p in points if p.trend is not None and p.trend.still_improving]
    if improving:
      outside.append("training to convergence")
      here.append(f"{', '.join(point_label(p) for p in improving)} still improving at the end")
  if not outside:
    return None
  paper = regime.text or "; ".join(outside)
  return f"outside the paper's regime: the paper {paper}; here {'; '.join(here)}"


def _count(n: float) -> str:
  for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
    if n >= size:
      return f"{n / size:.3g}{unit}"
  return f"{n:.3g}"


# -------------------------------------------------------------------- rule
def label(expect: Any, estimate: float, resolved: bool, equivalent: bool, band: float
          ) -> tuple[Label, str]:
  """The label of a tested claim and the rule's reason (see the module docstring)."""
  if isinstance(expect, Equivalent):
    inside = abs(estimate) <= band
    if equivalent:
      return "reproduced", f"equivalent within +-{band:g}"
    if resolved and not inside:
      return "not reproduced", f"resolved different, outside +-{band:g}"
    return (("in direction", f"unresolved, the estimate inside +-{band:g}") if inside
            else ("inconclusive", f"unresolved, the estimate outside +-{band:g}"))
  on_side = estimate < 0 if expect == "lower" else estimate > 0
  if resolved:
    return (("reproduced", f"resolved {expect}") if on_side
            else ("not reproduced", f"resolved against: {'higher' if expect == 'lower' else 'lower'}"))
  if equivalent:
    return "not reproduced", f"equivalent within +-{band:g}"
  return (("in direction", f"unresolved, the estimate {expect}") if on_side
          else ("inconclusive", "unresolved, the estimate against the paper"))


def expect_text(claim: Claim) -> str:
  """"lower", "higher", "equivalent within +-0.01" (a log ratio's band as a
  factor: "equivalent within 1.4x either way")."""
  if isinstance(claim.expect, Equivalent):
    if log_ratio(claim.metric):
      return f"equivalent within {math.exp(claim.expect.band):.3g}x either way"
    return f"equivalent within +-{claim.expect.band:g}"
  return claim.expect


def evaluate(claims: Sequence[Claim], report: Report,
             tokens: Mapping[tuple[int, ...], float] | None = None) -> tuple[ClaimResult, ...]:
  """Every claim's test and label, Holm over the family (see the module docstring)."""
  values = [p.values for p in report.points]
  prepared = []
  for claim in claims:
    where = f"claim {claim.id!r}"
    if claims_transfer.reads_variant(claim.metric):  # a variant: its points at every size
      found = claims_transfer.records(claim, report, where)
      t = found[find_point(claim.compare[0], claim.context, [r.variant for r in found], where)]
      (a, points), b = claims_transfer.variant(t, report), None
    elif claims_ladder.handles(claim.metric):  # a variant: its points at every rung
      found = claims_ladder.variants(report, where)
      if not found:  # no curves yet (the tuning stage's report): nothing to read
        a, b, points = claims_ladder.named(claim, report), None, []
        prepared.append((claim, a, b, points, Untested(
            f"the ladder has no curves yet: {report.ladder.note or 'no variant was measured'}")))
        continue
      v = found[find_point(claim.compare[0], claim.context, [f.values for f in found], where)]
      (a, points), b = claims_ladder.variant(v, report), None
    else:
      a = report.points[find_point(claim.compare[0], claim.context, values, where)]
      b = (None if claim.compare[1] is None else
           report.points[find_point(claim.compare[1], claim.context, values, where)])
      points = [a] if b is None else [a, b]
    result: Test | Untested
    stale = [p for p in points if is_stale(p)]
    if stale:
      p = stale[0]
      result = Untested(f"{point_label(p)}'s confirmation is stale: it ran at "
                        f"{_values(p.confirmed)}, and the tuning stage now chooses "
                        f"{_values(p.chosen)}")
    elif claim.requires is not None and not requirement_met(
        claim.requires, report.points[find_point(claim.requires.point, claim.context, values,
                                                  where)], report.report_split):
      result = test_claim(claim, report, a, b)
      descriptive = None
      if isinstance(result, Test):
        descriptive = _estimate_text(claim, result.interval)
      result = Untested(f"the design needs that {claim.requires.text}, which its runs do "
                        "not show",
                        descriptive or getattr(result, "descriptive", None))
    else:
      result = test_claim(claim, report, a, b)
    prepared.append((claim, a, b, points, result))
  tested = [r if isinstance(r, Test) else None for *_, r in prepared]
  adjusted = stats.holm([None if t is None else t.p for t in tested])
  adjusted_eq = stats.holm([None if t is None else t.p_equivalence for t in tested])
  family = sum(t is not None and t.p is not None for t in tested)
  alpha = report.options.alpha
  out = []
  for (claim, a, b, points, result), p_adj, eq_adj in zip(prepared, adjusted, adjusted_eq):
    common = dict(id=claim.id, source=claim.source, statement=claim.statement,
                  metric=claim.metric, expect=expect_text(claim), point_a=point_label(a),
                  point_b=None if b is None else point_label(b), band=band_of(claim, report),
                  family=family, outside_regime=outside_regime(claim.regime, points, tokens))
    if isinstance(result, Untested) or result.p is None:
      reason = result.reason if isinstance(result, Untested) else "no test (fewer than 2 seeds)"
      out.append(ClaimResult(
          **common, label="not tested here", reason=reason, estimate=None, low=None,
          high=None, level=None, seeds=0 if isinstance(result, Untested) else result.seeds,
          p=None, p_adjusted=None, p_equivalence=None, p_equivalence_adjusted=None,
          design=f"not in the family of {family} claim{'s' * (family != 1)}",
          descriptive=result.descriptive if isinstance(result, Untested) else None))
      continue
    iv = result.interval
    name, why = label(claim.expect, iv.diff, p_adj is not None and p_adj < alpha,
                      eq_adj is not None and eq_adj < alpha, band_of(claim, report))
    seeds = "confirmation seeds" if report.verdict_runs == "confirmation" else "seeds"
    # The transfer metrics read the validation tuning curves, as their ``how`` says.
    split = "" if claims_transfer.handles(claim.metric) else f", {report.report_split} split"
    design = (f"{result.seeds} {seeds}, {result.how}{split}; Holm over "
              f"the {family} claim{'s' * (family != 1)} of this report")
    if report.sequential is not None:
      design += f"; seeds added sequentially, alpha spent over {report.sequential.design.looks} looks"
    out.append(ClaimResult(
        **common, label=name, reason=why, estimate=iv.diff, low=iv.low, high=iv.high,
        level=iv.level, seeds=result.seeds, p=result.p, p_adjusted=p_adj,
        p_equivalence=result.p_equivalence, p_equivalence_adjusted=eq_adj, design=design))
  return tuple(out)


def _estimate_text(claim: Claim, iv: stats.Interval) -> str:
  """An untested estimate in words (log ratios as factors), rounded once."""
  def number(x: float) -> str:
    return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"
  if log_ratio(claim.metric):
    text = f"{math.exp(iv.diff):.3f}x"
    return text if iv.low is None else (
        f"{text} [{math.exp(iv.low):.3f}, {math.exp(iv.high):.3f}]")
  if iv.low is None:
    return number(iv.diff)
  return f"{number(iv.diff)} [{number(iv.low)}, {number(iv.high)}]"

