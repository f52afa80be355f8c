"""A sweep is checked whole before anything runs.

For every run: load the base config file, apply the run's overrides exactly as
``python -m tfx_jax.train --config.a.b=v`` would (same types), and run the
trainer's own validation. The first problem is a ConfigError naming the axis,
the field and the valid choices; the caller exits 2 having written nothing.
"""

from __future__ import annotations

import difflib
import importlib.util
import pathlib
from typing import Any, Mapping, Sequence

from tfx_jax.errors import ConfigError
from tfx_jax.sweep.spec import Axis, Run

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def load_base_config(spec: str):
  """``configs/lm.py:tiny`` -> the locked ConfigDict (ConfigError if it fails)."""
  path, _, preset = spec.partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"config file {path!r} does not exist.")
  module_spec = importlib.util.spec_from_file_location(
      f"_sweep_config_{pathlib.Path(path).stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    return module.get_config(preset) if preset else module.get_config()
  except (ValueError, KeyError) as e:
    raise ConfigError(f"--config {spec}: {e}") from None


def _parent(config, path: str):
  """The ConfigDict holding ``path``'s last key (ConfigError naming valid fields)."""
  node, seen = config, []
  keys = path.split(".")
  for key in keys:
    fields = list(node.keys()) if hasattr(node, "keys") else []
    if key not in fields:
      where = ".".join(seen) or "the config"
      close = difflib.get_close_matches(key, fields, n=1, cutoff=0.4)
      hint = f" Did you mean {'.'.join(seen + [close[0]])!r}?" if close else ""
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


def validate_config(config) -> None:
  """The run's own config validation (``run_setup.validate_run_config``)."""
  # Deferred: jax loads only once a sweep is validated (fast --help, --status).
  from tfx_jax import run_setup  # pylint: disable=import-outside-toplevel
  run_setup.validate_run_config(config)




def check_runs(base_spec: str, axes: Sequence[Axis], runs: Sequence[Run]) -> None:
  """Validates every run's config; a ConfigError names the axis and the run."""
  owner = {f: a.label for a in axes for f in a.fields}
  for run in runs:
    config = load_base_config(base_spec)
    for path, value in run.overrides.items():
      where = f"axis {owner[path]}" if path in owner else "override"
      try:
        apply_overrides(config, {path: value})
      except ConfigError as e:
        raise ConfigError(f"{where} (run {run.name}): {e}") from None
    try:
      validate_config(config)
    except ConfigError as e:
      fields = [f for v in run.values for f in v]
      labels = [a.label for a in axes]
      where = ((("axis " if len(labels) == 1 else "axes ") + ", ".join(labels))
               if fields else "base config")
      raise ConfigError(f"{where} (run {run.name}): {e}") from None


def base_values(base_spec: str, overrides: Mapping[str, Any], fields: Sequence[str]
                ) -> dict[str, Any]:
  """The base config's value (after the sweep's overrides) of each of ``fields``."""
  config = load_base_config(base_spec)
  apply_overrides(config, overrides)
  out = {}
  for path in fields:
    node, key = _parent(config, path)
    out[path] = node[key]
  return out
