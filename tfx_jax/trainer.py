"""``train_and_evaluate(config, workdir)``: the training loop.

Flow: locked ConfigDict -> validated ``ModelConfig`` -> mesh + shardings from
``jax.eval_shape`` -> one jitted, donated ``train_step`` -> metric writer and
checkpoint manager. Everything a run needs to continue lives in its workdir:

  workdir/config.json          the full config (read by evaluate / generate)
  workdir/status.json          running | finished | diverged | failed | preempted
  workdir/checkpoints/<step>/  params, optimizer, RNG, data-iterator position
  workdir/tensorboard/         event files (train/*, eval/*, config, hparams)
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import time
from typing import Any, get_args

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from tfx_jax import checkpoint as ckpt_lib
from tfx_jax import metrics as metrics_lib
from tfx_jax import sharding as sharding_lib
from tfx_jax import status as status_lib
from tfx_jax import tasks
from tfx_jax.errors import ConfigError
from tfx_jax.model_config import DType, ModelConfig, model_config_from_dict
from tfx_jax.models import build_model, dummy_inputs
from tfx_jax.optim import make_optimizer, make_schedule

# Config fields a checkpoint must agree on to be resumed: they decide shapes,
# data order or what is learned. Others (num_steps, eval, logging) may change.
RESUME_FIELDS = ("model.", "task", "seed", "data.name", "data.tokenizer",
                 "data.vocab_size", "data.mask_rate", "train.batch_size",
                 "train.seq_len", "optim.optimizer", "optim.accumulate_steps")
NONFINITE_CHOICES = ("stop", "skip")
EVAL_SEED = 0


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32 PRNG key; step keys are fold_in(rng, step)


@dataclasses.dataclass
class RunResult:
  status: str  # finished | diverged | preempted
  step: int
  metrics: dict  # last eval metrics


def flatten_config(config) -> dict[str, Any]:
  """{"model.d_model": 128, ...} with JSON-able values."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  flat = flax.traverse_util.flatten_dict(d, sep=".")
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat.items()}


def resolve_model_config(config) -> ModelConfig:
  """``config.model`` (+ compute dtype, task checks) -> validated ModelConfig."""
  model = config.model.to_dict()
  compute_dtype = config.get("compute_dtype")
  if compute_dtype:
    # Checked here so that the message names the field the user set.
    choices = get_args(DType)
    if compute_dtype not in choices:
      raise ConfigError(f"compute_dtype={compute_dtype!r} is not a valid choice; "
                        f"choose one of: {', '.join(choices)}.")
    model["dtype"] = compute_dtype
  cfg = model_config_from_dict(model, seq_len=config.train.seq_len)
  tasks.check_task(config.task, cfg.family)
  if config.task == "classify" and cfg.num_classes < 2:
    raise ConfigError(
        "task='classify' needs model.num_classes >= 2 (the number of labels of "
        f"data.name={config.data.name!r}), got {cfg.num_classes}.")
  return cfg


