"""Gated DeltaNet: a linear-attention token mixer with a delta-rule state (``model.mixer_pattern`` D).

Yang, Kautz, Hatamizadeh 2025 (ICLR), "Gated Delta Networks: Improving Mamba2
with Delta Rule"; fla-org/flash-linear-attention ``fla/layers/gated_deltanet.py``
(the layer) and ``fla/ops/gated_delta_rule/naive.py`` (the recurrence); HF
transformers ``models/qwen3_next/modeling_qwen3_next.py::Qwen3NextGatedDeltaNet``.
Each head keeps a state S [d_k, d_v]; per token t

  S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t

(the paper writes S [d_v, d_k] and o_t = S_t q_t: the same state, transposed),
with q, k, v = SiLU(short causal depthwise conv(x W_q | W_k | W_v)), q and k
L2-normalised per head (eps 1e-6 inside the root, as fla and HF), q scaled by
d_k^-1/2, alpha_t = exp(g_t), g_t = -exp(A_log) softplus(x_t W_a + dt_bias),
beta_t = sigmoid(x_t W_b). The output is RMSNorm(o_t) (per head, one gain
vector of d_v shared by the heads) times SiLU(x_t W_g), then W_o.

Initialisation (fla's): A ~ U(0, 16) (A_log = log A; drawn as 16 (1 - u), u in
[0, 1), so never log 0), dt ~ logU(1e-3, 0.1) and dt_bias = softplus^-1(dt) =
dt + log(-expm1(-dt)); the conv kernels as PyTorch's ``Conv1d`` default, U(-1/sqrt
W, 1/sqrt W) (fla's ``ShortConvolution`` and HF's ``conv1d`` are Conv1d, no bias);
the projections as :class:`Attention`'s (q, k, the gate: ``qk_init``; v and the
output: ``vo_gain``). W_a and W_b have no bias (dt_bias is W_a's), as both
references; the others follow ``model.use_bias``.

Two forms of the same recurrence: :func:`recurrent_gated_delta_rule` (a
``lax.scan`` over tokens: the decoding step) and :func:`chunked_gated_delta_rule`
(training and prefill: a ``lax.scan`` over chunks of C tokens, within a chunk
the UT/WY transform, one unit-lower-triangular solve, as fla's chunk form and
Qwen3-Next's ``torch_chunk_gated_delta_rule``).

Packed documents: the state (and the short convolution's window) never crosses
the start of a segment, where ``segment_ids`` changes from one token to the
next (the batch contract: segments are contiguous runs, padding 0): there the
decay is 0 (alpha_t r_t, r_t = 0 at a start), as fla's ``cu_seqlens`` varlen
form resets. A real token's output depends only on the earlier tokens of its
own document, as under the attention mask.

Grouped value heads (Qwen3-Next; ``model.deltanet_v_heads``,
``model.deltanet_v_head_dim``): q and k have H heads of d_k, v, the gate z,
alpha and beta H_v = r H heads of d_v; key head h serves the value heads h r
... h r + r - 1 (HF's ``repeat_interleave`` of q and k), each value head one
state [d_k, d_v]. H_v = H and d_v = d_k (the default) is the layer above.

Decoding (``use_cache``): the ``cache`` collection holds ``recurrent_state``
[B, H_v, d_k, d_v] (float32) and ``query_conv_state``, ``key_conv_state``
[B, W - 1, H, d_k] and ``value_conv_state`` [B, W - 1, H_v, d_v] (the last W -
1 inputs of each convolution); one token costs one recurrent step.

Hugging Face ``Qwen3NextGatedDeltaNet`` (its mixer has no biases) maps onto
these parameters as (tfx_jax/hf/qwen3_next.py)
  in_proj_qkvz.weight [H (2 d_k + 2 r d_v), D], per key head q, k, v, z (the
                    last two r value heads each)
                    -> query / key [D, H, d_k], value / gate [D, H_v, d_v]
  in_proj_ba.weight [H 2 r, D], per key head b, a (r value heads each)
                    -> beta / decay ``kernel`` [D, H_v]
  conv1d.weight [2 H d_k + H_v d_v, 1, W] (channels q | k | v, tap W - 1 the
                    current token) -> query_conv / key_conv [W, H, d_k],
                    value_conv [W, H_v, d_v]
  A_log [H_v] -> A_log;  dt_bias [H_v] -> dt_bias
  norm.weight [d_v] -> out_norm [d_v] (HF's RMSNormGated: w x / rms, times SiLU(z))
  out_proj.weight [D, H_v d_v] -> out ``kernel`` [H_v, d_v, D]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.layers import products

Initializer = Callable[..., jax.Array]

L2_EPS = 1e-6  # fla's and HF's l2norm: x / sqrt(sum x^2 + 1e-6)


def l2_normalize(x, eps: float = L2_EPS):
  """x / sqrt(sum(x^2) + eps) over the last axis (fla's ``l2norm``)."""
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)


