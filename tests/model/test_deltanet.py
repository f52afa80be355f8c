"""Gated DeltaNet (``model.mixer_pattern`` D) against a slow NumPy recurrence.

The recurrent and chunked forms of the gated delta rule against fla's naive
recurrent form written here in NumPy (float64), forward and gradients; the
layer against NumPy; causality, padding and packing; cached decoding against
the full forward; a DDDA hybrid unrolled and scanned; the config's errors.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import decoding as search
from tfx_jax.model import mixers
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, init_params, stack_layer_params
from tfx_jax.model.layers import deltanet as dn
from tfx_jax.model.specs import layer_spec

B, L, H, K = 2, 12, 2, 4
# Row 0 packs three documents and padding; row 1 is one document.
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 0, 0], [1] * L], np.int32)


def numpy_gated_delta_rule(q, k, v, g, beta, segments=None, state=None):
  """fla's ``naive_recurrent_gated_delta_rule`` (q already scaled), in float64,
  with the state reset where the segment id changes: (o [B, L, H, V], S [B, H, K, V])."""
  q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
  b_, l_, h_, k_ = k.shape
  S = np.zeros((b_, h_, k_, v.shape[-1])) if state is None else np.array(state, np.float64)
  o = np.zeros(v.shape)
  for b in range(b_):
    for t in range(l_):
      reset = segments is not None and t > 0 and segments[b, t] != segments[b, t - 1]
      for h in range(h_):
        S[b, h] = 0.0 if reset else S[b, h] * np.exp(g[b, t, h])
        delta = beta[b, t, h] * (v[b, t, h] - S[b, h].T @ k[b, t, h])
        S[b, h] = S[b, h] + np.outer(k[b, t, h], delta)
        o[b, t, h] = S[b, h].T @ q[b, t, h]
  return o, S


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q = np.asarray(dn.l2_normalize(jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)))
  k = np.asarray(dn.l2_normalize(jnp.asarray(rng.normal(size=(B, L, H, K)), jnp.float32)))
  v = rng.normal(size=(B, L, H, K)).astype(np.float32)
  g = -rng.uniform(0.0, 1.5, size=(B, L, H)).astype(np.float32)
  beta = rng.uniform(size=(B, L, H)).astype(np.float32)
  state = rng.normal(size=(B, H, K, K)).astype(np.float32)
  return q * K ** -0.5, k, v, g, beta, state


DOC = dn.document_index(jnp.asarray(SEGMENTS), (B, L))


# Chunks that divide the length (1, 4, the whole), that do not (5), and longer than it.
@pytest.mark.parametrize("chunk", [1, 4, 5, 12, 64])
def test_chunked_and_recurrent_forms_equal_the_numpy_recurrence(chunk):
  q, k, v, g, beta, state = _inputs()
  # With packed documents from an empty state, and one document from a given state.
  for segments, s0 in ((SEGMENTS, None), (None, state)):
    want_o, want_S = numpy_gated_delta_rule(q, k, v, g, beta, segments, s0)
    doc = None if segments is None else DOC
    rec_o, rec_S = dn.recurrent_gated_delta_rule(q, k, v, g, beta, doc, s0)
    chk_o, chk_S = dn.chunked_gated_delta_rule(q, k, v, g, beta, doc, s0, chunk=chunk)
    for got in (rec_o, chk_o):
      np.testing.assert_allclose(np.asarray(got), want_o, rtol=1e-5, atol=1e-5)
    for got in (rec_S, chk_S):
      np.testing.assert_allclose(np.asarray(got), want_S, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [4, 5])
def test_chunked_gradients_equal_recurrent_gradients_and_finite_differences(chunk):
  q, k, v, g, beta, state = _inputs(1)
  rng = np.random.default_rng(2)
  w_o = rng.normal(size=(B, L, H, K))
  w_S = rng.normal(size=(B, H, K, K))
  args = (q, k, v, g, beta, state)

  def loss(rule, *xs):
    o, S = rule(*xs[:5], DOC, xs[5])
    return jnp.sum(o * w_o) + jnp.sum(S * w_S)

  chunked = functools.partial(dn.chunked_gated_delta_rule, chunk=chunk)
  grad_chunked = jax.grad(lambda *xs: loss(chunked, *xs), argnums=tuple(range(6)))(*args)
  grad_rec = jax.grad(lambda *xs: loss(dn.recurrent_gated_delta_rule, *xs),
                      argnums=tuple(range(6)))(*args)
  for got, want in zip(grad_chunked, grad_rec):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)

  # The recurrent gradient along random directions against central differences
  # of the NumPy recurrence (float64).
  def numpy_loss(*xs):
    o, S = numpy_gated_delta_rule(*xs[:5], SEGMENTS, xs[5])
    return np.sum(o * w_o) + np.sum(S * w_S)

  eps = 1e-4
  for i, x in enumerate(args):
    d = rng.normal(size=x.shape)
    plus = [np.asarray(a, np.float64) + (eps * d if j == i else 0) for j, a in enumerate(args)]
    minus = [np.asarray(a, np.float64) - (eps * d if j == i else 0) for j, a in enumerate(args)]
    fd = (numpy_loss(*plus) - numpy_loss(*minus)) / (2 * eps)
    np.testing.assert_allclose(float(np.sum(np.asarray(grad_rec[i]) * d)), fd,
                               rtol=1e-3, atol=1e-3)


def test_short_conv_is_causal_depthwise_and_stops_at_documents():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(B, L, H, K)).astype(np.float32)
  w = rng.normal(size=(4, H, K)).astype(np.float32)
  prev = rng.normal(size=(B, 3, H, K)).astype(np.float32)
  y, new = dn.short_conv(jnp.asarray(x), jnp.asarray(w), DOC)
  y_cached, new_cached = dn.short_conv(jnp.asarray(x), jnp.asarray(w),
                                       jnp.zeros((B, L), jnp.int32), jnp.asarray(prev))
  want = np.zeros_like(x)
  want_cached = np.zeros_like(x)
  full = np.concatenate([prev, x], axis=1)
  for b in range(B):
    for t in range(L):
      for j in range(4):
        s = t - 3 + j
        if s >= 0 and all(SEGMENTS[b, u] == SEGMENTS[b, t] for u in range(s, t + 1)):
          want[b, t] += w[j] * x[b, s]
        want_cached[b, t] += w[j] * full[b, t + j]
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(y_cached), want_cached, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(new), x[:, -3:])
  np.testing.assert_array_equal(np.asarray(new_cached), x[:, -3:])


def test_gate_initialisation_follows_the_paper():
  key = jax.random.PRNGKey(0)
  A = np.exp(np.asarray(dn.A_log_init(key, (4096,))))
  assert 0 < A.min() and A.max() <= 16 and abs(A.mean() - 8) < 0.5
  dt = np.asarray(jax.nn.softplus(dn.dt_bias_init(key, (4096,))))
  assert 1e-3 * (1 - 1e-4) <= dt.min() and dt.max() <= 0.1 * (1 + 1e-4)
  # log-uniform: log dt uniform on [log 1e-3, log 0.1], mean at log 1e-2.
  assert abs(np.log(dt).mean() - np.log(1e-2)) < 0.1
  bound = 0.5  # 1 / sqrt(4)
  c = np.asarray(dn.conv_init(key, (4, 64)))
  assert -bound <= c.min() and c.max() <= bound and c.max() > 0.9 * bound


# ------------------------------------------------------------------ the model
def _cfg(**kw):
  return model_config_from_dict(dict(dict(
      family="decoder_only", position="rope", d_model=16, num_heads=2, num_layers=4,
      vocab_size=24, max_len=32, mixer_pattern="DDDA", deltanet_chunk=4), **kw))


@functools.cache
def _model(**kw):
  cfg = _cfg(**dict(kw))
  return cfg, init_params(cfg, jax.random.PRNGKey(0))


def _logits(cfg, params, ids, **kw):
  return np.asarray(build_model(cfg).apply({"params": params}, jnp.asarray(ids), **kw)["logits"])


def numpy_layer(p, x, segments, heads, width, eps):
  """The Gated DeltaNet sublayer in NumPy from its parameters (x [B, L, D])."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(p))
  silu = lambda z: z / (1 + np.exp(-z))
  dense = lambda name, y: (np.einsum("bld,d...->bl...", y, p[name]["kernel"])
                           + p[name].get("bias", 0.0))
  qkv = []
  for name in ("query", "key", "value"):
    z = dense(name, x)
    out = np.zeros_like(z)
    for b in range(x.shape[0]):
      for t in range(x.shape[1]):
        for j in range(width):
          s = t - (width - 1) + j
          if s >= 0 and all(segments[b, u] == segments[b, t] for u in range(s, t + 1)):
            out[b, t] += p[f"{name}_conv"][j] * z[b, s]
    qkv.append(silu(out))
  q, k, v = qkv
  norm = lambda z: z / np.sqrt(np.sum(z * z, -1, keepdims=True) + 1e-6)
  q, k = norm(q) * q.shape[-1] ** -0.5, norm(k)
  # Grouped value heads: key head h serves value heads h r ... h r + r - 1.
  r = v.shape[2] // q.shape[2]
  q, k = np.repeat(q, r, axis=2), np.repeat(k, r, axis=2)
  g = -np.exp(p["A_log"]) * np.log1p(np.exp(dense("decay", x) + p["dt_bias"]))
  beta = 1 / (1 + np.exp(-dense("beta", x)))
  o, _ = numpy_gated_delta_rule(q, k, v, g, beta, segments)
  o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + eps) * p["out_norm"]
  o = o * silu(dense("gate", x))
  return np.einsum("blhk,hkd->bld", o, p["out"]["kernel"]) + p["out"].get("bias", 0.0)


