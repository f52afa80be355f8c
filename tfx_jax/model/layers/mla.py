"""Multi-head latent attention (MLA): the ``model.attention_type='mla'`` layer.

DeepSeek-V2 (2024), Section 2.1, as DeepSeek-V3 and transformers'
``DeepseekV3Attention`` (``models/deepseek_v3/modeling_deepseek_v3.py``)
compute it, for a token's input h (widths: ``model/config_attention.py``):

  c_Q  = RMSNorm(h W_DQ)                      [d_c']  (q_a_proj, q_a_layernorm)
  q    = c_Q W_UQ  (or h W_Q when d_c' = 0)   [H, d_n + d_R]  (q_b_proj / q_proj)
  [c_KV ; k_R] = h W_DKV                      [d_c + d_R]  (kv_a_proj_with_mqa)
  c_KV = RMSNorm(c_KV)                        [d_c]  (kv_a_layernorm)
  [k_C ; v] = c_KV W_UKV                      [H, d_n + d_v]  (kv_b_proj)
  q_i  = [q_C ; RoPE(q_R)],  k_i = [k_C ; RoPE(k_R)]  (one k_R for every head)
  o    = softmax(q_i . k_i / sqrt(d_n + d_R) + bias) v,  out = o W_O   (out)

Shapes: B batch, L query length, S key length, H heads, N = d_n, R = d_R,
V = d_v, C = d_c, Q = d_c', D model width. The rotated part's logits go
through a shared key ([B, S, R], never broadcast to the heads), and the
logits and softmax are float32, as in ``attention.py``.

Biases follow transformers' ``attention_bias`` (``model.use_bias``): on
``q_a_proj``, ``kv_a_proj_with_mqa`` and ``out`` only; the up-projections
(``q_b_proj``, ``kv_b_proj``) and ``q_proj`` have none. The latent RMSNorms
have eps 1e-6, as transformers' (which does not pass ``rms_norm_eps`` to them)
and DeepSeek's own code.

The cache keeps what DeepSeek-V2 caches (Section 2.1.2): per token the
normalised latent c_KV (``cached_latent`` [B, S, C]) and the rotated shared
key k_R (``cached_rope_key`` [B, S, R]), d_c + d_R elements per token and
layer (:func:`kv_cache_elements_per_token`), never the per-head keys and
values. A cached call absorbs W_UK into the query and W_UV into the output
(DeepSeek-V2's inference form): q_C . (c W_UK) = (q_C W_UK^T) . c and
sum_s p_s (c_s W_UV) = (sum_s p_s c_s) W_UV, so the keys and values of the
cache are never expanded; the uncached call (training) expands them. The two
are the same product in another order, equal to float rounding (tested).

Composes with masks, windows (``model.attention_window``, ``global_every``),
T5 and ALiBi biases (on the logits, after the soft-cap, as in
``attention.py``), ``model.attention_logit_softcap``, attention dropout and
``model.attention_gate`` (gates per head over d_v); ``model.qk_norm`` and
muP have no rule here (``config_attention.validate``). RoPE (the positions'
scaling included) rotates the d_R part only; YaRN's attention factor m is
applied as DeepSeek-V3 does (``yarn_get_mscale`` with ``mscale_all_dim``):
m^2 on the softmax scale of every logit, not on cos and sin of the rotated
part. Self-attention only: an encoder-decoder's cross-attention stays
standard attention. One XLA path on every backend (the fused kernels of
``attention.py`` take equal query, key and value widths).

transformers' weights map to ours (a later import/export) as:

  q_a_proj.weight [Q, D]                -> q_a_proj/kernel [D, Q] (transposed)
  q_a_layernorm.weight                  -> q_a_layernorm/scale
  q_b_proj.weight [H (N + R), Q]        -> q_b_proj/kernel [Q, H, N + R]
  q_proj.weight [H (N + R), D]          -> q_proj/kernel [D, H, N + R]
  kv_a_proj_with_mqa.weight [C + R, D]  -> kv_a_proj_with_mqa/kernel [D, C + R]
  kv_a_layernorm.weight                 -> kv_a_layernorm/scale
  kv_b_proj.weight [H (N + V), C]       -> kv_b_proj/kernel [C, H, N + V]
  o_proj.weight [D, H V]                -> out/kernel [H, V, D]
  (q_a_proj, kv_a_proj_with_mqa, o_proj).bias -> (...)/bias

each transposed and reshaped, the heads outermost as in ``view(B, L, H, -1)``.
With ``rope_interleave=True`` (transformers' default, DeepSeek-V3's
checkpoints) RoPE pairs dimensions (2i, 2i + 1) and returns the halves layout;
``rope()`` pairs (i, i + R/2): the R rotated output columns of q_b_proj /
q_proj (per head) and of kv_a_proj_with_mqa are permuted by
:func:`deinterleave_rope`, after which q, k_R and the cache equal
transformers' own tensors. ``rope_interleave=False``: no permutation.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.model.config_attention import mla_dims
from tfx_jax.model.layers import probes, products
from tfx_jax.model.layers.attention import (NEG_INF, QK_CLIP_COLLECTION, AttentionSpec,
                                            Initializer, softcap, xavier)
from tfx_jax.model.layers.norms import RMSNorm
from tfx_jax.model.layers.positions import RotarySpec, rope

# The latent norms' epsilon: transformers' DeepseekV3RMSNorm default, which
# DeepseekV3Attention does not override (nor does DeepSeek's own model.py).
LATENT_NORM_EPS = 1e-6
# The name this layer sows its per-head largest logit under, in
# ``QK_CLIP_COLLECTION`` (train.qk_clip): run/qk_clip.py's rule for MLA.
QK_CLIP_KIND = "mla"


def kv_cache_elements_per_token(cfg) -> int:
  """Elements one token adds to one self-attention layer's KV cache.

  MLA: d_c + d_R (the normalised latent and the rotated shared key; DeepSeek-V3:
  512 + 64 = 576). Standard attention: 2 x kv_heads x head width (a key and
  a value per key/value head; GQA/MQA through ``model.num_kv_heads``). A pure
  function of the :class:`~tfx_jax.model.config.ModelConfig`; multiply by the
  bytes of the cache's dtype (the compute dtype) for bytes. An
  encoder-decoder's cross-attention caches its source keys and values
  (standard attention) once per source token, which this does not count.
  """
  if cfg.attention_type == "mla":
    dims = mla_dims(cfg)
    return dims.kv_rank + dims.rope_dim
  return 2 * cfg.kv_heads * cfg.attention_head_dim


def deinterleave_rope(rope_dim: int) -> np.ndarray:
  """The permutation of a rotated part's R columns from the interleaved pairs
  (2i, 2i + 1) (DeepSeek's checkpoints, transformers' ``rope_interleave``) to
  ``rope()``'s pairs (i, i + R/2): [0, 2, ..., R - 2, 1, 3, ..., R - 1]."""
  return np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)])