def gates(a_BLH, b_BLH, A_log_H, dt_bias_H):
  """(g, beta) in float32: g = -exp(A_log) softplus(a + dt_bias) (log alpha,
  <= 0), beta = sigmoid(b)."""
  f32 = jnp.float32
  g = -jnp.exp(A_log_H.astype(f32)) * jax.nn.softplus(a_BLH.astype(f32)
                                                      + dt_bias_H.astype(f32))
  return g, jax.nn.sigmoid(b_BLH.astype(f32))


def document_index(segment_ids_BL, shape):
  """[B, L] int32: how many segment starts (a change of id from the previous
  token) lie at or before each token; zeros without segment ids. Two tokens
  share a document iff their indices are equal; the tokens before the
  sequence (a cache) are document 0."""
  if segment_ids_BL is None:
    return jnp.zeros(shape, jnp.int32)
  starts = (segment_ids_BL[:, 1:] != segment_ids_BL[:, :-1]).astype(jnp.int32)
  return jnp.pad(jnp.cumsum(starts, axis=1), ((0, 0), (1, 0)))


def recurrent_gated_delta_rule(q_BLHK, k_BLHK, v_BLHV, g_BLH, beta_BLH, doc_BL=None,
                               state_BHKV=None):
  """The recurrence token by token: (o [B, L, H, V], final state [B, H, K, V]).

  S <- alpha_t r_t S; S <- S + k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t,
  with r_t = 0 where the document index changes (0 for the tokens before the
  sequence). q and k as the rule reads them (normalised, q scaled). Float32.
  """
  f32 = jnp.float32
  B, L, H, K = k_BLHK.shape
  V = v_BLHV.shape[-1]
  doc = jnp.zeros((B, L), jnp.int32) if doc_BL is None else doc_BL
  keep_BL = doc == jnp.pad(doc, ((0, 0), (1, 0)))[:, :-1]
  state = jnp.zeros((B, H, K, V), f32) if state_BHKV is None else state_BHKV.astype(f32)
  decay_BLH = jnp.exp(g_BLH.astype(f32)) * keep_BL[:, :, None]

  def step(S, xs):
    q, k, v, decay, beta = xs
    S = S * decay[:, :, None, None]
    delta = beta[..., None] * (v - jnp.einsum("bhkv,bhk->bhv", S, k))
    S = S + jnp.einsum("bhk,bhv->bhkv", k, delta)
    return S, jnp.einsum("bhkv,bhk->bhv", S, q)

  xs = [jnp.swapaxes(x.astype(f32), 0, 1) for x in (q_BLHK, k_BLHK, v_BLHV, decay_BLH,
                                                    beta_BLH)]
  state, o_LBHV = jax.lax.scan(step, state, xs)
  return jnp.swapaxes(o_LBHV, 0, 1), state


