"""Building blocks against slow, obviously-correct NumPy references.

Each formula (norms, FFN variants, sinusoidal table, RoPE, attention with
GQA/MQA, ALiBi slopes, T5 buckets, DeepNorm constants and init, the four
residual placements) is recomputed with loops over NumPy arrays or Python
floats, here or in references.py (those other test modules share), and
compared with the Flax code. Everything runs eagerly: on a 2-core CPU an XLA
compile costs more than these tiny computations.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.blocks import TransformerLayer
from tfx_jax.model.layers.attention import Attention, AttentionSpec, dot_product_attention
from tfx_jax.model.layers.ffn import FeedForward, activation_fn
from tfx_jax.model.layers.norms import LayerNorm, RMSNorm
from tfx_jax.model.layers.positions import (T5RelativeBias, alibi_bias, alibi_slopes, rope,
                                      rotary_spec, sinusoidal, t5_bucket)
from tfx_jax.model.config import deepnorm_constants, model_config_from_dict
from tfx_jax.model.families import build_model, layer_spec
from references import (jnp_rope, np_attention, np_layernorm, np_rmsnorm, np_rope, rand,
                        rope_theta)

ALL_ACTIVATIONS = ("relu", "gelu", "swish", "glu", "reglu", "geglu", "swiglu", "bilinear")


def _params(variables):
  """Plain nested dict of NumPy arrays (logical-axis boxes removed)."""
  import flax.linen as nn
  return jax.tree.map(np.asarray, nn.unbox(variables["params"]))


# ------------------------------------------------------------------ norms
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_layernorm_matches_numpy(eps):
  x = rand(0, 2, 3, 8, scale=3.0) + 1.5
  module = LayerNorm(eps=eps)
  assert set(module.init(jax.random.PRNGKey(0), x)["params"]) == {"scale", "bias"}
  # Non-trivial gain and bias, so both enter the check.
  variables = {"params": {"scale": jnp.asarray(rand(1, 8)), "bias": jnp.asarray(rand(2, 8))}}
  got = np.asarray(module.apply(variables, x))
  want = np_layernorm(x, np.asarray(variables["params"]["scale"]),
                      np.asarray(variables["params"]["bias"]), eps)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rmsnorm_matches_numpy(eps):
  x = rand(3, 2, 3, 8, scale=3.0) + 1.5
  module = RMSNorm(eps=eps)
  # No bias, no mean subtraction.
  assert set(module.init(jax.random.PRNGKey(0), x)["params"]) == {"scale"}
  variables = {"params": {"scale": jnp.asarray(rand(4, 8))}}
  got = np.asarray(module.apply(variables, x))
  want = np_rmsnorm(x, np.asarray(variables["params"]["scale"]), eps)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_norms_compute_statistics_in_float32_for_bfloat16():
  # bfloat16 inputs with a large mean (spacing 8 near 1000) and a small spread:
  # statistics taken in bfloat16 would be off by a good part of the spread.
  x = jnp.asarray(rand(5, 2, 4, 16, scale=10.0) + 1000.0, jnp.bfloat16)
  x32 = np.asarray(x, np.float32)  # the values the norm actually sees
  for module, ref in ((LayerNorm(dtype=jnp.bfloat16),
                       lambda p: np_layernorm(x32, p["scale"], p["bias"], 1e-6)),
                      (RMSNorm(dtype=jnp.bfloat16),
                       lambda p: np_rmsnorm(x32, p["scale"], 1e-6))):
    variables = module.init(jax.random.PRNGKey(0), x)
    got = module.apply(variables, x)
    assert got.dtype == jnp.bfloat16
    want = ref(_params(variables))
    # Only the final rounding to bfloat16 (8-bit mantissa) remains.
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=1e-2, atol=1e-2)


# -------------------------------------------------------------------- FFN
def _np_act(name, x):
  x = x.astype(np.float64)
  sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))
  erf = np.vectorize(math.erf)
  return {
      "relu": lambda: np.maximum(x, 0.0),
      "gelu": lambda: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))),
      "swish": lambda: x * sigmoid(x),
      "glu": lambda: sigmoid(x),
      "reglu": lambda: np.maximum(x, 0.0),
      "geglu": lambda: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))),
      "swiglu": lambda: x * sigmoid(x),
      "bilinear": lambda: x,
  }[name]()


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("activation", ALL_ACTIVATIONS)
def test_ffn_matches_numpy(activation, use_bias):
  act, gated = activation_fn(activation)
  assert gated == (activation in ("glu", "reglu", "geglu", "swiglu", "bilinear"))
  x = rand(6, 2, 3, 8, scale=2.0)
  module = FeedForward(d_ff=12, act=act, gated=gated, use_bias=use_bias)
  variables = module.init(jax.random.PRNGKey(1), x)
  p = _params(variables)
  assert ("wv" in p) == gated
  if use_bias:  # zero-initialised: make them matter
    for seed, name in enumerate(sorted(p)):
      p[name]["bias"] = rand(40 + seed, *p[name]["bias"].shape)
  got = np.asarray(module.apply({"params": p}, x))

  def dense(name, h):
    y = h.astype(np.float64) @ p[name]["kernel"]
    return y + p[name]["bias"] if use_bias else y

  if gated:  # Shazeer 2020: (act(x W) * (x V)) W2
    hidden = _np_act(activation, dense("wi", x)) * dense("wv", x)
  else:      # act(x W1 + b1) W2 + b2
    hidden = _np_act(activation, dense("wi", x))
  want = dense("wo", hidden)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------- sinusoidal
@pytest.mark.parametrize("d", [16, 9])
def test_sinusoidal_table_matches_paper_formula(d):
  length = 60
  got = np.asarray(sinusoidal(jnp.arange(length)[None], d))[0]
  want = np.zeros((length, d))
  for pos in range(length):
    for i in range((d + 1) // 2):
      angle = pos / 10000 ** (2 * i / d)
      want[pos, 2 * i] = math.sin(angle)
      if 2 * i + 1 < d:
        want[pos, 2 * i + 1] = math.cos(angle)
  # float32 angles up to 60 rad: absolute error ~ 60 * 2^-24.
  np.testing.assert_allclose(got, want, atol=2e-5)


def test_sinusoidal_uses_given_positions():
  pos = jnp.asarray([[3, 0, 7, 1]])
  table = np.asarray(sinusoidal(jnp.arange(8)[None], 16))[0]
  np.testing.assert_allclose(np.asarray(sinusoidal(pos, 16))[0], table[[3, 0, 7, 1]],
                             atol=1e-6)


# ------------------------------------------------------------------- RoPE
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rope_matches_numpy_rotation(base):
  x = rand(7, 2, 5, 3, 8)
  positions = np.asarray([[0, 1, 2, 3, 4], [7, 3, 0, 11, 30]])
  got = np.asarray(rope(jnp.asarray(x), jnp.asarray(positions), rotary_spec(8, base)))
  np.testing.assert_allclose(got, np_rope(x, positions, rope_theta(8, base)),
                             rtol=1e-5, atol=1e-5)
  # A rotation preserves the norm of every head vector.
  np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1),
                             rtol=1e-5)


def test_rope_scores_depend_only_on_offset():
  """R_i R_j^T = R_(i-j): q.k after rotation depends only on i - j."""
  d = 16
  q = rand(8, 1, 1, 1, d)
  k = rand(9, 1, 1, 1, d)

  def score(i, j):
    qi = rope(jnp.asarray(q), jnp.asarray([[i]]), rotary_spec(d))
    kj = rope(jnp.asarray(k), jnp.asarray([[j]]), rotary_spec(d))
    return float(jnp.sum(qi * kj))

  for i, j in [(5, 2), (2, 5), (9, 9), (17, 0)]:
    base = score(i, j)
    for shift in (1, 13, 100):
      assert score(i + shift, j + shift) == pytest.approx(base, rel=1e-4, abs=1e-4)
    assert score(i - j, 0) == pytest.approx(base, rel=1e-4, abs=1e-4)
  # ... and it does depend on the offset.
  assert abs(score(5, 2) - score(5, 3)) > 1e-3


def test_rope_half_split_equals_interleaved_up_to_permutation():
  """The paper's interleaved pairs (x0,x1),(x2,x3).. give the same q.k scores."""
  d = 8
  q, k = rand(10, d), rand(11, d)

  def interleaved(x, t):
    out = np.zeros(d)
    for i in range(d // 2):
      theta = 10000.0 ** (-2.0 * i / d)
      c, s = math.cos(t * theta), math.sin(t * theta)
      out[2 * i] = x[2 * i] * c - x[2 * i + 1] * s
      out[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c
    return out

  # Half-split pair i is (x_i, x_{i+d/2}); in interleaved layout it is (x_2i, x_2i+1).
  perm = np.empty(d, int)
  perm[0::2], perm[1::2] = np.arange(d // 2), np.arange(d // 2) + d // 2
  for i, j in [(3, 1), (0, 6), (12, 12)]:
    spec = rotary_spec(d)
    qi = np.asarray(rope(jnp.asarray(q)[None, None, None], jnp.asarray([[i]]), spec))
    kj = np.asarray(rope(jnp.asarray(k)[None, None, None], jnp.asarray([[j]]), spec))
    want = interleaved(q[perm], i) @ interleaved(k[perm], j)
    assert float(np.sum(qi * kj)) == pytest.approx(want, rel=1e-5, abs=1e-5)


# --------------------------------------------------------------- attention
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_dot_product_attention_matches_numpy(num_kv_heads):
  B, L, S, H, K = 2, 5, 7, 4, 8
  q = rand(12, B, L, H, K)
  k = rand(13, B, S, num_kv_heads, K)
  v = rand(14, B, S, num_kv_heads, K)
  bias = rand(15, B, H, L, S)
  mask = np.random.default_rng(16).random((B, 1, L, S)) < 0.7
  mask[..., 0] = True  # every query sees at least one key
  for m, bb in [(None, None), (mask, None), (mask, bias), (None, bias[:, :1])]:
    got = dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                None if m is None else jnp.asarray(m),
                                None if bb is None else jnp.asarray(bb))
    np.testing.assert_allclose(np.asarray(got), np_attention(q, k, v, m, bb),
                               rtol=1e-5, atol=1e-5)


def test_fully_masked_rows_stay_finite():
  q, k, v = rand(17, 1, 3, 2, 4), rand(18, 1, 3, 2, 4), rand(19, 1, 3, 2, 4)
  mask = np.zeros((1, 1, 3, 3), bool)
  mask[0, 0, 0, 0] = True  # rows 1 and 2 are padding queries
  out = dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                              jnp.asarray(mask))
  assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("num_kv_heads,rope_base,cross", [
    (4, None, False), (2, None, False), (1, None, False), (2, 10000.0, False),
    (2, None, True)], ids=["mha", "gqa", "mqa", "gqa-rope", "cross"])
def test_attention_module_matches_numpy(num_kv_heads, rope_base, cross):
  B, L, S, D, H, K = 2, 5, 6, 16, 4, 4
  x = rand(20, B, L, D)
  kv = rand(21, B, S, D) if cross else None
  positions = np.broadcast_to(np.arange(L), (B, L))
  mask = np.tril(np.ones((L, L), bool))[None, None].repeat(B, 0) if not cross else None
  module = Attention(AttentionSpec(
      num_heads=H, num_kv_heads=num_kv_heads, head_dim=K,
      rotary=None if rope_base is None else rotary_spec(K, rope_base)))
  args = (jnp.asarray(x),) if not cross else (jnp.asarray(x), jnp.asarray(kv))
  kw = dict(mask=None if mask is None else jnp.asarray(mask),
            positions_BL=jnp.asarray(positions))
  variables = module.init(jax.random.PRNGKey(2), *args, **kw)
  p = _params(variables)
  for name in p:  # random biases so that they are checked too
    p[name]["bias"] = rand(len(name), *p[name]["bias"].shape)
  got = np.asarray(module.apply({"params": p}, *args, **kw))

  src = x if not cross else kv
  proj = lambda name, y: np.einsum("bld,dhk->blhk", y, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj("query", x), proj("key", src), proj("value", src)
  assert k.shape[2] == num_kv_heads
  if rope_base is not None:
    inv_freq = rope_theta(K, rope_base)
    q, k = np_rope(q, positions, inv_freq), np_rope(k, positions, inv_freq)
  heads = np_attention(q, k, v, mask)
  want = np.einsum("blhk,hkd->bld", heads, p["out"]["kernel"]) + p["out"]["bias"]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------ ALiBi
def test_alibi_slopes_8_heads():
  np.testing.assert_allclose(alibi_slopes(8),
                             [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256])


def test_alibi_slopes_12_heads_follow_the_paper_rule():
  # Not a power of two: the 8 slopes of 8 heads, then every other slope of the
  # 16-head list 2^(-8k/16) = 2^(-k/2), k = 1, 3, 5, 7.
  want = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
  np.testing.assert_allclose(alibi_slopes(12), want, rtol=1e-6)


def test_alibi_slopes_other_counts():
  np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-k / 2) for k in range(1, 17)],
                             rtol=1e-6)
  np.testing.assert_allclose(alibi_slopes(1), [2.0**-8])
  np.testing.assert_allclose(alibi_slopes(2), [2.0**-4, 2.0**-8])
  # 6 heads: 4 of the 4-head list (2^-2k), then 2^-1, 2^-3 from the 8-head list.
  np.testing.assert_allclose(alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8,
                                               2.0**-1, 2.0**-3], rtol=1e-6)


