"""What a sweep's runs say, as numbers: ``report.json``.

Fair comparisons (Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities"; Marin's ablations):

- **Tuned values chosen per point.** Where the sweep tunes fields (``tune``),
  each point (a combination of axis values) is compared at its own best tuned
  value: the one with the best mean of ``select_by`` on the **validation**
  split, a run that failed at that value counted as the loss at
  initialisation (a value at which some seeds stall is not "best" on the
  strength of the seeds that did not). The comparison then reads a split the
  selection never saw: ``test`` (the runs' ``eval/test-<step>.json``). A dataset with no
  test split: the first seed is reserved for the selection and the other
  seeds are compared (``reserved_seed``).
- **Outcomes.** Every finished run is ``learned``, ``stalled`` (its final
  validation loss is not below the unigram entropy of the training targets,
  the loss of the best model that ignores context, by ``stall_margin``) or
  ``diverged``. Only learned runs enter means and comparisons; the others are
  counted, and count as the loss at initialisation in the choice of a tuned
  value and in the sensitivity.
- **Comparisons.** Per axis and per combination of the other axes (the
  context), each value against the axis's base value, per metric: a paired t
  interval over the seeds both sides have, else Welch's; Holm-Bonferroni over
  every comparison of the report (one family); a verdict ``better``,
  ``worse``, ``equivalent`` (TOST within +-margin) or ``unresolved``. A
  comparison whose side never learned (``failed``) is listed with its counts.
- **Sensitivity.** Per point the loss against each tuned value, and
  E_eta[min(l(eta), l0) - min_eta l(eta)] (l0: the loss at initialisation,
  taken as ln |V|, the loss of the uniform prediction a freshly initialised
  model gives up to its small initial logits).
- **Noise floor and power.** Per axis the base point's seed-to-seed standard
  deviation and the smallest difference its comparisons can detect at 80%
  power with the seeds they have.

Everything here is a pure function of ``collect.collect``'s output and the
dataset baselines (``baselines``), so it is tested on planted run summaries;
``analyze`` returns a ``schema.Report``, whose serialisation is report.json.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

from tfx_jax.report import stats
from tfx_jax.report.points import context_label, contexts, fmt_value, value_label
from tfx_jax.report.schema import (Baseline, Comparison, Counts, CurvePoint,
                                   FailedComparison, Noise, Options, Point, Report,
                                   ScaleEffect, SeedResult, Sensitivity, TunedValue)
from tfx_jax.sweep_record import AxisRecord, RunEntry, Split, SweepRecord

LOWER_IS_BETTER = ("loss", "perplexity", "nll", "ppl")
# Default equivalence margins by metric kind: 0.01 nats of loss, 0.5 BLEU
# (or chrF) points, half a point of accuracy.
DEFAULT_MARGINS = (("bleu", 0.5), ("chrf", 0.5), ("accuracy", 0.005), ("loss", 0.01))
Summaries = Mapping[str, dict[str, Any]]  # {run name: collect.run_summary}


def lower_is_better(metric: str) -> bool:
  return any(word in metric for word in LOWER_IS_BETTER)


def margin_for(metric: str, select_by: str, options: Options) -> float:
  if metric == select_by and options.equivalence_margin is not None:
    return float(options.equivalence_margin)
  for word, margin in DEFAULT_MARGINS:
    if word in metric:
      return margin
  return 0.01


def tuned_key(tuned: Mapping[str, Any]) -> str:
  """A tuned-value combination as a label: ``learning_rate=0.003`` ("" untuned)."""
  return ",".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in tuned.items())


def outcome(summary: dict[str, Any], baseline: Baseline, stall_margin: float
            ) -> stats.Outcome | None:
  """learned / stalled / diverged of a finished run (None: not finished)."""
  if summary["state"] == "diverged":
    return "diverged"
  if summary["state"] != "finished":
    return None
  loss = summary["final"].get("eval/loss")
  if baseline.unigram_entropy is None:  # no threshold known: only divergence counts
    return "learned" if loss is not None and math.isfinite(loss) else "diverged"
  return stats.classify_run(loss, False, baseline.unigram_entropy, stall_margin)


def reserved_seed(record: SweepRecord) -> int | None:
  """The seed that only chooses tuned values: a tuned sweep whose dataset has
  no test split compares the other seeds on validation."""
  if record.tune and record.report_split == "validation" and len(record.seeds) > 1:
    return record.seeds[0]
  return None


# ------------------------------------------------------------------ points
def _point_runs(record: SweepRecord, summaries: Summaries
                ) -> dict[tuple[int, ...], dict[str, tuple[dict, list]]]:
  """{point key: {tuned label: (tuned dict, [(entry, summary)])}} in declaration order."""
  out: dict[tuple[int, ...], dict[str, tuple[dict, list]]] = {}
  for entry in record.runs:
    out.setdefault(record.point_key(entry), {}).setdefault(
        tuned_key(entry.tuned), (entry.tuned, []))[1].append((entry, summaries[entry.name]))
  return out


def _split_values(summary, split: Split) -> dict[str, float]:
  values = summary["final"] if split == "validation" else summary.get("test", {})
  return {k: float(v) for k, v in values.items()
          if k.startswith("eval/") and v is not None and math.isfinite(v)}


def _selection_score(learned: list[float], failed: int, l0: float | None,
                     select_by: str) -> tuple[float, ...] | None:
  """What a tuned value is chosen by, lowest first; None: no run learned.

  A failed run (stalled or diverged) counts against its tuned value: for a
  loss with a known l0, as l0 in the mean (as in the sensitivity), so a rate
  at which half the seeds fail loses to one at which every seed learns unless
  the learned runs are better by more than the failures cost; otherwise the
  fewest failures first, then the best mean of the learned runs.
  """
  if not learned:
    return None
  mean = stats.mean_std(learned)[0]
  if lower_is_better(select_by) and l0 is not None:
    return ((sum(min(v, l0) for v in learned) + failed * l0) / (len(learned) + failed),)
  return (float(failed), mean if lower_is_better(select_by) else -mean)


def grid_edges(tune: Mapping[str, Sequence[Any]], tuned: Mapping[str, Any]) -> dict[str, str]:
  """{field: "lowest" | "highest"} for each tuned field whose chosen value is
  the end of its numeric grid (``tune``): the best value may lie beyond what
  was tried."""
  out = {}
  for field, value in tuned.items():
    grid = tune.get(field, ())
    if (len(grid) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                              for v in grid)):
      if value == min(grid):
        out[field] = "lowest"
      elif value == max(grid):
        out[field] = "highest"
  return out


def _seed_result(entry: RunEntry, summary, baseline: Baseline, split: Split,
                 options: Options) -> SeedResult:
  return SeedResult(
      run=entry.name, outcome=outcome(summary, baseline, options.stall_margin),
      validation=_split_values(summary, "validation"),
      test=None if split == "validation" else _split_values(summary, split),
      # Length extrapolation (evaluate --lengths), perplexity at k x the length.
      lengths={f"ppl@{k}x": float(v) for k, v in summary.get("lengths", {}).items()
               if v is not None and math.isfinite(v)},
      num_params=summary.get("num_params"))


def analyze_points(record: SweepRecord, summaries: Summaries,
                   baselines: Mapping[str, Baseline], options: Options) -> list[Point]:
  """Each point: its runs per tuned value with outcomes and metrics, its chosen
  tuned value, and the per-seed metrics it is compared on."""
  select_by, split = record.select_by, record.report_split
  reserved = reserved_seed(record)
  declared = set(record.seeds)
  points = []
  for key, by_tuned in _point_runs(record, summaries).items():
    tuned_rows = []
    for label, (tuned, runs) in by_tuned.items():
      seeds = {entry.seed: _seed_result(entry, summary, baselines[entry.name], split, options)
               for entry, summary in runs}
      # The declared seeds only (every tuned value has them; seeds added by
      # --until-resolved run at the chosen value alone).
      choosing = [s for seed, s in seeds.items()
                  if seed in declared and (reserved is None or seed == reserved)]
      selection = [s.validation[select_by] for s in choosing
                   if s.outcome == "learned" and select_by in s.validation]
      failed = sum(s.outcome in ("stalled", "diverged") for s in choosing)
      l0 = baselines[runs[0][0].name].initial_loss
      tuned_rows.append(TunedValue(
          tuned=tuned, label=label, seeds=seeds,
          counts=Counts.of(s.outcome for s in seeds.values()),
          selection_mean=stats.mean_std(selection)[0] if selection else None,
          selection_failed=failed,
          selection_score=_selection_score(selection, failed, l0, select_by)))
    candidates = [r for r in tuned_rows if r.selection_score is not None]
    chosen = min(candidates, key=lambda r: r.selection_score) if candidates else None
    compared = {}
    if chosen is not None:
      for seed, s in chosen.seeds.items():
        if s.outcome == "learned" and seed != reserved:
          compared[seed] = {**s.on(split), **s.lengths}
    params = [s.num_params for r in tuned_rows for s in r.seeds.values() if s.num_params]
    points.append(Point(
        key=key,
        values={a.label: value_label(a.values[i], a) for a, i in zip(record.axes, key)},
        chosen=None if chosen is None else chosen.tuned,
        chosen_label=None if chosen is None else chosen.label,
        chosen_at_edge={} if chosen is None else grid_edges(record.tune, chosen.tuned),
        tuned=tuple(tuned_rows),
        counts=sum((r.counts for r in tuned_rows), Counts()),
        runs=sum(len(r.seeds) for r in tuned_rows),
        compared=compared,
        num_params=params[0] if params else None))
  return points


# ------------------------------------------------------------- comparisons
def _by_key(points: Sequence[Point]) -> dict[tuple[int, ...], Point]:
  return {p.key: p for p in points}


def compared_metrics(points: Sequence[Point], select_by: str) -> list[str]:
  names = {m for p in points for values in p.compared.values() for m in values}
  names.discard("eval/perplexity")  # a function of eval/loss
  return sorted(names, key=lambda m: (m != select_by, m.startswith("ppl@"),
                                      int(m[4:-1]) if m.startswith("ppl@") else 0, m))


def _at(ctx: Sequence[int | None], axis_index: int, value_index: int) -> tuple[int, ...]:
  """The point key of ``value_index`` of axis ``axis_index`` in context ``ctx``."""
  return tuple(value_index if j == axis_index else c for j, c in enumerate(ctx))


def _against_base(record: SweepRecord, points: Sequence[Point]
                  ) -> Iterator[tuple[int, AxisRecord, tuple, int, Point, Point]]:
  """(axis index, axis, context, value index, point, base point) for every
  value of every axis against the axis's base value, in each context."""
  by_key = _by_key(points)
  for ai, axis in enumerate(record.axes):
    if len(axis.values) < 2:
      continue
    for ctx in contexts(record.axes, ai):
      base = by_key.get(_at(ctx, ai, axis.reference))
      for vi in range(len(axis.values)):
        point = by_key.get(_at(ctx, ai, vi))
        if vi != axis.reference and point is not None and base is not None:
          yield ai, axis, ctx, vi, point, base


