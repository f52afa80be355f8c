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

from tfx_jax import sharding as sharding_lib
from tfx_jax import tasks
from tfx_jax.data import pipeline
from tfx_jax.data import shards as shards_lib
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.errors import ConfigError
from tfx_jax.model_config import ModelConfig
from tfx_jax.models import build_model, dummy_inputs
from tfx_jax.optim import make_optimizer, make_schedule

# Evaluation reads a fixed shuffle of the split (the same for every run and
# seed): eval.num_batches then samples the whole split, not its first
# documents (one work, one genre), and runs stay comparable across seeds.
EVAL_SEED = 0
# The stacks whose layers ``train.log_layer_stats`` reports, in this order.
LAYER_STACKS = ("encoder", "decoder")


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
                batch_axes=(mesh.shape["data"] * mesh.shape["fsdp"], mesh.devices.size))


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
                      f"mesh.fsdp = {n_batch} on {n_devices} devices)")):
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
def per_layer_norms(tree) -> dict[str, jax.Array]:
  """{stack: [num_layers] L2 norms}: each layer's norm over all its arrays.

  Scanned stacks hold ``<stack>/layers/...`` with a leading layer axis; loop
  stacks hold ``<stack>/layer_<i>/...``. Stacks a model lacks are left out.
  """
  out = {}
  for stack in LAYER_STACKS:
    sub = tree.get(stack) if hasattr(tree, "get") else None
    if sub is None:
      continue
    if "layers" in sub:
      leaves = jax.tree.leaves(sub["layers"])
      num = leaves[0].shape[0]
      sq = sum(jnp.sum(jnp.square(x.astype(jnp.float32)).reshape(num, -1), axis=1)
               for x in leaves)
    else:
      names = sorted((k for k in sub if k.startswith("layer_")),
                     key=lambda k: int(k.split("_")[1]))
      sq = jnp.stack([sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                          for x in jax.tree.leaves(sub[k])) for k in names])
    out[stack] = jnp.sqrt(sq)
  return out


def per_layer_max_logits(intermediates) -> dict[str, jax.Array]:
  """{stack: [num_layers]}: each layer's largest self-attention logit, from the
  ``max_attention_logit`` values the attention layers sow (see Attention)."""
  out = {}
  for stack in LAYER_STACKS:
    sub = intermediates.get(stack)
    if sub is None:
      continue
    if "layers" in sub:  # scanned: one value per layer along the leading axis
      out[stack] = sub["layers"]["self_attention"]["max_attention_logit"][0]
    else:
      names = sorted((k for k in sub if k.startswith("layer_")),
                     key=lambda k: int(k.split("_")[1]))
      out[stack] = jnp.stack([sub[k]["self_attention"]["max_attention_logit"][0]
                              for k in names])
  return out


def make_train_step(model_cfg: ModelConfig, config, tx: optax.GradientTransformation,
                    schedule):
  """``train_step(state, batch) -> (state, metrics)``: pure, jitted by the caller.

  Metrics stay on the device: ``loss`` (the objective, label-smoothed where
  ``train.label_smoothing`` > 0, plus ``train.z_loss``), ``nll`` (the
  unsmoothed NLL, on eval/loss's scale), ``output_log_z`` (mean log Z of the
  output softmax), ``z_loss`` (the z-loss term), ``grad_norm``,
  ``learning_rate``, ``finite``; with ``train.log_layer_stats`` also
  ``layer_stats/{grad,param,update}_norm`` and
  ``layer_stats/max_attention_logit`` as {stack: [num_layers]} arrays,
  computed in the step at no extra host sync.
  """
  task = tasks.get(config.task)
  model = build_model(model_cfg, deterministic=False)
  loss = task.objective(config, model_cfg.family, train=True)
  skip_nonfinite = config.train.on_nonfinite == "skip"
  accumulate = int(config.optim.accumulate_steps)
  layer_stats = bool(config.train.log_layer_stats)
  z_loss = float(config.train.z_loss)
  # The attention layers' sown logit maxima are computed only when collected.
  collect = ["intermediates"] if layer_stats else []

  def train_step(state: TrainState, batch: dict):
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out, sown = model.apply({"params": params}, **task.model_inputs(batch),
                              rngs={"dropout": rng}, mutable=collect)
      objective, sums = loss(out, batch)
      return objective, (sums, sown.get("intermediates", {}))

    (objective, (sums, sown)), grads = jax.value_and_grad(
        loss_fn, has_aux=True)(state.params)
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
    weight = jnp.maximum(sums["weight"], 1.0)
    metrics = {"loss": objective, "nll": sums["nll"] / weight,
               "output_log_z": sums["log_z"] / weight,
               "z_loss": z_loss * sums["log_z_sq"] / weight,
               "grad_norm": grad_norm, "finite": finite,
               "learning_rate": schedule(update_count), "weight": sums["weight"]}
    if layer_stats:
      metrics["layer_stats/max_attention_logit"] = per_layer_max_logits(sown)
      metrics["layer_stats/grad_norm"] = per_layer_norms(grads)
      metrics["layer_stats/param_norm"] = per_layer_norms(params)
      metrics["layer_stats/update_norm"] = per_layer_norms(updates)
    return new, metrics

  return train_step


