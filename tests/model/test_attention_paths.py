"""The fast attention paths against the plain reference ``dot_product_attention``."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.layers import attention as att
from tfx_jax.model.families import attention_mask
from tfx_jax.model.layers.positions import alibi_bias

B, L, H, K = 2, 40, 4, 8


def _qkv(n_kv, seed=0, length=L):
  r = np.random.default_rng(seed)
  q = jnp.asarray(r.normal(size=(B, length, H, K)) * 2, jnp.float32)
  k, v = (jnp.asarray(r.normal(size=(B, length, n_kv, K)) * 2, jnp.float32)
          for _ in range(2))
  return q, k, v


def _packed_causal_mask(length=L):
  # Row 0: two packed documents; row 1: one document and right padding.
  seg = np.ones((B, length), np.int32)
  seg[0, length // 3:] = 2
  seg[1, length - 7:] = 0
  return jnp.asarray(seg), attention_mask(jnp.asarray(seg), jnp.asarray(seg), causal=True)


@pytest.mark.parametrize("n_kv", [4, 2, 1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fast_attention_equals_reference(n_kv, with_bias):
  q, k, v = _qkv(n_kv)
  _, mask = _packed_causal_mask()
  pos = jnp.broadcast_to(jnp.arange(L), (B, L))
  bias = alibi_bias(pos, pos, H) if with_bias else None
  ref = att.dot_product_attention(q, k, v, mask, bias)
  np.testing.assert_allclose(att.fast_attention(q, k, v, mask, bias), ref,
                             rtol=1e-5, atol=1e-5)
  # Non-causal, no mask, a bias broadcast over heads (cross-attention shapes).
  bias1 = jnp.asarray(np.random.default_rng(1).normal(size=(B, 1, L, L)), jnp.float32)
  np.testing.assert_allclose(att.fast_attention(q, k, v, None, bias1),
                             att.dot_product_attention(q, k, v, None, bias1),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [8, 16, 13])
@pytest.mark.parametrize("with_bias", [False, True])
def test_causal_blocked_attention_equals_reference_at_real_positions(block, with_bias):
  q, k, v = _qkv(2, seed=block)
  seg, mask = _packed_causal_mask()
  bias = None
  if with_bias:  # a per-head, per-batch bias like T5's
    bias = jnp.asarray(np.random.default_rng(2).normal(size=(B, H, L, L)), jnp.float32)
  ref = att.dot_product_attention(q, k, v, mask, bias)
  got = jax.jit(att.causal_blocked_attention, static_argnames="block")(
      q, k, v, mask, bias, block=block)
  real = np.asarray(seg > 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                             rtol=1e-5, atol=1e-5)


def test_gradients_of_the_fast_paths_equal_the_reference():
  q, k, v = _qkv(2)
  seg, mask = _packed_causal_mask()
  w = (seg > 0).astype(jnp.float32)[:, :, None, None]  # real positions only
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, mask, None)) * w)
  ref = jax.jit(jax.grad(loss(att.dot_product_attention), argnums=(0, 1, 2)))(q, k, v)
  blocked = lambda *a: att.causal_blocked_attention(*a, block=16)
  for f in (att.fast_attention, blocked):
    for g, r in zip(jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))(q, k, v), ref):
      np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bias_heads", [None, 1, H])
def test_gradients_of_the_blocked_path_with_a_learned_bias_and_grouped_heads(bias_heads):
  """The blocked path's own backward (block 13: a shorter last block) against the
  reference's autodiff, for the queries, keys, values and a T5-like bias."""
  q, k, v = _qkv(2, seed=7)
  seg, mask = _packed_causal_mask()
  w = (seg > 0).astype(jnp.float32)[:, :, None, None]
  bias = (None if bias_heads is None else jnp.asarray(
      np.random.default_rng(8).normal(size=(1, bias_heads, L, L)), jnp.float32))

  def loss(f):
    return lambda q, k, v, b: jnp.sum(jnp.sin(f(q, k, v, mask, b)) * w)

  args = (0, 1, 2) if bias is None else (0, 1, 2, 3)
  ref = jax.jit(jax.grad(loss(att.dot_product_attention), argnums=args))(q, k, v, bias)
  blocked = lambda *a: att.causal_blocked_attention(*a, block=13)
  got = jax.jit(jax.grad(loss(blocked), argnums=args))(q, k, v, bias)
  for g, r in zip(got, ref):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_blocked_path_in_bfloat16_is_close_to_float32():
  q, k, v = _qkv(2, seed=9)
  _, mask = _packed_causal_mask()
  f32 = att.causal_blocked_attention(q, k, v, mask, block=16)
  bf16 = att.causal_blocked_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask,
                                      block=16, dtype=jnp.bfloat16)
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(bf16, np.float32), f32, atol=0.1)
  grads = jax.grad(lambda q: jnp.sum(att.causal_blocked_attention(
      q, k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), mask, block=16,
      dtype=jnp.bfloat16).astype(jnp.float32)))(q.astype(jnp.bfloat16))
  assert grads.dtype == jnp.bfloat16 and np.isfinite(np.asarray(grads, np.float32)).all()


