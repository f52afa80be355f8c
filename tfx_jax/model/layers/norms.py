"""Normalisation layers: LayerNorm, RMSNorm and DyT (the ``model.norm_type`` axis).

Each normalises the last axis. ``axis`` is the logical name of that axis for the
parameters' sharding: ``embed`` for the residual stream, ``kv`` for the per-head
query-key norms (``model.qk_norm``).
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from tfx_jax.model.config import NormType


class LayerNorm(nn.Module):
  """LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b  (Ba et al. 2016).

  The textbook chapter's PyTorch reference divides by ``std + eps`` with the unbiased
  std; we follow the paper and every major codebase (biased variance inside
  the square root), which is what the formula in the chapter's equation states.
  Statistics are computed in float32 whatever the compute dtype.
  """
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  axis: str = "embed"

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]
    g = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis,)), (d,))
    b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,)), (d,))
    x = x_BLD.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jnp.reciprocal(jnp.sqrt(var + self.eps))
    return (y * g + b).astype(self.dtype)


class RMSNorm(nn.Module):
  """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g  (Zhang & Sennrich 2019; LLaMA)."""
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  axis: str = "embed"

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]
    g = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis,)), (d,))
    x = x_BLD.astype(jnp.float32)
    y = x * jnp.reciprocal(jnp.sqrt(jnp.square(x).mean(-1, keepdims=True) + self.eps))
    return (y * g).astype(self.dtype)


class DyT(nn.Module):
  """DyT(x) = gamma * tanh(alpha x) + beta  (Zhu et al. 2025, "Transformers
  without Normalization"): an element-wise replacement of a norm, with one
  learned scalar alpha (init 0.5, the paper's default alpha_0) and LayerNorm's
  per-channel gamma and beta. No statistics: ``eps`` is not read."""
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  axis: str = "embed"
  alpha_init: float = 0.5

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]
    alpha = self.param("alpha", nn.with_logical_partitioning(
        nn.initializers.constant(self.alpha_init), ()), ())
    g = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (self.axis,)), (d,))
    b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,)), (d,))
    y = jnp.tanh(alpha * x_BLD.astype(jnp.float32))
    return (y * g + b).astype(self.dtype)


_NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "dyt": DyT}


class JointHeads(nn.Module):
  """The norm ``make(...)`` over all heads of a [..., H, K] array at once (its
  last two axes as one vector of H K elements, one gain each): the query-key
  norm of OLMo 2 and OLMoE (``model.qk_norm_heads='joint'``). Its parameters
  are the inner norm's, under this module's name."""
  make: Callable[..., nn.Module]

  @nn.compact
  def __call__(self, x_BLHK):
    norm = self.make(name="norm")
    nn.share_scope(self, norm)
    return norm(x_BLHK.reshape(*x_BLHK.shape[:-2], -1)).reshape(x_BLHK.shape)


def norm_factory(norm_type: NormType, eps: float, dtype,
                 axis: str = "embed") -> Callable[..., nn.Module]:
  """The one dispatch point of ``model.norm_type`` (and of ``model.qk_norm``'s
  values); returns ``make(name=...)``."""
  return functools.partial(_NORMS[norm_type], eps=eps, dtype=dtype, axis=axis)
