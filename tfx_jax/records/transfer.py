"""Tune small, transfer up: which points of a sweep with ``tune_at`` tune,
and where every other point's tuned values come from.

``Sweep(tune=..., tune_at={"model.d_model": 64})`` names proxy sizes: values
of a field of one of the sweep's axes (a size axis, possibly zipped with
other fields: one field of it is enough; a field of an axis that is not a
size is allowed as well, its values then ordered as the axis lists them).
A point tunes (every tuned value x the declared seeds) where its value of
each named field is a proxy size; every other point takes the values chosen
at its *source*: the same point with each named axis at the nearest proxy
size below its own (the smallest proxy size where none is below). Sizes are
ordered by the field's value where the axis's values of it are all numbers,
else by their order in the axis.

The value carries over by the point's parametrization (``model.parametrization``,
``model/parametrization.py``): under ``mup`` and ``completep`` the learning
rate is in base units (the width and depth multipliers act through the
optimizer's parameter groups), so the same number is the transferred value
those rules prescribe; under ``sp`` the same number is a plain copy, which
nothing makes hold as width grows (Yang et al. 2022, Figure 1: the optimum
moves), and the report flags it.

This module reads the record only (its axes, ``tune_at``, ``base_values``):
the sweep (``sweep.spec.expand``) and the report (``report.sections.provenance``)
ask it the same questions.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records.sweep import tune_at_pairs

__all__ = ["axis_sources", "expected_to_hold", "parametrization", "plan", "record_sources",
           "size_label", "source_key", "transferred", "tune_at_pairs", "tune_at_text"]

PARAMETRIZATION = "model.parametrization"
# How a transferred value carries over, by parametrization.
RULES = {"sp": "a plain copy (not expected to hold under sp)",
         "mup": "identity in base units (muP)",
         "completep": "identity in base units (CompleteP)"}
DEFAULT_PARAMETRIZATION = "sp"


def tune_at_text(tune_at: Sequence[tuple[str, Sequence[Any]]]) -> str:
  """``model.d_model=32,64``: the proxy sizes as --tune-at writes them."""
  return " ".join(f"{field}={','.join(map(str, values))}" for field, values in tune_at)


def _numeric(values: Sequence[Any]) -> bool:
  return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def axis_sources(values: Sequence[Mapping[str, Any]], field: str, proxies: Sequence[Any],
                 label: str) -> list[int]:
  """For each value of an axis (its override dicts), the index of the value
  whose tuned values it takes: itself at a proxy size, else the nearest proxy
  size below, else the smallest. ConfigError where a value of the axis does
  not set ``field``, a proxy size is not one of its values (naming them), or
  two values of one size make "the nearest" ambiguous."""
  sizes = []
  for value in values:
    if field not in value:
      raise ConfigError(f"tune_at {field}: the value {dict(value)} of axis {label} does not "
                        f"set {field}; every value of the axis tune_at names sets its size.")
    sizes.append(value[field])
  for proxy in proxies:
    if proxy not in sizes:
      raise ConfigError(f"tune_at {field}={proxy!r}: not a value of axis {label}; choose "
                        f"from {', '.join(dict.fromkeys(map(str, sizes)))}.")
  order = (lambda i: sizes[i]) if _numeric(sizes) else (lambda i: i)
  tuned = [i for i, s in enumerate(sizes) if s in proxies]
  out = []
  for i, size in enumerate(sizes):
    if size in proxies:
      out.append(i)
      continue
    below = [j for j in tuned if order(j) < order(i)]
    pick = max(below, key=order) if below else min(tuned, key=order)
    ties = [j for j in tuned if order(j) == order(pick) and sizes[j] == sizes[pick]]
    if len(ties) > 1:
      raise ConfigError(f"tune_at {field}={sizes[pick]!r}: {len(ties)} values of axis {label} "
                        f"have this size, so the value {dict(values[i])} has no one source; "
                        "name a field that tells them apart.")
    out.append(pick)
  return out


def plan(axes: Sequence[Any], tune_at: Sequence[tuple[str, Sequence[Any]]]
         ) -> dict[int, list[int]]:
  """{axis index: the source of each of its values (``axis_sources``)} of the
  axes ``tune_at`` names (``axes``: anything with ``label``, ``fields`` and
  ``values``). ConfigError where a field is no axis's, or two name one axis."""
  out: dict[int, list[int]] = {}
  fields = [f for a in axes for f in a.fields]
  for field, proxies in tune_at:
    owner = [i for i, a in enumerate(axes) if field in a.fields]
    if not owner:
      raise ConfigError(f"tune_at {field}: no axis sets {field}; tune_at names a field of "
                        f"a (size) axis: {list(dict.fromkeys(fields)) or 'the sweep has no axis'}.")
    ai = owner[0]
    if ai in out:
      raise ConfigError(f"tune_at {field}: axis {axes[ai].label} is named by another field "
                        "of tune_at already; name one field of an axis.")
    out[ai] = axis_sources(axes[ai].values, field, list(proxies), axes[ai].label)
  return out


def source_key(sources: Mapping[int, Sequence[int]], key: Sequence[int]) -> tuple[int, ...]:
  """The point whose tuned values the point ``key`` takes (itself where it tunes)."""
  return tuple(sources[ai][vi] if ai in sources else vi for ai, vi in enumerate(key))


def record_sources(record) -> dict[int, list[int]]:
  """``plan`` of a ``SweepRecord`` ({} where it has no ``tune_at``)."""
  return plan(record.axes, record.tune_at) if record.tune_at else {}


def transferred(record, key: Sequence[int]) -> tuple[int, ...] | None:
  """The source point of a transferred point, None where the point tunes."""
  sources = record_sources(record)
  source = source_key(sources, key)
  return None if source == tuple(key) else source


def size_label(record, key: Sequence[int]) -> str:
  """A point's proxy size as the report names it: ``d_model=64`` (each
  ``tune_at`` field at the point's value, its last dotted part)."""
  parts = []
  for field, _ in record.tune_at:
    ai = next(i for i, a in enumerate(record.axes) if field in a.fields)
    parts.append(f"{field.split('.')[-1]}={record.axes[ai].values[key[ai]][field]}")
  return ",".join(parts)


def parametrization(record, overrides: Mapping[str, Any]) -> str:
  """A run's ``model.parametrization``: its overrides' (the sweep's, its axis
  values'), else the base config's (``record.base_values``), else ``sp``."""
  return str(overrides.get(PARAMETRIZATION,
                           record.base_values.get(PARAMETRIZATION, DEFAULT_PARAMETRIZATION)))


def expected_to_hold(parametrization_name: str) -> bool:
  """Whether a transferred learning rate is expected to stay optimal: under
  muP and CompleteP (their rules, in base units), not under sp."""
  return parametrization_name != "sp"
