"""The full run configuration with typed defaults, shared by ``configs/*.py``.

Every field a user may set exists here with a typed default, so configs can be
locked (a typo fails with a suggestion) and overridden from the command line
(``--config.model.activation=swiglu``). Optional fields are typed placeholders.
"""

from __future__ import annotations

import importlib.util
import pathlib
import types
from typing import Any, Mapping

import ml_collections
from ml_collections import config_dict

from tfx_jax.core import typed_config
from tfx_jax.core.errors import ConfigError, did_you_mean
from tfx_jax.model.config import ModelConfig
from tfx_jax.records.run_spec import RunSpec


def model_defaults() -> ml_collections.ConfigDict:
  """``config.model``: one field per :class:`ModelConfig` field, same defaults.

  ``model.dtype`` is the deprecated name of the top-level ``compute_dtype``
  (the one computation-dtype field): still accepted, unset by default.
  """
  model = typed_config.defaults(ModelConfig, skip=("dtype",))
  model.dtype = config_dict.placeholder(str)
  return model


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section, generated from the section dataclasses of
  ``run_config`` (their fields, types and comments say what each one means);
  config files change what they need, then lock."""
  from tfx_jax.run.config import SECTIONS  # pylint: disable=import-outside-toplevel
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "lm"  # lm | translate | mlm | classify (tfx_jax/tasks)
  c.model = model_defaults()
  for name, kind in SECTIONS.items():
    c[name] = typed_config.defaults(kind)
  # The computation dtype, float32 | bfloat16; parameters, optimizer state and
  # the loss's softmax statistics stay float32.
  c.compute_dtype = "float32"
  return c


def apply_preset(config: ml_collections.ConfigDict, row: Mapping[str, Any]) -> None:
  """Sets the fields of one row of a preset table (``configs/*.py``).

  A row maps section names (``model``, ``data``, ``train``, ...) to
  ``{field: value}``, and top-level fields (``compute_dtype``) to values.
  ``vocab_size`` is given once per row and sets both ``model.vocab_size`` and
  ``data.vocab_size``: the embedding and the tokenizer must agree. A field that
  the config does not have raises ``KeyError``: a typo in a table never adds one.
  """
  for key, value in row.items():
    if key == "vocab_size":
      _set(config.model, "model", vocab_size=value)
      _set(config.data, "data", vocab_size=value)
    elif isinstance(value, Mapping):
      if key not in config:
        raise KeyError(f"{key} is not a config section")
      _set(config[key], key, **value)
    else:
      _set(config, "config", **{key: value})


def select_preset(table: Mapping[str, Any], preset: str, file: str) -> Any:
  """``table[preset]``, or a ValueError listing the presets of ``file``."""
  if preset not in table:
    raise ValueError(f"unknown preset {preset!r} for configs/{file}; choose one of: "
                     f"{', '.join(table)}")
  return table[preset]


def _set(section: ml_collections.ConfigDict, where: str, /, **values) -> None:
  for key, value in values.items():
    if key not in section:
      raise KeyError(f"{where}.{key} is not a config field")
    setattr(section, key, value)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """``configs/lm.py:tiny`` -> that file's ``get_config("tiny")``.

  A missing file, or a config file that fails (an unknown preset, a bad
  table), is a ConfigError naming the spec.
  """
  path, _, preset = spec.partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"config file {path!r} does not exist.")
  try:
    module = load_config_module(path)
    return module.get_config(preset) if preset else module.get_config()
  except (ValueError, KeyError) as e:
    raise ConfigError(f"--config {spec}: {e}") from None


def load_config_module(path) -> types.ModuleType:
  """A config file as a module (``configs/`` is no package): its ``get_config``
  and its helpers, such as ``configs/lm.py``'s ``matched`` and ``moe_variant``,
  which the shipped experiments build their points with."""
  path = pathlib.Path(path)
  module_spec = importlib.util.spec_from_file_location(f"_tfx_config_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


# ------------------------------------------------------------- overrides
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def find_field(config, path: str) -> tuple[Any, str]:
  """(the ConfigDict holding ``path``'s last key, that key).

  A key that is not there is a ConfigError with a suggestion and the fields of
  the section it was looked up in: the one "did you mean" of the command line,
  the sweep and the benchmarks.
  """
  node, seen = config, []
  keys = path.split(".")
  for i, key in enumerate(keys):
    fields = list(node.keys()) if hasattr(node, "keys") else []
    if key not in fields:
      where = ".".join(["config"] + seen)
      hint = did_you_mean(key, fields, prefix="".join(f"{k}." for k in seen))
      raise ConfigError(f"{'.'.join(seen + [key])!r} is not a config field.{hint} "
                        f"Fields of {where}: {', '.join(sorted(fields))}.")
    if i == len(keys) - 1:
      return node, key
    node, seen = node[key], seen + [key]
  raise AssertionError(path)


def coerce(config, path: str, value: Any) -> Any:
  """``value`` (a command-line string or a Python value) as ``path``'s type,
  as ``--config.a.b=v`` parses it."""
  node, key = find_field(config, path)
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
    if kind is tuple:  # of ints (checkpoint.keep_steps): "18,27", "(18, 27)", "[]"
      inner = text.strip("()[] ")
      return tuple(int(v) for v in inner.split(",") if v.strip()) if inner else ()
  except ValueError:
    raise ConfigError(f"{path}={value!r} is not a valid {kind.__name__}.") from None
  return value


def apply_overrides(config, overrides: Mapping[str, Any]) -> None:
  """Sets each dotted path of ``overrides`` on the locked ``config``, typed."""
  for path, value in overrides.items():
    node, key = find_field(config, path)
    typed = coerce(config, path, value)
    try:
      setattr(node, key, typed)
    except (TypeError, ValueError) as e:
      kind = node.get_type(key).__name__
      raise ConfigError(f"{path}={value!r} does not fit the field's type "
                        f"({kind}): {e}") from None


def spec_config(spec: RunSpec) -> ml_collections.ConfigDict:
  """The locked config a run spec names: its file's preset, locked as
  ``--config`` locks it, with the spec's typed overrides and seed applied, the
  same values ``--config FILE --config.a.b=v ...`` would set."""
  config = load_config_file(spec.config)
  config.lock()
  apply_overrides(config, spec.config_overrides)
  return config


def unknown_override(argv: list[str]) -> str | None:
  """What is wrong with a ``--config.a.b=v`` of ``argv`` whose path is not a field
  of the ``--config`` file named there (a suggestion and the section's fields);
  None when every path is a field or the config file does not load."""
  spec = None
  for i, arg in enumerate(argv):
    if arg == "--config" and i + 1 < len(argv):
      spec = argv[i + 1]
    elif arg.startswith("--config="):
      spec = arg.split("=", 1)[1]
  if not spec:
    return None
  try:
    config = load_config_file(spec)
  except Exception:  # pylint: disable=broad-except
    return None
  for arg in argv[1:]:
    if arg.startswith("--config."):
      try:
        find_field(config, arg[len("--config."):].split("=", 1)[0])
      except ConfigError as e:
        return str(e)
  return None
