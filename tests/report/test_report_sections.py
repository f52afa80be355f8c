"""The report's sections (``tfx_jax/report/sections``): every committed
``docs/results/*/report.json`` renders the numbers its report.md shows, and a
section planted in the registry alone reaches report.md and report.json.

What report.json alone renders: the noise floor, the effective speedup, the
learning-rate sensitivity, the evaluation effects, the layer profiles, each
axis's comparisons table, the tuned values and the tuning stage (whose only
use of the sweep record is the axis labels, which each point's ``values``
keys are), and the compute total. What needs the sweep's runs (sweep.json
and the run directories, not committed beside the reports): the title and
the reproduce lines, the points table (tokens/s), the length extrapolation and
the per-layer table (each run's summary), the compute table's point rows and
the sentences of the verdicts and designs (each point's own tuned grid, from
its runs); for those, each comparison's sentence stored in report.json is
checked against report.md instead.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import textwrap
import types

import pytest

from tfx_jax.records import serial
from tfx_jax.report import assemble, collect, schema, sections
from tfx_jax.report.sections import (comparisons, compute, evaluation_effects,
                                     layer_profiles, noise, provenance, speedup, tuned,
                                     tuning_stage)
from tfx_jax.report.tables import markdown_table

import fakes

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results"
REPORTS = sorted(RESULTS.glob("**/report.json"))


def _labels_record(report: schema.Report):
  """A stand-in for the sweep record where a table reads only its axis labels."""
  labels = list(report.points[0].values) if report.points else []
  return types.SimpleNamespace(axes=[types.SimpleNamespace(label=label) for label in labels])


def _comparison_tables(report: schema.Report, md: str) -> list[str]:
  """Each axis's comparisons table; an axis's base value is the one its
  heading names (a row against another base is a declared pair)."""
  out = []
  for axis in dict.fromkeys(r.axis for r in report.comparisons):
    rows = [r for r in report.comparisons if r.axis == axis]
    head = f"### {axis} (base value: "
    assert head in md, f"no comparisons heading for {axis}"
    base = md.split(head, 1)[1].split(")", 1)[0].split(";", 1)[0]
    reference = next((r.base_index for r in rows if r.base_value == base), None)
    out.append(markdown_table(comparisons.comparisons_table(rows, reference)))
  return out


def test_every_committed_report_json_is_found():
  assert len(REPORTS) >= 9, REPORTS


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: str(p.parent.relative_to(RESULTS)))
def test_a_committed_report_json_renders_the_numbers_of_its_report_md(path):
  report = schema.Report.from_json(json.loads(path.read_text()))
  md = (path.parent / "report.md").read_text()
  blocks = ["\n".join(noise.markdown(None, report, {})),
            "\n".join(speedup.markdown(None, report, {})),
            *_comparison_tables(report, md)]
  if report.sensitivity:
    blocks.append(markdown_table(tuned.sensitivity_table(report)))
  if report.evaluation_effects:
    blocks.append(markdown_table(evaluation_effects.evaluation_effects_table(report)))
  if report.layer_profiles:
    blocks.append(markdown_table(layer_profiles.layer_trends_table(report)))
  if report.tune:
    # A sweep with tune_at: where each point's value came from (report.json's
    # provenance, the section's own record).
    sources = {tuple(row["key"]): serial.from_json(provenance.Provenance, row, str(path)).text
               for row in json.loads(path.read_text()).get("provenance", ())}
    blocks.append(markdown_table(tuned.tuned_table(_labels_record(report), report,
                                                   sources or None)))
  if report.verdict_runs == "confirmation":
    blocks.append(markdown_table(tuning_stage.tuning_stage_table(_labels_record(report),
                                                                 report)))
  if report.compute is not None:
    total = report.compute.total
    blocks.append(f"{total.runs} runs took {compute.fmt_core_time(total.core_seconds)}")
  for block in blocks:
    assert block in md, f"{path}: not in report.md:\n{block}"
  # A section with no numbers has no place in the report.md either.
  for rows, heading in ((report.noise, "## Noise floor and power"),
                        (report.speedups, "## Effective speedup over AdamW"),
                        (report.compute, "## Compute")):
    assert bool(rows) == (heading in md), f"{path}: {heading}"
  # The sentences need the sweep's runs; report.json keeps them as written.
  main = [r for r in report.comparisons if r.metric == report.select_by] or list(
      report.comparisons)
  for row in [*main, *report.failed]:
    assert f"- {row.text}" in md, f"{path}: not in report.md: {row.text}"
  assert report.comparisons or report.failed or "## Comparisons" not in md


PLANTED = '''
"""A statistic planted by the test: the number of finished runs."""

def compute(ctx):
  finished = sum(s.state == "finished" for s in ctx.summaries.values())
  return {"planted_finished_runs": {"runs": finished}}


def markdown(ctx, report, plots):
  runs = compute(ctx)["planted_finished_runs"]["runs"]
  return ["## Planted statistic", "", f"{runs} runs finished.", ""]
'''


def test_a_new_section_is_one_module_and_one_registry_line(tmp_path, monkeypatch):
  """A section written as one module and listed in ``SECTIONS`` (here by the
  test: the one line a contributor adds) reaches report.md at its place in
  the registry and report.json under its field, with no other file edited."""
  from test_report import LOSSES, sweep_record, write_run  # the planted sweep
  root = tmp_path / "planted"
  runs = []
  for (norm, pos), losses in LOSSES.items():
    for seed, loss in enumerate(losses):
      name = f"norm_position-{norm}_position-{pos}_s{seed}"
      write_run(root, name, seed, loss)
      runs.append(fakes.entry(name, seed,
                              [{"model.norm_position": norm}, {"model.position": pos}],
                              state="finished"))
  record = sweep_record("planted", [fakes.axis("model.norm_position", ["pre", "post"]),
                                    fakes.axis("model.position", ["rope", "alibi"])],
                        runs, seeds=[0, 1, 2])
  fakes.write_sweep(root, record)
  source = tmp_path / "planted_statistic.py"
  source.write_text(textwrap.dedent(PLANTED))
  spec = importlib.util.spec_from_file_location("planted_statistic", source)
  planted = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(planted)
  registry = list(sections.SECTIONS)
  registry.insert(registry.index(noise), planted)  # the registry line
  monkeypatch.setattr(sections, "SECTIONS", tuple(registry))
  md = assemble.write_report(root).read_text()
  data = json.loads((root / "report.json").read_text())
  _, summaries = collect.collect(root)
  finished = sum(s.state == "finished" for s in summaries.values())
  assert finished
  assert f"## Planted statistic\n\n{finished} runs finished.\n" in md
  assert md.index("## Planted statistic") < md.index("## Noise floor and power")
  assert data["planted_finished_runs"] == {"runs": finished}
  # The schema's fields are as they were: the new one sits beside them.
  assert set(data) - {"planted_finished_runs"} == set(
      schema.Report.from_json(data).to_json())
