"""Position schemes (the ``model.position`` axis).

Absolute schemes add a vector to the token embeddings (sinusoidal, learned);
relative schemes act inside attention: RoPE rotates queries and keys, T5 and
ALiBi add a per-head bias to the attention logits. The bias functions take
query and key *positions* (not lengths), so the same code serves training
(positions within each packed segment) and cached decoding (the query at the
cache index against every cache slot).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


# ---------------------------------------------------------------- sinusoidal
def sinusoidal(positions_BL: jax.Array, d: int, layout: str = "interleaved") -> jax.Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

  Vaswani et al. 2017, section 3.5, interleaved as in the paper (even
  dimensions sine, odd cosine). The textbook chapter prints a factor 2 in front of
  sin/cos; the paper has none and the chapter's own code and remarks (values in
  [-1, 1]) agree with the paper, so we follow the paper. Computed from the
  positions, so it is defined for any length (length extrapolation).

  ``layout="halves"`` puts all sines first, then all cosines ([sin | cos], as
  tensor2tensor, fairseq and Marian lay the table out): the same values under a
  fixed permutation of the model dimensions (even d only).
  """
  # ceil(d/2) frequencies: for odd d the last column is the sine of frequency
  # (d-1)/2, which has no cosine partner (the cosine is sliced off below).
  i = jnp.arange((d + 1) // 2, dtype=jnp.float32)
  inv_freq = jnp.exp(-(2.0 * i / d) * math.log(10000.0))
  angle_BLH = positions_BL[..., None].astype(jnp.float32) * inv_freq
  return _SINUSOIDAL_LAYOUTS[layout](jnp.sin(angle_BLH), jnp.cos(angle_BLH))[..., :d]


# The one dispatch point of ``model.sinusoidal_layout``: (sin, cos) [..., d/2] -> [..., d].
_SINUSOIDAL_LAYOUTS = {
    "interleaved": lambda s, c: jnp.stack([s, c], axis=-1).reshape(*s.shape[:-1], -1),
    "halves": lambda s, c: jnp.concatenate([s, c], axis=-1),
}


class LearnedPositions(nn.Module):
  """A learned absolute table of ``max_len`` rows (GPT, BERT), drawn from
  ``init`` and multiplied by ``scale`` where it is read (GPT-2: N(0, 0.02^2),
  unscaled; ``model.learned_position_init`` chooses)."""
  max_len: int
  d_model: int
  init: Callable = nn.initializers.normal(0.02)
  scale: float = 1.0

  @nn.compact
  def __call__(self, positions_BL):
    table = self.param(
        "embedding", nn.with_logical_partitioning(self.init, ("max_len", "embed")),
        (self.max_len, self.d_model))
    return jnp.take(table, positions_BL, axis=0) * self.scale


# ---------------------------------------------------------------------- RoPE
@dataclasses.dataclass(frozen=True)
class RotarySpec:
  """RoPE resolved into constants: what ``Attention`` rotates, and by how much.

  The first ``dims`` dimensions of each head are rotated, pair i being
  (x_i, x_{i + dims/2}), by the angle t * inv_freq[i] at position t; the
  other dimensions pass through. cos and sin are multiplied by
  ``attention_factor`` (YaRN's attention temperature; 1 otherwise). Built
  by :func:`rotary_spec`.
  """
  dims: int
  inv_freq: tuple[float, ...]  # dims / 2 frequencies, float64 values
  attention_factor: float = 1.0


def _frequencies(dims: int, base: float) -> np.ndarray:
  """theta_i = base^(-2i/r), i < r/2, over the rotated width r (Su et al. 2021,
  section 3.2.2; GPT-NeoX computes them over its rotary_ndims the same way)."""
  return base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)


def _unscaled(dims, base, factor, original_max_len):
  del factor, original_max_len
  return _frequencies(dims, base), 1.0


def _linear(dims, base, factor, original_max_len):
  """Position interpolation (Chen et al. 2023, section 2.2): f'(x, m) = f(x, m / s).

  Positions divided by the extension factor s = L'/L; since every angle is
  m * theta_i, dividing the frequencies by s is the same map.
  """
  del original_max_len
  return _frequencies(dims, base) / factor, 1.0


def _ntk(dims, base, factor, original_max_len):
  """Static "NTK-aware" scaling (Peng et al. 2023, section 3.1):
  b' = b * s^(r / (r - 2)) over the rotated width r, so that the lowest
  frequency is interpolated by s and the highest is left as it is."""
  del original_max_len
  return _frequencies(dims, base * factor ** (dims / (dims - 2))), 1.0


# YaRN's ramp bounds (Peng et al. 2023, section 3.2): frequencies that turn more
# than beta times over the training context are kept, fewer than alpha times
# interpolated; the paper's values for LLaMA, and transformers' defaults.
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


