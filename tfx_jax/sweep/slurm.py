"""SLURM executor: one job array, one task per unfinished run.

``runs/<sweep>/slurm/sweep.sbatch`` runs, in array task i, the i-th unfinished
run's ordinary training command (``python -m tfx_jax.train --spec``: the
run's ``run_spec.json``, written at submission), which runs its evaluations
after training (with ``--separate-evaluations``, an evaluation command each
follows it instead), under the run's
lock (util-linux ``flock``, the same lock the local executor takes), so a
resubmitted or concurrently running sweep never executes a run twice at once,
and every task resumes from the run's checkpoints. SLURM's SIGTERM at a time
limit or ``scancel`` becomes a checkpoint and status ``preempted``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
from typing import Sequence

from tfx_jax.records import sweep as sweep_record
from tfx_jax.core.errors import ConfigError
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import RunEntry, SlurmJob, SweepRecord

SCRIPT = "sweep.sbatch"


def render_script(sweep_dir: pathlib.Path, record: SweepRecord,
                  entries: Sequence[RunEntry], python: str,
                  cwd: pathlib.Path, separate_evaluations: bool = False) -> str:
  """The sbatch script of ``entries`` (array task i runs ``entries[i]``)."""
  slurm_dir = (sweep_dir / "slurm").resolve()
  cache = (sweep_dir / ".jax_cache").resolve()
  q = shlex.quote
  lines = [
      "#!/bin/bash",
      f"# Sweep {record.name}: one array task per unfinished run; each runs the",
      "# ordinary, resumable training command under the run's lock.",
      f"# Written by: {record.command}",
      f"#SBATCH --job-name={q('tfx-' + record.name)}",
      f"#SBATCH --array=0-{len(entries) - 1}",
      f"#SBATCH --output={q(str(slurm_dir / '%A_%a.out'))}",
      f"#SBATCH --chdir={q(str(cwd))}",
      "set -uo pipefail",
      f"export JAX_COMPILATION_CACHE_DIR=${{JAX_COMPILATION_CACHE_DIR:-{q(str(cache))}}}",
      "export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0",
      "export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0",
  ]
  if os.environ.get("PYTHONPATH"):
    lines.append(f"export PYTHONPATH={q(os.environ['PYTHONPATH'])}")
  lines += ["", 'case "$SLURM_ARRAY_TASK_ID" in']
  for i, entry in enumerate(entries):
    workdir = state_lib.run_dir(sweep_dir, entry.name)
    w = q(str(workdir))
    in_process = () if separate_evaluations else entry.evaluations
    train = state_lib.train_command(workdir, python)  # its spec: ``submit_sweep``
    lines += [
        f"  {i})  # {entry.name}",
        f"    W={w}",
        '    mkdir -p "$W/eval"',
        f'    exec 9>"$W/{state_lib.LOCK_FILE}"; flock 9',
        f'    echo "=== $(date -Is) task $SLURM_ARRAY_JOB_ID"_"$SLURM_ARRAY_TASK_ID" >> "$W/{state_lib.LOG_FILE}"',
        f'    {shlex.join(train)} >> "$W/{state_lib.LOG_FILE}" 2>&1; rc=$?',
        # A diverged run is a result, not a failed task.
        f"    grep -q '\"state\": \"finished\"' \"$W/status.json\" || {{ grep -q "
        f"'\"state\": \"diverged\"' \"$W/status.json\" && exit 0; exit $rc; }}",
    ]
    evals = (state_lib.eval_commands(workdir, entry.evaluations, python)
             if separate_evaluations else [])
    for k, cmd in enumerate(evals):
      marker = q(str(state_lib.eval_marker(workdir, k)))
      lines.append(f'    [ -e {marker} ] || {{ {shlex.join(cmd)} >> "$W/{state_lib.LOG_FILE}" '
                   f"2>&1 && echo {q(shlex.join(cmd[5:]))} > {marker} || exit 1; }}")
    if in_process:  # a finished run whose evaluations failed is a failed task
      lines.append("    exit $rc")
    lines.append("    ;;")
  lines += ["esac", ""]
  return "\n".join(lines)


def require(command: str) -> str:
  path = shutil.which(command)
  if path is None:
    raise ConfigError(f"`{command}` is not on PATH: --executor slurm needs a SLURM "
                      "client (Debian/Ubuntu: apt-get install slurm-wlm).")
  return path


def submit(script: pathlib.Path, slurm_args: str = "",
           env: dict[str, str] | None = None) -> str:
  """``sbatch --parsable [slurm_args] script``; returns the job id.

  ``env`` is what the tasks inherit (sbatch exports the submitting
  environment): the user's, not the sweep process's CPU-only validation
  setting.
  """
  cmd = [require("sbatch"), "--parsable", *shlex.split(slurm_args), str(script)]
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"{shlex.join(cmd)} failed: {proc.stderr.strip()}")
  return proc.stdout.strip().split(";")[0]


def _expand_tasks(spec: str) -> list[int]:
  """``4`` / ``[5-7,9%2]`` (squeue's array task ids) -> [5, 6, 7, 9]."""
  spec = spec.strip("[]").split("%")[0]
  out = []
  for part in spec.split(","):
    if "-" in part:
      lo, hi = part.split("-")
      out.extend(range(int(lo), int(hi) + 1))
    elif part.isdigit():
      out.append(int(part))
  return out


def queue_states(job_ids: Sequence[str]) -> dict[tuple[str, int], str]:
  """{(job id, task index): "PENDING" | "RUNNING" | ...} of the jobs still queued."""
  if not job_ids or shutil.which("squeue") is None:
    return {}
  proc = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T"],
                        capture_output=True, text=True)
  out = {}
  for line in proc.stdout.splitlines():
    ident, _, state = line.partition("|")
    m = re.fullmatch(r"(\d+)_(\S+)", ident.strip())
    if m:
      for task in _expand_tasks(m.group(2)):
        out[(m.group(1), task)] = state.strip()
  return out


def queued_runs(record: SweepRecord) -> dict[str, str]:
  """{run name: "JOB_TASK STATE"} of the runs SLURM has queued or running now."""
  states = queue_states([j.job_id for j in record.slurm_jobs])
  out = {}
  for job in record.slurm_jobs:
    for task, name in enumerate(job.runs):
      state = states.get((job.job_id, task))
      if state:
        out[name] = f"{job.job_id}_{task} {state}"
  return out


def submit_sweep(sweep_dir: pathlib.Path, record: SweepRecord,
                 entries: Sequence[RunEntry], python: str, slurm_args: str,
                 cwd: pathlib.Path, env: dict[str, str] | None = None,
                 separate_evaluations: bool = False) -> tuple[str, pathlib.Path]:
  """Writes the sbatch script of ``entries``, submits it, records the job id."""
  for entry in entries:  # what each task's training command reads
    state_lib.write_spec(sweep_dir, record, entry, in_process=not separate_evaluations)
  script = sweep_dir / "slurm" / SCRIPT
  script.parent.mkdir(parents=True, exist_ok=True)
  script.write_text(render_script(sweep_dir, record, entries, python, cwd,
                                  separate_evaluations))
  script.chmod(0o755)
  job_id = submit(script, slurm_args, env)
  record.slurm_jobs.append(SlurmJob(job_id, sweep_record.now(), slurm_args,
                                    tuple(e.name for e in entries)))
  return job_id, script
