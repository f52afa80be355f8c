"""Normalisation layers: LayerNorm and RMSNorm (the ``model.norm_type`` axis)."""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from tfx_jax.model_config import NormType


class LayerNorm(nn.Module):
  """LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b  (Ba et al. 2016).

  The textbook chapter's PyTorch reference divides by ``std + eps`` with the unbiased
  std; we follow the paper and every major codebase (biased variance inside
  the square root), which is what the formula in the chapter's equation states.
  Statistics are computed in float32 whatever the compute dtype.
  """
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]
    g = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (d,))
    b = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (d,))
    x = x_BLD.astype(jnp.float32)
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    y = (x - mean) * jnp.reciprocal(jnp.sqrt(var + self.eps))
    return (y * g + b).astype(self.dtype)


class RMSNorm(nn.Module):
  """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g  (Zhang & Sennrich 2019; LLaMA)."""
  eps: float = 1e-6
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]
    g = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (d,))
    x = x_BLD.astype(jnp.float32)
    y = x * jnp.reciprocal(jnp.sqrt(jnp.square(x).mean(-1, keepdims=True) + self.eps))
    return (y * g).astype(self.dtype)


_NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}


def norm_factory(norm_type: NormType, eps: float, dtype) -> Callable[..., nn.Module]:
  """The one dispatch point of ``model.norm_type``; returns ``make(name=...)``."""
  return functools.partial(_NORMS[norm_type], eps=eps, dtype=dtype)
