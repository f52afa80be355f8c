"""The confirmation stage: ``Sweep(confirm=N)``, ``python -m tfx_jax.sweep ... --confirm N``.

A tuned sweep chooses each point's tuned value on the validation split of its
declared seeds (the tuning stage). Comparing the points on those same seeds
reuses the seeds that chose: a seed that happens to be lucky at a value is
lucky on every split, so the chosen value's result is biased in its point's
favour, by more for a point whose curve over the tuned values is sharp than
for one whose curve is flat (the winner's curse of model selection: Cawley
and Talbot 2010, "On over-fitting in model selection and subsequent
selection bias in performance evaluation", JMLR 11). The confirmation stage
runs each point again at its chosen value on N fresh seeds, the same seeds
for every point (``SweepRecord.confirmation_seeds``: the N integers right
above the largest tuning seed), so comparisons stay paired, and the report's
verdicts read those runs only.

- **When.** Once every tuning run is finished or diverged: the report is
  written (the selection), then the confirmation runs are added. A failed
  tuning run (a crash) holds the stage back until ``--retry-failed`` has run
  it again, since a value chosen on part of the seeds would stay chosen.
- **Added once.** Confirmation runs are added runs (``adaptive``'s
  mechanism: recorded in sweep.json's ``added`` with stage ``confirm``, each
  a copy of the point's tuning run at the chosen value, named by that value
  and its seed), so the same command resumes after ``kill -9`` at any
  moment; seeds added later to a point (a larger ``--confirm``,
  ``--until-resolved``) run at the value its confirmation runs ran at.
- **Stale when the choice moves.** Where the finished tuning runs choose
  another value than a point's confirmation runs ran at (the grid was
  widened in the experiment file, tuning runs were added, the report's
  margins changed), the confirmation is *stale* (``stale_points``): it
  confirms a value nothing chooses. The report flags the point and leaves
  its comparisons out (``report.sections.choices``), ``--status`` names it,
  and the next time the sweep runs with its tuning stage done it
  re-confirms the point at its new choice: the old runs become
  ``superseded`` (kept on disk and in sweep.json, never run again, read by
  no verdict) and the confirmation seeds run at the new value, under names
  and workdirs of their own (a run's name holds its tuned values), so
  nothing written is lost or overwritten. The move is saved in sweep.json
  before any new run starts, so a kill at any moment resumes it. Runs at a
  value chosen again later become the point's confirmation again.
- **A point with no chosen value** (no tuning run learned) gets no
  confirmation run; the report counts it as failed.
- **A transferred point** (``tune_at``) runs no transfer stage when the sweep
  has confirmation seeds (``sweep.transfer``): it is confirmed at the value
  chosen at its source proxy, its runs copies of its declaration at that
  value (``transferred_points``), and it moves with its proxy's choice as a
  tuning point moves with its own.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping, Sequence

from tfx_jax.records import transfer as transfer_lib
from tfx_jax.sweep import adaptive
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import DECLARED, AddedRun, RunEntry, Stage, SweepRecord

if TYPE_CHECKING:
  from tfx_jax.report.schema import Point, Report

# The stages between which a point's confirmation moves.
MOVABLE: tuple[Stage, ...] = ("confirm", "superseded")

def seeds_text(seeds) -> str:
  """``1-3`` for consecutive seeds, else ``1, 3, 7``."""
  seeds = sorted(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def tuning_left(record: SweepRecord) -> list[RunEntry]:
  """The tuning runs (and a transferred point's runs at its transferred
  value, ``sweep.transfer``) not yet finished or diverged: the stage waits
  for them."""
  return [e for e in record.runs if e.stage in DECLARED and e.state not in state_lib.DONE]


def waiting(record: SweepRecord) -> str | None:
  """Why the confirmation stage cannot be added yet (None: it can)."""
  return waiting_for(tuning_left(record))


def waiting_for(left) -> str | None:
  """Why a stage after tuning waits on the tuning runs ``left`` (None: none left)."""
  if not left:
    return None
  failed = [e for e in left if e.state == "failed"]
  if failed and len(failed) == len(left):
    return (f"waits for {len(failed)} failed tuning run(s) (--retry-failed runs them "
            f"again): {', '.join(e.name for e in failed)}")
  return f"starts when the tuning stage is done ({len(left)} tuning run(s) left)"


def confirmed_values(record: SweepRecord) -> dict[tuple[int, ...], dict]:
  """{point key: the tuned values of its confirmation runs} (the points that
  have some; superseded runs are no point's confirmation)."""
  out = {}
  for entry in record.runs:
    if entry.stage == "confirm":
      out.setdefault(record.point_key(entry), dict(entry.tuned))
  return out


def stale_points(record: SweepRecord, report: Report) -> list[tuple[Point, dict]]:
  """(point, the tuned values its confirmation runs ran at) of each point of
  ``report`` (written from the finished tuning runs) whose confirmation runs
  ran at other tuned values than it chooses: a stale confirmation."""
  confirmed = confirmed_values(record)
  return [(p, confirmed[p.key]) for p in report.points
          if p.key in confirmed and confirmed[p.key] != p.chosen]


def move_confirmation(record: SweepRecord, key: tuple[int, ...], value: dict | None) -> None:
  """Makes the point's runs at ``value`` its confirmation runs and its other
  confirmation runs ``superseded``, in ``record.runs`` and ``record.added``
  (``value`` None: nothing is chosen, so every one is superseded)."""
  move_stage(record, key, value, MOVABLE, "confirm", "superseded")


def move_stage(record: SweepRecord, key: tuple[int, ...], value: dict | None,
               movable, kept: Stage, superseded: Stage) -> None:
  """The point's runs in a ``movable`` stage: those at ``value`` become
  ``kept``, the others ``superseded``, in ``record.runs`` and ``record.added``."""
  stages: dict[str, Stage] = {}
  for i, entry in enumerate(record.runs):
    if record.point_key(entry) == tuple(key) and entry.stage in movable:
      stage = kept if entry.tuned == value else superseded
      record.runs[i] = dataclasses.replace(entry, stage=stage)
      stages[entry.name] = stage
  record.added[:] = [dataclasses.replace(a, stage=stages[a.name]) if a.name in stages else a
                     for a in record.added]


def add_confirmation(record: SweepRecord, report: Report,
                     candidates: Sequence[RunEntry] = ()) -> list[RunEntry]:
  """Adds each point's missing confirmation seeds (``confirmation_seeds``)
  once the tuning stage is done, at the value ``report`` chose on the tuning
  seeds, first moving its confirmation there (``move_confirmation``: a stale
  one superseded, superseded runs at that value its confirmation again);
  returns the new runs (already in ``record``; none while ``waiting``).

  ``candidates`` (a sweep with ``tune_at``: ``cli.candidate_entries``, the
  transferred points' runs at every value of their grids): a transferred
  point without transfer-stage runs (with confirmation seeds the transfer
  stage runs none: ``sweep.transfer``) is confirmed at the value chosen at
  its source proxy, its runs copies of its candidate at that value."""
  if not record.confirm or waiting(record) is not None:
    return []
  values = {p.key: p.chosen for p in report.points}
  pools = {key: [e for e in record.runs if record.point_key(e) == key and e.stage in DECLARED]
           for key in values}
  for key, (value, entries) in transferred_points(record, values, candidates).items():
    values[key], pools[key] = value, entries
  for key, value in values.items():
    move_confirmation(record, key, value)
  templates, have = {}, set()
  for key, value in values.items():
    if value is None:
      continue  # no tuning run learned: nothing to confirm (a failed verdict)
    have |= {(key, e.seed) for e in record.runs
             if e.stage == "confirm" and record.point_key(e) == key}
    template = min((e for e in pools[key] if e.tuned == value),
                   key=lambda e: e.seed, default=None)
    if template is not None:  # None: a value no longer in the declared grid
      templates[key] = template
  new = []
  # Seeds outermost, as the declared runs: a stage stopped half-way has every
  # point's first confirmation seeds, paired.
  for seed in record.confirmation_seeds():
    for key, template in templates.items():
      if (key, seed) not in have:
        entry = adaptive.seeded_entry(template, seed, "confirm")
        record.runs.append(entry)
        record.added.append(AddedRun(entry.name, seed, template.name, "confirm"))
        new.append(entry)
  return new


def transferred_points(record: SweepRecord, chosen: Mapping[tuple[int, ...], dict | None],
                       candidates: Sequence[RunEntry]
                       ) -> dict[tuple[int, ...], tuple[dict | None, list[RunEntry]]]:
  """{point key: (the value ``chosen`` at its source, its candidates)} of each
  transferred point among ``candidates`` that has no transfer-stage run: its
  value is its proxy's, and its candidates at that value are the templates of
  its confirmation runs. A point with transfer-stage runs (a sweep directory
  of an earlier version, which ran them before confirming) is confirmed at
  the value those runs choose, as a tuning point at its tuning runs'."""
  plan = transfer_lib.record_sources(record)
  ran = {record.point_key(e) for e in record.runs if e.stage == "transfer"}
  out: dict[tuple[int, ...], tuple[dict | None, list[RunEntry]]] = {}
  for entry in candidates:
    key = record.point_key(entry)
    if key not in ran:
      out.setdefault(key, (chosen.get(transfer_lib.source_key(plan, key)), []))[1].append(entry)
  return out


def stage_counts(record: SweepRecord, stage: Stage) -> str:
  """``6 finished, 2 pending`` of the stage's runs."""
  counts: dict[str, int] = {}
  for entry in record.runs:
    if entry.stage == stage:
      counts[entry.state] = counts.get(entry.state, 0) + 1
  return ", ".join(f"{n} {s}" for s, n in counts.items()) or "no runs yet"


def status_lines(record: SweepRecord, report: Report | None) -> list[str]:
  """For ``--status`` of a sweep with confirmation seeds: each stage's runs,
  each point's chosen value and the value it is confirmed at, a stale
  confirmation (what it ran at, what is chosen now, when it is re-confirmed)
  and the superseded confirmation runs a point keeps."""
  from tfx_jax.report import context  # pylint: disable=import-outside-toplevel
  tuning = sorted({e.seed for e in record.runs if e.stage in DECLARED})
  lines = [f"tuning stage (seeds {seeds_text(tuning)}): {stage_counts(record, 'tune')}"]
  head = (f"confirmation stage (seeds {seeds_text(record.confirmation_seeds())}, "
          "each point at its chosen value): ")
  reason = waiting(record) if not any(e.stage == "confirm" for e in record.runs) else None
  lines.append(head + (reason or stage_counts(record, "confirm")))
  confirmed = confirmed_values(record)
  for point in report.points if report is not None else []:
    label = ", ".join(f"{k}={v}" for k, v in point.values.items()) or "base"
    chosen = point.chosen_label or "none (no tuning run learned: nothing to confirm)"
    value = confirmed.get(point.key)
    at = ""
    if value is not None:
      at = (f"; confirmed at {context.tuned_key(value)} on seeds "
            f"{seeds_text(_seeds(record, point.key, 'confirm'))}")
    if value is not None and value != point.chosen:
      now = (f"{point.chosen_label} is chosen now" if point.chosen is not None
             else "nothing is chosen now (no tuning run learned)")
      when = ("the next run of the sweep re-confirms it" if waiting(record) is None else
              f"it is re-confirmed once the tuning stage is done (the confirmation stage "
              f"{waiting(record)})")
      at = (f"; its confirmation is STALE: it ran at {context.tuned_key(value)} on seeds "
            f"{seeds_text(_seeds(record, point.key, 'confirm'))}, {now}; {when}")
    superseded = sorted({context.tuned_key(e.tuned) for e in record.runs
                         if e.stage == "superseded" and record.point_key(e) == point.key})
    if superseded:
      at += (f"; superseded confirmation runs at {', '.join(superseded)} (seeds "
             f"{seeds_text(_seeds(record, point.key, 'superseded'))}) kept, not compared")
    lines.append(f"  point {label}: chosen {chosen}{at}")
  return lines


def _seeds(record: SweepRecord, key: tuple[int, ...], stage: Stage) -> list[int]:
  """The seeds of a point's runs in ``stage``."""
  return sorted({e.seed for e in record.runs if e.stage == stage and record.point_key(e) == key})
