"""status.json is written atomically and read back."""

import datetime
import json

import pytest

from tfx_jax import status


def test_write_then_read(tmp_path):
  assert status.read_status(tmp_path) is None
  status.write_status(tmp_path, "running", 10)
  written = status.write_status(tmp_path, "diverged", 42,
                                reason="loss is nan at step 42",
                                num_nonfinite_skipped=3)
  read = status.read_status(tmp_path)
  assert read == written
  assert read["state"] == "diverged" and read["step"] == 42
  assert read["reason"] == "loss is nan at step 42"
  assert read["num_nonfinite_skipped"] == 3
  updated = datetime.datetime.fromisoformat(read["updated"])
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
    status.write_status(tmp_path, "running", 6, bad=cyclic)
  assert status.read_status(tmp_path)["step"] == 5
  assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
