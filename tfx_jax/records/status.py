"""Machine-readable run status: `<workdir>/status.json`.

Example:

  {"state": "running", "step": 1200, "reason": "",
   "updated": "2025-01-31T12:00:00+00:00", "num_nonfinite_skipped": 0,
   "seconds": {"startup": 9.1, "compile": 6.6, "train_steps": 58.0,
               "evaluations": 3.2, "checkpointing": 0.8}, "cores": 1,
   "train_step_memory": {"arguments": 1048576, "outputs": 4096,
                         "temporaries": 524288, "total": 1576960},
   "peak_rss_bytes": 912261120}

``seconds`` is where the run's time went (``Seconds``), summed over every
attempt made in the workdir (a resumed or re-evaluated run adds to it):
``startup`` from the process's start to the training loop (interpreter,
imports, data, state, restoring a checkpoint), ``compile`` the train step's
compilation and every program's tracing, lowering and compiling (or reading
from the persistent cache) inside the other timed phases (an evaluation's
first call compiles the eval step: that is compile, not evaluation),
``train_steps`` the loop's steps (their input batches and logging included),
``evaluations`` the evaluations in the loop and after it, ``checkpointing``
saving (and waiting for) checkpoints. ``cores`` is what the
process had: its CPU cores (affinity) on a CPU, else its local accelerators.

What the train step weighs: ``train_step_memory`` is the compiled train
step's ``Compiled.memory_analysis()`` per device (``compiled_memory``, as
``scale/plan.py`` reads it: the arguments, the outputs not written in place
of a donated argument, the temporaries XLA allocates, and their total), left
out where the backend gives no analysis; ``peak_rss_bytes`` the training
process's peak resident memory at the end of training (``peak_rss_bytes``:
``getrusage``'s ``ru_maxrss``; of process 0, which writes the file), the
largest of every attempt's.

It is the ``Status`` record (``records.serial``): its fields in that order,
each optional one left out where not known (a status written before the
train step compiled has no ``num_params``; one the sweep writes for a run
that crashed has only state, step, reason and time). A run branched from
another's checkpoint (``train.branch_from``) records ``branch_from`` (that
run's workdir) and ``branch_step``.

The file is replaced atomically (write a temporary file in the same
directory, then `os.replace`), so a reader never sees a half-written file,
even if the writer is killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import sys
import time
import typing
from typing import Any, Iterator, Literal, Mapping, Sequence

from tfx_jax.core import atomic as files
from tfx_jax.records import serial

State = Literal["running", "finished", "diverged", "failed", "preempted"]
STATES: tuple[str, ...] = typing.get_args(State)
FILENAME = "status.json"
# Where a run's time goes (status.json's ``seconds``), in the order it is spent.
PHASES = ("startup", "compile", "train_steps", "evaluations", "checkpointing")


@serial.layout(omit_none=("num_nonfinite_skipped", "num_params", "compile_seconds", "seconds",
                          "cores", "branch_from", "branch_step", "budgets",
                          "train_step_memory", "peak_rss_bytes"))
@dataclasses.dataclass(frozen=True)
class Status:
  """status.json: where a run stands and what it cost (None: not known yet)."""
  state: State
  step: int                    # the last completed training step
  reason: str = ""             # why it diverged, failed or stopped ("" none)
  updated: str = ""            # when it was written: UTC, to the second
  num_nonfinite_skipped: int | None = None  # updates skipped as non-finite (run's end)
  num_params: int | None = None             # the model's, once the step compiled
  compile_seconds: float | None = None      # the train step's compilation
  seconds: dict[str, float] | None = None   # {PHASES: seconds}, every attempt (``Seconds``)
  cores: int | None = None     # CPU cores (affinity), or local accelerators
  # A run started from another's checkpoint (train.branch_from): that run's
  # workdir and the step, where this run's curves join the trunk's.
  branch_from: str | None = None
  branch_step: int | None = None
  # What a comparison can hold equal (run/footprint.py's ``budgets``): params,
  # non_embedding_params, train_flops_per_token, kv_bytes_per_token,
  # state_bytes_per_sequence; written with num_params.
  budgets: dict[str, int] | None = None
  # The compiled train step's bytes per device ({MEMORY_KEYS: bytes}, written
  # with num_params) and the process's peak resident bytes (the run's end);
  # a status written before they were recorded has neither (None).
  train_step_memory: dict[str, int] | None = None
  peak_rss_bytes: int | None = None


serial.versioned(Status, FILENAME)


def write_status(workdir: str | os.PathLike, state: str, step: int,
                 reason: str = "", **fields: Any) -> Status:
  """Atomically writes the status of a run and returns what was written.

  Args:
    workdir: run directory (must exist).
    state: one of `STATES`.
    step: last completed training step.
    reason: human-readable explanation, e.g. why a run diverged or failed.
    **fields: the other fields of ``Status``, e.g. num_nonfinite_skipped=3.
  """
  if state not in STATES:
    raise ValueError(f"status state={state!r}; choose one of {list(STATES)}")
  status = Status(state, int(step), reason,
                  datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  **fields)
  files.write_json(pathlib.Path(workdir) / FILENAME, serial.to_json(status))
  return status


def read_status(workdir: str | os.PathLike) -> Status | None:
  """Returns the last status written in `workdir`, or None if there is none."""
  try:
    with open(pathlib.Path(workdir) / FILENAME) as f:
      return serial.from_json(Status, json.load(f))
  except FileNotFoundError:
    return None


def evaluation_marker(workdir: str | os.PathLike, index: int) -> pathlib.Path:
  """Exists once the run's evaluation after training number ``index`` (of the
  list its training command or sweep gives) has finished; holds its arguments."""
  return pathlib.Path(workdir) / "eval" / f"sweep-{index}.done"


def mark_evaluation_done(workdir: str | os.PathLike, index: int,
                         args: Sequence[str]) -> None:
  marker = evaluation_marker(workdir, index)
  marker.parent.mkdir(parents=True, exist_ok=True)
  marker.write_text(shlex.join(args) + "\n")


def process_start() -> float | None:
  """When this process started, in ``time.time()`` seconds (None where the OS
  does not say): Linux's start time of the process (``/proc/self/stat``, field
  22, in clock ticks since boot) against the seconds since boot (``/proc/uptime``)."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()  # after the command name
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22; fields[0] is 3
  except (OSError, ValueError, IndexError):
    return None
  return time.time() - (uptime - started)


