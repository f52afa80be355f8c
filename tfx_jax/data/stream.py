"""``data.packing=stream``: a split as one token stream, cut into windows.

The split's documents, in dataset order, are tokenized and concatenated, each
followed by the tokenizer's own end-of-document token (``tok.eos_id``: the
project's ``</s>`` for SentencePiece and bytes, an imported model's own, e.g.
GPT-2's ``<|endoftext|>``), after one ``bos`` that starts the stream:

  s = [bos] + doc_1 + [eos] + doc_2 + [eos] + ... + doc_n + [eos]

Window i is ``s[i L : i L + L + 1]`` (L = seq_len): L tokens and the one after
them, so that a language model's inputs are the first L and its targets the
last L, and consecutive windows share one token. Every token of ``s`` but the
first is then a target exactly once per epoch; the last window may be shorter
(padded by the task's window builder). This is how Press et al. 2022 (and
fairseq's ``--sample-break-mode none``) train and evaluate: contiguous text,
with no masking at document ends and positions running through the window.

The stream is built once per (split, tokenizer, documents) and kept in memory
as int32 (4 bytes a token): evaluation, which rebuilds its pipeline at every
evaluation, tokenizes its split once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfx_jax.data import repairs
from tfx_jax.data import rows as rows_lib
from tfx_jax.core.errors import ConfigError

# Streams of the TFDS splits read so far, by what they depend on.
_CACHE: dict[tuple, np.ndarray] = {}


def token_stream(documents: Sequence[Mapping[str, Any]], *, tok, text_key: str,
                 counts: repairs.Counts) -> np.ndarray:
  """``[bos] + doc_1 + [eos] + ... + doc_n + [eos]`` (module docstring) of the
  nonempty documents, in order; what is skipped or repaired is counted."""
  pieces = [np.asarray([tok.bos_id], np.int32)]
  eos = np.asarray([tok.eos_id], np.int32)
  for i in range(len(documents)):
    try:
      text = rows_lib.nonempty_text(documents[i], text_key, counts)
      if text is None:
        continue
      pieces += [np.asarray(tok.encode(text), np.int32), eos]
    except ConfigError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      counts.add("skipped (preprocessing error)", f"{type(e).__name__}: {e}")
  return np.concatenate(pieces)


def cached_stream(key: tuple, documents, **kwargs) -> np.ndarray:
  """``token_stream(documents, **kwargs)``, kept under ``key`` (the dataset,
  split, documents read and tokenizer) for the pipelines built later."""
  if key not in _CACHE:
    _CACHE[key] = token_stream(documents, **kwargs)
  return _CACHE[key]


class Windows(Sequence):
  """The windows of a token stream: ``windows[i] = s[i L : i L + L + 1]``;
  ``ceil((len(s) - 1) / L)`` of them, the last possibly shorter."""

  def __init__(self, stream: np.ndarray, seq_len: int):
    self.stream = stream
    self.seq_len = int(seq_len)

  def __len__(self) -> int:
    return -(-(len(self.stream) - 1) // self.seq_len)

  def __getitem__(self, i):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    if not -len(self) <= i < len(self):
      raise IndexError(i)
    start = (i % len(self)) * self.seq_len
    return self.stream[start:start + self.seq_len + 1]


def window_row(features: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
  """One window's row in the batch contract: ``features`` (inputs, targets,
  weights, each as long as the window) padded to ``seq_len``, with one segment
  over the whole window (no mask at document ends) and positions 0..n-1."""
  n = len(features["inputs"])
  return {"inputs": rows_lib.pad(features["inputs"], seq_len),
          "targets": rows_lib.pad(features["targets"], seq_len),
          "weights": rows_lib.pad(features["weights"], seq_len, np.float32),
          "segment_ids": rows_lib.pad(np.ones(n, np.int32), seq_len),
          "positions": rows_lib.pad(np.arange(n, dtype=np.int32), seq_len)}
