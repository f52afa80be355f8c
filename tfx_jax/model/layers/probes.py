"""The coordinate check's probes (``python -m tfx_jax.summary --coord-check``,
``run/coord_check.py``): the RMS of an activation, sown into its own
collection.

Yang et al. 2022 (Tensor Programs V, section 7 and Figure 5) check a
parametrization by the size of each coordinate of every layer's output as the
width grows: the RMS of each residual branch, of the attention logits and of
the output logits. The probes sow one float32 scalar each into
:data:`COLLECTION`, and only where that collection is mutable: the training
step never makes it mutable, so its program has not one operation more (the
attention layer's ``max_attention_logit`` in ``intermediates``, which
``train.log_layer_stats`` collects, is a separate collection for that reason).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

COLLECTION = "coord_check"


def rms(x: jax.Array) -> jax.Array:
  """sqrt(mean(x^2)) over every entry, in float32, out of the gradient."""
  x = jax.lax.stop_gradient(x).astype(jnp.float32)
  return jnp.sqrt(jnp.mean(jnp.square(x)))


def collecting(module: nn.Module) -> bool:
  """Whether ``module`` is applied with the coord check's collection mutable."""
  return module.is_mutable_collection(COLLECTION)


def sow_rms(module: nn.Module, name: str, x: jax.Array) -> jax.Array:
  """Sows rms(``x``) as ``name`` where the collection is collected; returns ``x``."""
  if collecting(module):
    module.sow(COLLECTION, name, rms(x))
  return x
