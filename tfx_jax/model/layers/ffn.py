"""Position-wise feed-forward networks (the ``model.activation`` axis).

Plain:  FFN(x) = act(x W1 + b1) W2 + b2              (textbook formula 2.4)
Gated:  FFN(x) = (act(x W) * (x V)) W2               (Shazeer 2020, "GLU variants")
        glu = sigmoid, reglu = relu, geglu = gelu (geglu_tanh: its tanh
        approximation), swiglu = swish, bilinear = identity.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.layers import products
from tfx_jax.model.config import GATED_ACTIVATIONS, Activation

Initializer = Callable[..., jax.Array]

# GELU: the exact erf form (Hendrycks & Gimpel 2016), as BERT and T5's GeGLU
# ablation use; Swish with beta = 1 (= SiLU), as in SwiGLU and LLaMA.
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    # The tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    # (Hendrycks & Gimpel 2016), as GPT-2 and T5 v1.1's gated FFN compute it.
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "swish": jax.nn.silu,
    "glu": jax.nn.sigmoid,
    "reglu": jax.nn.relu,
    "geglu": lambda x: jax.nn.gelu(x, approximate=False),
    "geglu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "swiglu": jax.nn.silu,
    "bilinear": lambda x: x,
}


def activation_fn(activation: Activation) -> tuple[Callable[[jax.Array], jax.Array], bool]:
  """The one dispatch point of ``model.activation``: (function, gated?)."""
  return _ACTIVATIONS[activation], activation in GATED_ACTIVATIONS


class FeedForward(nn.Module):
  """Plain or gated FFN; which one is decided by ``gated``."""
  d_ff: int
  act: Callable[[jax.Array], jax.Array]
  gated: bool
  use_bias: bool = True
  dropout: float = 0.0
  deterministic: bool = True
  kernel_init: Initializer = nn.initializers.xavier_uniform()
  dtype: jnp.dtype = jnp.float32
  platform: str = "cpu"  # the backend compiled for (products.dot_general_for)

  @nn.compact
  def __call__(self, x_BLD):
    d = x_BLD.shape[-1]

    def dense(features, axes, name, use_bias):
      return nn.Dense(
          features, use_bias=use_bias, dtype=self.dtype, name=name,
          dot_general=products.dot_general_for(self.dtype, self.platform),
          kernel_init=nn.with_logical_partitioning(self.kernel_init, axes),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]))

    # Tokens flattened to one axis: the products are plain [T, D] x [D, F]
    # matrices, whose weight gradients XLA's CPU backend computes without the
    # transposed copies of [B, L, F] activations it inserts for 3-D operands
    # (the same numbers; the FFN's forward and backward 1.75x faster on CPU).
    x_TD = x_BLD.reshape(-1, d)
    h_TF = self.act(dense(self.d_ff, ("embed", "mlp"), "wi", self.use_bias)(x_TD))
    if self.gated:
      h_TF = h_TF * dense(self.d_ff, ("embed", "mlp"), "wv", self.use_bias)(x_TD)
    if self.dropout > 0.0 and not self.deterministic:  # the mask of [B, L, F]
      h_TF = nn.Dropout(self.dropout)(h_TF.reshape(*x_BLD.shape[:-1], -1),
                                      deterministic=False).reshape(h_TF.shape)
    return dense(d, ("mlp", "embed"), "wo", self.use_bias)(h_TF).reshape(x_BLD.shape)
