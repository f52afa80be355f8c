"""The ``optim`` section: learning-rate schedules and optimizers.

:class:`OptimConfig` holds the section's fields with their types and choices;
:func:`resolve` checks it once (every rule, and the values derived from the
run's length) and the builders below take the resolved section and check
nothing again. Invalid values raise ``ConfigError`` naming the field, the value
and the valid choices.

Static choices and traced values. What changes the program (the optimizer,
the schedule, whether there is a warmup, whether weight decay or clipping is
on, the accumulation, Muon's Newton-Schulz steps and Nesterov switch) is read
from the section when the train step is traced. The values a sweep tunes (the
peak rate, the warmup's and the decay's lengths, betas, eps, the weight
decay, ...) are a :class:`Hyperparameters` of float32 scalars, an argument of
the train step: runs that differ only in them share one compiled program,
also across processes through the persistent compilation cache. The
optimizer's state holds none of them, so its tree is the same whatever the
values (and as it was when they were Python constants: older checkpoints
resume). ``optim.trace_hyperparameters=False`` compiles the same values in as
constants instead.

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
from typing import Any, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfx_jax.run import muon as muon_lib
from tfx_jax.core import typed_config
from tfx_jax.core.errors import ConfigError, InactiveSetting

Optimizer = Literal["adam", "adamw", "adafactor", "muon", "lion"]
Schedule = Literal["inverse_sqrt", "cosine", "linear", "constant", "wsd"]
DecayShape = Literal["linear", "1-sqrt"]
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
  b1: float = 0.9  # adam, adamw, muon's Adam group
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0
  grad_clip_norm: float = 1.0  # 0 = off
  decay_steps: int = 0  # cosine, linear, wsd: the step the decay ends; 0 = train.num_steps
  min_lr_ratio: float = 0.1  # cosine, wsd: the rate ends at min_lr_ratio x peak
  # wsd: the decay takes the last decay_fraction of the steps (to decay_steps),
  # with the shape decay_shape (Hägele et al. 2024: 1-sqrt beats linear).
  decay_fraction: float = 0.2
  decay_shape: DecayShape = "1-sqrt"
  accumulate_steps: int = 1  # gradients of k micro-batches per update; 1 = off
  # muon (see tfx_jax/run/muon.py): momentum, Nesterov, Newton-Schulz iterations,
  # Moonlight's update RMS (0 = Keller Jordan's sqrt(max(1, fan_out/fan_in))),
  # and the Adam group's rate as a multiple of the Muon group's.
  muon_momentum: float = 0.95
  muon_nesterov: bool = True
  muon_ns_steps: int = 5
  muon_consistent_rms: float = 0.2
  adam_learning_rate_ratio: float = 1.0
  # lion (Chen et al. 2023): the interpolation and the momentum decay.
  lion_b1: float = 0.9
  lion_b2: float = 0.99
  # The tuned values are an argument of the compiled step (one program for a
  # whole grid); False compiles them in as constants.
  trace_hyperparameters: bool = True


# Fields read only by one optimizer (or schedule): set elsewhere they are
# inactive settings (see errors.InactiveSetting).
OPTIMIZER_FIELDS = {
    "muon": ("muon_momentum", "muon_nesterov", "muon_ns_steps", "muon_consistent_rms",
             "adam_learning_rate_ratio"),
    "lion": ("lion_b1", "lion_b2"),
}
SCHEDULE_FIELDS = {"wsd": ("decay_fraction", "decay_shape")}
_DEFAULTS = OptimConfig()


class Hyperparameters(NamedTuple):
  """The tuned values of a run, float32 scalars: an argument of the train step.

  ``learning_rate`` is the peak the schedule reaches (with
  ``scale_by_d_model``, ``learning_rate * d_model^-0.5 * warmup^-0.5``);
  ``warmup_steps`` and ``decay_steps`` are step counts held as floats
  (exact below 2^24). A field an optimizer does not read is carried anyway,
  so every run's step has the same arguments.
  """

  learning_rate: Any
  warmup_steps: Any
  decay_steps: Any
  min_lr_ratio: Any
  decay_fraction: Any
  weight_decay: Any
  b1: Any
  b2: Any
  eps: Any
  grad_clip_norm: Any
  muon_momentum: Any
  muon_consistent_rms: Any
  adam_learning_rate_ratio: Any
  lion_b1: Any
  lion_b2: Any


def hyperparameters(cfg: OptimConfig, *, d_model: int) -> Hyperparameters:
  """The resolved section's tuned values as float32 scalars (NumPy).

  ``d_model`` (the model width) is read only with ``scale_by_d_model``, whose
  factor is folded into the peak here, in float64, then rounded once.
  """
  peak = cfg.learning_rate
  if cfg.scale_by_d_model:
    d_model = int(d_model)
    if d_model <= 0:
      raise ConfigError(f"model.d_model={d_model!r} must be > 0")
    peak = peak * d_model**-0.5 * cfg.warmup_steps**-0.5
  values = {f: getattr(cfg, f) for f in Hyperparameters._fields}
  values["learning_rate"] = peak
  return Hyperparameters(**{k: np.float32(v) for k, v in values.items()})


def _check(ok: bool, field: str, value: Any, requirement: str) -> None:
  if not ok:
    raise ConfigError(f"optim.{field}={value!r} is not valid: {requirement}")


def _check_active(cfg: OptimConfig) -> None:
  """A field of another optimizer or schedule, set away from its default."""
  for owner, kind, table in (("optimizer", cfg.optimizer, OPTIMIZER_FIELDS),
                             ("schedule", cfg.schedule, SCHEDULE_FIELDS)):
    for choice, fields in table.items():
      for field in fields:
        value, default = getattr(cfg, field), getattr(_DEFAULTS, field)
        if choice != kind and value != default:
          raise InactiveSetting(
              f"optim.{field}", default,
              f"optim.{field}={value!r} is read by optim.{owner}={choice!r} only "
              f"({owner} is {kind!r}); leave it at {default!r} or use {choice}.")
  if cfg.optimizer == "lion":
    for field in ("b1", "b2", "eps"):
      value, default = getattr(cfg, field), getattr(_DEFAULTS, field)
      if value != default:
        raise InactiveSetting(
            f"optim.{field}", default,
            f"optim.{field}={value!r} is Adam's; optimizer='lion' reads optim.lion_b1 "
            f"and optim.lion_b2 (and has no eps): leave it at {default!r}.")


def resolve(section: Any, *, num_train_steps: int) -> tuple[OptimConfig, tuple[str, ...]]:
  """The ``optim`` section read, checked and completed for a run of
  ``num_train_steps`` updates: (resolved section, notes for the run's log).

  ``decay_steps`` 0 becomes the run's length. Where that derived end does not
  leave room for the warmup (a short run of a preset with a long warmup, e.g.
  ``--config.train.num_steps=30`` with a warmup of 30), the warmup is capped at
  a tenth of the run (for wsd, also at the start of the decay) and a note says
  so; a ``decay_steps`` the user set that does not come after the warmup is an
  error naming both fields.
  """
  cfg = section if isinstance(section, OptimConfig) else typed_config.read(
      OptimConfig, "optim", section)
  kind, warmup, lr = cfg.schedule, cfg.warmup_steps, cfg.learning_rate
  _check(lr > 0, "learning_rate", lr, "must be > 0")
  _check(warmup >= 0, "warmup_steps", warmup, "must be >= 0")
  _check(cfg.decay_steps >= 0, "decay_steps", cfg.decay_steps,
         "must be >= 0 (0 = train.num_steps)")
  _check_active(cfg)
  if cfg.scale_by_d_model:
    _check(kind == "inverse_sqrt", "scale_by_d_model", True,
           f"only valid with schedule='inverse_sqrt' (got schedule={kind!r})")
    _check(warmup > 0, "warmup_steps", warmup,
           "must be > 0 when scale_by_d_model is set")
  if kind == "inverse_sqrt":
    _check(warmup > 0, "warmup_steps", warmup, "must be > 0 for schedule='inverse_sqrt'")
  if kind == "wsd":
    _check(0.0 < cfg.decay_fraction <= 1.0, "decay_fraction", cfg.decay_fraction,
           "must be in (0, 1]")
  notes = []
  decay_steps = cfg.decay_steps or int(num_train_steps)
  # The step the warmup must not pass: the decay's start (wsd) or its end.
  stable_end = (int(decay_steps * (1.0 - cfg.decay_fraction)) if kind == "wsd"
                else decay_steps - 1)
  if kind in ("cosine", "linear", "wsd") and warmup > stable_end:
    if cfg.decay_steps and kind == "wsd":
      _check(False, "warmup_steps", warmup,
             f"must end before the wsd decay starts, at step {stable_end} = "
             f"optim.decay_steps ({decay_steps}) x (1 - optim.decay_fraction)")
    if cfg.decay_steps:
      _check(False, "decay_steps", cfg.decay_steps,
             f"must be > optim.warmup_steps ({warmup}) for schedule={kind!r}")
    capped = min(int(decay_steps * DERIVED_WARMUP_SHARE), stable_end)
    which = (f"starts at step {stable_end} (the last optim.decay_fraction="
             f"{cfg.decay_fraction} of train.num_steps={decay_steps})" if kind == "wsd"
             else f"ends at train.num_steps={decay_steps}")
    share = ("the start of the decay" if kind == "wsd" and capped == stable_end
             else "a tenth of the run")
    notes.append(
        f"optim.warmup_steps={warmup} does not end before the {kind} decay, which "
        f"{which} (optim.decay_steps=0); the warmup is capped at {capped} steps, "
        f"{share}. Set optim.warmup_steps (or optim.decay_steps) to choose.")
    warmup = capped
  if kind in ("cosine", "wsd"):
    _check(0.0 <= cfg.min_lr_ratio <= 1.0, "min_lr_ratio", cfg.min_lr_ratio,
           "must be in [0, 1]")
  for field in ("b1", "b2", "muon_momentum", "lion_b1", "lion_b2"):
    value = getattr(cfg, field)
    _check(0.0 <= value < 1.0, field, value, "must be in [0, 1)")
  _check(cfg.eps > 0, "eps", cfg.eps, "must be > 0")
  _check(cfg.weight_decay >= 0, "weight_decay", cfg.weight_decay, "must be >= 0")
  _check(cfg.grad_clip_norm >= 0, "grad_clip_norm", cfg.grad_clip_norm,
         "must be >= 0 (0 = off)")
  _check(cfg.accumulate_steps >= 1, "accumulate_steps", cfg.accumulate_steps,
         "must be >= 1 (1 = off)")
  _check(cfg.muon_ns_steps >= 1, "muon_ns_steps", cfg.muon_ns_steps, "must be >= 1")
  _check(cfg.muon_consistent_rms >= 0, "muon_consistent_rms", cfg.muon_consistent_rms,
         "must be >= 0 (0 = Keller Jordan's width scaling)")
  _check(cfg.adam_learning_rate_ratio > 0, "adam_learning_rate_ratio",
         cfg.adam_learning_rate_ratio, "must be > 0")
  if cfg.optimizer == "adam" and cfg.weight_decay:
    raise InactiveSetting("optim.weight_decay", 0.0,
                          f"optim.weight_decay={cfg.weight_decay!r} is not valid: "
                          "optimizer='adam' has no weight decay; use optimizer='adamw' or "
                          "set weight_decay=0.0")
  return dataclasses.replace(cfg, warmup_steps=warmup, decay_steps=decay_steps), tuple(notes)


def make_schedule(cfg: OptimConfig, hp: Hyperparameters) -> optax.Schedule:
  """Returns the learning-rate schedule as a function of optax's update count.

  ``cfg`` is a resolved section (:func:`resolve`): it gives the kind
  (schedule, decay_shape) and whether there is a warmup; ``hp``
  (:func:`hyperparameters`, or the same traced) the values: the peak
  learning_rate, warmup_steps, and for "cosine" and "wsd" also decay_steps and
  min_lr_ratio, for "wsd" decay_fraction; for "linear" decay_steps.

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
  - "wsd" (warmup-stable-decay; Zhai et al. 2022, Hu et al. 2024 MiniCPM,
    Hägele et al. 2024): linear warmup, `peak` until the decay starts at
    `decay_steps * (1 - decay_fraction)`, then down to `min_lr_ratio * peak`
    at `decay_steps`: with progress `p` through the decay, the rate is
    `peak * (m + (1 - m) * (1 - s(p)))`, `s(p) = p` ("linear") or `sqrt(p)`
    ("1-sqrt", Hägele et al.'s cooldown, eq. 3); constant afterwards. A
    run's checkpoint from the stable phase continues into any decay length.
  """
  kind = cfg.schedule
  has_warmup = cfg.warmup_steps > 0
  lr, warmup, decay_steps = hp.learning_rate, hp.warmup_steps, hp.decay_steps
  # A quotient by a value of ``hp`` is a product with its reciprocal: XLA
  # rewrites `x / c` so for a constant c (trace_hyperparameters=False), and
  # the traced program must compute the same bits.
  per = lambda span: 1.0 / span

  def warmup_factor(step):
    if not has_warmup:
      return jnp.ones_like(step)
    return jnp.minimum(step * per(warmup), 1.0)

  def warmed(step, after):
    if not has_warmup:
      return after
    return jnp.where(step <= warmup, lr * warmup_factor(step), after)

  def from_one(count):
    return jnp.asarray(count, jnp.float32) + 1.0

  if kind == "inverse_sqrt":

    def schedule(count):
      step = from_one(count)
      return lr * jnp.minimum(step * per(warmup), jnp.sqrt(warmup / step))

  elif kind == "cosine":

    def schedule(count):
      step = from_one(count)
      progress = jnp.clip((step - warmup) * per(decay_steps - warmup), 0.0, 1.0)
      cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
      return warmed(step, lr * (hp.min_lr_ratio + (1.0 - hp.min_lr_ratio) * cosine))

  elif kind == "linear":

    def schedule(count):
      step = from_one(count)
      remaining = jnp.clip((decay_steps - step) * per(decay_steps - warmup), 0.0, 1.0)
      return warmed(step, lr * remaining)

  elif kind == "wsd":
    shape = jnp.sqrt if cfg.decay_shape == "1-sqrt" else (lambda p: p)

    def schedule(count):
      step = from_one(count)
      length = hp.decay_fraction * decay_steps
      progress = jnp.clip((step - (decay_steps - length)) * per(length), 0.0, 1.0)
      remaining = 1.0 - shape(progress)
      return warmed(step, lr * (hp.min_lr_ratio + (1.0 - hp.min_lr_ratio) * remaining))

  else:  # constant

    def schedule(count):
      step = from_one(count)
      return lr * warmup_factor(step)

  return schedule


def decay_mask(params: Any) -> Any:
  """Pytree of bools: True where weight decay applies.

  Biases and norm scales are excluded: every leaf of rank <= 1 and every leaf
  whose name is in `NO_DECAY_NAMES` (stacked per-layer copies included).
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.ndim(p) > 1 and muon_lib.leaf_name(path) not in NO_DECAY_NAMES,
      params)


def clip_by_global_norm(max_norm) -> optax.GradientTransformation:
  """``optax.clip_by_global_norm``'s rule (Pascanu et al. 2013): gradients
  whose global norm `||g||` exceeds ``max_norm`` are scaled by
  `max_norm / ||g||`; its state (none) too.

  The scale is one scalar, `min(1, max_norm / ||g||)`, that multiplies every
  leaf, where optax computes `g / ||g|| * max_norm` per element: then the
  element-wise program does not depend on whether ``max_norm`` is traced or a
  constant. (With a constant 1.0, XLA drops optax's `* max_norm`, and the
  CPU backend then contracts other products into FMAs: the last bits of the
  update differ from the traced program's.)
  """

  def update_fn(updates, state, params=None):
    del params
    g_norm = optax.tree.norm(updates)
    scale = jnp.where(g_norm < max_norm, 1.0, max_norm / g_norm)
    return jax.tree.map(lambda t: t * scale.astype(t.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def make_optimizer(cfg: OptimConfig, hp: Hyperparameters) -> optax.GradientTransformation:
  """Returns clip -> optimizer (-> gradient accumulation) built from config.

  ``cfg`` is a resolved section (:func:`resolve`), read for the choices;
  ``hp`` holds the values (:func:`hyperparameters`: constants; inside the
  train step, the same traced). Fields read: optimizer, grad_clip_norm (0 =
  off), weight_decay (0 = off), accumulate_steps (1 = off), b1, b2, eps (adam,
  adamw, muon's Adam group), lion_b1, lion_b2, the muon_* fields, plus the
  schedule's of `make_schedule`. The state's tree depends on the choices only.

  - "adam": Adam without weight decay (weight_decay must be 0; use "adamw").
  - "adamw": Adam with decoupled weight decay (Loshchilov & Hutter), masked
    by `decay_mask`. Note that optax multiplies the decay by the learning
    rate, as in PyTorch's AdamW.
  - "adafactor": optax's Adafactor defaults (factored second moments,
    decay_rate 0.8, update clipping 1.0, step scaled by parameter RMS, no
    momentum); b1, b2, eps are not used. weight_decay becomes
    `weight_decay_rate`, masked by `decay_mask`.
  - "muon": Newton-Schulz orthogonalised momentum for the hidden matrices,
    AdamW (as "adamw", at `adam_learning_rate_ratio` x the rate) for the
    rest; see :func:`tfx_jax.run.muon.muon`.
  - "lion": sign of an interpolated momentum (Chen et al. 2023, "Symbolic
    Discovery of Optimization Algorithms", Algorithm 2; `optax.lion`) with
    lion_b1, lion_b2 and decoupled weight decay masked by `decay_mask`.

  With accumulate_steps = k > 1 the whole chain is wrapped in
  `optax.MultiSteps`: gradients of k consecutive calls are averaged and
  applied once, so clipping acts on the averaged gradient and the schedule
  counts real updates, not micro-batches.
  """
  schedule = make_schedule(cfg, hp)
  name = cfg.optimizer
  # Off is a choice of the program (no decay term at all), as before the
  # values were traced; on, the strength is traced.
  weight_decay = hp.weight_decay if cfg.weight_decay else 0.0

  if name == "adam":
    opt = optax.adam(schedule, b1=hp.b1, b2=hp.b2, eps=hp.eps)
  elif name == "adamw":
    opt = optax.adamw(schedule, b1=hp.b1, b2=hp.b2, eps=hp.eps,
                      weight_decay=weight_decay, mask=decay_mask)
  elif name == "adafactor":
    opt = optax.adafactor(
        schedule,
        weight_decay_rate=weight_decay if cfg.weight_decay else None,
        weight_decay_mask=decay_mask if cfg.weight_decay else None)
  elif name == "lion":
    opt = optax.lion(schedule, b1=hp.lion_b1, b2=hp.lion_b2,
                     weight_decay=weight_decay, mask=decay_mask)
  else:  # muon
    adam = optax.adamw(lambda count: hp.adam_learning_rate_ratio * schedule(count),
                       b1=hp.b1, b2=hp.b2, eps=hp.eps, weight_decay=weight_decay,
                       mask=decay_mask)
    opt = muon_lib.muon(
        schedule, adam, momentum=hp.muon_momentum, nesterov=cfg.muon_nesterov,
        ns_steps=cfg.muon_ns_steps, weight_decay=weight_decay,
        consistent_rms=hp.muon_consistent_rms if cfg.muon_consistent_rms else None)

  if cfg.grad_clip_norm > 0:
    opt = optax.chain(clip_by_global_norm(hp.grad_clip_norm), opt)
  if cfg.accumulate_steps > 1:
    opt = optax.MultiSteps(opt, every_k_schedule=cfg.accumulate_steps)
  return opt


def parameter_groups(cfg: OptimConfig, params: Any) -> dict | None:
  """Which parameters each update rule gets, where the optimizer has several
  (muon: {"muon": ..., "adam": ...}, see ``muon.assignment``); None otherwise."""
  if cfg.optimizer != "muon":
    return None
  return muon_lib.assignment(params)
