"""The value residual (``model.value_residual``, ResFormer) against NumPy.

A stack of pre-norm layers written out in NumPy, layer 1's values mixed into
every later layer's (fixed 1/2 and 1/2, or the layer's learned pair); the
scanned stack against the loop, with remat; causality and padding; cached
decoding against the uncached forward in both decoder families; the errors.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.model import decoding as search
from tfx_jax.model.blocks import Stack
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import (attention_mask, build_model, init_params, layer_spec,
                                    stack_layer_params)
from references import np_attention, np_dense, np_layernorm, rand

B, L, D, LAYERS = 2, 6, 16, 3


def _cfg(mode, **kw):
  fields = dict(family="decoder_only", position="none", num_layers=LAYERS, d_model=D,
                num_heads=4, num_kv_heads=2, activation="relu", vocab_size=23, max_len=16,
                value_residual=mode)
  return model_config_from_dict(dict(fields, **kw))


def _perturbed(params, seed=0):
  leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, nn.unbox(params)))
  return jax.tree.unflatten(tree, [x + rand(seed + i, *x.shape, scale=0.3)
                                   for i, x in enumerate(leaves)])


def np_stack(x, p, mask, learned, eps=1e-6):
  """Pre-norm layers x <- x + Attn(LN(x)), x <- x + FFN(LN(x)), final LN, with
  V_n <- a_n V_n + b_n V_1 for n >= 2 (a = b = 1/2, or the layer's lambdas)."""
  v1 = None
  for i in range(LAYERS):
    lp = p[f"layer_{i}"]
    h = np_layernorm(x, lp["self_attention_norm"]["scale"], lp["self_attention_norm"]["bias"],
                     eps)
    a = lp["self_attention"]
    q, k, v = (np_dense(h, a[n]) for n in ("query", "key", "value"))
    if i == 0:
      v1 = v
    else:
      lam = ((float(lp["value_lambda"]), float(lp["first_value_lambda"])) if learned
             else (0.5, 0.5))
      v = lam[0] * v + lam[1] * v1
    o = np_attention(q, k, v, mask)
    x = x + np.einsum("blhk,hkd->bld", o, a["out"]["kernel"]) + a["out"]["bias"]
    h = np_layernorm(x, lp["ffn_norm"]["scale"], lp["ffn_norm"]["bias"], eps)
    x = x + np_dense(np.maximum(np_dense(h, lp["ffn"]["wi"]), 0.0), lp["ffn"]["wo"])
  return np_layernorm(x, p["final_norm"]["scale"], p["final_norm"]["bias"], eps)


def _stack_case(mode, scan=False, remat="none"):
  cfg = _cfg(mode)
  spec = layer_spec(cfg, "decoder", cross_attention=False)
  # Row 1: two packed documents (every query sees a key: the NumPy softmax of
  # a row with none would be NaN).
  seg = np.ones((B, L), np.int32)
  seg[1, 4:] = 2
  mask = attention_mask(jnp.asarray(seg), jnp.asarray(seg), causal=True)
  pos = jnp.broadcast_to(jnp.arange(L), (B, L))
  x = jnp.asarray(rand(1, B, L, D))
  loop = Stack(spec, LAYERS)
  params = _perturbed(loop.init(jax.random.PRNGKey(0), x, mask, None, pos)["params"])
  stack = Stack(spec, LAYERS, scan_layers=scan, remat=remat)
  p = stack_layer_params({"decoder": params})["decoder"] if scan else params
  f = lambda p, x: stack.apply({"params": p}, x, mask, None, pos)[0]
  return f, p, params, x, mask, seg


@pytest.mark.parametrize("mode", ["fixed", "learned"])
def test_stack_equals_numpy(mode):
  f, p, params, x, mask, _ = _stack_case(mode)
  got = np.asarray(f(p, x))
  want = np_stack(np.asarray(x), params, np.asarray(mask), mode == "learned")
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # Not vacuous: without the residual the stack computes something else.
  plain = np_stack(np.asarray(x), {**params, **{f"layer_{i}": {
      **params[f"layer_{i}"], "value_lambda": 1.0, "first_value_lambda": 0.0}
      for i in range(LAYERS)}}, np.asarray(mask), True)
  assert np.abs(plain - want).max() > 1e-2


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_stack_equals_the_loop_forward_and_gradient(remat):
  """nn.scan carries V_1 with the stream; layer 1 is the scanned flag's."""
  f, p, params, x, _, _ = _stack_case("learned")
  g, sp, _, _, _, _ = _stack_case("learned", scan=True, remat=remat)
  loss = lambda f: lambda p: jnp.sum(jnp.sin(f(p, x)))
  want, want_grads = jax.jit(jax.value_and_grad(loss(f)))(params)
  got, got_grads = jax.jit(jax.value_and_grad(loss(g)))(sp)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               got_grads, stack_layer_params({"decoder": want_grads})["decoder"])
  # Layer 1's lambdas are not read; the later layers' are.
  assert float(want_grads["layer_0"]["value_lambda"]) == 0.0
  assert abs(float(want_grads["layer_2"]["first_value_lambda"])) > 0.0


