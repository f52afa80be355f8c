"""Every ablation axis builds and trains: one optimizer step lowers the loss.

The axes are the fields of ``tfx_jax.model.config.ModelConfig`` typed as a
``Literal`` or ``bool``, or as a number annotated with the values to try
(``Annotated[float, Samples((0.0, 5.0))]``: the soft-caps, the attention
window), read from its type hints, so a new axis or a new value
is covered without editing this file; a field is left out only through
``NOT_AXES``, with the test that covers it instead. ``bool`` fields are axes
because each is an architecture switch (``use_bias``, ``scale_attention_logits``,
``output_bias``...) that changes what a layer computes, as a ``Literal`` value does.

The combinations are a pairwise covering design (``pairwise_design``): every
pair of values of any two axes appears in at least one combination, where some
valid combination has that pair, plus the architecture of every preset in
``configs/`` (the papers' settings the training tests use). Each combination is
one test, at a tiny size (1 layer, d_model 8, 2 heads, 4 tokens, vocabulary
11), with the numeric fields that a value reads (``WITH_VALUE``: a RoPE scaling
by a factor of 2, so that it changes the model, and YaRN's pre-training
length) set alongside it: the model is initialised, differentiated, updated once by Adam and
evaluated again, eagerly: op-by-op dispatch of ops compiled once per shape is
far cheaper here than one XLA compile per model. The settings outside the
grid (scan + remat, bfloat16, classification heads, untied embeddings,
GQA/MQA, dropout, partial rotary positions) are tested first.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import typing
from typing import Callable, Literal, Mapping, get_args, get_origin

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import (Family, ModelConfig, Remat, Samples,
                                  model_config_from_dict)
from tfx_jax.model.families import build_model, stack_layer_params
from helpers import ALL_PRESETS, load_config

FAMILIES = get_args(Family)
TINY_MODEL = dict(num_layers=1, d_model=8, num_heads=2, vocab_size=11, max_len=4)
SEQ_LEN = 4
IDS = jnp.asarray([[5, 6, 7, 8], [9, 10, 2, 3]], jnp.int32)
TARGETS = jnp.asarray([[6, 7, 8, 3], [10, 2, 3, 0]], jnp.int32)

# Numeric fields set with a value of an axis, so that the value computes
# something else than the default (a scaling factor of 1 is the identity) and is
# valid (YaRN needs the context length it extends). Shorter than SEQ_LEN: the
# scaled frequencies are those that matter.
WITH_VALUE = {
    ("rope_scaling", "linear"): dict(rope_scaling_factor=2.0),
    ("rope_scaling", "ntk"): dict(rope_scaling_factor=2.0),
    ("rope_scaling", "yarn"): dict(rope_scaling_factor=2.0, rope_original_max_len=2),
    # A base shape half the tiny width (and depth 1 of 1): m = 2, so that the
    # multipliers are not the identity.
    ("parametrization", "mup"): dict(mup_base_d_model=4),
    ("parametrization", "completep"): dict(mup_base_d_model=4, mup_base_layers=1),
    # A second layer: the value residual mixes layer 1's values into layer 2's, and
    # nope_every=2 makes layer 2 the one without RoPE.
    ("value_residual", "fixed"): dict(num_layers=2),
    ("value_residual", "learned"): dict(num_layers=2),
    ("nope_every", 2): dict(num_layers=2),
    # A shared expert for the gate to gate (with ffn_type=moe).
    ("shared_expert_gate", True): dict(shared_experts=1),
}

# Literal and bool fields of ModelConfig that are not axes of the design, each
# with the reason and the test that covers it.
NOT_AXES = {
    "remat": "trades memory for compute and must not change a number: "
             "test_scan_and_remat_give_the_same_gradients checks every policy",
    "scan_layers": "how the layers run, not what they compute: "
                   "test_scan_and_remat_give_the_same_gradients",
    "dtype": "the compute precision, not the architecture: test_bfloat16_compute "
             "compares bfloat16 with float32 for every family",
}


def _args(family, ids=IDS):
  return (ids,) if family != "encoder_decoder" else (ids, ids)


def _loss_fn(model, family, key="logits", labels=TARGETS, rngs=None):
  def loss(params):
    out = model.apply({"params": params}, *_args(family), rngs=rngs)
    return optax.softmax_cross_entropy_with_integer_labels(out[key], labels).mean()
  return loss


def _loss_and_grads(cfg, key="logits", labels=TARGETS):
  model = build_model(cfg)
  params = model.init(jax.random.PRNGKey(0), *_args(cfg.family))["params"]
  loss, grads = jax.value_and_grad(_loss_fn(model, cfg.family, key, labels))(params)
  return model, params, loss, grads


def _problems(loss, grads):
  """What is wrong with a (loss, gradient) pair, or an empty list."""
  problems = []
  if not np.isfinite(float(loss)):
    problems.append(f"loss {float(loss)}")
  leaves = jax.tree_util.tree_leaves_with_path(nn.unbox(grads))
  bad = [jax.tree_util.keystr(p) for p, g in leaves if not np.isfinite(np.asarray(g)).all()]
  if bad:
    problems.append(f"non-finite gradients in {bad}")
  if not any(np.abs(np.asarray(g)).max() > 0 for _, g in leaves):
    problems.append("all gradients are zero")
  return problems


# ------------------------------------------------------ the covering design
Combination = dict  # {axis: value}
Pair = frozenset  # {(axis, value), (axis, value)}: two values of two axes


def pairs_of(combination: Mapping) -> set[Pair]:
  """The pairs of values of two axes that ``combination`` contains."""
  items = list(combination.items())
  return {frozenset(p) for p in itertools.combinations(items, 2)}


def all_pairs(axes: Mapping[str, tuple]) -> set[Pair]:
  """Every pair of values of two different axes."""
  return {frozenset({(a, v), (b, w)}) for a, b in itertools.combinations(axes, 2)
          for v in axes[a] for w in axes[b]}


# ModelConfig's rules relate two or three fields, so a partial combination
# that has a valid completion has one that differs from the first values of
# the other axes in at most this many axes. Searching the whole product
# instead costs its size (billions of combinations) for every pair that no
# valid combination has.
MAX_CHANGES = 2


def completion(axes: Mapping[str, tuple], valid: Callable[[Combination], bool],
               partial: Mapping, max_changes: int = MAX_CHANGES) -> Combination | None:
  """A valid combination that agrees with ``partial``, or None when there is
  none with the other axes at their first values but for at most
  ``max_changes`` of them: the first such, fewest changes first, in axis and
  value order."""
  free = [a for a in axes if a not in partial]
  first = {a: axes[a][0] for a in free}
  for changes in range(min(max_changes, len(free)) + 1):
    for changed in itertools.combinations(free, changes):
      for values in itertools.product(*(axes[a][1:] for a in changed)):
        chosen = {**first, **dict(zip(changed, values))}
        combination = {a: partial[a] if a in partial else chosen[a] for a in axes}
        if valid(combination):
          return combination
  return None


def pairwise_design(axes: Mapping[str, tuple],
                    valid: Callable[[Combination], bool] | None = None,
                    seeds=()) -> list[Combination]:
  """Valid combinations of ``axes`` ({axis: values}) in which every pair of values
  of two axes that some valid combination contains appears at least once: the
  ``seeds`` (complete, valid combinations) first, then greedy additions.

  Greedy as AETG (Cohen et al. 1997, "The AETG system"), without its random
  candidates: each new combination starts from the uncovered pair whose two
  values take part in the most uncovered pairs, then fills the other axes,
  those with more values first (as IPOG does), each with the value that covers
  the most uncovered pairs together with the values chosen so far, among those
  that still have a valid completion. Ties go to the order of ``axes`` and of
  their values, so the design, and the test ids made from it, are the same on
  every run. ``valid`` (default: every combination is) says which are.
  """
  valid = valid or (lambda combination: True)
  rank = {(a, v): (i, j) for i, a in enumerate(axes) for j, v in enumerate(axes[a])}
  fill_order = sorted(axes, key=lambda a: (-len(axes[a]), rank[(a, axes[a][0])]))
  uncovered = all_pairs(axes)
  design = []
  for seed in seeds:
    if set(seed) != set(axes) or not valid(seed):
      raise ValueError(f"seed {seed} is not a valid combination of {list(axes)}")
    design.append(dict(seed))
    uncovered -= pairs_of(seed)
  while uncovered:
    need = collections.Counter(value for pair in uncovered for value in pair)
    start = min(uncovered, key=lambda pair: (-sum(need[v] for v in pair),
                                             sorted(rank[v] for v in pair)))
    combination = dict(start)
    if completion(axes, valid, combination) is None:
      uncovered.discard(start)  # no valid combination has this pair
      continue
    for axis in (a for a in fill_order if a not in combination):
      def preference(value, axis=axis):
        gain = sum(frozenset({(axis, value), chosen}) in uncovered
                   for chosen in combination.items())
        return -gain, -need[(axis, value)], rank[(axis, value)]
      # One exists: the combination so far has a valid completion.
      combination[axis] = next(
          value for value in sorted(axes[axis], key=preference)
          if completion(axes, valid, {**combination, axis: value}) is not None)
    combination = {a: combination[a] for a in axes}
    design.append(combination)
    uncovered -= pairs_of(combination)
  return design


def _samples(kind) -> tuple | None:
  """The values of an ``Annotated[number, Samples(...)]`` type, else None."""
  if get_origin(kind) is not typing.Annotated:
    return None
  found = [m.values for m in kind.__metadata__ if isinstance(m, Samples)]
  return found[0] if found else None


def switch_fields() -> dict[str, tuple]:
  """{field: its values} for every Literal, bool or sampled numeric field of
  ModelConfig."""
  hints = typing.get_type_hints(ModelConfig, include_extras=True)
  out = {}
  for field in dataclasses.fields(ModelConfig):
    kind = hints[field.name]
    if get_origin(kind) is Literal:
      out[field.name] = get_args(kind)
    elif kind is bool:
      out[field.name] = (False, True)
    elif _samples(kind) is not None:
      out[field.name] = _samples(kind)
  return out


AXES = {name: values for name, values in switch_fields().items() if name not in NOT_AXES}


def model_fields(combination: Mapping) -> dict:
  """The tiny model with ``combination`` and the numeric fields its values read."""
  fields = dict(TINY_MODEL)
  for (axis, value), extra in WITH_VALUE.items():
    if combination.get(axis) == value:
      fields.update(extra)
  return dict(fields, **combination)


def valid(combination: Mapping) -> bool:
  """Whether the model config accepts ``combination`` at the tiny size."""
  return _valid(tuple(sorted(combination.items())))


@functools.lru_cache(maxsize=None)
def _valid(items: tuple) -> bool:
  # The design's search asks about the same combination many times.
  try:
    model_config_from_dict(model_fields(dict(items)), seq_len=SEQ_LEN)
  except ConfigError:
    return False
  return True


def preset_architectures() -> list[Combination]:
  """The values of the axes in every preset of configs/, once each."""
  out = []
  for file, preset in ALL_PRESETS:
    cfg = model_config_from_dict(load_config(f"{file}:{preset}").model)
    combination = {axis: getattr(cfg, axis) for axis in AXES}
    if combination not in out:
      out.append(combination)
  return out


DESIGN = pairwise_design(AXES, valid, seeds=preset_architectures())


def _combination_id(combination: Mapping) -> str:
  """Literal values in axis order, then the bool switches not at their default."""
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  return "-".join([str(v) for v in combination.values() if not isinstance(v, bool)] +
                  [f"{a}={v}" for a, v in combination.items()
                   if isinstance(v, bool) and v != defaults[a]])


# ------------------------------------------------- tests of the design itself
SYNTHETIC = {
    "no constraint": ({"a": (0, 1, 2), "b": ("x", "y", "z"), "c": (False, True),
                       "d": ("p", "q"), "e": (0, 1, 2, 3)}, lambda c: True),
    "pair constraints": ({"a": (0, 1, 2), "b": ("x", "y", "z"), "c": (False, True),
                          "d": ("p", "q", "r", "s")},
                         lambda c: not (c["a"] == 0 and c["b"] == "x") and
                         not (c["c"] and c["d"] in ("r", "s"))),
    # No rule forbids (a=1, b=y) as such, but every combination with it is invalid.
    "a three-way constraint": ({"a": (0, 1), "b": ("x", "y"), "c": (0, 1, 2),
                                "d": (False, True)},
                               lambda c: not (c["a"] == 1 and c["b"] == "y" and c["c"] != 2)
                               and not (c["c"] == 2 and c["b"] == "y")),
    "a value valid with one value of another axis only": (
        {"family": ("p", "q", "r"), "size": (1, 2, 3), "mode": ("s", "t", "u")},
        lambda c: c["mode"] != "u" or c["family"] == "r"),
}


def _valid_pairs(axes, is_valid) -> set[Pair]:
  """The pairs of every valid combination in the product of the axes."""
  product = (dict(zip(axes, values)) for values in itertools.product(*axes.values()))
  return set().union(*(pairs_of(c) for c in product if is_valid(c)))


@pytest.mark.parametrize("case", SYNTHETIC)
def test_pairwise_design_covers_every_valid_pair(case):
  axes, is_valid = SYNTHETIC[case]
  design = pairwise_design(axes, is_valid)
  assert all(is_valid(c) and list(c) == list(axes) for c in design)
  assert set().union(*map(pairs_of, design)) >= _valid_pairs(axes, is_valid)
  assert len(design) < math.prod(len(values) for values in axes.values())
  assert design == pairwise_design(axes, is_valid)  # deterministic


def test_pairwise_design_starts_with_its_seeds_and_rejects_invalid_ones():
  axes, is_valid = SYNTHETIC["pair constraints"]
  seeds = [{"a": 0, "b": "y", "c": True, "d": "q"}, {"a": 2, "b": "z", "c": False, "d": "s"}]
  design = pairwise_design(axes, is_valid, seeds)
  assert design[:2] == seeds
  assert set().union(*map(pairs_of, design)) >= _valid_pairs(axes, is_valid)
  with pytest.raises(ValueError, match="not a valid combination"):
    pairwise_design(axes, is_valid, [{"a": 0, "b": "x", "c": False, "d": "p"}])
  with pytest.raises(ValueError, match="not a valid combination"):
    pairwise_design(axes, is_valid, [{"a": 1}])


def test_the_axes_are_every_literal_bool_and_sampled_field_of_the_model_config():
  hints = typing.get_type_hints(ModelConfig, include_extras=True)
  switches = {f.name for f in dataclasses.fields(ModelConfig)
              if get_origin(hints[f.name]) is Literal or hints[f.name] is bool
              or _samples(hints[f.name]) is not None}
  assert set(NOT_AXES) <= switches, "NOT_AXES names a field that is not a switch"
  assert set(AXES) == switches - set(NOT_AXES)
  assert {"family", "norm_position", "norm_type", "activation", "position",
          "embedding_norm", "sinusoidal_layout", "use_bias", "qk_norm", "block",
          "attention_gate", "attention_logit_softcap", "final_logit_softcap",
          "attention_window", "global_every"} <= set(AXES)
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  assert all(list(c) == list(AXES) for c in DESIGN)
  for axis, values in AXES.items():
    sampled = _samples(hints[axis])
    assert (values == (False, True) or values == get_args(hints[axis])
            or (values == sampled and sampled[0] == defaults[axis]))
    assert {c[axis] for c in DESIGN} == set(values), axis


def test_the_design_covers_every_valid_pair_and_every_preset():
  assert all(valid(c) for c in DESIGN)
  covered = set().union(*map(pairs_of, DESIGN))
  missing = [sorted(pair, key=str) for pair in all_pairs(AXES) - covered
             if completion(AXES, valid, dict(pair)) is not None]
  assert not missing
  assert all(preset in DESIGN for preset in preset_architectures())
  assert len({_combination_id(c) for c in DESIGN}) == len(DESIGN)


# ------------------------------------------------------------ outside the grid
_stacked = stack_layer_params


@pytest.mark.parametrize("remat", get_args(Remat))
@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
@pytest.mark.slow
def test_scan_and_remat_give_the_same_gradients(scan_layers, remat):
  """Rematerialisation only trades memory for compute: same loss, same gradients."""
  base = dict(TINY_MODEL, num_layers=2, family="decoder_only", position="rope",
              activation="swiglu")
  ref_cfg = model_config_from_dict(base)
  _, ref_params, ref_loss, ref_grads = _loss_and_grads(ref_cfg)
  cfg = model_config_from_dict(dict(base, scan_layers=scan_layers, remat=remat))
  model = build_model(cfg)
  params = _stacked(ref_params) if scan_layers else nn.unbox(ref_params)
  # Eagerly, lax.scan would compile its body per configuration; under
  # disable_jit it runs as a Python loop over the layers with the same semantics.
  with jax.disable_jit():
    loss, grads = jax.value_and_grad(_loss_fn(model, cfg.family))(params)
  assert not _problems(loss, grads)
  want = _stacked(ref_grads) if scan_layers else nn.unbox(ref_grads)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
               nn.unbox(grads), want)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_bfloat16_compute(family):
  cfg = model_config_from_dict(dict(TINY_MODEL, family=family, dtype="bfloat16",
                                    activation="swiglu", position="rope"))
  model, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(params)))
  out = model.apply({"params": params}, *_args(family))
  assert out["logits"].dtype == jnp.float32  # the loss is taken in float32
  # Close to the float32 model with the same parameters.
  f32 = build_model(model_config_from_dict(dict(TINY_MODEL, family=family,
                                                activation="swiglu", position="rope")))
  ref = f32.apply({"params": params}, *_args(family))["logits"]
  np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(ref), atol=0.1)


@pytest.mark.parametrize("family", ["decoder_only", "encoder_only"])
@pytest.mark.slow
def test_classification_head(family):
  cfg = model_config_from_dict(dict(TINY_MODEL, family=family, num_classes=3))
  labels = jnp.asarray([2, 0])
  model, params, loss, grads = _loss_and_grads(cfg, key="class_logits", labels=labels)
  assert not _problems(loss, grads)
  assert np.abs(np.asarray(nn.unbox(grads["classifier"]["kernel"]))).max() > 0
  out = model.apply({"params": params}, *_args(family))
  assert out["class_logits"].shape == (2, 3)
  assert out["logits"].shape == (2, 4, 11)


@pytest.mark.parametrize("family", FAMILIES)
def test_untied_embeddings(family):
  tied = model_config_from_dict(dict(TINY_MODEL, family=family))
  untied = model_config_from_dict(dict(TINY_MODEL, family=family, tie_embeddings=False))
  _, tied_params, _, _ = _loss_and_grads(tied)
  model, params, loss, grads = _loss_and_grads(untied)
  assert not _problems(loss, grads)
  assert "output" in params and "output" not in tied_params
  assert nn.unbox(params["output"]["kernel"]).shape == (8, 11)
  assert np.abs(np.asarray(nn.unbox(grads["output"]["kernel"]))).max() > 0


@pytest.mark.parametrize("num_kv_heads", [1, 2], ids=["mqa", "gqa"])  # mha: the grid
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_grouped_query_attention(family, num_kv_heads):
  cfg = model_config_from_dict(dict(TINY_MODEL, family=family, num_heads=4,
                                    num_kv_heads=num_kv_heads, position="rope"))
  _, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  stack = "decoder" if family != "encoder_only" else "encoder"
  attn = nn.unbox(params[stack]["layer_0"]["self_attention"])
  assert attn["query"]["kernel"].shape == (8, 4, 2)
  assert attn["key"]["kernel"].shape == (8, num_kv_heads, 2)
  assert attn["value"]["kernel"].shape == (8, num_kv_heads, 2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_dropout_in_training_mode(family):
  cfg = model_config_from_dict(dict(TINY_MODEL, family=family, dropout=0.3,
                                    attention_dropout=0.2))
  eval_model = build_model(cfg)
  params = eval_model.init(jax.random.PRNGKey(0), *_args(family))["params"]
  train = build_model(cfg, deterministic=False)
  losses = []
  for seed in (1, 2):
    loss, grads = jax.value_and_grad(_loss_fn(
        train, family, rngs={"dropout": jax.random.PRNGKey(seed)}))(params)
    assert not _problems(loss, grads)
    losses.append(float(loss))
  eval_loss = float(_loss_fn(eval_model, family)(params))
  assert losses[0] != losses[1] and eval_loss not in losses
  # Evaluation is deterministic.
  assert float(_loss_fn(eval_model, family)(params)) == eval_loss


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_rotary_positions(family):
  """``rope_fraction`` (GPT-NeoX): half of each head rotated, here with YaRN, whose
  attention factor scales the rotated half; the parameters are those of full RoPE."""
  rope = dict(TINY_MODEL, family=family, position="rope")
  cfg = model_config_from_dict(dict(rope, rope_fraction=0.5, rope_scaling="yarn",
                                    rope_scaling_factor=2.0, rope_original_max_len=2))
  assert cfg.rope_dims == 2
  model, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  assert not _step_problems(cfg, model, params, loss, grads)
  _, full_params, full_loss, _ = _loss_and_grads(model_config_from_dict(rope))
  assert (jax.tree.map(np.shape, nn.unbox(params)) ==
          jax.tree.map(np.shape, nn.unbox(full_params)))
  assert float(loss) != float(full_loss)


# ------------------------------------------------------------------ the grid
def _step_problems(cfg, model, params, loss, grads):
  """One Adam update (lr 1e-3: a step of about lr per parameter, whatever the
  gradient scale) must lower the loss: the gradients reach the parameters with
  the right sign."""
  opt = optax.adam(1e-3)
  updates, _ = opt.update(grads, opt.init(params), params)
  new_loss = float(_loss_fn(model, cfg.family)(optax.apply_updates(params, updates)))
  if not new_loss < float(loss):
    return [f"loss {float(loss)} -> {new_loss} after one optimizer step"]
  return []


@pytest.mark.parametrize("combination", DESIGN, ids=_combination_id)
@pytest.mark.slow
def test_ablation_combination_trains(combination):
  """A finite loss and gradients, not all zero, and one optimizer step lowers the loss."""
  cfg = model_config_from_dict(model_fields(combination), seq_len=SEQ_LEN)
  model, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  assert not _step_problems(cfg, model, params, loss, grads)
