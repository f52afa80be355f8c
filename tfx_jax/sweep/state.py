"""Where a sweep lives on disk and what state each run is in.

  runs/<sweep>/sweep.json       the definition, the command, and per run its
                                overrides, state, step, reason, times
  runs/<sweep>/<run>/           an ordinary training workdir
  runs/<sweep>/<run>/.sweep.lock  held (flock) by whoever executes the run
  runs/<sweep>/<run>/sweep.log    the run's console output, every attempt
  runs/<sweep>/<run>/eval/sweep-<i>.done  extra evaluation i finished

A run's state is read from its own workdir, never from memory, so a sweep
killed at any moment (``kill -9``) is picked up exactly where it was: the
trainer's ``status.json`` says finished / diverged / failed, the lock says
whether a process (a local child, a SLURM task) is executing it now, and
anything else resumes from its checkpoints.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import pathlib
import sys
from typing import Any, Sequence

from tfx_jax import files
from tfx_jax import status as status_lib
from tfx_jax.sweep.spec import Run, format_value, normalize_evaluation

SWEEP_FILE = "sweep.json"
LOCK_FILE = ".sweep.lock"
LOG_FILE = "sweep.log"
# States of a run in sweep.json.
STATES = ("pending", "running", "finished", "diverged", "failed")
DONE = ("finished", "diverged")


def run_dir(sweep_dir: pathlib.Path, run: Run | str) -> pathlib.Path:
  return sweep_dir / (run if isinstance(run, str) else run.name)


def train_command(config_spec: str, workdir: pathlib.Path, overrides: dict[str, Any],
                  python: str = sys.executable) -> list[str]:
  """The ordinary, resumable training command of one run."""
  return [python, "-m", "tfx_jax.train", "--config", config_spec,
          "--workdir", str(workdir),
          *[f"--config.{k}={format_value(v)}" for k, v in overrides.items()]]


def eval_commands(workdir: pathlib.Path, evaluations: Sequence[Sequence[str]],
                  python: str = sys.executable) -> list[list[str]]:
  """``python -m tfx_jax.evaluate --workdir RUN ARGS`` for each extra evaluation."""
  return [[python, "-m", "tfx_jax.evaluate", "--workdir", str(workdir), *args]
          for args in evaluations]


def evaluations_for(record: dict[str, Any], overrides: dict[str, Any]) -> list[list[str]]:
  """The argument lists of the record's evaluations that apply to a run with
  these overrides, in declared order."""
  found = (normalize_evaluation(e) for e in record.get("evaluations", []))
  return [list(e.args) for e in found if e.applies(overrides)]


def run_evaluations(record: dict[str, Any], entry: dict[str, Any]) -> list[list[str]]:
  """One run's evaluations (its entry's own list; a sweep.json written before
  conditional evaluations has only the record's)."""
  if "evaluations" in entry:
    return entry["evaluations"]
  return evaluations_for(record, entry.get("overrides", {}))


def eval_marker(workdir: pathlib.Path, index: int) -> pathlib.Path:
  return workdir / "eval" / f"sweep-{index}.done"


def evaluations_done(workdir: pathlib.Path, n: int) -> bool:
  return all(eval_marker(workdir, i).exists() for i in range(n))


# --------------------------------------------------------------------- locks
def try_lock(workdir: pathlib.Path) -> int | None:
  """An fd holding the run's exclusive lock, or None if another process holds it.

  ``flock(2)`` locks belong to the open file: a child that inherits the fd
  keeps the run locked after the sweep process dies, until it exits itself.
  SLURM tasks take the same lock with util-linux ``flock``.
  """
  workdir.mkdir(parents=True, exist_ok=True)
  fd = os.open(workdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None
  return fd


def is_locked(workdir: pathlib.Path) -> bool:
  if not (workdir / LOCK_FILE).exists():
    return False
  fd = try_lock(workdir)
  if fd is None:
    return True
  os.close(fd)
  return False


# --------------------------------------------------------------------- state
def run_state(workdir: pathlib.Path, num_evaluations: int = 0, *,
              check_lock: bool = True) -> dict[str, Any]:
  """{"state", "step", "reason", "compile_seconds"} of one run, from its workdir.

  ``check_lock=False``: the caller holds the run's lock itself.
  """
  status = status_lib.read_status(workdir) or {}
  step = int(status.get("step", 0))
  out = {"state": "pending", "step": step, "reason": status.get("reason", ""),
         "compile_seconds": status.get("compile_seconds")}
  if check_lock and is_locked(workdir):
    out["state"] = "running"
    return out
  state = status.get("state")
  if state == "finished" and not evaluations_done(workdir, num_evaluations):
    out["reason"] = "evaluations pending"
  elif state in ("finished", "diverged", "failed"):
    out["state"] = state
  elif state in ("running", "preempted"):
    out["reason"] = f"resumes from its last checkpoint (status {state} at step {step})"
  return out


def record_failure(workdir: pathlib.Path, reason: str) -> None:
  """Marks a run failed in its own status.json (a crash the trainer could not record)."""
  step = int((status_lib.read_status(workdir) or {}).get("step", 0))
  workdir.mkdir(parents=True, exist_ok=True)
  status_lib.write_status(workdir, "failed", step, reason=reason)


def log_tail(workdir: pathlib.Path, lines: int = 3) -> str:
  """The last non-empty lines of a run's console log (a failure's reason)."""
  try:
    text = (workdir / LOG_FILE).read_text(errors="replace")
  except FileNotFoundError:
    return ""
  kept = [l.strip() for l in text.splitlines() if l.strip()]
  return " | ".join(kept[-lines:])


# --------------------------------------------------------------- sweep.json
def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_sweep(sweep_dir: pathlib.Path) -> dict[str, Any] | None:
  try:
    return json.loads((sweep_dir / SWEEP_FILE).read_text())
  except FileNotFoundError:
    return None


def write_sweep(sweep_dir: pathlib.Path, record: dict[str, Any]) -> None:
  """Atomically replaces sweep.json (a reader never sees half a file)."""
  record["updated"] = now()
  sweep_dir.mkdir(parents=True, exist_ok=True)
  files.write_json(sweep_dir / SWEEP_FILE, record)


def refresh(sweep_dir: pathlib.Path, record: dict[str, Any]) -> dict[str, Any]:
  """Updates every run's state in ``record`` from its workdir; returns ``record``."""
  for entry in record["runs"]:
    entry.update(run_state(run_dir(sweep_dir, entry["name"]),
                           len(run_evaluations(record, entry))))
  return record


def counts(record: dict[str, Any]) -> dict[str, int]:
  out = {s: 0 for s in STATES}
  for entry in record["runs"]:
    out[entry["state"]] += 1
  return out
