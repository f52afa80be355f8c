"""The ``optim`` section: its fields, their resolution, and the optimizers.

:class:`OptimConfig` holds the section's fields with their types and choices;
:func:`resolve` checks it once (every rule, and the values derived from the
run's length) and :func:`build` (the optimizer, with its learning-rate
schedule from ``schedules.py``) takes the resolved section and checks
nothing again. Invalid values raise ``ConfigError`` naming the field, the value
and the valid choices.

Each optimizer is one class, registered under its ``optim.optimizer`` name
(``@OptimConfig.register_subclass``, levanter's shape): a subclass of
:class:`OptimConfig`, the fields every optimizer shares, that adds its own
fields (``muon_momentum``, ``lion_b1``, ...), checks them (``check``) and
builds its update rule (``build``). The ConfigDict stays flat
(:data:`OptimSection`: the shared fields and every optimizer's own, so
``--config.optim.lion_b1=0.95`` is what it was); :func:`resolve` turns it into
the chosen optimizer's class once, and a field of another optimizer set away
from its default is an inactive setting. Adding an optimizer is one class here.

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
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tfx_jax.run import muon as muon_lib
from tfx_jax.run.schedules import make_schedule
from tfx_jax.core import typed_config
from tfx_jax.core.errors import ConfigError, InactiveSetting

Schedule = Literal["inverse_sqrt", "cosine", "linear", "constant", "wsd"]  # schedules.py
DecayShape = Literal["linear", "1-sqrt"]
SCHEDULES = get_args(Schedule)
DEFAULT_OPTIMIZER = "adamw"

# Leaf names that never get weight decay, whatever their rank: with scan over
# layers a bias or norm scale of shape [D] is stored stacked as [layers, D], so
# rank alone does not identify them.
NO_DECAY_NAMES = ("bias", "scale")

# Where the decay's end is derived (decay_steps = 0: the run's length) and the
# warmup would not end before it, the warmup is capped at this share of the run.
DERIVED_WARMUP_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """``config.optim`` resolved: the fields every optimizer shares. The run's
  section is an instance of the chosen optimizer's subclass, which adds its
  own fields; after :func:`resolve`, ``decay_steps`` is the step at which the
  decay ends (never 0) and ``warmup_steps`` the warmup the run uses.

  A subclass, registered with :meth:`register_subclass`, declares its fields
  (named as on the command line, ``optim.<field>``; its float fields are
  tuned values, traced: :class:`Hyperparameters`), and may override
  ``check_shared`` (refuse a shared field it does not read), ``check`` (its
  own rules) and ``parameter_groups``; it must define ``build``.
  """

  # Every registered optimizer, by its ``optim.optimizer`` name, in the order
  # registered (the order of the choices in an error).
  registry: ClassVar[dict[str, type[OptimConfig]]] = {}
  optimizer: ClassVar[str] = ""  # the registered name; set by register_subclass

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
  # The tuned values are an argument of the compiled step (one program for a
  # whole grid); False compiles them in as constants.
  trace_hyperparameters: bool = True

  @classmethod
  def register_subclass(cls, name: str):
    """Class decorator: registers an optimizer under ``optim.optimizer=name``.
    Its own fields must not be another optimizer's (each flag has one owner)."""

    def register(sub: type[OptimConfig]) -> type[OptimConfig]:
      taken = {f for other in cls.registry.values() for f in other.own_fields()}
      clash = sorted(taken & set(sub.own_fields()))
      if name in cls.registry or clash:
        raise TypeError(f"optimizer {name!r}: name or fields {clash} already registered")
      sub.optimizer = name
      cls.registry[name] = sub
      return sub

    return register

  @classmethod
  def own_fields(cls) -> tuple[str, ...]:
    """The fields this optimizer adds to the shared ones."""
    shared = {f.name for f in dataclasses.fields(OptimConfig)}
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in shared)

  @classmethod
  def traced_fields(cls) -> tuple[str, ...]:
    """Its own tuned values (the float fields): in ``Hyperparameters.own``."""
    kinds = typed_config.field_types(cls)
    return tuple(f for f in cls.own_fields() if kinds[f] is float)

  def check_shared(self) -> None:
    """Raises :class:`InactiveSetting` for a shared field, set away from its
    default, that this optimizer does not read (before the ranges are checked)."""

  def check(self) -> None:
    """Raises ConfigError for an own field out of its range (after the shared ones)."""

  def build(self, schedule: optax.Schedule, hp: Hyperparameters
            ) -> optax.GradientTransformation:
    """The update rule (without clipping or accumulation): choices from
    ``self``, values from ``hp`` (traced inside the train step)."""
    raise NotImplementedError(f"{type(self).__name__} does not define build")

  def parameter_groups(self, params: Any) -> dict | None:
    """Which parameters each update rule gets, where the optimizer has several
    (muon); None otherwise."""
    del params
    return None

  def decay(self, hp: Hyperparameters):
    """The weight decay: traced where on. Off is a choice of the program (no
    decay term at all), as before the values were traced."""
    return hp.weight_decay if self.weight_decay else 0.0