def validate_run_config(config) -> ModelConfig:
  """Every check that can be made before data is read or anything compiled."""
  cfg = resolve_model_config(config)
  t = config.train

  def need(ok, field, value, what):
    if not ok:
      raise ConfigError(f"{field}={value!r} is not valid: {what}.")

  for name in ("num_steps", "batch_size", "seq_len", "log_every_steps"):
    need(getattr(t, name) > 0, f"train.{name}", getattr(t, name), "must be > 0")
  need(t.seq_len >= 2, "train.seq_len", t.seq_len, "must be >= 2")
  need(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing", t.label_smoothing,
       "must be in [0, 1)")
  need(t.on_nonfinite in NONFINITE_CHOICES, "train.on_nonfinite", t.on_nonfinite,
       f"choose one of: {', '.join(NONFINITE_CHOICES)}")
  for name in ("every_steps", "num_batches", "batch_size"):
    need(config.eval[name] > 0, f"eval.{name}", config.eval[name], "must be > 0")
  need(config.checkpoint.every_steps > 0, "checkpoint.every_steps",
       config.checkpoint.every_steps, "must be > 0")
  need(config.checkpoint.max_to_keep > 0, "checkpoint.max_to_keep",
       config.checkpoint.max_to_keep, "must be > 0")
  need(0.0 <= config.finetune.lambda_pt <= 1.0, "finetune.lambda_pt",
       config.finetune.lambda_pt, "must be in [0, 1]")
  need(config.optim.learning_rate > 0, "optim.learning_rate",
       config.optim.learning_rate, "must be > 0")
  need(config.optim.warmup_steps >= 0, "optim.warmup_steps",
       config.optim.warmup_steps, "must be >= 0")
  for name in ("b1", "b2"):
    need(0.0 <= config.optim[name] < 1.0, f"optim.{name}", config.optim[name],
         "must be in [0, 1)")
  need(config.optim.eps > 0, "optim.eps", config.optim.eps, "must be > 0")
  for name in ("num_bleu_examples", "num_samples"):
    need(config.eval[name] >= 0, f"eval.{name}", config.eval[name], "must be >= 0")
  _validate_data(config, need)
  # The mesh is checked against the devices now, not when the state is built.
  mesh = sharding_lib.make_mesh(config.mesh)
  n_proc = jax.process_count()
  n_batch = math.prod(mesh.shape[a] for a in sharding_lib.BATCH_AXES)
  for field in ("train.batch_size", "eval.batch_size"):
    section, name = field.split(".")
    size = config[section][name]
    need(size % n_proc == 0, field, size,
         f"must be divisible by the number of processes ({n_proc})")
    need(size % n_batch == 0, field, size,
         f"must be divisible by the batch axes of the mesh (data x fsdp = {n_batch})")
  # Building the optimizer validates every optim.* choice.
  make_optimizer(config.optim, d_model=cfg.d_model, num_train_steps=t.num_steps)
  return cfg


def _validate_data(config, need) -> None:
  """The data fields that can be checked without reading any data."""
  from tfx_jax.data import tokenizer as tokenizer_lib
  d = config.data
  need(d.tokenizer in tokenizer_lib.TOKENIZER_KINDS, "data.tokenizer", d.tokenizer,
       f"choose one of: {', '.join(tokenizer_lib.TOKENIZER_KINDS)}")
  need(d.vocab_size > 0, "data.vocab_size", d.vocab_size, "must be > 0")
  if config.task == "mlm":
    need(0.0 < d.mask_rate <= 1.0, "data.mask_rate", d.mask_rate, "must be in (0, 1]")


# ------------------------------------------------------------------ the steps
def make_train_step(model_cfg: ModelConfig, config, tx: optax.GradientTransformation,
                    schedule):
  task = config.task
  model = build_model(model_cfg, deterministic=False)
  skip_nonfinite = config.train.on_nonfinite == "skip"
  smoothing = float(config.train.label_smoothing)
  lambda_pt = float(config.finetune.lambda_pt)
  accumulate = int(config.optim.accumulate_steps)

  def train_step(state: TrainState, batch: dict):
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = model.apply({"params": params}, **tasks.model_inputs(task, batch),
                        rngs={"dropout": rng})
      return tasks.loss_and_sums(task, out, batch, label_smoothing=smoothing,
                                 lambda_pt=lambda_pt, family=model_cfg.family)

    (objective, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(objective) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    if skip_nonfinite:
      # Keep parameters and optimizer statistics of the last finite step.
      keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(finite, x, y), a, b)
      new = new.replace(params=keep(params, state.params),
                        opt_state=keep(opt_state, state.opt_state))
    update_count = state.step // accumulate
    metrics = {"loss": objective, "grad_norm": grad_norm, "finite": finite,
               "learning_rate": schedule(update_count), "weight": sums["weight"]}
    return new, metrics

  return train_step


def make_eval_step(model_cfg: ModelConfig, config):
  task = config.task
  model = build_model(model_cfg, deterministic=True)

  def eval_step(params, batch):
    out = model.apply({"params": params}, **tasks.model_inputs(task, batch))
    _, sums = tasks.loss_and_sums(task, out, batch, label_smoothing=0.0,
                                  lambda_pt=float(config.finetune.lambda_pt),
                                  family=model_cfg.family)
    return sums

  return eval_step


