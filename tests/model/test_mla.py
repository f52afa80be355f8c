"""Multi-head latent attention (``model.attention_type='mla'``) against references.

The layer against a NumPy formula written here (with and without query
compression; causal, windowed and biased masks; RoPE plain and YaRN-scaled;
soft-cap and gate), its gradients against the same formula in jax.numpy;
causality and padding invariance of the models; cached decoding (absorbed
projections over the latent cache) against the uncached forward; the cache's
size; the config's errors. Tiny shapes, eager where a compile would dominate.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import decoding
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, init_params, layer_spec, stack_layer_params
from tfx_jax.model.layers.attention import AttentionSpec
from tfx_jax.model.layers.mla import (LATENT_NORM_EPS, MlaSpec, MultiHeadLatentAttention,
                                      deinterleave_rope, kv_cache_elements_per_token)
from tfx_jax.model.layers.positions import rotary_spec, yarn_attention_factor
from references import rand

B, L, D, H = 2, 6, 16, 2
N, R, V, C = 4, 4, 6, 8  # d_nope, d_rope, d_v, d_c (d_v != d_nope on purpose)
POSITIONS = np.broadcast_to(np.arange(L), (B, L))
CAUSAL = np.tril(np.ones((L, L), bool))[None, None].repeat(B, 0)
WINDOW = CAUSAL & (np.arange(L)[:, None] - np.arange(L)[None, :] < 3)[None, None]
# Row 1 has two padding keys at the end (and their queries see nothing real).
PADDED = CAUSAL & (np.arange(L) < np.array([L, L - 2])[:, None])[:, None, None, :]


# ------------------------------------------------------------ the reference
def ref_mla(xp, x, p, mask, *, inv_freq=(), rope_scale=1.0, bias=None, cap=0.0,
            gate_width=0, positions=POSITIONS):
  """DeepSeek-V2's MLA (Section 2.1) as its equations read, per-head keys
  [k_C; k_R] materialised, in the array module ``xp`` (numpy or jax.numpy).
  ``rope_scale``: YaRN's m, as m^2 on the softmax scale."""
  def rms(z, g):
    return z / xp.sqrt(xp.mean(z * z, axis=-1, keepdims=True) + LATENT_NORM_EPS) * g

  def rope_halves(z, pos):  # z [B, L, h, r]: pairs (i, i + r/2)
    angle = pos[:, :, None, None] * xp.asarray(inv_freq)[None, None, None, :]
    cos, sin = xp.cos(angle), xp.sin(angle)
    z1, z2 = z[..., :len(inv_freq)], z[..., len(inv_freq):]
    return xp.concatenate([z1 * cos - z2 * sin, z2 * cos + z1 * sin], axis=-1)

  if "q_a_proj" in p:
    cq = rms(x @ p["q_a_proj"]["kernel"] + p["q_a_proj"]["bias"], p["q_a_layernorm"]["scale"])
    q = xp.einsum("blq,qhk->blhk", cq, p["q_b_proj"]["kernel"])
  else:
    q = xp.einsum("bld,dhk->blhk", x, p["q_proj"]["kernel"])
  ckr = x @ p["kv_a_proj_with_mqa"]["kernel"] + p["kv_a_proj_with_mqa"]["bias"]
  c = rms(ckr[..., :C], p["kv_a_layernorm"]["scale"])
  k_r = ckr[..., C:][:, :, None, :]  # one key for every head
  n = p["kv_b_proj"]["kernel"].shape[-1] - V
  q_c, q_r = q[..., :n], q[..., n:]
  if len(inv_freq):
    pos = xp.asarray(positions, xp.float32 if xp is jnp else np.float64)
    q_r, k_r = rope_halves(q_r, pos), rope_halves(k_r, pos)
  kv = xp.einsum("bsc,chf->bshf", c, p["kv_b_proj"]["kernel"])
  k_c, v = kv[..., :n], kv[..., n:]
  k = xp.concatenate([k_c, xp.broadcast_to(k_r, k_c.shape[:3] + (k_r.shape[-1],))], -1)
  qf = xp.concatenate([q_c, q_r], axis=-1)
  s = xp.einsum("blhk,bshk->bhls", qf, k) * rope_scale**2 / math.sqrt(qf.shape[-1])
  if cap:
    s = cap * xp.tanh(s / cap)
  if bias is not None:
    s = s + bias
  s = xp.where(mask, s, -1e9)
  w = xp.exp(s - s.max(-1, keepdims=True))
  w = w / w.sum(-1, keepdims=True)
  o = xp.einsum("bhls,bshv->blhv", w, v)
  if gate_width:
    g = xp.einsum("bld,dhg->blhg", x, p["gate"]["kernel"]) + p["gate"]["bias"]
    o = o / (1 + xp.exp(-g))
  return xp.einsum("blhv,hvd->bld", o, p["out"]["kernel"]) + p["out"]["bias"]


