"""A sweep is checked whole before anything runs.

For every run: load the base config file, apply the run's typed overrides
(``config_base.apply_overrides``: the values the run process applies from its
``run_spec.json``, ``config_base.spec_config``, and the ones ``--config.a.b=v``
parses to), and resolve it as the trainer does (``run_config.resolve``: no
devices, so a sweep for an 8-GPU node is checked on a laptop). The first
problem is a ConfigError naming the field and the valid choices (and the axis,
where its value is the cause); the caller exits 2 having written nothing.

A setting that every run shares (the base config's, or an override of the whole
sweep) may have no effect at some points: a RoPE scaling factor at
``rope_scaling=none``, in a sweep over the scaling methods with their baseline.
A single run refuses such a setting (``errors.InactiveSetting``); a sweep runs
those points with the field at its default, which computes the same thing, and
notes it for them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tfx_jax.run.config_base import apply_overrides, coerce, find_field, load_config_file
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.sweep.spec import Axis, Run

__all__ = ["apply_overrides", "base_values", "check_runs", "coerce"]


def _resolve(config, own: Mapping[str, str]) -> list[tuple[str, Any, Any, str]]:
  """Resolves ``config`` as its run would, setting every inactive setting that is
  not one of ``own`` (the fields the run's own axis values and tuned values set)
  to its default: [(field, value, default, why)] for each one so set."""
  # Deferred: jax loads only once a sweep is validated (fast --help).
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  inactive = []
  while True:
    try:
      run_config.resolve(config)
      return inactive
    except InactiveSetting as e:
      if e.field in own or any(f == e.field for f, *_ in inactive):
        raise
      node, key = find_field(config, e.field)
      inactive.append((e.field, node[key], e.default, str(e)))
      setattr(node, key, e.default)


def check_runs(base_spec: str, axes: Sequence[Axis], runs: Sequence[Run]
               ) -> dict[str, list[str]]:
  """Validates every run's config, without devices (``run_config``).

  A ConfigError names the field that is wrong; it names an axis and a run
  only when that axis's value is the cause: a base config (with the sweep's
  overrides) that fails on its own is reported as such, once. A shared setting
  that is inactive at a run is set to its default in that run's overrides;
  returns {run name: notes saying which} for the runs that have one.
  """
  owner = {f: f"axis {a.label}" for a in axes for f in a.fields}
  owner.update({f: f"tune {f}" for run in runs for f in run.tuned})
  notes: dict[str, list[str]] = {}
  for run in runs:
    config = load_config_file(base_spec)
    for path, value in run.overrides.items():
      where = owner.get(path, "override")
      try:
        apply_overrides(config, {path: value})
      except ConfigError as e:
        raise ConfigError(f"{where} (run {run.name}): {e}") from None
    own = {f for value in [*run.values, run.tuned] for f in value}
    try:
      inactive = _resolve(config, own)
    except ConfigError as e:
      shared = {k: v for k, v in run.overrides.items() if k not in owner}
      if _fails(base_spec, shared):
        raise ConfigError(f"the base config {base_spec} with the sweep's overrides "
                          f"(every run has it): {_fails(base_spec, shared)}") from None
      # The axis (or tuned field) whose value fails on its own; else their combination.
      labels = sorted({owner[f] for f in own})
      alone = [label for label in labels if _fails(base_spec, {
          **shared, **{k: v for k, v in run.overrides.items() if owner.get(k) == label}})]
      raise ConfigError(f"{', '.join(alone or labels)} (run {run.name}): {e}") from None
    for field, value, default, _ in inactive:
      run.overrides[field] = default
      notes.setdefault(run.name, []).append(
          f"{field}={value!r} has no effect at this point; the run leaves it at "
          f"{default!r}")
  return notes


def _fails(base_spec: str, overrides: Mapping[str, Any]) -> str:
  """The validation error of the base config with ``overrides`` ("" if valid),
  shared settings that are inactive allowed as in a sweep."""
  config = load_config_file(base_spec)
  apply_overrides(config, overrides)
  try:
    _resolve(config, own=())
  except ConfigError as e:
    return str(e)
  return ""


def base_values(base_spec: str, overrides: Mapping[str, Any], fields: Sequence[str]
                ) -> dict[str, Any]:
  """The base config's value (after the sweep's overrides) of each of ``fields``."""
  config = load_config_file(base_spec)
  apply_overrides(config, overrides)
  out = {}
  for path in fields:
    node, key = find_field(config, path)
    out[path] = node[key]
  return out
