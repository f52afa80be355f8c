"""bf16 projections in the CPU's fast form (``model/layers/products.py``) against
float32 references: values to bf16 rounding, gradients included."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.layers import products
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model

BF16 = jnp.bfloat16


def _rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _operands(seed=0, t=96, k=48, n=80):
  r = np.random.default_rng(seed)
  return (jnp.asarray(r.normal(size=(t, k)), jnp.float32),
          jnp.asarray(r.normal(size=(k, n)), jnp.float32),
          jnp.asarray(r.normal(size=(t, n)), jnp.float32))


@pytest.mark.slow
def test_matmul_and_its_gradients_match_float32_to_bf16_rounding():
  x, w, g = _operands()
  y = products.matmul(x.astype(BF16), w.astype(BF16))
  assert y.dtype == BF16
  assert _rel(y, x @ w) < 1e-2
  assert products.matmul(x.astype(BF16), w.astype(BF16), jnp.float32).dtype == jnp.float32
  loss = lambda f: lambda x, w: jnp.sum(f(x, w).astype(jnp.float32) * g)
  dx, dw = jax.grad(loss(products.matmul), argnums=(0, 1))(x.astype(BF16), w.astype(BF16))
  rx, rw = jax.grad(loss(jnp.dot), argnums=(0, 1))(x, w)
  assert dx.dtype == BF16 and dw.dtype == BF16
  assert _rel(dx, rx) < 1e-2 and _rel(dw, rw) < 1e-2
  # Through a float32 parameter cast to bf16 (what a Dense does): a float32 gradient.
  gw = jax.grad(lambda w: loss(products.matmul)(x.astype(BF16), w.astype(BF16)))(w)
  assert gw.dtype == jnp.float32 and _rel(gw, rw) < 1e-2


@pytest.mark.parametrize("features, axis", [(32, -1), ((4, 8), -1), (24, (-2, -1))])
@pytest.mark.slow
def test_dense_layers_through_the_fast_product(features, axis):
  """Dense / DenseGeneral shapes of the model (one axis; heads out; heads in):
  the same outputs and gradients as Flax's own bf16 product, to bf16 rounding."""
  r = np.random.default_rng(1)
  x = jnp.asarray(r.normal(size=(2, 6, 4, 8) if axis != -1 else (2, 6, 32)), jnp.float32)
  layers = [nn.DenseGeneral(features, axis=axis, dtype=BF16, dot_general=d)
            for d in (products.dot_general, None)]
  params = layers[1].init(jax.random.PRNGKey(0), x)
  fast, ref = (lambda p, l=l: l.apply(p, x) for l in layers)
  assert _rel(fast(params), ref(params)) < 1e-2
  ref32 = nn.DenseGeneral(features, axis=axis)
  grad = lambda f: jax.grad(lambda p: jnp.sum(jnp.sin(f(p).astype(jnp.float32))))(params)
  for a, b in zip(jax.tree.leaves(grad(fast)),
                  jax.tree.leaves(grad(lambda p: ref32.apply(p, x)))):
    assert _rel(a, b) < 2e-2


def test_other_contractions_keep_xla_s_own_product():
  x, w, _ = _operands(2)
  batched = (((2,), (1,)), ((0,), (0,)))
  a = jnp.stack([x, x]).astype(BF16)
  b = jnp.stack([w, w]).astype(BF16)
  np.testing.assert_array_equal(products.dot_general(a, b, batched),
                                jax.lax.dot_general(a, b, batched))


def test_the_fast_product_is_chosen_for_bf16_on_cpu_only():
  assert products.dot_general_for(BF16, "cpu") is products.dot_general
  assert products.dot_general_for(jnp.float32, "cpu") is None
  assert products.dot_general_for(BF16, "gpu") is None
  assert products.dot_general_for(BF16, "tpu") is None


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.slow
def test_a_bf16_model_trains_like_float32(tied, monkeypatch):
  """The LM's loss and gradients in bf16 (every projection and the logits
  through ``matmul``) against the same parameters in float32."""
  calls = []
  original = products.matmul
  monkeypatch.setattr(products, "matmul",
                      lambda *a: calls.append(a[0].shape) or original(*a))
  base = dict(family="decoder_only", num_layers=2, d_model=64, num_heads=4, vocab_size=256,
              max_len=32, activation="swiglu", tie_embeddings=tied)
  ids = jnp.asarray(np.random.default_rng(3).integers(1, 256, size=(2, 16)), jnp.int32)
  m32 = build_model(model_config_from_dict(base))
  m16 = build_model(model_config_from_dict({**base, "dtype": "bfloat16"}))
  # Compiled as training compiles them: one program each, not op by op.
  params = nn.unbox(jax.jit(m32.init)(jax.random.PRNGKey(0), ids))["params"]

  def loss(model):
    def f(p):
      logits = model.apply({"params": p}, ids[:, :-1])["logits"]
      assert logits.dtype == jnp.float32
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], -1))
    return jax.jit(jax.value_and_grad(f))

  calls.clear()
  jax.jit(m16.apply)({"params": params}, ids)
  # 2 layers x (q, k, v, out, wi, wv, wo) + the vocabulary projection.
  assert len(calls) == 2 * 7 + 1
  l32, g32 = loss(m32)(params)
  l16, g16 = loss(m16)(params)
  assert abs(float(l16) - float(l32)) < 0.02
  flat = lambda g: np.concatenate([np.ravel(np.asarray(x, np.float32))
                                   for x in jax.tree.leaves(g)])
  assert _rel(flat(g16), flat(g32)) < 0.02
  total = np.linalg.norm(flat(g32))
  for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
    assert a.dtype == jnp.float32
    # Each parameter's gradient, where it is not ~0 in float32 (the key bias's
    # is, analytically: softmax ignores it; bf16 rounding leaves ~1e-5 there).
    if np.linalg.norm(b) > 1e-3 * total:
      assert _rel(a, b) < 0.05


def test_the_row_major_transpose_is_exact():
  x, w, _ = _operands(4, t=37, k=5, n=11)
  for a in (x.astype(BF16), w):
    np.testing.assert_array_equal(products.row_major_transpose(a), np.asarray(a).T)
