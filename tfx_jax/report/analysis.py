"""What a sweep's runs say, as numbers: ``report.json``.

Fair comparisons (Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities"; Marin's ablations):

- **Tuned values chosen per point.** Where the sweep tunes fields (``tune``),
  each point (a combination of axis values) is compared at its own best tuned
  value: the one with the best mean of ``select_by`` on the **validation**
  split, each run counted at its own final loss capped at the loss at
  initialisation l0, a run that diverged at l0 (a value at which some seeds
  fail is not "best" on the strength of the seeds that did not). The comparison then reads a split the
  selection never saw: ``test`` (the runs' ``eval/test-<step>.json``). A dataset with no
  test split: the first seed is reserved for the selection and the other
  seeds are compared (``reserved_seed``).
- **Confirmation seeds.** Without them a tuned sweep's verdicts read the
  seeds that chose each point's value, which favours a point whose seeds
  were lucky at some value (selection-biased: ``Report.verdict_runs``
  "tuning"). A sweep with ``confirm`` compares each point's confirmation
  runs only (fresh seeds at the value its tuning stage chose, ``Point.
  confirmation``), on test, or on validation where the dataset has no test
  split (the selection never read those seeds, so no seed is reserved); the
  tuning stage still gives the choice, the tuned-values table, the
  sensitivity and the grid-edge check.
- **Outcomes.** Every finished run is ``learned``, ``stalled`` (its final
  validation loss is not below the unigram entropy of the training targets,
  the loss of the best model that ignores context, by ``stall_margin``) or
  ``diverged``. Only learned runs enter means and comparisons; the others are
  counted, and in the choice of a tuned value and in the sensitivity a
  stalled run counts at its own loss (capped at l0), a diverged one at l0.
- **Comparisons.** Per axis and per combination of the other axes (the
  context), each value against the axis's base value, and each pair the sweep
  declares (``Sweep.comparisons``: a value against another, which plays the
  base), per metric: a paired t
  interval over the seeds both sides have, else Welch's; Holm-Bonferroni over
  every comparison of the report (one family); a verdict ``better``,
  ``worse``, ``equivalent`` (TOST within +-margin) or ``unresolved``. A
  comparison whose side never learned (``failed``) is listed with its counts.
- **Adaptive seeds.** A sweep run with ``--until-resolved MAX_SEEDS`` tests
  each comparison again after every seed added; at a fixed alpha that
  optional stopping would raise the chance of a false verdict well above
  alpha. Its comparisons are tested sequentially instead
  (``sequential_design``, ``stats.SequentialDesign``): each look at its
  share of alpha (Bonferroni over the looks, shares by the power family of
  Kim and DeMets 1987), paired on the seeds both sides learned, Holm over
  the report for the differences and, separately, for the equivalence
  tests; each comparison says its look ("look 3 of 4").
- **Sensitivity** (``tuning``, with the grid-edge check: each point's own
  grid, ``SweepRecord.point_grid``). Per point the loss against each tuned value, and
  E_eta[min(l(eta), l0) - min_eta l(eta)], as Wortsman et al. define it: each
  run at its own final loss capped at l0, a diverged run at l0, l(eta) the
  mean over the rate's runs. l0, the loss at initialisation, is the mean of
  the point's runs' evaluations at step 0 (``eval.at_start``), or, for runs
  that did not evaluate at step 0, ln |V| (the loss of the uniform
  prediction a freshly initialised model gives up to its small initial
  logits; ``initial_loss``).
- **Effective speedup** (``speedup``): where the sweep ran AdamW at several
  lengths beside other optimizers, the AdamW steps each one's result is worth
  per step of its own (Wen et al. 2025), with a paired interval.
- **Still improving?** Per point, whether its validation loss still fell
  between its last two evaluations by more than the seed noise (``trend``).
- **Evaluation noise.** Each evaluation logs its metrics' standard errors
  (``<metric>_se``); they are reported per point beside the seed-to-seed
  spread (``Point.eval_se``, ``Point.seed_sd``), never compared themselves.
- **Noise floor and power.** Per axis the base point's seed-to-seed standard
  deviation and the smallest difference its comparisons can detect at 80%
  power with the seeds they have.
- **Evaluated another way** (``evaluation_effects``): RoPE scaled at
  evaluation only against the same models as trained, paired by seed.
- **Layer profiles** (``layer_profiles``): per point and stack, the per-layer
  statistic the report shows (the gradient norm at initialisation, Xiong et
  al.'s Figure 3) and whether it grows or falls from the first layer to the
  last, paired by seed on the log scale.

Everything here is a pure function of ``collect.collect``'s output and the
dataset baselines (``baselines``), so it is tested on planted run summaries;
``analyze`` returns a ``schema.Report``, whose serialisation is report.json.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

from tfx_jax.report import collect as collect_lib
from tfx_jax.report import compute as compute_lib
from tfx_jax.report import speedup
from tfx_jax.report import stats
from tfx_jax.report.tuning import grid_edges, grid_text, sensitivity
from tfx_jax.report.points import (at_chosen, context_label, contexts, fmt_value,
                                   group_points, value_label)
from tfx_jax.report.schema import (Baseline, Comparison, Counts, EvaluationEffect,
                                   FailedComparison, InitialLossSource, LayerProfile,
                                   Look, Noise,
                                   Options, Point, Report, ScaleEffect, SeedResult,
                                   Sequential, Trend, TunedValue, VerdictRuns,
                                   is_standard_error)
from tfx_jax.records.sweep import AxisRecord, RunEntry, Split, SweepRecord

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
  no test split compares the other seeds on validation (a sweep with
  confirmation seeds compares those, which the selection never read)."""
  if (record.tune and not record.confirm and record.report_split == "validation"
      and len(record.seeds) > 1):
    return record.seeds[0]
  return None


