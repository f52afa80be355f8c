"""The ``slurm_cluster`` fixture (a pytest plugin that ``conftest.py`` loads).

``slurm_cluster``: a real one-node SLURM cluster on localhost for the session,
started only when a test asks for it (the SLURM sweep and ``srun`` tests).
It starts Debian's ``munged``, ``slurmctld`` and ``slurmd`` as root with a
generated ``slurm.conf`` (state in a temporary directory, free ports,
``SLURM_CONF`` for the clients). Skipped where SLURM is not installed:
``apt-get install -y slurm-wlm munge`` (as root) provides it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from helpers import free_port, wait_until

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo")


def _which(name: str) -> str | None:
  return shutil.which(name) or next(
      (f"{d}/{name}" for d in ("/usr/sbin", "/sbin") if os.path.exists(f"{d}/{name}")), None)


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
# `sbatch --wait` polls after 2 s, then 8 s, then every 32 s while MinJobAge
# (default 300 s) allows: a 12-second job returned after 42 s. With 4 s it
# polls every 2 s; finished jobs still leave squeue at once, as before.
MinJobAge=4
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
  conf.write_text(SLURM_CONF.format(dir=d, ctld_port=free_port(), d_port=free_port(),
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
    wait_until(lambda: (d / "munge.socket").exists(), 30, "munged did not start", d)
    start(_which("slurmctld"), "-D", "-c", "-i")
    time.sleep(1)
    start(_which("slurmd"), "-D", "-N", "localhost")
    wait_until(lambda: subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
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