def comparisons(record: SweepRecord, points: Sequence[Point], options: Options
                ) -> list[Comparison]:
  """Every (axis, context, value, metric) against the axis's base value, with
  Holm-adjusted p-values over the whole report and a verdict each."""
  metrics = compared_metrics(points, record.select_by)
  untested = []  # every comparison with its interval, before the family's test
  for ai, axis, ctx, vi, point, base in _against_base(record, points):
    for metric in metrics:
      a = {s: v[metric] for s, v in point.compared.items() if metric in v}
      b = {s: v[metric] for s, v in base.compared.items() if metric in v}
      if not a or not b:
        continue
      untested.append(Comparison(
          axis=axis.label, axis_index=ai, value=value_label(axis.values[vi], axis),
          value_index=vi, base_value=value_label(axis.values[axis.reference], axis),
          context=context_label(record.axes, ctx, ai), context_key=tuple(ctx),
          metric=metric, split=record.report_split, seeds=tuple(sorted(a)),
          base_seeds=tuple(sorted(b)), interval=stats.compare(a, b),
          margin=margin_for(metric, record.select_by, options),
          chosen=point.chosen_label, base_chosen=base.chosen_label,
          counts=point.counts, base_counts=base.counts,
          p_adjusted=None, verdict="unresolved", seeds_needed=None, text=""))
  adjusted = stats.holm([r.interval.p_value for r in untested])  # None: not testable
  rows = []
  for row, p_adj in zip(untested, adjusted):
    iv = row.interval
    verdict = stats.verdict(iv, p_adj, row.margin, options.alpha,
                            lower_is_better(row.metric))
    row = dataclasses.replace(
        row, p_adjusted=p_adj, verdict=verdict,
        seeds_needed=(seeds_to_resolve(iv, options.alpha / len(untested), options.power)
                      if verdict == "unresolved" else None))
    rows.append(dataclasses.replace(row, text=verdict_text(record, row)))
  return rows


