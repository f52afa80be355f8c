"""``python -m tfx_jax.sweep ... --dry-run --topology NAME``: does every run of
a sweep compile and fit on that machine, before anything is submitted?

Each run's config is built as the sweep builds it (the base config, the
sweep's overrides, the run's axis, tuned and seed values) and its train and
evaluation steps are traced for the topology's devices. Runs whose traced
programs are the same text (a seed, or a traced hyperparameter such as the
learning rate, does not change the program) share one compilation, so a
sweep of 3 points x 5 seeds x 4 learning rates compiles 3 programs.
"""

from __future__ import annotations

import hashlib

from tfx_jax.run import config as run_config
from tfx_jax.run.config_base import apply_overrides, load_config_file
from tfx_jax.core.errors import ConfigError
from tfx_jax.scale import plan
from tfx_jax.scale import topology as topology_lib


def check_runs(base_spec: str, runs, topology: topology_lib.Topology) -> int:
  """Prints one line per run (memory per device, fits); 1 if any does not fit."""
  devices = topology_lib.devices(topology)
  hbm = int(topology.chip.limit_gib * plan.GIB) if topology.chip else None
  compiled: dict[str, tuple[str, bool | None]] = {}
  width = max(len(r.name) for r in runs)
  fails = 0
  print(f"compile check on {topology.name}: {topology.describe()}")
  for r in runs:
    config = load_config_file(base_spec)
    apply_overrides(config, r.overrides)
    run = run_config.resolve(config)
    try:
      sharded, train, evaluated = plan.lower_run(run, devices)
    except ConfigError as e:
      raise ConfigError(f"run {r.name}: {e}") from None
    key = hashlib.sha256((train.as_text() + evaluated.as_text()).encode()).hexdigest()
    if key not in compiled:
      compiled[key] = _compile(run, sharded, train, evaluated, hbm)
    text, fits = compiled[key]
    fails += fits is False
    print(f"  {r.name:<{width}}  {text}")
  programs = len(compiled)
  print(f"{len(runs)} runs, {programs} distinct program{'s' * (programs != 1)} compiled; "
        + (f"{fails} do not fit" if fails else
           "all fit" if hbm else "no memory limit (cpu topology)"))
  return 1 if fails else 0


def _compile(run, sharded, train, evaluated, hbm) -> tuple[str, bool | None]:
  try:
    built = plan.Compiled(sharded, train.compile(), evaluated.compile(), {})
  except Exception as e:  # pylint: disable=broad-except
    refused = plan.refusal(e)
    if refused is None:
      raise
    return f"does not fit: the compiler refused ({refused[:160]})", False
  memory = max(m.total for m in plan.step_memory(run, built))
  if hbm is None:
    return f"{plan.format_size(memory)} per device", None
  fits = memory <= hbm
  return (f"{plan.format_size(memory)} of {plan.format_size(hbm)} per device: "
          f"{'fits' if fits else 'does NOT fit'}"), fits
