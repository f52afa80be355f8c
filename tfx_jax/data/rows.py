"""Rows: how one raw example becomes the rows of a batch, generically.

A task's row builder (``build(example, index, *, tok, ..., counts)``, declared
in its module of ``tfx_jax.tasks``) returns a list of rows (dicts of NumPy
arrays); an empty list skips the example, and whatever was skipped or
repaired is counted in ``counts``. Its keyword arguments are the settings it
reads, and only those are passed to it (``RowFormat.bind``). A ``RowFormat``
says which builder makes a task's rows, whether rows are packed and which
feature keys they read; ``pipeline.make_dataset`` maps it over a split.

A format that reads text may also declare a window builder, the row of one
window of the split's token stream (``data.packing=stream``, ``data.stream``).

This module holds what every builder shares: the text of an example
(``example_text``, ``nonempty_text``), padding (``pad``), cutting a document
into rows (``cut_into_rows``) and ``RowFormat``. It knows rows, not tasks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from absl import logging
import numpy as np

from tfx_jax.data import repairs
from tfx_jax.core.errors import ConfigError

# Re-exported: the pipelines count what the rows skip or repair.
Counts = repairs.Counts

# A document is cut into at most this many rows; the rest is dropped (counted).
MAX_PIECES_PER_DOCUMENT = 1024


def example_text(example: Mapping[str, Any], key: str, counts: Counts | None = None) -> str:
  """The text feature ``key`` of an example; undecodable bytes are replaced
  (and counted in ``counts`` if given); a missing key is a ConfigError."""
  if key not in example:
    raise ConfigError(
        f"feature {key!r} (from data.text_key/source_key/target_key or the "
        f"dataset's default) is not in the examples; features: "
        f"{', '.join(sorted(example))}")
  value = example[key]
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, str):
    return value
  return repairs.decode_utf8(bytes(value), counts)


def nonempty_text(example: Mapping[str, Any], key: str, counts: Counts) -> str | None:
  """The text feature ``key``, or None (counted as skipped) when it is blank."""
  text = example_text(example, key, counts)
  if not text.strip():
    counts.add("skipped (empty text)")
    return None
  return text


def pad(ids: Sequence[int] | np.ndarray, length: int, dtype=np.int32) -> np.ndarray:
  """``ids`` followed by zeros up to ``length`` (0 is the padding id)."""
  out = np.zeros(length, dtype)
  out[:len(ids)] = ids
  return out


def cut_into_rows(features: dict[str, np.ndarray], seq_len: int, counts: Counts
                  ) -> list[dict[str, np.ndarray]]:
  """Cuts an unpadded document (aligned arrays) into rows of at most seq_len
  tokens, at most ``MAX_PIECES_PER_DOCUMENT`` of them (the rest is counted)."""
  length = len(features["inputs"])
  if length > seq_len:  # Expected for long documents: no text is lost.
    counts.add("split (longer than seq_len)", level=logging.INFO)
  starts = range(0, length, seq_len)
  if len(starts) > MAX_PIECES_PER_DOCUMENT:
    counts.add(f"truncated to {MAX_PIECES_PER_DOCUMENT} rows")
    starts = starts[:MAX_PIECES_PER_DOCUMENT]
  return [{k: v[s:s + seq_len] for k, v in features.items()} for s in starts]


@dataclasses.dataclass(frozen=True)
class RowFormat:
  """How one task's examples become batch rows."""

  name: str                   # the task's name (in error messages)
  build: Callable[..., list]  # the task's row builder (module docstring)
  packed: bool                # documents packed first-fit into rows
  labelled: bool = False      # examples carry a class label (model.num_classes)
  # The feature keys its rows read (fields of sources.DatasetSpec).
  keys: tuple[str, ...] = ("text_key",)
  # Checks of data.* fields that only this format reads (no data is read).
  check_data: Callable[[Any], None] | None = None
  # data.packing='stream': the row of one window of the split's token stream
  # (``data.stream``), ``window(tokens, index, *, <settings>)``; None: the
  # format reads whole examples only.
  window: Callable[..., dict] | None = None

  def bind(self, **settings) -> Callable[[Any, int], list]:
    """``build(example, index)`` with the settings its signature names."""
    return _bind(self.build, settings)

  def bind_window(self, **settings) -> Callable[[Any, int], dict]:
    """``window(tokens, index)`` with the settings its signature names."""
    return _bind(self.window, settings)


def _bind(fn: Callable, settings: dict) -> Callable:
  wanted = inspect.signature(fn).parameters
  return functools.partial(fn, **{k: v for k, v in settings.items() if k in wanted})