def chunked_gated_delta_rule(q_BLHK, k_BLHK, v_BLHV, g_BLH, beta_BLH, doc_BL=None,
                             state_BHKV=None, *, chunk: int = 64):
  """The same recurrence by chunks of C = min(chunk, L) tokens (the sequence
  padded to a multiple of C with tokens that leave the state as it is: beta 0,
  g 0): (o [B, L, H, V], final state [B, H, K, V]).

  Within a chunk, with G_i = sum of g up to i, Gamma_ij = exp(G_i - G_j) for j
  <= i in one document (0 across a start) and Gamma_i0 = exp(G_i) while i is
  in the document the chunk started in (else 0), the deltas
  delta_i = beta_i (v_i - (Gamma_i0 S_0 + sum_{j<i} Gamma_ij k_j delta_j^T)^T k_i)
  solve one unit-lower-triangular system (I + A) delta = beta V - (beta K *
  Gamma_.0) S_0, A_ij = beta_i Gamma_ij k_i.k_j (j < i): the UT transform
  (Yang et al. 2024, DeltaNet's WY form, with the gates as Gated DeltaNet's
  section 3.3). Then o_i = Gamma_i0 S_0^T q_i + sum_{j<=i} Gamma_ij (q_i.k_j)
  delta_j and S_C = Gamma_C0 S_0 + sum_j Gamma_Cj k_j delta_j^T; a
  ``lax.scan`` carries S over the chunks.
  """
  f32 = jnp.float32
  B, L, H, K = k_BLHK.shape
  V = v_BLHV.shape[-1]
  C = max(1, min(chunk, L))
  pad = (-L) % C
  N = (L + pad) // C
  doc = jnp.zeros((B, L), jnp.int32) if doc_BL is None else doc_BL
  state = jnp.zeros((B, H, K, V), f32) if state_BHKV is None else state_BHKV.astype(f32)
  zpad = lambda x: jnp.pad(x.astype(f32), ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
  # [B, N, C, ...] per chunk; the padded tokens continue the last document.
  chunks = lambda x: x.reshape(B, N, C, *x.shape[2:])
  q, k, v, g, beta = (chunks(zpad(x)) for x in (q_BLHK, k_BLHK, v_BLHV, g_BLH, beta_BLH))
  doc_BNC = chunks(jnp.pad(doc, ((0, 0), (0, pad)), mode="edge"))
  # The document of the token before each chunk (0 before the sequence).
  prev_BN = jnp.pad(doc_BNC[:, :-1, -1], ((0, 0), (1, 0)))

  G_BNCH = jnp.cumsum(g, axis=2)
  lower_CC = jnp.tril(jnp.ones((C, C), bool))
  same_BNCC = (doc_BNC[:, :, :, None] == doc_BNC[:, :, None, :]) & lower_CC
  same_BNHCC = same_BNCC[:, :, None]
  G_BNHC = jnp.moveaxis(G_BNCH, 3, 2)
  # Masked before the exp as well: above the diagonal G_i - G_j > 0 may overflow.
  diff = G_BNHC[..., :, None] - G_BNHC[..., None, :]
  decay_BNHCC = jnp.where(same_BNHCC, jnp.exp(jnp.where(same_BNHCC, diff, 0.0)), 0.0)
  from_start_BNC = doc_BNC == prev_BN[:, :, None]
  decay0_BNCH = jnp.where(from_start_BNC[..., None], jnp.exp(G_BNCH), 0.0)
  to_end_BNC = doc_BNC == doc_BNC[:, :, -1:]
  G_end_BN1H = G_BNCH[:, :, -1:]
  decay_end_BNCH = jnp.where(to_end_BNC[..., None],
                             jnp.exp(jnp.where(to_end_BNC[..., None], G_end_BN1H - G_BNCH,
                                               0.0)), 0.0)
  chunk_decay_BNH = jnp.where((doc_BNC[:, :, -1] == prev_BN)[..., None],
                              jnp.exp(G_end_BN1H[:, :, 0]), 0.0)

  kb = k * beta[..., None]
  vb = v * beta[..., None]
  strict_CC = jnp.tril(jnp.ones((C, C), bool), -1)
  A_BNHCC = jnp.einsum("bnihk,bnjhk->bnhij", kb, k) * decay_BNHCC * strict_CC
  T_BNHCC = A_BNHCC + jnp.eye(C, dtype=f32)
  rhs = jnp.concatenate([vb, kb * decay0_BNCH[..., None]], axis=-1)  # [B, N, C, H, V + K]
  solved = jax.scipy.linalg.solve_triangular(
      T_BNHCC, jnp.moveaxis(rhs, 3, 2), lower=True, unit_diagonal=True)
  u_BNHCV, w_BNHCK = solved[..., :V], solved[..., V:]
  intra_BNHCC = jnp.einsum("bnihk,bnjhk->bnhij", q, k) * decay_BNHCC
  q0_BNHCK = jnp.moveaxis(q * decay0_BNCH[..., None], 3, 2)
  kend_BNHCK = jnp.moveaxis(k * decay_end_BNCH[..., None], 3, 2)

  def step(S, xs):
    u, w, intra, q0, kend, chunk_decay = xs
    delta = u - jnp.einsum("bhck,bhkv->bhcv", w, S)
    o = jnp.einsum("bhck,bhkv->bhcv", q0, S) + jnp.einsum("bhij,bhjv->bhiv", intra, delta)
    S = S * chunk_decay[:, :, None, None] + jnp.einsum("bhck,bhcv->bhkv", kend, delta)
    return S, o

  xs = [jnp.moveaxis(x, 1, 0) for x in (u_BNHCV, w_BNHCK, intra_BNHCC, q0_BNHCK,
                                        kend_BNHCK, chunk_decay_BNH)]
  state, o_NBHCV = jax.lax.scan(step, state, xs)
  o_BLHV = jnp.moveaxis(o_NBHCV, 0, 1).transpose(0, 1, 3, 2, 4).reshape(B, N * C, H, V)
  return o_BLHV[:, :L], state


def short_conv(x_BLHK, kernel_WHK, doc_BL, state_BwHK=None):
  """Causal depthwise convolution: y_t = sum_j w_j x_{t - (W-1) + j}, tap W - 1 the
  current token, inputs of another document (or before the sequence with no
  ``state``) counted as 0; returns (y, the last W - 1 inputs, the next state)."""
  B, L = x_BLHK.shape[:2]
  W = kernel_WHK.shape[0]
  if state_BwHK is None:
    state_BwHK = jnp.zeros((B, W - 1, *x_BLHK.shape[2:]), x_BLHK.dtype)
  xx = jnp.concatenate([state_BwHK.astype(x_BLHK.dtype), x_BLHK], axis=1)
  dd = jnp.pad(doc_BL, ((0, 0), (W - 1, 0)))  # the state's tokens: document 0
  y = sum(kernel_WHK[j] * jnp.where((dd[:, j:j + L] == doc_BL)[..., None, None],
                                    xx[:, j:j + L], 0)
          for j in range(W))
  return y, xx[:, xx.shape[1] - (W - 1):]


def conv_init(key, shape, dtype=jnp.float32):
  """PyTorch's ``Conv1d`` default for a depthwise kernel [W, ...]: U(-1/sqrt(W), 1/sqrt(W))."""
  bound = 1.0 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def A_log_init(key, shape, dtype=jnp.float32):
  """log A, A ~ U(0, 16] (fla: ``uniform_(0, 16)``; 16 (1 - u) is never 0)."""
  return jnp.log(16.0 * (1.0 - jax.random.uniform(key, shape, dtype)))


def dt_bias_init(key, shape, dtype=jnp.float32, dt_min=1e-3, dt_max=0.1, floor=1e-4):
  """softplus^-1(dt), dt ~ logU(dt_min, dt_max) clamped at ``floor`` (fla, Mamba)."""
  u = jax.random.uniform(key, shape, dtype)
  dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)),
                   floor)
  return dt + jnp.log(-jnp.expm1(-dt))


