"""Device mesh and logical-axis sharding.

The logical axis names and the rules that map them to the mesh axes
``data``, ``fsdp``, ``tensor`` and ``expert`` live with the model
(``model/axes.py``); this module builds the mesh and the shardings. One
device is a 1x1x1x1 mesh: the same code runs on a laptop CPU and on many hosts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.axes import BATCH_AXES, LOGICAL_RULES, MESH_AXES  


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """``config.mesh``: the size of each mesh axis; -1 = all remaining devices."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  expert: int = 1  # devices the experts of each MoE layer are split over


def mesh_sizes(mesh_cfg: MeshConfig | Mapping[str, Any]) -> tuple[int, ...]:
  """(data, fsdp, tensor, expert) as the config sets them, checked without
  devices: each a positive integer or -1 (all remaining devices), at most one
  -1. A mapping without ``expert`` (a mesh recorded before it) has expert 1."""
  get = (lambda name: mesh_cfg.get(name, 1 if name == "expert" else None)) if isinstance(
      mesh_cfg, Mapping) else (lambda name: getattr(mesh_cfg, name))
  sizes = tuple(int(get(name)) for name in MESH_AXES)
  for name, size in zip(MESH_AXES, sizes):
    if not (size > 0 or size == -1):
      raise ConfigError(f"mesh.{name}={size} is not valid: must be a positive integer "
                        "or -1 (all remaining devices).")
  if sizes.count(-1) > 1:
    minus = [f"mesh.{n}" for n, s in zip(MESH_AXES, sizes) if s == -1]
    raise ConfigError(f"{' and '.join(minus)} are all -1: at most one mesh size may be "
                      "-1 (all remaining devices).")
  return sizes


def make_mesh(mesh_cfg, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one size may be -1 (all remaining devices).

  Sizes that do not fit the devices are a ConfigError naming the
  ``config.mesh.*`` fields, the device count and the sizes that would fit.
  """
  devices = list(devices if devices is not None else jax.devices())
  sizes = list(mesh_sizes(mesh_cfg))
  n = len(devices)
  fixed = {name: size for name, size in zip(MESH_AXES, sizes) if size != -1}
  known = int(np.prod(list(fixed.values())))
  free = -1 in sizes
  if (n % known) if free else (known != n):
    named = [f"config.mesh.{k}={v}" for k, v in fixed.items() if v != 1] or [
        f"config.mesh.{k}={v}" for k, v in fixed.items()]
    need = f"a multiple of {known}" if free else f"exactly {known}"
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    platform = devices[0].platform if devices else "none"
    raise ConfigError(
        f"{', '.join(named)}: the mesh (data, fsdp, tensor, expert) = {tuple(sizes)} needs "
        f"{need} devices, but this process sees {n} ({platform}). Sizes that fit {n} "
        f"device{'s' if n != 1 else ''}: config.mesh.data, config.mesh.fsdp, "
        f"config.mesh.tensor and config.mesh.expert each one of {divisors}, with a "
        f"product of {n} (or one of them -1, the remaining devices).")
  if free:
    sizes[sizes.index(-1)] = n // known
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def batch_shards(mesh: Mesh) -> int:
  """How many parts the batch is split into: the product of the mesh's batch
  axes (``BATCH_AXES``: data, fsdp and expert)."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.shape]))


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
