"""What the data path skips or repairs, counted: ``Counts`` and UTF-8 repair.

Both the pipelines (``rows``, ``pipeline``) and the conversion of a files
corpus (``files_corpus``) count each kind of skipped or repaired example here,
and log the counts sparsely. Undecodable UTF-8 is never an error: the bytes
are replaced with U+FFFD and the example is counted as ``UNDECODABLE``.
"""

from __future__ import annotations

import collections
import threading

from absl import logging

UNDECODABLE = "had undecodable bytes (replaced with U+FFFD)"


class Counts:
  """Thread-safe counters of skipped/repaired examples, logged sparsely."""

  def __init__(self, where: str):
    self.where = where
    self.counts = collections.Counter()
    self._lock = threading.Lock()

  def add(self, kind: str, detail: str = "", level: int = logging.WARNING
          ) -> None:
    with self._lock:
      self.counts[kind] += 1
      n = self.counts[kind]
    if n in (1, 10, 100, 1000, 10_000, 100_000) or n % 1_000_000 == 0:
      logging.log(level, "data %s: %d example(s) so far %s%s", self.where, n,
                  kind, f" ({detail})" if detail else "")


def decode_utf8(data: bytes, counts: Counts | None = None, where: str = "") -> str:
  """``data`` as text; undecodable bytes are replaced with U+FFFD (and the
  example counted in ``counts`` if given, ``where`` naming it)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    if counts is not None:
      counts.add(UNDECODABLE, f"{where}: {e}" if where else str(e))
    return data.decode("utf-8", errors="replace")
