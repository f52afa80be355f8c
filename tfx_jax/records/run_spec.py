"""``<run>/run_spec.json``: what one run of a sweep trains, typed once.

The sweep validates each run (``sweep.validate``: its overrides as the
fields' own Python types) and writes this record into the run's directory
before it starts it; the run process reads it back
(``python -m tfx_jax.train --spec <run>/run_spec.json --workdir <run>``) and
applies the values as they are, so a learning rate is a float from the
sweep's validation to the trained config, never a flag string parsed again.
A report reads the values a run used from here (``report.collect``).

  {"version": 1, "sweep": "act", "name": "activation-swiglu_s0",
   "config": "configs/lm.py:tiny",
   "overrides": {"train.num_steps": 50, "model.activation": "swiglu",
                 "optim.learning_rate": 0.003},
   "seed": 0, "evaluations": [["--split", "test"]],
   "axis_fields": ["model.activation"], "tuned_fields": ["optim.learning_rate"]}

Runs launched before this file existed have none: their values are those of
their ``sweep.json`` entry (``of_entry``), which is what their command line
carried.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

from tfx_jax.core import atomic as files
from tfx_jax.records import serial
from tfx_jax.records.ladder import BUDGET_FIELD
from tfx_jax.records.sweep import RunEntry, SweepRecord

FILENAME = "run_spec.json"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run as its process trains it: the config file and preset, the typed
  overrides, the seed and the evaluations to run after the last step, with
  the fields the sweep compares (its axes' fields and this run's tuned
  fields, which TensorBoard's HParams view lists first)."""
  config: str  # "configs/lm.py:tiny"
  # {dotted path: value of the field's own type}: the sweep's overrides, the
  # run's axis values and tuned values, in the order they apply (the seed apart).
  overrides: Mapping[str, Any]
  seed: int
  # ``python -m tfx_jax.evaluate`` argument lists the run process runs after
  # training (none where the sweep runs them as commands of their own).
  evaluations: tuple[tuple[str, ...], ...] = ()
  axis_fields: tuple[str, ...] = ()
  tuned_fields: tuple[str, ...] = ()
  sweep: str = ""
  name: str = ""

  def __post_init__(self):
    if "seed" in self.overrides:
      raise ValueError(f"{FILENAME}: the seed is its own field, not an override.")
    missing = [f for f in self.tuned_fields if f not in self.overrides]
    if missing:
      raise ValueError(f"{FILENAME}: tuned fields {missing} have no value in the overrides.")

  @property
  def config_overrides(self) -> dict[str, Any]:
    """Every ``--config.a.b`` the run applies to its config file, the seed last."""
    return {**self.overrides, "seed": self.seed}

  @property
  def tuned(self) -> dict[str, Any]:
    """{path: value} of the run's tuned fields."""
    return {f: self.overrides[f] for f in self.tuned_fields}

  @property
  def compared_fields(self) -> tuple[str, ...]:
    """The fields a sweep's runs differ by: its axes', the tuned ones, the seed."""
    return tuple(dict.fromkeys([*self.axis_fields, *self.tuned_fields, "seed"]))

  def to_json(self) -> dict[str, Any]:
    """run_spec.json's content (``serial.to_json``, its version first)."""
    return serial.to_json(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
    """The record of run_spec.json's content (ValueError naming a bad field,
    or a version this code does not read)."""
    if not isinstance(data, Mapping) or data.get("version") != VERSION:
      version = data.get("version") if isinstance(data, Mapping) else None
      raise ValueError(f"{FILENAME}: version {version!r}, expected {VERSION}.")
    return serial.from_json(cls, data, FILENAME)


serial.layout(order=("version", "config", "overrides", "seed", "evaluations", "axis_fields",
                     "tuned_fields", "sweep", "name"),
              derived={"version": lambda _: VERSION})(RunSpec)


def of_entry(record: SweepRecord, entry: RunEntry, in_process: bool = True) -> RunSpec:
  """The spec of a sweep's run: its ``sweep.json`` entry's overrides (typed by
  the sweep's validation) on the sweep's config file. ``in_process``: the run
  process runs the entry's evaluations itself (the sweep's default);
  otherwise the sweep runs them as commands of their own."""
  overrides = {k: v for k, v in entry.overrides.items() if k != "seed"}
  # A ladder's budget is no config field: its runs differ in train.num_steps,
  # which TensorBoard's HParams view lists after the rung's fields.
  axis_fields = tuple(dict.fromkeys(
      "train.num_steps" if f == BUDGET_FIELD else f for axis in record.axes for f in axis.fields))
  return RunSpec(config=record.config, overrides=overrides,
                 seed=int(entry.overrides.get("seed", entry.seed)),
                 evaluations=tuple(tuple(e) for e in entry.evaluations) if in_process else (),
                 axis_fields=axis_fields,
                 tuned_fields=tuple(f for f in entry.tuned if f in overrides),
                 sweep=record.name, name=entry.name)


def path(workdir: str | os.PathLike) -> pathlib.Path:
  return pathlib.Path(workdir) / FILENAME


def read(workdir: str | os.PathLike) -> RunSpec | None:
  """The spec in a run's directory, None where the run has none (a run
  launched before specs were written, or never launched)."""
  try:
    text = path(workdir).read_text()
  except FileNotFoundError:
    return None
  return RunSpec.from_json(json.loads(text))


def read_file(spec_path: str | os.PathLike) -> RunSpec:
  """The spec at ``spec_path`` (``--spec``), which must exist."""
  return RunSpec.from_json(json.loads(pathlib.Path(spec_path).read_text()))


def write(workdir: str | os.PathLike, spec: RunSpec) -> pathlib.Path:
  """Atomically writes ``spec`` into the run's directory (a run process
  starting at that moment reads the old spec or the new one, never half)."""
  target = path(workdir)
  target.parent.mkdir(parents=True, exist_ok=True)
  files.write_json(target, spec.to_json())
  return target
