"""Device mesh and logical-axis sharding.

Parameters carry logical axis names (``embed``, ``mlp``, ``heads``, ``kv``,
``vocab``, ``layers``, ...); ``LOGICAL_RULES`` maps them to the mesh axes
``data`` (batch), ``fsdp`` (parameters sharded, batch too) and ``tensor``
(within-layer model parallelism). One device is a 1x1x1 mesh: the same code
runs on a laptop CPU and on many hosts.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tfx_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("vocab", "tensor"),
    ("layers", None),
    ("max_len", None),
    ("relpos_buckets", None),
    ("classes", None),
    ("embed_out", None),
)


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 (all remaining devices)."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = [int(mesh_cfg.data), int(mesh_cfg.fsdp), int(mesh_cfg.tensor)]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(
        f"mesh sizes (data, fsdp, tensor) = {tuple(sizes)}: each must be a positive "
        "integer, and at most one may be -1 (all remaining devices).")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ConfigError(f"{len(devices)} devices cannot be split by mesh sizes {sizes}.")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ConfigError(
        f"mesh (data={sizes[0]}, fsdp={sizes[1]}, tensor={sizes[2]}) needs "
        f"{int(np.prod(sizes))} devices, but {len(devices)} are available.")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def shardings_of(abstract_boxed, mesh: Mesh, rules=LOGICAL_RULES):
  """NamedShardings for a tree whose leaves may be ``nn.LogicallyPartitioned``.

  Leaves without names (step counters, RNG keys), and optimizer statistics
  whose rank differs from their parameter's (Adafactor's factored moments),
  are replicated.
  """
  return jax.tree.map(lambda x: NamedSharding(mesh, leaf_spec(x, rules)), abstract_boxed,
                      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def leaf_spec(x, rules=LOGICAL_RULES) -> P:
  """The PartitionSpec of one leaf of a boxed tree (see ``shardings_of``)."""
  if isinstance(x, nn.LogicallyPartitioned) and len(x.names) == np.ndim(x.value):
    return nn.logical_to_mesh_axes(x.names, rules)
  return P()


def shard_shape(shape, spec: P, mesh_shape: dict[str, int]) -> tuple[int, ...]:
  """The block of a ``shape`` array each device holds under ``spec`` (rounded up)."""
  out = []
  for i, dim in enumerate(shape):
    axes = spec[i] if i < len(spec) else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    k = int(np.prod([mesh_shape[a] for a in axes]))
    out.append(-(-int(dim) // k))
  return tuple(out)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """Per-process NumPy batch -> global jax.Arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in local_batch.items()}