def test_the_block_is_chosen_per_backend_and_length():
  assert att.attention_block(256, "cpu") == 64
  assert att.attention_block(2048, "cpu") == 256
  assert att.attention_block(64, "cpu") == 0  # short: one block
  assert att.attention_block(2048, "gpu") == 0


@pytest.mark.slow
def test_causal_module_equals_the_reference_module():
  """The Attention layer with causal=True (blocked on CPU at length 128) gives the
  outputs of the plain reference attention at every real position."""
  length = 128
  x = jnp.asarray(np.random.default_rng(3).normal(size=(B, length, 16)), jnp.float32)
  seg, mask = _packed_causal_mask(length)
  layer = att.Attention(att.AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=4, causal=True))
  params = layer.init(jax.random.PRNGKey(0), x, mask=mask)
  got = jax.jit(lambda p: layer.apply(p, x, mask=mask))(params)
  ref_layer = layer.clone(spec=dataclasses.replace(layer.spec, causal=False))
  orig = att.Attention._attend
  try:  # the reference formula in place of every fast path
    att.Attention._attend = lambda self, q, k, v, m, b, *_: att.dot_product_attention(
        q, k, v, m, b)
    ref = jax.jit(lambda p: ref_layer.apply(p, x, mask=mask))(params)
  finally:
    att.Attention._attend = orig
  real = np.asarray(seg > 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                             rtol=1e-5, atol=1e-5)


_ON_GPU = jax.default_backend() == "gpu"


@pytest.mark.parametrize("n_kv", [4, 1])
@pytest.mark.parametrize("bias_kind", [None, "alibi", "t5"])
@pytest.mark.parametrize("scale_logits", [True, False])
def test_fused_attention_xla_equals_reference_at_real_positions(n_kv, bias_kind,
                                                                scale_logits):
  """The GPU path's formula (``jax.nn.dot_product_attention``, implementation
  "xla") on CPU: packed and padded causal masks, grouped heads, ALiBi and a
  per-head T5-like bias, with and without 1/sqrt(d_k)."""
  q, k, v = _qkv(n_kv, seed=11)
  seg, mask = _packed_causal_mask()
  pos = jnp.broadcast_to(jnp.arange(L), (B, L))
  bias = {None: None, "alibi": alibi_bias(pos, pos, H),
          "t5": jnp.asarray(np.random.default_rng(4).normal(size=(1, H, L, L)),
                            jnp.float32)}[bias_kind]
  ref = att.dot_product_attention(q, k, v, mask, bias, scale_logits=scale_logits)
  real = np.asarray(seg > 0)
  for causal in (False, True):
    got = att.fused_attention(q, k, v, mask, bias, scale_logits=scale_logits,
                              causal=causal, implementation="xla")
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                               rtol=1e-5, atol=1e-5)