def test_alibi_bias_is_minus_slope_times_distance():
  H, L = 4, 6
  pos = jnp.arange(L)[None]
  got = np.asarray(alibi_bias(pos, pos, H))
  slopes = [2.0 ** (-8 * k / H) for k in range(1, H + 1)]
  for h in range(H):
    for i in range(L):
      for j in range(i + 1):  # the causal part the paper defines
        assert got[0, h, i, j] == pytest.approx(-slopes[h] * (i - j), rel=1e-6)


# --------------------------------------------------------------- T5 buckets
# Expected values worked by hand from the formula in REFERENCES.md
# (32 buckets, max_distance 128), n = query_pos - key_pos.
#   bidirectional: 16 buckets a side, max_exact 8,
#     bucket(n) = n (n < 8) else min(15, 8 + floor(log(n/8) / log(16) * 8)); n < 0 adds 16.
#     15 -> 8 + floor(1.81) = 9;  16 -> 8 + 2 = 10;  20 -> 8 + floor(2.64) = 10;
#     32 -> 8 + 4 = 12;  64 -> 8 + 6 = 14;  127 -> 8 + floor(7.98) = 15;  128, 500 -> 15.
#   causal: n = max(n, 0), max_exact 16,
#     bucket(n) = n (n < 16) else min(31, 16 + floor(log(n/16) / log(8) * 16)).
#     20 -> 16 + floor(1.72) = 17;  32 -> 16 + floor(5.33) = 21;  64 -> 16 + floor(10.67) = 26;
#     127 -> 16 + floor(15.94) = 31;  128, 500 -> 31.
_BIDIRECTIONAL = {0: 0, 1: 1, 7: 7, 8: 8, 15: 9, 16: 10, 20: 10, 32: 12, 64: 14, 127: 15,
                  128: 15, 500: 15, -1: 17, -7: 23, -8: 24, -15: 25, -16: 26, -20: 26,
                  -64: 30, -127: 31, -128: 31, -500: 31}