def test_the_layer_equals_numpy():
  cfg = _cfg(num_layers=1, mixer_pattern="D", deltanet_heads=4, deltanet_head_dim=3)
  ds = layer_spec(cfg, "decoder", cross_attention=False).deltanet
  assert (ds.num_heads, ds.head_dim, ds.conv_width, ds.chunk) == (4, 3, 4, 4)
  layer = dn.GatedDeltaNet(ds)
  x = jax.random.normal(jax.random.PRNGKey(1), (B, L, 16))
  seg = jnp.asarray(SEGMENTS)
  params = layer.init(jax.random.PRNGKey(2), x, segment_ids_BL=seg)["params"]
  got = layer.apply({"params": params}, x, segment_ids_BL=seg)
  want = numpy_layer(params, np.asarray(x), SEGMENTS, 4, 4, cfg.norm_eps)
  real = SEGMENTS > 0
  np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-4, atol=1e-5)


def test_grouped_value_heads_equal_numpy():
  # 2 key heads of 3 serving 4 value heads of 5 (Qwen3-Next's grouped values).
  cfg = _cfg(num_layers=1, mixer_pattern="D", deltanet_heads=2, deltanet_head_dim=3,
             deltanet_v_heads=4, deltanet_v_head_dim=5)
  ds = layer_spec(cfg, "decoder", cross_attention=False).deltanet
  assert (ds.num_heads, ds.head_dim, ds.v_heads, ds.v_head_dim) == (2, 3, 4, 5)
  layer = dn.GatedDeltaNet(ds)
  x = jax.random.normal(jax.random.PRNGKey(1), (B, L, 16))
  seg = jnp.asarray(SEGMENTS)
  params = layer.init(jax.random.PRNGKey(2), x, segment_ids_BL=seg)["params"]
  shapes = {k: v.shape for k, v in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
  assert shapes[(jax.tree_util.DictKey("value"), jax.tree_util.DictKey("kernel"))] == (
      16, 4, 5)
  assert shapes[(jax.tree_util.DictKey("key_conv"),)] == (4, 2, 3)
  assert shapes[(jax.tree_util.DictKey("A_log"),)] == (4,)
  got = layer.apply({"params": params}, x, segment_ids_BL=seg)
  want = numpy_layer(params, np.asarray(x), SEGMENTS, 4, 4, cfg.norm_eps)
  real = SEGMENTS > 0
  np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-4, atol=1e-5)


