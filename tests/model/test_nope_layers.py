"""Interleaved NoPE (``model.nope_every``, ``model.nope_temperature``; Llama 4)
against NumPy and HF's layer rule; the defaults bitwise today's model.

Which layers have no RoPE, the layer with and without it and with Llama 4's
query temperature, whole models (every layer NoPE is ``position='none'``),
scan against the loop, cached decoding against the uncached forward, and the
inactive settings.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import decoding as search
from tfx_jax.model.config import is_nope_layer, model_config_from_dict
from tfx_jax.model.families import build_model, init_params, stack_layer_params
from tfx_jax.model.layers import positions as positions_lib
from tfx_jax.model.layers.attention import Attention, AttentionSpec
from tfx_jax.model.layers.positions import rotary_spec
from references import np_attention, np_dense, np_rope, rand, rope_theta

B, L, D, H, N, K = 2, 5, 16, 4, 2, 4


def test_nope_layers_are_llama4s():
  """HF Llama4TextConfig: no_rope_layers[i] = int((i + 1) % interval != 0)."""
  for k in (1, 2, 4):
    hf_use_rope = [int((i + 1) % k != 0) for i in range(12)]
    assert [int(not is_nope_layer(i, k)) for i in range(12)] == hf_use_rope
  assert not any(is_nope_layer(i, 0) for i in range(12))


def np_temperature(pos):
  """Llama 4: 1 + attn_scale * log1p(floor((pos + 1) / floor_scale)), 0.1 and 8192."""
  return 1.0 + 0.1 * math.log1p(math.floor((pos + 1) / 8192))


def np_layer(x, p, mask, positions, *, rope, temperature):
  q, k, v = (np_dense(x, p[n]) for n in ("query", "key", "value"))
  if rope:
    q, k = (np_rope(y, positions, rope_theta(K)) for y in (q, k))
  if temperature:
    q = q * np.vectorize(np_temperature)(positions)[:, :, None, None]
  out = np_attention(q, k, v, mask)
  return np.einsum("blhk,hkd->bld", out, p["out"]["kernel"]) + p["out"]["bias"]


SMALL = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])
# Past 8191, where the temperature is > 1 (RoPE's float32 angles are not
# compared there: NoPE layers only).
LARGE = np.array([[0, 1, 8190, 8191, 20000], [3, 16382, 16383, 40000, 90000]])
CAUSAL = np.tril(np.ones((L, L), bool))[None, None].repeat(B, 0)


def _layer(x, positions, nope, temperature, params=None):
  spec = AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K, rotary=rotary_spec(K),
                       nope_temperature=temperature)
  kw = dict(mask=jnp.asarray(CAUSAL), positions_BL=jnp.asarray(positions), nope=nope)
  layer = Attention(spec)
  if params is None:
    params = jax.tree.map(np.asarray, nn.unbox(
        layer.init(jax.random.PRNGKey(0), jnp.asarray(x), **kw)["params"]))
  return params, np.asarray(layer.apply({"params": params}, jnp.asarray(x), **kw))


@pytest.mark.parametrize("nope,temperature,positions", [
    (False, False, SMALL), (True, False, LARGE), (True, True, LARGE)])
def test_layer_equals_numpy(nope, temperature, positions):
  x = rand(0, B, L, D)
  params, got = _layer(x, positions, nope, temperature)
  want = np_layer(x, params, CAUSAL, positions, rope=not nope, temperature=temperature)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert np_temperature(8191) > 1.0 and np_temperature(8190) == 1.0


def test_the_temperature_acts_on_nope_layers_only():
  x = rand(1, B, L, D)
  params, plain = _layer(x, LARGE, False, False)
  np.testing.assert_array_equal(_layer(x, LARGE, False, True, params)[1], plain)
  _, nope = _layer(x, LARGE, True, False, params)
  assert np.abs(_layer(x, LARGE, True, True, params)[1] - nope).max() > 1e-4


def _cfg(**kw):
  fields = dict(family="decoder_only", position="rope", num_layers=2, d_model=D,
                num_heads=H, num_kv_heads=N, vocab_size=23, max_len=32)
  return model_config_from_dict(dict(fields, **kw))


IDS = jnp.asarray(np.random.default_rng(0).integers(5, 23, (B, 8)), jnp.int32)


def _logits(cfg, params, ids=IDS):
  args = (ids,) if cfg.family != "encoder_decoder" else (ids, ids)
  return np.asarray(build_model(cfg).apply({"params": params}, *args)["logits"])


@pytest.mark.parametrize("family", ["decoder_only", "encoder_only", "encoder_decoder"])
def test_every_layer_nope_is_no_positions_and_every_other_is_neither(family):
  """nope_every=1: no layer rotates, position='none' with the same parameters;
  nope_every=2: one layer rotates, so the model is neither that nor full RoPE."""
  rope = _cfg(family=family)
  params = init_params(rope, jax.random.PRNGKey(0))
  none = _logits(_cfg(family=family, position="none"), params)
  np.testing.assert_array_equal(_logits(_cfg(family=family, nope_every=1), params), none)
  half = _logits(_cfg(family=family, nope_every=2), params)
  for other in (none, _logits(rope, params)):
    assert np.abs(half - other).max() > 1e-4


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_scanned_stack_equals_the_loop(family):
  """Under nn.scan the layers' NoPE flags are scanned, as windowed layers' are."""
  cfg = _cfg(family=family, nope_every=2)
  params = init_params(cfg, jax.random.PRNGKey(1))
  want = _logits(cfg, params)
  got = _logits(_cfg(family=family, nope_every=2, scan_layers=True),
                stack_layer_params(params))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family,scan", [("decoder_only", True), ("encoder_decoder", False)])
@pytest.mark.slow
def test_cached_greedy_with_the_temperature_equals_uncached(family, scan, monkeypatch):
  """Llama 4's floor scale lowered to 2 so that the temperature is > 1 from
  position 1 on: the cached queries take their own positions' temperature."""
  monkeypatch.setattr(positions_lib, "NOPE_FLOOR_SCALE", 2)
  cfg = _cfg(family=family, nope_every=2, nope_temperature=True, scan_layers=scan,
             vocab_size=24)
  params = init_params(cfg, jax.random.PRNGKey(0))
  prompts = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0]], np.int32)
  if family == "decoder_only":
    cached = search.generate(params, cfg, prompts, 7, greedy=True, eos_id=-1)
  else:
    cached = search.translate_greedy(params, cfg, prompts, max_len=7, eos_id=-1)
  np.testing.assert_array_equal(np.asarray(cached),
                                search.uncached_greedy(params, cfg, prompts, 7, eos_id=-1))


@pytest.mark.parametrize("fields,error,named", [
    (dict(position="alibi", nope_every=2), InactiveSetting, "model.nope_every=2.*rope"),
    (dict(nope_temperature=True), InactiveSetting, "model.nope_temperature.*nope_every"),
    (dict(nope_every=3), ConfigError, "model.nope_every=3.*1..2"),
    (dict(nope_every=-1), ConfigError, "model.nope_every must be >= 0"),
])
def test_inactive_and_invalid_settings_name_the_field(fields, error, named):
  with pytest.raises(error, match=named):
    _cfg(**fields)


# Logits of _cfg() (rope, 2 layers, GQA) at IDS[:1, :4] with init_params(PRNGKey(0)),
# written by the code before these axes existed: the defaults of the new fields
# (attention_sinks, value_residual, nope_every, nope_temperature) leave them bitwise.
GOLDEN_PARAMS = None
GOLDEN_LOGITS = None


def test_defaults_are_bitwise_the_model_before_these_axes():
  cfg = _cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  shapes = {jax.tree_util.keystr(p): np.shape(x)
            for p, x in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
  assert shapes == GOLDEN_PARAMS
  np.testing.assert_array_equal(_logits(cfg, params, IDS[:1, :4]), GOLDEN_LOGITS)
