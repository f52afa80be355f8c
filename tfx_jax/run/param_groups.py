"""The optimizer's parameter groups under ``model.parametrization``.

One classification of the parameters, from two facts about each array:

- its fan-in and fan-out axes: a kernel's as Muon reads it
  (``muon.dimension_numbers``: the input axes of Flax's ``DenseGeneral``
  layout; a scanned stack's layer axis and a mixture's expert axis are batch
  axes), an embedding table's rows (its fan-in) and columns, and every other
  array (norm gains, biases, scalars) all fan-out;
- which of its axes grow with width: the axes whose size differs between the
  model at d_model and at 2 d_model (every explicit width doubled with it),
  the ``mup`` package's comparison with a second base shape.

Kinds: ``hidden`` (fan-in and fan-out grow), ``readout`` (fan-in grows, the
fan-out does not: the vocabulary projection and a classification head, which
carry ``MuReadout``'s forward multiplier), ``router`` (the same shape
elsewhere: a mixture's router, a readout in TP5's Table 3 form),
``embedding`` (fan-out grows from a fixed fan-in: token, position and
token-type tables), ``vector`` (no fan-in, width-sized: norm gains, biases)
and ``fixed`` (nothing grows: relative-position biases, scalars, vocabulary
biases). The Adam multipliers of each kind (learning rate, weight decay,
epsilon) follow model/parametrization.py's rules; Muon's own group follows
the spectral condition (:func:`muon_multiplier`). Under ``sp`` there are no
groups (``for_run`` returns None) and the optimizer is built as before.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import flax
import flax.linen as nn
import jax

from tfx_jax.core.errors import ConfigError
from tfx_jax.model import families, parametrization
from tfx_jax.run import muon as muon_lib

KINDS = ("hidden", "readout", "router", "embedding", "vector", "fixed")
# Optimizers whose update has a rule here: Adam's entrywise-normalised update
# (adam, adamw; Lion's sign update is entrywise +-1 as well, so Adam's table
# applies to it) and Muon (its matrices by the spectral condition, the rest by
# Adam's table). Adafactor scales its step by each parameter's RMS, a rule of
# its own that no muP table covers.
OPTIMIZERS = ("adam", "adamw", "lion", "muon")
# A residual block's parameters: under a stack's layers (looped or scanned).
_BLOCK = re.compile(r"^(encoder|decoder)/(layer_\d+|layers)/")


@dataclasses.dataclass(frozen=True)
class Multipliers:
  """Factors on the run's learning rate, weight decay and Adam epsilon."""
  lr: float = 1.0
  weight_decay: float = 1.0
  eps: float = 1.0

  @property
  def label(self) -> str:
    return f"lr x{self.lr:.6g}, wd x{self.weight_decay:.6g}, eps x{self.eps:.6g}"


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One array's classification: its kind, the stack whose block holds it
  (None outside the blocks), its fans now and at the base shape, and whether
  Muon orthogonalises it."""
  kind: str
  stack: str | None
  fan_in: int
  fan_out: int
  base_fan_in: float
  base_fan_out: float
  muon: bool


@dataclasses.dataclass(frozen=True)
class Groups:
  """The run's parameter groups: every array's :class:`Leaf` by path, and the
  multipliers of each (``adam``: the Adam table; ``muon``: the matrices Muon
  orthogonalises)."""
  leaves: dict[str, Leaf]
  adam: dict[str, Multipliers]
  muon: dict[str, Multipliers]
  parametrization: str
  width_mult: float
  depth_mults: dict[str, float]

  def adam_multipliers(self, path: str) -> Multipliers:
    return self.adam[path]

  def labels(self, tree: Any) -> Any:
    """Each leaf's Adam group label (its multipliers), over params or grads."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: self.adam[_key(path)].label, tree)

  def distinct(self) -> dict[str, Multipliers]:
    """{label: multipliers} of the Adam groups that occur."""
    return {m.label: m for m in self.adam.values()}


def _key(path) -> str:
  return "/".join(muon_lib.path_keys(path))


def doubled(model_cfg):
  """The model at twice the width (every explicit width doubled, the base too):
  the second shape the width-like axes are read from."""
  changes = {f: 2 * getattr(model_cfg, f) for f in parametrization.WIDTH_FIELDS
             if getattr(model_cfg, f)}
  changes["mup_base_d_model"] = 2 * model_cfg.mup_base_d_model
  return dataclasses.replace(model_cfg, **changes)


