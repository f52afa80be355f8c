"""Multi-process runs: JAX's multi-controller runtime, started from flags or the cluster.

Every process runs the same program (``python -m tfx_jax.train ... --distributed``,
or ``python -m tfx_jax.evaluate ... --distributed``)
over all devices of all processes; ``jax.distributed.initialize`` connects them
through a coordinator (process 0). Its three parameters come either all from
the command line or all from the environment that JAX detects (SLURM's
``srun``, Cloud TPU VMs, Open MPI's ``mpirun``); a partial set is refused, so
that a typo cannot silently start N one-process runs. On CPU the cross-process
collectives are gloo's (``jax_cpu_collectives_implementation``); GPUs use
NCCL and TPUs their interconnect, with nothing to configure.

What each process does in a run (``trainer``, ``run_setup``): every process
builds the same global batches and keeps its rows of them (the data, and so
the losses, do not depend on the number of processes); only process 0 writes
TensorBoard, console progress and ``status.json``; checkpoints are written by
all processes together (orbax).
"""

from __future__ import annotations

import dataclasses
import re

from absl import flags

from tfx_jax.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DistributedSpec:
  """Arguments of ``jax.distributed.initialize``; None: detected from the environment."""

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def define_flags(flag_values: flags.FlagValues) -> None:
  """``--distributed``, ``--coordinator_address``, ``--num_processes``, ``--process_id``."""
  flags.DEFINE_bool(
      "distributed", False, "Initialise jax.distributed (multi-process runs) from "
      "--coordinator_address, --num_processes and --process_id, or, with none of them, "
      "from the environment (SLURM, TPU VM, Open MPI).", flag_values=flag_values)
  flags.DEFINE_string(
      "coordinator_address", None, "host:port of process 0's coordinator (with "
      "--distributed).", flag_values=flag_values)
  flags.DEFINE_integer(
      "num_processes", None, "Number of processes of the run (with --distributed).",
      flag_values=flag_values)
  flags.DEFINE_integer(
      "process_id", None, "This process's index in [0, num_processes) (with "
      "--distributed).", flag_values=flag_values)


def initialize_from_flags(flag_values: flags.FlagValues) -> None:
  """Checks the flags of ``define_flags`` and initialises jax.distributed if asked.

  Call before any other JAX call. Raises ConfigError (the command's exit 2).
  """
  spec = spec_from_flags(
      flag_values["distributed"].value,
      coordinator_address=flag_values["coordinator_address"].value,
      num_processes=flag_values["num_processes"].value,
      process_id=flag_values["process_id"].value)
  if spec is not None:
    initialize(spec)


def spec_from_flags(distributed: bool, *, coordinator_address: str | None,
                    num_processes: int | None,
                    process_id: int | None) -> DistributedSpec | None:
  """Checks the command line's distributed flags; None for a one-process run.

  Raises ConfigError (exit 2, before JAX starts) for flags without
  ``--distributed``, a partial set of the three, or values out of range.
  """
  given = {"--coordinator_address": coordinator_address,
           "--num_processes": num_processes, "--process_id": process_id}
  set_flags = [name for name, value in given.items() if value is not None]
  if not distributed:
    if set_flags:
      raise ConfigError(f"{', '.join(set_flags)} need(s) --distributed.")
    return None
  if set_flags and len(set_flags) != len(given):
    missing = [name for name in given if name not in set_flags]
    raise ConfigError(
        f"--distributed with {', '.join(set_flags)} also needs {', '.join(missing)}: "
        "give all three, or none of them to detect them from the environment "
        "(SLURM, TPU VM, Open MPI).")
  if not set_flags:
    return DistributedSpec()
  if not re.fullmatch(r"\[?[\w.:-]+\]?:\d{1,5}", coordinator_address):
    raise ConfigError(f"--coordinator_address={coordinator_address!r} must be "
                      "host:port (e.g. 10.0.0.1:12345).")
  if num_processes < 1:
    raise ConfigError(f"--num_processes={num_processes} must be >= 1.")
  if not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id={process_id} must be in [0, "
                      f"--num_processes={num_processes}).")
  return DistributedSpec(coordinator_address, num_processes, process_id)


def initialize(spec: DistributedSpec) -> None:
  """``jax.distributed.initialize`` with gloo collectives for CPU devices.

  Call once per process, before any other JAX call. Raises ConfigError when no
  cluster is detected and no flags were given.
  """
  import jax  # pylint: disable=import-outside-toplevel
  # The CPU client's cross-process collectives; GPU and TPU clients ignore it.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(coordinator_address=spec.coordinator_address,
                               num_processes=spec.num_processes,
                               process_id=spec.process_id)
  except ValueError as e:
    # jax raises ValueError when nothing was given and no cluster is detected.
    raise ConfigError(
        f"--distributed found no cluster to join (no SLURM, TPU VM or Open MPI "
        f"environment; jax: {e}). Pass --coordinator_address, --num_processes and "
        "--process_id, or start the processes with srun, mpirun or on a TPU VM.") from e


def is_chief() -> bool:
  """Whether this is process 0, the one that writes logs, status and config.json."""
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier ``name`` (no-op on one process)."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)
