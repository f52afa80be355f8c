"""status.json is written atomically and read back; where a run's time goes;
what its train step and process weigh."""

import datetime
import json
import pathlib
import subprocess
import sys
import time

import pytest

from tfx_jax.core import atomic as files
from tfx_jax.records import serial
from tfx_jax.records import status

_IMPORTED = time.time()
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "records"


def test_write_then_read(tmp_path):
  assert status.read_status(tmp_path) is None
  status.write_status(tmp_path, "running", 10)
  written = status.write_status(tmp_path, "diverged", 42,
                                reason="loss is nan at step 42",
                                num_nonfinite_skipped=3)
  read = status.read_status(tmp_path)
  assert read == written
  assert read.state == "diverged" and read.step == 42
  assert read.reason == "loss is nan at step 42"
  assert read.num_nonfinite_skipped == 3 and read.num_params is None
  updated = datetime.datetime.fromisoformat(read.updated)
  assert updated.tzinfo is not None
  # Only the status file remains: no temporary files left behind.
  assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
  json.loads((tmp_path / "status.json").read_text())


def test_unknown_state_is_rejected(tmp_path):
  with pytest.raises(ValueError, match="preempted"):
    status.write_status(tmp_path, "paused", 1)
  assert status.read_status(tmp_path) is None


def test_failed_write_keeps_previous_status(tmp_path):
  status.write_status(tmp_path, "running", 5)
  cyclic = []
  cyclic.append(cyclic)
  with pytest.raises(ValueError, match="Circular"):  # fails mid-write
    files.write_json(tmp_path / status.FILENAME, {"state": "running", "step": 6, "bad": cyclic})
  assert status.read_status(tmp_path).step == 5
  assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_seconds_add_up_over_attempts_and_over_runs(tmp_path):
  """status.json's ``seconds``: an attempt adds to what the earlier ones wrote,
  every phase in ``PHASES`` order; the sweep sums them over runs."""
  first = status.Seconds()
  first.add("compile", 2.0)
  first.add("train_steps", 5.0)
  with first.timed("checkpointing"):
    pass
  status.write_status(tmp_path, "preempted", 10, seconds=first.to_json(), cores=2)
  again = status.Seconds(status.read_status(tmp_path).seconds)
  again.add("train_steps", 1.5)
  again.add("startup", -1.0)  # a clock step back never removes time
  written = again.to_json()
  assert list(written) == list(status.PHASES)
  assert (written["compile"], written["train_steps"], written["startup"]) == (2.0, 6.5, 0.0)
  assert written["checkpointing"] >= 0.0
  summed = status.summed([status.Status("finished", 10, seconds=written), None,
                          status.Status("running", 0),
                          status.Status("running", 3, seconds={"train_steps": 0.5})])
  assert summed["train_steps"] == 7.0 and summed["compile"] == 2.0


def test_process_start_is_this_process_s_own():
  """A fresh interpreter started moments ago reports a start just before its
  own clock reading, not the machine's boot or its parent's start."""
  code = ("import time; from tfx_jax.records import status; "
          "print(time.time() - status.process_start())")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, cwd=pathlib.Path(__file__).resolve().parents[2]).stdout
  age = float(out)
  assert 0.0 <= age < 60.0
  # This process (pytest) started before this test module was imported.
  assert status.process_start() <= _IMPORTED


def test_evaluation_markers_hold_their_arguments(tmp_path):
  assert not status.evaluation_marker(tmp_path, 1).exists()
  status.mark_evaluation_done(tmp_path, 1, ["--split", "test", "--lengths", "1x,2x"])
  assert status.evaluation_marker(tmp_path, 1).read_text() == "--split test --lengths 1x,2x\n"
  assert not status.evaluation_marker(tmp_path, 0).exists()