def _spec(q_rank=0, **kw):
  kw.setdefault("rotary", rotary_spec(R))
  return MlaSpec(num_heads=H, kv_rank=C, q_rank=q_rank, rope_dim=R, nope_dim=N, v_dim=V,
                 **kw)


def _layer(spec, mask, seed=0, **call):
  """(x, perturbed params as NumPy, the layer's output as NumPy)."""
  x = rand(seed, B, L, D)
  layer = MultiHeadLatentAttention(spec)
  kw = dict(mask=jnp.asarray(mask), positions_BL=jnp.asarray(POSITIONS), **call)
  params = nn.unbox(layer.init(jax.random.PRNGKey(seed), jnp.asarray(x), **kw)["params"])
  leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, params))
  # Every parameter off its initial value (norm gains 1, biases 0).
  params = jax.tree.unflatten(tree, [w + rand(seed + i + 1, *w.shape, scale=0.3)
                                     for i, w in enumerate(leaves)])
  return x, params, np.asarray(layer.apply({"params": params}, jnp.asarray(x), **kw))


def _f64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


CASES = {
    "causal": (dict(), CAUSAL, {}),
    "q_rank": (dict(q_rank=6), CAUSAL, {}),
    "window": (dict(q_rank=6), WINDOW, {}),
    "padded": (dict(), PADDED, {}),
    "bidirectional-no-rope": (dict(rotary=None), np.ones((B, 1, L, L), bool), {}),
    "yarn": (dict(q_rank=6, rotary=rotary_spec(R, scaling="yarn", factor=4.0,
                                               original_max_len=4)), CAUSAL, {}),
    "softcap-gate-bias": (dict(logit_softcap=2.0, gate_width=V), CAUSAL,
                          dict(bias=rand(9, B, H, L, L))),
}


