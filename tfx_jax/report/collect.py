"""Reads what a sweep's runs left on disk: sweep.json (``sweep_record``),
each run's run_spec.json (the values it trained with), TensorBoard scalars
(through TensorBoard's own event reader), status.json, extra evaluations.

Each run's figures are a ``RunSummary`` (``read_run``; a sweep's:
``collect``), so that the tables, statistics and plots are pure functions of
them (and testable on event files written by a test).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import statistics
from typing import Any, Iterable

from tfx_jax.run import metrics
from tfx_jax.records import run_spec
from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as sweep_record
from tfx_jax.records.summary import RunSummary
from tfx_jax.records.sweep import RunEntry, SweepRecord

# layer_stats/<kind>[/<param>]/<stack>_<NN> (tfx_jax/run/layer_stats.py).
LAYER_TAG = re.compile(
    r"layer_stats/(grad_norm|param_norm|update_norm|init_grad_norm)/(?:(\w+)/)?(\w+?)_(\d+)$")
INIT_KIND = "init_grad_norm"
LOG_Z_TAG = "train/output_log_z"
ATTENTION_LOGIT_TAG = re.compile(r"layer_stats/max_attention_logit/\w+_\d+$")


def training_signals(scalars: dict[str, list[tuple[int, float, float]]]) -> dict[str, float]:
  """What a run's training logged of the instabilities Wortsman et al. 2023
  study, over its finite values: the output softmax's mean log Z
  (``train/output_log_z``: first, last, min and max over the logged steps)
  and the largest self-attention logit of any layer (``train.log_layer_stats``:
  over the whole run, and at the last logged step); keys absent where the run
  logged none."""
  out = {}
  log_z = [(step, v) for step, v, _ in scalars.get(LOG_Z_TAG, []) if math.isfinite(v)]
  if log_z:
    values = [v for _, v in log_z]
    out.update({"output_log_z_first": values[0], "output_log_z_last": values[-1],
                "output_log_z_min": min(values), "output_log_z_max": max(values)})
  logits = [(step, v) for tag, points in scalars.items() if ATTENTION_LOGIT_TAG.match(tag)
            for step, v, _ in points if math.isfinite(v)]
  if logits:
    last = max(step for step, _ in logits)
    out["max_attention_logit"] = max(v for _, v in logits)
    out["max_attention_logit_last"] = max(v for step, v in logits if step == last)
  return out


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float, float]]]:
  """{tag: [(step, value, wall_time), ...]} from the event files in ``logdir``.

  Points an interrupted run logged past its last checkpoint are dropped, as
  TensorBoard does (the resumed run marks its restart step).
  """
  if not pathlib.Path(logdir).is_dir():
    return {}
  acc = metrics.load_events(logdir)
  return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
          for tag in acc.Tags()["scalars"]}


def _lengths_files(workdir: pathlib.Path) -> list[pathlib.Path]:
  """``evaluate --lengths`` results (``<split>-<step>.lengths.json``), oldest step first."""
  return sorted((workdir / "eval").glob("*.lengths.json"),
                key=lambda p: int(p.name.split("-")[-1].split(".")[0])
                if p.name.split("-")[-1].split(".")[0].isdigit() else -1)


def latest_lengths(workdir: pathlib.Path) -> list[dict[str, Any]] | None:
  """Rows of the newest ``evaluate --lengths`` result in the run, if any."""
  files = _lengths_files(workdir)
  return json.loads(files[-1].read_text()) if files else None


def lengths_split(workdir: pathlib.Path) -> str | None:
  """The split of the newest ``evaluate --lengths`` result (``validation``, ``test``)."""
  files = _lengths_files(workdir)
  return files[-1].name.rsplit("-", 1)[0] if files else None


def scaled_lengths(workdir: pathlib.Path) -> dict[str, dict[int, float]]:
  """``evaluate --lengths --rope_scaling`` results at the run's newest evaluated
  step: {"rope-yarn-x8-from64": {multiple: perplexity}}."""
  found: dict[str, tuple[int, pathlib.Path]] = {}
  for path in (workdir / "eval").glob("*.lengths.rope-*.json"):
    head, _, tag = path.name[:-len(".json")].partition(".lengths.")
    step = head.rsplit("-", 1)[-1]
    if step.isdigit() and int(step) >= found.get(tag, (-1, None))[0]:
      found[tag] = (int(step), path)
  return {tag: {int(r["multiple"]): r.get("perplexity")
                for r in json.loads(path.read_text())}
          for tag, (_, path) in sorted(found.items())}


def split_metrics(workdir: pathlib.Path, split: str) -> dict[str, float]:
  """The newest ``python -m tfx_jax.evaluate --split SPLIT`` metrics of a run
  (``eval/<split>-<step>.json``) under the in-training names (``eval/loss``,
  ``eval/loss_se``, ``eval/bleu``, ``eval/bleu_se``, ...); {} if there is none."""
  found = []
  for path in (workdir / "eval").glob(f"{split}-*.json"):
    step = path.name[len(split) + 1:-len(".json")]
    if step.isdigit():
      found.append((int(step), path))
  if not found:
    return {}
  metrics = json.loads(max(found)[1].read_text())
  return {(k if k.startswith("eval/") else f"eval/{k}"): float(v)
          for k, v in metrics.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)
          and k not in ("step", "num_examples", "beam_size")}


def join_trunk(trunk: dict[str, list[tuple[int, float, float]]],
               own: dict[str, list[tuple[int, float, float]]], branch_step: int
               ) -> dict[str, list[tuple[int, float, float]]]:
  """A branched budget's scalars as one run's: its trunk's up to the branch
  step (the step-0 evaluation among them), then its own after it (its own
  logs start at the branch step, where it restored the trunk's checkpoint)."""
  out = {}
  for tag in dict.fromkeys([*trunk, *own]):
    out[tag] = ([p for p in trunk.get(tag, []) if p[0] <= branch_step]
                + [p for p in own.get(tag, []) if p[0] > branch_step])
  return out


def branch_of(workdir: pathlib.Path, entry: RunEntry, status: status_lib.Status | None,
              record: SweepRecord | None = None) -> tuple[pathlib.Path, int] | None:
  """(the trunk's workdir, the branch step) of a branched budget's run; None:
  it ran from scratch. status.json's ``branch_from`` and ``branch_step``
  where the run wrote them (a status of a version before branching has
  neither), else the record's: the entry's ``trunk`` (its workdir beside the
  run's, also where a moved sweep directory no longer has status.json's
  path), at its point's branch step in the ladder's plan or its
  ``train.branch_step`` override."""
  path, step = getattr(status, "branch_from", None), getattr(status, "branch_step", None)
  trunk = pathlib.Path(path) if path else None
  if entry.trunk and (trunk is None or not trunk.is_dir()):
    trunk = workdir.parent / entry.trunk
  if step is None:
    count = (record.ladder.point(record.point_key(entry))
             if record is not None and record.ladder is not None else None)
    step = count.branch_step if count is not None else None
    if step is None and entry.overrides.get("train.branch_step"):
      step = int(entry.overrides["train.branch_step"])
  return None if trunk is None or step is None else (trunk, int(step))


def read_run(workdir: pathlib.Path, entry: RunEntry, record: SweepRecord | None = None
             ) -> RunSummary:
  """The figures of one run that the report aggregates (``RunSummary``: what
  each field holds), read from its workdir and its sweep.json entry. A
  branched budget of a ladder (``branch_of``) reads as a whole run: its
  trunk's curves up to the branch step and the trunk's step-0 evaluation
  joined to its own (``join_trunk``); its status, time and cost are its own."""
  status = status_lib.read_status(workdir)
  own = read_scalars(workdir / "tensorboard")
  scalars = own
  branch = branch_of(workdir, entry, status, record)
  if branch is not None:
    scalars = join_trunk(read_scalars(branch[0] / "tensorboard"), own, branch[1])
  final = {tag: points[-1][1] for tag, points in scalars.items()
           if tag.startswith("eval/") or tag == "train/nll"}
  tps = [v for _, v, _ in scalars.get("train/tokens_per_sec", [])[1:]]
  walls = [w for points in own.values() for _, _, w in points]  # its own time
  wall = entry.wall_seconds or ((max(walls) - min(walls)) if walls else None)
  lengths, window_tokens = {}, {}
  for row in latest_lengths(workdir) or []:
    lengths[int(row["multiple"])] = row.get("perplexity")
    if row.get("length"):
      window_tokens[int(row["multiple"])] = int(row["length"])
  layer: dict[str, dict[tuple[str, int], float]] = {}
  layer_steps = set()
  for tag, points in scalars.items():
    m = LAYER_TAG.match(tag)
    if m and points:
      first = min(points)
      kind = m.group(1) if m.group(2) is None else f"{m.group(1)}/{m.group(2)}"
      layer.setdefault(kind, {})[(m.group(3), int(m.group(4)))] = first[1]
      if m.group(1) != INIT_KIND:  # those are at step 0, before any update
        layer_steps.add(int(first[0]))
  return RunSummary(
      state=status.state if status else entry.state,
      step=status.step if status else 0,
      final=final,
      initial={tag: points[0][1] for tag, points in scalars.items()
               if tag.startswith("eval/") and points and points[0][0] == 0},
      curves={t: [(s, v) for s, v, _ in scalars[t]]
              for t in ("train/loss", "train/nll", "eval/loss", metrics.SUBSET_LOSS)
              if t in scalars},
      tokens_per_sec=statistics.median(tps) if tps else None,
      wall_seconds=wall,
      compile_seconds=(entry.compile_seconds if status is None
                       or status.compile_seconds is None else status.compile_seconds),
      lengths=lengths,
      window_tokens=window_tokens,
      scaled_lengths=scaled_lengths(workdir),
      lengths_split=lengths_split(workdir),
      layer_stats=layer,
      layer_stats_step=min(layer_steps) if layer_steps else None,
      training=training_signals(scalars),
      test=split_metrics(workdir, "test"),
      num_params=status.num_params if status else None,
      budgets=dict((status.budgets if status else None) or {}),
      seconds=dict((status.seconds if status else None) or {}),
      cores=status.cores if status else None,
      step_seconds=step_seconds(status, branch[1] if branch else 0),
      train_step_memory=dict((status.train_step_memory if status else None) or {}),
      peak_rss_bytes=status.peak_rss_bytes if status else None)


def step_seconds(status: status_lib.Status | None, start_step: int = 0) -> float | None:
  """A train step's seconds: status.json's ``train_steps`` phase (the loop's
  time less its compilation, evaluations and checkpointing; input batches
  and logging included) over the steps from ``start_step`` (0, or a branched
  budget's branch step) to its last; None where either is not recorded. The
  steps an interrupted attempt took after its last checkpoint are taken
  again and counted once, so a resumed run's figure errs high by them."""
  seconds = (status.seconds or {}).get("train_steps") if status else None
  steps = status.step - start_step if status else 0
  if not seconds or steps <= 0:
    return None
  return float(seconds) / steps


def shown_layer_kind(summaries: Iterable[RunSummary]) -> str | None:
  """The per-layer statistic a report shows of runs' summaries: the gradient
  norm at initialisation (``init_grad_norm/<param>``) where runs logged it,
  else the gradient norm over every array, else over one part; None without any."""
  kinds = sorted({k for s in summaries for k in s.layer_stats})
  for prefix in (INIT_KIND + "/", "grad_norm"):
    chosen = [k for k in kinds if k.startswith(prefix)]
    if chosen:
      return "grad_norm" if "grad_norm" in chosen else chosen[0]
  return None


def layer_kind_when(kind: str, summaries: Iterable[RunSummary]) -> tuple[str, str]:
  """(title, when) of a per-layer statistic ``kind`` of runs' summaries, e.g.
  ("at initialisation", "step 0, before the first update, ...")."""
  if kind.startswith(INIT_KIND + "/"):
    return ("at initialisation", "step 0, at the initial parameters, the mean over the "
            "first `train.layer_stats_init_batches` training batches")
  steps = sorted({s.layer_stats_step for s in summaries if s.layer_stats_step is not None})
  if steps == [1]:
    return ("at initialisation, one batch", "step 1, the first update, whose "
            "gradients are taken at the initial parameters, on one batch")
  return ("at the first logged step",
          f"step {', '.join(map(str, steps))}, after that many updates (runs made with "
          "`train.layer_stats_init_batches` > 0 log the statistics at initialisation)")


def as_trained(sweep_dir: pathlib.Path, record: SweepRecord) -> SweepRecord:
  """``record`` with each run's overrides and tuned values those its process
  trained with: its ``run_spec.json`` (``records.run_spec``), where it was
  started from one, else its sweep.json entry (a run started before specs
  were written, whose command line carried the entry's values, or one not
  started yet). sweep.json holds the latest invocation's overrides; a run
  finished under an earlier one keeps its own. Returns ``record``, its
  entries updated in place."""
  for entry in record.runs:
    spec = run_spec.read(sweep_dir / entry.name)
    if spec is not None:
      entry.overrides, entry.tuned = spec.config_overrides, spec.tuned
  return record


def collect(sweep_dir: pathlib.Path) -> tuple[SweepRecord, dict[str, RunSummary]]:
  """(sweep.json's record, each run's values those it trained with
  (``as_trained``); {run name: ``read_run``}, a branched ladder's trunk
  runs too, whose cost is the ladder's) of a sweep directory."""
  record = sweep_record.read(sweep_dir)
  if record is None:
    raise FileNotFoundError(f"{sweep_dir / sweep_record.FILENAME} does not exist: not a "
                            "sweep directory.")
  as_trained(sweep_dir, record)
  return record, {e.name: read_run(sweep_dir / e.name, e, record)
                  for e in [*record.runs, *record.trunks]}
