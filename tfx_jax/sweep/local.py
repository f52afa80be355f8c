"""Runs a sweep's runs on this machine, N at a time.

Each run is the ordinary subprocess ``python -m tfx_jax.train --spec
<run>/run_spec.json ...`` (the spec written just before, under the run's
lock: ``state.write_spec``), which runs the run's evaluations the spec names
itself after its last step (no new
interpreter, imports, checkpoint restore or compile per evaluation; a finished
run started again evaluates from its checkpoint); with
``separate_evaluations`` (the sweep's ``--separate-evaluations``) the
training command is followed by one ``python -m tfx_jax.evaluate`` command
per evaluation instead. Each is started from this process's main thread with:

- its share of the CPU cores: ``sched_setaffinity`` to ``cores / N`` cores
  (the binding limit) and XLA's CPU thread pool told the same; on a GPU
  machine its own GPUs through ``CUDA_VISIBLE_DEVICES``;
- ``PR_SET_PDEATHSIG = SIGTERM`` (both set by ``tfx_jax.sweep.child``): if the
  sweep process dies (even ``kill -9``) every child gets SIGTERM, which the
  trainer turns into a checkpoint and status ``preempted``; the next sweep
  command resumes it;
- the run's lock fd inherited, so the run stays locked until the child has
  exited: no run is ever executed by two processes at once;
- JAX's persistent compilation cache in ``runs/<sweep>/.jax_cache``, shared
  by every run of the sweep (same shapes compile once).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Callable

from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as sweep_record
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import RunEntry, SweepRecord

POLL_SECONDS = 0.2


def core_slots(parallel: int, cores: list[int] | None = None) -> list[list[int]]:
  """Splits the usable cores into ``parallel`` disjoint groups (shared if too few)."""
  cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
  if parallel >= len(cores):
    return [[cores[i % len(cores)]] for i in range(parallel)]
  share = len(cores) // parallel
  return [cores[i * share:(i + 1) * share] for i in range(parallel)]


def gpu_slots(parallel: int) -> list[str] | None:
  """``CUDA_VISIBLE_DEVICES`` per slot on an NVIDIA machine, else None."""
  if not shutil.which("nvidia-smi"):
    return None
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  gpus = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU")]
  if not gpus:
    return None
  share = max(1, len(gpus) // parallel)
  return [",".join(gpus[(i * share) % len(gpus):(i * share) % len(gpus) + share])
          for i in range(parallel)]


def child_env(sweep_dir: pathlib.Path, cores: list[int], gpus: str | None,
              base_env: dict[str, str], sharing: int = 1) -> dict[str, str]:
  """The environment of one run: thread limits, GPUs, the shared compile cache.

  ``sharing``: how many parallel runs share this run's GPUs.
  """
  env = dict(base_env)
  # Eigen's intra-op pool sized to this run's share (affinity is the hard limit).
  flags = f"--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={len(cores)}"
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str((sweep_dir / ".jax_cache").resolve()))
  # Cache every compilation, however small or quick (tiny runs compile in ~1 s).
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  if gpus is not None:
    env["CUDA_VISIBLE_DEVICES"] = gpus
    if sharing > 1:  # JAX preallocates 75% of a GPU: split it between the runs
      env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / sharing:.2f}")
  return env


def points_first(record: SweepRecord, entries: list[RunEntry]) -> list[RunEntry]:
  """``entries`` with the first run of every point before the second of any.

  The runs of one point differ only in seeds and tuned values, which are
  arguments of the compiled steps (the optimizer's hyperparameters are
  traced), so they share programs: started together, two of them would both
  compile what one could have written to the shared cache for the other; in
  this order parallel runs compile different points' programs, and each
  point's later runs read its programs back."""
  seen: dict[tuple[int, ...], int] = {}
  ranked = []
  for i, entry in enumerate(entries):
    key = record.point_key(entry)
    ranked.append((seen.get(key, 0), i, entry))
    seen[key] = seen.get(key, 0) + 1
  return [entry for _, _, entry in sorted(ranked, key=lambda r: r[:2])]


