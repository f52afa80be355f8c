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

import copy
import re
from typing import Any

_SEED_SUFFIX = re.compile(r"_s(\d+)$")


def seeded_entry(template: dict[str, Any], seed: int) -> dict[str, Any]:
  """A copy of sweep.json run ``template`` with another seed (name and overrides)."""
  entry = copy.deepcopy(template)
  entry["name"] = _SEED_SUFFIX.sub(f"_s{seed}", template["name"])
  entry["seed"] = seed
  entry["overrides"]["seed"] = seed
  entry.update(state="pending", step=0, reason="", attempts=0, wall_seconds=0.0,
               compile_seconds=None)
  return entry


def restore_added(record: dict[str, Any], previous: dict[str, Any] | None) -> None:
  """Re-adds the runs an earlier invocation added (their bookkeeping kept)."""
  by_name = {e["name"]: e for e in record["runs"]}
  old = {e["name"]: e for e in (previous or {}).get("runs", [])}
  record["added"] = []
  for added in (previous or {}).get("added", []):
    template = by_name.get(added["like"])
    if template is None or added["name"] in by_name:
      continue  # the declaration changed: the added run no longer belongs to it
    entry = seeded_entry(template, added["seed"])
    prev = old.get(entry["name"], {})
    entry.update(attempts=prev.get("attempts", 0),
                 wall_seconds=prev.get("wall_seconds", 0.0),
                 compile_seconds=prev.get("compile_seconds"))
    record["runs"].append(entry)
    record["added"].append(added)
    by_name[entry["name"]] = entry


def add_seeds(record: dict[str, Any], report: dict[str, Any], max_seeds: int
              ) -> list[dict[str, Any]]:
  """Adds one seed to each point of an unresolved comparison below ``max_seeds``
  seeds; returns the new sweep.json entries (already in ``record``)."""
  from tfx_jax.report import analysis  # pylint: disable=import-outside-toplevel
  points = {tuple(p["key"]): p for p in report["points"]}
  declared_max = max(record["seeds"])
  new = []
  for key in analysis.unresolved_points(record, report):
    point = points.get(tuple(key))
    if point is None or point["chosen"] is None:
      continue  # no learned run to add seeds to
    entries = [e for e in record["runs"] if _key(record, e) == tuple(key)
               and e.get("tuned", {}) == point["chosen"]]
    seeds = {e["seed"] for e in entries}
    if not entries or len(seeds) >= max_seeds:
      continue
    seed = next(s for s in range(declared_max + 1, declared_max + 2 + len(seeds))
                if s not in seeds)
    template = min(entries, key=lambda e: e["seed"])
    entry = seeded_entry(template, seed)
    record["runs"].append(entry)
    record.setdefault("added", []).append(
        {"name": entry["name"], "seed": seed, "like": template["name"]})
    new.append(entry)
  return new


def _key(record, entry) -> tuple[int, ...]:
  return tuple(axis["values"].index(value)
               for axis, value in zip(record["axes"], entry["values"]))


def unresolved_lines(record: dict[str, Any], report: dict[str, Any]) -> list[str]:
  """For ``--status``: each unresolved comparison and the seeds of each point."""
  lines = []
  seeds: dict[tuple, set] = {}
  for entry in record["runs"]:
    seeds.setdefault(_key(record, entry), set()).add(entry["seed"])
  for row in report["comparisons"]:
    if row["verdict"] == "unresolved" and row["metric"] == report["select_by"]:
      lines.append(f"  unresolved: {row['text']}")
  for point in report["points"]:
    label = ", ".join(f"{k}={v}" for k, v in point["values"].items()) or "base"
    lines.append(f"  point {label}: seeds {sorted(seeds.get(tuple(point['key']), []))}"
                 f" (learned {point['counts']['learned']}, stalled "
                 f"{point['counts']['stalled']}, diverged {point['counts']['diverged']})")
  return lines