def eval_metrics(task: str, sums: dict) -> dict:
  """eval/loss, eval/perplexity, eval/accuracy from summed statistics."""
  w = max(float(sums["weight"]), 1.0)
  loss = float(sums["nll"]) / w
  out = {"eval/loss": loss}
  if tasks.has_perplexity(task):
    out["eval/perplexity"] = float(math.exp(min(loss, 50.0)))
  if tasks.has_accuracy(task):
    out["eval/accuracy"] = float(sums["correct"]) / w
  if "pt_loss" in sums:
    out["eval/pt_loss"] = float(sums["pt_loss"]) / max(float(sums["pt_weight"]), 1.0)
  return out


# ---------------------------------------------------------------- state setup
class Setup:
  """Mesh, abstract state, shardings and the compiled steps of one config."""

  def __init__(self, config, model_cfg: ModelConfig):
    self.config = config
    self.model_cfg = model_cfg
    self.mesh = sharding_lib.make_mesh(config.mesh)
    t = config.train
    self.tx = make_optimizer(config.optim, d_model=model_cfg.d_model,
                             num_train_steps=t.num_steps)
    self.schedule = make_schedule(config.optim, d_model=model_cfg.d_model,
                                  num_train_steps=t.num_steps)
    model = build_model(model_cfg)
    inputs = dummy_inputs(model_cfg, 1, min(t.seq_len, model_cfg.max_len))

    def init_boxed(rng):
      params = model.init({"params": rng}, **inputs)["params"]
      return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                        opt_state=self.tx.init(params), rng=rng)

    self._init_boxed = init_boxed
    key = jax.random.PRNGKey(int(config.seed))
    boxed = jax.eval_shape(init_boxed, key)
    self.state_shardings = sharding_lib.shardings_of(boxed, self.mesh)
    self.abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.unbox(boxed), self.state_shardings)
    self.batch_sharding = sharding_lib.batch_sharding(self.mesh)

  def init_state(self) -> TrainState:
    key = jax.random.PRNGKey(int(self.config.seed))
    init = jax.jit(lambda r: nn.unbox(self._init_boxed(r)),
                   out_shardings=self.state_shardings)
    return init(key)

  def compile_steps(self):
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    train_step = jax.jit(
        make_train_step(self.model_cfg, self.config, self.tx, self.schedule),
        in_shardings=(self.state_shardings, self.batch_sharding),
        out_shardings=(self.state_shardings, replicated), donate_argnums=(0,))
    eval_step = jax.jit(
        make_eval_step(self.model_cfg, self.config),
        in_shardings=(self.state_shardings.params, self.batch_sharding),
        out_shardings=replicated)
    return train_step, eval_step


# ---------------------------------------------------------------------- data
def make_data(config, tokenizer, split: str, *, train: bool):
  from tfx_jax.data import pipeline
  n, i = jax.process_count(), jax.process_index()
  batch = config.train.batch_size if train else config.eval.batch_size
  # Evaluation reads a fixed shuffle of the split (the same for every run and
  # seed): eval.num_batches then samples the whole split, not its first
  # documents (one work, one genre), and runs stay comparable across seeds.
  return pipeline.make_dataset(
      config.data, config.task, split, batch_size=batch // n, seq_len=config.train.seq_len,
      seed=int(config.seed) if train else EVAL_SEED, tokenizer=tokenizer, shard_index=i,
      shard_count=n, shuffle=True, num_epochs=None if train else 1)


def load_tokenizer(config):
  from tfx_jax.data import tokenizer as tokenizer_lib
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  if tok.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tok.vocab_size}, data.tokenizer={config.data.tokenizer!r}); set "
        f"--config.model.vocab_size={tok.vocab_size} or larger.")
  return tok


