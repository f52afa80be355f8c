"""Attention sinks (``model.attention_sinks``, gpt-oss) against a NumPy reference.

p_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij')): every CPU path (the
reference ``dot_product_attention``, ``fast_attention``, the causal blocked
path with its own backward), with masks, sliding windows, a soft-cap, a bias
and grouped heads, forward and gradient; the layer's parameter, dropout, the
accelerators' routing, and cached decoding of a model with sinks.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model import decoding as search
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import attention_mask, init_params, window_mask
from tfx_jax.model.layers import attention as att

B, L, H, N, K = 2, 12, 4, 2, 4


def np_sink_weights(q, k, mask_B1LS, sinks_H, *, bias_BhLS=None, softcap=0.0):
  """[B, H, L, S] per head h (key/value head h // (H/N)): s = cap(q.k / sqrt(K))
  + bias, masked keys dropped, p_j = exp(s_j) / (exp(sink_h) + sum_j' exp(s_j')).
  Float64, one row at a time."""
  G = H // N
  p = np.zeros((B, H, q.shape[1], k.shape[1]))
  for b, h, i in np.ndindex(B, H, q.shape[1]):
    s = k[b, :, h // G].astype(np.float64) @ q[b, i, h].astype(np.float64) / math.sqrt(K)
    if softcap:
      s = softcap * np.tanh(s / softcap)
    if bias_BhLS is not None:
      s = s + bias_BhLS[b, h if bias_BhLS.shape[1] > 1 else 0, i]
    seen = mask_B1LS[b, 0, i]
    sink = float(sinks_H[h])
    top = max([sink] + list(s[seen]))
    e = np.where(seen, np.exp(s - top), 0.0)
    p[b, h, i] = e / (math.exp(sink - top) + e.sum())
  return p


def np_sink_attention(q, k, v, mask_B1LS, sinks_H, **kw):
  """out_i = sum_j p_ij v_j with ``np_sink_weights``: no value for the sink."""
  p = np_sink_weights(q, k, mask_B1LS, sinks_H, **kw)
  v_BSHK = v.astype(np.float64).repeat(H // N, axis=2)
  return np.einsum("bhls,bshk->blhk", p, v_BSHK)


def _inputs(seed=0):
  r = np.random.default_rng(seed)
  q = r.normal(size=(B, L, H, K)).astype(np.float32) * 2
  k, v = (r.normal(size=(B, L, N, K)).astype(np.float32) * 2 for _ in range(2))
  sinks = r.normal(size=(H,)).astype(np.float32)
  # Row 0: two packed documents; row 1: right padding (padding queries see nothing).
  seg = np.ones((B, L), np.int32)
  seg[0, 5:] = 2
  seg[1, 9:] = 0
  return q, k, v, sinks, seg


def _masks(seg, window):
  seg = jnp.asarray(seg)
  mask = attention_mask(seg, seg, causal=True)
  if window:
    pos = jnp.broadcast_to(jnp.arange(L), (B, L))
    mask = window_mask(mask, pos, pos, window, causal=True)
  return mask


PATHS = {
    "reference": att.dot_product_attention,
    "fast": att.fast_attention,
    "blocked": lambda *a, **kw: att.causal_blocked_attention(*a, block=5, **kw),
}


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("path", PATHS)
def test_every_cpu_path_equals_numpy_with_masks_windows_and_padding(path, window):
  q, k, v, sinks, seg = _inputs(1)
  mask = _masks(seg, window)
  want = np_sink_attention(q, k, v, np.asarray(mask), sinks)
  got = np.asarray(PATHS[path](*map(jnp.asarray, (q, k, v)), mask, None,
                               sinks_H=jnp.asarray(sinks)))
  # Padding queries (every key masked) give 0 on every path, finite.
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[1, 9:], 0.0)


@pytest.mark.parametrize("path", ["reference", "fast"])
def test_sink_is_not_soft_capped(path):
  """The cap bounds the content logits; the sink joins the row after it (a sink
  of 30 under a cap of 2 still takes almost all of each row)."""
  q, k, v, sinks, seg = _inputs(2)
  mask = _masks(seg, 0)
  sinks = sinks.copy()
  sinks[0] = 30.0
  want = np_sink_attention(q, k, v, np.asarray(mask), sinks, softcap=2.0)
  got = np.asarray(PATHS[path](*map(jnp.asarray, (q, k, v)), mask, None,
                               logit_softcap=2.0, sinks_H=jnp.asarray(sinks)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.abs(got[:, :, 0]).max() < 1e-10


def test_blocked_path_with_a_bias_equals_numpy():
  q, k, v, sinks, seg = _inputs(3)
  mask = _masks(seg, 4)
  bias = np.random.default_rng(4).normal(size=(B, H, L, L)).astype(np.float32)
  want = np_sink_attention(q, k, v, np.asarray(mask), sinks, bias_BhLS=bias)
  got = PATHS["blocked"](*map(jnp.asarray, (q, k, v)), mask, jnp.asarray(bias),
                         sinks_H=jnp.asarray(sinks))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_rows_sum_to_less_than_one():
  q, k, _, sinks, seg = _inputs(5)
  ones = jnp.ones((B, L, N, K))
  got = np.asarray(att.fast_attention(jnp.asarray(q), jnp.asarray(k), ones,
                                      _masks(seg, 0), sinks_H=jnp.asarray(sinks)))
  real = seg > 0
  assert (got[real] < 1.0).all() and (got[real] > 0.0).all()


def np_sink_gradient(q, k, v, mask, sinks, d_out):
  """d loss / d sink_h = -sum_{b, i} p_sink(b, h, i) * sum_k dO_k O_k: the sink's
  probability is exp(sink) / Z and O = sum_j p_j v_j."""
  out = np_sink_attention(q, k, v, mask, sinks)
  G = H // N
  grad = np.zeros(H)
  for b, h, i in np.ndindex(B, H, L):
    n = h // G
    s = k[b, :, n].astype(np.float64) @ q[b, i, h].astype(np.float64) / math.sqrt(K)
    seen = mask[b, 0, i]
    z = math.exp(sinks[h]) + np.exp(s[seen]).sum()
    grad[h] -= math.exp(sinks[h]) / z * float(d_out[b, i, h] @ out[b, i, h])
  return grad


@pytest.mark.parametrize("window", [0, 3])
def test_gradients_of_every_path_equal_the_reference_and_numpy(window):
  """q, k, v and sinks: the fast path and the blocked path's own backward
  (block 5: a shorter last block) against the reference's autodiff; the sinks'
  gradient against the closed form in NumPy."""
  q, k, v, sinks, seg = _inputs(6)
  mask = _masks(seg, window)
  d_out = np.random.default_rng(7).normal(size=(B, L, H, K)).astype(np.float32)

  def loss(f):
    return lambda q, k, v, s: jnp.sum(f(q, k, v, mask, None, sinks_H=s) * d_out)

  args = tuple(map(jnp.asarray, (q, k, v, sinks)))
  grads = {p: jax.jit(jax.grad(loss(f), argnums=(0, 1, 2, 3)))(*args)
           for p, f in PATHS.items()}
  np.testing.assert_allclose(
      grads["reference"][3], np_sink_gradient(q, k, v, np.asarray(mask), sinks, d_out),
      rtol=1e-4, atol=1e-5)
  for path in ("fast", "blocked"):
    for got, want in zip(grads[path], grads["reference"]):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dropout_drops_weights_after_the_sink():
  """Training mode: the weights p_ij (the sink's dropped) are dropped and rescaled."""
  q, k, v, sinks, seg = _inputs(8)
  mask = _masks(seg, 0)
  rng, rate = jax.random.PRNGKey(3), 0.5
  got = att.dot_product_attention(*map(jnp.asarray, (q, k, v)), mask, dropout_rng=rng,
                                  dropout=rate, deterministic=False,
                                  sinks_H=jnp.asarray(sinks))
  G = H // N
  keep = np.asarray(jax.random.bernoulli(rng, 1 - rate, (B, N, G, L, L)))
  p = np_sink_weights(q, k, np.asarray(mask), sinks).reshape(B, N, G, L, L)
  dropped = np.where(keep, p / (1 - rate), 0.0).reshape(B, H, L, L)
  want = np.einsum("bhls,bshk->blhk", dropped, v.astype(np.float64).repeat(G, axis=2))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


SPEC = att.AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K, causal=True, sinks=True)


