"""The setup of one run: devices, data, state and steps.

What a config means is decided before this (``run_config``, no devices);
here a validated config meets the machine: ``check_devices`` (the mesh
against the devices, the batch against the processes, once when a run
starts), the tokenizer and the data pipelines of its splits, and a
``ShardedRun``: the mesh, the abstract sharded train state and the jitted
train and evaluation steps. The training loop (``trainer``), the evaluation
and generation commands (through ``trained_run``) and the checkpoint converters
import this module; it imports none of them.

One evaluation forward (``make_eval_step``) serves the in-training evaluation
and ``python -m tfx_jax.evaluate``; ``evaluate_batches`` adds its sums over a
split.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from typing import Any, Callable, Iterable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils

from tfx_jax.run import layer_stats as layer_stats_lib
from tfx_jax.run import optim
from tfx_jax.run import param_groups
from tfx_jax.run import qk_clip
from tfx_jax.run import config as run_config
from tfx_jax.run import sharding as sharding_lib
from tfx_jax import tasks
from tfx_jax.data import pipeline
from tfx_jax.data import shards as shards_lib
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.layers import moe
from tfx_jax.model.config import ModelConfig
from tfx_jax.model.families import build_model, dummy_inputs

# Evaluation reads a fixed shuffle of the split (the same for every run and
# seed): eval.num_batches then samples the whole split, not its first
# documents (one work, one genre), and runs stay comparable across seeds.
EVAL_SEED = 0
# The stacks whose layers ``train.log_layer_stats`` reports, in this order,
# and each layer's norm over the arrays of ``train.layer_stats_param``.
LAYER_STACKS = layer_stats_lib.LAYER_STACKS
per_layer_norms = layer_stats_lib.per_layer_norms


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # raw uint32 PRNG key; step keys are fold_in(rng, step)


# ------------------------------------------------------------ the machine
def check_devices(config, *, num_shards: int | None = None) -> None:
  """What a validated config needs of this machine, checked when a run starts.

  The mesh must fit the devices (``sharding.make_mesh`` names the
  ``config.mesh.*`` fields, the device count and sizes that fit); each batch
  must divide among the processes, the data shards and the mesh's batch axes
  (``check_batches``).
  """
  mesh = sharding_lib.make_mesh(config.mesh)
  check_batches(config, process_count=jax.process_count(), num_shards=num_shards,
                batch_axes=(sharding_lib.batch_shards(mesh), mesh.devices.size))


def check_batches(config, *, process_count: int, num_shards: int | None = None,
                  batch_axes: tuple[int, int] = (1, 1)) -> None:
  """Each of train.batch_size and eval.batch_size divides among
  ``process_count`` processes, the data shards (``num_shards``, default
  ``data.num_shards``; 0: one per process) and the mesh's batch axes
  (``batch_axes``: data x fsdp, and the device count they come from)."""
  if num_shards is None:
    num_shards = int(config.data.num_shards)
  num_shards = num_shards or process_count
  shards_lib.assignment(num_shards, process_count, 0)  # The shards divide among processes.
  n_batch, n_devices = batch_axes
  for section in ("train", "eval"):
    size = getattr(config, section).batch_size
    for ok, what in ((size % process_count == 0,
                      f"the number of processes ({process_count})"),
                     (size % num_shards == 0,
                      f"the number of data shards (data.num_shards={num_shards})"),
                     (size % n_batch == 0, f"the batch axes of the mesh (mesh.data x "
                      f"mesh.fsdp x mesh.expert = {n_batch} on {n_devices} devices)")):
      if not ok:
        raise ConfigError(f"{section}.batch_size={size} must be divisible by {what}.")


# ------------------------------------------------------------------- data
def load_tokenizer(config):
  """The run's tokenizer; its vocabulary must fit ``model.vocab_size``."""
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  if tok.vocab_size > config.model.vocab_size:
    raise ConfigError(
        f"model.vocab_size={config.model.vocab_size} is smaller than the tokenizer's "
        f"vocabulary ({tok.vocab_size}, data.tokenizer={config.data.tokenizer!r}); set "
        f"--config.model.vocab_size={tok.vocab_size} or larger.")
  return tok


