"""Interleaved NoPE (``model.nope_every``, ``model.nope_temperature``; Llama 4)
against NumPy and HF's layer rule; the defaults today's model (its parameters
and logits).

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


# The parameters and logits of _cfg() (rope, 2 layers, GQA) at IDS[:1, :4] with
# init_params(PRNGKey(0)), written by the code before these axes existed (commit
# a274863): the defaults of the new fields (attention_sinks, value_residual,
# nope_every, nope_temperature) leave the model as it was (its parameter
# shapes; its logits to float32 rounding).
_LAYER_SHAPES = {
    "['ffn']['wi']['bias']": (64,),
    "['ffn']['wi']['kernel']": (16, 64),
    "['ffn']['wo']['bias']": (16,),
    "['ffn']['wo']['kernel']": (64, 16),
    "['ffn_norm']['bias']": (16,),
    "['ffn_norm']['scale']": (16,),
    "['self_attention']['key']['bias']": (2, 4),
    "['self_attention']['key']['kernel']": (16, 2, 4),
    "['self_attention']['out']['bias']": (16,),
    "['self_attention']['out']['kernel']": (4, 4, 16),
    "['self_attention']['query']['bias']": (4, 4),
    "['self_attention']['query']['kernel']": (16, 4, 4),
    "['self_attention']['value']['bias']": (2, 4),
    "['self_attention']['value']['kernel']": (16, 2, 4),
    "['self_attention_norm']['bias']": (16,),
    "['self_attention_norm']['scale']": (16,),
}
GOLDEN_PARAMS = {
    **{f"['decoder']['layer_{i}']{k}": s for i in range(2)
       for k, s in _LAYER_SHAPES.items()},
    "['decoder']['final_norm']['bias']": (16,),
    "['decoder']['final_norm']['scale']": (16,),
    "['embedding']['embedding']": (23, 16),
}
GOLDEN_LOGITS = np.asarray([
    0.040378864854574203, 0.7351246476173401, 1.0528541803359985, 0.24949471652507782,
    -2.4232826232910156, 2.6718497276306152, 1.9043545722961426, -1.8728052377700806,
    0.5365250706672668, 0.7402567267417908, 0.25156623125076294, 1.066563606262207,
    -1.763892412185669, 0.1582510769367218, -0.24041032791137695, -0.20888164639472961,
    0.9704843759536743, 0.6261032223701477, 0.45028775930404663, -1.0334752798080444,
    0.1866503208875656, -1.2813527584075928, 0.27522510290145874, 0.019860418513417244,
    0.7029268741607666, 1.124896764755249, 0.061504799872636795, -2.331042766571045,
    2.6218793392181396, 1.9362610578536987, -1.8215980529785156, 0.7448118329048157,
    0.6304890513420105, 0.33713436126708984, 1.0670535564422607, -1.8407628536224365,
    0.18567731976509094, -0.3512691855430603, -0.24143877625465393, 1.2166045904159546,
    0.7707309722900391, 0.43993261456489563, -1.128650426864624, 0.0731288269162178,
    -1.4017455577850342, 0.28709957003593445, 0.5950103402137756, 1.3202255964279175,
    0.619970977306366, -0.16660712659358978, -1.9168130159378052, 2.75431489944458,
    2.070566415786743, -1.2184189558029175, 0.1583409160375595, 0.6096418499946594,
    0.8657333850860596, 1.4243837594985962, -1.6276041269302368, 0.7603929042816162,
    0.31250816583633423, -0.220236673951149, 0.7129188776016235, 0.6107670664787292,
    1.3864021301269531, -0.38303112983703613, 0.7819154858589172, -0.9426819682121277,
    0.6449295878410339, 1.0499461889266968, 1.0860333442687988, 0.4746400713920593,
    0.4998415410518646, -1.92461359500885, 2.6342320442199707, 2.1129965782165527,
    -1.256011962890625, -0.22215944528579712, 1.2834659814834595, 0.3286050856113434,
    1.7121220827102661, -1.9588286876678467, 0.8228917121887207, 0.020012615248560905,
    -0.057880472391843796, 0.6060197353363037, 0.4711567759513855, 1.7504844665527344,
    -0.5248656868934631, 0.9258676171302795, -1.0636335611343384, 0.4627402126789093,
], np.float32).reshape(1, 4, 23)


def test_defaults_are_the_model_before_these_axes():
  """The default model's parameter tree and logits are those recorded before
  these axes existed. The logits to float32 rounding only: the recording's
  CPU and this one may sum a product in another order (AVX-512 or not), and
  any change to the model moves them by far more."""
  cfg = _cfg()
  params = init_params(cfg, jax.random.PRNGKey(0))
  shapes = {jax.tree_util.keystr(p): np.shape(x)
            for p, x in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
  assert shapes == GOLDEN_PARAMS
  np.testing.assert_allclose(_logits(cfg, params, IDS[:1, :4]), GOLDEN_LOGITS,
                             rtol=1e-5, atol=1e-5)