def test_a_status_file_reads_as_its_record_and_a_bad_value_is_named(tmp_path):
  """status.json reads as ``Status`` by attribute: keys an earlier version did
  not write read as not known, keys it does not know are ignored, and a value
  of the wrong type is refused naming its field."""
  (tmp_path / status.FILENAME).write_text(json.dumps(
      {"state": "finished", "step": 4, "reason": "", "updated": "2026-11-23T10:49:04+00:00",
       "num_nonfinite_skipped": 0, "written_later": 1}))
  read = status.read_status(tmp_path)
  assert (read.state, read.step, read.num_nonfinite_skipped) == ("finished", 4, 0)
  assert (read.num_params, read.seconds, read.cores) == (None, None, None)
  (tmp_path / status.FILENAME).write_text(json.dumps({"state": "finished", "step": "4"}))
  with pytest.raises(ValueError, match=r"status.json: step: an integer, got a string '4'"):
    status.read_status(tmp_path)
  (tmp_path / status.FILENAME).write_text(json.dumps({"state": "paused", "step": 4}))
  with pytest.raises(ValueError, match=r"status.json: state: 'paused' is not one of"):
    status.read_status(tmp_path)


def test_a_status_written_before_the_memory_figures_reads_without_them(tmp_path):
  """The statuses an earlier version wrote (the fixtures: started, compiled,
  finished, ..., none with ``train_step_memory`` or ``peak_rss_bytes``) read
  with both not known, and write back without them; the report reads such a
  run as having no step memory."""
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  from tfx_jax.records.sweep import RunEntry  # pylint: disable=import-outside-toplevel
  paths = sorted(FIXTURES.glob("*.status.json"))
  assert len(paths) >= 7
  for path in paths:
    (tmp_path / path.name).mkdir()
    (tmp_path / path.name / status.FILENAME).write_text(path.read_text())
    read = status.read_status(tmp_path / path.name)
    assert (read.train_step_memory, read.peak_rss_bytes) == (None, None), path.name
    assert not {"train_step_memory", "peak_rss_bytes"} & set(serial.to_json(read))
  run = collect.read_run(tmp_path / "finished.status.json", RunEntry("r", 0, (), {}))
  assert (run.train_step_memory, run.peak_rss_bytes) == ({}, None)
  assert run.step_seconds == pytest.approx(58.0 / 30)


def test_the_memory_figures_are_written_and_read_back(tmp_path):
  memory = {"arguments": 4096, "outputs": 16, "temporaries": 1024, "total": 5136}
  written = status.write_status(tmp_path, "finished", 3, train_step_memory=memory,
                                peak_rss_bytes=2**27)
  data = json.loads((tmp_path / status.FILENAME).read_text())
  assert list(data)[-2:] == ["train_step_memory", "peak_rss_bytes"]
  assert list(data["train_step_memory"]) == list(status.MEMORY_KEYS)
  assert status.read_status(tmp_path) == written


def test_compiled_memory_is_the_memory_analysis_as_the_planner_reads_it():
  """Arguments, outputs less those aliased to a donated argument, temporaries
  and their total, from one compiled program; None where a backend has no
  analysis (returns None, or raises)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  x = jnp.ones((64, 32), jnp.float32)
  compiled = jax.jit(lambda a, b: (a @ a.T + 1.0, b * 2.0), donate_argnums=1).lower(
      x, x).compile()
  m = compiled.memory_analysis()
  got = status.compiled_memory(compiled)
  assert got == {"arguments": m.argument_size_in_bytes,
                 "outputs": m.output_size_in_bytes - m.alias_size_in_bytes,
                 "temporaries": m.temp_size_in_bytes,
                 "total": (m.argument_size_in_bytes + m.output_size_in_bytes
                           - m.alias_size_in_bytes + m.temp_size_in_bytes)}
  assert got["arguments"] == 2 * 64 * 32 * 4

  class NoAnalysis:
    def memory_analysis(self):
      return None

  class Refuses:
    def memory_analysis(self):
      raise NotImplementedError("no memory analysis on this backend")

  assert status.compiled_memory(NoAnalysis()) is None
  assert status.compiled_memory(Refuses()) is None


def test_peak_rss_is_this_process_s_in_bytes():
  """ru_maxrss of this process, as bytes: at least the resident pages of an
  array it has just filled."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  filled = np.ones(64 * 2**20 // 8)  # 64 MiB, every page touched
  peak = status.peak_rss_bytes()
  assert peak is not None and peak >= filled.nbytes
