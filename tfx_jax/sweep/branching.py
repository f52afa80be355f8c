"""Several budgets from one run: a branched ladder's trunk runs.

With ``optim.schedule=wsd`` the learning rate of a budget of T steps is
constant from its warmup to its decay's start, ``int(T (1 - decay_fraction))``
(``run.optim.resolve``), whatever T is: every budget of one (rung, variant,
tuned value, seed) trains the same steps up to its own decay start (Hägele et
al. 2024). So one trunk run trains the longest budget's schedule to the last
decay start (``train.stop_step``), keeping a checkpoint at each budget's
(``checkpoint.keep_steps``), and each budget is a run of its own that starts
from the trunk's checkpoint at its branch point (``train.branch_from``,
``train.branch_step``) and runs its decay: its own workdir, record and
evaluations, resumable after kill -9 as any run, and bitwise the run it would
have been from scratch (``tests/run``: the trainer's branch test).

Trunks are entries of ``SweepRecord.trunks``, not of ``runs``: they are no
point of the report (which counts their cost). A budget's entry names its
trunk (``RunEntry.trunk``); the executors start a budget once its trunk is
done (locally: when it finishes; SLURM: on the next invocation, as stages are).
"""

from __future__ import annotations

import pathlib
from typing import Any, Iterable, Sequence

from tfx_jax.records.ladder import BUDGET_AXIS
from tfx_jax.records.sweep import SUPERSEDED, RunEntry, SweepRecord

# The config fields a branch adds to its budget's run: the trunk's workdir
# (written into run_spec.json when the run starts, as an absolute path) and
# the step of its checkpoint.
BRANCH_FROM, BRANCH_STEP = "train.branch_from", "train.branch_step"
STOP_STEP, KEEP_STEPS = "train.stop_step", "checkpoint.keep_steps"
TRUNK_MARK = "trunk"


def _group_key(entry: RunEntry) -> tuple:
  """What a budget's runs share: every override but the length (and the seed's)."""
  items = {k: v for k, v in entry.overrides.items()
           if k not in ("train.num_steps", BRANCH_STEP)}
  values = [v for i, v in enumerate(entry.values) if i != BUDGET_AXIS]
  return (repr(sorted(items.items(), key=lambda kv: kv[0])), repr(values), entry.seed)


def trunk_name(entry: RunEntry) -> str:
  """A budget's run name with its budget replaced by ``trunk``: the budgets'
  names differ only in their ``tokens_per_param-X`` part."""
  budget = "_tokens_per_param-"
  head, sep, tail = entry.name.partition(budget)
  if not sep:
    raise ValueError(f"{entry.name}: not the name of a ladder's budget")
  rest = tail.split("_", 1)
  return head + f"_{TRUNK_MARK}" + ("_" + rest[1] if len(rest) > 1 else "")


def _branch_at(record: SweepRecord, entry: RunEntry) -> int | None:
  point = record.ladder.point(record.point_key(entry)) if record.ladder else None
  return None if point is None else point.branch_step


def attach(record: SweepRecord, entries: Iterable[RunEntry] | None = None) -> list[RunEntry]:
  """Gives the budgets of ``entries`` (default: every run of the record) that
  have no trunk yet a trunk of their own, where two or more budgets of one
  (rung, variant, tuned value, seed) are among them; returns the trunks added.
  A budget whose group has a trunk already (an earlier invocation's, or an
  earlier stage's) branches from it where the trunk keeps a checkpoint at its
  branch point, else runs from scratch."""
  if record.ladder is None or not record.ladder.branch:
    return []
  existing = {t.name: t for t in record.trunks}
  groups: dict[tuple, list[RunEntry]] = {}
  for entry in record.runs if entries is None else entries:
    if entry.trunk or entry.stage in SUPERSEDED or _branch_at(record, entry) is None:
      continue
    groups.setdefault(_group_key(entry), []).append(entry)
  added = []
  for members in groups.values():
    if len(members) < 2 and trunk_name(members[0]) not in existing:
      continue
    longest = max(members, key=lambda e: e.overrides["train.num_steps"])
    name = trunk_name(longest)
    if name in existing:  # made before (an earlier invocation, an earlier stage)
      kept = existing[name].overrides.get(KEEP_STEPS, ())
      for entry in members:
        if _branch_at(record, entry) in kept:
          entry.trunk = name
          entry.overrides[BRANCH_STEP] = _branch_at(record, entry)
      continue
    steps = sorted({_branch_at(record, e) for e in members})
    overrides = {k: v for k, v in longest.overrides.items() if k != BRANCH_STEP}
    overrides[STOP_STEP] = steps[-1]
    overrides[KEEP_STEPS] = tuple(steps)
    trunk = RunEntry(name=name, seed=longest.seed, values=tuple(dict(v) for v in longest.values),
                     overrides=overrides, tuned=dict(longest.tuned), stage=longest.stage)
    record.trunks.append(trunk)
    existing[name] = trunk
    added.append(trunk)
    for entry in members:
      entry.trunk = name
      entry.overrides[BRANCH_STEP] = _branch_at(record, entry)
  return added


def trunk_of(record: SweepRecord, entry: RunEntry) -> RunEntry | None:
  """The trunk a budget branches from (None: it runs from scratch)."""
  if not entry.trunk:
    return None
  return next((t for t in record.trunks if t.name == entry.trunk), None)


def spec_overrides(sweep_dir: pathlib.Path, entry: RunEntry) -> dict[str, Any]:
  """What a branch's run_spec.json adds to its entry's overrides: the trunk's
  workdir, absolute (the run process may start anywhere)."""
  if not entry.trunk:
    return {}
  return {BRANCH_FROM: str((pathlib.Path(sweep_dir) / entry.trunk).absolute())}


def trunks_to_do(record: SweepRecord, todo: Sequence[RunEntry], done: Iterable[str],
                 failed_ok: bool) -> list[RunEntry]:
  """The trunks of ``todo``'s budgets that are not done (``done``: the states
  that are), ahead of them; a failed trunk only where failed runs are retried."""
  names = {e.trunk for e in todo if e.trunk}
  out = []
  for trunk in record.trunks:
    if trunk.name not in names or trunk.state in done:
      continue
    if trunk.state == "failed" and not failed_ok:
      continue
    out.append(trunk)
  return out


def steps_text(record: SweepRecord) -> str | None:
  """One line on what branching saves over the record's runs (None: no trunks)."""
  if not record.trunks:
    return None
  branched = [e for e in record.runs if e.trunk]
  from_scratch = sum(e.overrides["train.num_steps"] for e in branched)
  trained = (sum(t.overrides[STOP_STEP] for t in record.trunks)
             + sum(e.overrides["train.num_steps"] - e.overrides[BRANCH_STEP] for e in branched))
  return (f"  {len(record.trunks)} trunk run(s) for {len(branched)} branched budget(s): "
          f"{trained:,} steps trained against {from_scratch:,} from scratch "
          f"({1 - trained / max(from_scratch, 1):.0%} saved)")

