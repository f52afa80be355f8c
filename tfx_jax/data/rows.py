"""Per-task rows: one raw example -> the rows of a batch.

Each ``*_rows(example, index, *, tok, ..., counts)`` returns a list of rows
(dicts of NumPy arrays); an empty list skips the example, and whatever was
skipped or repaired is counted in ``counts``. Its keyword arguments are the
settings it reads, and only those are passed to it (``RowFormat.bind``). A
``RowFormat`` per task (``FORMATS``) says which builder makes its rows and
whether rows are packed; the task declarations in ``tfx_jax.tasks`` name
theirs, and ``pipeline.make_dataset`` maps it over a split.

* lm:        inputs (bos + text), targets (text + eos), weights; cut into rows
* translate: inputs (source + eos), decoder_inputs (bos + target),
             targets (target + eos), weights; one padded row per pair
* mlm:       inputs (masked), targets (original ids), weights (1 at the masked
             positions); cut into rows
* classify:  inputs (bos + passage), segment_ids, positions, label [B], and the
             next-token targets/weights of the passage (for L_FT + lambda L_PT)
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
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.errors import ConfigError

# Re-exported: the pipelines count what the rows skip or repair.
Counts = repairs.Counts

DEFAULT_MASK_RATE = 0.15
# A document is cut into at most this many rows; the rest is dropped (counted).
MAX_PIECES_PER_DOCUMENT = 1024


def check_mask_rate(mask_rate) -> None:
  """BERT's masking rate must be a probability that leaves something to predict."""
  if not 0.0 < float(mask_rate) <= 1.0:
    raise ConfigError(f"data.mask_rate={mask_rate!r} is not valid: must be in (0, 1].")


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


def _pad(ids: Sequence[int] | np.ndarray, length: int, dtype=np.int32
         ) -> np.ndarray:
  out = np.zeros(length, dtype)
  out[:len(ids)] = ids
  return out


def _pieces(features: dict[str, np.ndarray], seq_len: int, counts: Counts
            ) -> list[dict[str, np.ndarray]]:
  """Cuts an unpadded document into rows of at most seq_len tokens."""
  length = len(features["inputs"])
  if length > seq_len:  # Expected for long documents: no text is lost.
    counts.add("split (longer than seq_len)", level=logging.INFO)
  starts = range(0, length, seq_len)
  if len(starts) > MAX_PIECES_PER_DOCUMENT:
    counts.add(f"truncated to {MAX_PIECES_PER_DOCUMENT} rows")
    starts = starts[:MAX_PIECES_PER_DOCUMENT]
  return [{k: v[s:s + seq_len] for k, v in features.items()} for s in starts]


def _nonempty_text(example, key, counts) -> str | None:
  text = example_text(example, key, counts)
  if not text.strip():
    counts.add("skipped (empty text)")
    return None
  return text


def lm_rows(example, index, *, tok, keys, seq_len, counts):
  del index
  text = _nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  ids = tok.encode(text)
  doc = {
      "inputs": np.asarray([tok.bos_id] + ids, np.int32),
      "targets": np.asarray(ids + [tok.eos_id], np.int32),
      "weights": np.ones(len(ids) + 1, np.float32),
  }
  return _pieces(doc, seq_len, counts)


def bert_mask(ids: np.ndarray, rng: np.random.Generator, *, mask_rate: float,
              vocab_size: int, maskable: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
  """BERT masking (Devlin et al. 2019, sec. 3.1): (masked inputs, weights).

  Each maskable token is chosen with probability `mask_rate`; a chosen token is
  replaced by <mask> 80% of the time, by a random non-special token 10% and
  kept 10%. weights is 1 at the chosen positions (where the loss is taken).
  """
  chosen = (rng.random(ids.shape) < mask_rate) & maskable
  action = rng.random(ids.shape)
  random_ids = rng.integers(tokenizer_lib.NUM_SPECIAL, vocab_size, ids.shape)
  inputs = np.where(chosen & (action < 0.8), tokenizer_lib.MASK_ID, ids)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_ids,
                    inputs)
  return inputs.astype(np.int32), chosen.astype(np.float32)