def failed_comparisons(record: SweepRecord, points: Sequence[Point]
                       ) -> list[FailedComparison]:
  """The comparisons that ``comparisons`` cannot make because a side has no
  learned run (every run stalled or diverged, at every tuned value): a
  failure is a result, so each is listed with its counts instead of dropped."""
  out = []
  for ai, axis, ctx, vi, point, base in _against_base(record, points):
    if point.compared and base.compared:
      continue
    if not point.counts.finished or not base.counts.finished:
      continue  # a side with no finished run: nothing to say yet
    row = FailedComparison(
        axis=axis.label, value=value_label(axis.values[vi], axis),
        base_value=value_label(axis.values[axis.reference], axis),
        context=context_label(record.axes, ctx, ai), counts=point.counts,
        base_counts=base.counts, runs=point.runs, base_runs=base.runs,
        verdict=("both failed" if not point.compared and not base.compared
                 else "failed" if not point.compared else "base failed"), text="")
    out.append(dataclasses.replace(row, text=failed_text(record, row)))
  return out


def failed_text(record: SweepRecord, row: FailedComparison) -> str:
  """"post vs pre (num_layers=24): failed: post never learned (6 stalled of 6
  runs, at every learning rate); pre learned in 6 of 6"."""
  def side(name: str, counts: Counts, runs: int) -> str:
    if counts.learned:
      return f"{name} learned in {counts.learned} of {runs}"
    failed = ", ".join(f"{getattr(counts, o)} {o}" for o in ("stalled", "diverged")
                       if getattr(counts, o))
    every = ""
    if record.tune:
      fields = ", ".join(f.split(".")[-1].replace("_", " ") for f in record.tune)
      every = f", at every {fields}"
    return f"{name} never learned ({failed} of {runs} runs{every})"
  where = f" ({row.context})" if row.context != "-" else ""
  first, second = ((row.value, row.counts, row.runs),
                   (row.base_value, row.base_counts, row.base_runs))
  if row.verdict == "base failed":
    first, second = second, first
  return (f"{row.value} vs {row.base_value}{where}: {row.verdict}: "
          f"{side(*first)}; {side(*second)}")