def test_hybrid_is_causal_and_ignores_padding_and_other_documents():
  cfg, params = _model()
  rng = np.random.default_rng(4)
  ids = rng.integers(1, 24, size=(1, 10)).astype(np.int32)
  base = _logits(cfg, params, ids)
  for t in (3, 7):
    changed = ids.copy()
    changed[0, t + 1:] = (changed[0, t + 1:] % 23) + 1
    np.testing.assert_allclose(_logits(cfg, params, changed)[0, :t + 1], base[0, :t + 1],
                               rtol=1e-5, atol=1e-5)
  # Packed: documents 4 + 3 + padding 3; each document as if alone.
  seg = np.array([[1, 1, 1, 1, 2, 2, 2, 0, 0, 0]], np.int32)
  pos = np.array([[0, 1, 2, 3, 0, 1, 2, 0, 0, 0]], np.int32)
  packed = ids.copy()
  packed[0, 7:] = 0
  out = _logits(cfg, params, packed, segment_ids=jnp.asarray(seg), positions=jnp.asarray(pos))
  np.testing.assert_allclose(out[0, :4], _logits(cfg, params, ids[:, :4])[0], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(out[0, 4:7], _logits(cfg, params, ids[:, 4:7])[0], rtol=1e-5,
                             atol=1e-5)
  other = packed.copy()
  other[0, 7:] = 5  # the padding's tokens do not reach the real ones
  out2 = _logits(cfg, params, other, segment_ids=jnp.asarray(seg), positions=jnp.asarray(pos))
  np.testing.assert_allclose(out2[0, :7], out[0, :7], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scan,grouped", [(False, False), (True, False), (False, True)],
                         ids=["loop", "scan", "grouped-values"])
def test_cached_decoding_equals_the_full_forward(scan, grouped):
  # grouped: one key head serving 2 value heads of 6 (a conv state per projection).
  kw = dict(deltanet_heads=1, deltanet_v_heads=2, deltanet_v_head_dim=6) if grouped else {}
  cfg, params = _cfg(scan_layers=scan, **kw), _model(**kw)[1]
  if scan:
    params = stack_layer_params(params, unit=4)
  ids = np.random.default_rng(5).integers(1, 24, size=(2, 9)).astype(np.int32)
  full = _logits(cfg, params, ids)
  model = build_model(cfg, use_cache=True)
  cache = search.init_cache(cfg, 2, 9)
  # A prefill of 5 tokens (one chunk and a part), then one token at a time.
  out, mutated = model.apply({"params": params, "cache": cache}, jnp.asarray(ids[:, :5]),
                             mutable=["cache"])
  steps = [np.asarray(out["logits"])]
  cache = mutated["cache"]
  for t in range(5, 9):
    out, mutated = model.apply({"params": params, "cache": cache}, jnp.asarray(ids[:, t:t + 1]),
                               mutable=["cache"])
    cache = mutated["cache"]
    steps.append(np.asarray(out["logits"]))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
  prompts = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0]], np.int32)
  np.testing.assert_array_equal(
      np.asarray(search.generate(params, cfg, prompts, 5, greedy=True, eos_id=-1)),
      search.uncached_greedy(params, cfg, prompts, 5, eos_id=-1))


