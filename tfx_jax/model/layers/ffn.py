"""Position-wise feed-forward networks (the ``model.activation`` axis).

Plain:  FFN(x) = act(x W1 + b1) W2 + b2              (textbook formula 2.4)
Gated:  FFN(x) = (act(x W) * (x V)) W2               (Shazeer 2020, "GLU variants")
        glu = sigmoid, reglu = relu, geglu = gelu (geglu_tanh: its tanh
        approximation), swiglu = swish, bilinear = identity.
Clamped (gpt-oss; transformers' ``GptOssExperts._apply_gate``), swiglu_oss:
        g' = min(x W, l), u' = clip(x V, -l, l),
        FFN(x) = (g' sigmoid(alpha g') * (u' + 1)) W2
        l = model.swiglu_limit, alpha = model.swiglu_alpha (config_ffn.py).
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


def swiglu_oss(limit: float, alpha: float):
  """gpt-oss's clamped SwiGLU as (gate map, up map): h = gate(x W) * up(x V),
  gate(g) = min(g, l) sigmoid(alpha min(g, l)), up(u) = clip(u, -l, l) + 1."""
  def gate(g):
    g = jnp.minimum(g, limit)
    return g * jax.nn.sigmoid(alpha * g)
  return gate, lambda u: jnp.clip(u, -limit, limit) + 1.0


def ffn_activation(activation: Activation, swiglu_limit: float = 7.0,
                   swiglu_alpha: float = 1.702):
  """The one dispatch point of ``model.activation``: (function, gated?, up),
  ``up`` the map of a gated FFN's x V before the product (None: x V as it is;
  swiglu_oss: clipped, + 1), ``model.swiglu_*`` read by swiglu_oss only."""
  if activation == "swiglu_oss":
    gate, up = swiglu_oss(swiglu_limit, swiglu_alpha)
    return gate, True, up
  return _ACTIVATIONS[activation], activation in GATED_ACTIVATIONS, None


def activation_fn(activation: Activation) -> tuple[Callable[[jax.Array], jax.Array], bool]:
  """(function, gated?) of an activation whose up projection is used as it is
  (every one but swiglu_oss, which needs ``ffn_activation``'s up map too)."""
  act, gated, up = ffn_activation(activation)
  if up is not None:
    raise ValueError(f"activation {activation!r} maps its up projection too: use "
                     "ffn_activation, which returns that map.")
  return act, gated


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
  up: Callable[[jax.Array], jax.Array] | None = None  # gated: x V's map (ffn_activation)

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
      v_TF = dense(self.d_ff, ("embed", "mlp"), "wv", self.use_bias)(x_TD)
      h_TF = h_TF * (v_TF if self.up is None else self.up(v_TF))
    if self.dropout > 0.0 and not self.deterministic:  # the mask of [B, L, F]
      h_TF = nn.Dropout(self.dropout)(h_TF.reshape(*x_BLD.shape[:-1], -1),
                                      deterministic=False).reshape(h_TF.shape)
    return dense(d, ("mlp", "embed"), "wo", self.use_bias)(h_TF).reshape(x_BLD.shape)