def _layer_out(spec, x, mask, seg=None):
  layer = att.Attention(spec)
  params = layer.init(jax.random.PRNGKey(0), x, mask=mask)
  return params, layer.apply(params, x, mask=mask, segment_ids_BL=seg)


def test_the_layer_has_one_sink_per_query_head():
  x = jnp.asarray(np.random.default_rng(9).normal(size=(B, L, 16)), jnp.float32)
  params, _ = _layer_out(SPEC, x, _masks(np.ones((B, L), np.int32), 0))
  box = params["params"]["sinks"]
  assert box.names == ("heads",) and box.value.shape == (H,)
  big = att.Attention(att.AttentionSpec(num_heads=512, num_kv_heads=1, head_dim=K,
                                        sinks=True))
  s = np.asarray(nn.unbox(big.init(jax.random.PRNGKey(1), x)["params"]["sinks"]))
  assert 0.015 < s.std() < 0.025 and abs(s.mean()) < 0.005  # N(0, 0.02^2), as HF


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_accelerators_route_sinks_to_a_path_that_takes_them(platform):
  """Neither fused kernel takes a sink: the layer built for an accelerator
  gives the CPU layer's numbers (XLA's ``fast_attention``)."""
  _, _, _, _, seg = _inputs(10)
  x = jnp.asarray(np.random.default_rng(10).normal(size=(B, L, 16)), jnp.float32)
  mask = _masks(seg, 0)
  params, want = _layer_out(SPEC, x, mask)
  spec = att.AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K, causal=True,
                           sinks=True, platform=platform)
  got = att.Attention(spec).apply(params, x, mask=mask, segment_ids_BL=jnp.asarray(seg))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
@pytest.mark.slow
def test_cached_greedy_with_sinks_and_alternating_windows_equals_uncached(scan):
  """gpt-oss's layout: sinks, windowed and full layers alternating, GQA, RoPE."""
  cfg = model_config_from_dict(dict(
      family="decoder_only", position="rope", d_model=16, num_heads=4, num_kv_heads=2,
      num_layers=2, vocab_size=24, max_len=32, attention_sinks=True,
      attention_window=3, global_every=2, scan_layers=scan))
  params = init_params(cfg, jax.random.PRNGKey(0))
  # Sinks far from 0 so that they matter to the argmax.
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: x + 2.0 if "sinks" in jax.tree_util.keystr(p) else x, params)
  inputs = np.array([[5, 6, 7, 8, 9], [10, 11, 0, 0, 0]], np.int32)
  cached = np.asarray(search.generate(params, cfg, inputs, 7, greedy=True, eos_id=-1))
  np.testing.assert_array_equal(
      cached, search.uncached_greedy(params, cfg, inputs, 7, eos_id=-1))
