"""Value residual learning: the ``model.value_residual`` axis.

ResFormer (Zhou et al. 2025, "Value Residual Learning", ACL; the paper's code
Zcchill/Value-Residual-Learning): every layer n >= 2 of a stack mixes the
first layer's values into its own, right after the value projection and
before attention (and before the KV cache, which then holds the mixed values):

  fixed    V_n <- 0.5 V_n + 0.5 V_1                    (the paper's ResFormer)
  learned  V_n <- lambda_n V_n + lambda'_n V_1          (two scalars per layer,
           both initialised to 0.5, so that training starts at ``fixed``: the
           value-residual lambdas of modded-nanogpt's records, one pair per layer)

V_1 is the first layer's projected values of the same tokens, in the same
stack (an encoder and a decoder each use their own; cross-attention is
untouched). The stack carries V_1 from layer to layer (``blocks.Stack``), so
that a scanned stack stays one scanned layer: layer 1 is told by a flag
(``first``), a Python bool in a loop and a scanned one under ``nn.scan``. Every
layer has the same parameters, so layer 1 has a pair of lambdas too, which it
does not read (their gradient is 0).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class ValueResidualSpec:
  """``model.value_residual`` resolved (``specs.value_residual_spec``): the
  mixing weights fixed at 1/2 each, or learned per layer."""
  learned: bool


def value_lambdas(module: nn.Module, spec: ValueResidualSpec):
  """(lambda on V_n, lambda on V_1) of this layer: learned scalars of
  ``module`` (``value_lambda``, ``first_value_lambda``, init 0.5) or 0.5 each."""
  if not spec.learned:
    return 0.5, 0.5
  make = lambda name: module.param(name, nn.with_logical_partitioning(
      nn.initializers.constant(0.5), ()), (), jnp.float32)
  return make("value_lambda"), make("first_value_lambda")


def mix_values(v_BLNK, first_BLNK, first, lambdas, carried: dict):
  """The value hook of one layer: V_n mixed with V_1 = ``first_BLNK``, or,
  in the first layer (``first``), V_1 itself, kept in ``carried["first"]``
  for the layers after it. ``first`` is a Python bool or a traced one."""
  lam_n, lam_1 = (jnp.asarray(x, v_BLNK.dtype) for x in lambdas)
  mixed_BLNK = lam_n * v_BLNK + lam_1 * first_BLNK.astype(v_BLNK.dtype)
  if first is True:
    carried["first"] = v_BLNK
    return v_BLNK
  if first is False:
    carried["first"] = first_BLNK
    return mixed_BLNK
  carried["first"] = jnp.where(first, v_BLNK, first_BLNK)
  return jnp.where(first, v_BLNK, mixed_BLNK)


def initial_values(x_BLD: jax.Array, num_kv_heads: int, head_dim: int, dtype):
  """The V_1 a stack starts its carry with (zeros; the first layer replaces it)."""
  return jnp.zeros((*x_BLD.shape[:2], num_kv_heads, head_dim), dtype)
