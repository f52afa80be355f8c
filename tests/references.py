"""Slow, obviously-correct NumPy references of the formulas the model computes.

Each is written from its paper with loops over NumPy arrays or Python floats,
in float64, and is compared with the Flax code by the test modules that import
it (test_layers.py, test_attention_knobs.py, test_rope_scaling.py). They take
plain arrays and nested dicts of parameters, never a config or a module.

- Inputs: ``rand``, a seeded standard-normal float32 array.
- Norms: ``np_layernorm``, ``np_rmsnorm``.
- Rotary positions: ``rope_theta`` (the frequencies), ``np_rope`` (the
  rotation, partial and scaled), ``jnp_rope`` (the same rotation in jnp, for
  autodiff).
- Attention: ``np_attention`` (the scores and their softmax, per head),
  ``np_dense`` and ``np_attention_layer`` (the projections around it, with the
  query-key norm, RoPE, soft-cap and gate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np


def rand(seed: int, *shape: int, scale: float = 1.0) -> np.ndarray:
  """A float32 array of ``shape`` drawn from N(0, scale^2) by generator ``seed``."""
  return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------ norms
def np_layernorm(x, g, b, eps: float) -> np.ndarray:
  """LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b over the last axis, with
  the biased variance (Ba et al. 2016)."""
  out = np.empty_like(x, dtype=np.float64)
  for idx in np.ndindex(x.shape[:-1]):
    row = x[idx].astype(np.float64)
    mean = row.sum() / row.size
    var = ((row - mean) ** 2).sum() / row.size  # biased variance
    out[idx] = (row - mean) / math.sqrt(var + eps) * g + b
  return out


def np_rmsnorm(x, g, eps: float) -> np.ndarray:
  """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g over the last axis (Zhang &
  Sennrich 2019)."""
  out = np.empty_like(x, dtype=np.float64)
  for idx in np.ndindex(x.shape[:-1]):
    row = x[idx].astype(np.float64)
    out[idx] = row / math.sqrt((row**2).sum() / row.size + eps) * g
  return out


# ------------------------------------------------------------------- RoPE
def rope_theta(dims: int, base: float = 10000.0) -> list[float]:
  """theta_i = base^(-2i/r), i < r/2, over the rotated width r = ``dims`` (Su et
  al. 2021, RoFormer, section 3.2), one Python float at a time."""
  return [base ** (-2.0 * i / dims) for i in range(dims // 2)]


def np_rope(x_BLHK, positions_BL, inv_freq: Sequence[float], scale: float = 1.0
            ) -> np.ndarray:
  """Rotary embedding (Su et al. 2021) in the half-split layout: with r = 2 *
  len(inv_freq), pair i < r/2 is (x_i, x_{i+r/2}), rotated by the angle t *
  inv_freq[i] at position t:

    (x_i, x_{i+r/2}) -> scale * (x_i cos - x_{i+r/2} sin, x_i sin + x_{i+r/2} cos).

  Dimensions >= r are copied (GPT-NeoX's partial rotary). ``inv_freq`` is
  ``rope_theta`` or a scaled table (linear, NTK, YaRN); ``scale`` is YaRN's
  attention factor (Peng et al. 2023, section 3.4), 1 otherwise.
  """
  B, L, H, _ = x_BLHK.shape
  out = x_BLHK.astype(np.float64).copy()
  half = len(inv_freq)
  for b, l, h in np.ndindex(B, L, H):
    t = positions_BL[b, l]
    for i in range(half):
      c, s = math.cos(t * inv_freq[i]), math.sin(t * inv_freq[i])
      x1, x2 = float(x_BLHK[b, l, h, i]), float(x_BLHK[b, l, h, i + half])
      out[b, l, h, i] = scale * (x1 * c - x2 * s)
      out[b, l, h, i + half] = scale * (x1 * s + x2 * c)
  return out


def jnp_rope(x_BLHK, positions_BL, inv_freq: Sequence[float], scale: float = 1.0):
  """``np_rope``'s rotation as one split-and-concatenate in jnp (float32):
  differentiable, the plain formula that ``rope``'s own backward pass (the
  rotation by the opposite angle) is checked against with autodiff."""
  half = len(inv_freq)
  angle_BLR = positions_BL[..., None] * jnp.asarray(inv_freq, jnp.float32)
  cos = scale * jnp.cos(angle_BLR)[:, :, None]
  sin = scale * jnp.sin(angle_BLR)[:, :, None]
  x1, x2, rest = x_BLHK[..., :half], x_BLHK[..., half:2 * half], x_BLHK[..., 2 * half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


# -------------------------------------------------------------- attention
def np_attention(q_BLHK, k_BSNK, v_BSNK, mask_B1LS=None, bias_BhLS=None,
                 softcap: float = 0.0) -> np.ndarray:
  """softmax(cap(Q K^T / sqrt(d_k)) + bias) V per head (Vaswani et al. 2017,
  eq. 1); query head h reads key/value head h // (H/N) (GQA, Ainslie et al.
  2023; MQA at N = 1). ``softcap`` c > 0 bounds the scores by c tanh(s / c)
  (Gemma 2) before the bias is added; a False in ``mask_B1LS`` drops a key.
  ``bias_BhLS`` has one row per head or one shared by all heads."""
  B, L, H, K = q_BLHK.shape
  N = k_BSNK.shape[2]
  G = H // N
  out = np.zeros((B, L, H, K))
  for b, h in np.ndindex(B, H):
    n = h // G
    s = (q_BLHK[b, :, h].astype(np.float64) @ k_BSNK[b, :, n].T.astype(np.float64)
         / math.sqrt(K))
    if softcap:
      s = softcap * np.tanh(s / softcap)
    if bias_BhLS is not None:
      s = s + bias_BhLS[b, h if bias_BhLS.shape[1] > 1 else 0]
    if mask_B1LS is not None:
      s = np.where(mask_B1LS[b, 0], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    out[b, :, h] = p @ v_BSNK[b, :, n]
  return out


def np_dense(x_BLD, p) -> np.ndarray:
  """x W + b over the last axis of x, W of shape [D, ...] (``p["kernel"]``),
  the bias where ``p`` has one."""
  y = np.einsum("bld,d...->bl...", x_BLD, p["kernel"].astype(np.float64))
  return y + p["bias"] if "bias" in p else y


def np_attention_layer(x_BLD, p, mask_B1LS, *, qk_norm: str | None = None,
                       inv_freq: Sequence[float] | None = None, softcap: float = 0.0,
                       gate: bool = False, eps: float = 1e-6) -> np.ndarray:
  """Self-attention with its projections, from the parameters ``p`` of
  ``Attention``: q, k, v = x W_q, x W_k, x W_v; ``qk_norm`` ("layernorm" or
  "rmsnorm") normalises each head's queries and keys (Qwen3), before RoPE at
  positions 0..L-1 with ``inv_freq``; ``np_attention`` with ``softcap``; ``gate``
  multiplies each head's output by sigmoid(x W_g + b_g) (Qiu et al. 2025,
  position G1); then the output projection."""
  q, k, v = (np_dense(x_BLD, p[n]) for n in ("query", "key", "value"))
  if qk_norm is not None:
    norm = {"layernorm": lambda y, g: np_layernorm(y, g["scale"], g["bias"], eps),
            "rmsnorm": lambda y, g: np_rmsnorm(y, g["scale"], eps)}[qk_norm]
    q, k = norm(q, p["query_norm"]), norm(k, p["key_norm"])
  if inv_freq is not None:
    positions_BL = np.broadcast_to(np.arange(x_BLD.shape[1]), x_BLD.shape[:2])
    q, k = np_rope(q, positions_BL, inv_freq), np_rope(k, positions_BL, inv_freq)
  out_BLHK = np_attention(q, k, v, mask_B1LS, softcap=softcap)
  if gate:
    out_BLHK = out_BLHK / (1 + np.exp(-np_dense(x_BLD, p["gate"])))
  return np.einsum("blhk,hkd->bld", out_BLHK, p["out"]["kernel"]) + p["out"]["bias"]