@pytest.mark.parametrize("case", CASES)
def test_layer_matches_numpy(case):
  spec_kw, mask, call = CASES[case]
  spec = _spec(**spec_kw)
  x, p, got = _layer(spec, mask, **{k: jnp.asarray(v) for k, v in call.items()})
  assert ("q_a_proj" in p) == bool(spec.q_rank) and ("q_proj" in p) != bool(spec.q_rank)
  if spec.rotary is None:  # no decoupled RoPE part: the layer's R columns unrotated
    inv_freq, scale = (), 1.0
  else:
    inv_freq = spec.rotary.inv_freq
    scale = yarn_attention_factor(4.0) if case == "yarn" else 1.0
  want = ref_mla(np, _f64(x), _f64(p), mask, inv_freq=inv_freq, rope_scale=scale,
                 bias=call.get("bias"), cap=spec.logit_softcap, gate_width=spec.gate_width)
  real = mask.any(-1)[:, 0]  # queries that see a key
  np.testing.assert_allclose(got[real], want[real], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("q_rank", [0, 6])
def test_gradients_match_the_reference(q_rank):
  spec = _spec(q_rank=q_rank, gate_width=1)
  x, p, _ = _layer(spec, WINDOW, seed=3)
  layer = MultiHeadLatentAttention(spec)
  probe = rand(4, B, L, D)
  kw = dict(mask=jnp.asarray(WINDOW), positions_BL=jnp.asarray(POSITIONS))
  ours = jax.grad(lambda p, x: jnp.sum(layer.apply({"params": p}, x, **kw) * probe),
                  argnums=(0, 1))(p, jnp.asarray(x))
  theirs = jax.grad(lambda p, x: jnp.sum(ref_mla(
      jnp, x, p, WINDOW, inv_freq=spec.rotary.inv_freq, gate_width=1) * probe),
      argnums=(0, 1))(p, jnp.asarray(x))
  flat = jax.tree_util.tree_leaves_with_path(ours)
  for (path, g), w in zip(flat, jax.tree.leaves(theirs)):
    assert np.abs(np.asarray(w)).max() > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_deinterleave_maps_deepseek_interleaved_rope_to_ours():
  """transformers' ``apply_rotary_pos_emb_interleave`` (pairs (2i, 2i + 1),
  output [x_even' | x_odd']) equals ``rope()`` on the permuted columns."""
  r, inv_freq = 8, rotary_spec(8).inv_freq
  z, angle = rand(5, B, L, 1, r), POSITIONS[..., None, None] * np.asarray(inv_freq)
  cos, sin = np.cos(angle), np.sin(angle)
  z1, z2 = z[..., 0::2], z[..., 1::2]
  hf = np.concatenate([z1 * cos - z2 * sin, z2 * cos + z1 * sin], axis=-1)
  from tfx_jax.model.layers.positions import rope
  ours = rope(jnp.asarray(z[..., deinterleave_rope(r)]), jnp.asarray(POSITIONS),
              rotary_spec(r))
  np.testing.assert_allclose(np.asarray(ours), hf, rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------- the models
def _cfg(**kw):
  base = dict(family="decoder_only", attention_type="mla", position="rope", d_model=16,
              num_heads=2, num_layers=2, vocab_size=24, max_len=32)
  return model_config_from_dict({**base, **kw})


IDS = np.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]], np.int32)


@functools.cache
def _model(**kw):
  cfg = _cfg(**dict(kw))
  return cfg, init_params(cfg, jax.random.PRNGKey(0))


def test_default_widths_and_parameter_names():
  cfg, params = _model()
  attn = nn.unbox(params["decoder"]["layer_0"]["self_attention"])
  shapes = {k: {n: w.shape for n, w in v.items()} for k, v in attn.items()}
  # d_nope = 16 / 2 = 8, d_R = 4, d_v = 8, d_c = 32; no query compression.
  assert shapes == {"q_proj": {"kernel": (16, 2, 12)},
                    "kv_a_proj_with_mqa": {"kernel": (16, 36), "bias": (36,)},
                    "kv_a_layernorm": {"scale": (32,)},
                    "kv_b_proj": {"kernel": (32, 2, 16)},
                    "out": {"kernel": (2, 8, 16), "bias": (16,)}}
  assert kv_cache_elements_per_token(cfg) == 32 + 4
  standard = model_config_from_dict(dict(d_model=16, num_heads=4, num_kv_heads=2))
  assert kv_cache_elements_per_token(standard) == 2 * 2 * 4


def test_standard_attention_is_unchanged():
  cfg = model_config_from_dict(dict(d_model=16, num_heads=2, position="rope"))
  assert type(layer_spec(cfg, "decoder", cross_attention=False).attention) is AttentionSpec
  attn = nn.unbox(init_params(cfg, jax.random.PRNGKey(0))["decoder"]["layer_0"]
                  ["self_attention"])
  assert set(attn) == {"query", "key", "value", "out"}