def test_fused_attention_gradients_equal_the_reference():
  q, k, v = _qkv(2, seed=12)
  seg, mask = _packed_causal_mask()
  w = (seg > 0).astype(jnp.float32)[:, :, None, None]
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, mask, None)) * w)
  fused = lambda *a: att.fused_attention(*a, causal=True, implementation="xla")
  ref = jax.jit(jax.grad(loss(att.dot_product_attention), argnums=(0, 1, 2)))(q, k, v)
  for g, r in zip(jax.jit(jax.grad(loss(fused), argnums=(0, 1, 2)))(q, k, v), ref):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_gpu_attention_implementation_by_dtype_and_head_width():
  assert att.gpu_attention_implementation(jnp.bfloat16, 64) == "cudnn"
  assert att.gpu_attention_implementation(jnp.float16, 128) == "cudnn"
  assert att.gpu_attention_implementation(jnp.float32, 64) == "xla"
  assert att.gpu_attention_implementation(jnp.bfloat16, 12) == "xla"
  assert att.gpu_attention_implementation(jnp.bfloat16, 256) == "xla"


@pytest.mark.skipif(not _ON_GPU, reason="needs a GPU: cuDNN's flash attention "
                    "(the CPU tests check the same formula through implementation='xla')")
@pytest.mark.parametrize("bias_kind", [None, "alibi"])
def test_cudnn_attention_equals_xla_on_gpu(bias_kind):
  length, heads, width = 256, 8, 64
  r = np.random.default_rng(5)
  q = jnp.asarray(r.normal(size=(B, length, heads, width)), jnp.bfloat16)
  k, v = (jnp.asarray(r.normal(size=(B, length, 2, width)), jnp.bfloat16) for _ in range(2))
  seg, mask = _packed_causal_mask(length)
  pos = jnp.broadcast_to(jnp.arange(length), (B, length))
  bias = alibi_bias(pos, pos, heads) if bias_kind else None
  real = np.asarray(seg > 0)
  ref = att.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), mask, bias)
  got = jax.jit(lambda q, k, v: att.fused_attention(
      q, k, v, mask, bias, dtype=jnp.bfloat16, causal=True, implementation="cudnn"))(q, k, v)
  err = (np.linalg.norm(np.asarray(got, np.float32)[real] - np.asarray(ref)[real])
         / np.linalg.norm(np.asarray(ref)[real]))
  assert err < 1e-2, err
  grads = jax.grad(lambda q: jnp.sum(att.fused_attention(
      q, k, v, mask, bias, dtype=jnp.bfloat16, causal=True,
      implementation="cudnn").astype(jnp.float32)))(q)
  assert np.isfinite(np.asarray(grads, np.float32)).all()


@pytest.mark.slow
def test_the_module_takes_the_fused_path_when_the_backend_is_a_gpu(monkeypatch):
  """Built for a GPU (``platform``, as the run's set-up passes it), the layer
  calls ``fused_attention`` (XLA's implementation for float32, run here on
  CPU) and still gives the reference outputs at every real position."""
  length = 32
  x = jnp.asarray(np.random.default_rng(6).normal(size=(B, length, 16)), jnp.float32)
  seg, mask = _packed_causal_mask(length)
  layer = att.Attention(att.AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=4, causal=True))
  params = layer.init(jax.random.PRNGKey(0), x, mask=mask)
  ref = layer.apply(params, x, mask=mask)
  calls = []
  fused = att.fused_attention
  monkeypatch.setattr(att, "fused_attention",
                      lambda *a, **kw: calls.append(kw) or fused(*a, **kw))
  got = layer.clone(spec=dataclasses.replace(layer.spec, platform="gpu")).apply(
      params, x, mask=mask)
  assert [(c["implementation"], c["causal"]) for c in calls] == [("xla", True)]
  real = np.asarray(seg > 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real],
                             rtol=1e-5, atol=1e-5)
