"""Machines by the names their users know, and their devices for compiling.

Cloud TPU slices are named ``<generation>-<N>``: N counts chips for v5e and
v6e (one TensorCore a chip) and TensorCores for v4 and v5p (two a chip, used
as one "megacore" device), as the Cloud TPU accelerator types do:
``v5e-16`` is 16 chips (4x4), ``v4-32`` and ``v5p-32`` 16 chips (2x2x4). The
physical form ``v5e:4x4`` (``v4:2x2x4``, ``v5p:2x2x4``, ``v6e:8x8``) names the
chip grid itself. ``cpu-N`` is N fake CPU devices of this host
(``--xla_force_host_platform_device_count``): no extra needed, no memory limit.

A TPU topology's devices come from libtpu (``jax.experimental.topologies``),
compile-only: programs compile for them on a machine without a TPU. That
needs the ``tpu-aot`` extra, which pins ``jax[tpu]`` to the jax version of the
project (libtpu must match jax exactly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import tempfile

from tfx_jax.core.errors import ConfigError
from tfx_jax.scale import chips

INSTALL_HINT = ('pip install -e ".[tpu-aot]" (the tpu-aot extra: jax[tpu] at the '
                "project's jax version, which brings the matching libtpu)")


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str  # as users write it: v4, v5e, v5p, v6e
  libtpu_name: str  # libtpu's topology prefix
  chip: str  # chips.CHIPS row
  megacore: bool  # two TensorCores a chip, counted in the slice name
  # Slice sizes Cloud TPU offers (in the slice name's unit) -> chip grid.
  grids: dict[int, tuple[int, ...]]


def _grids_2d() -> dict[int, tuple[int, ...]]:
  return {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
          128: (8, 16), 256: (16, 16)}


def _grids_3d() -> dict[int, tuple[int, ...]]:
  # In TensorCores (two a chip): v4-8 and v5p-8 are one host's 2x2x1 chips.
  shapes = [(2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8),
            (4, 8, 8), (8, 8, 8), (8, 8, 16), (8, 16, 16), (16, 16, 16)]
  return {2 * math.prod(s): s for s in shapes}


GENERATIONS = {
    "v4": Generation("v4", "v4", "TPU v4", True, _grids_3d()),
    "v5e": Generation("v5e", "v5e", "TPU v5e", False, _grids_2d()),
    "v5p": Generation("v5p", "v5", "TPU v5p", True, _grids_3d()),
    "v6e": Generation("v6e", "v6e", "TPU v6e", False, _grids_2d()),
}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A named machine: its platform, chips and (for TPUs) libtpu's name."""
  name: str  # as given
  platform: str  # "tpu" or "cpu"
  num_devices: int
  generation: Generation | None = None
  grid: tuple[int, ...] = ()

  @property
  def chip(self) -> chips.Chip | None:
    return chips.by_name(self.generation.chip) if self.generation else None

  @property
  def libtpu_name(self) -> str:
    return f"{self.generation.libtpu_name}:{'x'.join(map(str, self.grid))}"

  def describe(self) -> str:
    if self.platform == "cpu":
      return f"{self.num_devices} fake CPU devices (no memory limit)"
    return (f"{self.chip.name}, {self.num_devices} chips ({'x'.join(map(str, self.grid))}), "
            f"{self.chip.hbm_gib:g} GiB HBM each")


def valid_names() -> list[str]:
  names = []
  for gen in GENERATIONS.values():
    names += [f"{gen.name}-{n}" for n in gen.grids]
  return names


def _unknown(name: str) -> ConfigError:
  gens = ", ".join(
      f"{g.name}-N with N in {sorted(g.grids)}" for g in GENERATIONS.values())
  return ConfigError(
      f"--topology={name!r} is not a known topology. Valid names: {gens} (N counts "
      f"chips for v5e and v6e, TensorCores for v4 and v5p); a chip grid such as "
      f"v5e:4x4, v6e:8x8, v4:2x2x4 or v5p:4x4x4; or cpu-N (N fake CPU devices).")