def yarn_attention_factor(factor: float) -> float:
  """sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, section 3.4); 1 for s <= 1."""
  return 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0


def _yarn(dims, base, factor, original_max_len, truncate: bool = True):
  """YaRN (Peng et al. 2023), as transformers' ``_compute_yarn_parameters``.

  Pair i makes n_i = L / lambda_i = L theta_i / (2 pi) turns over the training
  context L (the paper's r(d)). The paper ("NTK-by-parts", section 3.2) blends
      h(theta_i) = (1 - gamma_i) theta_i / s + gamma_i theta_i,
  gamma = 0 below alpha = 1 turn, 1 above beta = 32 turns, linear in n between.
  The released YaRN code and transformers make gamma linear in the pair index
  instead, between the indices where n = beta and n = alpha,
      i(n) = r ln(L / (2 pi n)) / (2 ln b)   (r the rotated width),
  rounded outwards (floor, ceil) and clamped to [0, r - 1]; we do the same, so
  that converted checkpoints compute what they were trained with. cos and sin
  are multiplied by sqrt(1/t) (section 3.4, ``yarn_attention_factor``).
  ``truncate`` False (``model.rope_yarn_truncate``; transformers' ``truncate``,
  gpt-oss's False) leaves the two indices unrounded, only clamped.
  """
  theta = _frequencies(dims, base)

  def pair_index(turns):
    return dims * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

  low, high = pair_index(YARN_BETA_FAST), pair_index(YARN_BETA_SLOW)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dims - 1)
  if low == high:
    high += 0.001  # a step rather than a ramp (transformers' guard against 0/0)
  ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  gamma = 1.0 - ramp  # 1: the frequency is kept (extrapolated); 0: divided by s
  return (1.0 - gamma) * theta / factor + gamma * theta, yarn_attention_factor(factor)


# The one dispatch point of ``model.rope_scaling``:
# (rotated width, base, factor s, original context L) -> (theta, attention factor).
_ROPE_SCALINGS = {"none": _unscaled, "linear": _linear, "ntk": _ntk, "yarn": _yarn}


def rotary_spec(dims: int, base: float = 10000.0, scaling: str = "none",
                factor: float = 1.0, original_max_len: int = 0, *,
                yarn_truncate: bool = True) -> RotarySpec:
  """The :class:`RotarySpec` of ``dims`` rotated dimensions per head with a scaling
  (``model.rope_scaling``: none, linear, ntk, yarn) by ``factor``; YaRN's ramp
  rounded outwards or not (``yarn_truncate``, read by yarn only)."""
  scale = _ROPE_SCALINGS[scaling]
  if scaling == "yarn" and not yarn_truncate:
    scale = functools.partial(_yarn, truncate=False)
  inv_freq, attention_factor = scale(dims, base, factor, original_max_len)
  return RotarySpec(dims, tuple(float(f) for f in inv_freq), float(attention_factor))


def rope(x_BLHK: jax.Array, positions_BL: jax.Array, spec: RotarySpec) -> jax.Array:
  """Rotary embedding (Su et al. 2021) on queries or keys, per head.

  Pair i of the rotated dimensions is rotated by angle t * theta_i
  (``spec.inv_freq``). We use the half-split layout, pairing (x_i, x_{i+r/2})
  ("rotate_half"), as the HF LLaMA code of textbook chapter 003 does; the interleaved layout
  of the paper is the same map up to a fixed permutation of the head dimension,
  so q.k scores are identical. With ``spec.dims`` < head_dim only the first
  ``dims`` dimensions are rotated (GPT-NeoX's partial rotary); the rest pass
  through unchanged.
  """
  inv_freq = jnp.asarray(spec.inv_freq, jnp.float32)
  angle_BLR = positions_BL[..., None].astype(jnp.float32) * inv_freq
  cos, sin = jnp.cos(angle_BLR), jnp.sin(angle_BLR)
  if spec.attention_factor != 1.0:
    cos, sin = cos * spec.attention_factor, sin * spec.attention_factor
  return _rotate(x_BLHK, cos[:, :, None, :], sin[:, :, None, :])


def _rotate_by(x, cos, sin):
  """Pairs (x_i, x_{i+h}), i < h = cos.shape[-1], rotated; dimensions >= 2h as they are."""
  h = cos.shape[-1]
  x32 = x.astype(jnp.float32)
  x1, x2, rest = x32[..., :h], x32[..., h:2 * h], x32[..., 2 * h:]
  parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
  if rest.shape[-1]:
    parts.append(rest)
  return jnp.concatenate(parts, axis=-1).astype(x.dtype)


@jax.custom_vjp
def _rotate(x, cos, sin):
  return _rotate_by(x, cos, sin)


def _rotate_fwd(x, cos, sin):
  return _rotate_by(x, cos, sin), (cos, sin)


