"""The SLURM executor against a real one-node SLURM cluster on localhost.

The session fixture starts Debian's ``munged``, ``slurmctld`` and ``slurmd``
as root with a generated ``slurm.conf`` (state in a temporary directory, free
ports, ``SLURM_CONF`` for the clients), submits a tiny sweep as a job array,
waits for it and checks the runs. Skipped where SLURM is not installed:
``apt-get install -y slurm-wlm munge`` (as root) provides it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tfx_jax import metrics
from tfx_jax import status as status_lib
from test_configs import ROOT, TINY, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo")
BASE_FLAGS = [f"--config.{k}={v}" for k, v in TINY.items()]


def _which(name: str) -> str | None:
  return shutil.which(name) or next(
      (f"{d}/{name}" for d in ("/usr/sbin", "/sbin") if os.path.exists(f"{d}/{name}")), None)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _memory_mb() -> int:
  return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)


SLURM_CONF = """\
ClusterName=tfxtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=localhost CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
  """{"SLURM_CONF": path} of a running one-node cluster; stopped at the end."""
  missing = [n for n in DAEMONS + CLIENTS if _which(n) is None]
  if missing:
    pytest.skip(f"SLURM is not installed (missing {', '.join(missing)}); install it "
                "with `apt-get install -y slurm-wlm munge` as root.")
  if os.geteuid() != 0:
    pytest.skip("the one-node SLURM test cluster runs its daemons as root.")
  d = tmp_path_factory.mktemp("slurm")
  for sub in ("state", "spool"):
    (d / sub).mkdir()
  key = d / "munge.key"
  key.write_bytes(os.urandom(1024))
  key.chmod(0o600)
  conf = d / "slurm.conf"
  conf.write_text(SLURM_CONF.format(dir=d, ctld_port=_free_port(), d_port=_free_port(),
                                    cpus=os.cpu_count(), memory=_memory_mb()))
  env = dict(os.environ, SLURM_CONF=str(conf))
  procs = []

  def start(*cmd):
    log = open(d / f"{os.path.basename(cmd[0])}.out", "wb")
    procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))

  try:
    start(_which("munged"), "--foreground", "--force", f"--socket={d}/munge.socket",
          f"--key-file={key}", f"--pid-file={d}/munged.pid",
          f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed")
    _wait(lambda: (d / "munge.socket").exists(), 30, "munged did not start", d)
    start(_which("slurmctld"), "-D", "-c", "-i")
    time.sleep(1)
    start(_which("slurmd"), "-D", "-N", "localhost")
    _wait(lambda: subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                 text=True).stdout.strip() == "idle", 60,
          "the SLURM node did not become idle", d)
    yield {"SLURM_CONF": str(conf)}
  finally:
    for proc in reversed(procs):
      proc.terminate()
    for proc in procs:
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        proc.kill()


def _wait(predicate, timeout: float, what: str, logs=None) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  detail = ""
  if logs is not None:
    detail = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                       for p in sorted(logs.glob("*.log")) + sorted(logs.glob("*.out")))
  raise AssertionError(f"{what} within {timeout:.0f}s\n{detail}")


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
  assert "-m tfx_jax.train --config configs/lm.py:tiny" in script
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

  _wait(lambda: not queued(), 240, f"job {job_id} did not finish")
  for name in ("activation-relu_s0", "activation-swiglu_s0"):
    workdir = sweep_dir / name
    assert status_lib.read_status(workdir)["state"] == "finished", (
        (workdir / "sweep.log").read_text())
    assert [s for s, _ in metrics.read_scalars(workdir / "tensorboard")["eval/loss"]] == [
        10, 20]
  assert sorted(p.name for p in (sweep_dir / "slurm").glob("*.out")) == [
      f"{job_id}_0.out", f"{job_id}_1.out"]
  status = sweep([*args, "--status"], env)
  assert status.returncode == 0
  assert status.stdout.count(" finished ") == 2 and "2 finished" in status.stdout
  # Resubmitting resumes: nothing is left to run, so nothing is submitted.
  again = sweep(args, env)
  assert again.returncode == 0 and "nothing to submit" in again.stdout
