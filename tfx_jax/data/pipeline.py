"""grain input pipelines: source -> shard -> shuffle -> tokenize -> pack -> batch.

Batches are dicts of NumPy arrays (int32 unless noted), leading dim = the
per-process batch size:

* lm:        inputs, targets (next token), segment_ids, positions, weights (f32)
* translate: inputs (source + eos), decoder_inputs (bos + target),
             targets (target + eos), weights (f32)
* mlm:       inputs (masked), targets (original ids), weights (f32, 1 at the
             masked positions), segment_ids, positions
* classify:  inputs (bos + passage), segment_ids, positions, label [B], and the
             next-token targets/weights of the passage (for L_FT + lambda L_PT)

segment_ids: 0 = padding, 1..k = packed document; positions restart at 0 in
every document. lm and mlm pack whole documents into `seq_len` rows (first-fit);
a document longer than a row is cut into row-sized pieces first, so no text is
lost. translate and classify hold one example per row, truncated and 0-padded.

Determinism and resumption: everything random is a function of `seed` and the
element's index in the (sharded, shuffled, repeated) stream: the shuffle order,
the bin order of the packer and the MLM mask (numpy Generator seeded with
(seed, index)), so the iterator's `get_state()` (a small JSON-serialisable dict)
restores the exact following batches with `set_state()`.

Robustness: empty texts are skipped, undecodable UTF-8 is decoded with
replacement characters, over-long sequences are truncated (translate, classify)
or split (lm, mlm), unusable labels are skipped; each is counted in
`skip_counts()` and logged with absl at counts 1, 10, 100, ...
"""

from __future__ import annotations

import collections
import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from absl import logging
import grain
import numpy as np

from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.errors import ConfigError

Task = Literal["lm", "translate", "mlm", "classify"]
TASKS = ("lm", "translate", "mlm", "classify")
DEFAULT_MASK_RATE = 0.15
# A document is cut into at most this many rows; the rest is dropped (counted).
MAX_PIECES_PER_DOCUMENT = 1024

_PACKED_KEYS = ("inputs", "targets", "weights")


class _Counts:
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


_COUNTS: dict[str, _Counts] = {}


def skip_counts(name: str, split: str) -> dict[str, int]:
  """Counts of skipped or repaired examples of the pipelines built for a split."""
  counts = _COUNTS.get(f"{name}:{split}")
  return dict(counts.counts) if counts else {}


def resolve_keys(data_cfg: Any) -> sources.DatasetSpec:
  return sources.resolve_keys(data_cfg)


def num_classes(data_cfg: Any) -> int:
  """Number of labels of a classification dataset (e.g. 4 for tfx_shakespeare_genre)."""
  return sources.num_classes(data_cfg.name, getattr(data_cfg, "data_dir", None)
                             or None, resolve_keys(data_cfg).label_key)


def embedded_datasets() -> list[str]:
  return sources.embedded_datasets()


def _text(example: Mapping[str, Any], key: str, counts: _Counts) -> str:
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
  try:
    return bytes(value).decode("utf-8")
  except UnicodeDecodeError as e:
    counts.add("had undecodable bytes (replaced with U+FFFD)", str(e))
    return bytes(value).decode("utf-8", errors="replace")


def _pad(ids: Sequence[int] | np.ndarray, length: int, dtype=np.int32
         ) -> np.ndarray:
  out = np.zeros(length, dtype)
  out[:len(ids)] = ids
  return out


