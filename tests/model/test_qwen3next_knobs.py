"""Qwen3-Next's knobs: Gated DeltaNet value heads of their own
(``model.deltanet_v_heads``, ``model.deltanet_v_head_dim``) and the shared
experts' width and sigmoid gate (``model.shared_expert_d_ff``,
``model.shared_expert_gate``): set only where read, their 0 / False defaults
the model as it was, the gate's formula, and the state size counted as built.
(The grouped layer against NumPy and its cached decoding: test_deltanet.py.)
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import budgets
from tfx_jax.model import decoding as search
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, init_params
from tfx_jax.model.layers import moe
from tfx_jax.model.specs import layer_spec

TINY = dict(family="decoder_only", num_layers=2, d_model=16, num_heads=2, vocab_size=23,
            max_len=12, position="rope", activation="swiglu")
MOE = dict(TINY, ffn_type="moe", num_experts=4, experts_per_token=2, expert_d_ff=8)
IDS = jnp.asarray([[3, 4, 5, 6, 7, 8], [5, 9, 7, 12, 15, 3]], jnp.int32)


@pytest.mark.parametrize("fields,error,match", [
    (dict(TINY, deltanet_v_heads=4), InactiveSetting,
     "model.deltanet_v_heads=4 is read by the Gated DeltaNet layers only"),
    (dict(TINY, deltanet_v_head_dim=6), InactiveSetting, "model.deltanet_v_head_dim=6"),
    (dict(TINY, mixer_pattern="DA", deltanet_v_heads=3), ConfigError,
     r"deltanet_v_heads=3 is not a multiple of the 2 key heads.*2, 4, 6"),
    (dict(TINY, mixer_pattern="DA", deltanet_v_head_dim=-1), ConfigError,
     "deltanet_v_head_dim must be >= 0"),
    (dict(TINY, shared_expert_d_ff=8), InactiveSetting,
     "model.shared_expert_d_ff=8 is read by model.ffn_type='moe' only"),
    (dict(TINY, shared_expert_gate=True), InactiveSetting, "model.shared_expert_gate=True"),
    (dict(MOE, shared_expert_gate=True), InactiveSetting,
     "model.shared_expert_gate=True is read by the shared experts only"),
    (dict(MOE, shared_expert_d_ff=8), InactiveSetting, "model.shared_experts is 0"),
    (dict(MOE, shared_experts=1, shared_expert_d_ff=-2), ConfigError,
     "shared_expert_d_ff must be >= 0, got -2"),
], ids=["v-heads-inactive", "v-dim-inactive", "v-heads-multiple", "v-dim-negative",
        "shared-width-dense", "shared-gate-dense", "shared-gate-no-shared",
        "shared-width-no-shared", "shared-width-negative"])
def test_config_errors(fields, error, match):
  with pytest.raises(error, match=match):
    model_config_from_dict(fields)


def _assert_same_model(a: dict, b: dict):
  """Two configs that name the same model: equal parameters and logits."""
  ca, cb = model_config_from_dict(a), model_config_from_dict(b)
  pa, pb = init_params(ca, jax.random.PRNGKey(0)), init_params(cb, jax.random.PRNGKey(0))
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(pa), nn.unbox(pb))
  la = build_model(ca).apply({"params": pa}, IDS)["logits"]
  np.testing.assert_array_equal(la, build_model(cb).apply({"params": pb}, IDS)["logits"])


def test_the_defaults_are_the_widths_as_before():
  # 0 = as many value heads as key heads, of the key width; 0 = shared_experts x
  # the expert width.
  hybrid = dict(TINY, mixer_pattern="DA", deltanet_heads=2, deltanet_head_dim=4)
  _assert_same_model(hybrid, dict(hybrid, deltanet_v_heads=2, deltanet_v_head_dim=4))
  shared = dict(MOE, shared_experts=2)
  _assert_same_model(shared, dict(shared, shared_expert_d_ff=16))


def test_the_shared_width_and_gate_are_built_and_gate_the_shared_output():
  cfg = model_config_from_dict(dict(MOE, shared_experts=1, shared_expert_d_ff=12,
                                    shared_expert_gate=True))
  spec = layer_spec(cfg, "decoder", cross_attention=False).ffn.moe
  assert (spec.shared_dim, spec.shared_gate) == (12, True)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
  real = jnp.ones((2, 5), bool)
  gated = moe.MixtureOfExperts(spec, act=jax.nn.silu, gated=True)
  plain = moe.MixtureOfExperts(dataclasses.replace(spec, shared_gate=False),
                               act=jax.nn.silu, gated=True)
  p = nn.unbox(gated.init(jax.random.PRNGKey(1), x, real))
  assert p["params"]["shared"]["wi"]["kernel"].shape == (16, 12)
  assert p["params"]["shared_gate"]["kernel"].shape == (16, 1)
  p_plain = {"params": {k: v for k, v in p["params"].items() if k != "shared_gate"}}
  y_gated, _ = gated.apply(p, x, real)
  (y_plain, _), state = plain.apply(p_plain, x, real, mutable=["intermediates"],
                                    capture_intermediates=lambda m, _: m.name == "shared")
  shared_TD = state["intermediates"]["shared"]["__call__"][0]
  gate_T1 = jax.nn.sigmoid(x.reshape(-1, 16) @ p["params"]["shared_gate"]["kernel"])
  # gated = routed + g shared = plain - (1 - g) shared
  want = y_plain.reshape(-1, 16) - (1.0 - gate_T1) * shared_TD
  np.testing.assert_allclose(y_gated.reshape(-1, 16), want, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(y_gated - y_plain).max()) > 1e-2


def test_the_recurrent_state_is_counted_as_the_cache_holds_it():
  # 2 key heads of 8 serving 4 value heads of 6: a state of 4 x 8 x 6 per D layer.
  cfg = model_config_from_dict(dict(TINY, num_layers=4, mixer_pattern="DDDA",
                                    deltanet_heads=2, deltanet_head_dim=8,
                                    deltanet_v_heads=4, deltanet_v_head_dim=6))
  assert budgets.recurrent_state_bytes_per_sequence(cfg) == 3 * 4 * 8 * 6 * 4
  assert budgets.token_mixing(cfg).deltanet_state == 4 * 8 * 6
  cache = search.init_cache(cfg, 1, 8)
  states = [x for path, x in jax.tree_util.tree_leaves_with_path(cache)
            if "recurrent_state" in jax.tree_util.keystr(path)]
  assert [x.shape for x in states] == [(1, 4, 8, 6)] * 3
  assert sum(x.size * x.dtype.itemsize for x in states) == (
      budgets.recurrent_state_bytes_per_sequence(cfg))
  convs = {jax.tree_util.keystr(path).split("'")[-2]: x.shape
           for path, x in jax.tree_util.tree_leaves_with_path(cache)
           if "conv_state" in jax.tree_util.keystr(path)}
  assert convs == {"query_conv_state": (1, 3, 2, 8), "key_conv_state": (1, 3, 2, 8),
                   "value_conv_state": (1, 3, 4, 6)}
