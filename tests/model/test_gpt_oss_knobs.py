"""gpt-oss's model knobs: ``model.activation='swiglu_oss'`` (``swiglu_limit``,
``swiglu_alpha``; model/config_ffn.py, model/layers/ffn.py),
``model.router_use_bias`` (model/layers/moe.py) and ``model.rope_yarn_truncate``
(model/layers/positions.py): each against a NumPy formula, the config checks,
and transformers' own YaRN without truncation.
"""

from __future__ import annotations

import math

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model
from tfx_jax.model.layers import moe
from tfx_jax.model.layers.ffn import FeedForward, activation_fn, ffn_activation
from tfx_jax.model.layers.positions import rotary_spec

MOE = dict(ffn_type="moe", num_experts=4, experts_per_token=2, activation="swiglu")


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------------------------- the activation
@pytest.mark.parametrize("limit,alpha", [(7.0, 1.702), (0.5, 1.0)])
def test_swiglu_oss_ffn_matches_numpy(limit, alpha):
  """(min(g, l) sigmoid(alpha min(g, l)) * (clip(u, -l, l) + 1)) W2 + b2 with
  g = x W + b, u = x V + c: transformers' GptOssExperts._apply_gate."""
  act, gated, up = ffn_activation("swiglu_oss", limit, alpha)
  assert gated and up is not None
  x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32) * 4.0
  module = FeedForward(d_ff=12, act=act, gated=True, use_bias=True, up=up)
  p = jax.tree.map(np.asarray, nn.unbox(module.init(jax.random.PRNGKey(1), x)["params"]))
  rng = np.random.default_rng(1)
  for name in p:  # zero-initialised: make them matter
    p[name]["bias"] = rng.normal(size=p[name]["bias"].shape).astype(np.float32)
  got = np.asarray(module.apply({"params": p}, x))
  dense = lambda name, h: h.astype(np.float64) @ p[name]["kernel"] + p[name]["bias"]
  g = np.minimum(dense("wi", x), limit)
  u = np.clip(dense("wv", x), -limit, limit)
  assert (dense("wi", x) > limit).any() and (np.abs(dense("wv", x)) > limit).any()
  want = dense("wo", g * _sigmoid(alpha * g) * (u + 1.0))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_activation_fn_refuses_swiglu_oss_without_its_up_map():
  with pytest.raises(ValueError, match="ffn_activation"):
    activation_fn("swiglu_oss")
  assert ffn_activation("swiglu")[2] is None


def test_swiglu_oss_experts_match_numpy():
  """Each routed expert applies the clamped SwiGLU (its up map included)."""
  cfg = model_config_from_dict(dict(MOE, activation="swiglu_oss", swiglu_limit=0.5,
                                    d_model=8, num_heads=2, use_bias=True))
  act, _, up = ffn_activation(cfg.activation, cfg.swiglu_limit, cfg.swiglu_alpha)
  layer = moe.MixtureOfExperts(moe.moe_spec(cfg), act=act, gated=True, use_bias=True, up=up)
  x = np.random.default_rng(2).normal(size=(1, 5, 8)).astype(np.float32) * 3.0
  real = np.ones((1, 5), bool)
  p = jax.tree.map(np.asarray, nn.unbox(layer.init(jax.random.PRNGKey(0), x, real)["params"]))
  rng = np.random.default_rng(3)
  for name in ("wi", "wv", "wo"):
    p[name]["bias"] = rng.normal(size=p[name]["bias"].shape).astype(np.float32)
  got = np.asarray(layer.apply({"params": p}, x, real)[0])[0]
  want = np.zeros((5, 8))
  for t, x_D in enumerate(x[0].astype(np.float64)):
    scores = np.exp(x_D @ p["router"]["kernel"])
    scores /= scores.sum()
    top = np.argsort(-scores)[:2]
    for e in top:
      g = np.minimum(x_D @ p["wi"]["kernel"][e] + p["wi"]["bias"][e], 0.5)
      u = np.clip(x_D @ p["wv"]["kernel"][e] + p["wv"]["bias"][e], -0.5, 0.5)
      h = g * _sigmoid(1.702 * g) * (u + 1.0)
      want[t] += scores[e] / scores[top].sum() * (h @ p["wo"]["kernel"][e] + p["wo"]["bias"][e])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- the router