def _rotate_bwd(residuals, d_out):
  # A rotation's transpose is the rotation by the opposite angle (scaled by the
  # same attention factor m: (m R)^T = m R^-1), and the identity on the
  # dimensions passed through: the same slices and concatenation as the
  # forward, where autodiff would pad and add the pieces' gradients. The angles
  # come from integer positions: no gradient.
  cos, sin = residuals
  return _rotate_by(d_out, cos, -sin), None, None


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


# ------------------------------------------------------- interleaved NoPE
# Llama 4's query temperature on its NoPE layers (HF ``Llama4TextAttention``,
# ``attn_temperature_tuning``; its config's ``floor_scale`` and ``attn_scale``).
NOPE_FLOOR_SCALE = 8192
NOPE_ATTN_SCALE = 0.1


def nope_temperature(positions_BL: jax.Array) -> jax.Array:
  """1 + attn_scale ln(1 + floor((pos + 1) / floor_scale)) per query, [B, L]
  float32: Llama 4 multiplies the queries of its layers without RoPE
  (``model.nope_every``) by it, so that attention sharpens as the context grows
  (the temperature tuning HF cites, Nakanishi 2025, arXiv 2501.19399). 1 for
  positions below floor_scale - 1 = 8191."""
  steps = jnp.floor((positions_BL.astype(jnp.float32) + 1.0) / NOPE_FLOOR_SCALE)
  return 1.0 + NOPE_ATTN_SCALE * jnp.log1p(steps)


# --------------------------------------------------------------------- ALiBi
def alibi_slopes(num_heads: int) -> np.ndarray:
  """Head slopes of ALiBi (Press et al. 2022).

  For n a power of two: m_k = 2^(-8k/n), k = 1..n. Otherwise the paper's rule:
  the slopes of the largest power of two p < n, then every other slope of the
  2p list until there are n.
  """
  def power_of_two(n):
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

  if num_heads & (num_heads - 1) == 0:
    return np.asarray(power_of_two(num_heads), np.float32)
  p = 2 ** int(math.floor(math.log2(num_heads)))
  extra = power_of_two(2 * p)[0::2][: num_heads - p]
  return np.asarray(power_of_two(p) + extra, np.float32)


def alibi_bias(q_pos_BQ, k_pos_BK, num_heads: int) -> jax.Array:
  """-m_h * |i - j|, shape [B, H, Q, K].

  The paper defines the causal case, -m_h * (i - j) for j <= i; future keys are
  masked anyway, so |i - j| gives the same logits there. For bidirectional
  encoders (not covered by the paper) the symmetric distance is the usual
  extension.
  """
  m_H = jnp.asarray(alibi_slopes(num_heads))
  dist_BQK = jnp.abs(q_pos_BQ[:, :, None] - k_pos_BK[:, None, :]).astype(jnp.float32)
  return -m_H[None, :, None, None] * dist_BQK[:, None]


# ------------------------------------------------------------ T5 relative bias
def t5_bucket(relative_position, *, bidirectional: bool, num_buckets: int = 32,
              max_distance: int = 128):
  """T5's bucket of ``relative_position = key_pos - query_pos`` (Raffel et al. 2020).

  n = query_pos - key_pos. Bidirectional: half the buckets for each sign (n < 0
  adds num_buckets/2), then |n|. Causal: n = max(n, 0). Below max_exact = B/2
  every distance has its own bucket; above, buckets grow logarithmically up to
  ``max_distance``, and everything further shares the last bucket.
  """
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret = ret + (n < 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  # n / max_exact >= 1 where used; guard log(0) in the discarded branch.
  large = max_exact + (
      jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
      / math.log(max_distance / max_exact) * (num_buckets - max_exact)
  ).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return ret + jnp.where(is_small, n, large)


class T5RelativeBias(nn.Module):
  """One learned scalar per (bucket, head), shared by all layers of a stack."""
  num_heads: int
  bidirectional: bool
  # T5 and HF's T5PreTrainedModel initialise the table with std d_model^-0.5,
  # so that at init the bias is small next to the content logits.
  init_std: float
  num_buckets: int = 32
  max_distance: int = 128

  @nn.compact
  def __call__(self, q_pos_BQ, k_pos_BK):
    table = self.param(
        "rel_embedding",
        nn.with_logical_partitioning(nn.initializers.normal(self.init_std),
                                     ("relpos_buckets", "heads")),
        (self.num_buckets, self.num_heads))
    bucket_BQK = t5_bucket(
        k_pos_BK[:, None, :] - q_pos_BQ[:, :, None], bidirectional=self.bidirectional,
        num_buckets=self.num_buckets, max_distance=self.max_distance)
    return jnp.take(table, bucket_BQK, axis=0).transpose(0, 3, 1, 2)  # [B, H, Q, K]
