"""Where a sweep lives on disk and what state each run is in.

  runs/<sweep>/sweep.json       the record (``tfx_jax.records.sweep``): the
                                definition, the command, and per run its
                                overrides, state, step, reason, times
  runs/<sweep>/<run>/           an ordinary training workdir
  runs/<sweep>/<run>/run_spec.json  what the run trains (``records.run_spec``):
                                written by the executor before it starts the
                                run, read by its ``python -m tfx_jax.train --spec``
  runs/<sweep>/<run>/.sweep.lock  held (flock) by whoever executes the run
  runs/<sweep>/<run>/sweep.log    the run's console output, every attempt
  runs/<sweep>/<run>/eval/sweep-<i>.done  extra evaluation i finished
                                (``status.evaluation_marker``: written by the
                                training process that ran it, or by the
                                executor after a separate evaluation command)

A run's state is read from its own workdir, never from memory, so a sweep
killed at any moment (``kill -9``) is picked up exactly where it was: the
trainer's ``status.json`` says finished / diverged / failed, the lock says
whether a process (a local child, a SLURM task) is executing it now, and
anything else resumes from its checkpoints.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pathlib
import sys
import typing
from typing import Sequence

from tfx_jax.records import run_spec
from tfx_jax.records import status as status_lib
from tfx_jax.sweep.spec import Run
from tfx_jax.records.run_spec import RunSpec
from tfx_jax.records.sweep import RunEntry, RunProgress, State, SweepRecord

LOCK_FILE = ".sweep.lock"
LOG_FILE = "sweep.log"
# States of a run in sweep.json.
STATES: tuple[State, ...] = typing.get_args(State)
DONE = ("finished", "diverged")


def run_dir(sweep_dir: pathlib.Path, run: Run | str) -> pathlib.Path:
  return sweep_dir / (run if isinstance(run, str) else run.name)


def write_spec(sweep_dir: pathlib.Path, record: SweepRecord, entry: RunEntry,
               in_process: bool = True) -> RunSpec:
  """Writes the run's spec (``run_spec.json``, from its validated entry) into
  its directory, where its training command reads it; returns it.
  ``in_process``: the training process runs the run's evaluations after its
  last step (or, on a finished run, from its checkpoint); otherwise the
  executor runs them as commands of their own (``eval_commands``)."""
  spec = run_spec.of_entry(record, entry, in_process)
  if entry.trunk:  # a branched budget: where its trunk's checkpoints are
    from tfx_jax.sweep import branching  # pylint: disable=import-outside-toplevel
    spec = dataclasses.replace(spec, overrides={
        **spec.overrides, **branching.spec_overrides(sweep_dir, entry)})
  run_spec.write(run_dir(sweep_dir, entry.name), spec)
  return spec


def train_command(workdir: pathlib.Path, python: str = sys.executable) -> list[str]:
  """The ordinary, resumable training command of one run, which trains the
  spec written into its directory (``write_spec``)."""
  return [python, "-m", "tfx_jax.train", "--spec", str(run_spec.path(workdir)),
          "--workdir", str(workdir)]


def eval_commands(workdir: pathlib.Path, evaluations: Sequence[Sequence[str]],
                  python: str = sys.executable) -> list[list[str]]:
  """``python -m tfx_jax.evaluate --workdir RUN ARGS`` for each extra evaluation."""
  return [[python, "-m", "tfx_jax.evaluate", "--workdir", str(workdir), *args]
          for args in evaluations]


def eval_marker(workdir: pathlib.Path, index: int) -> pathlib.Path:
  return status_lib.evaluation_marker(workdir, index)


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
              check_lock: bool = True) -> RunProgress:
  """Where one run stands, from its workdir.

  ``check_lock=False``: the caller holds the run's lock itself.
  """
  status = status_lib.read_status(workdir)
  step = status.step if status else 0
  reason, compile_seconds = (status.reason, status.compile_seconds) if status else ("", None)
  if check_lock and is_locked(workdir):
    return RunProgress("running", step, reason, compile_seconds)
  state = status.state if status else None
  if state == "finished" and not evaluations_done(workdir, num_evaluations):
    return RunProgress("pending", step, "evaluations pending", compile_seconds)
  if state in ("finished", "diverged", "failed"):
    return RunProgress(state, step, reason, compile_seconds)
  if state in ("running", "preempted"):
    reason = f"resumes from its last checkpoint (status {state} at step {step})"
  return RunProgress("pending", step, reason, compile_seconds)


def record_failure(workdir: pathlib.Path, reason: str) -> None:
  """Marks a run failed in its own status.json (a crash the trainer could not record)."""
  status = status_lib.read_status(workdir)
  step = status.step if status else 0
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


# ------------------------------------------------------------------- record
def refresh(sweep_dir: pathlib.Path, record: SweepRecord) -> SweepRecord:
  """Updates every run's state in ``record`` from its workdir; returns ``record``."""
  for entry in [*record.runs, *record.trunks]:
    entry.observe(run_state(run_dir(sweep_dir, entry.name), len(entry.evaluations)))
  return record


def counts(record: SweepRecord) -> dict[State, int]:
  out = {s: 0 for s in STATES}
  for entry in record.runs:
    out[entry.state] += 1
  return out
