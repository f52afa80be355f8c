"""Compile a run ahead of time for a machine, and say whether it fits there.

  python -m tfx_jax.compile --config configs/lm.py:llama_7b --topology v5e-16 \\
      --config.mesh.data=1 --config.mesh.fsdp=-1 --config.train.batch_size=16
  python -m tfx_jax.compile --config configs/lm.py:tiny --topology cpu-8 --json out.json
  ./launch.sh compile ARGS...

The run is built as training builds it (``run_config.resolve``, the mesh rules,
the sharded state, ``run_setup.ShardedRun``'s train and evaluation steps) on
the devices of ``--topology`` (``scale/topology.py``: Cloud TPU names such as
v5e-16, v4-32, v5p-128, v6e-64, the chip-grid form v5e:4x4, or cpu-N), and
compiled with the compiler of that machine: for a TPU, libtpu on this CPU
(the ``tpu-aot`` extra), as MaxText's ``train_compile.py`` and AXLearn's AOT
compilation do. It prints, per device:

* memory: parameters, optimizer state, the other arguments (batch, step, RNG),
  temporaries (activations), outputs, code; their total against the chip's
  HBM: fits / does not fit, and when not, the settings that would help, each
  with its own compiled total where the model is small enough to compile
  again quickly (``--knobs``);
* FLOPs per step: the analytic 6 N D (+ attention) count, the compiled
  program's (each loop body times its trip count, ``scale/hlo.py``) and XLA's
  own ``cost_analysis`` (loop bodies once);
* the collectives of the compiled step: count and bytes per step;
* a roofline estimate of the step time and the MFU it implies
  (``scale/roofline.py``, from ``scale/chips.py``'s published peaks).

Memory, FLOPs and collectives are the compiler's; the time and MFU are
estimates. Exit status 0: fits (or cpu-N, which has no limit); 1: does not
fit; 2: a bad config or topology (before anything is compiled).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.core.errors import ConfigError
from tfx_jax.scale import topology as topology_lib


def _explain(argv: list[str]) -> str | None:
  from tfx_jax.run.config_base import unknown_override  # pylint: disable=import-outside-toplevel
  return unknown_override(argv)


FLAGS = new_flags(explain=_explain)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file[:preset].", lock_config=True, flag_values=FLAGS)
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "The machine to compile for: v5e-16, v4-32, v5p-128, v6e-64, "
    "v5e:4x4, cpu-8, ...", flag_values=FLAGS)
_JSON = flags.DEFINE_string("json", None, "Also write the report as JSON here.",
                            flag_values=FLAGS)
_KNOBS = flags.DEFINE_enum(
    "knobs", "auto", ["auto", "compile", "list"],
    "When the run does not fit: compile each helping setting to give its total "
    "(compile), only name them (list), or compile them for models under 2B "
    "parameters (auto).", flag_values=FLAGS)

def main(argv):
  del argv
  if _TOPOLOGY.value is None:
    raise ConfigError("--topology is required: the machine to compile for, e.g. "
                      "v5e-16, v4-32, v5p-128, v6e-64, v5e:4x4 or cpu-8.")
  topology = topology_lib.parse(_TOPOLOGY.value)
  if topology.platform == "tpu" and not topology_lib.libtpu_available():
    raise ConfigError(f"--topology={topology.name} compiles for TPU, which needs "
                      f"libtpu: {topology_lib.INSTALL_HINT}.")
  topology_lib.prepare_host(topology)
  # Deferred: jax starts after XLA_FLAGS is set for cpu-N.
  from tfx_jax.scale import plan  # pylint: disable=import-outside-toplevel
  report = plan.check(_CONFIG.value, topology, knobs=_KNOBS.value,
                      name=config_flags.get_config_filename(FLAGS["config"]))
  print(plan.format_report(report), flush=True)
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump(report.to_json(), f, indent=1)
  return 0 if report.fits is not False else 1


if __name__ == "__main__":
  run_main(main, FLAGS)
