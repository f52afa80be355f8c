"""Supervisor of one sweep child: ``python -m tfx_jax.sweep.child PARENT_PID CORES -- CMD...``.

Runs ``CMD`` (a training or evaluation command) and waits for it, with:

- ``PR_SET_PDEATHSIG`` (Linux): when the sweep process dies, even by
  ``kill -9``, this supervisor is signalled and sends ``CMD`` exactly one
  SIGTERM, which the trainer turns into a checkpoint and status
  ``preempted``. The kernel signals a child once per exiting thread of a
  multithreaded parent (the sweep has imported JAX), and the trainer treats a
  second SIGTERM as "give up now"; this single-threaded supervisor forwards
  only the first.
- the CPU affinity ``CORES`` (``0,1``): the run's share of the machine,
  inherited by ``CMD``.

Ctrl-C reaches ``CMD`` directly (same process group); the supervisor ignores
it and keeps waiting. Its exit code is ``CMD``'s (128 + N for signal N). Any
inherited file descriptors (the run's lock) stay open until ``CMD`` exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main(argv: list[str]) -> int:
  if len(argv) < 4 or argv[2] != "--":
    print("usage: python -m tfx_jax.sweep.child PARENT_PID CORES -- CMD...", file=sys.stderr)
    return 2
  parent, cores, cmd = int(argv[0]), argv[1], argv[3:]
  child: subprocess.Popen | None = None
  terminated = False

  def on_term(signum, frame):
    del signum, frame
    nonlocal terminated
    if not terminated and child is not None:
      child.send_signal(signal.SIGTERM)
    terminated = True

  signal.signal(signal.SIGTERM, on_term)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _set_pdeathsig()
  if os.getppid() != parent:  # the sweep died before prctl took effect
    return 143
  if cores and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, [int(c) for c in cores.split(",")])
  # The command gets SIGINT's default back, and dies with this supervisor
  # should it be killed (single-threaded: one signal).
  child = subprocess.Popen(
      cmd, close_fds=False,
      preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), _set_pdeathsig()))
  if terminated:  # a signal came while the command was being started
    child.send_signal(signal.SIGTERM)
  rc = child.wait()
  return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