def verdict_runs(record: SweepRecord) -> VerdictRuns:
  """The runs a report's verdicts read (``schema.VerdictRuns``)."""
  if record.confirm:
    return "confirmation"
  if not record.tune:
    return "all"
  return "tuning" if reserved_seed(record) is None else "reserved"


# ------------------------------------------------------------------ points
def _point_runs(record: SweepRecord, summaries: Summaries
                ) -> dict[tuple[int, ...], dict[str, tuple[dict, list]]]:
  """{point key: {tuned label: (tuned dict, [(entry, summary)])}} in declaration
  order: the tuning stage's runs (the confirmation runs are the point's own)."""
  out: dict[tuple[int, ...], dict[str, tuple[dict, list]]] = {}
  for entry in record.runs:
    if entry.stage != "tune":
      continue
    out.setdefault(record.point_key(entry), {}).setdefault(
        tuned_key(entry.tuned), (entry.tuned, []))[1].append((entry, summaries[entry.name]))
  return out


def _split_values(summary, split: Split) -> dict[str, float]:
  values = summary["final"] if split == "validation" else summary.get("test", {})
  return {k: float(v) for k, v in values.items()
          if k.startswith("eval/") and v is not None and math.isfinite(v)}


def _selection_score(runs: Sequence[tuple[stats.Outcome, float | None]], l0: float | None,
                     select_by: str) -> tuple[float, ...] | None:
  """What a tuned value is chosen by, lowest first; None: no run learned.

  ``runs``: each choosing run's outcome and final ``select_by`` (validation).
  For a loss with a known l0, the rule of the sensitivity (Wortsman et al.
  2023): the mean over the runs of min(loss, l0), a stalled run at its own
  loss, a diverged one (or one without the metric) at l0 (``stats.capped_mean``),
  so a rate at which half the seeds fail loses to one at which every seed
  learns unless the learned runs are better by more than the failures cost.
  Otherwise the fewest failures (stalled or diverged) first, then the best
  mean of the learned runs. A value at which no run learned is never chosen:
  there would be nothing to compare at it.
  """
  learned = [v for o, v in runs if o == "learned" and v is not None]
  if not learned:
    return None
  if lower_is_better(select_by) and l0 is not None:
    return (stats.capped_mean([None if o == "diverged" else v for o, v in runs], l0),)
  mean = stats.mean_std(learned)[0]
  failed = sum(o != "learned" for o, _ in runs)
  return (float(failed), mean if lower_is_better(select_by) else -mean)


@dataclasses.dataclass(frozen=True)
class InitialLoss:
  """A point's l0 in ``select_by``'s units, where it comes from, and the
  number of runs whose step-0 evaluations it is the mean of."""
  value: float
  source: InitialLossSource
  runs: int


def initial_loss(summaries: Sequence[dict[str, Any]], select_by: str,
                 uniform: float | None) -> InitialLoss | None:
  """l0 of a point whose runs are ``summaries``: the mean of their ``select_by``
  at step 0 (the evaluation before the first update, ``eval.at_start``;
  the seeds initialise differently, the tuned values do not matter at step 0);
  where no run evaluated at step 0 (runs of earlier versions), ``uniform``,
  the task's loss of the uniform prediction (ln |V|, ln of the classes), which
  is a value of ``eval/loss`` only. None for a metric where higher is better,
  or when neither is known."""
  if not lower_is_better(select_by):
    return None
  measured = [float(s["initial"][select_by]) for s in summaries
              if math.isfinite(s.get("initial", {}).get(select_by, math.nan))]
  if measured:
    return InitialLoss(sum(measured) / len(measured), "step 0", len(measured))
  if select_by == "eval/loss" and uniform is not None:
    return InitialLoss(float(uniform), "uniform", 0)
  return None


def initial_losses(record: SweepRecord, summaries: Summaries,
                   baselines: Mapping[str, Baseline]
                   ) -> dict[tuple[int, ...], InitialLoss | None]:
  """{point key: its ``initial_loss``} over all of the point's runs."""
  runs: dict[tuple[int, ...], list[RunEntry]] = {}
  for entry in record.runs:
    runs.setdefault(record.point_key(entry), []).append(entry)
  return {key: initial_loss([summaries[e.name] for e in entries], record.select_by,
                            baselines[entries[0].name].initial_loss)
          for key, entries in runs.items()}