_CAUSAL = {0: 0, 1: 1, 7: 7, 8: 8, 15: 15, 16: 16, 20: 17, 32: 21, 64: 26, 127: 31,
           128: 31, 500: 31, -1: 0, -8: 0, -500: 0}


@pytest.mark.parametrize("bidirectional,table", [(True, _BIDIRECTIONAL), (False, _CAUSAL)],
                         ids=["bidirectional", "causal"])
def test_t5_buckets_known_distances(bidirectional, table):
  n = np.asarray(list(table), np.int32)
  # t5_bucket takes relative_position = key_pos - query_pos = -n.
  got = np.asarray(t5_bucket(jnp.asarray(-n), bidirectional=bidirectional))
  assert dict(zip(n.tolist(), got.tolist())) == table


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_every_distance_against_python_formula(bidirectional):
  def bucket(n, num_buckets=32, max_distance=128):
    ret = 0
    if bidirectional:
      num_buckets //= 2
      ret = num_buckets if n < 0 else 0
      n = abs(n)
    else:
      n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
      return ret + n
    return ret + min(num_buckets - 1, max_exact + math.floor(
        math.log(n / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)))

  n = np.arange(-700, 701)
  got = np.asarray(t5_bucket(jnp.asarray(-n), bidirectional=bidirectional))
  want = np.asarray([bucket(int(v)) for v in n])
  np.testing.assert_array_equal(got, want)