def check_data(config) -> None:
  """The run's data before anything is compiled: a files corpus converted (its
  content errors reported), and a labelled task's class head with a class for
  every label of the dataset (a label past it would be skipped, never learned)."""
  sources.dataset_name(config.data)
  if not tasks.get(config.task).rows.labelled:
    return
  n = pipeline.num_classes(config.data)
  if n > config.model.num_classes:
    raise ConfigError(
        f"model.num_classes={config.model.num_classes} is smaller than the number of "
        f"labels of data.name={config.data.name!r} ({n}); set "
        f"--config.model.num_classes={n}.")


def make_data(config, tokenizer, split: str, *, train: bool, num_shards: int | None = None,
              process_index: int | None = None, process_count: int | None = None
              ) -> shards_lib.ShardedBatches:
  """This process's rows of the run's global batches of ``split``: endless and
  seeded (train) or one pass over the fixed evaluation shuffle (``EVAL_SEED``).

  The split is read as ``num_shards`` grain pipelines (default
  ``data.num_shards``; 0: one per process), each process reading its own
  shards (``data.shards``). The global batch is the concatenation of one
  sub-batch per shard, so for a fixed shard count it, and so the losses, are
  the same on 1 or N processes, and the iterator state restores on any
  number of processes that divides, or is a multiple of, the shard count.
  Every process sees the same number of evaluation batches: ended shards
  give zero-weight rows until all have ended.
  """
  n = jax.process_count() if process_count is None else process_count
  i = jax.process_index() if process_index is None else process_index
  if num_shards is None:
    num_shards = int(config.data.num_shards)
  num_shards = num_shards or n
  batch = config.train.batch_size if train else config.eval.batch_size
  shards, rows = shards_lib.assignment(num_shards, n, i)
  threads = max(1, min(16, os.cpu_count() or 1) // len(shards))
  datasets = [pipeline.make_dataset(
      config.data, tasks.get(config.task).rows, split, batch_size=batch // num_shards,
      seq_len=config.train.seq_len, seed=int(config.seed) if train else EVAL_SEED,
      tokenizer=tokenizer, shard_index=s, shard_count=num_shards, shuffle=True,
      num_epochs=None if train else 1, read_threads=threads) for s in shards]
  # Processes read different rows only when there are several shards; then
  # they agree on the end of a finite split and gather the iterator state.
  collective = num_shards > 1 and jax.process_count() > 1
  return shards_lib.ShardedBatches(
      datasets, shards, num_shards, rows=rows, finite=not train,
      **({"any_process": _any_process, "gather": _gather_json} if collective else {}))


def _any_process(flag: bool) -> bool:
  return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def _gather_json(value: Any) -> list[Any]:
  """``value`` (JSON-able) of every process, in process order."""
  data = np.frombuffer(json.dumps(value).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.asarray(data.size, np.int32))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  rows = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(row[:int(size)])) for row, size in zip(rows, sizes)]


# -------------------------------------------------------------- the steps
def per_layer_max_logits(intermediates) -> dict[str, jax.Array]:
  """{stack: [num_layers]}: each layer's largest self-attention logit, from the
  ``max_attention_logit`` values the attention layers sow (see Attention); with
  Gated DeltaNet layers (``model.mixer_pattern``), [attention layers]."""
  out = {}
  for stack in LAYER_STACKS:
    sub = intermediates.get(stack)
    if sub is None:
      continue
    # model.mixer_pattern: the attention layers only (a D layer has no logits),
    # in layer order; a scanned stack of mixed layers scans units of layer_0, ...
    number = lambda k: int(k.split("_")[1])
    attends = lambda tree: sorted((k for k in tree if k.startswith("layer_")
                                   and "self_attention" in tree[k]), key=number)
    logits = lambda tree, k: tree[k]["self_attention"]["max_attention_logit"][0]
    if "layers" in sub and "self_attention" in sub["layers"]:
      out[stack] = logits(sub, "layers")  # scanned: one value per layer
    elif "layers" in sub and attends(sub["layers"]):  # [units, attention layers per unit]
      out[stack] = jnp.stack([logits(sub["layers"], k) for k in attends(sub["layers"])],
                             axis=1).reshape(-1)
    elif attends(sub):
      out[stack] = jnp.stack([logits(sub, k) for k in attends(sub)])
  return out


