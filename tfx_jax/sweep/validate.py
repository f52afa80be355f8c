"""A sweep is checked whole before anything runs.

For every run: load the base config file, apply the run's overrides exactly as
``python -m tfx_jax.train --config.a.b=v`` would (same types), and run the
trainer's own validation (``run_config``: no devices, so a sweep for an 8-GPU
node is checked on a laptop). The first problem is a ConfigError naming the
field and the valid choices (and the axis, where its value is the cause); the
caller exits 2 having written nothing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tfx_jax.errors import ConfigError, did_you_mean
from tfx_jax.config_base import load_config_file
from tfx_jax.sweep.spec import Axis, Run

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _parent(config, path: str):
  """The ConfigDict holding ``path``'s last key (ConfigError naming valid fields)."""
  node, seen = config, []
  keys = path.split(".")
  for key in keys:
    fields = list(node.keys()) if hasattr(node, "keys") else []
    if key not in fields:
      where = ".".join(seen) or "the config"
      hint = did_you_mean(key, fields, prefix="".join(f"{k}." for k in seen))
      raise ConfigError(f"{path!r} is not a config field.{hint} Fields of {where}: "
                        f"{', '.join(sorted(fields))}.")
    if key is keys[-1]:
      return node, key
    node, seen = node[key], seen + [key]
  raise AssertionError(path)


def coerce(config, path: str, value: Any) -> Any:
  """``value`` (a command-line string or a Python value) as ``path``'s type."""
  node, key = _parent(config, path)
  if hasattr(node[key], "keys"):
    raise ConfigError(f"{path!r} is a section, not a field; set one of its fields: "
                      f"{', '.join(sorted(node[key].keys()))}.")
  kind = node.get_type(key)
  if not isinstance(value, str) or kind is str:
    return value
  text = value.strip()
  try:
    if kind is bool:
      if text.lower() not in _TRUE + _FALSE:
        raise ValueError
      return text.lower() in _TRUE
    if kind is int:
      return int(text)
    if kind is float:
      return float(text)
  except ValueError:
    raise ConfigError(f"{path}={value!r} is not a valid {kind.__name__}.") from None
  return value


def apply_overrides(config, overrides: Mapping[str, Any]) -> None:
  """Sets each dotted path of ``overrides`` on the locked ``config``, typed."""
  for path, value in overrides.items():
    node, key = _parent(config, path)
    typed = coerce(config, path, value)
    try:
      setattr(node, key, typed)
    except (TypeError, ValueError) as e:
      kind = node.get_type(key).__name__
      raise ConfigError(f"{path}={value!r} does not fit the field's type "
                        f"({kind}): {e}") from None


def _validate(config) -> None:
  # Deferred: jax loads only once a sweep is validated (fast --help).
  from tfx_jax import run_config  # pylint: disable=import-outside-toplevel
  run_config.validate_run_config(config)


def check_runs(base_spec: str, axes: Sequence[Axis], runs: Sequence[Run]) -> None:
  """Validates every run's config, without devices (``run_config``).

  A ConfigError names the field that is wrong; it names an axis and a run
  only when that axis's value is the cause: a base config (with the sweep's
  overrides) that fails on its own is reported as such, once.
  """
  owner = {f: f"axis {a.label}" for a in axes for f in a.fields}
  owner.update({f: f"tune {f}" for run in runs for f in run.tuned})
  for run in runs:
    config = load_config_file(base_spec)
    for path, value in run.overrides.items():
      where = owner.get(path, "override")
      try:
        apply_overrides(config, {path: value})
      except ConfigError as e:
        raise ConfigError(f"{where} (run {run.name}): {e}") from None
    try:
      _validate(config)
    except ConfigError as e:
      shared = {k: v for k, v in run.overrides.items() if k not in owner}
      if _fails(base_spec, shared):
        raise ConfigError(f"the base config {base_spec} with the sweep's overrides "
                          f"(every run has it): {_fails(base_spec, shared)}") from None
      # The axis (or tuned field) whose value fails on its own; else their combination.
      labels = sorted({owner[f] for value in [*run.values, run.tuned] for f in value})
      alone = [label for label in labels if _fails(base_spec, {
          **shared, **{k: v for k, v in run.overrides.items() if owner.get(k) == label}})]
      raise ConfigError(f"{', '.join(alone or labels)} (run {run.name}): {e}") from None


def _fails(base_spec: str, overrides: Mapping[str, Any]) -> str:
  """The validation error of the base config with ``overrides`` ("" if valid)."""
  config = load_config_file(base_spec)
  apply_overrides(config, overrides)
  try:
    _validate(config)
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
    node, key = _parent(config, path)
    out[path] = node[key]
  return out
