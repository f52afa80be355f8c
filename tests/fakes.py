"""Planted sweeps: a sweep directory as the sweep command and its runs leave
it, written by the code's own writers, so that the report's and the sweep's
tests read exactly what a real sweep would give them, in seconds.

- The record (sweep.json): ``axis``, ``entry`` and ``record`` build the
  ``SweepRecord`` the sweep command builds (the report's tests read it in
  memory, or plant it); ``write_sweep`` writes it as the command does
  (``records.sweep.write``), or as an earlier version did (``written_before``).
- A run's workdir: ``write_run`` (TensorBoard scalars through the trainer's
  ``MetricWriter``, status.json through ``write_status``, the markers of the
  evaluations after training that finished), ``log`` (more scalars, from one
  more writer: a resumed run, a second logger), ``write_evaluation``
  (``eval/<split>-<step>.json``) and ``write_lengths`` (``evaluate
  --lengths``'s rows), as ``python -m tfx_jax.evaluate`` writes them.
- A run's summary in memory, as ``report.collect.read_run`` reads it from a
  workdir: ``summary``, for tests that drive the analysis without files.
- A laddered sweep (``Sweep(ladder=...)``): ``ladder_sweep``, its record
  with the ladder's plan and trunks and every run's summary, from a known
  loss against compute.

Which files a run's workdir holds for the report: ``report/collect.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib
from typing import Any, Iterable, Mapping, Sequence

from tfx_jax.core import atomic
from tfx_jax.records import ladder as ladder_lib
from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as sweep_lib
from tfx_jax.records.summary import RunSummary
from tfx_jax.records.sweep import AddedRun, AxisRecord, Evaluation, RunEntry, SweepRecord
from tfx_jax.run import metrics

CONFIG = "configs/lm.py:tiny"

Scalars = Mapping[int, Mapping[str, float]] | Iterable[tuple[int, Mapping[str, float]]]


# ------------------------------------------------------------------ the record
def axis(label: str, values: Sequence[Any], reference: int = 0,
         comparisons: Sequence[Sequence[int]] = (),
         fields: Sequence[str] | None = None) -> AxisRecord:
  """An axis as sweep.json records it. ``values``: each a dict of overrides,
  or a bare value of the field named ``label`` ({label: value});
  ``fields``: those the values set unless given; ``comparisons``: the
  declared (value index, base index) pairs."""
  values = tuple(dict(v) if isinstance(v, Mapping) else {label: v} for v in values)
  if fields is None:
    fields = tuple(dict.fromkeys(k for v in values for k in v))
  return AxisRecord(label, tuple(fields), values, reference,
                    tuple((int(v), int(b)) for v, b in comparisons))


def entry(name: str, seed: int, values: Sequence[Mapping[str, Any]] = (),
          overrides: Mapping[str, Any] | None = None, tuned: Mapping[str, Any] | None = None,
          **bookkeeping: Any) -> RunEntry:
  """One run of the record: the value of each axis (in axis order), its
  overrides and tuned values; ``bookkeeping``: any other ``RunEntry`` field
  (state, step, attempts, wall_seconds, compile_seconds, stage, ...)."""
  return RunEntry(name=name, seed=seed, values=tuple(dict(v) for v in values),
                  overrides=dict(overrides or {}), tuned=dict(tuned or {}), **bookkeeping)


def record(name: str, axes: Sequence[AxisRecord], runs: Sequence[RunEntry],
           seeds: Sequence[int], **fields: Any) -> SweepRecord:
  """The ``SweepRecord`` of a planted sweep (config ``CONFIG`` unless given).

  ``fields``: any other ``SweepRecord`` field; ``evaluations`` and ``added``
  may be given as sweep.json has them (argument lists, dicts). A run without
  evaluations of its own gets the record's that apply to its overrides, as
  the sweep command gives them (``records.sweep.evaluations_for``).
  """
  fields.setdefault("config", CONFIG)
  evaluations = tuple(e if isinstance(e, Evaluation) else sweep_lib.parse_evaluation(e)
                      for e in fields.pop("evaluations", ()))
  added = [a if isinstance(a, AddedRun) else AddedRun(**a) for a in fields.pop("added", ())]
  runs = [e if e.evaluations else dataclasses.replace(
              e, evaluations=sweep_lib.evaluations_for(evaluations, e.overrides))
          for e in runs]
  return SweepRecord(name=name, seeds=tuple(seeds), axes=tuple(axes), runs=runs,
                     evaluations=evaluations, added=added, **fields)


def write_sweep(root: pathlib.Path, sweep: SweepRecord,
                written_before: Sequence[str] = ()) -> pathlib.Path:
  """Writes ``sweep`` as ``root``'s sweep.json, as the sweep command does;
  ``written_before``: top-level keys left out, as a version from before
  they were kept wrote the file (the reader's migration then fills them).
  Returns ``root``."""
  sweep_lib.write(root, sweep)
  if written_before:
    path = pathlib.Path(root) / sweep_lib.FILENAME
    data = json.loads(path.read_text())
    for key in written_before:
      del data[key]
    atomic.write_json(path, data)
  return pathlib.Path(root)


# ------------------------------------------------------------ a run's workdir
def log(workdir: pathlib.Path, scalars: Scalars) -> None:
  """TensorBoard scalars of the run, from one writer (one event file, as one
  process of the trainer): ``scalars`` {step: {tag: value}} or (step, {tag:
  value}) pairs, in the order they are logged."""
  items = scalars.items() if isinstance(scalars, Mapping) else scalars
  with metrics.MetricWriter(pathlib.Path(workdir) / "tensorboard") as writer:
    for step, values in items:
      writer.write_scalars(step, dict(values))


def write_run(workdir: pathlib.Path, scalars: Scalars = (), *, state: str = "finished",
              step: int = 30, reason: str = "",
              evaluated: Mapping[int, Sequence[str]] | None = None,
              **status: Any) -> pathlib.Path:
  """A run's workdir as training leaves it: its TensorBoard ``scalars``
  (``log``; none: no event file) and its status.json (``state`` at ``step``,
  ``reason``; ``status``: its other fields, e.g. num_params, cores,
  seconds); ``evaluated``: {index: arguments} of the evaluations after
  training that finished (their markers). Returns ``workdir``."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  if scalars:
    log(workdir, scalars)
  for index, args in (evaluated or {}).items():
    status_lib.mark_evaluation_done(workdir, index, args)
  status_lib.write_status(workdir, state, step, reason, **status)
  return workdir


def write_evaluation(workdir: pathlib.Path, split: str, step: int,
                     scores: Mapping[str, Any], task: str = "lm",
                     num_examples: int = 100) -> pathlib.Path:
  """``eval/<split>-<step>.json`` as ``python -m tfx_jax.evaluate --split
  SPLIT`` writes it: the scores, then the examples, step, split and task."""
  path = pathlib.Path(workdir) / "eval" / f"{split}-{step}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic.write_json(path, {**scores, "num_examples": num_examples, "step": step,
                           "split": split, "task": task})
  return path


