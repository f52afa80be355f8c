"""Machine-readable run status: `<workdir>/status.json`.

Example:

  {"state": "running", "step": 1200, "reason": "",
   "updated": "2025-01-31T12:00:00+00:00", "num_nonfinite_skipped": 0}

The file is replaced atomically (write a temporary file in the same
directory, then `os.replace`), so a reader never sees a half-written file,
even if the writer is killed.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
from typing import Any

from tfx_jax import files

STATES = ("running", "finished", "diverged", "failed", "preempted")
FILENAME = "status.json"


def write_status(workdir: str | os.PathLike, state: str, step: int,
                 reason: str = "", **extra: Any) -> dict[str, Any]:
  """Atomically writes the status of a run and returns what was written.

  Args:
    workdir: run directory (must exist).
    state: one of `STATES`.
    step: last completed training step.
    reason: human-readable explanation, e.g. why a run diverged or failed.
    **extra: further JSON-able fields, e.g. num_nonfinite_skipped=3.
  """
  if state not in STATES:
    raise ValueError(f"status state={state!r}; choose one of {list(STATES)}")
  status = {
      "state": state,
      "step": int(step),
      "reason": reason,
      "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      **extra,
  }
  files.write_json(pathlib.Path(workdir) / FILENAME, status)
  return status


def read_status(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """Returns the last status written in `workdir`, or None if there is none."""
  try:
    with open(pathlib.Path(workdir) / FILENAME) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
