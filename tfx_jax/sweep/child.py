"""Launcher of one sweep child: ``python -m tfx_jax.sweep.child PARENT_PID CORES -- CMD...``.

Sets, then ``exec``s ``CMD`` (both survive ``execve``):

- ``PR_SET_PDEATHSIG = SIGTERM`` (Linux): when the sweep process dies, even by
  ``kill -9``, the run gets SIGTERM, which the trainer turns into a checkpoint
  and status ``preempted``;
- the CPU affinity ``CORES`` (``0,1``): the run's share of the machine.

A separate launcher rather than ``subprocess``'s ``preexec_fn``: the sweep
process has imported JAX (its threads), and running Python between ``fork``
and ``exec`` of a multithreaded process is unsafe.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
  parent, cores, sep, *cmd = argv
  if sep != "--" or not cmd:
    raise SystemExit("usage: python -m tfx_jax.sweep.child PARENT_PID CORES -- CMD...")
  if sys.platform.startswith("linux"):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # the sweep died before prctl took effect
      sys.exit(143)
    if cores:
      os.sched_setaffinity(0, [int(c) for c in cores.split(",")])
  os.execvp(cmd[0], cmd)


if __name__ == "__main__":
  main(sys.argv[1:])
