"""The report's section "Points": selection and outcomes.

Each point (a combination of axis values): its runs at each tuned value,
each finished run's outcome (learned, stalled or diverged: ``outcome``), the
tuned value it is compared at (chosen on validation by ``_selection_score``,
each run capped at the loss at initialisation l0, ``initial_loss``), its
confirmation runs (stale where they ran at another value than is chosen
now), and the per-seed metrics its comparisons read (``Point.compared``).
``points`` is every section's view of them, with their trends
(``sections.trends``) and the firmness of their choices
(``sections.choices``); report.json's ``points`` and the runs its verdicts
read (``verdict_runs``, ``reserved_seed``, the seeds).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tfx_jax.records.ladder import BUDGET_AXIS
from tfx_jax.records.summary import RunSummaries, RunSummary
from tfx_jax.records import transfer as transfer_lib
from tfx_jax.records.sweep import DECLARED, RunEntry, Split, SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import (BITS_PER_BYTE, Context, compared_at, compared_by,
                                    lower_is_better, per_token, reserved_seed, tokenizer_axes,
                                    tuned_key, verdict_runs)
from tfx_jax.report.points import Points, value_label
from tfx_jax.report.schema import (Baseline, Counts, InitialLossSource, Options, Point, Report,
                                   SeedResult, TunedValue, is_standard_error)
from tfx_jax.report.sections import choices, trends
from tfx_jax.report.tables import Lines, fmt, markdown_table, outcome_cells, pm, seeds_range
from tfx_jax.report.tuning import grid_edges


def points(ctx: Context) -> list[Point]:
  """The report's points, each with its trend and its choice's margin,
  computed once per report."""
  return ctx.once("points", lambda: choices.choice_margins(ctx.record, trends.trends(
      ctx.record, analyze_points(ctx.record, ctx.summaries, ctx.baselines, ctx.options),
      ctx.summaries)))


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's points and the runs its verdicts read."""
  record = ctx.record
  return {"points": tuple(points(ctx)), "reserved_seed": reserved_seed(record),
          "verdict_runs": verdict_runs(record), "tuning_seeds": tuple(record.seeds),
          "confirmation_seeds": record.confirmation_seeds()}


def outcome(summary: RunSummary, baseline: Baseline, stall_margin: float
            ) -> stats.Outcome | None:
  """learned / stalled / diverged of a finished run (None: not finished)."""
  if summary.state == "diverged":
    return "diverged"
  if summary.state != "finished":
    return None
  loss = summary.final.get("eval/loss")
  if baseline.unigram_entropy is None:  # no threshold known: only divergence counts
    return "learned" if loss is not None and math.isfinite(loss) else "diverged"
  return stats.classify_run(loss, False, baseline.unigram_entropy, stall_margin)


def _point_runs(record: SweepRecord, summaries: RunSummaries
                ) -> dict[tuple[int, ...], dict[str, tuple[dict, list]]]:
  """{point key: {tuned label: (tuned dict, [(entry, summary)])}} in declaration
  order: the tuning stage's runs (the confirmation runs are the point's own),
  and a transferred point's runs at its transferred value (``tune_at``: its
  one tuned value, so its choice)."""
  out: dict[tuple[int, ...], dict[str, tuple[dict, list]]] = {}
  for entry in record.runs:
    if entry.stage not in DECLARED:
      continue
    out.setdefault(record.point_key(entry), {}).setdefault(
        tuned_key(entry.tuned), (entry.tuned, []))[1].append((entry, summaries[entry.name]))
  return out


def _split_values(summary: RunSummary, split: Split) -> dict[str, float]:
  values = summary.final if split == "validation" else summary.test
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


