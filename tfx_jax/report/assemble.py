"""A sweep's report, assembled from its sections: ``runs/<sweep>/report.md``,
``report.json``, ``report.csv`` and PNG plots.

Each section (``sections.SECTIONS``, in report order) computes its numbers
from the shared ``context.Context`` (the sweep record, the runs' summaries,
their baselines, the options), writes its plots and renders its part of
report.md from the numbers; this module walks them. ``analyze`` is the
numbers (``schema.Report``, whose serialisation is report.json, with each
comparison's sentences rendered into it when it is written:
``verdicts.with_sentences``), ``render`` the markdown, ``write_report``
everything. Everything below ``write_report`` is a pure function of
``collect.collect``'s output and the datasets' baselines (``baselines``), so it
is tested on planted run summaries.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping

from tfx_jax.core import atomic as files
from tfx_jax.records import serial
from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import collect as collect_lib
from tfx_jax.report import runs_csv
from tfx_jax.report.context import Context
from tfx_jax.report.schema import Baseline, Options, Report
from tfx_jax.report import sections
from tfx_jax.report.sections import claims as claims_section
from tfx_jax.report.sections import verdicts

REPORT_FIELDS = frozenset(f.name for f in dataclasses.fields(Report))


def fields(ctx: Context) -> dict[str, Any]:
  """Every section's report.json fields (``compute``), computed once."""

  def make() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section in sections.SECTIONS:
      if hasattr(section, "compute"):
        out.update(section.compute(ctx))
    return out

  return ctx.once("fields", make)


def report_of(ctx: Context) -> Report:
  """The report's numbers: the fields of ``schema.Report`` the sections fill."""
  return Report(**{k: v for k, v in fields(ctx).items() if k in REPORT_FIELDS})


def analyze(record: SweepRecord, summaries: RunSummaries, baselines: Mapping[str, Baseline],
            options: Options = Options()) -> Report:
  """The report: the points, the comparisons and what they rest on.

  ``baselines`` maps each run name to its dataset's ``Baseline``.
  """
  return report_of(Context(record, summaries, baselines, options))


def report_json(ctx: Context, report: Report) -> dict[str, Any]:
  """report.json: the report with its sentences rendered
  (``verdicts.with_sentences``), then the fields of sections outside the
  schema, each under its name, then the claims' labels (``claims``)."""
  extra = {k: serial.to_json(v) for k, v in fields(ctx).items() if k not in REPORT_FIELDS}
  found = claims_section.results(ctx, report)
  if found:
    extra["claims"] = serial.to_json(found)
  return {**verdicts.with_sentences(ctx.record, report).to_json(), **extra}


def render_context(ctx: Context, report: Report, plots: Mapping[str, str]) -> str:
  """The report's markdown: every section's part, in order."""
  return "\n".join(line for section in sections.SECTIONS if hasattr(section, "markdown")
                   for line in section.markdown(ctx, report, plots))


def render(record: SweepRecord, summaries: RunSummaries, report: Report,
           plots: Mapping[str, str]) -> str:
  """The markdown of ``report`` (its options and baselines), of the sweep
  ``record`` whose runs' summaries are ``summaries``."""
  return render_context(Context(record, summaries, report.baselines, report.options),
                        report, plots)


def report_options(record: SweepRecord, stall_margin: float | None = None,
                   equivalence_margin: float | None = None) -> Options:
  """The given options, else the sweep's own (``--stall-margin`` and
  ``--equivalence-margin`` of ``python -m tfx_jax.sweep``), else the defaults."""
  saved = {k: v for k, v in record.report_options.to_json().items() if v is not None}
  given = {k: v for k, v in (("stall_margin", stall_margin),
                             ("equivalence_margin", equivalence_margin)) if v is not None}
  return Options(**{**saved, **given})


def relabel(report_dir: str | pathlib.Path, record: SweepRecord) -> pathlib.Path:
  """Labels the claims of ``record`` (the sweep as its experiment file
  declares it now) on the report already in ``report_dir``, from its
  report.json alone: a committed report whose runs are gone. Writes
  report.json with its ``claims`` (every other key as it was) and report.md
  with its claims block replaced (or added after the title); returns report.md."""
  import json  # pylint: disable=import-outside-toplevel
  from tfx_jax.report.claims import evaluate  # pylint: disable=import-outside-toplevel
  report_dir = pathlib.Path(report_dir)
  path = report_dir / "report.json"
  data = json.loads(path.read_text())
  report = Report.from_json(data)
  found = evaluate(record.claims, report, claims_section.design_tokens(record))
  data.pop("claims", None)
  if found:
    data["claims"] = serial.to_json(found)
  files.write_json(path, data)
  md = report_dir / "report.md"
  text = md.read_text()
  # A report written before its sweep declared claims says so above its
  # sections (their verdicts are Holm over its own comparisons).
  before = "## Exploratory comparisons" not in text
  md.write_text(claims_section.replace_block(
      text, claims_section.markdown_lines(found, relabelled=before)))
  return md


def write_report(sweep_dir: str | pathlib.Path, *, stall_margin: float | None = None,
                 equivalence_margin: float | None = None) -> pathlib.Path:
  """Writes report.md, report.json, report.csv and the PNG plots of
  ``sweep_dir``; returns report.md. Margins not given are the sweep's own
  (``report_options`` in sweep.json), else the defaults."""
  # The datasets' baselines read the data and its tokenizers: imported when a report is written.
  from tfx_jax.report import baselines  # pylint: disable=import-outside-toplevel
  from tfx_jax.report import style  # pylint: disable=import-outside-toplevel
  sweep_dir = pathlib.Path(sweep_dir)
  record, summaries = collect_lib.collect(sweep_dir)
  options = report_options(record, stall_margin, equivalence_margin)
  ctx = Context(record, summaries, baselines.of_runs(sweep_dir, record), options)
  report = report_of(ctx)
  palette = style.Palette(record)
  plots: dict[str, str] = {}
  for section in sections.SECTIONS:
    if hasattr(section, "plots"):
      plots.update(section.plots(ctx, report, sweep_dir, palette))
  runs_csv.write_csv(sweep_dir / "report.csv", record, summaries,
                     runs_csv.metric_names(list(summaries.values())))
  files.write_json(sweep_dir / "report.json", report_json(ctx, report))
  path = sweep_dir / "report.md"
  path.write_text(render_context(ctx, report, plots))
  return path
