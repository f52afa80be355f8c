"""The project-wide user-input error, and the hint that comes with a typo.

Every module that validates user input (config fields, flags, paths) raises
``ConfigError``; the command-line entry points (``cli.run_main``) turn it into
``error: ...`` and exit code 2. It lives here, at the bottom of the import
graph, so that raising it never pulls in the model config or anything else.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class ConfigError(ValueError):
  """Bad user input: names the field, the value and the valid choices."""


def did_you_mean(word: str, choices: Iterable[str], *, prefix: str = "") -> str:
  """`` Did you mean 'x'?`` for the closest of ``choices``, or ``""``.

  ``prefix`` is put before the suggestion (``model.`` for a field path).
  """
  close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.4)
  return f" Did you mean {prefix + close[0]!r}?" if close else ""


class InactiveSetting(ConfigError):
  """A setting that has no effect where it is set (``field`` at a value other than
  ``default`` while another field makes it unused, e.g. a RoPE scaling factor with
  ``rope_scaling='none'``).

  A single run refuses it: a user who set it expected it to act. In a sweep,
  where one shared setting meets every point, the points at which it is
  inactive run with the field at ``default`` instead, which computes the same
  thing, and the sweep says so for those runs.
  """

  def __init__(self, field: str, default, message: str):
    super().__init__(message)
    self.field = field
    self.default = default