def _pieces(features: dict[str, np.ndarray], seq_len: int, counts: _Counts
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
  text = _text(example, key, counts)
  if not text.strip():
    counts.add("skipped (empty text)")
    return None
  return text


def _lm(example, index, *, tok, key, seq_len, counts, **_):
  del index
  text = _nonempty_text(example, key, counts)
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


def _mlm(example, index, *, tok, key, seq_len, counts, seed, mask_rate, **_):
  text = _nonempty_text(example, key, counts)
  if text is None:
    return []
  ids = np.asarray([tok.bos_id] + tok.encode(text) + [tok.eos_id], np.int32)
  rng = np.random.default_rng([seed, index])
  maskable = (ids != tok.bos_id) & (ids != tok.eos_id)
  inputs, weights = bert_mask(ids, rng, mask_rate=mask_rate,
                              vocab_size=tok.vocab_size, maskable=maskable)
  return _pieces({"inputs": inputs, "targets": ids, "weights": weights},
                 seq_len, counts)


def _translate(example, index, *, tok, keys, seq_len, target_seq_len, counts,
               **_):
  del index
  source = tok.encode(_text(example, keys.source_key, counts))
  target = tok.encode(_text(example, keys.target_key, counts))
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


def _classify(example, index, *, tok, keys, seq_len, counts, n_classes, **_):
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


_PREPROCESSORS: dict[str, Callable[..., list[dict[str, np.ndarray]]]] = {
    "lm": _lm, "mlm": _mlm, "translate": _translate, "classify": _classify,
}


def _guarded(fn, counts: _Counts):
  """Skips (and counts) examples whose preprocessing fails; bad keys raise."""

  def apply(index, example):
    try:
      return fn(example, index)
    except ConfigError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      counts.add("skipped (preprocessing error)", f"{type(e).__name__}: {e}")
      return []

  return apply


class _Unlist(grain.experimental.FlatMapTransform):
  """Flattens the per-example lists of rows (an empty list skips the example)."""

  max_fan_out = MAX_PIECES_PER_DOCUMENT

  def flat_map(self, element):
    return element


def _rename_packed(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {
      "inputs": row["inputs"],
      "targets": row["targets"],
      "weights": row["weights"].astype(np.float32),
      "segment_ids": row["inputs_segment_ids"].astype(np.int32),
      "positions": row["inputs_positions"].astype(np.int32),
  }


def make_dataset(
    data_cfg: Any,
    task: Task,
    split: str,
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    tokenizer: tokenizer_lib.Tokenizer,
    shard_index: int = 0,
    shard_count: int = 1,
    shuffle: bool = True,
    num_epochs: int | None = None,
    target_seq_len: int | None = None,
    drop_remainder: bool | None = None,
    read_threads: int | None = None,
    source: Sequence[Mapping[str, Any]] | None = None,
) -> grain.IterDataset:
  """Returns a grain IterDataset of batches for `task` (see module docstring).

  `it = iter(ds)` is resumable: `state = it.get_state()` (JSON-serialisable),
  then `it2 = iter(ds); it2.set_state(state)` yields the same batches as `it`.

  Args:
    data_cfg: attribute object (e.g. ConfigDict) with `name`, `data_dir`,
      `mask_rate` and the optional feature keys `text_key`, `source_key`,
      `target_key`, `label_key` (empty/None: the dataset's defaults).
    task: "lm", "translate", "mlm" or "classify".
    split: TFDS split, e.g. "train" or "validation".
    batch_size: per-process batch size.
    seq_len: row length (translate: source length).
    seed: shuffling, packing and masking seed.
    tokenizer: from `tokenizer.load_tokenizer` / `tokenizer_from_config`.
    shard_index, shard_count: this process's shard (jax.process_index(),
      jax.process_count()); shards are disjoint strided slices of the split.
    shuffle: shuffle examples (reshuffled every epoch) and packed rows.
    num_epochs: None repeats forever; otherwise the data ends after that many.
    target_seq_len: translate target length (default: seq_len).
    drop_remainder: drop a final partial batch (default: only when repeating
      forever); otherwise it is filled with all-zero rows (segment_ids and
      weights 0, label 0: mask classify rows by `segment_ids.max(-1) > 0`).
    read_threads: threads that read and tokenize ahead of the consumer
      (default: one per CPU core, at most 16).
    source: a random-access sequence of example dicts to read instead of the
      TFDS dataset `data_cfg.name` (tests, in-memory data).
  """
  if task not in _PREPROCESSORS:
    raise ConfigError(f"task={task!r}; choices: {', '.join(TASKS)}")
  for field, value in (("batch_size", batch_size), ("seq_len", seq_len)):
    if int(value) < 1 or (field == "seq_len" and int(value) < 2):
      raise ConfigError(f"{field}={value} must be positive (seq_len >= 2)")
  if not 0 <= shard_index < shard_count:
    raise ConfigError(f"shard_index={shard_index} must be in [0, "
                      f"shard_count={shard_count})")
  seed = int(seed) % 2**32
  mask_rate = getattr(data_cfg, "mask_rate", None)
  mask_rate = DEFAULT_MASK_RATE if mask_rate is None else float(mask_rate)
  if task == "mlm" and not 0.0 < mask_rate <= 1.0:
    raise ConfigError(f"data.mask_rate={mask_rate} must be in (0, 1]")
  keys = resolve_keys(data_cfg)
  data_dir = getattr(data_cfg, "data_dir", None) or None
  n_classes = None  # An in-memory source: labels are only checked to be >= 0.
  if source is None:
    source = sources.open_source(data_cfg.name, split, data_dir)
    if task == "classify":
      n_classes = num_classes(data_cfg)
  if len(source) < shard_count:
    raise ConfigError(f"{data_cfg.name}[{split}] has {len(source)} examples, "
                      f"fewer than shard_count={shard_count}")
  counts = _COUNTS.setdefault(f"{data_cfg.name}:{split}",
                              _Counts(f"{data_cfg.name}[{split}]"))
  preprocess = functools.partial(
      _PREPROCESSORS[task], tok=tokenizer, key=keys.text_key, keys=keys,
      seq_len=int(seq_len), target_seq_len=int(target_seq_len or seq_len),
      counts=counts, seed=seed, mask_rate=mask_rate, n_classes=n_classes)

  ds = grain.MapDataset.source(source)[shard_index::shard_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs)
  ds = ds.map_with_index(_guarded(preprocess, counts))
  if read_threads is None:
    read_threads = min(16, os.cpu_count() or 1)
  ds = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=read_threads, prefetch_buffer_size=max(64, 2 * batch_size)))
  ds = grain.experimental.FlatMapIterDataset(ds, _Unlist())
  if task in ("lm", "mlm"):
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct={k: int(seq_len) for k in _PACKED_KEYS},
        num_packing_bins=max(8, batch_size), seed=seed,
        shuffle_bins=shuffle)
    ds = ds.map(_rename_packed)
  if drop_remainder is None:
    drop_remainder = num_epochs is None
  batch_fn = None if drop_remainder else functools.partial(
      grain.experimental.batch_and_pad, batch_size=batch_size)
  return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)