def test_hybrid_scanned_over_its_unit_equals_the_loop():
  cfg8, params = _model(num_layers=8)
  scanned = _cfg(num_layers=8, scan_layers=True)
  ids = np.random.default_rng(6).integers(1, 24, size=(2, 7)).astype(np.int32)
  stacked = stack_layer_params(params, unit=4)
  shapes = lambda tree: [(jax.tree_util.keystr(path), tuple(a.shape))
                         for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]]
  tree = jax.eval_shape(lambda: nn.unbox(init_params(scanned, jax.random.PRNGKey(0))))
  assert shapes(tree) == shapes(stacked)
  assert set(stacked["decoder"]["layers"]) == {"layer_0", "layer_1", "layer_2", "layer_3"}
  assert "deltanet" in stacked["decoder"]["layers"]["layer_0"]
  assert "self_attention" in stacked["decoder"]["layers"]["layer_3"]
  np.testing.assert_allclose(_logits(scanned, stacked, ids), _logits(cfg8, params, ids),
                             rtol=1e-5, atol=1e-5)
  # The loop's layers follow the pattern repeated to the depth: DDDADDDA.
  kinds = ["deltanet" in nn.unbox(params)["decoder"][f"layer_{i}"] for i in range(8)]
  assert kinds == [True, True, True, False] * 2


