"""The transfer stage: ``Sweep(tune=..., tune_at={"model.d_model": 64})``,
``python -m tfx_jax.sweep ... --tune-at model.d_model=64``.

The tuning stage runs only at the proxy sizes (``records.transfer``: which
points tune and where every other point takes its value from). Once it is
done, the report chooses each proxy point's value, and every other point
runs its declared seeds at the value chosen at its source, the nearest
proxy size below it: the transfer stage, whose runs the verdicts read.

With ``confirm=N`` there is no transfer stage (``runs_none``): the verdicts
read the confirmation runs only, so a transferred point's declared seeds
would be read by none, and at the largest sizes of a ladder they are its
dearest runs. Once the tuning stage is done, the confirmation stage runs
every point's confirmation seeds at its value, a transferred point at the
value chosen at its source, each run a copy of the point's declaration at
that value (``confirm.add_confirmation``); where the proxy's choice moves,
the point's confirmation runs at the old value become ``superseded`` and it
is confirmed again at the new one, as a tuning point is. A sweep directory
of an earlier version, whose transferred points ran a transfer stage before
their confirmation, keeps its runs: they are moved with the choice as below,
and a point confirms at the value they choose.

The stage keeps confirmation's guarantees (``sweep.confirm``):

- **When.** Once every tuning run is finished or diverged; a failed tuning
  run holds it back until ``--retry-failed`` has run it again.
- **Added once.** A transferred point's runs are the sweep's own declaration
  of the point at that value (validated with every run before anything
  ran: ``cli.candidate_entries``), added to sweep.json's ``runs`` and
  ``added`` (stage ``transfer``, ``like`` their own name) and saved before
  they start, so the same command resumes after ``kill -9`` at any moment.
- **Stale when the choice moves.** Where the proxy's finished tuning runs
  choose another value than a point's transfer runs ran at, those runs become
  ``superseded_transfer`` (kept on disk and in sweep.json, never run again,
  read by no verdict) and the point runs its seeds at the new value, under
  names of their own; runs at a value chosen again become its runs again.
- **A proxy with no chosen value** (no tuning run learned) gives its
  transferred points no run; the report counts them as failed.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from tfx_jax.records import transfer as transfer_lib
from tfx_jax.records.sweep import AddedRun, RunEntry, Stage, SweepRecord
from tfx_jax.sweep import confirm

if TYPE_CHECKING:
  from tfx_jax.report.schema import Report

# The stages between which a transferred point's runs move.
MOVABLE: tuple[Stage, ...] = ("transfer", "superseded_transfer")


def sources(record: SweepRecord, keys) -> dict[tuple[int, ...], tuple[int, ...]]:
  """{point key: its source point} of the transferred points among ``keys``."""
  plan = transfer_lib.record_sources(record)
  out = {}
  for key in keys:
    source = transfer_lib.source_key(plan, key)
    if source != tuple(key):
      out[tuple(key)] = source
  return out


def waiting(record: SweepRecord) -> str | None:
  """Why the transfer stage cannot be added yet (None: it can)."""
  return confirm.waiting_for([e for e in record.runs if e.stage == "tune"
                             and e.state not in ("finished", "diverged")])


def move(record: SweepRecord, key: tuple[int, ...], value: dict | None) -> None:
  """Makes the point's runs at ``value`` its transfer runs and its others
  ``superseded_transfer``, in ``record.runs`` and ``record.added``."""
  confirm.move_stage(record, key, value, MOVABLE, "transfer", "superseded_transfer")


def add_transfer(record: SweepRecord, report: Report, candidates: Sequence[RunEntry]
                 ) -> list[RunEntry]:
  """Adds each transferred point's missing declared seeds at the value
  ``report`` chose at its source (``candidates``: the transferred points'
  runs at every value of their grids), first moving its runs there
  (``move``); returns the new runs (already in ``record``; none while
  ``waiting``, none on a sweep with confirmation seeds: the confirmation
  stage runs those points, ``confirm.add_confirmation``, and the move only
  keeps a sweep directory's earlier transfer-stage runs in step)."""
  if not record.tune_at or waiting(record) is not None:
    return []
  chosen = {p.key: p.chosen for p in report.points}
  by_point: dict[tuple[int, ...], list[RunEntry]] = {}
  for entry in candidates:
    by_point.setdefault(record.point_key(entry), []).append(entry)
  targets = sources(record, by_point)
  for key, source in targets.items():
    move(record, key, chosen.get(source))
  if runs_none(record):
    return []
  have = {(record.point_key(e), e.seed) for e in record.runs if e.stage == "transfer"}
  names = {e.name for e in record.runs}
  new = []
  # Seeds outermost, as the declared runs: a stage stopped half-way has every
  # point's first seeds.
  for seed in record.seeds:
    for key, source in targets.items():
      value = chosen.get(source)
      if value is None or (key, seed) in have:
        continue  # nothing learned at the proxy: nothing to transfer
      found = next((e for e in by_point[key] if e.seed == seed and e.tuned == value), None)
      if found is None or found.name in names:
        continue  # a value no longer in the declared grid
      entry = dataclasses.replace(found, overrides=dict(found.overrides),
                                  tuned=dict(found.tuned), stage="transfer")
      record.runs.append(entry)
      record.added.append(AddedRun(entry.name, seed, entry.name, "transfer"))
      new.append(entry)
  return new


def runs_none(record: SweepRecord) -> bool:
  """Whether the transfer stage adds no run: with confirmation seeds the
  verdicts read the confirmation runs only, so a transferred point's declared
  seeds would be read by none (and at the largest sizes they are a sweep's
  dearest runs); the confirmation stage runs its seeds at its proxy's value."""
  return bool(record.confirm)


def plan_text(record: SweepRecord, candidates: Sequence[RunEntry]) -> str:
  """``--dry-run``'s and the header's lines: which points tune, which take a
  transferred value, from where and by which rule."""
  keys = list(dict.fromkeys(record.point_key(e) for e in [*record.runs, *candidates]))
  targets = sources(record, keys)
  lines = [f"  tune_at {transfer_lib.tune_at_text(record.tune_at)}: the tuning stage runs "
           "at the proxy sizes only"]
  tuning = [k for k in keys if k not in targets]
  lines.append("    tuned here: " + "; ".join(_label(record, k) for k in tuning))
  for key, source in targets.items():
    entry = next(e for e in candidates if record.point_key(e) == key)
    rule = transfer_lib.RULES.get(transfer_lib.parametrization(record, entry.overrides),
                                  "a copy")
    lines.append(f"    point {_label(record, key)}: takes the value chosen at "
                 f"{transfer_lib.size_label(record, source)} ({_label(record, source)}), "
                 f"{rule}")
  if runs_none(record):
    lines.append(f"  no transfer-stage runs (confirm > 0): the confirmation stage runs the "
                 f"{len(targets)} transferred points at their proxies' values, once the "
                 "tuning stage is done")
  else:
    lines.append(f"  then the transfer stage: {len(targets)} points x {len(record.seeds)} "
                 f"seeds ({confirm.seeds_text(record.seeds)}), once the tuning stage is done")
  return "\n".join(lines)


def _label(record: SweepRecord, key: tuple[int, ...]) -> str:
  """A point as ``--status`` names it: ``model.d_model=64,model.num_heads=2``."""
  parts = [",".join(f"{k}={v}" for k, v in axis.values[i].items())
           for axis, i in zip(record.axes, key)]
  return ", ".join(p for p in parts if p) or "base"


def status_lines(record: SweepRecord, report: Report | None) -> list[str]:
  """For ``--status`` of a sweep with ``tune_at``: the transfer stage (waiting
  for tuning, running, done; none with confirmation seeds) and each
  transferred point's value and source."""
  keys = list(dict.fromkeys(record.point_key(e) for e in record.runs))
  runs = [e for e in record.runs if e.stage == "transfer"]
  reason = waiting(record)
  if runs and all(e.state in ("finished", "diverged") for e in runs) and reason is None:
    state = f"done ({confirm.stage_counts(record, 'transfer')})"
  elif runs:
    state = f"running ({confirm.stage_counts(record, 'transfer')})"
  else:
    state = f"waiting for tuning: {reason}" if reason else "not added yet"
  if runs_none(record) and not runs:
    lines = ["transfer stage: no runs (confirm > 0): the confirmation stage runs each "
             "transferred point's confirmation seeds at its proxy's chosen value"]
  else:
    lines = [f"transfer stage (seeds {confirm.seeds_text(record.seeds)}, each transferred "
             f"point at its proxy's chosen value): {state}"]
  chosen = {p.key: p.chosen_label for p in report.points} if report is not None else {}
  for key, source in sources(record, keys).items():
    at = sorted({_tuned(e.tuned) for e in runs if record.point_key(e) == key})
    confirmed = sorted({_tuned(e.tuned) for e in record.runs
                        if e.stage == "confirm" and record.point_key(e) == key})
    lines.append(f"  point {_label(record, key)}: from {transfer_lib.size_label(record, source)}"
                 f" (chosen there: {chosen.get(source) or 'not yet'})"
                 + (f"; runs at {', '.join(at)}" if at else "")
                 + (f"; confirmation runs at {', '.join(confirmed)}" if confirmed else ""))
  return lines


def _tuned(tuned) -> str:
  return ",".join(f"{k.split('.')[-1]}={v}" for k, v in tuned.items())
