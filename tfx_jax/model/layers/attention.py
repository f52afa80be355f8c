"""Multi-head attention: softmax(Q K^T / sqrt(d_k) + bias) V, with GQA/MQA and a KV cache.

Shapes: B batch, L query length, S key length, H query heads, N key/value
heads (H = N * G), K head dim, D model dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.layers import probes
from tfx_jax.model.layers import products
from tfx_jax.model.layers import tpu_attention
from tfx_jax.model.layers.positions import RotarySpec, nope_temperature, rope

Initializer = Callable[..., jax.Array]

# A finite "minus infinity": fully masked rows (padding queries) stay finite.
NEG_INF = -1e9


def xavier(gain: float = 1.0, distribution: str = "uniform"):
  """Xavier/Glorot init with a gain (variance scale gain^2).

  ``DenseGeneral`` initialises its kernel in the flattened 2-D shape
  (d_model, heads * head_dim), so fans are those of the fused matrix, as in
  the textbook chapters' PyTorch code and DeepNet.
  """
  return nn.initializers.variance_scaling(gain**2, "fan_avg", distribution)


def softcap(logits, cap: float):
  """cap * tanh(logits / cap): logits smoothly bounded to (-cap, cap) (Gemma 2).
  ``cap`` 0 leaves them as they are."""
  if not cap:
    return logits
  return cap * jnp.tanh(logits / cap)


def sink_logits(sinks_H, N: int, G: int):
  """One sink logit per query head, [H] -> [1, N, G, 1, 1] float32 (grouped heads)."""
  return sinks_H.astype(jnp.float32).reshape(1, N, G, 1, 1)


def dot_product_attention(q_BLHK, k_BSNK, v_BSNK, mask_BhLS=None, bias_BhLS=None,
                          *, dropout_rng=None, dropout: float = 0.0,
                          deterministic: bool = True, dtype=jnp.float32,
                          scale_logits: bool = True, logit_softcap: float = 0.0,
                          sinks_H=None):
  """softmax(cap(Q K^T / sqrt(d_k)) + bias) V with grouped key/value heads.

  ``scale_logits=False`` drops the 1/sqrt(d_k) (T5 folds it into its init).
  ``logit_softcap`` c > 0 bounds the content logits by c tanh(x / c) before the
  position bias is added, as Gemma 2 does (its only bias is the mask).

  ``mask`` is boolean, True where attention is allowed; ``mask`` and ``bias``
  broadcast over heads when their head dim is 1. Logits and softmax are float32.

  ``sinks_H`` (``model.attention_sinks``; gpt-oss, HF ``eager_attention_forward``):
  head h's learned logit appended to every row and dropped after the softmax,
  p_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij')), so a row sums to less
  than 1 and the sink carries no value. It is appended after the cap, the bias
  and the mask, as HF appends it after the mask: the sink is never capped, and
  a row with every key masked (a padding query) gives 0, not NaN.
  """
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  G = H // N
  q_BLNGK = q_BLHK.reshape(B, L, N, G, K)
  logits_BNGLS = jnp.einsum("blngk,bsnk->bngls", q_BLNGK, k_BSNK,
                            preferred_element_type=jnp.float32)
  if scale_logits:
    logits_BNGLS = logits_BNGLS / jnp.sqrt(jnp.float32(K))
  logits_BNGLS = softcap(logits_BNGLS, logit_softcap)

  def grouped(x_BhLS):
    h = x_BhLS.shape[1]
    if h == 1:
      return x_BhLS[:, :, None]
    return x_BhLS.reshape(x_BhLS.shape[0], N, G, *x_BhLS.shape[2:])

  if bias_BhLS is not None:
    logits_BNGLS = logits_BNGLS + grouped(bias_BhLS).astype(jnp.float32)
  if mask_BhLS is not None:
    logits_BNGLS = jnp.where(grouped(mask_BhLS), logits_BNGLS, NEG_INF)
  if sinks_H is None:
    probs = jax.nn.softmax(logits_BNGLS, axis=-1)
  else:
    sink_BNGL1 = jnp.broadcast_to(sink_logits(sinks_H, N, G), (*logits_BNGLS.shape[:-1], 1))
    probs = jax.nn.softmax(jnp.concatenate([logits_BNGLS, sink_BNGL1], axis=-1),
                           axis=-1)[..., :-1]
  if not deterministic and dropout > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout), 0.0)
  out_BLNGK = jnp.einsum("bngls,bsnk->blngk", probs.astype(dtype), v_BSNK)
  return out_BLNGK.reshape(B, L, H, K)


def _grouped(x_BhLS, N, G):
  """[B, h, L, S] with h in (1, N * G) -> broadcastable [B, N, G or 1, L, S]."""
  if x_BhLS.shape[1] == 1:
    return x_BhLS[:, :, None]
  return x_BhLS.reshape(x_BhLS.shape[0], N, G, *x_BhLS.shape[2:])


def fast_attention(q_BLHK, k_BSNK, v_BSNK, mask_BhLS=None, bias_BhLS=None, *,
                   dtype=jnp.float32, scale_logits: bool = True,
                   logit_softcap: float = 0.0, sinks_H=None):
  """``dot_product_attention`` without dropout, with fewer passes over [L, S].

  The same formula, arranged for speed on CPU: 1/sqrt(d_k) scales the queries
  ([L, K]) instead of the logits ([L, S]); the row maximum is a constant
  (its gradient is zero); and the softmax denominator divides the output
  ([L, K]) instead of the probabilities, as FlashAttention does. Equal to the
  reference to float32 rounding (tested). A sink (``sinks_H``) takes part in
  the row maximum and adds exp(sink - max) to the denominator.
  """
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  G = H // N
  if scale_logits:
    q_BLHK = q_BLHK * jnp.asarray(K ** -0.5, q_BLHK.dtype)
  q_BLNGK = q_BLHK.reshape(B, L, N, G, K)
  logits_BNGLS = jnp.einsum("blngk,bsnk->bngls", q_BLNGK, k_BSNK,
                            preferred_element_type=jnp.float32)
  logits_BNGLS = softcap(logits_BNGLS, logit_softcap)
  if bias_BhLS is not None:
    logits_BNGLS = logits_BNGLS + _grouped(bias_BhLS, N, G).astype(jnp.float32)
  if mask_BhLS is not None:
    logits_BNGLS = jnp.where(_grouped(mask_BhLS, N, G), logits_BNGLS, NEG_INF)
  max_BNGL1 = jnp.max(logits_BNGLS, axis=-1, keepdims=True)
  if sinks_H is not None:
    sink_1NG11 = sink_logits(sinks_H, N, G)
    max_BNGL1 = jnp.maximum(max_BNGL1, sink_1NG11)
  max_BNGL1 = jax.lax.stop_gradient(max_BNGL1)
  unnorm_BNGLS = jnp.exp(logits_BNGLS - max_BNGL1)
  denom_BNGL = jnp.sum(unnorm_BNGLS, axis=-1)
  if sinks_H is not None:
    denom_BNGL = denom_BNGL + jnp.exp(sink_1NG11 - max_BNGL1)[..., 0]
  denom_BLNG = denom_BNGL.transpose(0, 3, 1, 2)
  out_BLNGK = jnp.einsum("bngls,bsnk->blngk", unnorm_BNGLS.astype(dtype), v_BSNK,
                         preferred_element_type=jnp.float32)
  out_BLNGK = out_BLNGK / denom_BLNG[..., None]
  return out_BLNGK.astype(dtype).reshape(B, L, H, K)


def fused_attention(q_BLHK, k_BSNK, v_BSNK, mask_BhLS=None, bias_BhLS=None, *,
                    dtype=jnp.float32, scale_logits: bool = True, causal: bool = False,
                    implementation: str | None = None):
  """``jax.nn.dot_product_attention``: the same formula through JAX's fused kernels.

  ``implementation`` "cudnn" is cuDNN's flash attention (GPU, bf16/fp16), which
  takes the position bias and the boolean mask as one additive bias; "xla" is
  XLA's own composition, on any backend (the CPU tests compare it with
  ``dot_product_attention``). ``causal`` (queries and keys the same positions,
  and the mask already causal) lets cuDNN skip the key blocks above the
  diagonal; it never changes the result.
  """
  K = q_BLHK.shape[-1]
  out_BLHK = jax.nn.dot_product_attention(
      q_BLHK.astype(dtype), k_BSNK.astype(dtype), v_BSNK.astype(dtype),
      bias=None if bias_BhLS is None else bias_BhLS.astype(dtype), mask=mask_BhLS,
      scale=K ** -0.5 if scale_logits else 1.0, is_causal=causal,
      implementation=implementation)
  return out_BLHK.astype(dtype)


def gpu_attention_implementation(dtype, head_dim: int) -> str:
  """"cudnn" where cuDNN's flash attention takes these inputs, else "xla".

  cuDNN's fused kernel runs in half precision with head widths that are
  multiples of 8 up to 128; float32 attention stays with XLA.
  """
  half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return "cudnn" if half and head_dim % 8 == 0 and head_dim <= 128 else "xla"


def causal_blocked_attention(q_BLHK, k_BLNK, v_BLNK, mask_BhLL=None, bias_BhLL=None, *,
                             block: int, dtype=jnp.float32, scale_logits: bool = True,
                             sinks_H=None):
  """Self-attention whose mask is causal (or stricter), by query blocks.

  Query block [i, i + block) attends to keys [0, i + block) only: the key
  blocks above the diagonal are masked for every query of the block, so their
  logits, exps and products are skipped rather than computed and zeroed
  (2/3 of the work at 3 blocks, 5/8 at 4, toward 1/2). The skipped keys
  contribute exactly 0 to every query that has a key it may see; a query that
  sees no key at all (padding) gets the uniform average of the keys it is
  shown, which differs from the reference's average over all keys, and is
  never read by a real position.

  Heads-first inside, with its own backward (``_blocked_core``): the
  FlashAttention gradient from each block's saved probabilities, with the
  key and value gradients added into place rather than padded and summed.
  With sinks (``sinks_H``, see ``dot_product_attention``) a padding query
  gets 0, as the reference does, and each sink's gradient is
  -sum_{b,l} p_sink * rowsum(dO * O), p_sink = exp(sink) / denominator.
  """
  B, L, H, K = q_BLHK.shape
  N = k_BLNK.shape[2]
  G = H // N
  if scale_logits:
    q_BLHK = q_BLHK * jnp.asarray(K ** -0.5, q_BLHK.dtype)
  q_BNGLK = q_BLHK.reshape(B, L, N, G, K).transpose(0, 2, 3, 1, 4)
  k_BNLK = k_BLNK.transpose(0, 2, 1, 3)
  v_BNLK = v_BLNK.transpose(0, 2, 1, 3)
  grouped = lambda x: None if x is None else _grouped(x, N, G)
  sink = None if sinks_H is None else sink_logits(sinks_H, N, G)
  out_BNGLK = _blocked_core(q_BNGLK, k_BNLK, v_BNLK, grouped(mask_BhLL),
                            grouped(bias_BhLL), sink, block, jnp.dtype(dtype))
  return out_BNGLK.astype(dtype).transpose(0, 3, 1, 2, 4).reshape(B, L, H, K)


def _blocks(length: int, block: int):
  return [(start, min(start + block, length)) for start in range(0, length, block)]


def _blocked_forward(q, k, v, mask, bias, sink, block, dtype):
  """(output [B, N, G, L, K] f32, each block's probabilities [B, N, G, b, end],
  each block's sink probability [B, N, G, b, 1], empty without a sink)."""
  outs, probs, sink_probs = [], [], []
  for start, end in _blocks(q.shape[3], block):
    s = jnp.einsum("bngld,bnsd->bngls", q[:, :, :, start:end], k[:, :, :end],
                   preferred_element_type=jnp.float32)
    if bias is not None:
      s = s + bias[..., start:end, :end].astype(jnp.float32)
    if mask is not None:
      s = jnp.where(mask[..., start:end, :end], s, NEG_INF)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    if sink is not None:
      row_max = jnp.maximum(row_max, sink)
    e = jnp.exp(s - row_max)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
      e_sink = jnp.exp(sink - row_max)
      denom = denom + e_sink
      sink_probs.append(e_sink / denom)
    outs.append(jnp.einsum("bngls,bnsd->bngld", e.astype(dtype), v[:, :, :end],
                           preferred_element_type=jnp.float32) / denom)
    probs.append(e / denom)
  return jnp.concatenate(outs, axis=3), probs, sink_probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _blocked_core(q, k, v, mask, bias, sink, block, dtype):
  return _blocked_forward(q, k, v, mask, bias, sink, block, dtype)[0]


def _blocked_core_fwd(q, k, v, mask, bias, sink, block, dtype):
  out, probs, sink_probs = _blocked_forward(q, k, v, mask, bias, sink, block, dtype)
  return out, (q, k, v, mask, bias, sink, out, probs, sink_probs)


def _blocked_core_bwd(block, dtype, residuals, d_out):
  """dS = P * (dP - rowsum(dO * O)) per block (the row maximum is a constant:
  its gradient through the softmax is zero). A sink leaves dS as it is (O is
  still sum_j P_j V_j) and has d sink = -sum p_sink rowsum(dO * O)."""
  q, k, v, mask, bias, sink, out, probs, sink_probs = residuals
  f32 = jnp.float32
  dq, dk, dv = [], jnp.zeros(k.shape, f32), jnp.zeros(v.shape, f32)
  dbias = None if bias is None else jnp.zeros(bias.shape, f32)
  dsink = None if sink is None else jnp.zeros(sink.shape, f32)
  for b, ((start, end), p) in enumerate(zip(_blocks(q.shape[3], block), probs)):
    do = d_out[:, :, :, start:end].astype(f32)
    dv = dv.at[:, :, :end].add(jnp.einsum("bngls,bngld->bnsd", p.astype(dtype),
                                          do.astype(dtype), preferred_element_type=f32))
    dp = jnp.einsum("bngld,bnsd->bngls", do.astype(dtype), v[:, :, :end],
                    preferred_element_type=f32)
    row_dot = jnp.sum(do * out[:, :, :, start:end], axis=-1, keepdims=True)
    ds = p * (dp - row_dot)
    if sink is not None:  # summed over the batch and the block's queries
      dsink = dsink - jnp.sum(sink_probs[b] * row_dot, axis=(0, 3), keepdims=True)
    dq.append(jnp.einsum("bngls,bnsd->bngld", ds.astype(dtype), k[:, :, :end],
                         preferred_element_type=f32))
    dk = dk.at[:, :, :end].add(jnp.einsum("bngls,bngld->bnsd", ds.astype(dtype),
                                          q[:, :, :, start:end], preferred_element_type=f32))
    if bias is not None:  # summed over the axes the bias is broadcast along
      axes = tuple(i for i in range(3) if bias.shape[i] == 1 and ds.shape[i] != 1)
      dbias = dbias.at[..., start:end, :end].add(jnp.sum(ds, axis=axes, keepdims=True))
  return (jnp.concatenate(dq, axis=3).astype(q.dtype), dk.astype(k.dtype),
          dv.astype(v.dtype), None, None if bias is None else dbias.astype(bias.dtype),
          dsink)


_blocked_core.defvjp(_blocked_core_fwd, _blocked_core_bwd)


def attention_block(length: int, platform: str) -> int:
  """Query block of ``causal_blocked_attention`` for a length and backend; 0: none.

  Chosen on CPU, where the elementwise work on [L, S] dominates at d_k = 32..64:
  blocks of 64 up to 8 blocks, wider ones beyond (fewer, larger matmuls).
  Accelerators keep one block (their fused kernels are a separate question).
  """
  if platform != "cpu" or length < 128:
    return 0
  return max(64, -(-length // 8))


def content_logits(q_BLHK, k_BSNK, *, scale_logits: bool = True):
  """q.k (/ sqrt(d_k)) in float32, grouped [B, N, G, L, S]: the logits the
  diagnostics read, before any soft-cap and position bias (a product of its
  own, so that no attention path changes)."""
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  logits_BNGLS = jnp.einsum("blngk,bsnk->bngls", q_BLHK.reshape(B, L, N, H // N, K),
                            k_BSNK, preferred_element_type=jnp.float32)
  if scale_logits:
    logits_BNGLS = logits_BNGLS / jnp.sqrt(jnp.float32(K))
  return logits_BNGLS


def max_attention_logit(q_BLHK, k_BSNK, mask_BhLS=None, *, scale_logits: bool = True):
  """The largest content logit q.k (/ sqrt(d_k)) that a query is allowed to see.

  The stability diagnostic of Wortsman et al. 2023 (attention logit growth):
  before any soft-cap and position bias, over every batch row, head, query
  and unmasked key. A separate product, so that no attention path changes;
  XLA drops it when nothing reads it.
  """
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  logits_BNGLS = content_logits(q_BLHK, k_BSNK, scale_logits=scale_logits)
  if mask_BhLS is not None:
    logits_BNGLS = jnp.where(_grouped(mask_BhLS, N, H // N), logits_BNGLS, -jnp.inf)
  return jax.lax.stop_gradient(jnp.max(logits_BNGLS))


def attention_logit_rms(q_BLHK, k_BSNK, mask_BhLS=None, *, scale_logits: bool = True):
  """The RMS of the content logits q.k (/ sqrt(d_k)) over every batch row,
  head, query and unmasked key: the coordinate check's attention logits (Yang
  et al. 2022, Figure 5), before any soft-cap and position bias, as
  :func:`max_attention_logit` takes them."""
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  logits_BNGLS = content_logits(q_BLHK, k_BSNK, scale_logits=scale_logits)
  if mask_BhLS is None:
    return probes.rms(logits_BNGLS)
  seen = jnp.broadcast_to(_grouped(mask_BhLS, N, H // N), logits_BNGLS.shape)
  total = jnp.sum(jnp.where(seen, jnp.square(logits_BNGLS), 0.0))
  return jax.lax.stop_gradient(jnp.sqrt(total / jnp.maximum(jnp.sum(seen), 1)))


# ---- QK-clip (train.qk_clip; run/qk_clip.py) ------------------------------
# The collection each attention sows its per-head largest logit into, under
# its kind's name (``QK_CLIP_KIND``), only where the collection is mutable (the
# train step with train.qk_clip > 0): run/qk_clip.py finds the rule of that
# kind by the name. Another attention kind (MLA) sows under its own name.
QK_CLIP_COLLECTION = "qk_clip"
QK_CLIP_KIND = "standard"


def max_logit_per_head(q_BLHK, k_BSNK, mask_BhLS=None, *, scale_logits: bool = True):
  """[H]: each query head's largest logit q.k (/ sqrt(d_k)) over every batch
  row, query and unmasked key: Kimi K2's S_max^h (arXiv 2507.20534, section
  2.1), as the softmax sees it before any soft-cap and position bias (the
  queries carry muP's ``query_scale`` already). A separate product, as
  :func:`max_attention_logit`, so that no attention path changes."""
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  logits_BNGLS = content_logits(q_BLHK, k_BSNK, scale_logits=scale_logits)
  if mask_BhLS is not None:
    logits_BNGLS = jnp.where(_grouped(mask_BhLS, N, H // N), logits_BNGLS, -jnp.inf)
  return jax.lax.stop_gradient(jnp.max(logits_BNGLS, axis=(0, 3, 4)).reshape(H))


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """The attention of one stack, resolved from ``model.*`` (``families.layer_spec``):
  heads, projections and their initialisation, RoPE, the logits' form and the
  backend's kernel. A new attention variant is a field here, set there and read
  by :class:`Attention`.

  Stability and attention knobs: ``qk_norm`` normalises each head's queries
  and keys before RoPE
  (``query_norm``, ``key_norm``, one gain per head dimension shared by the
  heads, as Qwen3); ``logit_softcap`` bounds the logits (``softcap``);
  ``gate_width`` > 0 multiplies each head's output by sigmoid(x W_g + b_g)
  computed from this layer's query input x, with 1 (headwise) or head_dim
  (elementwise) gates per head, before the output projection (Qiu et al.
  2025, "Gated Attention for Large Language Models", position G1).
  """
  num_heads: int
  num_kv_heads: int
  head_dim: int
  use_bias: bool = True
  dropout: float = 0.0  # on the attention weights
  rotary: RotarySpec | None = None  # None: no RoPE
  qk_init: Initializer = xavier()
  vo_gain: float = 1.0
  vo_distribution: str = "uniform"
  dtype: jnp.dtype = jnp.float32
  scale_logits: bool = True  # divide logits by sqrt(head_dim)
  # The caller's mask never lets a query see a later key (a decoder's
  # self-attention): key blocks above the diagonal may be skipped.
  causal: bool = False
  qk_norm: Callable[..., nn.Module] | None = None  # norm_factory(..., axis="kv")
  logit_softcap: float = 0.0
  gate_width: int = 0  # gates per head: 0 none, 1 headwise, head_dim elementwise
  # The backend the program is compiled for ("cpu", "gpu", "tpu"), resolved once
  # by the run's set-up (``models.build_model``), never from the tracing host:
  # it picks the attention kernel and the product form.
  platform: str = "cpu"
  # A factor on the queries after RoPE: muP's logits q.k x alpha / d_head in
  # place of q.k / sqrt(d_head) (model/parametrization.py); 1.0: none.
  query_scale: float = 1.0
  # model.attention_sinks: a learned logit per query head in every softmax's
  # denominator (``sinks``, [H], N(0, 0.02^2) as HF's gpt-oss initialises it).
  sinks: bool = False
  # model.nope_temperature: Llama 4's query temperature (``nope_temperature``)
  # on the layers without RoPE (the ``nope`` flag of the call).
  nope_temperature: bool = False


class Attention(nn.Module):
  """Self- or cross-attention with optional RoPE and an optional KV cache: the
  layer of an :class:`AttentionSpec`, passed whole.

  With ``use_cache`` self-attention keys and values are written into a
  cache at ``cache_index`` and the queries attend over the whole cache; the
  caller's mask hides the slots not yet written. Keys are rotated (RoPE) with
  their own positions before they are cached. Cross-attention with ``use_cache``
  mode stores the projected encoder keys and values (``cross_key``,
  ``cross_value``) on the first call with a mutable cache after ``init`` and
  reuses them afterwards.

  Self-attention sows its largest logit (``max_attention_logit``) into the
  ``intermediates`` collection; it is computed only where that collection is
  mutable (``train.log_layer_stats``). Every attention sows each head's largest
  logit (``max_logit_per_head``) into ``QK_CLIP_COLLECTION``, only where that
  one is mutable (``train.qk_clip``). Every attention sows the RMS of its
  logits (``logit_rms``) into the coordinate check's collection
  (``probes.COLLECTION``), only where that one is mutable.
  """
  spec: AttentionSpec
  use_cache: bool = False
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BLD, kv_BSD=None, *, mask=None, bias=None, positions_BL=None,
               cache_index=None, segment_ids_BL=None, nope=False, value_hook=None):
    """``segment_ids_BL`` (self-attention), when given, says that ``mask`` is
    exactly "same segment of these ids, key not padding" (and causal with
    ``causal``), which lets a kernel rebuild the mask from the ids (TPU).

    ``nope`` (``model.nope_every``): this layer skips RoPE (and takes the query
    temperature with ``spec.nope_temperature``); a Python bool, or a traced one
    when a scanned stack mixes the layers. ``value_hook`` maps the projected
    values before they are cached or attended (``model.value_residual``,
    blocks.py)."""
    s = self.spec
    D = x_BLD.shape[-1]
    is_self = kv_BSD is None
    kv_BSD = x_BLD if is_self else kv_BSD

    def proj(name, heads, init, features=None):
      return nn.DenseGeneral(
          (heads, features or s.head_dim), axis=-1, use_bias=s.use_bias,
          dtype=s.dtype, name=name,
          dot_general=products.dot_general_for(s.dtype, s.platform),
          kernel_init=nn.with_logical_partitioning(init, ("embed", "heads", "kv")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("heads", "kv")))

    vo_in = xavier(s.vo_gain, s.vo_distribution)
    # Projections over tokens flattened to one axis ([T, D] x [D, H*K]), as in
    # the FFN: no transposed activation copies for the weight gradients.
    flat = lambda x: x.reshape(-1, x.shape[-1])
    unflat = lambda y, x: y.reshape(*x.shape[:-1], *y.shape[1:])
    q = unflat(proj("query", s.num_heads, s.qk_init)(flat(x_BLD)), x_BLD)
    if s.qk_norm is not None:
      q = s.qk_norm(name="query_norm")(q)
    cross_cached = self.use_cache and not is_self and self.has_variable("cache", "cross_key")
    if cross_cached:
      # Cross-attention while decoding: the encoder's keys and values were
      # projected once per sequence (``search`` primes them), not every step.
      k = self.get_variable("cache", "cross_key")
      v = self.get_variable("cache", "cross_value")
    else:
      k = unflat(proj("key", s.num_kv_heads, s.qk_init)(flat(kv_BSD)), kv_BSD)
      v = unflat(proj("value", s.num_kv_heads, vo_in)(flat(kv_BSD)), kv_BSD)
      if value_hook is not None:
        v = value_hook(v)
      if s.qk_norm is not None:
        k = s.qk_norm(name="key_norm")(k)
      if (self.use_cache and not is_self and not self.is_initializing()
          and self.is_mutable_collection("cache")):
        self.put_variable("cache", "cross_key", k)
        self.put_variable("cache", "cross_value", v)
    if s.rotary is not None and nope is not True:
      rotated = lambda x: rope(x, positions_BL, s.rotary)
      if nope is False:
        q, k = rotated(q), rotated(k)
      else:  # model.nope_every under nn.scan: this layer's flag
        q, k = jnp.where(nope, q, rotated(q)), jnp.where(nope, k, rotated(k))
    if s.nope_temperature and nope is not False:
      temperature_BL = nope_temperature(positions_BL)
      if nope is not True:
        temperature_BL = jnp.where(nope, temperature_BL, 1.0)
      q = q * temperature_BL[:, :, None, None].astype(q.dtype)

    if s.query_scale != 1.0:
      q = q * jnp.asarray(s.query_scale, q.dtype)
    if self.use_cache and is_self:
      k, v = self._update_cache(k, v, cache_index)
    if is_self and self.is_mutable_collection("intermediates"):
      self.sow("intermediates", "max_attention_logit",
               max_attention_logit(q, k, mask, scale_logits=s.scale_logits))
    if self.is_mutable_collection(QK_CLIP_COLLECTION):  # QK-clip (train.qk_clip)
      self.sow(QK_CLIP_COLLECTION, QK_CLIP_KIND,
               max_logit_per_head(q, k, mask, scale_logits=s.scale_logits))
    if probes.collecting(self):
      self.sow(probes.COLLECTION, "logit_rms",
               attention_logit_rms(q, k, mask, scale_logits=s.scale_logits))

    sinks_H = None
    if s.sinks:
      sinks_H = self.param("sinks", nn.with_logical_partitioning(
          nn.initializers.normal(0.02), ("heads",)), (s.num_heads,), jnp.float32)
    if not self.deterministic and s.dropout > 0.0:
      out_BLHK = dot_product_attention(
          q, k, v, mask, bias, dropout_rng=self.make_rng("dropout"),
          dropout=s.dropout, deterministic=False, dtype=s.dtype,
          scale_logits=s.scale_logits, logit_softcap=s.logit_softcap, sinks_H=sinks_H)
    else:
      out_BLHK = self._attend(q, k, v, mask, bias,
                              segment_ids_BL if is_self and not self.use_cache else None,
                              sinks_H)
    if s.gate_width:
      gate = proj("gate", s.num_heads, s.qk_init, s.gate_width)(flat(x_BLD))
      out_BLHK = out_BLHK * jax.nn.sigmoid(
          unflat(gate, x_BLD).astype(jnp.float32)).astype(out_BLHK.dtype)
    B, L = out_BLHK.shape[:2]
    return nn.DenseGeneral(
        D, axis=(-2, -1), use_bias=s.use_bias, dtype=s.dtype, name="out",
        dot_general=products.dot_general_for(s.dtype, s.platform),
        kernel_init=nn.with_logical_partitioning(
            xavier(s.vo_gain, s.vo_distribution),
            ("heads", "kv", "embed")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    )(out_BLHK.reshape(B * L, *out_BLHK.shape[2:])).reshape(B, L, D)

  def _attend(self, q_BLHK, k_BSNK, v_BSNK, mask, bias, segment_ids_BL=None,
              sinks_H=None):
    """The attention path for the target backend and shape (no dropout).

    TPU: the splash kernel (``tpu_attention``: FlashAttention, O(L) memory)
    where the mask is segments (and causal) and there is no position bias.
    GPU: ``fused_attention`` (cuDNN's flash attention where it applies; no
    soft-cap there). CPU: the causal blocked path, else ``fast_attention``.
    Neither fused kernel takes sinks: with ``sinks_H`` the accelerators take
    ``fast_attention`` (XLA), which does.
    """
    s = self.spec
    L, S = q_BLHK.shape[1], k_BSNK.shape[1]
    platform = s.platform
    if (platform == "tpu" and segment_ids_BL is not None and bias is None
        and sinks_H is None and tpu_attention.splash_applies(L, S)):
      return tpu_attention.splash_attention(
          q_BLHK, k_BSNK, v_BSNK, segment_ids_BL, causal=s.causal,
          scale_logits=s.scale_logits, logit_softcap=s.logit_softcap,
          dtype=s.dtype)
    if platform == "gpu" and not s.logit_softcap and sinks_H is None:
      return fused_attention(
          q_BLHK, k_BSNK, v_BSNK, mask, bias, dtype=s.dtype,
          scale_logits=s.scale_logits, causal=s.causal and L == S,
          implementation=gpu_attention_implementation(s.dtype, q_BLHK.shape[-1]))
    block = attention_block(L, platform)
    # The blocked path's own backward has no soft-cap; capped logits take the
    # fast path.
    if s.causal and L == S and block and block < L and not s.logit_softcap:
      return causal_blocked_attention(q_BLHK, k_BSNK, v_BSNK, mask, bias, block=block,
                                      dtype=s.dtype, scale_logits=s.scale_logits,
                                      sinks_H=sinks_H)
    return fast_attention(q_BLHK, k_BSNK, v_BSNK, mask, bias, dtype=s.dtype,
                          scale_logits=s.scale_logits,
                          logit_softcap=s.logit_softcap, sinks_H=sinks_H)

  def _update_cache(self, k_BLNK, v_BLNK, cache_index):
    """Writes the new keys/values at ``cache_index``; returns the whole cache.

    On the initialising call (``cache_index`` None) the cache is created with
    the input's length as its capacity and the inputs are used as they are.
    """
    ck = self.variable("cache", "cached_key", jnp.zeros, k_BLNK.shape, k_BLNK.dtype)
    cv = self.variable("cache", "cached_value", jnp.zeros, v_BLNK.shape, v_BLNK.dtype)
    if cache_index is None:
      return k_BLNK, v_BLNK
    ck.value = jax.lax.dynamic_update_slice(ck.value, k_BLNK.astype(ck.value.dtype),
                                            (0, cache_index, 0, 0))
    cv.value = jax.lax.dynamic_update_slice(cv.value, v_BLNK.astype(cv.value.dtype),
                                            (0, cache_index, 0, 0))
    return ck.value, cv.value