# status.json's ``train_step_memory``, in file order.
MEMORY_KEYS = ("arguments", "outputs", "temporaries", "total")


def compiled_memory(compiled) -> dict[str, int] | None:
  """{MEMORY_KEYS: bytes per device} of a compiled program
  (``jax.stages.Compiled``), read from its ``memory_analysis()`` as
  ``scale/plan.py`` reads it: the arguments (donated ones included), the
  outputs less those aliased to a donated argument (written in its place),
  XLA's temporaries, and their total. None where the backend gives no
  analysis (it returns None or raises)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None  # e.g. a backend without the analysis: not known
  if m is None:
    return None
  parts = {"arguments": int(m.argument_size_in_bytes),
           "outputs": max(0, int(m.output_size_in_bytes) - int(m.alias_size_in_bytes)),
           "temporaries": int(m.temp_size_in_bytes)}
  return {**parts, "total": sum(parts.values())}


def peak_rss_bytes() -> int | None:
  """This process's peak resident memory so far, in bytes (None where the OS
  does not say): ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, in KiB on
  Linux and in bytes on macOS (getrusage(2) of each)."""
  try:
    import resource  # pylint: disable=import-outside-toplevel
  except ImportError:  # not on a POSIX system
    return None
  peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
  if peak <= 0:
    return None
  return peak if sys.platform == "darwin" else peak * 1024


# JAX's duration events of making a program: tracing, lowering to MLIR, and
# the backend's compile (which includes reading the persistent cache). They
# nest in no other of these events, so their sum is the time spent making
# programs.
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")


class _CompileClock:
  """Seconds JAX reported making programs in this process (from the first
  :class:`Seconds` on; one listener per process)."""
  total = 0.0
  listening = False

  @classmethod
  def start(cls) -> None:
    if not cls.listening:
      import jax.monitoring  # pylint: disable=import-outside-toplevel
      jax.monitoring.register_event_duration_secs_listener(cls._on_event)
      cls.listening = True

  @classmethod
  def _on_event(cls, event: str, seconds: float, **_) -> None:
    if event in COMPILE_EVENTS:
      cls.total += seconds


class Seconds:
  """A run's seconds per phase (``PHASES``): those of earlier attempts
  (``previous``, status.json's ``seconds``) plus this one's."""

  def __init__(self, previous: Mapping[str, Any] | None = None):
    self.seconds = {p: float((previous or {}).get(p) or 0.0) for p in PHASES}
    _CompileClock.start()

  def add(self, phase: str, seconds: float) -> None:
    self.seconds[phase] += max(0.0, seconds)

  @contextlib.contextmanager
  def timed(self, phase: str) -> Iterator[None]:
    """Times ``phase``; what JAX spent making programs meanwhile is compile."""
    start, compiled = time.perf_counter(), _CompileClock.total
    try:
      yield
    finally:
      making = _CompileClock.total - compiled
      self.add(phase, time.perf_counter() - start - making)
      self.add("compile", making)

  def to_json(self) -> dict[str, float]:
    return {p: round(self.seconds[p], 3) for p in PHASES}


def summed(statuses: Sequence[Status | None]) -> dict[str, float]:
  """The phases' seconds summed over runs' statuses (a run without: 0)."""
  out = dict.fromkeys(PHASES, 0.0)
  for status in statuses:
    for phase, value in ((status.seconds if status else None) or {}).items():
      if phase in out and isinstance(value, (int, float)):
        out[phase] += float(value)
  return out