def _axes(keys: list[str], shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(fan-in axes, fan-out axes) of an array at ``keys``; batch axes in neither."""
  path = [jax.tree_util.DictKey(k) for k in keys]
  x = jax.ShapeDtypeStruct(shape, "float32")
  batch = 1 if muon_lib.SCANNED in keys[:-1] else 0
  name = keys[-1]
  if name == "kernel":
    dims = muon_lib.dimension_numbers(path, x)
    if dims is not None:
      return tuple(dims.reduction_axis), tuple(dims.output_axis)
    inputs = muon_lib.INPUT_AXES.get(keys[-2] if len(keys) > 1 else "", 1)
    return (tuple(range(batch, batch + inputs)),
            tuple(range(batch + inputs, len(shape))))
  if name == "embedding" and len(shape) - batch == 2:
    return (batch,), (batch + 1,)
  return (), tuple(range(batch, len(shape)))


def param_shapes(model_cfg) -> dict[str, jax.ShapeDtypeStruct]:
  """{path: shape} of the model's parameters (unboxed), by ``jax.eval_shape``."""
  model = families.build_model(model_cfg)
  abstract = jax.eval_shape(
      lambda rng: model.init({"params": rng}, **families.dummy_inputs(model_cfg)),
      jax.random.PRNGKey(0))
  flat = flax.traverse_util.flatten_dict(nn.unbox(abstract["params"]))
  return {"/".join(k): v for k, v in flat.items()}


def classify(model_cfg) -> dict[str, Leaf]:
  """Every parameter's :class:`Leaf` (see the module docstring)."""
  now, wide = param_shapes(model_cfg), param_shapes(doubled(model_cfg))
  m = parametrization.width_mult(model_cfg)
  out = {}
  for path, x in now.items():
    keys = path.split("/")
    shape, grown = tuple(x.shape), tuple(wide[path].shape)
    fan_in_axes, fan_out_axes = _axes(keys, shape)
    width = [a != b for a, b in zip(shape, grown)]
    fan = lambda axes: math.prod(shape[a] for a in axes)
    base = lambda axes: math.prod(shape[a] / (m if width[a] else 1) for a in axes)
    in_grows = any(width[a] for a in fan_in_axes)
    out_grows = any(width[a] for a in fan_out_axes)
    module = keys[-2] if len(keys) > 1 else ""
    if in_grows and out_grows:
      kind = "hidden"
    elif in_grows:
      kind = "readout" if module in muon_lib.HEAD_MODULES else "router"
    elif out_grows:
      kind = "embedding" if fan_in_axes else "vector"
    else:
      kind = "fixed"
    block = _BLOCK.match(path)
    dims = muon_lib.dimension_numbers([jax.tree_util.DictKey(k) for k in keys],
                                      jax.ShapeDtypeStruct(shape, "float32"))
    out[path] = Leaf(kind=kind, stack=block.group(1) if block else None,
                     fan_in=fan(fan_in_axes), fan_out=fan(fan_out_axes),
                     base_fan_in=base(fan_in_axes), base_fan_out=base(fan_out_axes),
                     muon=dims is not None)
  return out


def adam_multipliers(model_cfg, leaf: Leaf) -> Multipliers:
  """The Adam table (model/parametrization.py) for one array."""
  m = parametrization.width_mult(model_cfg)
  completep = model_cfg.parametrization == "completep"
  alpha = model_cfg.depth_alpha
  m_l = _depth_mult(model_cfg, leaf.stack)
  depth_lr = m_l ** (alpha - 1) if completep and leaf.stack else 1.0
  depth_eps = m_l ** -alpha if completep and leaf.stack else 1.0
  if leaf.kind in ("hidden", "router"):
    return Multipliers(lr=depth_lr / m, weight_decay=m,
                       eps=depth_eps / m if completep and leaf.stack else 1.0)
  if leaf.kind in ("vector", "fixed") and leaf.stack:
    # Dey et al.'s epsilon rule is for every array in the blocks.
    return Multipliers(lr=depth_lr, eps=depth_eps / m if completep else 1.0)
  return Multipliers()


def muon_multiplier(model_cfg, leaf: Leaf, consistent_rms: bool) -> Multipliers:
  """Muon's matrices: the update's spectral norm should scale as sqrt(fan-out /
  fan-in) (Yang, Simon and Bernstein 2023, the spectral condition behind muP).
  The orthogonalised update has spectral norm 1, times Muon's shape scale:
  Jordan's sqrt(max(1, fan-out / fan-in)), which meets the condition for
  every matrix whose fans grow together (factor 1), or Moonlight's r
  sqrt(max(fan-in, fan-out)), which grows as sqrt(m) (factor m^-1/2). The
  factor is the condition's ratio to the base over the scale's, times
  CompleteP's depth factor in the blocks; the weight decay is divided by it,
  so that rate x decay stays as tuned."""

  def scale(fan_in, fan_out):
    if consistent_rms:
      return math.sqrt(max(fan_in, fan_out))
    return math.sqrt(max(1.0, fan_out / fan_in))

  target = math.sqrt(leaf.fan_out / leaf.fan_in) / math.sqrt(leaf.base_fan_out /
                                                             leaf.base_fan_in)
  shape = scale(leaf.fan_in, leaf.fan_out) / scale(leaf.base_fan_in, leaf.base_fan_out)
  lr = target / shape
  if model_cfg.parametrization == "completep" and leaf.stack:
    lr *= _depth_mult(model_cfg, leaf.stack) ** (model_cfg.depth_alpha - 1)
  return Multipliers(lr=lr, weight_decay=1.0 / lr)


def _depth_mult(model_cfg, stack: str | None) -> float:
  if stack is None:
    return 1.0
  layers = model_cfg.encoder_layers if stack == "encoder" else model_cfg.decoder_layers
  return parametrization.depth_mult(model_cfg, layers)


def check_optimizer(model_cfg, optim_cfg) -> None:
  """ConfigError for an optimizer (or optimizer setting) with no rule under the
  model's parametrization."""
  kind = model_cfg.parametrization
  if kind == "sp":
    return
  if optim_cfg.optimizer not in OPTIMIZERS:
    raise ConfigError(
        f"model.parametrization={kind!r} has no rule for optim.optimizer="
        f"{optim_cfg.optimizer!r} (it scales each step by the parameter's RMS, which no "
        f"muP table covers); use one of: {', '.join(OPTIMIZERS)}.")
  if optim_cfg.scale_by_d_model:
    raise ConfigError(
        f"model.parametrization={kind!r} sets each group's rate from the width; "
        "optim.scale_by_d_model=True would scale every rate by d_model^-0.5 as well: "
        "set it to False.")


def for_run(model_cfg, optim_cfg) -> Groups | None:
  """The run's groups (None under sp: the optimizer as it always was)."""
  if not parametrization.transfers(model_cfg):
    return None
  check_optimizer(model_cfg, optim_cfg)
  leaves = classify(model_cfg)
  consistent = bool(getattr(optim_cfg, "muon_consistent_rms", 0.0))
  is_muon = optim_cfg.optimizer == "muon"
  present = {"decoder_only": ("decoder",), "encoder_only": ("encoder",),
             "encoder_decoder": ("encoder", "decoder")}[model_cfg.family]
  stacks = {s: _depth_mult(model_cfg, s) for s in present}
  return Groups(
      leaves=leaves,
      adam={p: adam_multipliers(model_cfg, leaf) for p, leaf in leaves.items()},
      muon={p: muon_multiplier(model_cfg, leaf, consistent) for p, leaf in leaves.items()
            if is_muon and leaf.muon},
      parametrization=model_cfg.parametrization,
      width_mult=parametrization.width_mult(model_cfg), depth_mults=stacks)


def format_groups(groups: Groups) -> str:
  """The table ``summary`` prints: each group's multipliers and its arrays."""
  rows: dict[tuple, list[str]] = {}
  for path, leaf in groups.leaves.items():
    mult = groups.muon.get(path) or groups.adam[path]
    rule = "muon" if path in groups.muon else "adam"
    rows.setdefault((rule, leaf.kind, mult.label), []).append(path)
  depth = ", ".join(f"m_L[{s}] {v:.4g}" for s, v in groups.depth_mults.items())
  lines = [f"parameter groups (model.parametrization={groups.parametrization}: width "
           f"multiplier m {groups.width_mult:.4g}, {depth})",
           f"  {'rule':<5} {'kind':<10} {'multipliers':<38} arrays"]
  for (rule, kind, label), paths in sorted(rows.items()):
    patterns = muon_lib._patterns(paths)
    lines.append(f"  {rule:<5} {kind:<10} {label:<38} {patterns[0]}")
    lines.extend(f"  {'':<5} {'':<10} {'':<38} {p}" for p in patterns[1:])
  return "\n".join(lines)