@dataclasses.dataclass(frozen=True)
class MlaSpec:
  """The MLA self-attention of one stack, resolved from ``model.*`` (``specs.layer_spec``).

  The fields shared with :class:`AttentionSpec` mean what they mean there
  (initialisation, dropout, dtype, soft-cap, gate, causal, platform);
  ``rotary`` rotates the ``rope_dim`` part (None: no RoPE part).
  """
  num_heads: int
  kv_rank: int  # d_c
  q_rank: int  # d_c'; 0: no query compression
  rope_dim: int  # d_R; 0: no decoupled RoPE part
  nope_dim: int  # d_n
  v_dim: int  # d_v
  use_bias: bool = True
  dropout: float = 0.0
  rotary: RotarySpec | None = None
  qk_init: Initializer = xavier()
  vo_gain: float = 1.0
  vo_distribution: str = "uniform"
  dtype: jnp.dtype = jnp.float32
  scale_logits: bool = True  # divide logits by sqrt(d_n + d_R)
  causal: bool = False
  logit_softcap: float = 0.0
  gate_width: int = 0  # gates per head: 0 none, 1 headwise, d_v elementwise
  platform: str = "cpu"


def mla_spec(cfg, attention: AttentionSpec, gate_width: int) -> MlaSpec:
  """The :class:`MlaSpec` of ``cfg`` for a stack whose standard attention
  would be ``attention`` (its initialisation, RoPE, dtype and flags are
  MLA's too; its RoPE is already over d_R, ``ModelConfig.rope_dims``)."""
  dims = mla_dims(cfg)
  return MlaSpec(
      num_heads=cfg.num_heads, kv_rank=dims.kv_rank, q_rank=dims.q_rank,
      rope_dim=dims.rope_dim, nope_dim=dims.nope_dim, v_dim=dims.v_dim,
      use_bias=attention.use_bias, dropout=attention.dropout, rotary=attention.rotary,
      qk_init=attention.qk_init, vo_gain=attention.vo_gain,
      vo_distribution=attention.vo_distribution, dtype=attention.dtype,
      scale_logits=attention.scale_logits, causal=attention.causal,
      logit_softcap=attention.logit_softcap, gate_width=gate_width,
      platform=attention.platform)