def test_the_default_pattern_is_todays_model():
  base = model_config_from_dict(dict(family="decoder_only", d_model=16, num_heads=2,
                                     num_layers=2, vocab_size=24))
  for pattern in ("A", "AA"):
    cfg = model_config_from_dict(dict(family="decoder_only", d_model=16, num_heads=2,
                                      num_layers=2, vocab_size=24, mixer_pattern=pattern))
    ids = jnp.asarray([[3, 4, 5]])
    p0 = init_params(base, jax.random.PRNGKey(0))
    p1 = init_params(cfg, jax.random.PRNGKey(0))
    jax.tree.map(np.testing.assert_array_equal, nn.unbox(p0), nn.unbox(p1))
    np.testing.assert_array_equal(_logits(cfg, p1, ids), _logits(base, p0, ids))


def test_mixer_units_and_layers():
  assert [mixers.mixer_unit(p) for p in ("", "A", "AAA", "DADA", "DDDA", "D")] == [
      "A", "A", "A", "DA", "DDDA", "D"]
  assert mixers.layer_mixers("DDDA", 8) == "DDDADDDA"
  assert mixers.layer_mixers("DDDA", 6) == "DDDADD"


@pytest.mark.parametrize("fields,error,match", [
    (dict(mixer_pattern="DXA"), ConfigError, r"'X'.*A \(full attention\), D \(Gated DeltaNet\)"),
    (dict(deltanet_conv=3), InactiveSetting, "model.deltanet_conv=3 is read by the Gated"),
    (dict(mixer_pattern="AAAD", num_layers=2, deltanet_heads=2), InactiveSetting,
     "deltanet_heads"),
    (dict(mixer_pattern="D", family="encoder_only"), ConfigError,
     "family one of: decoder_only"),
    (dict(mixer_pattern="D", family="encoder_decoder"), ConfigError,
     "family one of: decoder_only"),
    (dict(mixer_pattern="DDDA", num_layers=6, scan_layers=True), ConfigError,
     "multiple of 4"),
    (dict(mixer_pattern="D", deltanet_chunk=0), ConfigError, "deltanet_chunk must be >= 1"),
    (dict(mixer_pattern="D", deltanet_conv=-1), ConfigError, "deltanet_conv must be >= 0"),
    (dict(mixer_pattern="D", parametrization="mup", mup_base_d_model=8), ConfigError,
     "parametrization='sp'"),
], ids=["character", "inactive", "inactive-at-depth", "encoder", "encoder-decoder",
        "scan-depth", "chunk", "conv", "mup"])
def test_config_errors(fields, error, match):
  with pytest.raises(error, match=match):
    model_config_from_dict(dict(dict(d_model=16, num_heads=2, num_layers=4), **fields))


def test_layer_stats_read_the_attention_layers_of_a_hybrid():
  from tfx_jax.run.setup import per_layer_max_logits
  attn = lambda v: {"self_attention": {"max_attention_logit": (jnp.asarray(v),)}}
  loop = {"decoder": {"layer_0": {"deltanet": {}}, "layer_1": attn(1.0),
                      "layer_2": {"deltanet": {}}, "layer_3": attn(3.0)}}
  np.testing.assert_array_equal(per_layer_max_logits(loop)["decoder"], [1.0, 3.0])
  units = {"decoder": {"layers": {"layer_0": {"deltanet": {}}, "layer_1": attn([1.0, 3.0])}}}
  np.testing.assert_array_equal(per_layer_max_logits(units)["decoder"], [1.0, 3.0])
  assert per_layer_max_logits({"decoder": {"layers": {"deltanet": {}}}}) == {}
