"""The report's section "Effective speedup over AdamW": how many AdamW steps an
optimizer's result is worth. It applies where the sweep sets the optimizer or
the length and ran AdamW at two or more lengths; its rows are report.json's
``speedups`` (``tfx_jax.records.speedup``).

Wen et al. 2025 ("Fantastic Pretraining Optimizers and Where to Find Them",
section 3; Marin's optimizer study) measure an optimizer X by the number of
steps AdamW needs to reach X's final validation loss, divided by X's own
steps: 1.4 means X's run is worth 1.4 times its steps of AdamW. They read it
off AdamW runs each trained to its own length with its own schedule, so every
AdamW loss on the reference curve is a fully decayed endpoint; a point in the
middle of one long AdamW run sits mid-decay, above the loss a run of that
length reaches, and would credit X with a speedup it does not have.

Here, in each context (the values of the axes that set neither
``optim.optimizer`` nor ``train.num_steps``, e.g. the model size):

- **The reference curve.** The AdamW points of the context at two or more
  lengths (``train.num_steps``), each a run of that length whose schedule
  decays over it (a ``constant`` or ``inverse_sqrt`` schedule, or a
  ``decay_steps`` other than the run's length, is flagged: not an endpoint).
  Its loss at S steps between two lengths is interpolated linearly in log S
  (loss falls about linearly in log steps over a factor of two; no power law
  is fitted, and nothing is read outside the lengths run).
- **Steps to reach.** The smallest S on that curve whose loss is at most X's:
  the mean over the paired seeds (the seeds every point involved learned) of
  the final ``select_by`` on the report's compared split, X's and each
  AdamW length's. Speedup = S / X's steps.
- **Outside AdamW's range, a bound.** X's loss below that of the longest
  AdamW run: the speedup is more than longest / X's steps; above that of the
  shortest: at most shortest / X's steps. No extrapolation: a longer (or
  shorter) AdamW run brackets it.
- **Interval: the delta method over seed pairs.** The estimate is a smooth
  function g of the mean losses (X's and the two bracketing AdamW lengths')
  within its segment of the curve, so with per-seed influence values
  psi_s = grad g . (v_s - mean v), v_s seed s's losses, the standard error of
  log speedup is sd(psi) / sqrt(n) (paired: the seed-to-seed covariance of X
  and AdamW enters, as in a paired t interval), and the 95% interval is
  log speedup +- t(0.975, n - 1) se, mapped back to a ratio. An end beyond
  the lengths AdamW ran is reported as a bound there (``low_beyond``,
  ``high_beyond``), not extrapolated. Two seeds or more; with one, no interval.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tfx_jax.records.speedup import LEVEL, Bound, Interval, Speedup
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import Context
from tfx_jax.report.points import value_label
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.sections import selection

REFERENCE = "adamw"
OPTIMIZER, STEPS = "optim.optimizer", "train.num_steps"
# Schedules whose rate never decays to an end: a run with one is no endpoint.
UNDECAYED = ("constant", "inverse_sqrt")


@dataclasses.dataclass(frozen=True)
class Reach:
  """Where a loss meets a reference curve: the steps S* (the bound's end
  where ``bound`` is set) and the segment (i, i + 1) it was interpolated on."""
  steps: float
  bound: Bound | None
  segment: int | None


def steps_to_reach(target: float, steps: Sequence[int], losses: Sequence[float]) -> Reach:
  """The smallest step count S in [steps[0], steps[-1]] at which the curve
  through (log steps, losses) is at most ``target`` (``steps`` increasing)."""
  if losses[0] <= target:
    return Reach(float(steps[0]), "at most", None)
  for i in range(len(steps) - 1):
    a, b = losses[i], losses[i + 1]
    if b <= target:  # a > target >= b: the curve crosses in (steps[i], steps[i + 1]]
      t = (a - target) / (a - b)
      log_s = math.log(steps[i]) + t * (math.log(steps[i + 1]) - math.log(steps[i]))
      return Reach(math.exp(log_s), None, i)
  return Reach(float(steps[-1]), "more than", None)


def delta_interval(x: Sequence[float], a: Sequence[float], b: Sequence[float],
                   steps_a: int, steps_b: int, steps: int, steps_range: tuple[int, int],
                   level: float = LEVEL) -> Interval | None:
  """The delta-method interval of the speedup interpolated between AdamW
  lengths ``steps_a`` < ``steps_b`` (per-seed losses ``a``, ``b``, paired with
  X's ``x``), for X's ``steps``; ends clipped to ``steps_range`` (the
  shortest and longest AdamW lengths) as bounds. None with fewer than 2 seeds."""
  n = len(x)
  if n < 2:
    return None
  mx, ma, mb = (sum(v) / n for v in (x, a, b))
  width = math.log(steps_b) - math.log(steps_a)
  # log S* = log steps_a + width * (ma - mx) / (ma - mb)
  d = ma - mb
  gx, ga, gb = -width / d, width * (mx - mb) / d ** 2, width * (ma - mx) / d ** 2
  psi = [gx * (xs - mx) + ga * (as_ - ma) + gb * (bs - mb) for xs, as_, bs in zip(x, a, b)]
  se = stats.mean_std(psi)[1] / math.sqrt(n)
  log_speedup = (math.log(steps_a) + width * (ma - mx) / d) - math.log(steps)
  half = stats.t_quantile(0.5 + level / 2, n - 1) * se
  lo_steps, hi_steps = (steps * math.exp(log_speedup - half),
                        steps * math.exp(log_speedup + half))
  shortest, longest = steps_range
  return Interval(low=max(lo_steps, shortest) / steps, high=min(hi_steps, longest) / steps,
                  low_beyond=lo_steps < shortest, high_beyond=hi_steps > longest,
                  se_log=se, n=n, level=level)


def _settings(record: SweepRecord, point: Point) -> dict[str, Any]:
  """The point's optimizer, length and schedule fields, as its runs set them."""
  entry = next(e for e in record.runs if record.point_key(e) == point.key)
  return {**record.base_values, **record.overrides, **entry.overrides}


def optimizer_axes(record: SweepRecord) -> list[int]:
  """The axes that set the optimizer or the run's length."""
  return [i for i, a in enumerate(record.axes) if {OPTIMIZER, STEPS} & set(a.fields)]


def _decayed(settings: Mapping[str, Any]) -> bool:
  """Does the run's schedule end decayed at its own last step? Unknown
  settings (the base config's) count as decayed."""
  decay = settings.get("optim.decay_steps", 0)
  return (settings.get("optim.schedule") not in UNDECAYED
          and decay in (0, settings.get(STEPS)))


def speedups(record: SweepRecord, points: Sequence[Point]) -> list[Speedup]:
  """Every non-AdamW point's effective speedup over the AdamW points of its
  context, where the context has AdamW at two or more lengths; [] where the
  sweep sets no optimizer or length (see the module docstring)."""
  opt_axes = optimizer_axes(record)
  if not opt_axes:
    return []
  metric, split = record.select_by, record.report_split
  if not metric.endswith("loss"):
    return []  # steps to reach a loss: lower is better, on a loss
  groups: dict[tuple, list[tuple[Point, dict[str, Any]]]] = {}
  for point in points:
    ctx = tuple(None if i in opt_axes else k for i, k in enumerate(point.key))
    groups.setdefault(ctx, []).append((point, _settings(record, point)))
  out = []
  for ctx, members in groups.items():
    reference = sorted(((s[STEPS], p, s) for p, s in members
                        if s.get(OPTIMIZER) == REFERENCE and STEPS in s),
                       key=lambda r: r[0])
    if len({steps for steps, _, _ in reference}) < 2 or len(reference) != len(
        {steps for steps, _, _ in reference}):
      continue  # no curve: AdamW at one length (or two points at one length)
    context = ", ".join(value_label(a.values[k], a) if len(a.fields) > 1 else
                        f"{a.label.split('.')[-1]}={value_label(a.values[k], a)}"
                        for a, k in zip(record.axes, ctx) if k is not None) or "-"
    for point, settings in members:
      if settings.get(OPTIMIZER) in (REFERENCE, None) or STEPS not in settings:
        continue
      out.append(_speedup(point, settings, reference, context, metric, split))
  return out


def _speedup(point: Point, settings: Mapping[str, Any], reference, context: str,
             metric: str, split: str) -> Speedup:
  """One row: the paired seeds, the mean curve, S*, the interval."""
  steps = int(settings[STEPS])
  ref_steps = tuple(int(s) for s, _, _ in reference)
  not_decayed = tuple(int(s) for s, _, st in reference if not _decayed(st))
  sides = [point] + [p for _, p, _ in reference]
  seeds = sorted(set.intersection(*(
      {seed for seed, v in p.compared.items() if metric in v} for p in sides)))
  row = Speedup(context=context, point=dict(point.values),
                optimizer=str(settings[OPTIMIZER]), steps=steps, metric=metric,
                split=split, seeds=tuple(seeds), loss=None, reference_steps=ref_steps,
                reference_losses=(), reference_steps_to_reach=None, speedup=None,
                not_decayed=not_decayed)
  if not seeds:
    return dataclasses.replace(row, note="no seed learned at this point and at every "
                               "AdamW length")
  x = [point.compared[s][metric] for s in seeds]
  curves = [[p.compared[s][metric] for s in seeds] for _, p, _ in reference]
  loss = sum(x) / len(x)
  ref_losses = tuple(sum(c) / len(c) for c in curves)
  reach = steps_to_reach(loss, ref_steps, ref_losses)
  row = dataclasses.replace(row, loss=loss, reference_losses=ref_losses)
  if reach.bound is not None:
    return dataclasses.replace(row, bound=reach.bound, bound_value=reach.steps / steps)
  i = reach.segment
  interval = delta_interval(x, curves[i], curves[i + 1], ref_steps[i], ref_steps[i + 1],
                            steps, (ref_steps[0], ref_steps[-1]))
  return dataclasses.replace(row, reference_steps_to_reach=reach.steps,
                             speedup=reach.steps / steps, interval=interval)


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``speedups`` (none where the sweep ran no AdamW curve)."""
  return {"speedups": tuple(speedups(ctx.record, selection.points(ctx)))}


# ------------------------------------------------------------------ report.md
def speedup_text(row: Speedup) -> str:
  """``1.31x [1.12, 1.52]``, ``more than 2.00x``, ``at most 0.50x``, or why not known."""
  if row.speedup is not None:
    if row.interval is None:
      return f"{row.speedup:.2f}x (one seed: no interval)"
    iv = row.interval
    low = f"<{iv.low:.2f}" if iv.low_beyond else f"{iv.low:.2f}"
    high = f">{iv.high:.2f}" if iv.high_beyond else f"{iv.high:.2f}"
    return f"{row.speedup:.2f}x [{low}, {high}]"
  if row.bound is not None:
    return f"{row.bound} {row.bound_value:.2f}x"
  return row.note or "not known"


def markdown(ctx: Context | None, report: Report, plots: Mapping[str, str]) -> list[str]:
  """report.md's speedup table and how to read it ([] where there is none)."""
  rows = report.speedups
  if not rows:
    return []
  split, metric = rows[0].split, rows[0].metric
  table = [["context", "optimizer", "steps", f"{metric} ({split})",
            "AdamW lengths (loss)", "AdamW steps to reach", "speedup [95% interval]",
            "paired seeds"]]
  for r in rows:
    curve = ", ".join(f"{s}: {l:.4f}" for s, l in zip(r.reference_steps, r.reference_losses))
    flagged = (f" (not decayed at its end: {', '.join(map(str, r.not_decayed))})"
               if r.not_decayed else "")
    table.append([r.context, r.optimizer, str(r.steps),
                  "-" if r.loss is None else f"{r.loss:.4f}", (curve or "-") + flagged,
                  "-" if r.reference_steps_to_reach is None
                  else f"{r.reference_steps_to_reach:,.0f}", speedup_text(r), str(len(r.seeds))])
  lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
  lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
  return ["## Effective speedup over AdamW", "",
          "Wen et al. 2025: the AdamW steps needed to reach the optimizer's final "
          f"`{metric}` ({split} split, each point at its chosen tuned values, mean over the "
          "seeds every point of the row learned), divided by the optimizer's own steps. "
          "The AdamW curve is its runs at several lengths, each decayed over its own "
          "length, interpolated linearly in log steps between them. The interval is the "
          "delta method over the paired seeds (t with n − 1 degrees of freedom, on log "
          "speedup); an end written `<` or `>` lies beyond the AdamW lengths run and is a "
          "bound, as is a speedup written `more than` (the optimizer beat the longest "
          "AdamW run) or `at most` (it did no better than the shortest): longer or "
          "shorter AdamW runs would bracket it, nothing is extrapolated.", "",
          *lines, ""]