def make_train_step(model_cfg: ModelConfig, config, platform: str | None = None):
  """``train_step(state, batch, hparams) -> (state, metrics)``: pure, jitted by
  the caller.

  ``hparams`` is the run's ``optim.Hyperparameters`` (traced, or constants
  closed over by the caller): the optimizer and its schedule are built from
  them, once, inside the step (``optim.build``), so the state's tree is the
  one the section's choices give, whatever the values, and the logged rate is
  the schedule the update applied.

  Metrics stay on the device: ``loss`` (the objective, label-smoothed where
  ``train.label_smoothing`` > 0, plus ``train.z_loss``), ``nll`` (the
  unsmoothed NLL, on eval/loss's scale), ``output_log_z`` (mean log Z of the
  output softmax), ``z_loss`` (the z-loss term), ``grad_norm``,
  ``learning_rate`` (the rate of this update, from the step's own
  schedule), ``finite``; with ``train.log_layer_stats`` also
  ``layer_stats/{grad,param,update}_norm`` (over the arrays of
  ``train.layer_stats_param``, ``layer_stats.metric_key``) and
  ``layer_stats/max_attention_logit`` as {stack: [num_layers]} arrays,
  computed in the step at no extra host sync; with ``train.qk_clip`` the
  fraction of query heads QK-clip rescaled, ``qk_clip_fraction`` (run/qk_clip.py).
  """
  task = tasks.get(config.task)
  model = build_model(model_cfg, deterministic=False, platform=platform)
  loss = task.objective(config, model_cfg.family, train=True)
  skip_nonfinite = config.train.on_nonfinite == "skip"
  accumulate = int(config.optim.accumulate_steps)
  layer_stats = bool(config.train.log_layer_stats)
  stats_param = config.train.layer_stats_param
  z_loss = float(config.train.z_loss)
  # DeepSeek-V3's expert bias, moved from each step's loads (0: not balanced so).
  bias_rate = (model_cfg.router_bias_rate if model_cfg.ffn_type == "moe"
               and model_cfg.moe_balance == "bias" else 0.0)
  # The attention layers' sown logit maxima are computed only when collected.
  collect = ["intermediates"] if layer_stats else []
  # QK-clip (train.qk_clip, run/qk_clip.py): each head's largest logit, sown.
  tau = float(config.train.qk_clip)
  if tau:
    collect.append(qk_clip.COLLECTION)
  groups = param_groups.for_run(model_cfg, config.optim)  # None under sp

  def train_step(state: TrainState, batch: dict, hparams: optim.Hyperparameters):
    # float32 arrays whether traced or constant: the same arithmetic either way.
    hp = jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), hparams)
    optimizer = optim.build(config.optim, hp, groups)
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out, sown = model.apply({"params": params}, **task.model_inputs(batch),
                              rngs={"dropout": rng}, mutable=collect)
      objective, sums = loss(out, batch)
      return objective, (sums, sown)

    (objective, (sums, collected)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(state.params)
    sown = collected.get("intermediates", {})
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(objective) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if bias_rate:  # out of the gradient: its own rule, from this step's loads
      # Once per optimizer update (DeepSeek-V3: "at the end of each step"): with
      # accumulation, at its last micro-batch, from that micro-batch's loads.
      rate = bias_rate if accumulate == 1 else jnp.where(
          (state.step + 1) % accumulate == 0, bias_rate, 0.0)
      params = moe.update_expert_bias(params, state.params, sums["router/counts"], rate)
    if tau:  # after the update, outside the optimizer: once per update
      at = tau if accumulate == 1 else jnp.where(
          (state.step + 1) % accumulate == 0, tau, jnp.inf)
      params, clip_fraction = qk_clip.apply(params, collected[qk_clip.COLLECTION], at)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    if skip_nonfinite:
      # Keep parameters and optimizer statistics of the last finite step.
      keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(finite, x, y), a, b)
      new = new.replace(params=keep(params, state.params),
                        opt_state=keep(opt_state, state.opt_state))
    update_count = state.step // accumulate
    weight = jnp.maximum(sums["weight"], 1.0)
    metrics = {"loss": objective, "nll": sums["nll"] / weight,
               "output_log_z": sums["log_z"] / weight,
               "z_loss": z_loss * sums["log_z_sq"] / weight,
               "grad_norm": grad_norm, "finite": finite,
               "learning_rate": optimizer.schedule(update_count),
               "weight": sums["weight"], **moe.router_metrics(sums)}
    if tau:
      metrics["qk_clip_fraction"] = clip_fraction
    if layer_stats:
      metrics["layer_stats/max_attention_logit"] = per_layer_max_logits(sown)
      for kind, tree in (("grad_norm", grads), ("param_norm", params),
                         ("update_norm", updates)):
        metrics[layer_stats_lib.metric_key(kind, stats_param)] = per_layer_norms(
            tree, stats_param)
    return new, metrics

  return train_step


