"""The report's section "Compute": what the sweep's runs cost and where it went.

Per point (every run of one combination of axis values: each tuned value,
seed and confirmation seed), for the trunk runs of a branched ladder (no
point's: the stable phases its budgets branch from) and in total (trunks
included):

- core-seconds: each run's wall time times the cores it had (status.json's
  ``cores``: CPU cores of its affinity, or its accelerators), summed. A run's
  wall time is the sweep's measure (``RunEntry.wall_seconds``: process
  launches, interpreter start and every attempt included), else (SLURM) the
  sum of the phases its status.json records;
- the fraction of them spent in train steps (status.json's ``seconds``:
  ``train_steps``), the rest being startup, compilation, evaluations and
  checkpointing, also given each in core-seconds;
- the evaluations' time over the train steps' ("eval / train steps",
  ``eval_per_train_step``): what evaluating costs for each second of training
  (a ladder worth shipping keeps it at most 15%: ``eval.num_batches`` reads a
  fixed subset at the evaluations during training, ``eval.final_batches`` the
  whole split at the last).

``costs`` builds it (report.json's ``compute``, ``tfx_jax.records.compute``)
from the record's runs and their summaries' ``seconds`` and ``cores``
(``records.summary.RunSummary``); ``compute_table`` is its table in report.md (``markdown``).
"""

from __future__ import annotations

from typing import Any, Mapping

from tfx_jax.records import status as status_lib
from tfx_jax.records.compute import Compute, ComputeRow
from tfx_jax.records.summary import RunSummaries, RunSummary
from tfx_jax.records.sweep import RunEntry, SweepRecord
from tfx_jax.report.context import Context
from tfx_jax.report.tables import markdown_table
from tfx_jax.report.points import group_points, value_label
from tfx_jax.report.schema import Report


def core_seconds(entry: RunEntry, summary: RunSummary) -> float | None:
  """A run's wall time times its cores (None: no time recorded: not
  started, or written before it was)."""
  seconds = summary.seconds or {}
  if not seconds:
    return None
  # The sweep's own measure where it has one (a local run), else the phases'.
  return float(entry.wall_seconds or sum(seconds.values())) * int(summary.cores or 1)


def _row(key: tuple[int, ...] | None, runs_: list[tuple[RunEntry, RunSummary]]
         ) -> ComputeRow:
  runs, total = 0, 0.0
  phases = dict.fromkeys(status_lib.PHASES, 0.0)
  for entry, summary in runs_:
    cost = core_seconds(entry, summary)
    if cost is None:
      continue
    runs += 1
    total += cost
    for phase in phases:
      phases[phase] += float(summary.seconds.get(phase) or 0.0) * int(summary.cores or 1)
  return ComputeRow(key, runs, total, phases)


def trunk_runs(record: SweepRecord, summaries: RunSummaries
               ) -> list[tuple[RunEntry, RunSummary]]:
  """The trunk runs of a branched ladder (``SweepRecord.trunks``) with their
  summaries: no point's, the ladder's cost."""
  return [(e, summaries[e.name]) for e in record.trunks if e.name in summaries]


def costs(record: SweepRecord, summaries: RunSummaries) -> Compute | None:
  """The section's numbers (None: no run recorded where its time went): each
  point's runs, the trunks of a branched ladder, and the total of both."""
  points = group_points(record, summaries)
  rows = tuple(_row(key, runs) for key, runs in points.items())
  trunks = _row(None, trunk_runs(record, summaries))
  total = _row(None, [run for runs in points.values() for run in runs]
               + trunk_runs(record, summaries))
  if not total.runs:
    return None
  return Compute(tuple(r for r in rows if r.runs), total, trunks if trunks.runs else None)


def fmt_core_time(core_seconds: float) -> str:
  """Core-seconds, as core-minutes or core-hours past an hour."""
  if core_seconds >= 3600:
    return f"{core_seconds / 3600:.2f} core-h"
  return f"{core_seconds / 60:.{1 if core_seconds >= 600 else 2}f} core-min"


def _percent(fraction: float | None) -> str:
  return "-" if fraction is None else f"{100 * fraction:.0f}%"


def compute_table(record: SweepRecord, compute_: Compute) -> list[list[str]]:
  """One row per point and the total: runs, core time, train steps' share,
  each phase's core time and the evaluations' time over the train steps'."""
  # Each axis by its fields' last parts: an axis over several fields names them
  # all ("num_layers+num_steps"), not its last field alone.
  names = ["+".join(f.split(".")[-1] for f in a.label.split("+")) for a in record.axes]
  head = [*names, "runs", "core time", "train steps",
          *(p.replace("_", " ") for p in status_lib.PHASES if p != "train_steps"),
          "eval / train steps"]
  rows = [head]

  def cells(row: ComputeRow) -> list[str]:
    return [str(row.runs), fmt_core_time(row.core_seconds), _percent(row.train_fraction),
            *(fmt_core_time(row.phases[p]) for p in status_lib.PHASES if p != "train_steps"),
            _percent(row.eval_per_train_step)]

  for row in compute_.points:
    rows.append([value_label(a.values[i], a) for a, i in zip(record.axes, row.key)]
                + cells(row))
  if compute_.trunks is not None:
    rows.append(["trunks", *[""] * (len(names) - 1)] + cells(compute_.trunks)
                if names else cells(compute_.trunks))
  rows.append(["**total**", *[""] * (len(names) - 1)] + cells(compute_.total)
              if names else cells(compute_.total))
  return rows


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``compute`` (None: no run recorded its time)."""
  return {"compute": costs(ctx.record, ctx.summaries)}


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> list[str]:
  """What the runs cost: core time per point and in total, the share of it
  in train steps, the evaluations' time over theirs (nothing where no run
  recorded its time)."""
  if report.compute is None:
    return []
  total = report.compute.total
  share = ("" if total.train_fraction is None
           else f", {100 * total.train_fraction:.0f}% of it in train steps")
  if total.eval_per_train_step is not None:
    share += (f"; evaluations took {100 * total.eval_per_train_step:.0f}% of the train "
              "steps' time")
  trunks = report.compute.trunks
  if trunks is not None:
    share += (f"; {trunks.runs} of the runs are trunks, the stable phases the ladder's "
              f"budgets branch from ({fmt_core_time(trunks.core_seconds)})")
  return ["## Compute", "",
          f"{total.runs} runs took {fmt_core_time(total.core_seconds)}{share}. "
          "Core time is each run's wall time (from its process's start, every attempt) "
          "times the cores it had; the phases are those its status.json records "
          "(startup: interpreter, imports, data, state; evaluations: in training and "
          "after it, their compilation included).", "",
          markdown_table(compute_table(ctx.record, report.compute)), ""]