# ------------------------------------------------------------------ the loop
class _Preemption:
  """Turns SIGTERM / SIGINT into a flag the loop checks after every step."""

  def __init__(self):
    self.signal = None
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave handlers alone
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signal is not None:  # second signal: give up at once
      raise KeyboardInterrupt
    self.signal = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def _console(msg: str) -> None:
  if jax.process_index() == 0:
    print(msg, flush=True)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> RunResult:
  """Trains ``config`` in ``workdir``, resuming from its latest checkpoint."""
  model_cfg = validate_run_config(config)
  workdir_path = ckpt_lib.ensure_writable(workdir)
  flat_config = flatten_config(config)
  is_chief = jax.process_index() == 0
  ckpt = ckpt_lib.Checkpointer(workdir_path / "checkpoints",
                               max_to_keep=config.checkpoint.max_to_keep)
  try:
    return _train(config, model_cfg, workdir_path, flat_config, ckpt, is_chief)
  except KeyboardInterrupt:
    # A second signal, or one before the loop: nothing new was saved, and the
    # same command resumes from the last checkpoint.
    step = _last_step(ckpt)
    status_lib.write_status(workdir_path, "preempted", step,
                            reason=f"interrupted; resumes from step {step}")
    raise
  except ConfigError:
    raise  # bad input: the workdir's previous status still holds
  except Exception as e:
    status_lib.write_status(workdir_path, "failed", _last_step(ckpt),
                            reason=f"{type(e).__name__}: {e}")
    raise
  finally:
    ckpt.close()


def _last_step(ckpt) -> int:
  """The step of the newest checkpoint, once the pending saves are written."""
  try:
    ckpt.wait()
    return int(ckpt.latest_step() or 0)
  except Exception:  # pylint: disable=broad-except
    return 0