def initial_loss(summaries: Sequence[RunSummary], select_by: str,
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
  measured = [float(s.initial[select_by]) for s in summaries
              if math.isfinite(s.initial.get(select_by, math.nan))]
  if measured:
    return InitialLoss(sum(measured) / len(measured), "step 0", len(measured))
  if select_by == "eval/loss" and uniform is not None:
    return InitialLoss(float(uniform), "uniform", 0)
  return None


def initial_losses(record: SweepRecord, summaries: RunSummaries,
                   baselines: Mapping[str, Baseline]
                   ) -> dict[tuple[int, ...], InitialLoss | None]:
  """{point key: its ``initial_loss``} over all of the point's runs."""
  runs: dict[tuple[int, ...], list[RunEntry]] = {}
  for entry in record.runs:
    runs.setdefault(record.point_key(entry), []).append(entry)
  return {key: initial_loss([summaries[e.name] for e in entries], record.select_by,
                            baselines[entries[0].name].initial_loss)
          for key, entries in runs.items()}


def _seed_result(entry: RunEntry, summary: RunSummary, baseline: Baseline, split: Split,
                 options: Options) -> SeedResult:
  return SeedResult(
      run=entry.name, outcome=outcome(summary, baseline, options.stall_margin),
      validation=_split_values(summary, "validation"),
      test=None if split == "validation" else _split_values(summary, split),
      # Length extrapolation (evaluate --lengths), perplexity at k x the length.
      lengths={f"ppl@{k}x": float(v) for k, v in summary.lengths.items()
               if v is not None and math.isfinite(v)},
      num_params=summary.num_params, training=dict(summary.training))


def _tuned_rows(record: SweepRecord, by_tuned: Mapping[str, tuple[dict, list]],
                baselines: Mapping[str, Baseline], options: Options, l0: float | None
                ) -> list[TunedValue]:
  """A point's runs at each of its tuned values (``_point_runs``), with their
  outcomes and what chooses among them (``_selection_score``)."""
  select_by, split = record.select_by, record.report_split
  reserved = reserved_seed(record)
  declared = set(record.seeds)
  rows = []
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
    rows.append(TunedValue(
        tuned=tuned, label=label, seeds=seeds,
        counts=Counts.of(s.outcome for s in seeds.values()),
        selection_mean=stats.mean_std(selection)[0] if selection else None,
        selection_failed=failed,
        selection_score=_selection_score(
            [(s.outcome, s.validation.get(select_by)) for s in choosing
             if s.outcome is not None], l0, select_by)))
  return rows


def shared_picks(rows: Mapping[tuple[int, ...], Sequence[TunedValue]]
                 ) -> dict[tuple[int, ...], TunedValue | None]:
  """{point key: its chosen tuned value} of a ladder whose budgets share their
  tuned value (``Ladder(share_tuning=True)``): the points of one rung and
  variant (their keys but the budget's) choose together, among the tuned
  values scored (``_selection_score``) at every budget, the one whose mean
  score over the budgets is the lowest (element by element; the first
  declared on a tie). A value unscored at some budget, or scored there on
  another scale (l0 known at one budget, not at another), is no candidate;
  where none is, no budget of the group has a chosen value.

  Why one value: with ``optim.schedule=wsd`` a budget differs from the others
  only in its decay (Hägele et al. 2024 tune the rate once per size), and
  budgets at different values cannot branch from one trunk."""
  groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
  for key in rows:
    groups.setdefault(key[:BUDGET_AXIS] + key[BUDGET_AXIS + 1:], []).append(key)
  out: dict[tuple[int, ...], TunedValue | None] = {}
  for members in groups.values():
    scored = [{r.label: r for r in rows[k] if r.selection_score is not None}
              for k in members]
    best, best_score = None, None
    for label in scored[0]:
      scores = [s[label].selection_score for s in scored if label in s]
      if len(scores) < len(members) or len({len(x) for x in scores}) > 1:
        continue
      mean = tuple(sum(x[i] for x in scores) / len(scores) for i in range(len(scores[0])))
      if best_score is None or mean < best_score:
        best, best_score = label, mean
    for key, by_label in zip(members, scored):
      out[key] = None if best is None else by_label[best]
  return out


def analyze_points(record: SweepRecord, summaries: RunSummaries,
                   baselines: Mapping[str, Baseline], options: Options) -> list[Point]:
  """Each point: its runs per tuned value with outcomes and metrics, its chosen
  tuned value, its confirmation runs (stage ``confirm``: superseded runs are
  no point's), and the per-seed metrics it is compared on (the learned
  confirmation runs on a sweep with confirmation seeds, none where they are
  stale, else the learned runs at the chosen value).

  A transferred point (``tune_at``) of a sweep with confirmation seeds runs
  no transfer stage (``sweep.transfer``): its runs are its confirmation runs,
  it has no tuned values of its own, and its chosen value is the one chosen
  at its source proxy. One with transfer-stage runs (a sweep of an earlier
  version) chooses among those, its one tuned value.

  A ladder whose budgets share their tuned value (``shared_picks``): the
  budgets of each rung and variant report the one value they chose together;
  a transferred point takes its proxy's at its budget, the shared one."""
  split = record.report_split
  reserved = reserved_seed(record)
  confirmation_runs: dict[tuple[int, ...], list[RunEntry]] = {}
  for entry in record.runs:
    if entry.stage == "confirm":
      confirmation_runs.setdefault(record.point_key(entry), []).append(entry)
  l0s = initial_losses(record, summaries, baselines)
  plan = transfer_lib.record_sources(record)
  transferred = {k for k in {record.point_key(e) for e in record.runs}
                 if transfer_lib.source_key(plan, k) != k}
  by_point = _point_runs(record, summaries)
  rows: dict[tuple[int, ...], list[TunedValue]] = {}
  picks: dict[tuple[int, ...], TunedValue | None] = {}
  for key, by_tuned in by_point.items():
    rows[key] = _tuned_rows(record, by_tuned, baselines, options,
                            None if l0s[key] is None else l0s[key].value)
    candidates = [r for r in rows[key] if r.selection_score is not None]
    picks[key] = min(candidates, key=lambda r: r.selection_score) if candidates else None
  if record.ladder is not None and record.ladder.share_tuning:
    picks.update(shared_picks({k: r for k, r in rows.items() if k not in transferred}))
  points = []
  for key in [*by_point, *(k for k in confirmation_runs if k not in by_point)]:
    tuned_rows = rows.get(key, [])
    # Its own choice, or (confirmation runs only) its source proxy's.
    chosen = picks.get(key if key in by_point else transfer_lib.source_key(plan, key))
    confirming = confirmation_runs.get(key, [])
    confirmation = {e.seed: _seed_result(e, summaries[e.name], baselines[e.name], split,
                                         options) for e in confirming}
    confirmed = dict(confirming[0].tuned) if confirming else None
    stale = choices.is_stale(confirmed, None if chosen is None else chosen.tuned)
    compared = {}
    if record.confirm:
      for seed, s in sorted(confirmation.items()):
        if s.outcome == "learned" and not stale:
          compared[seed] = {**s.on(split), **s.lengths}
    elif chosen is not None:
      for seed, s in chosen.seeds.items():
        if s.outcome == "learned" and seed != reserved:
          compared[seed] = {**s.on(split), **s.lengths}
    params = [s.num_params for r in tuned_rows for s in r.seeds.values() if s.num_params]
    if not tuned_rows:
      params = [s.num_params for s in confirmation.values() if s.num_params]
    points.append(Point(
        key=key,
        values={a.label: value_label(a.values[i], a) for a, i in zip(record.axes, key)},
        chosen=None if chosen is None else chosen.tuned,
        chosen_label=None if chosen is None else chosen.label,
        # A transferred point's value is its proxy's choice, whose grid edge
        # the proxy reports.
        chosen_at_edge=({} if chosen is None or key in transferred
                        else grid_edges(record.point_grid(key), chosen.tuned)),
        tuned=tuple(tuned_rows),
        counts=sum((r.counts for r in tuned_rows), Counts()),
        runs=sum(len(r.seeds) for r in tuned_rows),
        compared=compared,
        num_params=params[0] if params else None,
        confirmed=confirmed, confirmation=confirmation, stale=stale))
  return points


def compared_metrics(points: Sequence[Point], record: SweepRecord) -> list[str]:
  """The metrics the points are compared on, ``compared_by``'s first; a
  metric's evaluation standard error (``<metric>_se``) is reported beside it
  (``Point.eval_se``), not compared. Points that differ in tokenizer
  (``tokenizer_axes``) are compared in bits per byte and in no metric per
  token; otherwise bits per byte is eval/loss times one constant (the
  evaluated sample's tokens over its bytes) and is left out, as perplexity."""
  names = {m for p in points for values in p.compared.values() for m in values
           if not is_standard_error(m)}
  names.discard("eval/perplexity")  # a function of eval/loss
  if tokenizer_axes(record):
    names = {m for m in names if not per_token(m)}
  else:
    names.discard(BITS_PER_BYTE)
  first = compared_by(record)
  return sorted(names, key=lambda m: (m != first, m.startswith("ppl@"),
                                      int(m[4:-1]) if m.startswith("ppl@") else 0, m))



# ------------------------------------------------------------------ report.md
def points_table(record: SweepRecord, report: Report, points: Points) -> list[list[str]]:
  """One row per point: chosen tuned values, outcomes, compared metrics (a
  sweep with confirmation seeds: its confirmation runs')."""
  metrics = compared_metrics(report.points, record)
  tuned = bool(record.tune)
  confirmed = report.verdict_runs == "confirmation"
  head = ([a.label for a in record.axes] + (["chosen"] if tuned else [])
          + ["confirmation runs" if confirmed else "runs", "learned", "stalled", "diverged"]
          + _metric_head(report, metrics) + ["still improving"]
          + ["tokens/s"])
  budget_columns = _budget_columns(points)
  rows = [head + [title for _, title in budget_columns]]
  for point in report.points:
    tps = [s.tokens_per_sec for _, s in points.get(point.key, []) if s.tokens_per_sec]
    counts, runs = ((point.confirmation_counts, len(point.confirmation)) if confirmed
                    else (point.counts, point.runs))
    budgets = next((s.budgets for _, s in points.get(point.key, []) if s.budgets), {})
    rows.append(list(point.values.values())
                + ([_chosen_cell(point)] if tuned else [])
                + [str(runs)] + outcome_cells(counts)
                + _metric_cells(report, point, metrics) + [trends.trend_cell(point.trend)]
                + [f"{stats.mean_std(tps)[0]:,.0f}" if tps else "-"]
                + [f"{budgets[key]:,}" if key in budgets else "-"
                   for key, _ in budget_columns])
  return rows


# The budgets a comparison may hold equal (run/footprint.py's ``budgets``), as
# the points table heads them: shown where the runs recorded them.
BUDGET_COLUMNS = (("params", "params"), ("non_embedding_params", "non-embedding params"),
                  ("train_flops_per_token", "train FLOPs/token"),
                  ("kv_bytes_per_token", "KV cache bytes/token"),
                  ("state_bytes_per_sequence", "state bytes/sequence"))


def _budget_columns(points: Points) -> list[tuple[str, str]]:
  """The budget columns of the points table: none where no run recorded its
  budgets (runs older than them), the recurrent state only where a model has one."""
  recorded = [s.budgets for runs in points.values() for _, s in runs if s.budgets]
  if not recorded:
    return []
  return [(key, title) for key, title in BUDGET_COLUMNS
          if key != "state_bytes_per_sequence" or any(b.get(key) for b in recorded)]


def _chosen_cell(point: Point) -> str:
  """The tuned values a point is compared at, or why it is not compared."""
  if point.stale:
    return (f"{point.chosen_label or 'none learned'} (confirmation stale: ran at "
            f"{compared_at(point)}; not compared)")
  return compared_at(point) or "none learned"


# The evaluation's standard error should be at most this fraction of the
# seed-to-seed standard deviation: it then adds at most 1/16 to the seed
# variance (3% to the standard deviation).
EVAL_NOISE_LIMIT = 0.25


def _with_se(report: Report, metrics: Sequence[str]) -> list[str]:
  """The compared metrics whose evaluations logged a standard error."""
  return [m for m in metrics if any(m in p.eval_se for p in report.points)]


def _metric_head(report: Report, metrics: Sequence[str]) -> list[str]:
  """Each compared metric's column, and its evaluation SE's where it has one."""
  with_se = _with_se(report, metrics)
  return [c for m in metrics for c in [f"{m} ({report.report_split})"]
          + ([f"{m} eval SE"] if m in with_se else [])]


def _metric_cells(report: Report, point, metrics: Sequence[str]) -> list[str]:
  """Mean ± seed std of each compared metric, and beside it the evaluation SE,
  in bold where it is more than ``EVAL_NOISE_LIMIT`` of the seed std."""
  with_se = _with_se(report, metrics)
  cells = []
  for m in metrics:
    cells.append(pm([v[m] for v in point.compared.values() if m in v]))
    if m in with_se:
      se, sd = point.eval_se.get(m), point.seed_sd.get(m)
      noisy = se is not None and sd is not None and se > EVAL_NOISE_LIMIT * sd
      cells.append(f"**{se:.4f}**" if noisy else fmt(se))
  return cells


def eval_noise_lines(record: SweepRecord, report: Report) -> Lines:
  """What the eval SE column means, and the points whose evaluation noise is
  more than ``EVAL_NOISE_LIMIT`` of their seed spread."""
  metrics = _with_se(report, compared_metrics(report.points, record))
  if not metrics:
    return []
  out = ["Eval SE: the standard error of each evaluation's own estimate, the sampling "
         "error of the evaluated sample (across its rows for losses and accuracy, "
         "sacreBLEU's bootstrap over sentences for BLEU and chrF), root mean square over "
         "the runs. Beside the seed-to-seed standard deviation it bounds how much of that "
         "spread the evaluated sample could make (runs evaluated on the same sample share "
         "part of its error, which cancels in their differences); at most a quarter of "
         "it adds at most 3% to the spread.", ""]
  noisy = [(p, m) for p in report.points for m in metrics
           if m in p.eval_se and m in p.seed_sd
           and p.eval_se[m] > EVAL_NOISE_LIMIT * p.seed_sd[m]]
  if noisy:
    out += ["Evaluation noise above a quarter of the seed spread (in bold above): "
            + "; ".join(f"{', '.join(p.values.values()) or 'base'} {m} (eval SE "
                        f"{p.eval_se[m]:.4f}, seed std {p.seed_sd[m]:.4f})"
                        for p, m in noisy)
            + ". Part of those points' seed-to-seed spread, and of their differences, "
            "may be the evaluated sample: evaluate more data (`eval.num_batches`; 0 "
            "evaluates the whole split).", ""]
  return out



def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The points table: chosen values, outcomes, metrics, trend, tokens/s, and
  the budgets a comparison may hold equal, so a reader sees which were."""
  where = (f"of each point's confirmation runs (seeds {seeds_range(report.confirmation_seeds)}"
           "), at the tuned value its tuning stage chose" if report.verdict_runs ==
           "confirmation" else "at each point's chosen tuned value")
  return ["## Points", "",
          f"Metrics on the {report.report_split} split {where}, "
          "mean ± standard deviation over its learned runs. Stalled: the final validation "
          "loss is not below the unigram entropy of the training targets (the best model "
          f"that ignores context) by {report.options.stall_margin} nats; stalled "
          "and diverged runs are counted, not averaged. Still improving: the validation "
          "loss of those runs fell between their last two evaluations (the mean over "
          "the runs) by more than the seed noise, the seed-to-seed standard deviation "
          "of their final validation loss (the base point's where a point has one run): "
          "a longer run may change the verdicts on that point."
          + (" Budgets (where the runs recorded them): total and non-embedding "
             "parameters, training FLOPs per token at the training length, the KV "
             "cache's bytes per token in the compute dtype (docs/fair-comparisons.md, "
             "\"Matched budgets\")." if _budget_columns(ctx.groups) else ""), "",
          markdown_table(points_table(ctx.record, report, ctx.groups)), ""
          ] + eval_noise_lines(ctx.record, report)