def seeds_to_resolve(iv: stats.Interval, alpha: float, power: float) -> int | None:
  """Seeds (pairs, or per side) at which a true difference of the size seen
  would be detected with ``power``, given the seed-to-seed spread seen: a
  planning figure. ``alpha`` is the family's divided by its size (Bonferroni,
  which Holm never rejects less often than). None when not known or above 64."""
  if iv.se is None or not iv.se or iv.diff == 0.0:
    return None
  paired = iv.method == "paired"
  sd = iv.se * (iv.n_a ** 0.5 if paired else (1 / iv.n_a + 1 / iv.n_b) ** -0.5)
  return stats.seeds_needed(iv.diff, sd, paired, alpha, power)


def verdict_text(record: SweepRecord, row: Comparison) -> str:
  """"swiglu vs gelu: better by 0.039 nats [0.012, 0.066], 5 seeds paired, ..."."""
  iv = row.interval
  unit = " nats" if "loss" in row.metric else ""
  size = abs(iv.diff)
  if iv.low is not None:
    bounds = f" [{iv.low:+.3f}, {iv.high:+.3f}]"
  else:
    bounds = " (no interval: fewer than two seeds)"
  how = (f"{iv.n_a} seeds paired" if iv.method == "paired"
         else f"{iv.n_a} vs {iv.n_b} seeds, unpaired (Welch)")
  tuned = ""
  if record.tune:
    fields = ", ".join(f.split(".")[-1].replace("_", " ") for f in record.tune)
    tuned = f", {fields} tuned per point"
  where = f" ({row.context})" if row.context != "-" else ""
  metric = "" if row.metric == record.select_by else f" {row.metric}"
  verdict = row.verdict
  if verdict in ("better", "worse"):
    head = f"{verdict} by {size:.3f}{unit}"
  elif verdict == "equivalent":
    head = f"equivalent within ±{row.margin:g}{unit} (difference {iv.diff:+.3f})"
  else:
    head = f"unresolved (difference {iv.diff:+.3f}{unit})"
  p = "-" if row.p_adjusted is None else f"{row.p_adjusted:.3g}"
  need = ""
  if verdict == "unresolved" and row.seeds_needed:
    need = (f"; about {row.seeds_needed} seeds"
            f"{' paired' if iv.method == 'paired' else ' per side'} would detect a "
            "difference of this size")
  elif verdict == "unresolved" and iv.se:
    need = "; more than 64 seeds would be needed to detect a difference of this size"
  return (f"{row.value} vs {row.base_value}{where}{metric}: {head}{bounds}, {how}"
          f"{tuned}; adjusted p = {p}{need}")