def make_eval_step(model_cfg: ModelConfig, config):
  """``eval_step(params, batch) -> (sums, predictions)``: the one evaluation forward."""
  task = tasks.get(config.task)
  model = build_model(model_cfg, deterministic=True)
  loss = task.objective(config, model_cfg.family, train=False)

  def eval_step(params, batch):
    out = model.apply({"params": params}, **task.model_inputs(batch))
    _, sums = loss(out, batch)
    return sums, task.predictions(out)

  return eval_step


def evaluate_batches(eval_step, params, batches: Iterable[dict], mesh, *,
                     max_batches: int = 0,
                     on_batch: Callable[[dict, Any], None] | None = None) -> dict:
  """Sums of ``eval_step`` over ``batches`` (at most ``max_batches``; 0: all).

  ``on_batch(batch, predictions)`` sees every global batch with its
  predictions (the evaluation command writes hypotheses from them; with
  several processes, each process's rows are gathered first). Every process
  must see as many batches (``make_data`` guarantees it), or the collectives
  of the step wait forever. Returns None when no batch came.
  """
  total = None
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


# ---------------------------------------------------------- state and mesh
def state_initializer(config, model_cfg: ModelConfig, tx: optax.GradientTransformation):
  """``init(rng) -> TrainState`` whose params and optimizer moments are boxed
  with their logical axis names (``jax.eval_shape`` it for shapes and names)."""
  model = build_model(model_cfg)
  inputs = dummy_inputs(model_cfg, 1, min(config.train.seq_len, model_cfg.max_len))

  def init_boxed(rng):
    params = model.init({"params": rng}, **inputs)["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=rng)

  return init_boxed


class ShardedRun:
  """The mesh, abstract sharded state and jitted steps of one resolved run
  config (``run_config.RunConfig``) with the model ``model_cfg`` (its own, or
  one changed for evaluation, e.g. RoPE scaled)."""

  def __init__(self, config, model_cfg: ModelConfig):
    self.config = config
    self.model_cfg = model_cfg
    self.mesh = sharding_lib.make_mesh(config.mesh)
    self.tx = make_optimizer(config.optim, d_model=model_cfg.d_model)
    self.schedule = make_schedule(config.optim, d_model=model_cfg.d_model)
    self._init_boxed = init_boxed = state_initializer(config, model_cfg, self.tx)
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
    """The jitted, donated train step."""
    return jax.jit(
        make_train_step(self.model_cfg, self.config, self.tx, self.schedule),
        in_shardings=(self.state_shardings, self.batch_sharding),
        out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))

  def eval_step(self):
    """The jitted evaluation forward."""
    return jax.jit(
        make_eval_step(self.model_cfg, self.config),
        in_shardings=(self.state_shardings.params, self.batch_sharding),
        out_shardings=self.replicated)

  def compile_steps(self):
    """(train_step, eval_step), jitted."""
    return self.train_step(), self.eval_step()