def test_t5_relative_bias_looks_up_query_minus_key():
  module = T5RelativeBias(num_heads=3, bidirectional=False, init_std=1.0)
  pos = jnp.arange(5)[None]
  variables = module.init(jax.random.PRNGKey(0), pos, pos)
  table = _params(variables)["rel_embedding"]
  got = np.asarray(module.apply(variables, pos, pos))
  assert got.shape == (1, 3, 5, 5)
  for h, i, j in np.ndindex(3, 5, 5):
    # Causal, distances below max_exact = 16: bucket = max(i - j, 0).
    assert got[0, h, i, j] == table[max(i - j, 0), h]


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
@pytest.mark.slow
def test_t5_relative_bias_init_std_is_d_model_to_minus_half(family):
  """T5 / HF initialise the bias table with std d_model^-0.5 (here 1/8), small
  next to the content logits at init."""
  cfg = model_config_from_dict(dict(family=family, position="t5_bias", num_layers=1,
                                    d_model=64, num_heads=8, t5_num_buckets=128,
                                    vocab_size=16))
  ids = jnp.ones((1, 2), jnp.int32)
  params = _params(build_model(cfg).init(
      jax.random.PRNGKey(0), ids, *(() if family == "decoder_only" else (ids,))))
  tables = [v["rel_embedding"] for k, v in params.items() if k.endswith("relative_bias")]
  assert len(tables) == (1 if family == "decoder_only" else 2)
  for table in tables:
    assert table.shape == (128, 8)
    # 1024 samples: the std estimate is good to ~2%.
    assert np.std(table) == pytest.approx(64**-0.5, rel=0.1)