# ------------------------------------------------------ sensitivity, noise
def sensitivity(record: SweepRecord, points: Sequence[Point],
                baselines_by_point: Mapping[tuple[int, ...], Baseline]) -> list[Sensitivity]:
  """Per point: the selection metric at every tuned value (each seed, the
  mean of learned runs, failures) and the LR sensitivity number."""
  select_by = record.select_by
  out = []
  if not record.tune:
    return out
  for point in points:
    l0 = baselines_by_point[point.key].initial_loss
    curve = []
    for row in point.tuned:
      seeds = {seed: (s.validation.get(select_by) if s.outcome == "learned" else None)
               for seed, s in row.seeds.items() if s.outcome is not None}
      learned = [v for v in seeds.values() if v is not None]
      mean = stats.mean_std(learned)[0] if learned else None
      failed = sum(v is None for v in seeds.values())
      curve.append(CurvePoint(tuned=row.tuned, label=row.label, seeds=seeds, mean=mean,
                              failed=failed))
    number, all_failed = None, False
    means = {c.label: c.mean for c in curve if c.seeds}
    if l0 is not None and lower_is_better(select_by) and means:
      # A tuned value whose finished runs all failed counts as l0 (mean None).
      all_failed = not any(m is not None and m < l0 for m in means.values())
      number = None if all_failed else stats.lr_sensitivity(means, l0)
    out.append(Sensitivity(point=point.values, key=point.key, curve=tuple(curve),
                           initial_loss=l0, sensitivity=number, all_failed=all_failed))
  return out