def test_router_bias_is_a_parameter_that_shifts_the_logits():
  cfg = dict(MOE, d_model=8, num_heads=2, vocab_size=11, max_len=8)
  ids = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
  plain_cfg, biased_cfg = (model_config_from_dict(dict(cfg, router_use_bias=b))
                           for b in (False, True))
  flat = lambda c: flax.traverse_util.flatten_dict(
      nn.unbox(build_model(c).init(jax.random.PRNGKey(0), ids)["params"]), sep="/")
  plain, biased = flat(plain_cfg), flat(biased_cfg)
  biases = {k: biased.pop(k) for k in list(biased) if k.endswith("router/bias")}
  assert sorted(biases) == [f"decoder/layer_{i}/ffn/router/bias" for i in (0, 1)]
  assert all(b.shape == (4,) and not np.any(b) for b in biases.values())  # zeros
  assert plain.keys() == biased.keys()  # the default has no router bias
  # A zero bias is the model without one, bit for bit.
  logits = lambda c, p: np.asarray(build_model(c).apply(
      {"params": flax.traverse_util.unflatten_dict(p, sep="/")}, ids)["logits"])
  np.testing.assert_array_equal(logits(biased_cfg, dict(biased, **biases)),
                                logits(plain_cfg, biased))
  # It scores as well as chooses: a large bias on expert 3 routes every token there.
  layer = moe.MixtureOfExperts(moe.moe_spec(biased_cfg), act=jax.nn.silu, gated=True)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 6, 8))
  real = jnp.ones((1, 6), bool)
  p = nn.unbox(layer.init(jax.random.PRNGKey(2), x, real)["params"])
  p["router"]["bias"] = jnp.asarray([0.0, 0.0, 0.0, 100.0])
  _, stats = layer.apply({"params": p}, x, real)
  assert float(stats.counts[0, 3]) == 6.0


# ---------------------------------------------------------------- YaRN's ramp
def _np_yarn_unrounded(dims, base, factor, original):
  """transformers' _compute_yarn_parameters with truncate=False, written out."""
  def index(turns):
    return dims * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
  low, high = max(index(32), 0.0), min(index(1), dims - 1)
  out = []
  for i in range(dims // 2):
    theta = base ** (-2 * i / dims)
    ramp = min(max((i - low) / (high - low), 0.0), 1.0)
    out.append(theta / factor * ramp + theta * (1.0 - ramp))
  return out


@pytest.mark.parametrize("dims,base,factor,original", [
    (8, 10000.0, 4.0, 64), (64, 150000.0, 32.0, 4096), (16, 10000.0, 2.0, 100000)])
def test_yarn_without_truncation_matches_numpy_and_transformers(dims, base, factor,
                                                                 original):
  spec = rotary_spec(dims, base, "yarn", factor, original, yarn_truncate=False)
  np.testing.assert_allclose(spec.inv_freq, _np_yarn_unrounded(dims, base, factor, original),
                             rtol=1e-12)
  assert spec.attention_factor == rotary_spec(dims, base, "yarn", factor,
                                              original).attention_factor
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  config = transformers.GptOssConfig(
      hidden_size=dims * 2, num_attention_heads=2, head_dim=dims, num_key_value_heads=2,
      num_hidden_layers=1, intermediate_size=8, vocab_size=8,
      max_position_embeddings=int(original * factor),
      rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                       "original_max_position_embeddings": original, "truncate": False})
  inv_freq, _ = ROPE_INIT_FUNCTIONS["yarn"](config)
  np.testing.assert_allclose(np.float32(spec.inv_freq), inv_freq.numpy(), rtol=3e-7)


def test_yarn_truncation_is_the_default_and_differs():
  rounded = rotary_spec(8, 10000.0, "yarn", 4.0, 64)
  assert rotary_spec(8, 10000.0, "yarn", 4.0, 64, yarn_truncate=True) == rounded
  assert rotary_spec(8, 10000.0, "yarn", 4.0, 64, yarn_truncate=False) != rounded
  # Read by yarn only.
  assert rotary_spec(8, 10000.0, "linear", 4.0, yarn_truncate=False) == rotary_spec(
      8, 10000.0, "linear", 4.0)


# ---------------------------------------------------------------- config checks
_YARN = dict(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0,
             rope_original_max_len=16)


@pytest.mark.parametrize("fields,named", [
    (dict(activation="swiglu", swiglu_limit=5.0), "model.swiglu_limit=5.0"),
    (dict(activation="gelu", swiglu_alpha=1.0), "model.swiglu_alpha=1.0"),
    (dict(router_use_bias=True), "model.router_use_bias=True"),
    (dict(position="rope", rope_yarn_truncate=False), "model.rope_yarn_truncate=False"),
    (dict(position="learned", rope_yarn_truncate=False), "model.rope_yarn_truncate=False"),
    (dict(_YARN, rope_scaling="linear", rope_original_max_len=0, rope_yarn_truncate=False),
     "model.rope_yarn_truncate=False"),
])
def test_inactive_settings_are_refused(fields, named):
  with pytest.raises(InactiveSetting, match=named):
    model_config_from_dict(fields)


@pytest.mark.parametrize("fields,named", [
    (dict(swiglu_limit=0.0), "model.swiglu_limit must be finite and > 0"),
    (dict(swiglu_limit=math.inf), "model.swiglu_limit must be finite"),
    (dict(swiglu_alpha=-1.0), "model.swiglu_alpha must be finite and > 0"),
])
def test_swiglu_oss_numbers_are_checked(fields, named):
  with pytest.raises(ConfigError, match=named):
    model_config_from_dict(dict(activation="swiglu_oss", **fields))


def test_the_knobs_are_accepted_where_they_act():
  cfg = model_config_from_dict(dict(MOE, **_YARN, activation="swiglu_oss", swiglu_limit=3.0,
                                    swiglu_alpha=1.0, router_use_bias=True,
                                    rope_yarn_truncate=False))
  assert (cfg.gated, cfg.swiglu_limit, cfg.router_use_bias, cfg.rope_yarn_truncate) == (
      True, 3.0, True, False)
