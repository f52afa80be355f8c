"""SIGTERM / SIGINT as a flag the training loop reads after every step."""

from __future__ import annotations

import signal


class Preemption:
  """Context manager: the first signal sets ``self.signal``; a second one
  raises KeyboardInterrupt at once (the user insists)."""

  def __init__(self):
    self.signal = None
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave handlers alone
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signal is not None:  # second signal: give up at once
      raise KeyboardInterrupt
    self.signal = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
