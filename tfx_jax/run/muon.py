"""Muon: which parameters it orthogonalises, how, and the transformation.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural
networks"; Liu et al. 2025, "Muon is Scalable for LLM Training", Moonlight)
updates each hidden weight matrix with its momentum orthogonalised by a
Newton-Schulz iteration, `O = NS(M) ~ U V^T` for `M = U S V^T`, and leaves
embeddings, output heads, norms, biases and every other parameter to AdamW.

The groups come from parameter paths (:func:`dimension_numbers`), for every
model family, stacked (``model.scan_layers``) or not:

- A ``kernel`` is a matrix for Muon unless it is an output head (``output``:
  the untied vocabulary projection; ``classifier``). Its input axes are the
  reduction axes and the rest are output axes, as Flax's ``DenseGeneral``
  lays a kernel out (`[*inputs, *features]`): one input axis (`embed`) for
  the attention's query/key/value/gate kernels `[embed, heads, kv]`, which
  are orthogonalised as one `embed x (heads * kv)` matrix, and two (`heads,
  kv`) for its ``out`` kernel `[heads, kv, embed]`; FFN and head-transform
  kernels are plain `[in, out]` matrices.
- Under a scanned stack (a ``layers`` module on the path) axis 0 is the
  layer axis: a batch axis, so each layer's matrix is orthogonalised on its
  own (``optax.contrib.MuonDimensionNumbers`` leaves it out of both groups).
- Everything else (``embedding``, ``rel_embedding``, ``scale``, ``bias``,
  DyT's ``alpha``, the output and MLM biases) goes to Adam.

This follows MaxText's ``muon_utils.transform_logic`` (attention ``out``
reduces over its heads and head-dim axes; query/key/value output over theirs)
and Moonlight's split.

Communication on a sharded mesh. The Newton-Schulz iteration multiplies the
whole matrix by itself (`A = X X^T`, `B = c1 A + c2 A A`, `X <- c0 X + B X`,
``muon_ns_steps`` times), so a kernel sharded over ``fsdp`` (its `embed` axis)
or ``tensor`` (`mlp`, `heads`) is not orthogonalised shard by shard: XLA's SPMD
partitioner gathers and reduces partial products for every multiplication,
where AdamW's update is element-wise and needs nothing beyond the gradient's
own reductions. Measured on 8 fake CPU devices (mesh data=2, fsdp=2,
tensor=2; a 2-layer scanned LM, d_model 64, 131,712 parameters; collectives
counted in the compiled step's HLO, elements = the per-device result shapes):

  AdamW, Lion   12 all-gathers (119k elements),  29 all-reduces (170k),
                 1 collective-permute
  Muon          42 all-gathers (283k elements), 111 all-reduces (490k),
                91 collective-permutes (225k)

about 3.5x the elements moved per step (7.6x the parameter count against
2.2x), growing with ``muon_ns_steps``. With the matrices replicated
(``mesh.data`` only) or on one device there is none.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

# Module names of kernels that are output heads (AdamW, as embeddings are).
HEAD_MODULES = ("output", "classifier")
# Kernels of ``DenseGeneral`` over more than one input axis: attention's output
# projection reads (heads, kv).
INPUT_AXES = {"out": 2}
# The name of a scanned stack's module: its leaves carry a leading layer axis.
SCANNED = "layers"
# A mixture of experts' projections (model/layers/moe.py, ``ExpertDense``) store every
# expert's matrix in one kernel [E, in, out] under these module names: the
# expert axis is a batch axis, so each expert's matrix is orthogonalised on its
# own (Newton-Schulz over an [E * in, out] reshape would mix the experts).
EXPERT_MODULES = ("wi", "wv", "wo")
GROUPS = ("muon", "adam")


def path_keys(path) -> list[str]:
  """The dict keys of a pytree path (boxes' ``.value`` and the like left out)."""
  keys = []
  for key in path:
    if isinstance(key, jax.tree_util.DictKey):
      keys.append(str(key.key))
    elif isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
      keys.append(key.name)
  return keys


def leaf_name(path) -> str:
  """The parameter's own name (``kernel``, ``scale``...): the path's last key."""
  keys = path_keys(path)
  return keys[-1] if keys else ""


def dimension_numbers(path, x) -> MuonDimensionNumbers | None:
  """How Muon reads the parameter at ``path`` as matrices; None: it goes to Adam.

  See the module docstring for the rule. Axes not named are batch axes (the
  layer axis of a scanned stack).
  """
  keys = path_keys(path)
  if not keys or keys[-1] != "kernel":
    return None
  module = keys[-2] if len(keys) > 1 else ""
  if module in HEAD_MODULES:
    return None
  batch = 1 if SCANNED in keys[:-1] else 0
  if module in EXPERT_MODULES and x.ndim - batch == 3:
    batch += 1  # [(layers,) experts, in, out]
  inputs = INPUT_AXES.get(module, 1)
  if x.ndim - batch <= inputs:
    return None  # no output axis: not a matrix
  return MuonDimensionNumbers(reduction_axis=tuple(range(batch, batch + inputs)),
                              output_axis=tuple(range(batch + inputs, x.ndim)))


def _is_masked(x) -> bool:
  return isinstance(x, optax.MaskedNode)


def _per_leaf(fn: Callable, tree: Any) -> Any:
  """``fn(path, leaf)`` over ``tree``, keeping the ``MaskedNode``s that
  ``optax.partition`` puts where another group's leaves are."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if _is_masked(x) else fn(path, x), tree, is_leaf=_is_masked)


def labels(tree: Any) -> Any:
  """"muon" or "adam" for every leaf of ``tree`` (params, boxed or not, or grads)."""
  return _per_leaf(lambda path, x: "adam" if dimension_numbers(path, x) is None
                   else "muon", tree)


def _dimension_numbers_tree(tree: Any) -> Any:
  return _per_leaf(dimension_numbers, tree)


def _fans(x, dims: MuonDimensionNumbers) -> tuple[int, int]:
  fan_in = math.prod(x.shape[a] for a in dims.reduction_axis)
  fan_out = math.prod(x.shape[a] for a in dims.output_axis)
  return fan_in, fan_out


def scale_by_shape(consistent_rms) -> optax.GradientTransformation:
  """The orthogonalised update's scale from its matrix's shape.

  With ``consistent_rms`` = r (Liu et al. 2025, eq. 4): `r * sqrt(max(fan_in,
  fan_out))`, which gives every matrix's update the RMS r (an orthogonal
  `m x n` matrix has RMS `1/sqrt(max(m, n))`), r = 0.2 matching AdamW's
  typical update RMS so that its learning rate and weight decay carry over.
  With None: Jordan's `sqrt(max(1, fan_out / fan_in))`. The same formulas
  as optax.contrib's (private) ``scale_by_shape``; ``consistent_rms`` may be
  traced.
  """

  def scale(x, dims):
    fan_in, fan_out = _fans(x, dims)
    if consistent_rms is None:
      return math.sqrt(max(1.0, fan_out / fan_in)) * x
    return (consistent_rms * math.sqrt(max(fan_in, fan_out))) * x

  def update_fn(updates, state, params=None):
    del params
    # Another group's MaskedNodes are empty subtrees of both trees: skipped.
    return jax.tree.map(scale, updates, _dimension_numbers_tree(updates)), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def scale_per_leaf(factors: Callable[[str], float]) -> optax.GradientTransformation:
  """Each leaf's update times ``factors(path)`` (a constant per array: the
  parametrization's rate multipliers, run/param_groups.py)."""

  def update_fn(updates, state, params=None):
    del params
    return _per_leaf(lambda path, u: u * jnp.asarray(
        factors("/".join(path_keys(path))), u.dtype), updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def decay_per_leaf(weight_decay, factors: Callable[[str], float]
                   ) -> optax.GradientTransformation:
  """``optax.add_decayed_weights`` with the decay times ``factors(path)`` per array."""

  def update_fn(updates, state, params):
    decayed = jax.tree.map(
        lambda u, p, path: u + weight_decay * factors(path) * p, updates, params,
        _per_leaf(lambda path, p: "/".join(path_keys(path)), params))
    return decayed, state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def muon(learning_rate, adam: optax.GradientTransformation, *, momentum, nesterov: bool,
         ns_steps: int, weight_decay, consistent_rms, multipliers=None
         ) -> optax.GradientTransformation:
  """Muon for the matrices of :func:`labels`, ``adam`` for the rest.

  The Muon group is ``optax.contrib.scale_by_muon`` (momentum ``momentum``,
  bias-corrected, Nesterov with ``nesterov``; ``ns_steps`` quintic
  Newton-Schulz iterations with Jordan's coefficients (3.4445, -4.7750,
  2.0315), each matrix first divided by its Frobenius norm), then
  :func:`scale_by_shape`, decoupled weight decay (every Muon leaf is a
  hidden matrix), and ``learning_rate``: `W <- W - lr (s NS(M) + wd W)`.

  This is ``optax.contrib.muon`` with the Adam group passed in: optax's own
  decays every Adam leaf (norm scales and biases too) and uses Nesterov there
  when Muon does, where here the Adam group is the run's AdamW, with its
  decay mask. ``momentum``, ``weight_decay`` and ``consistent_rms`` may be
  traced; ``ns_steps`` and ``nesterov`` are choices of the program.

  ``multipliers`` (path -> ``param_groups.Multipliers``; None: none) gives
  each matrix its rate factor f and decay factor: `W <- W - lr f (s NS(M) +
  wd g W)` (model.parametrization's rules).
  """
  if multipliers is None:
    decay = optax.add_decayed_weights(weight_decay)
    rate = (optax.scale_by_learning_rate(learning_rate),)
  else:
    decay = decay_per_leaf(weight_decay, lambda p: multipliers(p).weight_decay)
    rate = (optax.scale_by_learning_rate(learning_rate),
            scale_per_leaf(lambda p: multipliers(p).lr))
  matrices = optax.chain(
      optax.contrib.scale_by_muon(ns_steps=ns_steps, beta=momentum, nesterov=nesterov,
                                  weight_dimension_numbers=_dimension_numbers_tree),
      scale_by_shape(consistent_rms),
      decay, *rate)
  return optax.partition({"muon": matrices, "adam": adam}, labels)


# ------------------------------------------------------ the assignment, shown
def assignment(params: Any) -> dict:
  """{group: {"count", "params", "parameters": {path: {"shape", and for Muon
  "reduction_axes", "output_axes"}}}} over ``params`` (boxed or not, arrays or
  shapes), as the run prints it and writes it beside its config."""
  out = {g: {"count": 0, "params": 0, "parameters": {}} for g in GROUPS}
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for path, x in leaves:
    dims = dimension_numbers(path, x)
    group = out["adam" if dims is None else "muon"]
    entry = {"shape": list(x.shape)}
    if dims is not None:
      entry.update(reduction_axes=list(dims.reduction_axis),
                   output_axes=list(dims.output_axis))
    group["parameters"]["/".join(path_keys(path))] = entry
    group["count"] += 1
    group["params"] += math.prod(x.shape)
  return out


def _brace(patterns: list[str], index: int) -> list[str]:
  """Patterns equal but for the part at ``index`` (from the end), merged:
  ``a/x/k`` and ``a/y/k`` -> ``a/{x,y}/k``."""
  merged: dict[tuple, list[str]] = {}
  for p in patterns:
    parts = p.split("/")
    if len(parts) < -index:
      merged.setdefault((p,), [])
      continue
    key = (*parts[:index], "", *parts[len(parts) + index + 1:])
    merged.setdefault(key, []).append(parts[index])
  out = []
  for key, values in merged.items():
    if not values:
      out.append(key[0])
      continue
    part = values[0] if len(values) == 1 else "{" + ",".join(values) + "}"
    hole = key.index("")
    out.append("/".join((*key[:hole], part, *key[hole + 1:])))
  return out


def _patterns(paths) -> list[str]:
  """Paths with layer numbers folded (``layer_*``) and siblings braced:
  ``decoder/layer_*/self_attention/{key,out,query,value}/kernel``."""
  folded = sorted({re.sub(r"layer_\d+", "layer_*", p) for p in paths})
  return _brace(_brace(folded, -2), -1)


def format_assignment(groups: dict) -> str:
  """A compact table: group, arrays, parameters, and the paths (folded)."""
  lines = [f"{'group':<6} {'arrays':>6} {'params':>12}  parameters"]
  for name in GROUPS:
    g = groups[name]
    patterns = _patterns(g["parameters"]) or ["-"]
    lines.append(f"{name:<6} {g['count']:>6} {g['params']:>12,}  {patterns[0]}")
    lines.extend(f"{'':<6} {'':>6} {'':>12}  {p}" for p in patterns[1:])
  return "\n".join(lines)