def _seed_result(entry: RunEntry, summary, baseline: Baseline, split: Split,
                 options: Options) -> SeedResult:
  return SeedResult(
      run=entry.name, outcome=outcome(summary, baseline, options.stall_margin),
      validation=_split_values(summary, "validation"),
      test=None if split == "validation" else _split_values(summary, split),
      # Length extrapolation (evaluate --lengths), perplexity at k x the length.
      lengths={f"ppl@{k}x": float(v) for k, v in summary.get("lengths", {}).items()
               if v is not None and math.isfinite(v)},
      num_params=summary.get("num_params"), training=dict(summary.get("training", {})))


def analyze_points(record: SweepRecord, summaries: Summaries,
                   baselines: Mapping[str, Baseline], options: Options) -> list[Point]:
  """Each point: its runs per tuned value with outcomes and metrics, its chosen
  tuned value, its confirmation runs, and the per-seed metrics it is compared
  on (the learned confirmation runs on a sweep with confirmation seeds, else
  the learned runs at the chosen value)."""
  select_by, split = record.select_by, record.report_split
  reserved = reserved_seed(record)
  declared = set(record.seeds)
  confirmation_runs: dict[tuple[int, ...], list[RunEntry]] = {}
  for entry in record.runs:
    if entry.stage == "confirm":
      confirmation_runs.setdefault(record.point_key(entry), []).append(entry)
  l0s = initial_losses(record, summaries, baselines)
  points = []
  for key, by_tuned in _point_runs(record, summaries).items():
    l0 = None if l0s[key] is None else l0s[key].value
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
      tuned_rows.append(TunedValue(
          tuned=tuned, label=label, seeds=seeds,
          counts=Counts.of(s.outcome for s in seeds.values()),
          selection_mean=stats.mean_std(selection)[0] if selection else None,
          selection_failed=failed,
          selection_score=_selection_score(
              [(s.outcome, s.validation.get(select_by)) for s in choosing
               if s.outcome is not None], l0, select_by)))
    candidates = [r for r in tuned_rows if r.selection_score is not None]
    chosen = min(candidates, key=lambda r: r.selection_score) if candidates else None
    confirming = confirmation_runs.get(key, [])
    confirmation = {e.seed: _seed_result(e, summaries[e.name], baselines[e.name], split,
                                         options) for e in confirming}
    compared = {}
    if record.confirm:
      for seed, s in sorted(confirmation.items()):
        if s.outcome == "learned":
          compared[seed] = {**s.on(split), **s.lengths}
    elif chosen is not None:
      for seed, s in chosen.seeds.items():
        if s.outcome == "learned" and seed != reserved:
          compared[seed] = {**s.on(split), **s.lengths}
    params = [s.num_params for r in tuned_rows for s in r.seeds.values() if s.num_params]
    points.append(Point(
        key=key,
        values={a.label: value_label(a.values[i], a) for a, i in zip(record.axes, key)},
        chosen=None if chosen is None else chosen.tuned,
        chosen_label=None if chosen is None else chosen.label,
        chosen_at_edge=({} if chosen is None
                        else grid_edges(record.point_grid(key), chosen.tuned)),
        tuned=tuple(tuned_rows),
        counts=sum((r.counts for r in tuned_rows), Counts()),
        runs=sum(len(r.seeds) for r in tuned_rows),
        compared=compared,
        num_params=params[0] if params else None,
        confirmed=dict(confirming[0].tuned) if confirming else None,
        confirmation=confirmation))
  return points


# ------------------------------------------------------------- comparisons
def _by_key(points: Sequence[Point]) -> dict[tuple[int, ...], Point]:
  return {p.key: p for p in points}


def compared_metrics(points: Sequence[Point], select_by: str) -> list[str]:
  """The metrics the points are compared on, the selection metric first; a
  metric's evaluation standard error (``<metric>_se``) is reported beside it
  (``Point.eval_se``), not compared."""
  names = {m for p in points for values in p.compared.values() for m in values
           if not is_standard_error(m)}
  names.discard("eval/perplexity")  # a function of eval/loss
  return sorted(names, key=lambda m: (m != select_by, m.startswith("ppl@"),
                                      int(m[4:-1]) if m.startswith("ppl@") else 0, m))


def _at(ctx: Sequence[int | None], axis_index: int, value_index: int) -> tuple[int, ...]:
  """The point key of ``value_index`` of axis ``axis_index`` in context ``ctx``."""
  return tuple(value_index if j == axis_index else c for j, c in enumerate(ctx))


def _against_base(record: SweepRecord, points: Sequence[Point]
                  ) -> Iterator[tuple[int, AxisRecord, tuple, int, int, Point, Point]]:
  """(axis index, axis, context, value index, base index, point, base point)
  for every value of every axis against the axis's base value, then for each
  pair the axis declares (``AxisRecord.comparisons``) its value against its
  base, in each context."""
  by_key = _by_key(points)
  for ai, axis in enumerate(record.axes):
    if len(axis.values) < 2:
      continue
    pairs = [(vi, axis.reference) for vi in range(len(axis.values)) if vi != axis.reference]
    for ctx in contexts(record.axes, ai):
      for vi, bi in [*pairs, *axis.comparisons]:
        point, base = by_key.get(_at(ctx, ai, vi)), by_key.get(_at(ctx, ai, bi))
        if point is not None and base is not None:
          yield ai, axis, ctx, vi, bi, point, base