def _key_value_init(k_init, v_init, nope_dim: int):
  """kv_b_proj's [C, H, N + V] kernel as the two matrices it holds: W_UK
  [C, H N] from ``k_init`` and W_UV [C, H V] from ``v_init``, each drawn in
  its flattened 2-D shape (as ``DenseGeneral`` draws q, k, v), per head [k | v]."""
  def init(key, shape, dtype=jnp.float32):
    C, H, F = shape
    k_key, v_key = jax.random.split(key)
    w_k = k_init(k_key, (C, H * nope_dim), dtype).reshape(C, H, nope_dim)
    w_v = v_init(v_key, (C, H * (F - nope_dim)), dtype).reshape(C, H, F - nope_dim)
    return jnp.concatenate([w_k, w_v], axis=-1)
  return init


class _Kernel(nn.Module):
  """A bare kernel (``<name>/kernel``), for a projection the layer uses in two
  orders (kv_b_proj: expanded, or absorbed into the query and output)."""
  shape: tuple[int, ...]
  kernel_init: Initializer
  axes: tuple[str, ...]

  @nn.compact
  def __call__(self):
    return self.param("kernel", nn.with_logical_partitioning(self.kernel_init, self.axes),
                      self.shape)


def _einsum(spec, a, b, dtype):
  """``jnp.einsum`` of ``a`` and ``b`` cast to ``dtype``, accumulated in float32."""
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                    preferred_element_type=jnp.float32)