# --------------------------------------------------------------- DeepNorm
def test_deepnorm_constants_worked_values():
  (a, b), = deepnorm_constants("decoder_only", 0, 6).values()
  assert (a, b) == pytest.approx((1.861, 0.380), abs=1e-3)
  c = deepnorm_constants("encoder_decoder", 6, 6)
  assert c["encoder"] == pytest.approx((1.418, 0.497), abs=1e-3)
  assert c["decoder"] == pytest.approx((2.060, 0.343), abs=1e-3)
  # 12 layers: alpha = 24^(1/4), beta = 96^(-1/4).
  assert deepnorm_constants("decoder_only", 0, 12)["decoder"] == pytest.approx(
      (2.2134, 0.3195), abs=1e-3)
  assert deepnorm_constants("encoder_only", 12, 0)["encoder"] == pytest.approx(
      (2.2134, 0.3195), abs=1e-3)


@pytest.mark.parametrize("n", [6, 12, 100])
def test_deepnorm_constants_formulas(n):
  assert deepnorm_constants("decoder_only", 0, n) == {
      "decoder": pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))}
  assert deepnorm_constants("encoder_only", n, 0) == {
      "encoder": pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))}
  m = n // 2
  c = deepnorm_constants("encoder_decoder", n, m)
  assert c["encoder"] == pytest.approx((0.81 * (n**4 * m) ** (1 / 16),
                                        0.87 * (n**4 * m) ** (-1 / 16)))
  assert c["decoder"] == pytest.approx(((3 * m) ** 0.25, (12 * m) ** -0.25))