def comparisons(record: SweepRecord, points: Sequence[Point], options: Options
                ) -> list[Comparison]:
  """Every (axis, context, value, metric) against the axis's base value, and
  every declared pair's (its value against its base), with Holm-adjusted
  p-values over the whole report and a verdict each.

  A sweep with adaptive seeds (``sequential_design``) is tested at its
  current look (``stats.sequential_look``: the seeds both sides learned,
  paired); the Holm adjustment then runs twice, over the differences' and
  over the equivalence tests' sequential p-values, so that neither a false
  better/worse nor a false equivalent verdict anywhere in the report has
  more than alpha chance, whatever look each comparison stopped at.
  Otherwise each comparison is the paired (or Welch) t over the seeds it
  has, and its equivalence test is the unadjusted TOST (``stats.verdict``).
  """
  design = sequential_design(record)
  metrics = compared_metrics(points, record.select_by)
  untested = []  # every comparison with its interval, before the family's test
  looks: list[stats.SequentialLook | None] = []
  for ai, axis, ctx, vi, bi, point, base in _against_base(record, points):
    for metric in metrics:
      a = {s: v[metric] for s, v in point.compared.items() if metric in v}
      b = {s: v[metric] for s, v in base.compared.items() if metric in v}
      if not a or not b:
        continue
      margin = margin_for(metric, record.select_by, options)
      look = (None if design is None else
              _sequential_look(design, look_of(record, point, base), a, b, margin,
                               options.alpha))
      looks.append(look)
      untested.append(Comparison(
          axis=axis.label, axis_index=ai, value=value_label(axis.values[vi], axis),
          value_index=vi, base_index=bi, base_value=value_label(axis.values[bi], axis),
          context=context_label(record.axes, ctx, ai), context_key=tuple(ctx),
          metric=metric, split=record.report_split, seeds=tuple(sorted(a)),
          base_seeds=tuple(sorted(b)),
          interval=stats.compare(a, b) if look is None else look.interval,
          margin=margin, chosen=compared_at(point), base_chosen=compared_at(base),
          counts=_counted(record, point)[0], base_counts=_counted(record, base)[0],
          p_adjusted=None, verdict="unresolved", seeds_needed=None, text=""))
  if design is None:
    adjusted = stats.holm([r.interval.p_value for r in untested])  # None: not testable
    equivalences = [None] * len(untested)  # the verdict's own TOST, unadjusted
  else:
    adjusted = stats.holm([look.p_difference for look in looks])
    equivalences = [
        dataclasses.replace(look.equivalence, p_value=p, alpha=options.alpha,
                            equivalent=p is not None and p < options.alpha)
        for look, p in zip(looks, stats.holm([look.p_equivalence for look in looks]))]
  rows = []
  for row, p_adj, look, eq in zip(untested, adjusted, looks, equivalences):
    iv = row.interval
    verdict = stats.verdict(iv, p_adj, row.margin, options.alpha,
                            lower_is_better(row.metric), equivalence=eq)
    needed = None
    if verdict == "unresolved":
      needed = (seeds_to_resolve(iv, options.alpha / len(untested), options.power)
                if design is None else
                sequential_seeds_to_resolve(iv, design, options.alpha / len(untested),
                                            options.power))
    row = dataclasses.replace(
        row, p_adjusted=p_adj, verdict=verdict, seeds_needed=needed,
        look=None if look is None else Look(look.look, look.looks, look.share,
                                            None if eq is None else eq.p_value))
    rows.append(dataclasses.replace(row, text=verdict_text(record, row),
                                    design=design_line(record, row)))
  return rows


def evaluation_effects(record: SweepRecord, points: Sequence[Point], summaries: Summaries,
                       options: Options) -> list[EvaluationEffect]:
  """Each point's length perplexities with RoPE scaled at evaluation only
  (``evaluate --lengths --rope_scaling``) against the same models' as trained,
  paired by seed over the runs its verdicts read, at each length; p adjusted
  by Holm over these rows alone (two evaluations of the same models are a
  question apart from the comparisons between models)."""
  untested = []
  for point in points:
    verdict_runs = _verdict_runs(record, point)
    runs = {seed: summaries[verdict_runs[seed].run] for seed in point.compared
            if seed in verdict_runs}
    tags = sorted({tag for s in runs.values() for tag in s.get("scaled_lengths", {})})
    for tag in tags:
      multiples = sorted({k for s in runs.values()
                          for k in s.get("scaled_lengths", {}).get(tag, {})})
      for k in multiples:
        metric = f"ppl@{k}x"
        scaled = {seed: float(v) for seed, s in runs.items()
                  if (v := s.get("scaled_lengths", {}).get(tag, {}).get(k)) is not None
                  and math.isfinite(v) and metric in point.compared[seed]}
        if not scaled:
          continue
        trained = {seed: point.compared[seed][metric] for seed in scaled}
        untested.append((point, tag.removeprefix("rope-"), metric, tuple(sorted(scaled)),
                         stats.compare(scaled, trained)))
  adjusted = stats.holm([iv.p_value for *_, iv in untested])
  rows = []
  for (point, how, metric, seeds, iv), p_adj in zip(untested, adjusted):
    margin = margin_for(metric, record.select_by, options)
    rows.append(EvaluationEffect(
        key=point.key, point=", ".join(point.values.values()) or "base config",
        evaluation=how, metric=metric, seeds=seeds, interval=iv, margin=margin,
        p_adjusted=p_adj,
        verdict=stats.verdict(iv, p_adj, margin, options.alpha, lower_is_better(metric))))
  return rows


