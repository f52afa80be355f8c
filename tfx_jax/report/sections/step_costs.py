"""The report's section "Step time and memory": what each point's train step
costs on the machine that ran it, beside what it scores.

Per point, over the runs the per-point tables show (``points.at_chosen``: a
tuned point's runs at its chosen value, its confirmation runs where it has
them), the median over its runs of

- milliseconds per train step: status.json's ``train_steps`` phase over the
  steps the run took (``collect.step_seconds``: the loop's time less its
  compilation, evaluations and checkpointing, so input batches and logging
  are in it; a mean over every step, where ``train/tokens_per_sec`` is a
  median over logging intervals and needs the tokens of a step);
- the compiled train step's memory per device: status.json's
  ``train_step_memory`` total (``Compiled.memory_analysis()``, as
  ``scale/plan.py`` reads it: arguments, outputs not written in place of a
  donated argument, temporaries), in MiB;
- the training process's peak resident memory (status.json's
  ``peak_rss_bytes``, ``getrusage``'s ``ru_maxrss`` at the end of training:
  the interpreter, the data pipeline, the compiler and the buffers), in MiB;

the time and the compiled memory also as ratios to the base point's: the
point with every compared axis at its base value (``AxisRecord.reference``)
in the same context (a ladder's rung and budget, ``context.context_axes``),
so a variant's cost reads against the base beside its quality, the metric
the comparisons lead with (``compared_by``: mean ± std over the point's
compared runs, as the points table has it). A time is of the cores the run
had and the load beside it (runs of ``--parallel`` share a machine), so
ratios between runs of one sweep on one machine are what it measures.

``step_costs`` builds report.json's ``step_costs`` (``records.compute.StepCost``);
``step_costs_table`` is its table in report.md.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence

from tfx_jax.records.compute import StepCost
from tfx_jax.records.summary import RunSummary
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report.context import Context, compared_by, context_axes
from tfx_jax.report.points import Points, at_chosen
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.sections import selection
from tfx_jax.report.tables import Lines, markdown_table, pm, point_cells

MIB = 2**20


def base_key(record: SweepRecord, key: Sequence[int]) -> tuple[int, ...]:
  """The point ``key``'s ratios are over: each compared axis at its base
  value, each context axis (``context_axes``) at ``key``'s."""
  contexts = context_axes(record)
  return tuple(k if ai in contexts else a.reference
               for ai, (a, k) in enumerate(zip(record.axes, key)))


def _median(summaries: Sequence[RunSummary], value: Callable[[RunSummary], float | None]
            ) -> float | None:
  values = [v for v in map(value, summaries) if v is not None]
  return float(statistics.median(values)) if values else None


def _ratio(value: float | None, base: float | None) -> float | None:
  return None if value is None or not base else value / base


def step_costs(record: SweepRecord, points: Sequence[Point], groups: Points) -> list[StepCost]:
  """Each point's step time and memory (``StepCost``; a point none of whose
  shown runs recorded any: no row), in the points' order."""
  shown = at_chosen(groups, {p.key: p.chosen for p in points})
  measured = {}
  for point in points:
    runs = [s for _, s in shown.get(point.key, []) if s.step_seconds is not None
            or s.train_step_memory.get("total") is not None or s.peak_rss_bytes is not None]
    if runs:
      measured[point.key] = (len(runs), _median(runs, lambda s: None if s.step_seconds is None
                                                else 1000.0 * s.step_seconds),
                             _median(runs, lambda s: s.train_step_memory.get("total")),
                             _median(runs, lambda s: s.peak_rss_bytes))
  out = []
  for key, (runs, ms, memory, rss) in measured.items():
    base = base_key(record, key)
    _, base_ms, base_memory, _ = measured.get(base, (0, None, None, None))
    out.append(StepCost(key=key, base=base, runs=runs, step_ms=ms,
                        step_ms_ratio=_ratio(ms, base_ms), step_bytes=memory,
                        step_bytes_ratio=_ratio(memory, base_memory), peak_rss_bytes=rss))
  return out


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``step_costs`` (none where no run recorded them)."""
  return {"step_costs": tuple(step_costs(ctx.record, selection.points(ctx), ctx.groups))}


def _cell(value: float | None, form: str) -> str:
  return "-" if value is None else format(value, form)


def step_costs_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """One row per point: its runs, its compared metric, ms per train step and
  its ratio to the base, the compiled train step's MiB and its ratio, the
  peak resident MiB."""
  metric = compared_by(record)
  rows = [[a.label for a in record.axes]
          + ["runs", metric, "ms / step", "× base", "train step MiB", "× base",
             "peak RSS MiB"]]
  for row in report.step_costs:
    point = report.point(row.key)
    quality = ([v[metric] for v in point.compared.values() if metric in v]
               if point is not None else [])
    rows.append(point_cells(record, row.key)
                + [str(row.runs), pm(quality), _cell(row.step_ms, ".1f"),
                   _cell(row.step_ms_ratio, ".2f"),
                   _cell(None if row.step_bytes is None else row.step_bytes / MIB, ".1f"),
                   _cell(row.step_bytes_ratio, ".2f"),
                   _cell(None if row.peak_rss_bytes is None else row.peak_rss_bytes / MIB,
                         ".0f")])
  return rows


def _cores(ctx: Context, report: Report) -> str:
  """The cores the shown runs had, as a phrase ("" where none recorded them)."""
  shown = at_chosen(ctx.groups, report.chosen())
  cores = sorted({s.cores for rows in shown.values() for _, s in rows if s.cores})
  if not cores:
    return ""
  counts = str(cores[0]) if len(cores) == 1 else f"{cores[0]} to {cores[-1]}"
  return f" The runs had {counts} cores (or accelerators) each."


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Each point's train step time and memory, against the base point's,
  beside its quality (nothing where no run recorded them)."""
  if not report.step_costs:
    return []
  return ["## Step time and memory", "",
          "Per point, the median over its runs (those of the points table): milliseconds "
          "per train step (the train-step phase's seconds over the steps taken: "
          "compilation, evaluations and checkpointing left out), the compiled train "
          "step's memory per device (arguments, outputs and temporaries, from XLA's "
          "memory analysis) and the training process's peak resident memory, each time "
          "and compiled memory also over the base point's (every compared axis at its "
          f"base value), beside {compared_by(ctx.record)} (mean ± std of the compared "
          f"runs).{_cores(ctx, report)}", "",
          markdown_table(step_costs_table(ctx.record, report)), ""]
