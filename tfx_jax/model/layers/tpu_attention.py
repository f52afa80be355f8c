"""Self-attention on TPU through the splash attention kernel that JAX ships.

``jax.experimental.pallas.ops.tpu.splash_attention`` is FlashAttention
(Dao et al. 2022) written for the TPU: the softmax is taken block by block
with a running maximum and denominator, so neither the [L, S] logits nor the
probabilities are ever held whole, and its backward recomputes them from the
output and the log-sum-exp. A layer's attention then needs O(L) memory
instead of O(L^2): at seq 2048 with 32 heads, 512 MiB of float32 logits per
sequence (twice that with the saved probabilities) are not allocated. It is
the kernel MaxText uses (``attention=flash``) on TPU.

The kernel takes its mask as a static pattern (causal, or full) plus segment
ids: two tokens attend to each other only within one segment. That is the
mask ``models.attention_mask`` builds from the same segment ids (padding is
segment 0, and a real query never sees a padding key), so the result at every
real position is the same. Position biases (T5, ALiBi), a sliding window,
dropout on the probabilities and a KV cache have no place in it: those take
the layer's other paths (``Attention._attend``).

The kernel is a Pallas call, which XLA's SPMD partitioner cannot split; it
runs under ``shard_map`` over the mesh the step is traced in
(``jax.sharding.get_abstract_mesh()``, set by ``run_setup.ShardedRun``), each
device on its rows of the batch (the batch axes ``data`` and ``fsdp``) and, when
they divide, its heads (``tensor``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

# Query and key blocks of the kernel: MaxText's defaults (sa_block_q = sa_block_kv
# = 512); a shorter sequence is one block. Mosaic tiles the kernel's blocks by
# 128 lanes, so a sequence must be a multiple of 128 to take this path.
BLOCK = 512
LANES = 128
from tfx_jax.model.axes import BATCH_AXES
HEAD_AXIS = "tensor"  # the mesh axis of the ``heads`` logical axis


def splash_applies(q_len: int, kv_len: int) -> bool:
  """Whether self-attention of this length can take the kernel: queries and
  keys the same positions (no cache), in whole 128-lane tiles."""
  return q_len == kv_len and q_len % LANES == 0


@functools.lru_cache(maxsize=None)
def _kernel(length: int, num_heads: int, causal: bool, softcap: float):
  """The splash kernel of one shape and mask (built once per trace)."""
  # Deferred: the Pallas TPU modules load only for a TPU program.
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=import-outside-toplevel
      splash_attention_kernel as splash, splash_attention_mask as masks)
  shape = (length, length)
  head_mask = masks.CausalMask(shape) if causal else masks.FullMask(shape)
  block = min(BLOCK, length)
  sizes = splash.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
      block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  return splash.make_splash_mha(
      masks.MultiHeadMask([head_mask] * num_heads), block_sizes=sizes, head_shards=1,
      q_seq_shards=1, attn_logits_soft_cap=softcap or None)


def splash_attention(q_BLHK, k_BLNK, v_BLNK, segment_ids_BL, *, causal: bool,
                     scale_logits: bool = True, logit_softcap: float = 0.0,
                     dtype=jnp.bfloat16):
  """softmax(cap(Q K^T / sqrt(d_k)) + mask) V by the splash kernel; [B, L, H, K].

  ``segment_ids_BL`` [B, L] int: a query sees the keys of its own segment
  (and, ``causal``, none after it). Grouped key/value heads (N dividing H) are
  the kernel's own. Inputs are cast to ``dtype``; the kernel accumulates in
  float32.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=import-outside-toplevel
      splash_attention_kernel as splash)
  B, L, H, K = q_BLHK.shape
  N = k_BLNK.shape[2]
  if scale_logits:
    q_BLHK = q_BLHK * jnp.asarray(K ** -0.5, q_BLHK.dtype)
  q_BHLK = q_BLHK.astype(dtype).transpose(0, 2, 1, 3)
  k_BNLK = k_BLNK.astype(dtype).transpose(0, 2, 1, 3)
  v_BNLK = v_BLNK.astype(dtype).transpose(0, 2, 1, 3)
  segment_ids_BL = segment_ids_BL.astype(jnp.int32)

  mesh = jax.sharding.get_abstract_mesh()
  heads = None
  if not mesh.empty and HEAD_AXIS in mesh.shape:
    t = mesh.shape[HEAD_AXIS]
    heads = HEAD_AXIS if t > 1 and H % t == 0 and N % t == 0 else None

  def attend(q, k, v, seg):
    kernel = _kernel(L, q.shape[1], causal, float(logit_softcap))
    ids = splash.SegmentIds(q=seg, kv=seg)
    return jax.vmap(kernel, in_axes=(0, 0, 0, splash.SegmentIds(0, 0)))(q, k, v, ids)

  if mesh.empty:
    out_BHLK = attend(q_BHLK, k_BNLK, v_BNLK, segment_ids_BL)
  else:
    batch = tuple(a for a in BATCH_AXES if a in mesh.shape)
    qkv = P(batch, heads, None, None)
    out_BHLK = jax.shard_map(attend, mesh=mesh, in_specs=(qkv, qkv, qkv, P(batch, None)),
                             out_specs=qkv, check_vma=False)(
                                 q_BHLK, k_BNLK, v_BNLK, segment_ids_BL)
  return out_BHLK.transpose(0, 2, 1, 3).astype(dtype)
