"""A config section as a frozen dataclass: its ConfigDict defaults and its typed reading.

Every section of a run config (``model``, ``data``, ``train``, ``eval``,
``checkpoint``, ``optim``, ``finetune``, ``mesh``) is a frozen dataclass whose
fields carry the types and defaults; ``Literal`` fields carry their choices.
The locked ``ConfigDict`` that config files and ``--config.*`` flags edit is
generated from them (:func:`defaults`), and read back into the dataclass once
(:func:`read`), with an error that names the field, the value and the valid
choices. A field typed ``str | None`` is optional: an unset placeholder in the
ConfigDict, ``None`` in the dataclass. A field typed ``tuple[int, ...]`` holds
a tuple of integers (a list is read as one).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal, Mapping, TypeVar, get_args, get_origin, get_type_hints

import ml_collections
from ml_collections import config_dict

from tfx_jax.core.errors import ConfigError, did_you_mean

T = TypeVar("T")


@functools.cache
def field_types(cls) -> dict[str, Any]:
  """{field name: its resolved annotation} of a dataclass."""
  hints = get_type_hints(cls, include_extras=False)
  return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def choices(kind) -> tuple | None:
  """The values of a ``Literal`` type (None for any other type)."""
  return get_args(kind) if get_origin(kind) is Literal else None


def _optional(kind) -> bool:
  return type(None) in get_args(kind) and choices(kind) is None


def defaults(cls, *, skip: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """A ConfigDict with one field per dataclass field, at its default; optional
  (``str | None``) fields are typed placeholders, so they can be set from the
  command line."""
  out = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    if f.name in skip:
      continue
    if _optional(field_types(cls)[f.name]):
      setattr(out, f.name, config_dict.placeholder(str))
    else:
      setattr(out, f.name, f.default)
  return out


def check_value(section: str, name: str, kind: Any, value: Any) -> Any:
  """``value`` checked against the field's type (ints widen to floats)."""
  where = f"{section}.{name}" if section else name
  options = choices(kind)
  if options is not None:
    if value not in options:
      raise ConfigError(f"{where}={value!r} is not a valid choice; choose one of: "
                        f"{', '.join(map(str, options))}.")
    return value
  if _optional(kind):
    if value is not None and not isinstance(value, str):
      raise ConfigError(f"{where} must be a string, got {value!r}.")
    return value
  if kind is bool:
    if not isinstance(value, bool):
      raise ConfigError(f"{where} must be true or false, got {value!r}.")
  elif kind is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError(f"{where} must be an integer, got {value!r}.")
  elif kind is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{where} must be a number, got {value!r}.")
    value = float(value)
    if not math.isfinite(value):
      raise ConfigError(f"{where} must be finite, got {value!r}.")
  elif kind is str and not isinstance(value, str):
    raise ConfigError(f"{where} must be a string, got {value!r}.")
  elif get_origin(kind) is tuple:
    item = get_args(kind)[0]
    if not isinstance(value, (tuple, list)):
      raise ConfigError(f"{where} must be a tuple of {item.__name__}s, got {value!r}.")
    value = tuple(check_value(section, f"{name}[{i}]", item, v) for i, v in enumerate(value))
  return value


def read(cls: type[T], section: str, values: Mapping[str, Any] | Any) -> T:
  """The dataclass ``cls`` from a ConfigDict section or a mapping, typed.

  A key that is not a field is a ConfigError with a suggestion and the valid
  fields; an unset placeholder (None) of a non-optional field keeps the
  default. Cross-field rules are the caller's (each section's ``check``).
  """
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  kinds = field_types(cls)
  out = {}
  for key, value in dict(values).items():
    if key not in kinds:
      hint = did_you_mean(key, kinds)
      raise ConfigError(f"{section}.{key} is not a {section} field.{hint} Valid fields: "
                        f"{', '.join(sorted(kinds))}.")
    if value is None and not _optional(kinds[key]):
      continue
    out[key] = check_value(section, key, kinds[key], value)
  return cls(**out)


def need(ok: bool, field: str, value: Any, what: str) -> None:
  """A range or cross-field rule: ConfigError ``field=value is not valid: what.``"""
  if not ok:
    raise ConfigError(f"{field}={value!r} is not valid: {what}.")


def as_dict(section: Any) -> dict[str, Any]:
  """A section dataclass as the ConfigDict section it was read from."""
  return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
