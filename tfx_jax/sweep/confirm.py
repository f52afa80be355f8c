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
- **Fixed once added.** Confirmation runs are added runs (``adaptive``'s
  mechanism: recorded in sweep.json's ``added`` with stage ``confirm``, each
  a copy of the point's tuning run at the chosen value), so the same command
  resumes after ``kill -9`` at any moment, and the value a point was
  confirmed at never moves, whatever a later analysis (other margins, more
  tuning seeds) would choose: seeds added later to a point (a larger
  ``--confirm``, ``--until-resolved``) run at the same value.
- **A point with no chosen value** (no tuning run learned) gets no
  confirmation run; the report counts it as failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfx_jax.sweep import adaptive
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import AddedRun, RunEntry, Stage, SweepRecord

if TYPE_CHECKING:
  from tfx_jax.report.schema import Report

def seeds_text(seeds) -> str:
  """``1-3`` for consecutive seeds, else ``1, 3, 7``."""
  seeds = sorted(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def tuning_left(record: SweepRecord) -> list[RunEntry]:
  """The tuning runs not yet finished or diverged: the stage waits for them."""
  return [e for e in record.runs if e.stage == "tune" and e.state not in state_lib.DONE]


def waiting(record: SweepRecord) -> str | None:
  """Why the confirmation stage cannot be added yet (None: it can)."""
  left = tuning_left(record)
  if not left:
    return None
  failed = [e for e in left if e.state == "failed"]
  if failed and len(failed) == len(left):
    return (f"waits for {len(failed)} failed tuning run(s) (--retry-failed runs them "
            f"again): {', '.join(e.name for e in failed)}")
  return f"starts when the tuning stage is done ({len(left)} tuning run(s) left)"


def confirmed_values(record: SweepRecord) -> dict[tuple[int, ...], dict]:
  """{point key: the tuned values of its confirmation runs} (the points that have some)."""
  out = {}
  for entry in record.runs:
    if entry.stage == "confirm":
      out.setdefault(record.point_key(entry), dict(entry.tuned))
  return out


def add_confirmation(record: SweepRecord, report: Report) -> list[RunEntry]:
  """Adds each point's missing confirmation seeds (``confirmation_seeds``)
  once the tuning stage is done, at the value the point was confirmed at
  before, else at the value ``report`` chose on the tuning seeds; returns the
  new runs (already in ``record``; none while ``waiting``)."""
  if not record.confirm or waiting(record) is not None:
    return []
  confirmed = confirmed_values(record)
  templates, have = {}, set()
  for point in report.points:
    value = confirmed.get(point.key, point.chosen)
    if value is None:
      continue  # no tuning run learned: nothing to confirm (a failed verdict)
    runs = [e for e in record.runs if record.point_key(e) == point.key]
    have |= {(point.key, e.seed) for e in runs if e.stage == "confirm"}
    template = min((e for e in runs if e.stage == "tune" and e.tuned == value),
                   key=lambda e: e.seed, default=None)
    if template is not None:  # None: a value no longer in the declared grid
      templates[point.key] = template
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


def stage_counts(record: SweepRecord, stage: Stage) -> str:
  """``6 finished, 2 pending`` of the stage's runs."""
  counts: dict[str, int] = {}
  for entry in record.runs:
    if entry.stage == stage:
      counts[entry.state] = counts.get(entry.state, 0) + 1
  return ", ".join(f"{n} {s}" for s, n in counts.items()) or "no runs yet"


def status_lines(record: SweepRecord, report: Report | None) -> list[str]:
  """For ``--status`` of a sweep with confirmation seeds: each stage's runs,
  and each point's chosen value and the value it is confirmed at."""
  from tfx_jax.report import context  # pylint: disable=import-outside-toplevel
  tuning = sorted({e.seed for e in record.runs if e.stage == "tune"})
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
      seeds = sorted(e.seed for e in record.runs
                     if e.stage == "confirm" and record.point_key(e) == point.key)
      moved = "" if value == point.chosen else " (chosen before; kept)"
      at = f"; confirmed at {context.tuned_key(value)}{moved} on seeds {seeds_text(seeds)}"
    lines.append(f"  point {label}: chosen {chosen}{at}")
  return lines