@dataclasses.dataclass(frozen=True)
class DeltaNetSpec:
  """The Gated DeltaNet layers of one stack, resolved from ``model.deltanet_*``
  (``specs.layer_spec``): key heads and their width d_k, value heads and their
  width d_v (0: as the keys), the short convolution's width (0: none, SiLU of
  the projections as fla), the chunk."""
  num_heads: int
  head_dim: int
  v_heads: int = 0
  v_head_dim: int = 0
  conv_width: int = 4
  chunk: int = 64
  use_bias: bool = False
  qk_init: Initializer = nn.initializers.xavier_uniform()
  vo_init: Initializer = nn.initializers.xavier_uniform()
  norm_eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  platform: str = "cpu"


class GatedDeltaNet(nn.Module):
  """The token mixer of a D layer; the call signature of :class:`Attention`
  (``mask``, ``bias`` and ``positions_BL`` are not read: the recurrence is
  causal and position-free; ``segment_ids_BL`` resets it at each document)."""
  spec: DeltaNetSpec
  use_cache: bool = False
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BLD, kv_BSD=None, *, mask=None, bias=None, positions_BL=None,
               cache_index=None, segment_ids_BL=None):
    assert kv_BSD is None, "Gated DeltaNet mixes a sequence with itself"
    s = self.spec
    B, L, D = x_BLD.shape
    H, K, W = s.num_heads, s.head_dim, s.conv_width
    Hv, V = s.v_heads or H, s.v_head_dim or K
    flat = lambda x: x.reshape(-1, x.shape[-1])
    unflat = lambda y: y.reshape(B, L, *y.shape[1:])

    def proj(name, init, features=(H, K), use_bias=s.use_bias):
      axes = ("embed", "heads", "kv")[:1 + len(features)]
      return lambda x: unflat(nn.DenseGeneral(
          features, axis=-1, use_bias=use_bias, dtype=s.dtype, name=name,
          dot_general=products.dot_general_for(s.dtype, s.platform),
          kernel_init=nn.with_logical_partitioning(init, axes),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))(flat(x)))

    shapes = ((H, K), (H, K), (Hv, V))
    qkv = [proj("query", s.qk_init)(x_BLD), proj("key", s.qk_init)(x_BLD),
           proj("value", s.vo_init, (Hv, V))(x_BLD)]
    decoding = self.use_cache and cache_index is not None
    doc_BL = document_index(None if decoding else segment_ids_BL, (B, L))
    if self.use_cache:
      recurrent = self.variable("cache", "recurrent_state", jnp.zeros, (B, Hv, K, V),
                                jnp.float32)
    if W:
      for i, name in enumerate(("query_conv", "key_conv", "value_conv")):
        kernel = self.param(name, nn.with_logical_partitioning(
            conv_init, (None, "heads", "kv")), (W, *shapes[i])).astype(s.dtype)
        if self.use_cache:
          conv_state = self.variable("cache", f"{name}_state", jnp.zeros,
                                     (B, W - 1, *shapes[i]), s.dtype)
        qkv[i], new = short_conv(qkv[i], kernel, doc_BL,
                                 conv_state.value if decoding else None)
        if decoding:
          conv_state.value = new.astype(conv_state.value.dtype)
    q, k, v = (jax.nn.silu(x.astype(jnp.float32)) for x in qkv)
    q = l2_normalize(q) * K ** -0.5
    k = l2_normalize(k)
    if Hv != H:  # each key head serves Hv / H consecutive value heads
      q, k = (jnp.repeat(x, Hv // H, axis=2) for x in (q, k))
    A_log = self.param("A_log", nn.with_logical_partitioning(A_log_init, ("heads",)), (Hv,))
    dt_bias = self.param("dt_bias", nn.with_logical_partitioning(dt_bias_init, ("heads",)),
                         (Hv,))
    g, beta = gates(proj("decay", s.qk_init, (Hv,), False)(x_BLD),
                    proj("beta", s.qk_init, (Hv,), False)(x_BLD), A_log, dt_bias)
    state = recurrent.value if decoding else None
    if L == 1 and decoding:
      o_BLHK, state = recurrent_gated_delta_rule(q, k, v, g, beta, doc_BL, state)
    else:
      o_BLHK, state = chunked_gated_delta_rule(q, k, v, g, beta, doc_BL, state,
                                               chunk=s.chunk)
    if decoding:
      recurrent.value = state
    scale = self.param("out_norm", nn.with_logical_partitioning(nn.initializers.ones,
                                                                ("kv",)), (V,))
    o = o_BLHK * jax.lax.rsqrt(jnp.mean(jnp.square(o_BLHK), -1, keepdims=True) + s.norm_eps)
    z = proj("gate", s.qk_init, (Hv, V))(x_BLD)
    o = (o * scale * jax.nn.silu(z.astype(jnp.float32))).astype(s.dtype)
    return nn.DenseGeneral(
        D, axis=(-2, -1), use_bias=s.use_bias, dtype=s.dtype, name="out",
        dot_general=products.dot_general_for(s.dtype, s.platform),
        kernel_init=nn.with_logical_partitioning(s.vo_init, ("heads", "kv", "embed")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    )(o.reshape(B * L, Hv, V)).reshape(B, L, D)