# Fields read only by one schedule: set elsewhere they are inactive settings
# (see errors.InactiveSetting). Each optimizer's own fields are the same for it.
SCHEDULE_FIELDS = {"wsd": ("decay_fraction", "decay_shape")}


class Hyperparameters(NamedTuple):
  """The tuned values of a run, float32 scalars: an argument of the train step.

  ``learning_rate`` is the peak the schedule reaches (with
  ``scale_by_d_model``, ``learning_rate * d_model^-0.5 * warmup^-0.5``);
  ``warmup_steps`` and ``decay_steps`` are step counts held as floats
  (exact below 2^24). A shared field an optimizer does not read is carried
  anyway; ``own`` holds the optimizer's own tuned fields by name
  (``OptimConfig.traced_fields``: ``{"lion_b1": ..., "lion_b2": ...}``).
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
  own: dict[str, Any]


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
  shared = {f: getattr(cfg, f) for f in Hyperparameters._fields if f != "own"}
  shared["learning_rate"] = peak
  own = {f: np.float32(getattr(cfg, f)) for f in cfg.traced_fields()}
  return Hyperparameters(**{k: np.float32(v) for k, v in shared.items()}, own=own)


def _check(ok: bool, field: str, value: Any, requirement: str) -> None:
  if not ok:
    raise ConfigError(f"optim.{field}={value!r} is not valid: {requirement}")


def _check_active(flat: Any, cfg: OptimConfig) -> None:
  """A field of another optimizer or schedule, set away from its default."""
  defaults = OptimSection()
  owners = (("optimizer", cfg.optimizer,
             {name: sub.own_fields() for name, sub in OptimConfig.registry.items()}),
            ("schedule", cfg.schedule, SCHEDULE_FIELDS))
  for owner, kind, table in owners:
    for choice, fields in table.items():
      for field in fields:
        value, default = getattr(flat, field), getattr(defaults, field)
        if choice != kind and value != default:
          raise InactiveSetting(
              f"optim.{field}", default,
              f"optim.{field}={value!r} is read by optim.{owner}={choice!r} only "
              f"({owner} is {kind!r}); leave it at {default!r} or use {choice}.")
  cfg.check_shared()


def resolve(section: Any, *, num_train_steps: int) -> tuple[OptimConfig, tuple[str, ...]]:
  """The ``optim`` section read, checked and completed for a run of
  ``num_train_steps`` updates: (resolved section, notes for the run's log).

  ``section`` is the flat section (an :data:`OptimSection`, or a mapping of
  some of its fields); the result is an instance of the chosen optimizer's
  class. ``decay_steps`` 0 becomes the run's length. Where that derived end
  does not leave room for the warmup (a short run of a preset with a long
  warmup, e.g. ``--config.train.num_steps=30`` with a warmup of 30), the
  warmup is capped at a tenth of the run (for wsd, also at the start of the
  decay) and a note says so; a ``decay_steps`` the user set that does not come
  after the warmup is an error naming both fields.
  """
  flat = section if isinstance(section, OptimSection) else typed_config.read(
      OptimSection, "optim", section)
  chosen = OptimConfig.registry[flat.optimizer]
  cfg = chosen(**{f.name: getattr(flat, f.name) for f in dataclasses.fields(chosen)})
  kind, warmup, lr = cfg.schedule, cfg.warmup_steps, cfg.learning_rate
  _check(lr > 0, "learning_rate", lr, "must be > 0")
  _check(warmup >= 0, "warmup_steps", warmup, "must be >= 0")
  _check(cfg.decay_steps >= 0, "decay_steps", cfg.decay_steps,
         "must be >= 0 (0 = train.num_steps)")
  _check_active(flat, cfg)
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
  for field in ("b1", "b2"):
    _check_rate(cfg, field)
  _check(cfg.eps > 0, "eps", cfg.eps, "must be > 0")
  _check(cfg.weight_decay >= 0, "weight_decay", cfg.weight_decay, "must be >= 0")
  _check(cfg.grad_clip_norm >= 0, "grad_clip_norm", cfg.grad_clip_norm,
         "must be >= 0 (0 = off)")
  _check(cfg.accumulate_steps >= 1, "accumulate_steps", cfg.accumulate_steps,
         "must be >= 1 (1 = off)")
  cfg.check()
  return dataclasses.replace(cfg, warmup_steps=warmup, decay_steps=decay_steps), tuple(notes)



def _check_rate(cfg: OptimConfig, field: str) -> None:
  """A momentum or interpolation coefficient: in [0, 1)."""
  value = getattr(cfg, field)
  _check(0.0 <= value < 1.0, field, value, "must be in [0, 1)")


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


# ----------------------------------------------------------------- optimizers
@OptimConfig.register_subclass("adam")
@dataclasses.dataclass(frozen=True)
class Adam(OptimConfig):
  """Adam without weight decay (weight_decay must be 0; use "adamw")."""

  def check(self) -> None:
    if self.weight_decay:
      raise InactiveSetting("optim.weight_decay", 0.0,
                            f"optim.weight_decay={self.weight_decay!r} is not valid: "
                            "optimizer='adam' has no weight decay; use optimizer='adamw' or "
                            "set weight_decay=0.0")

  def build(self, schedule, hp):
    return optax.adam(schedule, b1=hp.b1, b2=hp.b2, eps=hp.eps)


@OptimConfig.register_subclass("adamw")
@dataclasses.dataclass(frozen=True)
class AdamW(OptimConfig):
  """Adam with decoupled weight decay (Loshchilov & Hutter), masked by
  `decay_mask`. Note that optax multiplies the decay by the learning rate, as
  in PyTorch's AdamW."""

  def build(self, schedule, hp):
    return optax.adamw(schedule, b1=hp.b1, b2=hp.b2, eps=hp.eps,
                       weight_decay=self.decay(hp), mask=decay_mask)


@OptimConfig.register_subclass("adafactor")
@dataclasses.dataclass(frozen=True)
class Adafactor(OptimConfig):
  """optax's Adafactor defaults (factored second moments, decay_rate 0.8,
  update clipping 1.0, step scaled by parameter RMS, no momentum); b1, b2, eps
  are not used. weight_decay becomes `weight_decay_rate`, masked by
  `decay_mask`."""

  def build(self, schedule, hp):
    return optax.adafactor(
        schedule,
        weight_decay_rate=self.decay(hp) if self.weight_decay else None,
        weight_decay_mask=decay_mask if self.weight_decay else None)


@OptimConfig.register_subclass("muon")
@dataclasses.dataclass(frozen=True)
class Muon(OptimConfig):
  """Newton-Schulz orthogonalised momentum for the hidden matrices, AdamW (as
  "adamw", at `adam_learning_rate_ratio` x the rate) for the rest; see
  :func:`tfx_jax.run.muon.muon` (tfx_jax/run/muon.py)."""

  # Momentum, Nesterov, Newton-Schulz iterations, Moonlight's update RMS
  # (0 = Keller Jordan's sqrt(max(1, fan_out/fan_in))), and the Adam group's
  # rate as a multiple of the Muon group's.
  muon_momentum: float = 0.95
  muon_nesterov: bool = True
  muon_ns_steps: int = 5
  muon_consistent_rms: float = 0.2
  adam_learning_rate_ratio: float = 1.0

  def check(self) -> None:
    _check_rate(self, "muon_momentum")
    _check(self.muon_ns_steps >= 1, "muon_ns_steps", self.muon_ns_steps, "must be >= 1")
    _check(self.muon_consistent_rms >= 0, "muon_consistent_rms", self.muon_consistent_rms,
           "must be >= 0 (0 = Keller Jordan's width scaling)")
    _check(self.adam_learning_rate_ratio > 0, "adam_learning_rate_ratio",
           self.adam_learning_rate_ratio, "must be > 0")

  def build(self, schedule, hp, groups=None):
    own, weight_decay = hp.own, self.decay(hp)
    ratio = lambda count: own["adam_learning_rate_ratio"] * schedule(count)
    adam_rule = lambda rate, hp: optax.adamw(rate, b1=hp.b1, b2=hp.b2, eps=hp.eps,
                                             weight_decay=self.decay(hp), mask=decay_mask)
    adam = (adam_rule(ratio, hp) if groups is None else
            grouped(adam_rule, ratio, hp, groups))
    return muon_lib.muon(
        schedule, adam, momentum=own["muon_momentum"], nesterov=self.muon_nesterov,
        ns_steps=self.muon_ns_steps, weight_decay=weight_decay,
        consistent_rms=own["muon_consistent_rms"] if self.muon_consistent_rms else None,
        multipliers=None if groups is None else groups.muon.__getitem__)

  def parameter_groups(self, params):
    """{"muon": ..., "adam": ...}: see ``muon.assignment``."""
    return muon_lib.assignment(params)


@OptimConfig.register_subclass("lion")
@dataclasses.dataclass(frozen=True)
class Lion(OptimConfig):
  """Sign of an interpolated momentum (Chen et al. 2023, "Symbolic Discovery
  of Optimization Algorithms", Algorithm 2; `optax.lion`) with lion_b1,
  lion_b2 and decoupled weight decay masked by `decay_mask`."""

  lion_b1: float = 0.9  # the interpolation
  lion_b2: float = 0.99  # the momentum's decay

  def check_shared(self) -> None:
    for field in ("b1", "b2", "eps"):
      value, default = getattr(self, field), getattr(OptimConfig, field)
      if value != default:
        raise InactiveSetting(
            f"optim.{field}", default,
            f"optim.{field}={value!r} is Adam's; optimizer='lion' reads optim.lion_b1 "
            f"and optim.lion_b2 (and has no eps): leave it at {default!r}.")

  def check(self) -> None:
    for field in ("lion_b1", "lion_b2"):
      _check_rate(self, field)

  def build(self, schedule, hp):
    return optax.lion(schedule, b1=hp.own["lion_b1"], b2=hp.own["lion_b2"],
                      weight_decay=self.decay(hp), mask=decay_mask)


class Built(NamedTuple):
  """A run's optimizer: the transform and the schedule it follows, built
  together, so the rate a step logs is the rate its update applied."""

  tx: optax.GradientTransformation
  schedule: optax.Schedule


def grouped(rule, schedule: optax.Schedule, hp: Hyperparameters, groups
            ) -> optax.GradientTransformation:
  """``rule(rate, hp)`` once per parameter group of ``model.parametrization``
  (``run/param_groups.py``), each with its multipliers on the rate, the weight
  decay and epsilon: ``optax.partition`` over the groups' labels."""
  def one(m):
    scaled = hp._replace(weight_decay=hp.weight_decay * m.weight_decay, eps=hp.eps * m.eps)
    return rule(lambda count: m.lr * schedule(count), scaled)
  return optax.partition({label: one(m) for label, m in groups.distinct().items()},
                         groups.labels)


def build(cfg: OptimConfig, hp: Hyperparameters, groups=None) -> Built:
  """clip -> the optimizer's rule (-> gradient accumulation), and its schedule.

  ``cfg`` is a resolved section (:func:`resolve`), read for the choices;
  ``hp`` holds the values (:func:`hyperparameters`: constants; inside the
  train step, the same traced). Fields read: grad_clip_norm (0 = off),
  weight_decay (0 = off), accumulate_steps (1 = off), the optimizer's (its
  class's ``build``: :class:`Adam`, :class:`AdamW`, :class:`Adafactor`,
  :class:`Muon`, :class:`Lion`), plus the schedule's of `make_schedule`. The
  state's tree depends on the choices only.

  With accumulate_steps = k > 1 the whole chain is wrapped in
  `optax.MultiSteps`: gradients of k consecutive calls are averaged and
  applied once, so clipping acts on the averaged gradient and the schedule
  counts real updates, not micro-batches.

  ``groups`` (``param_groups.for_run``; None under ``model.parametrization=
  sp``) builds the rule once per parameter group with its multipliers.
  """
  schedule = make_schedule(cfg, hp)
  if groups is None:
    opt = cfg.build(schedule, hp)
  elif isinstance(cfg, Muon):
    opt = cfg.build(schedule, hp, groups)
  else:
    opt = grouped(cfg.build, schedule, hp, groups)
  if cfg.grad_clip_norm > 0:
    opt = optax.chain(clip_by_global_norm(hp.grad_clip_norm), opt)
  if cfg.accumulate_steps > 1:
    opt = optax.MultiSteps(opt, every_k_schedule=cfg.accumulate_steps)
  return Built(opt, schedule)


def _flat_section() -> type:
  """The ``optim`` section as the ConfigDict holds it: ``optimizer`` (one of
  the registered names), the shared fields and every optimizer's own, flat."""
  names = tuple(OptimConfig.registry)
  fields = [("optimizer", Literal[names], dataclasses.field(default=DEFAULT_OPTIMIZER))]
  for cls in (OptimConfig, *OptimConfig.registry.values()):
    kinds = typed_config.field_types(cls)
    own = cls.own_fields() if cls is not OptimConfig else [
        f.name for f in dataclasses.fields(OptimConfig)]
    fields += [(f.name, kinds[f.name], dataclasses.field(default=f.default))
               for f in dataclasses.fields(cls) if f.name in own]
  section = dataclasses.make_dataclass("OptimSection", fields, frozen=True)
  section.__module__ = __name__
  return section


# ``config.optim`` as given: its fields are the command line's ``optim.<field>``.
OptimSection = _flat_section()
Optimizer = typed_config.field_types(OptimSection)["optimizer"]
OPTIMIZERS = get_args(Optimizer)
