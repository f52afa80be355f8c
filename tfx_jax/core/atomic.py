"""Files a reader may open at any moment: written whole or not at all."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def write_json(path: str | os.PathLike, value: Any) -> None:
  """Atomically replaces ``path`` with ``value`` as indented JSON.

  The text goes to a temporary file in the same directory, is flushed and
  fsynced, then renamed over ``path``: a reader (another process, a resumed
  run after ``kill -9`` or a power cut) sees the old file or the new one,
  never half of one.
  """
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(value, f, indent=2, default=str)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