def mlm_rows(example, index, *, tok, keys, seq_len, counts, seed, mask_rate):
  text = _nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  ids = np.asarray([tok.bos_id] + tok.encode(text) + [tok.eos_id], np.int32)
  rng = np.random.default_rng([seed, index])
  maskable = (ids != tok.bos_id) & (ids != tok.eos_id)
  inputs, weights = bert_mask(ids, rng, mask_rate=mask_rate,
                              vocab_size=tok.vocab_size, maskable=maskable)
  return _pieces({"inputs": inputs, "targets": ids, "weights": weights},
                 seq_len, counts)


def translate_rows(example, index, *, tok, keys, seq_len, target_seq_len, counts):
  del index
  source = tok.encode(example_text(example, keys.source_key, counts))
  target = tok.encode(example_text(example, keys.target_key, counts))
  if not source or not target:
    counts.add("skipped (empty source or target)")
    return []
  if len(source) >= seq_len or len(target) >= target_seq_len:
    counts.add("truncated (longer than seq_len)")
  source = source[:seq_len - 1] + [tok.eos_id]
  target = target[:target_seq_len - 1]
  return [{
      "inputs": _pad(source, seq_len),
      "decoder_inputs": _pad([tok.bos_id] + target, target_seq_len),
      "targets": _pad(target + [tok.eos_id], target_seq_len),
      "weights": _pad(np.ones(len(target) + 1), target_seq_len, np.float32),
  }]


def classify_rows(example, index, *, tok, keys, seq_len, counts, n_classes):
  del index
  label = int(np.asarray(example[keys.label_key]))
  if label < 0 or (n_classes is not None and label >= n_classes):
    counts.add("skipped (label out of range)", f"{label}, num_classes "
               f"{n_classes if n_classes is not None else 'unknown'}")
    return []
  text = _nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  ids = tok.encode(text)
  if len(ids) >= seq_len:
    counts.add("truncated (longer than seq_len)")
  inputs = ([tok.bos_id] + ids)[:seq_len]
  targets = (ids + [tok.eos_id])[:seq_len]
  return [{
      "inputs": _pad(inputs, seq_len),
      "segment_ids": _pad(np.ones(len(inputs)), seq_len),
      "positions": _pad(np.arange(len(inputs)), seq_len),
      "label": np.int32(label),
      "targets": _pad(targets, seq_len),
      "weights": _pad(np.ones(len(targets)), seq_len, np.float32),
  }]


# ------------------------------------------------------------ the formats
@dataclasses.dataclass(frozen=True)
class RowFormat:
  """How one task's examples become batch rows."""

  name: str
  build: Callable[..., list]  # one of the *_rows builders above
  packed: bool                # documents packed first-fit into rows
  labelled: bool = False      # examples carry a class label (model.num_classes)
  # The feature keys its rows read (fields of sources.DatasetSpec).
  keys: tuple[str, ...] = ("text_key",)
  # Checks of data.* fields that only this format reads (no data is read).
  check_data: Callable[[Any], None] | None = None

  def bind(self, **settings) -> Callable[[Any, int], list]:
    """``build(example, index)`` with the settings its signature names."""
    wanted = inspect.signature(self.build).parameters
    return functools.partial(self.build,
                             **{k: v for k, v in settings.items() if k in wanted})


FORMATS: dict[str, RowFormat] = {f.name: f for f in (
    RowFormat("lm", lm_rows, packed=True),
    RowFormat("translate", translate_rows, packed=False,
              keys=("source_key", "target_key")),
    RowFormat("mlm", mlm_rows, packed=True,
              check_data=lambda data: check_mask_rate(
                  getattr(data, "mask_rate", DEFAULT_MASK_RATE))),
    RowFormat("classify", classify_rows, packed=False, labelled=True,
              keys=("text_key", "label_key")),
)}


def get_format(name: str) -> RowFormat:
  """The rows of task ``name``; ConfigError listing the choices otherwise."""
  if name not in FORMATS:
    raise ConfigError(f"task={name!r} is not a valid choice; choices: "
                      f"{', '.join(FORMATS)}.")
  return FORMATS[name]
