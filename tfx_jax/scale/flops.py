"""The analytic model FLOP count of a training step.

Model FLOPs per token follow PaLM (Chowdhery et al. 2022, Appendix B):
6 N + 12 L H Q T, with N the parameters that take part in matrix products
(every parameter but the learned position table, and but the input embedding
when it is not tied to the output projection), L layers, H heads of width Q,
T the sequence length (MLA's H Q and a Gated DeltaNet layer's count as
``attention_flops_per_token`` says). Causal attention is counted in full, as PaLM does,
although fused kernels skip the masked half. These are the FLOPs the model
needs, not the ones a step spends: rematerialisation recomputes the forward
(about 8 N per token under ``remat=full``) and is not counted, which is what
makes MFU comparable across remat policies.
"""

from __future__ import annotations

import math

import jax


def matmul_params(params, model_cfg) -> int:
  """Parameters that take part in a matrix product per token (module
  docstring); ``params`` may be arrays or ``jax.ShapeDtypeStruct``s."""
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if name.startswith("positions/") or "_positions/" in name:  # a lookup table
      continue
    if not model_cfg.tie_embeddings and name == "embedding/embedding":
      continue
    total += int(math.prod(leaf.shape))
  return total


def flops_per_token(n_params: int, model_cfg, seq: int) -> float:
  """6 N + 12 L H Q T (PaLM's model FLOPs per token)."""
  return 6.0 * n_params + attention_flops_per_token(model_cfg, seq)


def attention_flops_per_token(model_cfg, seq: int) -> float:
  """The 12 L H Q T term alone: the attention scores and their weighted sum
  (MLA: H Q is H (d_n + d_R + d_v) / 2), plus a Gated DeltaNet layer's state
  products, 3 x 6 H d_k d_v (``model.budgets.token_mixing``)."""
  from tfx_jax.model import budgets  # pylint: disable=import-outside-toplevel
  layers = model_cfg.num_layers * (2 if model_cfg.family == "encoder_decoder" else 1)
  mix = budgets.token_mixing(model_cfg)
  attention = layers - mix.deltanet_layers
  return (12.0 * attention * mix.attention_width * seq
          + 18.0 * mix.deltanet_layers * mix.deltanet_state)
