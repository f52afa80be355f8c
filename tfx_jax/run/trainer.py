"""``train_and_evaluate(config, workdir)``: the training loop.

What the config means (validation, data, mesh, state, the steps) lives in
``run_setup``; this module only runs it: resume or initialise, step, log,
evaluate, checkpoint, stop on a signal or a non-finite loss. Everything a run
needs to continue lives in its workdir:

  workdir/config.json          the full config (read by evaluate / generate)
  workdir/optimizer_groups.json  optim.optimizer=muon: each parameter's group
  workdir/status.json          running | finished | diverged | failed | preempted,
                               where the time went (status.Seconds), what the
                               train step and the process weighed
  workdir/checkpoints/<step>/  params, optimizer, RNG, data-iterator position
  workdir/tensorboard/         event files (train/*, eval/*, config, hparams)
  workdir/eval/                the evaluations asked for after training
                               (``evaluations``: tfx_jax.evaluate's files)

A run may start from another run's checkpoint instead of initialising
(``train.branch_from``, a budget's decay from a WSD trunk: run/branch.py) and
may stop before its schedule ends (``train.stop_step``, the trunk).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from typing import Sequence

from absl import logging
from flax import traverse_util
import jax
import ml_collections
import numpy as np

from tfx_jax.run import branch as branch_lib
from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import evaluation
from tfx_jax.run import footprint
from tfx_jax.core import atomic as files
from tfx_jax.run import layer_stats
from tfx_jax.run import metrics as metrics_lib
from tfx_jax.run import muon
from tfx_jax.run import param_groups
from tfx_jax.run import config as run_config
from tfx_jax.run import setup as run_setup
from tfx_jax.run import sharding as sharding_lib
from tfx_jax.records import status as status_lib
from tfx_jax import tasks
from tfx_jax.run.config_base import base_config
from tfx_jax.data import shards as shards_lib
from tfx_jax.data import sources
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.layers import moe
from tfx_jax.model.families import build_model
from tfx_jax.core.preemption import Preemption
from tfx_jax.run.pretrained import load_pretrained
from tfx_jax.run.trained_run import TrainedRun

# Beside config.json where the optimizer has parameter groups (muon).
OPTIMIZER_GROUPS = "optimizer_groups.json"
HPARAM_METRICS = ["eval/loss", "eval/perplexity", "eval/accuracy", "eval/bpb"]


@dataclasses.dataclass
class RunResult:
  status: str  # finished | diverged | preempted
  step: int
  metrics: dict  # last eval metrics


def _console(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


def _write_status(workdir, state: str, step: int, **fields) -> None:
  """``status.json``, written by process 0 only (one writer per workdir)."""
  if jax.process_index() == 0:
    status_lib.write_status(workdir, state, step, **fields)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       evaluations: Sequence[Sequence[str]] = (),
                       started: float | None = None,
                       first_hparams: Sequence[str] = ()) -> RunResult:
  """Trains ``config`` in ``workdir``, resuming from its latest checkpoint.

  ``evaluations``: argument lists of ``python -m tfx_jax.evaluate`` without
  --workdir (``[["--split", "test"]]``), run in this process after the last
  step, on the final parameters, with the command's results and files; each
  once (``status.evaluation_marker``), so a finished run started again runs only
  those missing, from its checkpoint. They are checked before anything is
  compiled. ``started``: when the process started (``status.process_start``),
  where the run's ``startup`` seconds begin; default: now. ``first_hparams``:
  the config fields TensorBoard's HParams view lists first (a sweep's axes and
  tuned fields, ``RunSpec.compared_fields``).
  """
  started = time.time() if started is None else started
  run = run_config.resolve(config)
  requests = [(tuple(args), evaluation.parse_request(args)) for args in evaluations]
  for _, request in requests:
    evaluation.check(request, run)
  run_setup.check_devices(run)
  workdir_path = ckpt_lib.ensure_writable(workdir)
  run_config.log_notes(run)
  ckpt = ckpt_lib.Checkpointer(workdir_path / "checkpoints",
                               max_to_keep=run.checkpoint.max_to_keep,
                               keep_steps=run.checkpoint.keep_steps)
  loop = _TrainingLoop(run, workdir_path, ckpt, requests, started, first_hparams)
  try:
    return loop.run()
  except KeyboardInterrupt:
    # A second signal, or one before the loop: nothing new was saved, and the
    # same command resumes from the last checkpoint.
    step = _last_step(ckpt)
    _write_status(workdir_path, "preempted", step,
                  reason=f"interrupted; resumes from step {step}", **loop.timing())
    raise
  except ConfigError:
    raise  # bad input: the workdir's previous status still holds
  except Exception as e:
    _write_status(workdir_path, "failed", _last_step(ckpt),
                  reason=f"{type(e).__name__}: {e}", **loop.timing())
    raise
  finally:
    loop.close()  # what was logged before a failure is kept
    ckpt.close()


def _last_step(ckpt) -> int:
  """The step of the newest checkpoint, once the pending saves are written."""
  try:
    ckpt.wait()
    return int(ckpt.latest_step() or 0)
  except Exception:  # pylint: disable=broad-except
    return 0


class _TrainingLoop:
  """One run of the loop: built in ``run()``, then stepped until done."""

  def __init__(self, config: run_config.RunConfig, workdir: pathlib.Path, ckpt,
               requests: Sequence[tuple[tuple[str, ...], evaluation.Request]] = (),
               started: float | None = None, first_hparams: Sequence[str] = ()):
    self.config, self.model_cfg, self.workdir, self.ckpt = config, config.model, workdir, ckpt
    self.first_hparams = tuple(first_hparams)
    self.requests, self.started = list(requests), time.time() if started is None else started
    # Where the time goes, added to what earlier attempts in this workdir spent.
    self.previous = status_lib.read_status(workdir)
    self.seconds = status_lib.Seconds(self.previous.seconds if self.previous else None)
    # The dataset's version (a files corpus's key) is recorded with every
    # checkpoint, so that a resume never reads another version's splits or
    # tokenizer.
    self.flat_config = {**run_config.flatten_config(config),
                        "data.version": sources.data_version(config.data)}
    self.is_chief = jax.process_index() == 0
    self.task = tasks.get(config.task)
    self.num_skipped, self.step_memory = 0, None  # the compiled step's bytes (status.json)
    self.last_eval: dict = {}
    self.writer = None
    self.branch = None  # the checkpoint of another run this one starts from
    # A branched run's status says where it branched, also once it resumes
    # from checkpoints of its own.
    self.branched = ({"branch_from": self.previous.branch_from,
                      "branch_step": self.previous.branch_step}
                     if self.previous and self.previous.branch_from else {})

  def timing(self) -> dict:
    """What every status.json write carries: ``seconds`` (this attempt's
    added), ``cores`` and, for a branched run, ``branch_from`` (the trunk's
    workdir) and ``branch_step``."""
    return {"seconds": self.seconds.to_json(), "cores": _cores(), **self.branched}

  def close(self) -> None:
    """Writes and closes the event files (closing twice is a no-op)."""
    if self.writer is not None:
      self.writer.close()

  # ---------------------------------------------------------------- set up
  def _resume_point(self):
    """The newest readable checkpoint's step (None: start afresh, or from
    ``train.branch_from``'s checkpoint, then checked: ``self.branch``)."""
    latest = self.ckpt.latest_step()
    if latest is not None:
      # Damaged checkpoints are set aside with a warning.
      latest, saved = self.ckpt.read_latest_config()
      self._check_saved(saved, run_config.RESUME_FIELDS, f"the checkpoint in {self.workdir}",
                        "resumed")
    elif self.config.train.branch_from:
      self.branch = point = branch_lib.find(self.config.train)
      self._check_saved(point.config, branch_lib.FIELDS,
                        f"train.branch_from's checkpoint ({point.describe()})",
                        "branched from", hint="set them as the trunk has them")
      branch_lib.check_optimizer(point, self.config, self.flat_config)
      self.branched = {"branch_from": str(point.workdir), "branch_step": point.step}
    return latest

  def _check_saved(self, saved: dict, fields, what: str, action: str,
                   hint: str = "") -> None:
    """A checkpoint's saved config against this run's: ConfigError where they
    disagree on ``fields`` or the corpus (``what`` cannot be ``action``; the
    error's ``hint``: what to do, by default check_compatible's)."""
    # Fields added to the config since the checkpoint was written take their
    # defaults, which keep the behaviour the checkpoint was trained with.
    saved = run_config.resume_view({**run_config.flatten_config(base_config()), **saved})
    current = run_config.resume_view(self.flat_config)
    if "data.version" not in saved:
      # Written before versions were recorded: an embedded dataset was then at
      # its first version, whose splits and tokenizer may differ from this one's.
      if sources.embedded_version(self.config.data.name) not in (None, "1.0.0"):
        logging.warning(
            "%s does not record its dataset's version; if it was trained on %s "
            "before version %s (at 1.0.0), run it with --config.data.name=%s:1.0.0 "
            "to read the same data and tokenizer.",
            what, current["data.name"], current["data.version"], current["data.name"])
      current.pop("data.version")
    changed = sources.version_change(self.config.data, saved)
    if changed:
      raise ConfigError(f"{what} was trained on another corpus and cannot be {action}: "
                        f"{changed}; or use a new workdir.")
    ckpt_lib.check_compatible(
        saved, current, fields,
        lead=f"{what} was written with a different config and cannot be {action}",
        **({"hint": hint} if hint else {}))

  def _build(self, latest):
    name = sources.pinned_name(self.config.data, self.flat_config["data.version"])
    if name != self.config.data.name:
      # A files corpus is read as converted when the run started, even if its
      # files change while it runs (a later run then refuses to resume).
      self.config = self.config.with_data_name(name)
    config = self.config
    self.tokenizer = run_setup.load_tokenizer(config)
    run_setup.check_data(config)
    self.sharded = sharded = run_setup.ShardedRun(
        config, self.model_cfg, byte_lengths=self.tokenizer.byte_lengths())
    restored = (self.ckpt.restore(abstract_state=sharded.abstract_state)
                if latest is not None else
                branch_lib.restore(self.branch, sharded.abstract_state)
                if self.branch is not None else None)
    # data.num_shards=0 is one shard per process at the start; a resumed run
    # keeps the shard count its data position was written with.
    self.num_shards = int(config.data.num_shards) or (
        jax.process_count() if restored is None
        else shards_lib.shard_count_of(restored.data_state))
    if self.num_shards != (int(config.data.num_shards) or jax.process_count()):
      run_setup.check_devices(config, num_shards=self.num_shards)
    self.train_iter = iter(run_setup.make_data(config, self.tokenizer, "train", train=True,
                                               num_shards=self.num_shards))
    if restored is not None:
      self.state = restored.state
      self.train_iter.set_state(restored.data_state)
      _console(f"Resumed from step {int(self.state.step)} of {self.workdir / 'checkpoints'}."
               if self.branch is None else
               f"Branched from {self.branch.describe()} (train.branch_from); the decay "
               f"to step {config.train.num_steps} runs here.")
    else:
      self.state = sharded.init_state()
      if config.finetune.init_checkpoint:
        self.state = load_pretrained(self.state, config.finetune.init_checkpoint,
                                     self.flat_config, sharded.state_shardings.params,
                                     log=_console)
    if self.is_chief:
      files.write_json(self.workdir / "config.json", config.to_dict())
    self._show_parameter_groups()
    self.num_params = sum(int(np.prod(x.shape))
                          for x in jax.tree.leaves(sharded.abstract_state.params))
    shapes = traverse_util.flatten_dict(sharded.abstract_state.params, sep="/")
    self.budgets = footprint.budgets(self.model_cfg, config.train.seq_len, shapes)
    self.eval_step = sharded.eval_step()
    self.sample_inputs = (self.task.sample_inputs(config)
                          if self.task.sample_inputs else [])
    self.writer = metrics_lib.MetricWriter(self.workdir / "tensorboard",
                                           is_chief=self.is_chief)

  def _show_parameter_groups(self) -> None:
    """Where the optimizer has several update rules (muon), which parameters
    each gets: printed, and written to ``optimizer_groups.json`` beside the
    config."""
    if self.sharded.groups is not None and self.is_chief:  # model.parametrization
      _console(param_groups.format_groups(self.sharded.groups))
    groups = self.config.optim.parameter_groups(self.sharded.abstract_state.params)
    if groups is None or not self.is_chief:
      return
    path = self.workdir / OPTIMIZER_GROUPS
    files.write_json(path, {"optimizer": self.config.optim.optimizer, "groups": groups})
    _console(f"Parameter groups of optim.optimizer={self.config.optim.optimizer} "
             f"(also in {path}):\n" + muon.format_assignment(groups))

  def _compile(self, batch) -> float:
    """AOT-compiles the train step for the batch shape; returns the seconds."""
    start = time.time()
    # The tuned optimizer values are an argument (optim.Hyperparameters): one
    # program, from the persistent cache, for every value of them.
    self.hparams = self.sharded.step_hparams()
    self.train_step = self.sharded.train_step().lower(self.state, batch,
                                                      self.hparams).compile()
    seconds = time.time() - start
    self.step_memory = status_lib.compiled_memory(self.train_step)  # read, not compiled again
    self.seconds.add("compile", seconds)
    _console(f"Compiled the train step in {seconds:.2f} s.")
    return seconds

  # ---------------------------------------------------------------- the run
  def run(self) -> RunResult:
    config, t = self.config, self.config.train
    latest = self._resume_point()
    if latest is not None and latest >= t.end_step:
      pending = evaluation.pending(self.workdir, self.requests)
      _console(f"Run in {self.workdir} already finished at step {latest} "
               f"({_length(t)}); " + (
                   f"{len(pending)} evaluation(s) to run from its checkpoint."
                   if pending else "nothing to do."))
      self.seconds.add("startup", time.time() - self.started)
      self._evaluate_after(latest, live=False)
      kept = {k: getattr(self.previous, k) for k in (
          "num_nonfinite_skipped", "num_params", "compile_seconds", "budgets",
          "train_step_memory", "peak_rss_bytes")} if self.previous else {}
      _write_status(self.workdir, "finished", latest, reason="already finished", **kept,
                    **self.timing())
      return RunResult("finished", latest, {})
    self._build(latest)
    step = start_step = int(self.state.step)
    fresh = latest is None  # nothing of this workdir's own to resume (or branched)
    if not fresh or self.writer.had_events:
      # Points that an attempt killed after its last checkpoint (or before its
      # first) logged past ``start_step`` are logged again: drop the old ones;
      # a run without a checkpoint of its own (afresh, or branched) logs its
      # step 0 again too (the config, the hparams, the evaluation at
      # initialisation), so from step 0 on.
      self.writer.mark_restart(0 if fresh else start_step + 1)
    if fresh:
      self.writer.write_config_text(ml_collections.ConfigDict(config.to_dict()))
      self.writer.write_hparams(self.flat_config, HPARAM_METRICS,
                                first=self.first_hparams)
    _write_status(self.workdir, "running", start_step, **self.timing())
    compile_seconds = None
    self.timer = (step, time.time(), 0.0)  # step, time, tokens since the last log
    pending = None  # the previous step's metrics, read one step late (no stall)
    outcome, reason = "finished", ""
    self.seconds.add("startup", time.time() - self.started)
    loop_start, outside_steps = time.perf_counter(), self._outside_steps()
    with Preemption() as preempt:
      if start_step == 0 and config.eval.at_start:
        # The loss at initialisation (eval.at_start): one evaluation before
        # the first update, the l0 of the report's learning-rate sensitivity.
        self._eval_and_report(0, samples=False)
      if start_step == 0 and t.layer_stats_init_batches:
        self._log_init_layer_stats()
      while step < t.end_step:
        batch = next(self.train_iter)
        tokens = float(np.sum(batch["inputs"] > 0))
        if "decoder_inputs" in batch:
          tokens += float(np.sum(batch["decoder_inputs"] > 0))
        self.timer = (*self.timer[:2], self.timer[2] + tokens)
        batch = sharding_lib.global_batch(batch, self.sharded.mesh)
        if compile_seconds is None:
          compile_seconds = self._compile(batch)
          _write_status(self.workdir, "running", start_step,
                        compile_seconds=round(compile_seconds, 3),
                        num_params=self.num_params, budgets=self.budgets,
                        train_step_memory=self.step_memory, **self.timing())
          self.timer = (self.timer[0], time.time(), self.timer[2])
        self.state, metrics = self.train_step(self.state, batch, self.hparams)
        step += 1
        if pending is not None and self._stops(*pending):
          step = pending[1]
          outcome, reason = "diverged", f"non-finite loss or gradient at step {step}"
          break
        pending = (metrics, step)
        # With layer statistics a fresh run also logs its first update, whose
        # gradients are taken at the initial parameters (Xiong et al.'s Figure 3).
        first_update = step == 1 and start_step == 0 and t.log_layer_stats
        is_log = step % t.log_every_steps == 0 or step == t.end_step or first_update
        # A trunk stopped at train.stop_step is no budget: no final evaluation.
        is_eval = step % config.eval.every_steps == 0 or step == t.num_steps
        is_save = (step % config.checkpoint.every_steps == 0
                   or step in config.checkpoint.keep_steps)
        stop_signal = preempt.signal  # read once: a later signal waits a step
        if not (is_log or is_eval or is_save or stop_signal is not None):
          continue
        # Check this step now: never evaluate or checkpoint non-finite params.
        m, pending = jax.device_get(metrics), None
        if self._stops(m, step):
          outcome, reason = "diverged", f"non-finite loss or gradient at step {step}"
          break
        if is_log:
          self._log(step, m)
        if is_eval:
          self._eval_and_report(step)
        if is_save:
          self._save(step)
        if stop_signal is not None:
          outcome, reason = "preempted", f"received {stop_signal}"
          break
    # The steps' time: the loop's, less what it spent compiling, evaluating and
    # checkpointing (counted in their own phases).
    self.seconds.add("train_steps", time.perf_counter() - loop_start
                     - (self._outside_steps() - outside_steps))
    if outcome == "finished" and step < t.num_steps:
      reason = (f"stopped at train.stop_step={t.stop_step}, on the schedule of "
                f"train.num_steps={t.num_steps}")
    result = self._finish(outcome, reason, step, compile_seconds)
    if result.status == "finished" and evaluation.pending(self.workdir, self.requests):
      self._evaluate_after(step, live=True)
      _write_status(self.workdir, "finished", step, reason=reason, **self._extra,
                    **self.timing())
    return result

  def _outside_steps(self) -> float:
    return sum(self.seconds.seconds[p] for p in ("compile", "evaluations", "checkpointing"))

  def _evaluate_after(self, step: int, live: bool) -> None:
    """The evaluations after training not done yet, on the final parameters:
    live (just trained) or, ``live`` False, restored from the checkpoint."""
    final = (TrainedRun(self.workdir, self.config, self.model_cfg, self.tokenizer,
                        self.state.params, step, self.sharded) if live else None)
    with self.seconds.timed("evaluations"):
      evaluation.after_training(self.workdir, self.requests, step, final, log=_console)

  def _stops(self, metrics, at_step) -> bool:
    """Non-finite handling of a finished step; True to stop the run."""
    if bool(metrics["finite"]):
      return False
    if self.config.train.on_nonfinite == "skip":
      self.num_skipped += 1
      self.writer.write_scalars(at_step, {"train/nonfinite_skipped": self.num_skipped})
      logging.warning("non-finite loss or gradient at step %d: update skipped "
                      "(%d so far)", at_step, self.num_skipped)
      return False
    return True

  def _log(self, step, m) -> None:
    t = self.config.train
    last_step, last_time, tokens = self.timer
    now = time.time()
    elapsed = max(now - last_time, 1e-9)
    tok_per_sec = tokens * jax.process_count() / elapsed
    scalars = {"train/loss": float(m["loss"]), "train/nll": float(m["nll"]),
               "train/output_log_z": float(m["output_log_z"]),
               "train/learning_rate": float(m["learning_rate"]),
               "train/grad_norm": float(m["grad_norm"]),
               "train/tokens_per_sec": tok_per_sec}
    if t.z_loss:
      scalars["train/z_loss"] = float(m["z_loss"])
    if t.qk_clip:
      scalars["train/qk_clip_fraction"] = float(m["qk_clip_fraction"])
    scalars.update(layer_stats.tags(m))
    scalars.update(moe.log_scalars(m, self.model_cfg))
    self.writer.write_scalars(step, scalars)
    eta = (t.end_step - step) / max((step - last_step) / elapsed, 1e-9)
    _console(f"step {step:>6}/{t.end_step}  loss {float(m['loss']):.4f}  "
             f"{tok_per_sec:,.0f} tok/s  ETA {_fmt_time(eta)}")
    self.timer = (step, now, 0.0)

  def _log_init_layer_stats(self) -> None:
    """Each layer's gradient norm at the initial parameters, the mean over the
    first ``train.layer_stats_init_batches`` training batches (read from a
    pipeline of their own: training still starts at the first), logged at step
    0 as ``layer_stats/init_grad_norm/<param>/<stack>_<NN>`` (run/layer_stats.py)."""
    config, t = self.config, self.config.train
    model = build_model(self.model_cfg, deterministic=False)
    objective = self.task.objective(config, self.model_cfg.family, train=True)
    grad_norms = jax.jit(layer_stats.make_grad_norms(model, self.task, objective,
                                                     t.layer_stats_param))
    batches = (sharding_lib.global_batch(b, self.sharded.mesh) for b in run_setup.make_data(
        config, self.tokenizer, "train", train=True, num_shards=self.num_shards))
    means = layer_stats.mean_init_grad_norms(grad_norms, self.state.params, batches,
                                             self.state.rng, t.layer_stats_init_batches)
    key = f"layer_stats/{layer_stats.INIT_KIND}/{t.layer_stats_param}"
    self.writer.write_scalars(0, layer_stats.tags({key: means}))
    _console(f"Gradient norms per layer at initialisation ({t.layer_stats_param}, mean "
             f"of {t.layer_stats_init_batches} batches) logged at step 0.")

  def _eval_and_report(self, step, samples: bool = True) -> None:
    """eval/* on a fixed validation sample (eval.num_batches; the last one of
    training: eval.final_batches), plus the task's generated samples
    (``samples``: off at step 0, where an untrained model's text says nothing)."""
    start = time.time()
    config = self.config
    data = run_setup.make_data(config, self.tokenizer, "validation", train=False,
                               num_shards=self.num_shards)
    batches = config.eval.batches_at(step, config.train.num_steps)
    subset = None
    if batches == config.eval.num_batches:
      sums = run_setup.evaluate_batches(self.eval_step, self.state.params, data,
                                        self.sharded.mesh, max_batches=batches)
    else:  # the final pass: more than the subset, whose sums it gives too
      subset, sums = run_setup.evaluate_subset_and_pass(
          self.eval_step, self.state.params, data, self.sharded.mesh,
          subset=config.eval.num_batches, max_batches=batches)
    if sums is None:
      raise ConfigError(f"the validation split of {config.data.name} is empty.")
    self.last_eval = tasks.metrics_from_sums(self.task, sums)
    if subset is not None:
      # The subset's loss at the last step beside the whole pass's: the
      # evaluations before it read the subset (the still-improving check).
      self.writer.write_scalars(step, metrics_lib.subset_tags(
          tasks.metrics_from_sums(self.task, subset)))
    if self.sample_inputs and samples:
      run = TrainedRun(self.workdir, config, self.model_cfg, self.tokenizer,
                     self.state.params, step, self.sharded)
      scalars, texts = self.task.sample_report(run, self.sample_inputs, config)
      self.writer.write_texts(step, texts)
      self.last_eval.update(scalars)
    self.writer.write_scalars(step, self.last_eval)
    _console(f"step {step:>6}  " + "  ".join(
        f"{k} {v:.4f}" for k, v in self.last_eval.items()))
    # train/tokens_per_sec excludes evaluation time.
    last_step, last_time, tokens = self.timer
    self.timer = (last_step, last_time + time.time() - start, tokens)
    self.seconds.add("evaluations", time.time() - start)

  def _save(self, step, force=False) -> None:
    # Metrics up to a checkpoint must survive a kill -9 as the checkpoint does:
    # a resumed run logs only the steps after it.
    with self.seconds.timed("checkpointing"):
      self.writer.flush()
      self.ckpt.save(step, self.state, self.train_iter.get_state(), self.flat_config,
                     force=force)

  def _finish(self, outcome, reason, step, compile_seconds) -> RunResult:
    # The process's peak resident memory at the end of training, the largest
    # of every attempt's (an evaluation after training comes after it).
    peaks = [p for p in (status_lib.peak_rss_bytes(),
                         self.previous.peak_rss_bytes if self.previous else None) if p]
    extra = {"num_nonfinite_skipped": self.num_skipped, "num_params": self.num_params,
             "budgets": self.budgets, "train_step_memory": self.step_memory,
             "peak_rss_bytes": max(peaks) if peaks else None}
    if compile_seconds is not None:
      extra["compile_seconds"] = round(compile_seconds, 3)
    self._extra = extra
    if outcome == "diverged":
      self.writer.flush()
      with self.seconds.timed("checkpointing"):
        self.ckpt.wait()
      _write_status(self.workdir, "diverged", step, reason=reason, **extra,
                    **self.timing())
      _console(f"Run diverged: {reason}. Status written to "
               f"{self.workdir / 'status.json'}.")
      self.writer.close()
      return RunResult("diverged", step, self.last_eval)
    self._save(step, force=True)
    with self.seconds.timed("checkpointing"):
      self.ckpt.wait()
    self.writer.close()
    _write_status(self.workdir, outcome, step, reason=reason, **extra, **self.timing())
    if outcome == "preempted":
      _console(f"{reason}: saved a checkpoint at step {step}; run the same command "
               "to resume.")
    elif reason:
      _console(f"Finished: {reason}. Checkpoints: {self.workdir / 'checkpoints'}")
    else:
      _console(f"Finished at step {step}. Checkpoints: {self.workdir / 'checkpoints'}\n"
               f"TensorBoard logs: {self.workdir / 'tensorboard'}  "
               f"(view with: tensorboard --logdir {self.workdir})")
    return RunResult(outcome, step, self.last_eval)


def _length(t: run_config.TrainConfig) -> str:
  """How far a run trains, as its config says it."""
  if t.stop_step and t.stop_step < t.num_steps:
    return f"train.stop_step={t.stop_step} of train.num_steps={t.num_steps}"
  return f"train.num_steps={t.num_steps}"


def _cores() -> int:
  """What this process computes on: its CPU cores (affinity) on a CPU, else its
  local accelerators (status.json's ``cores``, the report's core-seconds)."""
  if jax.default_backend() != "cpu":
    return jax.local_device_count()
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
      os.cpu_count() or 1)


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
