"""Per-module parameter table of a config, without allocating the parameters.

  python -m tfx_jax.summary --config configs/lm.py:llama_7b
  python -m tfx_jax.summary --config configs/lm.py:llama_7b --mesh data=2,fsdp=2,tensor=2

Shapes come from ``jax.eval_shape`` of the initialiser, so a 65B preset prints
in seconds. The table ends with ``params: <total>``, then ``active params``
(those one token computes with: of a mixture of experts' routed experts, the k
it is sent to) and the FLOPs per token of a forward and of a training step
(``flops_per_token``), which a comparison of dense and MoE models at matched
active or total parameters reads (configs/lm.py, ``moe_variant``), and the size of
the optimizer's state (``optim.optimizer``: AdamW two float32 moments per
parameter, Muon one for its matrices and two for the rest, Lion one,
Adafactor factored ones). With ``--mesh`` (no devices
needed) it adds each parameter's sharding under ``sharding.LOGICAL_RULES`` and
the block each device holds, then the memory per device of the parameters and
of the optimizer state (``optim.*`` of the config), the last two lines.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.run import config as run_config
from tfx_jax.run import footprint


def _explain(argv: list[str]) -> str | None:
  """Names a ``--config.*`` override that is not a field (loaded only on an error)."""
  from tfx_jax.run.config_base import unknown_override  # pylint: disable=import-outside-toplevel
  return unknown_override(argv)


FLAGS = new_flags(explain=_explain)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file[:preset].", lock_config=True, flag_values=FLAGS)
_DEPTH = flags.DEFINE_integer(
    "depth", 3, "How many levels of module names to group by.", flag_values=FLAGS)
_MESH = flags.DEFINE_string(
    "mesh", None, "A mesh to show the sharding and per-device memory on, e.g. "
    "data=2,fsdp=2,tensor=2 (axes left out have size 1).", flag_values=FLAGS)


def main(argv):
  del argv
  run = run_config.resolve(_CONFIG.value)
  mesh = footprint.parse_mesh(_MESH.value) if _MESH.value is not None else None
  shapes = footprint.param_shapes(run.model)
  print(footprint.format_table(shapes, _DEPTH.value))
  print(footprint.format_counts(run.model, shapes, run.train.seq_len))
  print(footprint.optimizer_state(run, run.model))
  if mesh is not None:
    report = footprint.sharding_report(run, run.model, mesh)
    print()
    print(report)


if __name__ == "__main__":
  run_main(main, FLAGS)
