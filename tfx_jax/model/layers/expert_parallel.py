"""Expert parallelism: a mixture of experts' rows sent to their experts' devices.

With a mesh axis ``expert`` of size ep > 1 (``config.mesh.expert``) the E
experts of each MoE layer are split over it, E/ep per device (the kernels'
logical axis "expert"), and the tokens are split over the batch axes
(``model/axes.py``'s ``BATCH_AXES``, which include ``expert``). Left to the SPMD
partitioner, the dispatch of model/layers/moe.py would gather every expert's
kernels on every device; here it runs per device under ``jax.shard_map``
(GShard, Lepikhin et al. 2021, section 3.2; MegaBlocks, Gale et al. 2023):
each device routes its T_l local tokens as on one device, its rows travel
to the devices of their experts by an all-to-all over ``expert``, each
device runs its E/ep experts on the rows it received from every device, and
a second all-to-all brings the results back to be weighed. ``dispatch`` of
model/layers/moe.py lays out the rows and weighs them; this module only moves them
(``capacity_exchange``, ``dropless_exchange``) and runs the per-device
program (``per_device``).

  * capacity: each device gives every expert C_l = ceil(factor T_l k / E)
    rows (GShard's per-group capacity), the [E, C_l, D] buffer is one dense
    all-to-all each way, [ep, E/ep, C_l, D] split by destination. Drops are
    decided per device, so they differ from one device's only where an
    expert overflows.
  * dropless: the rows are sorted by expert, so each destination's rows are
    one contiguous slice. With the dense exchange (XLA:CPU, which implements
    no ``ragged-all-to-all``) each destination gets a buffer of the worst
    case, A_l = T_l k rows (nothing is dropped), and the rows per (source,
    local expert) follow in a small all-to-all; the receiver reads each
    row's expert from those counts, sorts the ep A_l rows by local expert
    (padding last), multiplies them with one grouped matmul
    (``jax.lax.ragged_dot``) and sends them back unsorted. On TPU and GPU
    ``jax.lax.ragged_all_to_all`` sends only the rows (ep x less traffic),
    packed: source s's rows then start at the sum of the earlier sources'
    counts instead of at s A_l, the only difference in the layout.

The cost, per MoE layer and step: two all-to-alls of k T_l D activations per
device (there and back) in the forward pass and two in the backward (the
capacity buffer: factor k T_l D; the dense dropless exchange: ep k T_l D,
mostly padding), plus one of E integers (the dropless counts), instead of
all-gathers of every expert kernel. The ragged exchange's two rules for the
backward pass (a JVP and a transpose, each another ragged-all-to-all) are
JAX's own (jax/_src/lax/parallel.py).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from tfx_jax.model.axes import BATCH_AXES

EXPERT_AXIS = "expert"
# Backends whose XLA implements ragged-all-to-all (XLA:CPU does not).
RAGGED_PLATFORMS = ("tpu", "gpu")

# rows [N, D], rows per expert [E_local], capacity (0: dropless) -> [N, D]
RowsFn = Callable[[jax.Array, jax.Array, int], jax.Array]


def expert_axis_size() -> int:
  """The size of the ``expert`` axis of the mesh the step is traced in (the
  abstract mesh ``run_setup.ShardedRun`` sets); 1 without one."""
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else int(mesh.shape.get(EXPERT_AXIS, 1))


def _to_devices(x):
  """[ep, ...] with block d for device d -> [ep, ...] with block s from device s."""
  return jax.lax.all_to_all(x, EXPERT_AXIS, 0, 0)


def capacity_exchange(ffn: RowsFn, ep: int) -> RowsFn:
  """Rows laid out expert by expert, C rows each ([E C, D] as
  ``moe.capacity_rows`` places them) -> the experts' outputs in that layout,
  each expert run on the device that holds it: ``ffn`` runs this device's
  E/ep experts, C rows from each of the ep devices, as one batched product."""

  def run(x_ND, sizes_E, capacity):
    (E,), D = sizes_E.shape, x_ND.shape[-1]
    local = E // ep
    x_SLCD = _to_devices(x_ND.reshape(ep, local, capacity, D))  # S: the source device
    x_MD = x_SLCD.transpose(1, 0, 2, 3).reshape(local * ep * capacity, D)  # by local expert
    y_MD = ffn(x_MD, jnp.full((local,), ep * capacity, jnp.int32), ep * capacity)
    y_SLCD = y_MD.reshape(local, ep, capacity, D).transpose(1, 0, 2, 3)
    return _to_devices(y_SLCD).reshape(E * capacity, D)

  return run


def _local_groups(starts_S, sizes_SL, rows: int):
  """The local expert of each of ``rows`` received rows: source s's rows
  start at ``starts_S[s]``, ``sizes_SL[s, l]`` of them for local expert l in
  order; rows of no source (padding) get the number of local experts."""
  p_R = jnp.arange(rows)
  source_R = jnp.sum(p_R[:, None] >= starts_S[None, :], axis=-1) - 1
  within_R = p_R - starts_S[source_R]
  ends_RL = jnp.cumsum(sizes_SL, axis=-1)[source_R]
  return jnp.sum(within_R[:, None] >= ends_RL, axis=-1).astype(jnp.int32)


def dropless_exchange(ffn: RowsFn, ep: int, ragged: bool) -> RowsFn:
  """Rows sorted by expert (``moe.dropless_rows``: ``sizes_E`` rows each,
  the rest padding) -> the experts' outputs in that order, each expert run on
  the device that holds it. ``ragged``: the rows travel packed by
  ``jax.lax.ragged_all_to_all``; else in worst-case buffers by
  ``jax.lax.all_to_all``. Either way a device receives into ep A rows, the
  most it can get (every row of every device for its experts): its experts'
  activations then take ep times the memory of an even load."""

  def run(x_AD, sizes_E, capacity):
    del capacity  # dropless
    (A, D), (E,) = x_AD.shape, sizes_E.shape
    local = E // ep
    # X: the device rows go to, S: the one they come from. This device's rows
    # for device x: the slice start_X[x] : start_X[x] + n_X[x].
    n_X = jnp.sum(sizes_E.reshape(ep, local), axis=-1)
    start_X = jnp.cumsum(n_X) - n_X
    # What every device sends here, per local expert ([source, local expert]).
    recv_SL = _to_devices(sizes_E.reshape(ep, local))
    recv_S = jnp.sum(recv_SL, axis=-1)
    if ragged:
      starts_S = jnp.cumsum(recv_S) - recv_S  # sources packed in order
      # Where this device's rows land on device d: d's start for this source.
      x_RD = jax.lax.ragged_all_to_all(
          x_AD, jnp.zeros((ep * A, D), x_AD.dtype), start_X, n_X,
          jax.lax.all_to_all(starts_S, EXPERT_AXIS, 0, 0, tiled=True), recv_S,
          axis_name=EXPERT_AXIS)
    else:
      starts_S = jnp.arange(ep) * A  # a buffer of A rows per source
      i_A = jnp.arange(A)
      send_XA = jnp.where(i_A < n_X[:, None], start_X[:, None] + i_A, A)
      x_RD = _to_devices(x_AD.at[send_XA].get(mode="fill", fill_value=0)).reshape(ep * A, D)
    # Sorted by local expert, padding last (as moe.dropless_rows sorts), for
    # one grouped matmul over this device's experts (M: rows in that order).
    group_R = _local_groups(starts_S, recv_SL, ep * A)
    order_R = jnp.argsort(group_R, stable=True)
    row_R = jnp.zeros_like(order_R).at[order_R].set(jnp.arange(ep * A))
    sizes_L = jnp.bincount(group_R, length=local).astype(jnp.int32)
    y_MD = ffn(jnp.zeros_like(x_RD).at[row_R].set(x_RD), sizes_L, 0)
    y_RD = y_MD[row_R]
    if ragged:
      return jax.lax.ragged_all_to_all(
          y_RD, jnp.zeros((A, D), y_RD.dtype), starts_S, recv_S,
          jax.lax.all_to_all(start_X, EXPERT_AXIS, 0, 0, tiled=True), n_X,
          axis_name=EXPERT_AXIS)
    y_XAD = _to_devices(y_RD.reshape(ep, A, D))
    # Row r came back from its expert's device x, at r - start_X[x]; padding: none.
    r_A = jnp.arange(A)
    x_A = jnp.sum(r_A[:, None] >= jnp.cumsum(n_X)[None, :], axis=-1)
    back_A = jnp.where(x_A < ep, x_A * A + r_A - start_X[jnp.minimum(x_A, ep - 1)], ep * A)
    return y_XAD.reshape(ep * A, D).at[back_A].get(mode="fill", fill_value=0)

  return run


def per_device(local: Callable, x_BLD, experts_BLK, weights_BLK, projections, key):
  """``local(x [T_l, D], experts [T_l, k], weights [T_l, k], projections,
  key) -> (y [T_l, D], dropped [T_l, k])`` run on every device of the
  abstract mesh under ``jax.shard_map``: the tokens split over the mesh's
  batch axes, the experts' ``projections`` (leaves [E, ...]) over ``expert`` (their
  fsdp and tensor shards, if any, gathered), ``key`` (a dropout key or None)
  folded with the device's index among the batch shards. Returns (y [B, L, D],
  dropped [B, L, k]) split as the tokens."""
  mesh = jax.sharding.get_abstract_mesh()
  batch = tuple(a for a in BATCH_AXES if a in mesh.shape)
  shards = math.prod(mesh.shape[a] for a in batch)
  B, L, D = x_BLD.shape
  if B % shards:
    raise ValueError(f"a batch of {B} sequences does not divide among the mesh's batch axes "
                     f"({' x '.join(f'{a}={mesh.shape[a]}' for a in batch)} = {shards}), "
                     "which the expert-parallel dispatch splits it over.")

  def run(x, experts, weights, w, key):
    B_l, K = x.shape[0], experts.shape[-1]
    if key is not None:  # each batch shard its own dropout mask (tensor copies alike)
      key = jax.random.fold_in(key, jax.lax.axis_index(batch))
    y_TD, dropped_TK = local(x.reshape(B_l * L, D), experts.reshape(B_l * L, K),
                             weights.reshape(B_l * L, K), w, key)
    return y_TD.reshape(B_l, L, D), dropped_TK.reshape(B_l, L, K)

  tokens = P(batch)
  return jax.shard_map(run, mesh=mesh, in_specs=(tokens, tokens, tokens, P(EXPERT_AXIS), P()),
                       out_specs=(tokens, tokens), check_vma=False)(
                           x_BLD, experts_BLK, weights_BLK, projections, key)