@pytest.mark.parametrize("family", ["decoder_only", "encoder_only", "encoder_decoder"])
@pytest.mark.slow
def test_scanned_stack_equals_the_loop(family):
  kw = dict(family=family, mla_q_rank=6, remat="full")
  cfg, params = _model(**kw)
  scanned = _cfg(**kw, scan_layers=True)
  args = (IDS,) if family != "encoder_decoder" else (IDS, IDS)
  loop = build_model(cfg).apply({"params": params}, *args)["logits"]
  with jax.disable_jit():  # lax.scan's body runs once per layer, uncompiled
    scan = build_model(scanned).apply({"params": stack_layer_params(params)},
                                      *args)["logits"]
  assert np.isfinite(np.asarray(loop)).all()
  np.testing.assert_allclose(np.asarray(scan), np.asarray(loop), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_decoder_is_causal_and_keeps_packed_documents_apart(position):
  cfg, params = _model(position=position, mla_q_rank=6)
  model = build_model(cfg)
  run = lambda ids, *a: np.asarray(model.apply({"params": params}, jnp.asarray(ids),
                                               *map(jnp.asarray, a))["logits"])
  base = run(IDS)
  changed = IDS.copy()
  changed[:, 3] = 1
  np.testing.assert_allclose(run(changed)[:, :3], base[:, :3], rtol=1e-5, atol=1e-6)
  assert np.abs(run(changed)[:, 3:] - base[:, 3:]).max() > 1e-4
  # Two documents packed in one row (segments 1, 2; positions from 0 in each):
  # the second's logits are its own, as if alone.
  packed = np.array([[5, 6, 7, 8, 9, 10]], np.int32)
  segments = np.array([[1, 1, 1, 2, 2, 2]], np.int32)
  positions = np.array([[0, 1, 2, 0, 1, 2]], np.int32)
  np.testing.assert_allclose(run(packed, segments, positions)[:, 3:], run(packed[:, 3:]),
                             rtol=1e-5, atol=1e-5)


def test_encoder_ignores_padding():
  cfg, params = _model(family="encoder_only", position="t5_bias", attention_window=3)
  model = build_model(cfg)
  segments = (IDS > 0).astype(np.int32)
  other = IDS.copy()
  other[1, 4:] = 7
  out = lambda ids: np.asarray(model.apply({"params": params}, jnp.asarray(ids),
                                           jnp.asarray(segments))["logits"])
  np.testing.assert_allclose(out(other)[1, :4], out(IDS)[1, :4], rtol=1e-5, atol=1e-6)
  assert np.abs(out(other)[1, 4:] - out(IDS)[1, 4:]).max() > 1e-4  # the padding did change


# ------------------------------------------------------------ cached decoding
PROMPTS = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0], [12, 13, 14, 0, 0]], np.int32)


def test_cache_holds_the_latent_and_the_rope_key():
  cfg, _ = _model(mla_q_rank=6)
  cache = decoding.init_cache(cfg, 3, 10)["decoder"]["layer_0"]["self_attention"]
  assert {k: v.shape for k, v in cache.items()} == {"cached_latent": (3, 10, 32),
                                                    "cached_rope_key": (3, 10, 4)}
  per_token = sum(v.shape[-1] for v in cache.values())
  assert per_token == kv_cache_elements_per_token(cfg)
  no_rope, _ = _model(position="learned")
  cache = decoding.init_cache(no_rope, 1, 4)["decoder"]["layer_0"]["self_attention"]
  assert set(cache) == {"cached_latent"} and kv_cache_elements_per_token(no_rope) == 32


