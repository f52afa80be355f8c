"""Command line: ``python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/NAME``.

Any field can be overridden: ``--config.model.activation=swiglu``. Running the
same command again resumes from the workdir's latest checkpoint. Compiled
steps are cached on disk (``TFX_JAX_COMPILATION_CACHE``, default
``~/.cache/tfx_jax/xla``; empty: off; ``JAX_COMPILATION_CACHE_DIR``, as a
sweep sets it, wins), so a repeated shape skips compilation.

``--evaluate="--split test"`` (repeatable) evaluates the run after its last
step, in this process, as ``python -m tfx_jax.evaluate --workdir RUN --split
test`` would (the same results and files); on a finished run, the same
command runs the evaluations it has not done yet, from its checkpoint. A
sweep's evaluations run this way (``--separate-evaluations`` of the sweep
starts the evaluation command instead).

Multi-process runs (one process per host, or per GPU) add ``--distributed``
and start the same command in every process: JAX's multi-controller runtime
is initialised from ``--coordinator_address``, ``--num_processes`` and
``--process_id``, or, with none of them, from the environment JAX detects
(SLURM, Cloud TPU VMs, Open MPI). See ``tfx_jax.run.distributed``.
"""

from __future__ import annotations

import os
import shlex
import sys

from absl import flags
from ml_collections import config_flags

from tfx_jax.run import distributed
from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.core.errors import ConfigError


def _explain(argv: list[str]) -> str | None:
  """Names a ``--config.*`` override that is not a field (loaded only on an error)."""
  from tfx_jax.run.config_base import unknown_override  # pylint: disable=import-outside-toplevel
  return unknown_override(argv)


FLAGS = new_flags(explain=_explain)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file and preset, e.g. configs/lm.py:tiny.",
    lock_config=True, flag_values=FLAGS)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints and logs.", flag_values=FLAGS)
_EVALUATE = flags.DEFINE_multi_string(
    "evaluate", [], "After training, evaluate in this process with these arguments of "
    "python -m tfx_jax.evaluate (without --workdir), e.g. --evaluate='--split test'; "
    "repeatable.", flag_values=FLAGS)
distributed.define_flags(FLAGS)
flags.adopt_module_key_flags(distributed, flag_values=FLAGS)  # listed in --help
flags.mark_flags_as_required(["config", "workdir"], flag_values=FLAGS)


def main(argv):
  from tfx_jax.records import status  # pylint: disable=import-outside-toplevel
  started = status.process_start()  # where the run's startup seconds begin
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  # Before jax starts; jax and the trainer load only when a run starts, so
  # --help and flag errors answer at once.
  distributed.initialize_from_flags(FLAGS)
  import jax
  # A sweep repeats shapes: XLA executables are kept on disk and a repeated
  # shape skips compilation. TFX_JAX_COMPILATION_CACHE="" turns this off; a
  # cache named by JAX's own JAX_COMPILATION_CACHE_DIR (a sweep's) is kept.
  cache_dir = os.environ.get("TFX_JAX_COMPILATION_CACHE",
                             os.path.join(os.path.expanduser("~"), ".cache", "tfx_jax",
                                          "xla"))
  if cache_dir and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    jax.config.update("jax_compilation_cache_dir", cache_dir)
  from tfx_jax.run import trainer
  evaluations = [shlex.split(args) for args in _EVALUATE.value]
  result = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value, evaluations, started)
  if result.status == "diverged":
    sys.exit(1)


if __name__ == "__main__":
  run_main(main, FLAGS)