def layer_profiles(record: SweepRecord, points: Sequence[Point], summaries: Summaries,
                   options: Options) -> list[LayerProfile]:
  """Each point's per-layer statistic, the one the report's per-layer table
  shows (``collect.shown_layer_kind``: the gradient norm at initialisation
  where runs logged it), over the runs that table shows (``points.at_chosen``:
  a tuned point's runs at its chosen value, its confirmation runs where it
  has them), per stack: each layer's mean over seeds with its 95%
  t-interval, and last over first, paired by seed on the log scale; p
  adjusted by Holm over these rows alone (a profile is a question apart from
  the comparisons between points). A run counts where it logged every layer
  of the stack with a positive value. A profile equal on every seed to an
  earlier point's (a measurement the axis between them cannot touch: the
  gradient at initialisation does not depend on the warmup that follows) is
  tested once: it takes that profile's p and trend and names it
  (``same_as``), and Holm counts it once."""
  shown = at_chosen(group_points(record, summaries), {p.key: p.chosen for p in points})
  kind = collect_lib.shown_layer_kind([s for runs in shown.values() for _, s in runs])
  if kind is None:
    return []
  untested, first_seen = [], {}
  for point in points:
    runs = [(e.seed, s["layer_stats"].get(kind, {})) for e, s in shown.get(point.key, [])]
    for stack in sorted({st for _, values in runs for st, _ in values}):
      layers = sorted({i for _, values in runs for st, i in values if st == stack})
      by_seed = {seed: [values[(stack, i)] for i in layers] for seed, values in runs
                 if all(values.get((stack, i), 0.0) > 0.0 for i in layers)}
      if not by_seed or len(layers) < 2:
        continue
      seeds = sorted(by_seed)
      columns = list(zip(*(by_seed[seed] for seed in seeds)))
      means, halves = zip(*(stats.mean_half_width(list(c)) for c in columns))
      interval = stats.paired_interval([math.log(by_seed[s][-1]) for s in seeds],
                                       [math.log(by_seed[s][0]) for s in seeds])
      label = ", ".join(point.values.values()) or "base config"
      measured = (stack, tuple((seed, tuple(by_seed[seed])) for seed in seeds))
      same_as = first_seen.setdefault(measured, label)
      untested.append(LayerProfile(
          key=point.key, point=label, statistic=kind, stack=stack, seeds=tuple(seeds),
          means=tuple(means), half_widths=tuple(halves), interval=interval,
          p_adjusted=None, trend="unresolved", same_as=None if same_as == label else same_as))
  tested = [row for row in untested if row.same_as is None]
  adjusted = dict(zip([(row.point, row.stack) for row in tested],
                      stats.holm([row.interval.p_value for row in tested])))
  rows = []
  for row in untested:
    p_adj = adjusted[(row.same_as or row.point, row.stack)]
    diff = row.interval.diff
    resolved = p_adj is not None and p_adj < options.alpha and diff != 0.0
    rows.append(dataclasses.replace(
        row, p_adjusted=p_adj,
        trend=("grows" if diff > 0.0 else "falls") if resolved else "unresolved"))
  return rows


def _seeds_text(seeds: Sequence[int]) -> str:
  """``seed 0``, ``seeds 1-4`` (consecutive), ``seeds 1, 3, 5``."""
  seeds = sorted(seeds)
  if len(seeds) == 1:
    return f"seed {seeds[0]}"
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"seeds {seeds[0]}-{seeds[-1]}"
  return "seeds " + ", ".join(map(str, seeds))


def design_line(record: SweepRecord, row: Comparison) -> str:
  """One comparison's design in a line: where its compared values were chosen,
  which seeds and split its verdict reads, and how it is tested, e.g.

    tuned on seed 0 over learning_rate {0.001, 0.003, 0.01}; confirmed on
    seeds 1-4 (paired, test split); sequential: <method>, look 3 of 4

  A tuned sweep without confirmation seeds says that its verdicts read the
  seeds that chose the values (selection-biased), unless a seed was reserved
  for the choice.
  """
  parts = []
  reserved = reserved_seed(record)
  if record.tune:
    # Each side's own grid (per-point grids), once where both have the same.
    grid, base_grid = (record.point_grid(row.key_of(row.value_index)),
                       record.point_grid(row.base_key))
    over = (f" over {grid_text(grid)}" if grid == base_grid else
            f": {row.value} over {grid_text(grid)}, {row.base_value} over "
            f"{grid_text(base_grid)}")
    tuning = list(record.seeds) if reserved is None else [reserved]
    parts.append(f"tuned on {_seeds_text(tuning)}{over}")
  paired = row.interval.method == "paired"
  seeds = (set(row.seeds) & set(row.base_seeds)) if paired else (
      set(row.seeds) | set(row.base_seeds))
  parts.append(f"{'confirmed' if record.confirm else 'compared'} on {_seeds_text(seeds)} "
               f"({'paired' if paired else 'Welch, unpaired'}, {row.split} split)")
  if record.tune and not record.confirm and reserved is None:
    parts.append("selection-biased: the seeds that chose the values are compared")
  if row.look is not None:
    parts.append(f"sequential: {stats.SEQUENTIAL_METHOD}, look {row.look.look} of "
                 f"{row.look.looks}")
  else:
    parts.append("fixed seeds: t test, Holm over the report")
  return "; ".join(parts)