def test_cached_step_logits_equal_the_full_forward():
  """Prefill 3 tokens, then one token at a time through the absorbed form:
  every step's logits are the full (expanded) forward's at that position."""
  cfg, params = _model(mla_q_rank=6, attention_window=3, global_every=2)
  full = np.asarray(build_model(cfg).apply({"params": params}, jnp.asarray(IDS[:1]))["logits"])
  cached = build_model(cfg, use_cache=True)
  cache = decoding.init_cache(cfg, 1, IDS.shape[1])
  out, vs = cached.apply({"params": params, "cache": cache}, jnp.asarray(IDS[:1, :3]),
                         mutable=["cache"])
  steps = [np.asarray(out["logits"])[0]]
  for t in range(3, IDS.shape[1]):
    out, vs = cached.apply({"params": params, "cache": vs["cache"]},
                           jnp.asarray(IDS[:1, t:t + 1]), mutable=["cache"])
    steps.append(np.asarray(out["logits"])[0])
  np.testing.assert_allclose(np.concatenate(steps), full[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", [
    dict(mla_q_rank=6),
    dict(scan_layers=True, rope_scaling="yarn", rope_scaling_factor=4.0,
         rope_original_max_len=4),
    dict(position="learned", mla_v_dim=4),
    dict(family="encoder_decoder", position="t5_bias"),
], ids=["q_rank", "yarn-scan", "learned-no-rope", "encoder_decoder"])
@pytest.mark.slow
def test_cached_greedy_equals_uncached_argmax_loop(kw):
  cfg = _cfg(**kw)
  params = init_params(cfg, jax.random.PRNGKey(1))
  if cfg.family == "decoder_only":
    cached = decoding.generate(params, cfg, PROMPTS, 6, greedy=True, eos_id=-1)
  else:
    cached = decoding.translate_greedy(params, cfg, PROMPTS, max_len=6, eos_id=-1)
  reference = decoding.uncached_greedy(params, cfg, PROMPTS, 6, eos_id=-1)
  np.testing.assert_array_equal(np.asarray(cached), np.asarray(reference))


# --------------------------------------------------------------- the config
@pytest.mark.parametrize("fields,error,match", [
    (dict(mla_kv_rank=8), InactiveSetting, "model.mla_kv_rank=8 is read by "
     "model.attention_type='mla' only.*choices: standard, mla"),
    (dict(mla_q_rank=4), InactiveSetting, "mla_q_rank"),
    (dict(attention_type="mla", num_kv_heads=1), InactiveSetting, "num_kv_heads"),
    (dict(attention_type="mla", mla_rope_dim=4), InactiveSetting,
     "needs model.position='rope'"),
    (dict(attention_type="mla", position="rope", mla_rope_dim=3), ConfigError, "even"),
    (dict(attention_type="mla", mla_kv_rank=-1), ConfigError, "mla_kv_rank must be >= 0"),
    (dict(attention_type="mla", mla_nope_dim=-2), ConfigError, "mla_nope_dim must be"),
    (dict(attention_type="mla", mla_v_dim=-2), ConfigError, "mla_v_dim must be"),
    (dict(attention_type="mla", qk_norm="rmsnorm"), ConfigError, "qk_norm=none"),
    (dict(attention_type="mla", parametrization="mup", mup_base_d_model=8), ConfigError,
     "parametrization=sp"),
    (dict(attention_type="mla", position="rope", rope_fraction=0.5), ConfigError,
     "mla_rope_dim instead"),
    (dict(attention_type="flash"), ConfigError, "standard"),
])
def test_config_errors(fields, error, match):
  with pytest.raises(error, match=match):
    model_config_from_dict(dict(d_model=16, num_heads=2, **fields))


def test_dropout_acts_in_training_only():
  spec = _spec(dropout=0.5)
  x = jnp.asarray(rand(0, B, L, D))
  kw = dict(mask=jnp.asarray(CAUSAL), positions_BL=jnp.asarray(POSITIONS))
  params = MultiHeadLatentAttention(spec).init(jax.random.PRNGKey(0), x, **kw)["params"]
  train = MultiHeadLatentAttention(spec, deterministic=False)
  run = lambda seed: np.asarray(train.apply({"params": params}, x, **kw,
                                            rngs={"dropout": jax.random.PRNGKey(seed)}))
  evaluated = np.asarray(MultiHeadLatentAttention(spec).apply({"params": params}, x, **kw))
  assert np.abs(run(1) - run(2)).max() > 1e-3 and np.abs(run(1) - evaluated).max() > 1e-3
  np.testing.assert_array_equal(run(1), run(1))