def _train(config, model_cfg, workdir: pathlib.Path, flat_config, ckpt, is_chief):
  t = config.train
  latest = ckpt.latest_step()
  if latest is not None:
    # The newest readable checkpoint: damaged ones are set aside with a warning.
    latest, saved = ckpt.read_latest_config()
    ckpt_lib.check_compatible(saved, flat_config, RESUME_FIELDS)
    if latest >= t.num_steps:
      _console(f"Run in {workdir} already finished at step {latest} "
               f"(train.num_steps={t.num_steps}); nothing to do.")
      status_lib.write_status(workdir, "finished", latest,
                              reason="already finished")
      return RunResult("finished", latest, {})

  tokenizer = load_tokenizer(config)
  setup = Setup(config, model_cfg)
  train_data = make_data(config, tokenizer, "train", train=True)
  train_iter = iter(train_data)
  if latest is not None:
    restored = ckpt.restore(abstract_state=setup.abstract_state)
    state = restored.state
    train_iter.set_state(restored.data_state)
    _console(f"Resumed from step {int(state.step)} of {workdir / 'checkpoints'}.")
  else:
    state = setup.init_state()
    if config.finetune.init_checkpoint:
      state = load_pretrained(state, config.finetune.init_checkpoint, flat_config,
                              setup.state_shardings.params)
  if is_chief:
    (workdir / "config.json").write_text(json.dumps(config.to_dict(), indent=2,
                                                    default=str))
  train_step, eval_step = setup.compile_steps()
  writer = metrics_lib.MetricWriter(workdir / "tensorboard", is_chief=is_chief)
  start_step = int(state.step)
  if start_step == 0:
    writer.write_config_text(config)
    writer.write_hparams(flat_config, ["eval/loss", "eval/perplexity", "eval/accuracy"])
  else:
    writer.mark_restart(start_step + 1)
  status_lib.write_status(workdir, "running", start_step)

  def evaluate(params) -> dict:
    sums = None
    for i, batch in enumerate(make_data(config, tokenizer, "validation", train=False)):
      if i >= config.eval.num_batches:
        break
      out = eval_step(params, sharding_lib.global_batch(batch, setup.mesh))
      sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    if sums is None:
      raise ConfigError(f"the validation split of {config.data.name} is empty.")
    return eval_metrics(config.task, jax.device_get(sums))

  decode_examples = _decode_examples(config, tokenizer)

  def decode_report(params, at_step):
    """eval/bleu (translation) and decoded samples as TensorBoard text."""
    if not decode_examples:
      return {}
    from tfx_jax import run_io
    run = run_io.Run(workdir, config, model_cfg, tokenizer, params, at_step)
    scalars, texts = _decode_metrics(run, decode_examples, config)
    writer.write_texts(at_step, texts)
    return scalars

  def save(step, force=False):
    # Metrics up to a checkpoint must survive a kill -9 as the checkpoint does:
    # a resumed run logs only the steps after it.
    writer.flush()
    ckpt.save(step, state, train_iter.get_state(), flat_config, force=force)

  num_skipped = 0
  last_eval: dict = {}
  step = start_step
  timer_step, timer_time, tokens = step, time.time(), 0.0
  pending = None  # metrics of the previous step: read one step late (no stall)
  result_status, reason = "finished", ""

  def check(pending_metrics, at_step):
    """Non-finite handling of a finished step; returns True to stop the run."""
    nonlocal num_skipped
    if bool(pending_metrics["finite"]):
      return False
    if config.train.on_nonfinite == "skip":
      num_skipped += 1
      writer.write_scalars(at_step, {"train/nonfinite_skipped": num_skipped})
      logging.warning("non-finite loss or gradient at step %d: update skipped "
                      "(%d so far)", at_step, num_skipped)
      return False
    return True

  with _Preemption() as preempt:
    while step < t.num_steps:
      batch = next(train_iter)
      tokens += float(np.sum(batch["inputs"] > 0))
      if "decoder_inputs" in batch:
        tokens += float(np.sum(batch["decoder_inputs"] > 0))
      state, metrics = train_step(state, sharding_lib.global_batch(batch, setup.mesh))
      step += 1
      if pending is not None and check(*pending):
        result_status, reason = "diverged", f"non-finite loss or gradient at step {pending[1]}"
        step = pending[1]
        break
      pending = (metrics, step)
      is_log = step % t.log_every_steps == 0 or step == t.num_steps
      is_eval = step % config.eval.every_steps == 0 or step == t.num_steps
      is_save = step % config.checkpoint.every_steps == 0
      stop_signal = preempt.signal  # read once: a later signal waits a step
      if is_log or is_eval or is_save or stop_signal is not None:
        # Check this step now: never evaluate or checkpoint non-finite params.
        m = jax.device_get(metrics)
        pending = None
        if check(m, step):
          result_status, reason = "diverged", f"non-finite loss or gradient at step {step}"
          break
      if is_log:
        now = time.time()
        tok_per_sec = tokens * jax.process_count() / max(now - timer_time, 1e-9)
        steps_per_sec = (step - timer_step) / max(now - timer_time, 1e-9)
        writer.write_scalars(step, {
            "train/loss": float(m["loss"]), "train/learning_rate": float(m["learning_rate"]),
            "train/grad_norm": float(m["grad_norm"]), "train/tokens_per_sec": tok_per_sec})
        eta = (t.num_steps - step) / max(steps_per_sec, 1e-9)
        _console(f"step {step:>6}/{t.num_steps}  loss {float(m['loss']):.4f}  "
                 f"{tok_per_sec:,.0f} tok/s  ETA {_fmt_time(eta)}")
        timer_step, timer_time, tokens = step, now, 0.0
      if is_eval:
        eval_start = time.time()
        last_eval = evaluate(state.params)
        last_eval.update(decode_report(state.params, step))
        writer.write_scalars(step, last_eval)
        _console(f"step {step:>6}  " + "  ".join(
            f"{k} {v:.4f}" for k, v in last_eval.items()))
        timer_time += time.time() - eval_start  # train/tokens_per_sec excludes eval
      if is_save:
        save(step)
      if stop_signal is not None:
        result_status, reason = "preempted", f"received {stop_signal}"
        break

  if result_status == "diverged":
    writer.flush()
    ckpt.wait()
    status_lib.write_status(workdir, "diverged", step, reason=reason,
                            num_nonfinite_skipped=num_skipped)
    _console(f"Run diverged: {reason}. Status written to {workdir / 'status.json'}.")
    writer.close()
    return RunResult("diverged", step, last_eval)

  save(step, force=True)
  ckpt.wait()
  writer.close()
  status_lib.write_status(workdir, result_status, step, reason=reason,
                          num_nonfinite_skipped=num_skipped)
  if result_status == "preempted":
    _console(f"{reason}: saved a checkpoint at step {step}; run the same command "
             "to resume.")
  else:
    _console(f"Finished at step {step}. Checkpoints: {workdir / 'checkpoints'}\n"
             f"TensorBoard logs: {workdir / 'tensorboard'}  "
             f"(view with: tensorboard --logdir {workdir})")
  return RunResult(result_status, step, last_eval)