# ------------------------------------------------------ sequential looks
def first_look_seeds(record: SweepRecord) -> set[int]:
  """The seeds whose runs enter a verdict at the first look, before any seed
  is added: a confirmed sweep's confirmation seeds, else its declared seeds
  (but the one reserved for the choice)."""
  if record.confirm:
    return set(record.confirmation_seeds())
  return set(record.seeds) - {reserved_seed(record)}


def sequential_design(record: SweepRecord) -> stats.SequentialDesign | None:
  """The looks of a sweep with adaptive seeds (``record.until_resolved``);
  None: a fixed-seed sweep, tested once.

  ``--until-resolved MAX_SEEDS`` adds one seed at a time to a point (one look
  each) until it has MAX_SEEDS, counted as ``adaptive.add_seeds`` counts
  them: its confirmation seeds, else all its runs at the chosen value (a
  reserved seed too). So a comparison has at most MAX_SEEDS - counted + 1
  looks, the first with ``first_look_seeds``.
  """
  if not record.until_resolved:
    return None
  first = len(first_look_seeds(record))
  counted = record.confirm or len(record.seeds)
  return stats.SequentialDesign(first, first + max(0, record.until_resolved - counted))


def _verdict_runs(record: SweepRecord, point: Point) -> Mapping[int, SeedResult]:
  """{seed: run} of the runs a point's verdicts read, finished or not: its
  confirmation runs, else its runs at the chosen value (the reserved seed
  left out)."""
  if record.confirm:
    return point.confirmation
  row = next((r for r in point.tuned if r.label == point.chosen_label), None)
  if point.chosen is None or row is None:
    return {}
  reserved = reserved_seed(record)
  return {seed: s for seed, s in row.seeds.items() if seed != reserved}


def look_of(record: SweepRecord, point: Point, base: Point) -> int:
  """The look a comparison of ``point`` and ``base`` is at: 1 + the seeds
  added to both (beyond ``first_look_seeds``) whose runs have finished on
  both sides, whatever their outcome. Both points take added seeds in the
  same order (``adaptive.add_seeds``), so these are the first rounds of each."""
  first = first_look_seeds(record)

  def added(p: Point) -> set[int]:
    return {seed for seed, s in _verdict_runs(record, p).items()
            if seed not in first and s.outcome is not None}

  return 1 + len(added(point) & added(base))


def _sequential_look(design: stats.SequentialDesign, look: int, a: Mapping[int, float],
                     b: Mapping[int, float], margin: float, alpha: float
                     ) -> stats.SequentialLook:
  """``stats.sequential_look`` on the seeds that both sides learned (paired:
  the sequential test is one of per-seed differences); with no such seed, an
  interval that is not known (nothing to test)."""
  pairs = sorted(set(a) & set(b))
  if pairs:
    return stats.sequential_look([a[s] for s in pairs], [b[s] for s in pairs], design,
                                 look, margin, alpha)
  diff = stats.mean_std(list(a.values()))[0] - stats.mean_std(list(b.values()))[0]
  unknown = stats.Interval(diff, None, None, None, None, None, "paired", 0, 0, 1.0 - alpha)
  return stats.SequentialLook(look, design.looks, design.share(look), unknown,
                              stats.tost(unknown, margin, alpha), None, None)


def sequential_seeds_to_resolve(iv: stats.Interval, design: stats.SequentialDesign,
                                alpha: float, power: float) -> int | None:
  """``seeds_to_resolve`` for adaptive seeds: the seeds per point (in a
  verdict: confirmation seeds, or declared ones but a reserved seed) at the
  last look of a design from the same first look whose last look alone
  detects a difference of the size seen with ``power``
  (``stats.sequential_seeds_needed``); as MAX_SEEDS it is one more where a
  seed is reserved for the choice. None when not known or above 64."""
  if iv.se is None or not iv.se or iv.diff == 0.0:
    return None
  sd = iv.se * iv.n_a ** 0.5  # the sequential test is paired
  return stats.sequential_seeds_needed(iv.diff, sd, design.first, alpha, power, design.rho)


def compared_at(point: Point) -> str | None:
  """The tuned values a point is compared at, as a label: those of its
  confirmation runs where it has some (fixed when they were added), else the
  chosen ones."""
  return point.chosen_label if point.confirmed is None else tuned_key(point.confirmed)