def _state(workdir: pathlib.Path) -> str | None:
  """The state the run's status.json gives (None: none written)."""
  status = status_lib.read_status(workdir)
  return status.state if status else None


@dataclasses.dataclass
class _Job:
  entry: RunEntry
  workdir: pathlib.Path
  lock_fd: int
  commands: list[list[str]]  # remaining: train, then evaluations
  slot: int
  started: float
  phase: int = 0  # index of the running command
  proc: subprocess.Popen | None = None


class LocalExecutor:
  """Executes the runs of one sweep with at most ``parallel`` children."""

  def __init__(self, sweep_dir: pathlib.Path, record: SweepRecord, parallel: int,
               env: dict[str, str], retry_failed: bool = False,
               out: Callable[[str], None] = print, separate_evaluations: bool = False):
    self.sweep_dir = sweep_dir
    self.separate_evaluations = separate_evaluations
    self.retry_failed = retry_failed
    self.record = record
    self.parallel = max(1, parallel)
    self.env = env
    self.out = out
    self.cores = core_slots(self.parallel)
    self.gpus = gpu_slots(self.parallel)
    self.free = list(range(self.parallel))
    self.jobs: list[_Job] = []
    self.waiting_noted: set[str] = set()

  # ------------------------------------------------------------------ start
  def _commands(self, entry: RunEntry) -> list[list[str]]:
    workdir = state_lib.run_dir(self.sweep_dir, entry.name)
    train = state_lib.train_command(workdir)
    if not self.separate_evaluations:
      return [train]  # the spec names the evaluations the training process runs
    return [train, *state_lib.eval_commands(workdir, entry.evaluations)]

  def _start(self, entry: RunEntry) -> str:
    """Starts ``entry`` in a free slot: "started", "busy" (locked elsewhere) or "done"."""
    workdir = state_lib.run_dir(self.sweep_dir, entry.name)
    fd = state_lib.try_lock(workdir)
    if fd is None:
      return "busy"
    # Locked: the state read now cannot change under us.
    entry.observe(state_lib.run_state(workdir, len(entry.evaluations), check_lock=False))
    if entry.state in state_lib.DONE or (entry.state == "failed" and not self.retry_failed):
      os.close(fd)
      return "done"
    # Under the run's lock: no other process starts it while its spec changes.
    state_lib.write_spec(self.sweep_dir, self.record, entry,
                         in_process=not self.separate_evaluations)
    slot = self.free.pop(0)
    job = _Job(entry, workdir, fd, self._commands(entry), slot, time.time())
    entry.attempts += 1
    self.jobs.append(job)
    self._launch(job)
    cores = self.cores[slot]
    where = f"cores {cores[0]}-{cores[-1]}" if len(cores) > 1 else f"core {cores[0]}"
    if self.gpus:
      where += f", GPU {self.gpus[slot]}"
    self.out(f"  start  {entry.name}  ({where}; log {workdir / state_lib.LOG_FILE})")
    return "started"

  def _launch(self, job: _Job) -> None:
    # A finished training run skips straight to its missing evaluation
    # commands (the training command runs its own evaluations: started again,
    # it evaluates from the checkpoint).
    if job.phase == 0 and len(job.commands) > 1 and _state(job.workdir) == "finished":
      job.phase = 1
    while job.phase > 0 and job.phase <= len(job.commands) - 1 and \
        state_lib.eval_marker(job.workdir, job.phase - 1).exists():
      job.phase += 1
    if job.phase >= len(job.commands):
      job.proc = None
      return
    log = open(job.workdir / state_lib.LOG_FILE, "ab")
    log.write(f"\n=== {sweep_record.now()} {' '.join(job.commands[job.phase])}\n".encode())
    log.flush()
    gpus = self.gpus[job.slot] if self.gpus else None
    sharing = self.gpus.count(gpus) if self.gpus else 1
    launcher = [sys.executable, "-m", "tfx_jax.sweep.child", str(os.getpid()),
                ",".join(map(str, self.cores[job.slot])), "--"]
    job.proc = subprocess.Popen(
        launcher + job.commands[job.phase], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=child_env(self.sweep_dir, self.cores[job.slot],
                                                gpus, self.env, sharing),
        pass_fds=(job.lock_fd,))
    log.close()

  # ------------------------------------------------------------------- finish
  def _finished(self, job: _Job) -> bool:
    """Handles the exit of ``job``'s current command; True when the run is over."""
    rc = job.proc.returncode if job.proc is not None else 0
    state = _state(job.workdir)
    if job.phase == 0:
      if state == "diverged":
        return True  # a result, not a failure; no evaluations of a diverged run
      if state == "preempted":
        return True  # stopped by a signal of its own: resumes next time
      if rc != 0 or state != "finished":
        if state != "failed":  # a crash the trainer did not record
          state_lib.record_failure(
              job.workdir, f"train exited with code {rc}: {state_lib.log_tail(job.workdir)}")
        return True
    elif job.proc is not None:
      if rc != 0:
        state_lib.record_failure(
            job.workdir, f"evaluation {' '.join(job.commands[job.phase][5:])} exited "
            f"with code {rc}: {state_lib.log_tail(job.workdir)}")
        return True
      marker = state_lib.eval_marker(job.workdir, job.phase - 1)
      marker.parent.mkdir(exist_ok=True)
      marker.write_text(" ".join(job.commands[job.phase][5:]) + "\n")
    job.phase += 1
    if job.phase >= len(job.commands):
      return True
    self._launch(job)
    return job.proc is None

  def _close(self, job: _Job) -> None:
    os.close(job.lock_fd)
    self.jobs.remove(job)
    self.free.append(job.slot)
    self.free.sort()
    entry = job.entry
    entry.wall_seconds = round(entry.wall_seconds + time.time() - job.started, 1)
    entry.observe(state_lib.run_state(job.workdir, len(entry.evaluations)))
    compile_s = entry.compile_seconds
    extra = f"  compile {compile_s:.1f}s" if isinstance(compile_s, (int, float)) else ""
    reason = f"  ({entry.reason})" if entry.state != "finished" and entry.reason else ""
    self.out(f"  {entry.state:<8} {entry.name}  step {entry.step}  "
             f"{time.time() - job.started:.1f}s{extra}{reason}")

  def _trunk_pending(self, entry: RunEntry, queue: list[RunEntry]) -> bool:
    """Whether ``entry`` is a branched budget whose trunk is still to run or
    running here (a trunk not run by this invocation is left to the branch,
    which fails naming the trunk's missing checkpoint)."""
    if not entry.trunk:
      return False
    return any(e.name == entry.trunk for e in queue) or any(
        job.entry.name == entry.trunk for job in self.jobs)

  # --------------------------------------------------------------------- loop
  def run(self, entries: list[RunEntry], save: Callable[[], None]) -> None:
    """Executes ``entries`` (runs of the record), saving the record on changes."""
    queue = points_first(self.record, entries)
    try:
      while queue or self.jobs:
        started_any = False
        for entry in list(queue):
          if not self.free:
            break
          if self._trunk_pending(entry, queue):
            continue  # a branched budget starts from its trunk's checkpoint
          outcome = self._start(entry)
          if outcome == "busy":
            if entry.name not in self.waiting_noted:
              self.waiting_noted.add(entry.name)
              self.out(f"  wait   {entry.name}  (locked by another process; "
                       "starts when it is released)")
            continue
          queue.remove(entry)
          started_any |= outcome == "started"
        if started_any:
          save()
        for job in list(self.jobs):
          if job.proc is not None and job.proc.poll() is None:
            continue
          if self._finished(job):
            self._close(job)
            save()
        time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
      # Children got the same SIGINT (one process group): each checkpoints.
      self.out("interrupted: waiting for the runs to save a checkpoint ...")
      for job in list(self.jobs):
        if job.proc is not None:
          try:
            job.proc.wait()
          except KeyboardInterrupt:
            job.proc.kill()
        self._close(job)
      save()
      raise