def parse(name: str) -> Topology:
  """The topology of a name (module docstring); a ConfigError listing the valid
  names for anything else. Reads no device and needs no libtpu."""
  text = name.strip().lower()
  cpu = re.fullmatch(r"cpu-(\d+)", text)
  if cpu:
    n = int(cpu.group(1))
    if n < 1:
      raise _unknown(name)
    return Topology(name, "cpu", n)
  sliced = re.fullmatch(r"(v\d+[a-z]?)-(\d+)", text)
  if sliced and sliced.group(1) in GENERATIONS:
    gen = GENERATIONS[sliced.group(1)]
    size = int(sliced.group(2))
    if size not in gen.grids:
      raise _unknown(name)
    grid = gen.grids[size]
    return Topology(name, "tpu", math.prod(grid), gen, grid)
  physical = re.fullmatch(r"(v\d+[a-z]?):(\d+(?:x\d+)+)", text)
  if physical and physical.group(1) in GENERATIONS:
    gen = GENERATIONS[physical.group(1)]
    grid = tuple(int(d) for d in physical.group(2).split("x"))
    if len(grid) != len(next(iter(gen.grids.values()))) or min(grid) < 1:
      raise _unknown(name)
    return Topology(name, "tpu", math.prod(grid), gen, grid)
  raise _unknown(name)


def libtpu_available() -> bool:
  import importlib.util  # pylint: disable=import-outside-toplevel
  return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def _quiet_stderr():
  """Holds back what libtpu prints to the process's stderr while it loads on a
  machine without TPU (it looks for TPU hosts it is not meant to find); shown
  only if loading fails."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      held.seek(0)
      sys.stderr.write(held.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def prepare_host(topology: Topology) -> None:
  """A cpu-N topology's devices exist only if XLA is told before its CPU
  backend starts: sets ``--xla_force_host_platform_device_count=N`` then (a
  process whose backend started already keeps the devices it has)."""
  if topology.platform != "cpu":
    return
  if "jax" in sys.modules:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    if xla_bridge._backends:  # pylint: disable=protected-access
      return
  flag = f"--xla_force_host_platform_device_count={topology.num_devices}"
  os.environ["XLA_FLAGS"] = " ".join(
      [f for f in os.environ.get("XLA_FLAGS", "").split()
       if not f.startswith("--xla_force_host_platform_device_count")] + [flag])


def devices(topology: Topology) -> list:
  """The topology's devices: compile-only TPU devices from libtpu, or this
  host's CPU devices (which must number ``num_devices``: set
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before jax starts;
  ``python -m tfx_jax.compile`` does)."""
  import jax  # pylint: disable=import-outside-toplevel
  if topology.platform == "cpu":
    found = jax.devices("cpu")
    if len(found) < topology.num_devices:
      raise ConfigError(
          f"--topology={topology.name} needs {topology.num_devices} CPU devices but "
          f"this process has {len(found)}: start it with XLA_FLAGS="
          f"--xla_force_host_platform_device_count={topology.num_devices}.")
    return found[:topology.num_devices]
  if not libtpu_available():
    raise ConfigError(f"--topology={topology.name} compiles for TPU, which needs libtpu: "
                      f"{INSTALL_HINT}.")
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  if not hardware_utils.num_available_tpu_chips_and_device_id()[0]:
    # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) that guards a TPU;
    # without one there is nothing to guard, and two compiles (test workers, a
    # sweep check beside a compile) may load it at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  gen = topology.generation
  kwargs = {}
  if gen.megacore:
    kwargs["chip_config_name"] = "megacore"
  if len(topology.grid) == 2 and min(topology.grid) < 2:
    # A host holds 2x2 chips; a slice smaller than a host (v5e-1) is its own host.
    kwargs["chips_per_host_bounds"] = (*(min(g, 2) for g in topology.grid), 1)
  with _quiet_stderr():
    desc = topologies.get_topology_desc(topology.libtpu_name, "tpu", **kwargs)
  return list(desc.devices)