def make_eval_step(model_cfg: ModelConfig, config, platform: str | None = None,
                   byte_lengths: np.ndarray | None = None):
  """``eval_step(params, batch) -> (sums, predictions)``: the one evaluation forward.

  ``byte_lengths``: the UTF-8 bytes of every token id (the tokenizer's
  ``byte_lengths()``), for a task that reports bits per byte (``bpb`` in its
  metrics: lm, mlm): the step gathers each target's bytes from it, a
  constant of the program (one [B, L] integer gather), and the sums gain
  ``losses.byte_sums``. None (or a task without it): no bytes.
  """
  task = tasks.get(config.task)
  model = build_model(model_cfg, deterministic=True, platform=platform)
  loss = task.objective(config, model_cfg.family, train=False)
  table = None
  if byte_lengths is not None and "bpb" in task.metrics:
    # Ids of the model's vocabulary past the tokenizer's (never a target) are 0 bytes.
    table = np.zeros(max(len(byte_lengths), model_cfg.vocab_size), np.int32)
    table[:len(byte_lengths)] = byte_lengths

  def eval_step(params, batch):
    out = model.apply({"params": params}, **task.model_inputs(batch))
    if table is not None:
      batch = {**batch, "target_bytes": jnp.asarray(table)[batch["targets"]]}
    _, sums = loss(out, batch)
    return sums, task.predictions(out)

  return eval_step


def evaluate_batches(eval_step, params, batches: Iterable[dict], mesh, *,
                     max_batches: int = 0,
                     on_batch: Callable[[dict, Any], None] | None = None,
                     total: dict | None = None) -> dict | None:
  """Sums of ``eval_step`` over ``batches`` (at most ``max_batches``; 0: all),
  added to ``total`` (the sums of the batches before them, in the order one
  pass adds them) where given.

  ``on_batch(batch, predictions)`` sees every global batch with its
  predictions (the evaluation command writes hypotheses from them; with
  several processes, each process's rows are gathered first). Every process
  must see as many batches (``make_data`` guarantees it), or the collectives
  of the step wait forever. Returns None when no batch came (and no ``total``).
  """
  for i, batch in enumerate(batches):
    if max_batches and i >= max_batches:
      break
    sums, pred = eval_step(params, sharding_lib.global_batch(batch, mesh))
    total = tasks.add_sums(total, jax.device_get(sums))
    if on_batch is not None:
      if jax.process_count() > 1:
        batch = jax.tree.map(np.asarray,
                             multihost_utils.process_allgather(batch, tiled=True))
      on_batch(batch, jax.device_get(pred))
  return total


def evaluate_subset_and_pass(eval_step, params, batches: Iterable[dict], mesh, *,
                             subset: int, max_batches: int = 0
                             ) -> tuple[dict | None, dict | None]:
  """(sums over the first ``subset`` batches, sums over at most ``max_batches``;
  0: all) of ``batches``, from one pass (``max_batches`` 0 or > ``subset``):
  the fixed evaluation shuffle's subset is the first batches of every longer
  pass, so the longer pass gives the subset's sums too, at no extra step."""
  batches = iter(batches)
  first = evaluate_batches(eval_step, params, itertools.islice(batches, subset), mesh)
  # Added on in order: the pass's sums are bitwise those of one call.
  return first, first if first is None else evaluate_batches(
      eval_step, params, batches, mesh, total=first,
      max_batches=max_batches - subset if max_batches else 0)


# ---------------------------------------------------------- state and mesh
def state_initializer(config, model_cfg: ModelConfig, tx: optax.GradientTransformation):
  """``init(rng) -> TrainState`` whose params and optimizer moments are boxed
  with their logical axis names (``jax.eval_shape`` it for shapes and names)."""
  model = build_model(model_cfg)
  inputs = dummy_inputs(model_cfg, 1, min(config.train.seq_len, model_cfg.max_len))

  def init_boxed(rng):
    params = model.init({"params": rng}, **inputs)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=_unbox_masked(tx.init(params)), rng=rng)

  return init_boxed


def _unbox_masked(opt_state):
  """``optax.partition`` (muon's groups) stands a ``MaskedNode`` for each leaf
  of another group; initialised on boxed parameters, it sits in a box with no
  array, which has no sharding: the node alone, as the unboxed state has it."""
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  return jax.tree.map(
      lambda x: x.value if is_box(x) and isinstance(x.value, optax.MaskedNode) else x,
      opt_state, is_leaf=is_box)


