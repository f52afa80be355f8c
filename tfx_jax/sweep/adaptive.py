"""More seeds where they are needed: ``python -m tfx_jax.sweep ... --until-resolved N``.

After the sweep's runs and its report, every point on either side of an
unresolved comparison (``report.sections.sequential.unresolved_points``; a comparison the sweep
declares, ``Sweep.comparisons``, as well as one against an axis's base value)
gets one more seed at its chosen tuned value, while it has fewer than N;
then those run, the report is written again, and so on until every
comparison is resolved or the points have N seeds. The points of one
comparison get the same new seed (the smallest above the declared ones
that the point lacks), so their differences stay paired. On a sweep with
confirmation seeds (``confirm``) the added seeds are confirmation seeds, N
counts a point's confirmation seeds, and the tuning seeds never enter a
verdict. A tuned sweep without confirmation seeds is refused (``cli``): its
verdicts read the seeds that chose each point's value, and more of them
would not remove that bias.

Every round is another look at the same comparisons, so N is part of the
test: sweep.json keeps the first N given (``until_resolved``), and the
report tests such a sweep sequentially over the looks N allows
(``report.context.sequential_design``), which keeps the chance of any
false verdict at most alpha whichever round the sweep stops at.

Added runs are ordinary runs recorded in sweep.json (``added``: each with the
run it copies and its stage), so the same command resumes after a kill at any
moment: the runs already added are rebuilt, finished ones are kept. The
confirmation stage (``confirm``) adds its runs the same way.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Mapping

from tfx_jax.records.sweep import AddedRun, RunEntry, Stage, SweepRecord
from tfx_jax.sweep import branching

if TYPE_CHECKING:
  from tfx_jax.report.schema import Report

_SEED_SUFFIX = re.compile(r"_s(\d+)$")


def seeded_entry(template: RunEntry, seed: int, stage: Stage | None = None) -> RunEntry:
  """A pending copy of run ``template`` with another seed (name and overrides),
  in ``stage`` (default: the template's). A branched budget's copy branches
  from no trunk yet: the seed's own trunk is attached to it
  (``branching.attach``)."""
  overrides = {k: v for k, v in template.overrides.items() if k != branching.BRANCH_STEP}
  return RunEntry(name=_SEED_SUFFIX.sub(f"_s{seed}", template.name), seed=seed,
                  values=template.values, overrides={**overrides, "seed": seed},
                  tuned=dict(template.tuned), evaluations=template.evaluations,
                  notes=template.notes, stage=stage or template.stage)


def restore_added(record: SweepRecord, previous: SweepRecord | None,
                  candidates: Mapping[str, RunEntry] | None = None) -> None:
  """Re-adds the runs an earlier invocation added (their bookkeeping kept), in
  the order they were added. A transferred point's own runs (``like`` their
  own name) are rebuilt from ``candidates`` ({name: the sweep's declaration
  of a transferred point at one value and seed}, ``cli.candidate_entries``),
  and so are its confirmation runs where they copy one of those (``like`` a
  candidate's name: a sweep with confirmation seeds runs no transfer stage)."""
  by_name = {e.name: e for e in record.runs}
  old = {e.name: e for e in previous.runs} if previous else {}
  record.added.clear()
  for added in previous.added if previous else []:
    if added.name in by_name:
      continue
    if added.like == added.name:  # a transfer stage's run: its declaration
      found = (candidates or {}).get(added.name) if record.tune_at else None
      if found is None:
        continue  # the declaration changed: the point no longer takes this value
      entry = dataclasses.replace(found, overrides=dict(found.overrides),
                                  tuned=dict(found.tuned), stage=added.stage)
    else:
      template = by_name.get(added.like)
      if template is None and record.tune_at:
        # A transferred point's confirmation run copies its declaration at
        # its proxy's value (no transfer-stage run: ``confirm.add_confirmation``).
        template = (candidates or {}).get(added.like)
      if template is None or (added.stage in ("confirm", "superseded")
                              and not record.confirm):
        continue  # the declaration changed: the added run no longer belongs to it
      entry = seeded_entry(template, added.seed, added.stage)
    entry.inherit(old.get(entry.name))
    record.runs.append(entry)
    record.added.append(added)
    by_name[entry.name] = entry


def add_seeds(record: SweepRecord, report: Report, max_seeds: int) -> list[RunEntry]:
  """Adds one seed to each point of an unresolved comparison below ``max_seeds``
  seeds (confirmation seeds, on a sweep that has them); returns the new runs
  (already in ``record``). ``max_seeds`` is the budget sweep.json keeps
  (``record.until_resolved``), over whose looks the report's sequential test
  spends alpha; a record without one is tested as if its seeds were fixed."""
  from tfx_jax.report.sections import sequential  # pylint: disable=import-outside-toplevel
  if record.until_resolved is not None and max_seeds != record.until_resolved:
    raise ValueError(f"max_seeds={max_seeds}, but the sweep's sequential design allows "
                     f"{record.until_resolved} (sweep.json's until_resolved)")
  points = {p.key: p for p in report.points}
  declared_max = max(record.seeds)
  new = []
  for key in sequential.unresolved_points(report):
    point = points.get(key)
    if point is None or point.chosen is None:
      continue  # no learned run to add seeds to
    # A confirmed point's seeds are its confirmation runs, at the value they
    # were confirmed at; otherwise its runs at the chosen value.
    entries = [e for e in record.runs if record.point_key(e) == key and (
        e.stage == "confirm" if record.confirm else e.tuned == point.chosen)]
    seeds = {e.seed for e in entries}
    if not entries or len(seeds) >= max_seeds:
      continue
    seed = next(s for s in range(declared_max + 1, declared_max + 2 + len(seeds))
                if s not in seeds)
    template = min(entries, key=lambda e: e.seed)
    entry = seeded_entry(template, seed)
    record.runs.append(entry)
    record.added.append(AddedRun(entry.name, seed, template.name, entry.stage))
    new.append(entry)
  return new


def unresolved_lines(record: SweepRecord, report: Report) -> list[str]:
  """For ``--status``: each unresolved comparison and the seeds of each point."""
  from tfx_jax.report.context import compared_by  # pylint: disable=import-outside-toplevel
  from tfx_jax.report.sections import verdicts  # pylint: disable=import-outside-toplevel
  lines = []
  seeds: dict[tuple, set] = {}
  for entry in record.runs:
    seeds.setdefault(record.point_key(entry), set()).add(entry.seed)
  for row in report.comparisons:
    if row.verdict == "unresolved" and row.metric == compared_by(record):
      lines.append(f"  unresolved: {verdicts.verdict_text(record, row)}")
  for point in report.points:
    label = ", ".join(f"{k}={v}" for k, v in point.values.items()) or "base"
    lines.append(f"  point {label}: seeds {sorted(seeds.get(point.key, []))}"
                 f" (learned {point.counts.learned}, stalled "
                 f"{point.counts.stalled}, diverged {point.counts.diverged})")
  return lines
