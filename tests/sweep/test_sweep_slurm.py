"""The SLURM executor against a real one-node SLURM cluster on localhost.

The session fixture ``slurm_cluster`` (tests/conftest.py, shared with the
multi-process tests) starts Debian's ``munged``, ``slurmctld`` and ``slurmd``
as root; this test submits a tiny sweep as a job array, waits for it and
checks the runs. Skipped where SLURM is not installed:
``apt-get install -y slurm-wlm munge`` (as root) provides it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tfx_jax.run import metrics
from tfx_jax.records import status as status_lib
from helpers import ROOT, TINY, subprocess_env, wait_until

# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes")]

BASE_FLAGS = [f"--config.{k}={v}" for k, v in TINY.items()]


def sweep(args, env) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "tfx_jax.sweep", *map(str, args)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_slurm_executor_runs_unfinished_runs_as_one_job_array(slurm_cluster, tmp_path,
                                                               tmp_path_factory):
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, 1024)  # once, before two tasks need it
  env = {**subprocess_env(tmp_path_factory.getbasetemp() / "sweep_jax_cache"),
         **slurm_cluster}
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.activation=relu,swiglu",
          "--seeds", "0", "--name", "on_slurm", "--workdir", tmp_path,
          "--executor", "slurm", *BASE_FLAGS]
  proc = sweep(args, env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  job_id = proc.stdout.strip().splitlines()[-1]
  assert job_id.isdigit(), proc.stdout
  sweep_dir = tmp_path / "on_slurm"
  script = (sweep_dir / "slurm" / "sweep.sbatch").read_text()
  assert "#SBATCH --array=0-1" in script
  # Each task trains the run's spec, written into its directory at submission.
  assert "-m tfx_jax.train --spec" in script
  for name in ("activation-relu_s0", "activation-swiglu_s0"):
    assert (sweep_dir / name / "run_spec.json").is_file()
  record = json.loads((sweep_dir / "sweep.json").read_text())
  assert record["slurm_jobs"][0]["job_id"] == job_id

  # While the tasks run (each takes seconds: start, compile, train), --status
  # shows SLURM's view of every run beside the state read from its workdir.
  early = sweep([*args, "--status"], env)
  assert early.returncode == 0 and f"slurm {job_id}_" in early.stdout, early.stdout

  def queued():
    out = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True,
                         text=True)
    return out.stdout.strip()

  wait_until(lambda: not queued(), 240, f"job {job_id} did not finish")
  for name in ("activation-relu_s0", "activation-swiglu_s0"):
    workdir = sweep_dir / name
    assert status_lib.read_status(workdir).state == "finished", (
        (workdir / "sweep.log").read_text())
    assert [s for s, _ in metrics.read_scalars(workdir / "tensorboard")["eval/loss"]] == [
        0, 10, 20]
  assert sorted(p.name for p in (sweep_dir / "slurm").glob("*.out")) == [
      f"{job_id}_0.out", f"{job_id}_1.out"]
  status = sweep([*args, "--status"], env)
  assert status.returncode == 0
  assert status.stdout.count(" finished ") == 2 and "2 finished" in status.stdout
  # Resubmitting resumes: nothing is left to run, so nothing is submitted.
  again = sweep(args, env)
  assert again.returncode == 0 and "nothing to submit" in again.stdout