def _decode_examples(config, tokenizer):
  """A fixed validation subset decoded at every evaluation.

  translate: the first ``eval.num_bleu_examples`` (source, reference) pairs;
  lm: the first words of a few validation documents as prompts.
  """
  from tfx_jax import inference
  if config.task == "translate" and config.eval.num_bleu_examples > 0:
    return inference.translation_pairs(config, "validation",
                                          config.eval.num_bleu_examples)
  if config.task == "lm" and config.eval.num_samples > 0:
    from tfx_jax.data import sources
    keys = sources.resolve_keys(config.data)
    src = sources.open_source(config.data.name, "validation", config.data.data_dir or None)
    prompts = []
    for i in range(min(len(src), 50 * config.eval.num_samples)):
      words = inference.text_of(src[i], keys.text_key).split()
      if len(words) >= 4:
        prompts.append((" ".join(words[:4]), ""))
      if len(prompts) == config.eval.num_samples:
        break
    return prompts
  return []


def _decode_metrics(run, examples, config):
  """Greedy decoding of the fixed subset: (scalars, texts)."""
  from tfx_jax import inference
  sources_txt = [s for s, _ in examples]
  if config.task == "translate":
    from tfx_jax import bleu
    hyps = inference.translate_texts(run, sources_txt, beam_size=1)
    score, _ = bleu.corpus_bleu(hyps, [r for _, r in examples])
    shown = "\n\n".join(f"source: {s}  \nhypothesis: {h}  \nreference: {r}"
                         for (s, r), h in list(zip(examples, hyps))[:config.eval.num_samples])
    return {"eval/bleu": score}, {"samples": shown}
  outs = inference.generate_texts(run, sources_txt, max_new_tokens=32, greedy=True)
  return {}, {"samples": "\n\n".join(f"{p} **{o}**" for p, o in zip(sources_txt, outs))}


# Model fields that may differ between a pretraining run and its fine-tuning.
_FINETUNE_FREE = ("model.num_classes", "model.dropout", "model.attention_dropout",
                  "model.remat", "model.dtype")


def load_pretrained(state: TrainState, path: str, flat_config: dict,
                    param_shardings) -> TrainState:
  """Starts fine-tuning from another run's latest parameters.

  ``path`` is a run's workdir or its ``checkpoints`` directory. Every
  parameter of the new model that the checkpoint has (same path and shape) is
  loaded; the rest (the classification head) keeps its fresh initialisation.
  The optimizer starts afresh.
  """
  root = pathlib.Path(path)
  directory = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  if not directory.is_dir():
    raise ConfigError(f"finetune.init_checkpoint={path!r} is neither a run directory "
                      "nor a checkpoints directory.")
  source = ckpt_lib.Checkpointer(directory, max_to_keep=10**6)
  try:
    if source.latest_step() is None:
      raise ConfigError(f"finetune.init_checkpoint={path!r} holds no checkpoint.")
    saved = source.read_config()
    fields = [k for k in flat_config if k.startswith("model.") and k not in _FINETUNE_FREE]
    ckpt_lib.check_compatible(saved, flat_config, fields)
    restored = source.restore()
  finally:
    source.close()
  pretrained = flax.traverse_util.flatten_dict(restored.state["params"], sep="/")
  fresh = flax.traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  merged, loaded = {}, 0
  for key, value in fresh.items():
    old = pretrained.get(key)
    if old is not None and tuple(old.shape) == tuple(value.shape):
      merged[key], loaded = np.asarray(old, value.dtype), loaded + 1
    else:
      merged[key] = value
  new_keys = sorted(set(fresh) - set(pretrained))
  _console(f"Loaded {loaded}/{len(fresh)} parameter arrays from {directory}"
           + (f"; new: {', '.join(new_keys)}" if new_keys else "") + ".")
  params = flax.traverse_util.unflatten_dict(merged, sep="/")
  return state.replace(params=jax.device_put(params, param_shardings))


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