def _traced_in(mesh, step):
  """``step`` traced with ``mesh`` as the abstract mesh in context, which the
  kernels that run per device under ``shard_map`` read (model/layers/tpu_attention.py)."""

  @functools.wraps(step)  # the step's name names its compiled program (and cache entry)
  @functools.wraps(step)
  def traced(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return step(*args)

  return traced


class ShardedRun:
  """The mesh, abstract sharded state and jitted steps of one resolved run
  config (``run_config.RunConfig``) with the model ``model_cfg`` (its own, or
  one changed for evaluation, e.g. RoPE scaled).

  ``devices`` (default: this process's) may be another machine's, e.g. the
  compile-only devices of a TPU topology (``python -m tfx_jax.compile``): the
  steps are then that machine's programs, the model's kernels chosen for its
  platform (``build_model(platform=...)``), and compile without running.
  ``byte_lengths``: the tokenizer's bytes per id, with which the evaluation
  step reports bits per byte (``make_eval_step``)."""

  def __init__(self, config, model_cfg: ModelConfig, devices=None,
               byte_lengths: np.ndarray | None = None):
    self.config = config
    self.model_cfg = model_cfg
    self.byte_lengths = byte_lengths  # the tokenizer's, for eval/bpb (make_eval_step)
    self.mesh = sharding_lib.make_mesh(config.mesh, devices)
    run_config.check_expert_axis(model_cfg, self.mesh.shape["expert"])
    self.platform = self.mesh.devices.flat[0].platform
    # The tuned values (optim.Hyperparameters); the optimizer built from them
    # gives the state's tree, which does not depend on them (the train step
    # builds its own from the same values, traced: an argument of the program).
    self.hparams = optim.hyperparameters(config.optim, d_model=model_cfg.d_model)
    self.groups = param_groups.for_run(model_cfg, config.optim)  # None under sp
    self.optimizer = optim.build(config.optim, self.hparams, self.groups)
    self._init_boxed = init_boxed = state_initializer(config, model_cfg, self.optimizer.tx)
    key = jax.random.PRNGKey(int(config.seed))
    boxed = jax.eval_shape(init_boxed, key)
    self.state_shardings = sharding_lib.shardings_of(boxed, self.mesh)
    self.abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        nn.unbox(boxed), self.state_shardings)
    self.batch_sharding = sharding_lib.batch_sharding(self.mesh)
    self.replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

  def init_state(self) -> TrainState:
    key = jax.random.PRNGKey(int(self.config.seed))
    init = jax.jit(lambda r: nn.unbox(self._init_boxed(r)),
                   out_shardings=self.state_shardings)
    return init(key)

  def train_step(self):
    """The jitted, donated ``train_step(state, batch, hparams)``; call it with
    :meth:`step_hparams`.

    With ``optim.trace_hyperparameters`` (the default) ``hparams`` is an
    argument of the program, which is then the same for every value of them.
    Off, the run's values are compiled in as constants (the argument is still
    passed, and not read), as before they were traced.
    """
    traced = _traced_in(self.mesh, make_train_step(self.model_cfg, self.config,
                                                   self.platform))
    step = traced
    if not self.config.optim.trace_hyperparameters:
      constants = self.hparams

      @functools.wraps(traced)
      def constant_step(state, batch, hparams):
        del hparams  # optim.trace_hyperparameters=False: the run's, compiled in
        return traced(state, batch, constants)

      step = constant_step

    return jax.jit(
        step, in_shardings=(self.state_shardings, self.batch_sharding, self.replicated),
        out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))

  def step_hparams(self) -> optim.Hyperparameters:
    """The run's ``optim.Hyperparameters`` on the mesh, replicated: the third
    argument of :meth:`train_step`."""
    return jax.tree.map(
        lambda v: jax.make_array_from_callback((), self.replicated, lambda _: v),
        self.hparams)

  def eval_step(self):
    """The jitted evaluation forward: one per run, so that the evaluations after
    training reuse the program the in-training ones compiled."""
    if getattr(self, "_eval_step", None) is None:
      self._eval_step = jax.jit(
          _traced_in(self.mesh, make_eval_step(self.model_cfg, self.config,
                                               self.platform, self.byte_lengths)),
          in_shardings=(self.state_shardings.params, self.batch_sharding),
          out_shardings=self.replicated)
    return self._eval_step

  def compile_steps(self):
    """(train_step, eval_step), jitted."""
    return self.train_step(), self.eval_step()
