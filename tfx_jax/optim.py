"""The ``optim`` section: learning-rate schedules and optimizers.

:class:`OptimConfig` holds the section's fields with their types and choices;
:func:`resolve` checks it once (every rule, and the values derived from the
run's length) and the builders below take the resolved section and check
nothing again. Invalid values raise ``ConfigError`` naming the field, the value
and the valid choices.

Step convention: optax calls a schedule with `count`, the number of updates
already applied (0 for the first update). The formulas below are written, as in
the papers, for a step counted from 1, so every schedule evaluates them at
`step = count + 1`. The first update therefore gets a small non-zero learning
rate (e.g. `d_model^-0.5 * warmup^-1.5` for the Transformer schedule) and
`schedule(warmup_steps - 1)` is the peak, i.e. the rate of update number
`warmup_steps`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

import jax
import jax.numpy as jnp
import optax

from tfx_jax import typed_config
from tfx_jax.errors import ConfigError, InactiveSetting

Optimizer = Literal["adam", "adamw", "adafactor"]
Schedule = Literal["inverse_sqrt", "cosine", "linear", "constant"]
OPTIMIZERS = get_args(Optimizer)
SCHEDULES = get_args(Schedule)

# Leaf names that never get weight decay, whatever their rank: with scan over
# layers a bias or norm scale of shape [D] is stored stacked as [layers, D], so
# rank alone does not identify them.
NO_DECAY_NAMES = ("bias", "scale")

# Where the decay's end is derived (decay_steps = 0: the run's length) and the
# warmup would not end before it, the warmup is capped at this share of the run.
DERIVED_WARMUP_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """``config.optim``. After :func:`resolve`, ``decay_steps`` is the step at
  which the decay ends (never 0) and ``warmup_steps`` the warmup the run uses."""

  optimizer: Optimizer = "adamw"
  learning_rate: float = 1e-3
  schedule: Schedule = "cosine"
  warmup_steps: int = 100
  scale_by_d_model: bool = False  # the Transformer paper's d_model^-0.5 factor
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0
  grad_clip_norm: float = 1.0  # 0 = off
  decay_steps: int = 0  # cosine, linear: the step the decay ends; 0 = train.num_steps
  min_lr_ratio: float = 0.1  # cosine: the rate ends at min_lr_ratio x peak
  accumulate_steps: int = 1  # gradients of k micro-batches per update; 1 = off


def _check(ok: bool, field: str, value: Any, requirement: str) -> None:
  if not ok:
    raise ConfigError(f"optim.{field}={value!r} is not valid: {requirement}")


def resolve(section: Any, *, num_train_steps: int) -> tuple[OptimConfig, tuple[str, ...]]:
  """The ``optim`` section read, checked and completed for a run of
  ``num_train_steps`` updates: (resolved section, notes for the run's log).

  ``decay_steps`` 0 becomes the run's length. Where that derived end does not
  come after ``warmup_steps`` (a short run of a preset with a long warmup, e.g.
  ``--config.train.num_steps=30`` with a warmup of 30), the warmup is capped at
  a tenth of the run and a note says so; a ``decay_steps`` the user set that
  does not come after the warmup is an error naming both fields.
  """
  cfg = section if isinstance(section, OptimConfig) else typed_config.read(
      OptimConfig, "optim", section)
  kind, warmup, lr = cfg.schedule, cfg.warmup_steps, cfg.learning_rate
  _check(lr > 0, "learning_rate", lr, "must be > 0")
  _check(warmup >= 0, "warmup_steps", warmup, "must be >= 0")
  _check(cfg.decay_steps >= 0, "decay_steps", cfg.decay_steps,
         "must be >= 0 (0 = train.num_steps)")
  if cfg.scale_by_d_model:
    _check(kind == "inverse_sqrt", "scale_by_d_model", True,
           f"only valid with schedule='inverse_sqrt' (got schedule={kind!r})")
    _check(warmup > 0, "warmup_steps", warmup,
           "must be > 0 when scale_by_d_model is set")
  if kind == "inverse_sqrt":
    _check(warmup > 0, "warmup_steps", warmup, "must be > 0 for schedule='inverse_sqrt'")
  notes = []
  decay_steps = cfg.decay_steps or int(num_train_steps)
  if kind in ("cosine", "linear") and decay_steps <= warmup:
    if cfg.decay_steps:
      _check(False, "decay_steps", cfg.decay_steps,
             f"must be > optim.warmup_steps ({warmup}) for schedule={kind!r}")
    capped = int(decay_steps * DERIVED_WARMUP_SHARE)
    notes.append(
        f"optim.warmup_steps={warmup} does not end before the {kind} decay, which ends "
        f"at train.num_steps={decay_steps} (optim.decay_steps=0); the warmup is capped "
        f"at {capped} steps, a tenth of the run. Set optim.warmup_steps (or "
        "optim.decay_steps) to choose.")
    warmup = capped
  if kind == "cosine":
    _check(0.0 <= cfg.min_lr_ratio <= 1.0, "min_lr_ratio", cfg.min_lr_ratio,
           "must be in [0, 1]")
  for field in ("b1", "b2"):
    value = getattr(cfg, field)
    _check(0.0 <= value < 1.0, field, value, "must be in [0, 1)")
  _check(cfg.eps > 0, "eps", cfg.eps, "must be > 0")
  _check(cfg.weight_decay >= 0, "weight_decay", cfg.weight_decay, "must be >= 0")
  _check(cfg.grad_clip_norm >= 0, "grad_clip_norm", cfg.grad_clip_norm,
         "must be >= 0 (0 = off)")
  _check(cfg.accumulate_steps >= 1, "accumulate_steps", cfg.accumulate_steps,
         "must be >= 1 (1 = off)")
  if cfg.optimizer == "adam" and cfg.weight_decay:
    raise InactiveSetting("optim.weight_decay", 0.0,
                          f"optim.weight_decay={cfg.weight_decay!r} is not valid: "
                          "optimizer='adam' has no weight decay; use optimizer='adamw' or "
                          "set weight_decay=0.0")
  return dataclasses.replace(cfg, warmup_steps=warmup, decay_steps=decay_steps), tuple(notes)


def make_schedule(cfg: OptimConfig, *, d_model: int) -> optax.Schedule:
  """Returns the learning-rate schedule as a function of optax's update count.

  ``cfg`` is a resolved section (:func:`resolve`). Fields read: schedule,
  learning_rate, warmup_steps, scale_by_d_model, and for "cosine" also
  decay_steps, min_lr_ratio; for "linear" also decay_steps. `d_model` (the
  model width) is used only with scale_by_d_model.

  With `step = count + 1` (see the module docstring) and
  `peak = learning_rate`:

  - "inverse_sqrt": `peak * min(step / warmup, sqrt(warmup / step))`: linear
    warmup, then decay with the inverse square root of the step. With
    `scale_by_d_model` the peak is `learning_rate * d_model^-0.5 *
    warmup^-0.5`, which makes this exactly the schedule of "Attention Is All
    You Need" (eq. 3), `lr = d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5)`, scaled by `learning_rate` (1.0 in the paper recipe).
  - "cosine": linear warmup to `peak` over `warmup_steps`, then half-cosine
    decay to `min_lr_ratio * peak` at step `decay_steps` (default: the last
    update), constant afterwards.
  - "linear": linear warmup to `peak` over `warmup_steps`, then linear decay
    to 0 at step `decay_steps` (default: the last update), 0 afterwards. BERT's
    schedule (Devlin et al. 2019; HF `get_linear_schedule_with_warmup`);
    min_lr_ratio is not read.
  - "constant": linear warmup to `peak` (no warmup if warmup_steps is 0),
    then constant.
  """
  kind = cfg.schedule
  lr = cfg.learning_rate
  warmup = cfg.warmup_steps
  if cfg.scale_by_d_model:
    d_model = int(d_model)
    if d_model <= 0:
      raise ConfigError(f"model.d_model={d_model!r} must be > 0")
    lr = lr * d_model**-0.5 * warmup**-0.5

  def warmup_factor(step):
    if warmup == 0:
      return jnp.ones_like(step)
    return jnp.minimum(step / warmup, 1.0)

  decay_steps = cfg.decay_steps

  if kind == "inverse_sqrt":

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      return lr * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))

  elif kind == "cosine":
    min_ratio = cfg.min_lr_ratio

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      progress = jnp.clip((step - warmup) / (decay_steps - warmup), 0.0, 1.0)
      cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
      decayed = lr * (min_ratio + (1.0 - min_ratio) * cosine)
      return jnp.where(step <= warmup, lr * warmup_factor(step), decayed)

  elif kind == "linear":

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      remaining = jnp.clip((decay_steps - step) / (decay_steps - warmup), 0.0, 1.0)
      return jnp.where(step <= warmup, lr * warmup_factor(step), lr * remaining)

  else:  # constant

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      return lr * warmup_factor(step)

  return schedule


def decay_mask(params: Any) -> Any:
  """Pytree of bools: True where weight decay applies.

  Biases and norm scales are excluded: every leaf of rank <= 1 and every leaf
  whose name is in `NO_DECAY_NAMES` (stacked per-layer copies included).
  """

  def leaf_name(path) -> str:
    for key in reversed(path):
      if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
      if isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
        return key.name
    return ""

  return jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.ndim(p) > 1 and leaf_name(path) not in NO_DECAY_NAMES,
      params)


def make_optimizer(cfg: OptimConfig, *, d_model: int) -> optax.GradientTransformation:
  """Returns clip -> optimizer (-> gradient accumulation) built from config.

  ``cfg`` is a resolved section (:func:`resolve`). Fields read: optimizer,
  grad_clip_norm (0 = off), weight_decay, accumulate_steps (1 = off), b1, b2,
  eps (adam / adamw), plus the schedule fields of `make_schedule` (which also
  takes `d_model`).

  - "adam": Adam without weight decay (weight_decay must be 0; use "adamw").
  - "adamw": Adam with decoupled weight decay (Loshchilov & Hutter), masked
    by `decay_mask`. Note that optax multiplies the decay by the learning
    rate, as in PyTorch's AdamW.
  - "adafactor": optax's Adafactor defaults (factored second moments,
    decay_rate 0.8, update clipping 1.0, step scaled by parameter RMS, no
    momentum); b1, b2, eps are not used. weight_decay becomes
    `weight_decay_rate`, masked by `decay_mask`.

  With accumulate_steps = k > 1 the whole chain is wrapped in
  `optax.MultiSteps`: gradients of k consecutive calls are averaged and
  applied once, so clipping acts on the averaged gradient and the schedule
  counts real updates, not micro-batches.
  """
  schedule = make_schedule(cfg, d_model=d_model)
  name = cfg.optimizer
  weight_decay = cfg.weight_decay
  clip = cfg.grad_clip_norm
  accumulate = cfg.accumulate_steps

  if name == "adam":
    opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  elif name == "adamw":
    opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                      weight_decay=weight_decay, mask=decay_mask)
  else:  # adafactor
    opt = optax.adafactor(
        schedule,
        weight_decay_rate=weight_decay or None,
        weight_decay_mask=decay_mask if weight_decay else None)

  if clip > 0:
    opt = optax.chain(optax.clip_by_global_norm(clip), opt)
  if accumulate > 1:
    opt = optax.MultiSteps(opt, every_k_schedule=accumulate)
  return opt