def write_tuned_run(workdir: pathlib.Path, validation: float, test: float,
                    step: int = 30) -> None:
  """A run as a tuned sweep leaves it once finished: its validation curve, its
  test evaluation (``eval/test-<step>.json``) and that evaluation's marker."""
  write_run(workdir, [(10, {"train/loss": 3.0, "train/tokens_per_sec": 100.0}),
                      (step, {"eval/loss": validation,
                              "eval/perplexity": math.exp(validation)})],
            step=step, evaluated={0: ["--split", "test"]}, num_params=1000)
  write_evaluation(workdir, "test", step,
                   {"eval/loss": test, "eval/perplexity": math.exp(test)})


def write_lengths(workdir: pathlib.Path, step: int, perplexities: Mapping[int, float],
                  split: str = "validation", window: int = 64,
                  scaling: str | None = None) -> pathlib.Path:
  """``evaluate --lengths``'s result at ``step``: a row per multiple of the
  training window ({multiple: perplexity}), ``window`` x multiple tokens
  long; ``scaling``: the RoPE scaling's tag of ``--rope_scaling``
  (``yarn-x2-from64``), whose results have a file of their own."""
  suffix = f".lengths.rope-{scaling}.json" if scaling else ".lengths.json"
  path = pathlib.Path(workdir) / "eval" / f"{split}-{step}{suffix}"
  path.parent.mkdir(parents=True, exist_ok=True)
  atomic.write_json(path, [{"multiple": k, "length": window * k, "perplexity": ppl}
                           for k, ppl in sorted(perplexities.items())])
  return path


# --------------------------------------------------------- a summary in memory
def summary(final: Mapping[str, float] | None = None, **fields: Any) -> RunSummary:
  """A run's summary as ``report.collect.read_run`` reads it: ``final`` its
  last eval/* values, ``fields`` any other of its fields (state, step, test,
  initial, curves, lengths, num_params, ...); the rest as a finished run
  whose workdir holds its status.json alone has them (tests/test_fakes.py
  checks that against ``read_run``)."""
  return RunSummary(**{"state": "finished", **fields, "final": dict(final or {})})


