"""Per-module parameter table of a config, without allocating the parameters.

  python -m tfx_jax.summary --config configs/lm.py:llama_7b
  python -m tfx_jax.summary --config configs/lm.py:llama_7b --mesh data=2,fsdp=2,tensor=2

Shapes come from ``jax.eval_shape`` of the initialiser, so a 65B preset prints
in seconds. The table ends with ``params: <total>``, then ``active params``
(those one token computes with: of a mixture of experts' routed experts, the k
it is sent to) and the FLOPs per token of a forward and of a training step
(``flops_per_token``), which a comparison of dense and MoE models at matched
active or total parameters reads (configs/lm.py, ``moe_variant``), the budgets
a comparison can hold equal (``budgets:`` total and non-embedding parameters,
training FLOPs per token at train.seq_len, and the KV cache's bytes per token
in the compute dtype, with a recurrent layer's state per sequence:
configs/lm.py's ``matched``, docs/fair-comparisons.md), and the size of
the optimizer's state (``optim.optimizer``: AdamW two float32 moments per
parameter, Muon one for its matrices and two for the rest, Lion one,
Adafactor factored ones). With ``--mesh`` (no devices
needed) it adds each parameter's sharding under ``sharding.LOGICAL_RULES`` and
the block each device holds, then the memory per device of the parameters and
of the optimizer state (``optim.*`` of the config), the last two lines. Under
``model.parametrization`` mup or completep it prints the optimizer's parameter
groups with their multipliers at this size (``run/param_groups.py``).

The coordinate check (Yang et al. 2022; ``run/coord_check.py``):

  python -m tfx_jax.summary --config configs/lm.py:tiny \
      --config.model.parametrization=mup --config.model.mup_base_d_model=64 \
      --coord-check --widths 64,128,256,512 [--steps 5] [--out coord_check.png]

trains the config at each width a few steps on the same batches and prints,
per step, the RMS of each sublayer's output, of the attention logits and of
the output logits against the width with their log-log slopes, and plots them
to ``--out``.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from tfx_jax.core.errors import ConfigError
from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.run import config as run_config
from tfx_jax.run import footprint
from tfx_jax.run import param_groups


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
_COORD_CHECK = flags.DEFINE_bool(
    "coord-check", False, "Train the config a few steps at each of --widths and print "
    "the RMS of every sublayer's output, of the attention logits and of the output "
    "logits against the width (Yang et al. 2022's coordinate check).", flag_values=FLAGS)
_WIDTHS = flags.DEFINE_string(
    "widths", None, "The coordinate check's widths (model.d_model), comma-separated; "
    "default 64,128,256,512.", flag_values=FLAGS)
_STEPS = flags.DEFINE_integer(
    "steps", None, "The coordinate check's updates per width (default 5).",
    flag_values=FLAGS)
_OUT = flags.DEFINE_string(
    "out", None, "Where the coordinate check's figure is written (default "
    "./coord_check.png).", flag_values=FLAGS)


def _coord_check() -> None:
  """The coordinate check of the config (``run/coord_check.py``)."""
  from tfx_jax.run import coord_check  # pylint: disable=import-outside-toplevel
  widths = (coord_check.parse_widths(_WIDTHS.value) if _WIDTHS.value is not None
            else coord_check.DEFAULT_WIDTHS)
  steps = coord_check.DEFAULT_STEPS if _STEPS.value is None else _STEPS.value
  coord_check.run(_CONFIG.value, widths, steps, _OUT.value or "coord_check.png")


def main(argv):
  del argv
  if not _COORD_CHECK.value:
    given = [f"--{name}" for name, flag in (("widths", _WIDTHS), ("steps", _STEPS),
                                            ("out", _OUT)) if flag.value is not None]
    if given:
      raise ConfigError(f"{', '.join(given)} set the coordinate check's options: add "
                        "--coord-check to run it (or leave them out).")
  elif _MESH.value is not None:
    raise ConfigError("--coord-check trains on this machine's devices; --mesh describes "
                      "another machine's sharding: leave one of them out.")
  if _COORD_CHECK.value:
    return _coord_check()
  run = run_config.resolve(_CONFIG.value)
  mesh = footprint.parse_mesh(_MESH.value) if _MESH.value is not None else None
  shapes = footprint.param_shapes(run.model)
  print(footprint.format_table(shapes, _DEPTH.value))
  print(footprint.format_counts(run.model, shapes, run.train.seq_len))
  print(footprint.format_budgets(run.model, run.train.seq_len, shapes))
  print(footprint.optimizer_state(run, run.model))
  groups = param_groups.for_run(run.model, run.optim)  # None under sp
  if groups is not None:
    print(param_groups.format_groups(groups))
  if mesh is not None:
    report = footprint.sharding_report(run, run.model, mesh)
    print()
    print(report)


if __name__ == "__main__":
  run_main(main, FLAGS)