class MultiHeadLatentAttention(nn.Module):
  """MLA self-attention with its latent cache: the layer of an :class:`MlaSpec`.

  The call signature is :class:`~tfx_jax.model.layers.attention.Attention`'s
  (``kv_BSD`` must be None; ``segment_ids_BL`` is not read: no kernel here
  rebuilds the mask). With ``use_cache`` the new tokens' latents and rotated
  keys are written at ``cache_index`` and the queries attend over the whole
  cache through the absorbed projections; the caller's mask hides the slots
  not yet written. Sows ``max_attention_logit`` and ``logit_rms`` (the
  scaled content logits q . k / sqrt(d_n + d_R), before soft-cap and bias) as
  ``Attention`` does, where those collections are mutable, and each head's
  largest of those logits (Kimi K2's S_max^h) into ``QK_CLIP_COLLECTION``
  under ``QK_CLIP_KIND``, only where that one is mutable (``train.qk_clip``).
  """
  spec: MlaSpec
  use_cache: bool = False
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BLD, kv_BSD=None, *, mask=None, bias=None, positions_BL=None,
               cache_index=None, segment_ids_BL=None, nope=False, value_hook=None):
    """Attention's signature; ``nope`` and ``value_hook`` (model.nope_every,
    model.value_residual) are never set with MLA (config_attention refuses them)."""
    del segment_ids_BL, nope, value_hook
    if kv_BSD is not None:
      raise ValueError("MultiHeadLatentAttention is self-attention only; "
                       "cross-attention is standard attention (specs.layer_spec).")
    s = self.spec
    B, L, D = x_BLD.shape
    H, N, R, V, C = s.num_heads, s.nope_dim, s.rope_dim, s.v_dim, s.kv_rank
    dtype = s.dtype
    part = nn.with_logical_partitioning
    dense = functools.partial(nn.DenseGeneral, axis=-1, dtype=dtype,
                              dot_general=products.dot_general_for(dtype, s.platform))
    norm = functools.partial(RMSNorm, eps=LATENT_NORM_EPS, dtype=dtype, axis="latent")
    x_TD = x_BLD.reshape(B * L, D)

    # Queries: compressed through the latent c_Q (q_rank > 0) or projected directly.
    if s.q_rank:
      cq_TQ = dense(s.q_rank, use_bias=s.use_bias, name="q_a_proj",
                    kernel_init=part(s.qk_init, ("embed", "latent")),
                    bias_init=part(nn.initializers.zeros, ("latent",)))(x_TD)
      cq_TQ = norm(name="q_a_layernorm")(cq_TQ)
      q_THK = dense((H, N + R), use_bias=False, name="q_b_proj",
                    kernel_init=part(s.qk_init, ("latent", "heads", "kv")))(cq_TQ)
    else:
      q_THK = dense((H, N + R), use_bias=False, name="q_proj",
                    kernel_init=part(s.qk_init, ("embed", "heads", "kv")))(x_TD)
    q_BLHK = q_THK.reshape(B, L, H, N + R)
    q_nope_BLHN, q_rope_BLHR = q_BLHK[..., :N], q_BLHK[..., N:]

    # The KV latent and the shared RoPE key, from one projection.
    ckr_TF = dense(C + R, use_bias=s.use_bias, name="kv_a_proj_with_mqa",
                   kernel_init=part(s.qk_init, ("embed", "latent")),
                   bias_init=part(nn.initializers.zeros, ("latent",)))(x_TD)
    c_BLC = norm(name="kv_a_layernorm")(ckr_TF[:, :C]).reshape(B, L, C)
    k_rope_BLR = ckr_TF[:, C:].reshape(B, L, R)
    w_CHF = _Kernel((C, H, N + V), _key_value_init(
        s.qk_init, xavier(s.vo_gain, s.vo_distribution), N),
        ("latent", "heads", "kv"), name="kv_b_proj")()
    w_uk_CHN, w_uv_CHV = w_CHF[..., :N], w_CHF[..., N:]

    scale = (N + R) ** -0.5 if s.scale_logits else 1.0
    if R and s.rotary is not None:
      rotary = s.rotary
      if rotary.attention_factor != 1.0:
        # YaRN's m on every logit's scale (DeepSeek-V3's mscale_all_dim), not on
        # the rotated part's cos and sin.
        scale *= rotary.attention_factor ** 2
        rotary = dataclasses.replace(rotary, attention_factor=1.0)
      q_rope_BLHR = rope(q_rope_BLHR, positions_BL, rotary)
      k_rope_BLR = rope(k_rope_BLR[:, :, None], positions_BL, rotary)[:, :, 0]

    absorbed = False
    if self.use_cache:
      c_BSC, k_rope_BSR, absorbed = self._update_cache(c_BLC, k_rope_BLR, cache_index)
    else:
      c_BSC, k_rope_BSR = c_BLC, k_rope_BLR
    if absorbed:
      # q_C . (c W_UK) = (q_C W_UK^T) . c: the cache is never expanded.
      q_lat_BLHC = _einsum("blhn,chn->blhc", q_nope_BLHN, w_uk_CHN, dtype)
      logits_BHLS = _einsum("blhc,bsc->bhls", q_lat_BLHC, c_BSC, dtype)
    else:
      k_nope_BSHN = _einsum("bsc,chn->bshn", c_BSC, w_uk_CHN, dtype)
      logits_BHLS = _einsum("blhn,bshn->bhls", q_nope_BLHN, k_nope_BSHN, dtype)
    if R:
      logits_BHLS = logits_BHLS + _einsum("blhr,bsr->bhls", q_rope_BLHR, k_rope_BSR, dtype)
    logits_BHLS = logits_BHLS * jnp.float32(scale)
    self._sow_logits(logits_BHLS, mask)

    probs_BHLS = self._probabilities(logits_BHLS, mask, bias)
    if absorbed:
      # sum_s p_s (c_s W_UV) = (sum_s p_s c_s) W_UV.
      o_lat_BLHC = _einsum("bhls,bsc->blhc", probs_BHLS, c_BSC, dtype)
      out_BLHV = _einsum("blhc,chv->blhv", o_lat_BLHC, w_uv_CHV, dtype).astype(dtype)
    else:
      v_BSHV = _einsum("bsc,chv->bshv", c_BSC, w_uv_CHV, dtype)
      out_BLHV = _einsum("bhls,bshv->blhv", probs_BHLS, v_BSHV, dtype).astype(dtype)
    if s.gate_width:
      gate_THG = dense((H, s.gate_width), use_bias=s.use_bias, name="gate",
                       kernel_init=part(s.qk_init, ("embed", "heads", "kv")),
                       bias_init=part(nn.initializers.zeros, ("heads", "kv")))(x_TD)
      out_BLHV = out_BLHV * jax.nn.sigmoid(
          gate_THG.astype(jnp.float32)).reshape(B, L, H, s.gate_width).astype(dtype)
    return nn.DenseGeneral(
        D, axis=(-2, -1), use_bias=s.use_bias, dtype=dtype, name="out",
        dot_general=products.dot_general_for(dtype, s.platform),
        kernel_init=part(xavier(s.vo_gain, s.vo_distribution), ("heads", "kv", "embed")),
        bias_init=part(nn.initializers.zeros, ("embed",)),
    )(out_BLHV.reshape(B * L, H, V)).reshape(B, L, D)

  def _probabilities(self, logits_BHLS, mask, bias):
    """softmax(cap(logits) + bias) over the allowed keys, float32, with dropout
    on the weights in training (as ``attention.dot_product_attention``)."""
    s = self.spec
    logits_BHLS = softcap(logits_BHLS, s.logit_softcap)
    if bias is not None:
      logits_BHLS = logits_BHLS + bias.astype(jnp.float32)
    if mask is not None:
      logits_BHLS = jnp.where(mask, logits_BHLS, NEG_INF)
    probs_BHLS = jax.nn.softmax(logits_BHLS, axis=-1)
    if not self.deterministic and s.dropout > 0.0:
      keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - s.dropout,
                                  probs_BHLS.shape)
      probs_BHLS = jnp.where(keep, probs_BHLS / (1.0 - s.dropout), 0.0)
    return probs_BHLS

  def _sow_logits(self, logits_BHLS, mask):
    """The diagnostics ``Attention`` sows, of the scaled content logits, and
    QK-clip's per-head maxima."""
    seen = (jnp.ones(logits_BHLS.shape, bool) if mask is None
            else jnp.broadcast_to(mask, logits_BHLS.shape))
    if self.is_mutable_collection("intermediates"):
      self.sow("intermediates", "max_attention_logit", jax.lax.stop_gradient(
          jnp.max(jnp.where(seen, logits_BHLS, -jnp.inf))))
    if self.is_mutable_collection(QK_CLIP_COLLECTION):  # QK-clip (train.qk_clip)
      # [H]: (q_C . k_C + q_R . k_R) x scale, over batch, queries and seen keys.
      self.sow(QK_CLIP_COLLECTION, QK_CLIP_KIND, jax.lax.stop_gradient(
          jnp.max(jnp.where(seen, logits_BHLS, -jnp.inf), axis=(0, 2, 3))))
    if probes.collecting(self):
      total = jnp.sum(jnp.where(seen, jnp.square(logits_BHLS), 0.0))
      self.sow(probes.COLLECTION, "logit_rms", jax.lax.stop_gradient(
          jnp.sqrt(total / jnp.maximum(jnp.sum(seen), 1))))

  def _update_cache(self, c_BLC, k_rope_BLR, cache_index):
    """Writes the new latents and rotated keys at ``cache_index``; returns
    (the whole latent cache, the whole key cache, True).

    On the initialising call (``cache_index`` None) the cache is created with
    the input's length as its capacity and the inputs are used as they are
    (returns False: the expanded form).
    """
    cc = self.variable("cache", "cached_latent", jnp.zeros, c_BLC.shape, c_BLC.dtype)
    ck = None
    if self.spec.rope_dim:
      ck = self.variable("cache", "cached_rope_key", jnp.zeros, k_rope_BLR.shape,
                         k_rope_BLR.dtype)
    if cache_index is None:
      return c_BLC, k_rope_BLR, False
    cc.value = jax.lax.dynamic_update_slice(cc.value, c_BLC.astype(cc.value.dtype),
                                            (0, cache_index, 0))
    if ck is None:
      return cc.value, k_rope_BLR, True
    ck.value = jax.lax.dynamic_update_slice(ck.value, k_rope_BLR.astype(ck.value.dtype),
                                            (0, cache_index, 0))
    return cc.value, ck.value, True
