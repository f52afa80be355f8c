"""More seeds where they are needed: ``python -m tfx_jax.sweep ... --until-resolved N``.

After the sweep's runs and its report, every point on either side of an
unresolved comparison (``analysis.unresolved_points``) gets one more seed at
its chosen tuned value, while it has fewer than N; then those run, the
report is written again, and so on until every comparison is resolved or
the points have N seeds. The points of one comparison get the same new seed
(the smallest above the declared ones that the point lacks), so their
differences stay paired. The selection of tuned values reads the declared
seeds only, which every tuned value has; added seeds enter the comparisons.

Added runs are ordinary runs recorded in sweep.json (``added``: each with the
declared run it copies), so the same command resumes after a kill at any
moment: the runs already added are rebuilt, finished ones are kept.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tfx_jax.sweep_record import AddedRun, RunEntry, SweepRecord

if TYPE_CHECKING:
  from tfx_jax.report.schema import Report

_SEED_SUFFIX = re.compile(r"_s(\d+)$")


def seeded_entry(template: RunEntry, seed: int) -> RunEntry:
  """A pending copy of run ``template`` with another seed (name and overrides)."""
  return RunEntry(name=_SEED_SUFFIX.sub(f"_s{seed}", template.name), seed=seed,
                  values=template.values, overrides={**template.overrides, "seed": seed},
                  tuned=dict(template.tuned), evaluations=template.evaluations,
                  notes=template.notes)


def restore_added(record: SweepRecord, previous: SweepRecord | None) -> None:
  """Re-adds the runs an earlier invocation added (their bookkeeping kept)."""
  by_name = {e.name: e for e in record.runs}
  old = {e.name: e for e in previous.runs} if previous else {}
  record.added.clear()
  for added in previous.added if previous else []:
    template = by_name.get(added.like)
    if template is None or added.name in by_name:
      continue  # the declaration changed: the added run no longer belongs to it
    entry = seeded_entry(template, added.seed)
    entry.inherit(old.get(entry.name))
    record.runs.append(entry)
    record.added.append(added)
    by_name[entry.name] = entry


def add_seeds(record: SweepRecord, report: Report, max_seeds: int) -> list[RunEntry]:
  """Adds one seed to each point of an unresolved comparison below ``max_seeds``
  seeds; returns the new runs (already in ``record``)."""
  from tfx_jax.report import analysis  # pylint: disable=import-outside-toplevel
  points = {p.key: p for p in report.points}
  declared_max = max(record.seeds)
  new = []
  for key in analysis.unresolved_points(record, report):
    point = points.get(key)
    if point is None or point.chosen is None:
      continue  # no learned run to add seeds to
    entries = [e for e in record.runs
               if record.point_key(e) == key and e.tuned == point.chosen]
    seeds = {e.seed for e in entries}
    if not entries or len(seeds) >= max_seeds:
      continue
    seed = next(s for s in range(declared_max + 1, declared_max + 2 + len(seeds))
                if s not in seeds)
    template = min(entries, key=lambda e: e.seed)
    entry = seeded_entry(template, seed)
    record.runs.append(entry)
    record.added.append(AddedRun(entry.name, seed, template.name))
    new.append(entry)
  return new


def unresolved_lines(record: SweepRecord, report: Report) -> list[str]:
  """For ``--status``: each unresolved comparison and the seeds of each point."""
  lines = []
  seeds: dict[tuple, set] = {}
  for entry in record.runs:
    seeds.setdefault(record.point_key(entry), set()).add(entry.seed)
  for row in report.comparisons:
    if row.verdict == "unresolved" and row.metric == report.select_by:
      lines.append(f"  unresolved: {row.text}")
  for point in report.points:
    label = ", ".join(f"{k}={v}" for k, v in point.values.items()) or "base"
    lines.append(f"  point {label}: seeds {sorted(seeds.get(point.key, []))}"
                 f" (learned {point.counts.learned}, stalled "
                 f"{point.counts.stalled}, diverged {point.counts.diverged})")
  return lines
