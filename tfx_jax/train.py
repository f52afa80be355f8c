"""Command line: ``python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/NAME``.

Any field can be overridden: ``--config.model.activation=swiglu``. Running the
same command again resumes from the workdir's latest checkpoint. Compiled
steps are cached on disk (``TFX_JAX_COMPILATION_CACHE``, default
``~/.cache/tfx_jax/xla``; empty: off; ``JAX_COMPILATION_CACHE_DIR``, as a
sweep sets it, wins), so a repeated shape skips compilation.

``--spec RUN/run_spec.json`` instead of ``--config`` and its overrides: the
run a sweep wrote (``tfx_jax.records.run_spec``: the config file, the typed
overrides, the seed and the evaluations), trained as ``--config FILE
--config.a.b=v ...`` with the same values would be; a sweep starts its runs
this way.

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
import ml_collections
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
_SPEC = flags.DEFINE_string(
    "spec", None, "A run's specification written by python -m tfx_jax.sweep "
    "(RUN/run_spec.json: config file, overrides, seed, evaluations), instead of "
    "--config and its --config.* overrides.", flag_values=FLAGS)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints and logs.", flag_values=FLAGS)
_EVALUATE = flags.DEFINE_multi_string(
    "evaluate", [], "After training, evaluate in this process with these arguments of "
    "python -m tfx_jax.evaluate (without --workdir), e.g. --evaluate='--split test'; "
    "repeatable.", flag_values=FLAGS)
distributed.define_flags(FLAGS)
flags.adopt_module_key_flags(distributed, flag_values=FLAGS)  # listed in --help
flags.mark_flags_as_required(["workdir"], flag_values=FLAGS)
flags.mark_flags_as_mutual_exclusive(["config", "spec"], required=True, flag_values=FLAGS)


def _run() -> tuple[ml_collections.ConfigDict, list[list[str]], tuple[str, ...]]:
  """(the run's config, its evaluations, the fields TensorBoard's HParams view
  lists first) from --config and its overrides, or from --spec."""
  if not _SPEC.value:
    return _CONFIG.value, [shlex.split(args) for args in _EVALUATE.value], ()
  if _EVALUATE.value:
    raise ConfigError("--evaluate with --spec: the spec names the run's evaluations; "
                      "give --evaluate with --config.")
  from tfx_jax.records import run_spec  # pylint: disable=import-outside-toplevel
  from tfx_jax.run.config_base import spec_config  # pylint: disable=import-outside-toplevel
  try:
    spec = run_spec.read_file(_SPEC.value)
  except FileNotFoundError:
    raise ConfigError(f"--spec {_SPEC.value}: no such file.") from None
  except ValueError as e:
    raise ConfigError(f"--spec {_SPEC.value}: {e}") from None
  return spec_config(spec), [list(e) for e in spec.evaluations], spec.compared_fields


def main(argv):
  from tfx_jax.records import status  # pylint: disable=import-outside-toplevel
  started = status.process_start()  # where the run's startup seconds begin
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  config, evaluations, first_hparams = _run()
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
  result = trainer.train_and_evaluate(config, _WORKDIR.value, evaluations, started,
                                      first_hparams=first_hparams)
  if result.status == "diverged":
    sys.exit(1)


if __name__ == "__main__":
  run_main(main, FLAGS)
