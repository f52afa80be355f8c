"""Every command's start on a machine that has libtpu but no TPU.

The ``tpu-aot`` extra installs libtpu so that programs compile for TPU
topologies on a CPU host (``python -m tfx_jax.compile``). JAX then also tries
to start a TPU backend in every process, on every command: on a machine
without a TPU chip that costs about 65 ms of libtpu start-up (measured on the
2-core CPU host, median of 10) and prints libtpu's complaints about the TPU
hosts it cannot find. ``skip_absent_tpu`` (called when ``tfx_jax`` is
imported) restricts JAX to its CPU backend in exactly that case: libtpu
installed, ``JAX_PLATFORMS`` not set by the user, no TPU chip and no NVIDIA GPU
on the machine (JAX's own hardware probes). Compiling for a TPU topology does
not need the TPU backend: libtpu's compiler is loaded on its own
(``jax.experimental.topologies``).
"""

from __future__ import annotations

import importlib.util
import os


def skip_absent_tpu() -> bool:
  """Sets the platforms to CPU when libtpu is installed on a machine without
  a TPU or an NVIDIA GPU (module docstring); True if it did."""
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return False
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  if chips or hardware_utils.has_visible_nvidia_gpu():
    return False
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  if xla_bridge._backends:  # pylint: disable=protected-access
    return False  # started already: too late to choose
  import jax  # pylint: disable=import-outside-toplevel
  # This process only, not os.environ: a job it submits (sbatch exports the
  # environment) may run on a machine with accelerators.
  jax.config.update("jax_platforms", "cpu")
  return True
