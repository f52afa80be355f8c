"""The planted sweeps of tests/fakes.py are what the code writes and reads."""

from __future__ import annotations

import fakes
from tfx_jax.records import sweep as sweep_lib
from tfx_jax.report import collect


def test_a_planted_summary_is_the_one_collect_reads_from_a_run_that_logged_nothing(tmp_path):
  entry = fakes.entry("r_s0", 0)
  fakes.write_run(tmp_path / "r_s0", step=0)
  assert collect.read_run(tmp_path / "r_s0", entry) == fakes.summary()


def test_a_planted_sweep_reads_back_as_its_record(tmp_path):
  record = fakes.record(
      "planted", [fakes.axis("model.activation", ["relu", "gelu"], comparisons=[[1, 0]])],
      [fakes.entry(f"activation-{a}_s0", 0, [{"model.activation": a}],
                   {"model.activation": a, "seed": 0}) for a in ("relu", "gelu")],
      seeds=[0], evaluations=[["--split", "test"]], until_resolved=3,
      added=[{"name": "activation-relu_s1", "seed": 1, "like": "activation-relu_s0"}])
  fakes.write_sweep(tmp_path, record)
  read = sweep_lib.read(tmp_path)
  assert read == sweep_lib.SweepRecord(**{**vars(record), "updated": read.updated})
  assert read.runs[0].evaluations == (("--split", "test"),)
  # As a version before the budget was kept wrote it: the reader works it out.
  fakes.write_sweep(tmp_path, record, written_before=["until_resolved"])
  assert sweep_lib.read(tmp_path).until_resolved == 1
