"""Dense products in bf16, in the form XLA's CPU backend runs fast.

On CPUs with bf16 instructions (AVX512-BF16, AMX-BF16) XLA's CPU backend runs a
product of bf16 operands fast when it accumulates and returns float32
(``preferred_element_type=float32``) and its operands are plain row-major
matrices; a bf16 result, mixed bf16/float32 operands, or a contraction over
the leading (token) axis fall back to slower kernels. Autodiff of a bf16
``Dense`` produces exactly those slow forms in the backward pass. ``matmul``
keeps all three products of a projection (forward, input gradient, weight
gradient) in the fast form, with its own backward:

  forward          y = x w               [T, K] x [K, N] -> f32, rounded to bf16
  input gradient   dx = g (w^T)          [T, N] x [N, K], w^T materialised
  weight gradient  dw = (x^T) g          [K, T] x [T, N], x^T materialised

The transposes are materialised as gathers (``row_major_transpose``): XLA
folds a transpose (even behind an optimisation barrier) into the product's
dimension numbers, and a bf16 product with a transposed operand is upcast to
float32 on the CPU. Measured on a 2-vCPU AMD EPYC (AVX512-BF16), T 2048, K
256, N 1024: dx 90 -> 145-296 GFLOP/s, dw 68 -> 134 GFLOP/s with the gather
(0.6 ms for x^T); the forward 155, float32's 69-84.

Each accumulates in float32 and rounds once to bf16, as PyTorch's CPU autocast
does. ``dot_general_for`` gives Flax's ``Dense`` / ``DenseGeneral`` this
product where it applies (bf16 computation on the CPU backend) and None (Flax's
own ``lax.dot_general``) elsewhere: GPUs and TPUs keep XLA's own choices.

The backend is the one the program is compiled for, passed down from the run's
set-up (``models.build_model(platform=...)``), not the host that traces it: a
step compiled ahead of time for a TPU topology on a CPU host
(``python -m tfx_jax.compile``) must get the TPU's products.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

F32 = jnp.float32


def uses_fast_products(dtype, platform: str) -> bool:
  """Whether projections in ``dtype`` go through ``matmul`` on ``platform``
  (the backend the program is compiled for: "cpu", "gpu", "tpu")."""
  return jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16) and platform == "cpu"


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def matmul(x_TK: jax.Array, w_KN: jax.Array, out_dtype=None) -> jax.Array:
  """x w for 2-D bf16 operands, accumulated in float32, returned in
  ``out_dtype`` (default: x's dtype; float32 for logits, unrounded)."""
  return jnp.dot(x_TK, w_KN, preferred_element_type=F32).astype(out_dtype or x_TK.dtype)


def _matmul_fwd(x_TK, w_KN, out_dtype):
  return matmul(x_TK, w_KN, out_dtype), (x_TK, w_KN)


def row_major_transpose(a_MN: jax.Array) -> jax.Array:
  """a^T as its own row-major array: a gather by iota indices, which XLA does
  not fold into the next product's dimension numbers (a transpose it does)."""
  m, n = a_MN.shape
  index = jnp.int32 if m * n < 2**31 else jnp.int64
  i_NM = jax.lax.broadcasted_iota(index, (n, m), 1)
  j_NM = jax.lax.broadcasted_iota(index, (n, m), 0)
  return a_MN.reshape(-1)[i_NM * n + j_NM]


def _matmul_bwd(out_dtype, residuals, g_TN):
  x_TK, w_KN = residuals
  g_TN = g_TN.astype(x_TK.dtype)
  # Both gradients as plain [M, K] x [K, N] products of row-major operands.
  dx_TK = jnp.dot(g_TN, row_major_transpose(w_KN),
                  preferred_element_type=F32).astype(x_TK.dtype)
  dw_KN = jnp.dot(row_major_transpose(x_TK), g_TN,
                  preferred_element_type=F32).astype(w_KN.dtype)
  return dx_TK, dw_KN


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """``lax.dot_general`` with the signature Flax's ``Dense`` calls, through
  ``matmul`` when the contraction is the lhs's trailing axes against the rhs's
  leading axes in order, without batch axes (every projection of the model);
  other contractions go to ``lax.dot_general`` unchanged."""
  (lhs_c, rhs_c), (lhs_b, rhs_b) = dimension_numbers
  lhs_c = tuple(a % lhs.ndim for a in lhs_c)
  rhs_c = tuple(a % rhs.ndim for a in rhs_c)
  k = len(lhs_c)
  plain = (not lhs_b and not rhs_b and lhs_c == tuple(range(lhs.ndim - k, lhs.ndim))
           and rhs_c == tuple(range(k)) and lhs.dtype == rhs.dtype
           and preferred_element_type is None)
  if not plain:
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  outer, inner = lhs.shape[:lhs.ndim - k], lhs.shape[lhs.ndim - k:]
  size = math.prod(inner)
  y = matmul(lhs.reshape(-1, size), rhs.reshape(size, -1))
  return y.reshape(*outer, *rhs.shape[k:])


def dot_general_for(dtype, platform: str):
  """Flax's ``dot_general`` argument for projections computed in ``dtype`` on
  ``platform``: ``dot_general`` above where ``uses_fast_products``, else None
  (Flax's own)."""
  return dot_general if uses_fast_products(dtype, platform) else None

