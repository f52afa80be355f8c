"""grain input pipelines: source -> shard -> shuffle -> tokenize -> pack -> batch.

A pipeline makes the rows of a task's ``rows.RowFormat`` (its builder, in the
task's module of ``tfx_jax.tasks``), packs them if the format says so, and
batches them. Batches are dicts of NumPy arrays (int32 unless noted), leading
dim = the per-process batch size; for the tasks of ``tfx_jax.tasks``:

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
With ``data.packing=stream`` lm and mlm rows are instead consecutive windows
of the split's token stream (``data.stream``): one segment per row (1 on
every real token), positions 0..seq_len-1 straight through document ends.

``data.train_fraction`` < 1 reads the first ceil(fraction x N) of the N
examples of the train split (in dataset order, whatever the seed); other
splits are read whole.

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

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from tfx_jax.data import eval_cache
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import sources
from tfx_jax.data import stream as stream_lib
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError

_PACKED_KEYS = ("inputs", "targets", "weights")


_COUNTS: dict[str, rows_lib.Counts] = {}


def skip_counts(name: str, split: str) -> dict[str, int]:
  """Counts of skipped or repaired examples of the pipelines built for a split."""
  counts = _COUNTS.get(f"{name}:{split}")
  return dict(counts.counts) if counts else {}


def resolve_keys(data_cfg: Any) -> sources.DatasetSpec:
  return sources.resolve_keys(data_cfg)


def num_classes(data_cfg: Any) -> int:
  """Number of labels of a classification dataset (e.g. 4 for tfx_shakespeare_genre)."""
  return sources.num_classes(sources.dataset_name(data_cfg),
                             getattr(data_cfg, "data_dir", None) or None,
                             resolve_keys(data_cfg).label_key)


def embedded_datasets() -> list[str]:
  return sources.embedded_datasets()


def _guarded(fn, counts: rows_lib.Counts):
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

  max_fan_out = rows_lib.MAX_PIECES_PER_DOCUMENT

  def flat_map(self, element):
    return element


def _windows(data_cfg, rows, split, source, *, tokenizer, keys, counts, seq_len, cached):
  """The windows of the split's token stream (``data.stream``) with the
  task's row of each, as a MapDataset (``data.packing=stream``)."""
  if rows.window is None:
    raise ConfigError(f"data.packing='stream' needs a task whose rows read text "
                      f"windows; task {rows.name!r} reads whole examples: use "
                      "data.packing='documents'.")
  kwargs = dict(tok=tokenizer, text_key=keys.text_key, counts=counts)
  if cached:  # a TFDS split: the same stream for every pipeline of the run
    key = (data_cfg.name, getattr(data_cfg, "data_dir", None), split, len(source),
           keys.text_key, type(tokenizer).__name__,
           getattr(tokenizer, "model_path", None), tokenizer.vocab_size)
    tokens = stream_lib.cached_stream(key, source, **kwargs)
  else:
    tokens = stream_lib.token_stream(source, **kwargs)
  return stream_lib.Windows(tokens, seq_len)


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
    rows: rows_lib.RowFormat,
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
  """Returns a grain IterDataset of batches of `rows` (see module docstring).

  `it = iter(ds)` is resumable: `state = it.get_state()` (JSON-serialisable),
  then `it2 = iter(ds); it2.set_state(state)` yields the same batches as `it`.

  Args:
    data_cfg: attribute object (e.g. ConfigDict) with `name`, `data_dir`,
      the optional feature keys `text_key`, `source_key`, `target_key`,
      `label_key` (empty/None: the dataset's defaults), `mask_rate` (for
      the builders that read it; missing: their default), `packing` and
      `train_fraction` (missing: "documents", 1.0).
    rows: the task's row format (``tasks.get(name).rows``).
    split: TFDS split, e.g. "train" or "validation".
    batch_size: rows per batch of this pipeline (the run's: batch_size /
      data.num_shards).
    seq_len: row length (translate: source length).
    seed: shuffling, packing and masking seed.
    tokenizer: from `tokenizer.load_tokenizer` / `tokenizer_from_config`.
    shard_index, shard_count: the data shard this pipeline reads: shards are
      disjoint strided slices of the split (``data.shards`` divides them among
      the processes).
    shuffle: shuffle examples (reshuffled every epoch) and packed rows;
      with ``packing=stream``, the windows (the stream itself stays in order).
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
  # The call as made: an evaluation pass's cache key (eval_cache), every argument in it.
  arguments = dict(locals())
  seed = int(seed) % 2**32
  keys = resolve_keys(data_cfg)
  data_dir = getattr(data_cfg, "data_dir", None) or None
  n_classes = None  # An in-memory source: labels are only checked to be >= 0.
  cached = source is None
  if source is None:
    source = sources.open_source(sources.dataset_name(data_cfg), split, data_dir)
    if rows.labelled:
      n_classes = num_classes(data_cfg)
  counts = _COUNTS.setdefault(f"{data_cfg.name}:{split}",
                              rows_lib.Counts(f"{data_cfg.name}[{split}]"))
  settings = dict(
      tok=tokenizer, keys=keys, seq_len=int(seq_len),
      target_seq_len=int(target_seq_len or seq_len), counts=counts, seed=seed,
      mask_rate=getattr(data_cfg, "mask_rate", None), n_classes=n_classes)
  examples = grain.MapDataset.source(source)
  used = sources.leading_examples(len(source), data_cfg, split)
  if used < len(source):
    examples = examples[:used]
  stream = getattr(data_cfg, "packing", "documents") == "stream"
  if stream:
    examples = grain.MapDataset.source(_windows(
        data_cfg, rows, split, examples, tokenizer=tokenizer, keys=keys, counts=counts,
        seq_len=int(seq_len), cached=cached))
  what = "windows of its token stream" if stream else "examples"
  if len(examples) < shard_count:
    raise ConfigError(f"{data_cfg.name}[{split}] has {len(examples)} {what}, "
                      f"fewer than shard_count={shard_count}")

  ds = examples[shard_index::shard_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs)
  if stream:
    window = rows.bind_window(**settings)
    ds = ds.map_with_index(lambda index, tokens: window(tokens, index))
  else:
    ds = ds.map_with_index(_guarded(rows.bind(**settings), counts))
  if read_threads is None:
    read_threads = min(16, os.cpu_count() or 1)
  ds = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=read_threads, prefetch_buffer_size=max(64, 2 * batch_size)))
  if not stream:
    ds = grain.experimental.FlatMapIterDataset(ds, _Unlist())
  if rows.packed and not stream:
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct={k: int(seq_len) for k in _PACKED_KEYS},
        num_packing_bins=max(8, batch_size), seed=seed,
        shuffle_bins=shuffle)
    ds = ds.map(_rename_packed)
  if drop_remainder is None:
    drop_remainder = num_epochs is None
  batch_fn = None if drop_remainder else functools.partial(
      grain.experimental.batch_and_pad, batch_size=batch_size)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)
  # One pass over a split (an evaluation) is prepared once, then read back.
  return eval_cache.pipeline_pass(ds, arguments) if num_epochs == 1 else ds