def test_deepnorm_layer_spec_uses_the_stack_constants():
  cfg = model_config_from_dict(dict(family="encoder_decoder", norm_position="deepnorm",
                                    num_layers=6, d_model=16, num_heads=2))
  enc, dec = (layer_spec(cfg, s, cross_attention=s == "decoder")
              for s in ("encoder", "decoder"))
  # beta: the gain of the values, the attention's output and the FFN.
  for spec, (alpha, beta) in ((enc, (1.418, 0.497)), (dec, (2.060, 0.343))):
    assert (spec.alpha, spec.attention.vo_gain, spec.ffn.vo_gain) == pytest.approx(
        (alpha, beta, beta), abs=1e-3)
  assert dec.cross_attention.vo_gain == dec.attention.vo_gain
  cfg = model_config_from_dict(dict(family="decoder_only", norm_position="deepnorm",
                                    num_layers=6, d_model=16, num_heads=2))
  spec = layer_spec(cfg, "decoder", cross_attention=False)
  assert (spec.alpha, spec.attention.vo_gain, spec.ffn.vo_gain) == pytest.approx(
      (1.861, 0.380, 0.380), abs=1e-3)
  pre = model_config_from_dict(dict(family="decoder_only", norm_position="pre",
                                    num_layers=6, d_model=16, num_heads=2))
  spec = layer_spec(pre, "decoder", cross_attention=False)
  assert (spec.alpha, spec.attention.vo_gain, spec.ffn.vo_gain) == (1.0, 1.0, 1.0)


def _std_and_kurtosis(w):
  w = np.asarray(w, np.float64).ravel()
  std = w.std()
  return std, float(np.mean(((w - w.mean()) / std) ** 4))


@pytest.mark.parametrize("family,num_layers,betas", [
    ("decoder_only", 6, {"decoder": 0.380}),
    ("encoder_decoder", 6, {"encoder": 0.497, "decoder": 0.343}),
])
def test_deepnorm_init_uses_beta(family, num_layers, betas):
  """Xavier-normal, gain beta on value/out/FFN kernels, gain 1 on query/key."""
  D, F = 128, 512
  cfg = model_config_from_dict(dict(
      family=family, norm_position="deepnorm", num_layers=num_layers, d_model=D,
      num_heads=4, d_ff=F, vocab_size=16, activation="relu", position="none"))
  params = build_model(cfg).init(jax.random.PRNGKey(0), jnp.ones((1, 2), jnp.int32),
                                 *(() if family == "decoder_only"
                                   else (jnp.ones((1, 2), jnp.int32),)))
  params = _params(params)
  xavier_attn = math.sqrt(2.0 / (D + D))
  xavier_ffn = math.sqrt(2.0 / (D + F))
  for stack, beta in betas.items():
    layer = params[stack]["layer_0"]
    attns = ["self_attention"] + (["cross_attention"] if "cross_attention" in layer else [])
    expected = {}
    for a in attns:
      expected[(a, "query")] = xavier_attn
      expected[(a, "key")] = xavier_attn
      expected[(a, "value")] = beta * xavier_attn
      expected[(a, "out")] = beta * xavier_attn
    expected[("ffn", "wi")] = beta * xavier_ffn
    expected[("ffn", "wo")] = beta * xavier_ffn
    for (sub, name), want in expected.items():
      std, kurt = _std_and_kurtosis(layer[sub][name]["kernel"])
      # >= 16k samples: the std estimate is good to ~1%.
      assert std == pytest.approx(want, rel=0.05), (stack, sub, name)
      assert 2.7 < kurt < 3.3, (stack, sub, name, "not normal")  # uniform has 1.8