def _counted(record: SweepRecord, point: Point) -> tuple[Counts, int, str | None]:
  """The runs a point's comparisons count: (outcome counts, runs, the tuned
  values they ran at as a label where they are confirmation runs). A sweep
  with confirmation seeds counts a point's confirmation runs (none yet: no
  finished run), or its tuning stage where it has no value to confirm."""
  if record.confirm and (point.chosen is not None or point.confirmed is not None):
    label = None if point.confirmed is None else tuned_key(point.confirmed)
    return point.confirmation_counts, len(point.confirmation), label
  return point.counts, point.runs, None


def failed_comparisons(record: SweepRecord, points: Sequence[Point]
                       ) -> list[FailedComparison]:
  """The comparisons that ``comparisons`` cannot make because a side has no
  learned run (every run stalled or diverged, at every tuned value, or every
  confirmation run): a failure is a result, so each is listed with its counts
  instead of dropped."""
  out = []
  for ai, axis, ctx, vi, bi, point, base in _against_base(record, points):
    if point.compared and base.compared:
      continue
    (counts, runs, confirmed), (base_counts, base_runs, base_confirmed) = (
        _counted(record, point), _counted(record, base))
    if not counts.finished or not base_counts.finished:
      continue  # a side with no finished run: nothing to say yet
    row = FailedComparison(
        axis=axis.label, value=value_label(axis.values[vi], axis),
        base_value=value_label(axis.values[bi], axis),
        context=context_label(record.axes, ctx, ai), counts=counts,
        base_counts=base_counts, runs=runs, base_runs=base_runs,
        verdict=("both failed" if not point.compared and not base.compared
                 else "failed" if not point.compared else "base failed"), text="",
        confirmed=confirmed, base_confirmed=base_confirmed)
    grids = (record.point_grid(point.key), record.point_grid(base.key))
    out.append(dataclasses.replace(row, text=failed_text(record, row, grids)))
  return out