def noise_and_power(record: SweepRecord, points: Sequence[Point],
                    rows: Sequence[Comparison], options: Options) -> list[Noise]:
  """Per axis: the base point's seed standard deviation (select_by, report
  split) and the smallest difference detectable at ``options.power``."""
  select_by = record.select_by
  by_key = _by_key(points)
  out = []
  for ai, axis in enumerate(record.axes):
    base_points = [p for k, p in by_key.items() if k[ai] == axis.reference]
    values = [v[select_by] for p in base_points[:1] for v in p.compared.values()
              if select_by in v]
    sd = stats.mean_std(values)[1] if len(values) > 1 else None
    mine = [r for r in rows if r.axis_index == ai and r.metric == select_by]
    paired = [r for r in mine if r.interval.method == "paired" and r.interval.se]
    if paired:
      # The standard deviation of the per-seed differences: se * sqrt(n).
      sds = sorted(r.interval.se * math.sqrt(r.interval.n_a) for r in paired)
      n = min(r.interval.n_a for r in paired)
      mdd = stats.min_detectable_difference(sds[len(sds) // 2], n, True,
                                            options.alpha, options.power)
      method = "paired"
    elif sd is not None and len(values) > 1:
      n = len(values)
      mdd = stats.min_detectable_difference(sd, n, False, options.alpha, options.power)
      method = "welch"
    else:
      n, mdd, method = len(values), None, None
    out.append(Noise(axis=axis.label, metric=select_by,
                     base_value=value_label(axis.values[axis.reference], axis),
                     base_sd=sd, seeds=n, min_detectable_difference=mdd, method=method,
                     power=options.power))
  return out


# An axis whose values change the parameter count by more than this factor
# (in some context) changes the model's size; matched variants (gated FFNs at
# 2/3 width, within 1%) do not.
SIZE_RATIO = 1.1


def size_axes(record: SweepRecord, points: Sequence[Point]) -> list[int]:
  """Axes whose values change the model size (e.g. zipped d_model/num_heads)."""
  by_key = _by_key(points)
  out = []
  for ai, axis in enumerate(record.axes):
    for ctx in contexts(record.axes, ai):
      sizes = [p.num_params for vi in range(len(axis.values))
               if (p := by_key.get(_at(ctx, ai, vi))) and p.num_params]
      if len(sizes) > 1 and max(sizes) >= SIZE_RATIO * min(sizes):
        out.append(ai)
        break
  return out


def scale_effects(record: SweepRecord, points: Sequence[Point], rows: Sequence[Comparison]
                  ) -> list[ScaleEffect]:
  """For a size axis: each other axis's difference from its base (select_by)
  against the parameter count of the context, with its interval."""
  out = []
  for size_ai in size_axes(record, points):
    by_key = _by_key(points)
    for row in rows:
      if row.axis_index == size_ai or row.metric != record.select_by:
        continue
      point = by_key.get(row.key_of(row.value_index))
      if point is None or not point.num_params:
        continue
      iv = row.interval
      out.append(ScaleEffect(size_axis=record.axes[size_ai].label, axis=row.axis,
                             value=row.value, base_value=row.base_value,
                             context=row.context, num_params=point.num_params,
                             diff=iv.diff, low=iv.low, high=iv.high, verdict=row.verdict))
  return out


# ------------------------------------------------------------------- whole
def analyze(record: SweepRecord, summaries: Summaries, baselines: Mapping[str, Baseline],
            options: Options = Options()) -> Report:
  """The report: the points, the comparisons and what they rest on.

  ``baselines`` maps each run name to its dataset's ``Baseline``.
  """
  points = analyze_points(record, summaries, baselines, options)
  rows = comparisons(record, points, options)
  by_point: dict[tuple[int, ...], Baseline] = {}
  for entry in record.runs:
    by_point.setdefault(record.point_key(entry), baselines[entry.name])
  return Report(
      sweep=record.name, select_by=record.select_by, tune=dict(record.tune),
      report_split=record.report_split, reserved_seed=reserved_seed(record),
      options=options, baselines=dict(sorted(baselines.items())),
      points=tuple(points), comparisons=tuple(rows),
      failed=tuple(failed_comparisons(record, points)),
      sensitivity=tuple(sensitivity(record, points, by_point)),
      noise=tuple(noise_and_power(record, points, rows, options)),
      scale=tuple(scale_effects(record, points, rows)))


def unresolved_points(record: SweepRecord, report: Report) -> list[tuple[int, ...]]:
  """The point keys on either side of an unresolved comparison."""
  keys = []
  for row in report.comparisons:
    if row.verdict != "unresolved":
      continue
    for vi in (row.value_index, record.axes[row.axis_index].reference):
      key = row.key_of(vi)
      if key not in keys:
        keys.append(key)
  return keys
