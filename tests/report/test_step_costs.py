"""Each point's train step time and memory against the base point's
(``report.sections.step_costs``), from planted summaries; how a run's step
time is read from its status.json (``collect.step_seconds``); the runs CSV's
columns of them.

The planted sweep (summaries in memory): attention mha (the base), gqa and
mla; one tuning seed (0) over two learning rates, three confirmation seeds
(1-3) at each point's choice. The tuning runs record a step time and memory
far from the confirmation runs', which the table must not read; mla's
confirmation runs recorded none (runs older than the figures).
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from tfx_jax.records import status as status_lib
from tfx_jax.report import assemble, collect, runs_csv, schema
from tfx_jax.report.sections import step_costs

import fakes

MIB = 2**20
LRS = (1e-3, 1e-2)
# point -> (confirmation runs' (validation loss, step seconds, compiled step
# MiB, peak RSS MiB), seeds 1, 2, 3; None: the run recorded none of them).
PLANTED = {
    "mha": [(2.50, 0.010, 100, 500), (2.52, 0.012, 100, 520), (2.54, 0.011, 100, 510)],
    "gqa": [(2.55, 0.0090, 80, 480), (2.56, 0.0088, 80, 470), (2.57, 0.0095, 81, 490)],
    "mla": [(2.60, None, None, None)] * 3,
}


def _entry(attention, lr, seed, stage="tune"):
  return fakes.entry(f"attention-{attention}_learning_rate-{lr!r}_s{seed}", seed,
                     [{"model.attention": attention}],
                     {"model.attention": attention, "optim.learning_rate": lr, "seed": seed},
                     {"optim.learning_rate": lr}, stage=stage)


def _figures(step_s, mib, rss_mib):
  if step_s is None:
    return {}
  return {"step_seconds": step_s, "cores": 2, "peak_rss_bytes": rss_mib * MIB,
          "train_step_memory": {"arguments": (mib - 1) * MIB, "outputs": 0,
                                "temporaries": MIB, "total": mib * MIB}}


def _planted():
  runs, summaries = [], {}
  for attention, confirmation in PLANTED.items():
    for lr, loss in zip(LRS, (2.6, 2.5)):  # the larger rate chosen
      runs.append(_entry(attention, lr, 0))
      summaries[runs[-1].name] = fakes.summary(
          {"eval/loss": loss}, test={"eval/loss": loss}, **_figures(1.0, 999, 9999))
    for seed, (loss, *figures) in enumerate(confirmation, start=1):
      runs.append(_entry(attention, LRS[1], seed, "confirm"))
      summaries[runs[-1].name] = fakes.summary({"eval/loss": loss}, test={"eval/loss": loss},
                                               **_figures(*figures))
  record = fakes.record("costs", [fakes.axis("model.attention", list(PLANTED))], runs, (0,),
                        tune={"optim.learning_rate": list(LRS)}, confirm=3,
                        report_split="test", evaluations=[["--split", "test"]])
  baselines = {n: schema.Baseline(5.7, math.log(1024)) for n in summaries}
  return record, summaries, assemble.analyze(record, summaries, baselines)


def test_each_point_s_step_time_and_memory_against_the_base_s():
  record, summaries, report = _planted()
  assert report.verdict_runs == "confirmation"
  mha, gqa = report.step_costs  # mla recorded none: no row
  assert (mha.key, mha.base, gqa.key, gqa.base) == ((0,), (0,), (1,), (0,))
  assert (mha.runs, gqa.runs) == (3, 3)
  # Medians of the confirmation runs alone (the tuning runs' 1 s and 999 MiB unread).
  assert mha.step_ms == pytest.approx(11.0) and gqa.step_ms == pytest.approx(9.0)
  assert (mha.step_ms_ratio, gqa.step_ms_ratio) == pytest.approx((1.0, 9.0 / 11.0))
  assert (mha.step_bytes, gqa.step_bytes) == (100 * MIB, 80 * MIB)
  assert (mha.step_bytes_ratio, gqa.step_bytes_ratio) == pytest.approx((1.0, 0.8))
  assert (mha.peak_rss_bytes, gqa.peak_rss_bytes) == (510 * MIB, 480 * MIB)
  # report.json: written rounded, read back; a report without them reads as none.
  data = report.to_json()
  assert data["step_costs"][1] == {
      "key": [1], "base": [0], "runs": 3, "step_ms": 9.0, "step_ms_ratio": round(9 / 11, 4),
      "step_bytes": 80 * MIB, "step_bytes_ratio": 0.8, "peak_rss_bytes": 480 * MIB}
  assert schema.Report.from_json(json.loads(json.dumps(data))).step_costs[1].step_ms == 9.0
  del data["step_costs"]
  assert schema.Report.from_json(data).step_costs == ()
  # report.md: beside the compared metric of the confirmation runs.
  md = assemble.render(record, summaries, report, {})
  section = md.split("## Step time and memory", 1)[1].split("\n## ", 1)[0]
  assert "The runs had 2 cores (or accelerators) each." in section
  assert ("| model.attention | runs | eval/loss | ms / step | × base | train step MiB "
          "| × base | peak RSS MiB |") in section
  assert "| mha | 3 | 2.5200 ± 0.0200 | 11.0 | 1.00 | 100.0 | 1.00 | 510 |" in section
  assert "| gqa | 3 | 2.5600 ± 0.0100 | 9.0 | 0.82 | 80.0 | 0.80 | 480 |" in section
  assert "| mla |" not in section


def test_no_step_figures_no_section():
  record, summaries, _ = _planted()
  bare = {name: fakes.summary(s.final, test=s.test) for name, s in summaries.items()}
  baselines = {n: schema.Baseline(5.7, math.log(1024)) for n in bare}
  report = assemble.analyze(record, bare, baselines)
  assert report.step_costs == ()
  assert "## Step time and memory" not in assemble.render(record, bare, report, {})


def test_the_base_is_each_compared_axis_at_its_base_value():
  record = fakes.record("two", [fakes.axis("model.attention", ["mha", "gqa"], reference=1),
                                fakes.axis("model.num_layers", [2, 4])], [], (0,))
  assert step_costs.base_key(record, (0, 1)) == (1, 0)
  assert step_costs.base_key(record, (1, 0)) == (1, 0)


def test_a_run_s_step_time_is_its_train_steps_phase_over_its_steps(tmp_path):
  """``collect.step_seconds``: a branched budget counts its steps from its
  branch step; a status without the phase (or with no step taken) has none."""
  status = status_lib.Status("finished", 40, seconds={"train_steps": 2.0})
  assert collect.step_seconds(status) == 0.05
  assert collect.step_seconds(status, start_step=30) == pytest.approx(0.2)
  assert collect.step_seconds(status_lib.Status("finished", 40, seconds={})) is None
  assert collect.step_seconds(status_lib.Status("running", 0, seconds={"train_steps": 1.0})
                              ) is None
  assert collect.step_seconds(None) is None
  memory = {"arguments": 10, "outputs": 2, "temporaries": 4, "total": 16}
  fakes.write_run(tmp_path / "r_s0", step=40, seconds={"train_steps": 2.0},
                  train_step_memory=memory, peak_rss_bytes=1024)
  run = collect.read_run(tmp_path / "r_s0", fakes.entry("r_s0", 0))
  assert (run.step_seconds, run.train_step_memory, run.peak_rss_bytes) == (0.05, memory, 1024)


def test_the_runs_csv_has_each_run_s_step_time_and_memory(tmp_path):
  record, summaries, _ = _planted()
  runs_csv.write_csv(tmp_path / "report.csv", record, summaries, ["eval/loss"])
  rows = {r["run"]: r for r in csv.DictReader(open(tmp_path / "report.csv"))}
  gqa = rows["attention-gqa_learning_rate-0.01_s2"]
  assert (gqa["step_ms"], gqa["train_step_bytes"], gqa["peak_rss_bytes"]) == (
      "8.8", str(80 * MIB), str(470 * MIB))
  mla = rows["attention-mla_learning_rate-0.01_s1"]
  assert (mla["step_ms"], mla["train_step_bytes"], mla["peak_rss_bytes"]) == ("", "", "")