def failed_text(record: SweepRecord, row: FailedComparison,
                grids: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> str:
  """"post vs pre (num_layers=24): failed: post never learned (6 stalled of 6
  runs, at every learning rate); pre learned in 6 of 6"; a side counted on
  its confirmation runs says so ("3 stalled of 3 confirmation runs, at
  learning_rate=0.01"). ``grids``: each side's own tuned grid (value, base;
  default: every field the sweep tunes)."""
  own = dict(zip((row.value, row.base_value), grids or ()))

  def side(name: str, counts: Counts, runs: int, confirmed: str | None) -> str:
    kind = "confirmation runs" if confirmed is not None else "runs"
    if counts.learned:
      return (f"{name} learned in {counts.learned} of {runs}"
              + (" confirmation runs" if confirmed is not None else ""))
    failed = ", ".join(f"{getattr(counts, o)} {o}" for o in ("stalled", "diverged")
                       if getattr(counts, o))
    every = ""
    if confirmed is not None:
      every = f", at {confirmed}"
    elif own.get(name, record.tune):
      fields = ", ".join(f.split(".")[-1].replace("_", " ")
                         for f in own.get(name, record.tune))
      every = f", at every {fields}"
    return f"{name} never learned ({failed} of {runs} {kind}{every})"
  where = f" ({row.context})" if row.context != "-" else ""
  first, second = ((row.value, row.counts, row.runs, row.confirmed),
                   (row.base_value, row.base_counts, row.base_runs, row.base_confirmed))
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
    level = "" if row.look is None else f" ({iv.level:.1%} interval)"
    bounds = f" [{iv.low:+.3f}, {iv.high:+.3f}]{level}"
  else:
    bounds = " (no interval: fewer than two seeds)"
  seeds = "confirmation seeds" if record.confirm else "seeds"
  how = (f"{iv.n_a} {seeds} paired" if iv.method == "paired"
         else f"{iv.n_a} vs {iv.n_b} {seeds}, unpaired (Welch)")
  tuned = ""
  # The fields either side tunes (its own grid: a point may tune fewer).
  fields = list(dict.fromkeys(
      [*record.point_grid(row.key_of(row.value_index)),
       *record.point_grid(row.base_key)]))
  if fields:
    tuned = f", {', '.join(f.split('.')[-1].replace('_', ' ') for f in fields)} tuned per point"
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
  look = ("" if row.look is None else
          f"; sequential, look {row.look.look} of {row.look.looks}")
  need = ""
  if verdict == "unresolved" and row.seeds_needed and row.look is not None:
    design = sequential_design(record)
    need = (f"; about {row.seeds_needed} {seeds} paired would detect a difference of "
            f"this size, as the last look of a sequential design from {design.first} "
            f"(this sweep's last look has {design.last})")
  elif verdict == "unresolved" and row.seeds_needed:
    need = (f"; about {row.seeds_needed} seeds"
            f"{' paired' if iv.method == 'paired' else ' per side'} would detect a "
            "difference of this size")
  elif verdict == "unresolved" and iv.se:
    need = "; more than 64 seeds would be needed to detect a difference of this size"
  return (f"{row.value} vs {row.base_value}{where}{metric}: {head}{bounds}, {how}"
          f"{tuned}{look}; adjusted p = {p}{need}")


# ------------------------------------------------------------------ noise
# The validation curve whose last evaluations say whether a run still improved.
TREND_METRIC = "eval/loss"


def _chosen_curves(point: Point, summaries: Summaries) -> list[list[tuple[int, float]]]:
  """The validation-loss curves (evaluations after step 0, the one at
  initialisation left out) of the point's learned runs that its verdicts
  read: its confirmation runs where it has some, else its runs at its chosen
  value."""
  row = next((r for r in point.tuned if r.label == point.chosen_label), None)
  results = point.confirmation or ({} if point.chosen is None or row is None
                                   else row.seeds)
  out = []
  for _, s in sorted(results.items()):
    if s.outcome == "learned":
      curve = summaries[s.run].get("curves", {}).get(TREND_METRIC, [])
      out.append([(step, v) for step, v in curve if step > 0 and math.isfinite(v)])
  return [c for c in out if c]


def trends(record: SweepRecord, points: Sequence[Point], summaries: Summaries
           ) -> list[Point]:
  """``points``, each with its ``Trend``: still improving at its last evaluations?

  The runs: the point's learned runs that its verdicts read (its
  confirmation runs where it has some, else its runs at its chosen tuned
  value, seeds added by ``--until-resolved`` too), each with at least two
  evaluations after step 0.
  A run's drop is its validation loss at its second-to-last evaluation minus
  that at its last; the point's drop is the mean over its runs. The seed
  noise is the seed-to-seed standard deviation (n - 1) of the final
  validation loss of those runs; where the point has a single run, that of
  the base point (every axis at its base value); not known where that has a
  single run too. The point is still improving where drop > seed noise: the
  last interval of training alone moved its loss by more than a change of
  seed does, so a longer run may change a verdict resting on it.
  """
  curves = {p.key: _chosen_curves(p, summaries) for p in points}

  def noise(key: tuple[int, ...]) -> float | None:
    finals = [c[-1][1] for c in curves.get(key, [])]
    return stats.mean_std(finals)[1] if len(finals) > 1 else None

  base = tuple(a.reference for a in record.axes)
  out = []
  for point in points:
    runs = [c for c in curves[point.key] if len(c) > 1]
    if not runs:
      out.append(point)
      continue
    sd, source = noise(point.key), "point"
    if sd is None and point.key != base:
      sd, source = noise(base), "base point"
    drop = sum(c[-2][1] - c[-1][1] for c in runs) / len(runs)
    out.append(dataclasses.replace(point, trend=Trend(
        steps=(runs[0][-2][0], runs[0][-1][0]), drop=drop, runs=len(runs), seed_noise=sd,
        noise_from=None if sd is None else source,
        still_improving=None if sd is None else drop > sd)))
  return out


def noise_and_power(record: SweepRecord, points: Sequence[Point],
                    rows: Sequence[Comparison], options: Options) -> list[Noise]:
  """Per axis: the base point's seed standard deviation (select_by, report
  split) and the smallest difference detectable at ``options.power``, by
  the test its comparisons have: at alpha, or with adaptive seeds at the
  current look's share of it (the smallest of the rows with fewest seeds)."""
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
      alpha = min(options.alpha * r.look.share if r.look is not None else options.alpha
                  for r in paired if r.interval.n_a == n)
      mdd = (stats.min_detectable_difference(sds[len(sds) // 2], n, True, alpha,
                                             options.power) if alpha > 0 else None)
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
  points = trends(record, analyze_points(record, summaries, baselines, options), summaries)
  rows = comparisons(record, points, options)
  return Report(
      sweep=record.name, select_by=record.select_by, tune=dict(record.tune),
      report_split=record.report_split, reserved_seed=reserved_seed(record),
      verdict_runs=verdict_runs(record), tuning_seeds=tuple(record.seeds),
      confirmation_seeds=record.confirmation_seeds(),
      options=options, baselines=dict(sorted(baselines.items())),
      points=tuple(points), comparisons=tuple(rows),
      failed=tuple(failed_comparisons(record, points)),
      sensitivity=tuple(sensitivity(record, points,
                                    initial_losses(record, summaries, baselines))),
      noise=tuple(noise_and_power(record, points, rows, options)),
      scale=tuple(scale_effects(record, points, rows)),
      sequential=sequential(record), speedups=tuple(speedup.speedups(record, points)),
      compute=compute_lib.compute(record, summaries),
      evaluation_effects=tuple(evaluation_effects(record, points, summaries, options)),
      layer_profiles=tuple(layer_profiles(record, points, summaries, options)))


def sequential(record: SweepRecord) -> Sequential | None:
  """The report's account of its sequential test (None: fixed seeds)."""
  design = sequential_design(record)
  return None if design is None else Sequential(record.until_resolved, design)


def unresolved_points(report: Report) -> list[tuple[int, ...]]:
  """The point keys on either side of an unresolved comparison (a declared
  pair's too: both its points take the added seeds)."""
  keys = []
  for row in report.comparisons:
    if row.verdict != "unresolved":
      continue
    for key in (row.key_of(row.value_index), row.base_key):
      if key not in keys:
        keys.append(key)
  return keys