def test_non_deepnorm_init_is_xavier_uniform_with_gain_1():
  D = 128
  cfg = model_config_from_dict(dict(family="decoder_only", norm_position="pre",
                                    num_layers=6, d_model=D, num_heads=4, d_ff=512,
                                    vocab_size=16, activation="relu", position="none"))
  params = _params(build_model(cfg).init(jax.random.PRNGKey(0),
                                         jnp.ones((1, 2), jnp.int32)))
  layer = params["decoder"]["layer_0"]
  for name in ("query", "key", "value", "out"):
    std, kurt = _std_and_kurtosis(layer["self_attention"][name]["kernel"])
    assert std == pytest.approx(math.sqrt(2.0 / (2 * D)), rel=0.05)
    assert 1.7 < kurt < 1.9  # uniform


# --------------------------------------------------------- residual placement
@pytest.mark.parametrize("norm_position", ["post", "pre", "sandwich", "deepnorm"])
@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_residual_formula(norm_position, norm_type):
  """One layer against the seed formulas, composed by hand from its sublayers:
  post Norm(x + F(x)); pre x + F(Norm(x)); sandwich x + Norm(F(Norm(x)));
  deepnorm Norm(alpha x + F(x))."""
  cfg = model_config_from_dict(dict(
      family="decoder_only", norm_position=norm_position, norm_type=norm_type,
      num_layers=3, d_model=16, num_heads=4, num_kv_heads=2, gated_d_ff=24,
      activation="swiglu", position="rope"))
  spec = layer_spec(cfg, "decoder", cross_attention=False)
  B, L = 2, 5
  x = jnp.asarray(rand(30, B, L, 16, scale=2.0))
  mask = jnp.asarray(np.tril(np.ones((L, L), bool))[None, None].repeat(B, 0))
  pos = jnp.broadcast_to(jnp.arange(L), (B, L))
  layer = TransformerLayer(spec)
  args = (mask, None, pos, None, None, None)
  variables = layer.init(jax.random.PRNGKey(3), x, *args)
  p = _params(variables)
  # Random norm gains/biases so that a swapped or missing norm is visible.
  for name in p:
    if name.endswith("norm"):
      p[name] = {k: rand(len(name) + len(k), *v.shape) for k, v in p[name].items()}
  got, _ = layer.apply({"params": p}, x, *args)

  norm_cls = LayerNorm if norm_type == "layernorm" else RMSNorm
  norm = lambda name, y: norm_cls(eps=cfg.norm_eps).apply({"params": p[name]}, y)
  attn = lambda y: Attention(AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=4,
                                           rotary=spec.attention.rotary)).apply(
                                 {"params": p["self_attention"]}, y, mask=mask,
                                 positions_BL=pos)
  ffn = lambda y: FeedForward(d_ff=24, act=jax.nn.silu, gated=True).apply(
      {"params": p["ffn"]}, y)
  alpha = (2 * 3) ** 0.25  # decoder-only, 3 layers
  h = x
  for name, f in (("self_attention", attn), ("ffn", ffn)):
    if norm_position == "post":
      h = norm(f"{name}_norm", h + f(h))
    elif norm_position == "pre":
      h = h + f(norm(f"{name}_norm", h))
    elif norm_position == "sandwich":
      h = h + norm(f"{name}_post_norm", f(norm(f"{name}_norm", h)))
    else:
      assert spec.alpha == pytest.approx(alpha)
      h = norm(f"{name}_norm", alpha * h + f(h))
  np.testing.assert_allclose(np.asarray(got), np.asarray(h), rtol=1e-5, atol=1e-5)


def test_rope_gradient_is_the_inverse_rotation():
  """rope's own backward (the rotation by the opposite angle) against autodiff of
  the plain split-and-concatenate formula."""
  r = np.random.default_rng(5)
  x = jnp.asarray(r.normal(size=(2, 7, 3, 8)), jnp.float32)
  positions = jnp.asarray(r.integers(0, 50, size=(2, 7)))
  w = jnp.asarray(r.normal(size=x.shape), jnp.float32)

  got = jax.grad(lambda x: jnp.sum(jnp.sin(rope(x, positions, rotary_spec(8))) * w))(x)
  want = jax.grad(lambda x: jnp.sum(jnp.sin(jnp_rope(x, positions, rope_theta(8))) * w))(x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