# ------------------------------------------------------------- a ladder
def ladder_counts(rung: Mapping[str, Any], vocab: int = 256) -> tuple[int, int]:
  """(non-embedding, total) parameters of a planted rung: 12 L d^2 for its
  blocks (attention 4 d^2, FFN 8 d^2), plus a vocab x d table."""
  d, layers = int(rung["model.d_model"]), int(rung["model.num_layers"])
  return 12 * layers * d * d, 12 * layers * d * d + vocab * d


def ladder_sweep(name: str, rungs: Sequence[Mapping[str, Any]], budgets: Sequence[float],
                 variants: Mapping[str, Sequence[Any]],
                 loss: Any, seeds: Sequence[int] = (0, 1, 2), *,
                 tokens_per_step: int = 256, corpus_tokens: int | None = 10_000_000,
                 branch: bool = False, seconds: float = 10.0,
                 tune: Mapping[str, Sequence[Any]] | None = None, **fields: Any
                 ) -> tuple[SweepRecord, dict[str, RunSummary]]:
  """(record, summaries) of a planted laddered sweep, every run finished, as
  ``Sweep(ladder=Ladder(rungs, budgets))`` with the declared axes
  ``variants`` ({field: values}, the first each axis's base) records it: the
  rung axis, the budget axis, then the variants (``records.ladder``).

  ``loss(variant, compute, seed)``: the final validation loss of a run of
  the variant ({field: value}, its tuned values among them) at training
  compute C = tokens x 6 N (``ladder_counts``' N); ``seconds``: each run's
  train-step seconds on one core. ``branch``: each (rung, variant, tuned
  value, seed)'s budgets branch at 80% of their steps from one trunk run (in
  ``record.trunks``, its own seconds). ``tune``: {field: values}, every
  point's grid (``Sweep(tune=...)``)."""
  fields_ = tuple(rungs[0])
  axes_ = [axis("+".join(fields_), rungs, fields=fields_),
           axis(ladder_lib.BUDGET_FIELD, [{ladder_lib.BUDGET_FIELD: float(b)} for b in budgets]),
           *(axis(field, values) for field, values in variants.items())]
  combos = [dict(zip(variants, c)) for c in itertools.product(*variants.values())]
  grid = [dict(zip(tune or {}, c)) for c in itertools.product(*(tune or {}).values())]
  points, runs, trunks, summaries = [], [], [], {}
  for r, rung in enumerate(rungs):
    non_embedding, total = ladder_counts(rung)
    for (v, variant), (t, tuned) in itertools.product(enumerate(combos), enumerate(grid)):
      steps = [ladder_lib.steps_for(b, non_embedding, tokens_per_step) for b in budgets]
      trunk_step = max(int(0.8 * s) for s in steps)
      tag = f"_t{t}" if tune else ""
      for seed in seeds:
        trunk = f"{name}_r{r}_v{v}{tag}_s{seed}_trunk" if branch else ""
        if branch:
          trunks.append(entry(trunk, seed, (), {**rung, "train.num_steps": trunk_step},
                              state="finished", step=trunk_step, wall_seconds=seconds))
          summaries[trunk] = summary({"eval/loss": 9.0}, step=trunk_step, cores=1,
                                     seconds={"train_steps": seconds})
        for b, budget in enumerate(budgets):
          key = (r, b, *(list(variants[f]).index(variant[f]) for f in variants))
          tokens = steps[b] * tokens_per_step
          if seed == seeds[0] and t == 0:
            points.append(ladder_lib.PointCount(
                key, total, non_embedding, non_embedding, 6 * non_embedding, steps[b], tokens,
                int(0.8 * steps[b]) if branch else None))
          run = f"{name}_r{r}_b{b}_v{v}{tag}_s{seed}"
          values = [axes_[0].values[r], axes_[1].values[b],
                    *({f: variant[f]} for f in variants)]
          runs.append(entry(run, seed, values,
                            {**rung, **variant, **tuned, "train.num_steps": steps[b]},
                            tuned=tuned, state="finished", step=steps[b], trunk=trunk,
                            wall_seconds=seconds))
          value = float(loss({**variant, **tuned}, float(tokens * 6 * non_embedding), seed))
          summaries[run] = summary({"eval/loss": value}, step=steps[b], num_params=total,
                                   cores=1, seconds={"train_steps": seconds})
  plan = ladder_lib.LadderPlan(
      fields_, tuple(dict(r) for r in rungs), tuple(float(b) for b in budgets),
      tuple(ladder_counts(r)[0] for r in rungs), tokens_per_step, tuple(points),
      corpus_tokens, branch)
  return record(name, axes_, runs, seeds, ladder=plan, trunks=trunks, tune=dict(tune or {}),
                **fields), summaries