def test_learned_starts_at_fixed():
  cfg_f, cfg_l = _cfg("fixed"), _cfg("learned")
  ids = jnp.asarray(np.random.default_rng(0).integers(5, 23, (B, L)), jnp.int32)
  pf, pl = init_params(cfg_f, jax.random.PRNGKey(0)), init_params(cfg_l, jax.random.PRNGKey(0))
  assert nn.unbox(pl["decoder"]["layer_1"]["value_lambda"]) == 0.5
  out_f = build_model(cfg_f).apply({"params": pf}, ids)["logits"]
  out_l = build_model(cfg_l).apply({"params": pl}, ids)["logits"]
  np.testing.assert_array_equal(np.asarray(out_f), np.asarray(out_l))


def test_causal_and_padding_invariant():
  """Changing token t changes no logit before t; padding ids change no real logit."""
  cfg = _cfg("learned", position="rope")
  model = build_model(cfg)
  params = _perturbed(init_params(cfg, jax.random.PRNGKey(1)), 3)
  ids = np.random.default_rng(1).integers(5, 23, (1, 8)).astype(np.int32)
  other = ids.copy()
  other[0, 5] = 5 + (ids[0, 5] - 4) % 18
  seg = np.array([[1, 1, 1, 1, 1, 0, 0, 0]], np.int32)
  batch = jnp.asarray(np.concatenate([ids, other]))
  out = np.asarray(model.apply({"params": params}, batch)["logits"])
  np.testing.assert_allclose(out[1, :5], out[0, :5], rtol=0, atol=1e-6)
  assert np.abs(out[1, 5] - out[0, 5]).max() > 1e-4
  padded = np.asarray(model.apply({"params": params}, batch,
                                  segment_ids=jnp.asarray(np.concatenate([seg, seg])))["logits"])
  np.testing.assert_allclose(padded[1, :5], padded[0, :5], rtol=0, atol=1e-6)


PROMPTS = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("family,mode,scan", [
    ("decoder_only", "fixed", False),
    ("decoder_only", "learned", True),
    ("encoder_decoder", "learned", False),
])
@pytest.mark.slow
def test_cached_greedy_equals_uncached(family, mode, scan):
  """The cache holds the mixed values; each step's V_1 is layer 1's values of
  the new token."""
  cfg = _cfg(mode, family=family, position="rope", num_layers=2, scan_layers=scan,
             vocab_size=24, max_len=32)
  params = init_params(cfg, jax.random.PRNGKey(0))
  if family == "decoder_only":
    cached = search.generate(params, cfg, PROMPTS, 7, greedy=True, eos_id=-1)
  else:
    cached = search.translate_greedy(params, cfg, PROMPTS, max_len=7, eos_id=-1)
  want = search.uncached_greedy(params, cfg, PROMPTS, 7, eos_id=-1)
  np.testing.assert_array_equal(np.asarray(cached), want)


@pytest.mark.parametrize("fields", [
    dict(num_layers=1),
    dict(family="encoder_decoder", num_layers=3, num_decoder_layers=1),
])
def test_fewer_than_two_layers_is_an_error_naming_the_choices(fields):
  with pytest.raises(ConfigError, match="model.value_residual='fixed'.*none, fixed, learned"):
    _cfg("fixed", **fields)
  with pytest.raises(ConfigError, match="value_residual"):
    _cfg("nearly")
