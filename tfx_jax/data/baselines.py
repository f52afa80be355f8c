"""The loss of the best model that ignores context: unigram entropy of targets.

A model that predicts every target from the same distribution q, whatever
comes before it, has cross-entropy -sum_t p(t) log q(t) on targets distributed
as p, which is least, and equal to the entropy H(p) = -sum_t p(t) log p(t), at
q = p (Gibbs' inequality). With p the empirical distribution of the training
targets, H(p) in nats is the loss a run must get below to have learnt anything
from context; a run whose final eval loss is not below it has stalled. For
labels (classification) it is the loss of predicting the class frequencies,
the probabilistic counterpart of always answering the majority class.

Which targets are counted is the task's to say (its ``Targets``, declared in
its module of ``tfx_jax.tasks`` beside its rows): ``Targets.ids`` lists the
target ids or labels of one example as the task's rows predict them, and
None for an example the rows skip; rows truncated to `seq_len` are counted
whole. This module only counts them, with the run's tokenizer.

`unigram_entropy` computes it once per dataset version, split (its leading
part with ``data.train_fraction`` < 1: the examples a run trains on), targets kind,
feature keys and tokenizer (kind, vocabulary size, model file hash, special
ids) and keeps it in `unigram_entropy.json`: next to the SentencePiece model,
or, for the byte and hf tokenizers, in the dataset's tokenizer directory
(`tokenizer.tokenizer_dir`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from absl import logging
import numpy as np

from tfx_jax.core import atomic as files
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib

CACHE_FILE = "unigram_entropy.json"
# Ids are counted in chunks of this many with np.bincount.
_CHUNK = 1 << 20
# Examples read at once from a source that reads in batches (array_record).
_READ_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class Targets:
  """What a task's rows predict, for the unigram baseline.

  ``kind`` names them in the cache key (the task's name); ``ids(example, tok,
  keys)`` is the list of target ids or labels of one example (None: the rows
  skip it); ``keys`` are the feature keys it reads (names of
  `sources.DatasetSpec` fields), in the order the cache key lists them.
  """

  kind: str
  ids: Callable[..., list[int] | None]
  keys: tuple[str, ...]


def _examples(source: Sequence[Mapping[str, Any]]) -> Iterator[Mapping]:
  """Every example once, in order; in batches where the source reads them so."""
  read_many = getattr(source, "__getitems__", None)
  for start in range(0, len(source), _READ_BATCH):
    indices = list(range(start, min(start + _READ_BATCH, len(source))))
    if read_many is not None:
      yield from read_many(indices)
    else:
      yield from (source[i] for i in indices)


def target_counts(source: Sequence[Mapping[str, Any]], tokenizer, targets: Targets,
                  keys: sources.DatasetSpec) -> tuple[np.ndarray, int]:
  """(count of each target id or label, examples counted) over `source`.

  Each example is tokenized once; `source` is any random-access sequence of
  example dicts (a TFDS data source, or a list in tests).
  """
  targets_of = targets.ids
  counts = np.zeros(0, np.int64)
  pending: list[int] = []
  examples = 0

  def flush():
    nonlocal counts, pending
    if pending:
      chunk = np.bincount(np.asarray(pending, np.int64))
      if len(chunk) > len(counts):
        counts = np.pad(counts, (0, len(chunk) - len(counts)))
      counts[:len(chunk)] += chunk
      pending = []

  for example in _examples(source):
    ids = targets_of(example, tokenizer, keys)
    if ids is None:
      continue
    examples += 1
    pending.extend(ids)
    if len(pending) >= _CHUNK:
      flush()
  flush()
  return counts, examples


def entropy_nats(counts: Sequence[int] | np.ndarray) -> float:
  """H = -sum_t p_t ln p_t in nats, p_t = c_t / sum c, from target counts (zeros ignored).

  The cross-entropy of the best model that ignores context (it predicts the
  unigram distribution p at every position) on the targets it was counted
  on (module docstring). ``counts``: counts per target id, e.g.
  np.bincount(targets, minlength=V). ValueError for a negative or non-finite
  count, or no target at all.
  """
  c = np.asarray(counts, dtype=np.float64).ravel()
  if np.any(c < 0) or not np.all(np.isfinite(c)):
    raise ValueError("target counts must be finite and non-negative")
  total = c.sum()
  if total == 0:
    raise ValueError("no targets to take the entropy of")
  p = c[c > 0] / total
  return float(-(p * np.log(p)).sum())


def tokenizer_identity(tokenizer) -> dict[str, Any]:
  """What makes two tokenizers give the same targets: kind, vocab, file, ids."""
  kind = type(tokenizer).__name__
  for cls, name in ((tokenizer_lib.ByteTokenizer, "byte"),
                    (tokenizer_lib.SentencePieceTokenizer, "sentencepiece"),
                    (tokenizer_lib.HFTokenizer, "hf")):
    if isinstance(tokenizer, cls):
      kind = name
      break
  digest = None
  path = getattr(tokenizer, "model_path", None)
  if path:
    with open(path, "rb") as f:
      digest = hashlib.sha256(f.read()).hexdigest()
  return {"kind": kind, "vocab_size": int(tokenizer.vocab_size),
          "model_sha256": digest, "bos_id": int(tokenizer.bos_id),
          "eos_id": int(tokenizer.eos_id)}


def cache_key(dataset: str, version: str, split: str, kind: str,
              features: Sequence[str], tokenizer: Mapping[str, Any]) -> str:
  """One line naming everything the entropy depends on."""
  digest = (tokenizer["model_sha256"] or "none")[:16]
  return (f"{dataset}:{version} {split} {kind}({','.join(features)}) "
          f"{tokenizer['kind']} vocab={tokenizer['vocab_size']} "
          f"sha256={digest} bos={tokenizer['bos_id']} eos={tokenizer['eos_id']}")


def cache_path(data_cfg: Any, tokenizer) -> str:
  """`unigram_entropy.json` next to the tokenizer kept with the prepared data."""
  if isinstance(tokenizer, tokenizer_lib.SentencePieceTokenizer):
    directory = os.path.dirname(os.path.abspath(tokenizer.model_path))
  else:
    directory = tokenizer_lib.tokenizer_dir(
        sources.dataset_name(data_cfg), getattr(data_cfg, "data_dir", None) or None)
  return os.path.join(directory, CACHE_FILE)


def _read_cache(path: str) -> dict[str, Any]:
  try:
    with open(path) as f:
      cache = json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    logging.warning("Ignoring unreadable %s (%s); it is rewritten.", path, e)
    return {}
  return cache if isinstance(cache, dict) else {}


class _Leading(Sequence):
  """The first ``n`` examples of a random-access source."""

  def __init__(self, source: Sequence[Mapping[str, Any]], n: int):
    self._source, self._n = source, min(n, len(source))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, i: int) -> Mapping[str, Any]:
    if not 0 <= i < self._n:
      raise IndexError(i)
    return self._source[i]

  def __getitems__(self, indices: Sequence[int]) -> list[Mapping[str, Any]]:
    if any(not 0 <= i < self._n for i in indices):
      raise IndexError(indices)
    read_many = getattr(self._source, "__getitems__", None)
    if read_many is None:
      return [self._source[i] for i in indices]
    return list(read_many(list(indices)))


def unigram_entropy(data_cfg: Any, tokenizer, targets: Targets, *,
                    split: str = "train",
                    source: Sequence[Mapping[str, Any]] | None = None) -> float:
  """Entropy (nats) of the unigram distribution of `targets` in `split`.

  The loss of the best model that ignores context (module docstring). Read
  from the cache kept with the prepared data, else computed by streaming the
  split once and cached; many processes at once compute it once
  (`sources.build_lock`).

  Args:
    data_cfg: the run's data config (`name`, `data_dir`, feature keys).
    tokenizer: the run's tokenizer (`tokenizer.tokenizer_from_config`).
    targets: what the task's rows predict (its ``Task.targets``).
    split: the split whose targets are counted (the training split); with
      ``data.train_fraction`` < 1, its leading examples that a run trains on.
    source: example dicts to count instead of the dataset (in memory, tests);
      nothing is cached then.
  """
  if source is not None:
    keys = sources.resolve_keys(data_cfg)
    used = sources.leading_examples(len(source), data_cfg, split)
    counts, _ = target_counts(_Leading(source, used), tokenizer, targets, keys)
    return entropy_nats(counts)
  return float(_split_counts(data_cfg, tokenizer, targets, split)["entropy_nats"])


def _split_counts(data_cfg: Any, tokenizer, targets: Targets, split: str) -> dict[str, Any]:
  """The cache entry of ``split``'s targets (entropy, examples, targets, ...),
  computed by streaming the split once where the cache has none."""
  keys = sources.resolve_keys(data_cfg)
  features = [getattr(keys, field) for field in targets.keys]
  data_dir = getattr(data_cfg, "data_dir", None) or None
  name = sources.canonical_name(sources.dataset_name(data_cfg))
  # The examples a run of this config trains on: with data.train_fraction < 1,
  # the leading part of the split (`sources.leading_examples`), named in the key.
  total = len(sources.open_source(name, split, data_dir))
  used = sources.leading_examples(total, data_cfg, split)
  counted = split if used == total else f"{split}[:{used}]"
  key = cache_key(name, sources.dataset_version(name, data_dir), counted, targets.kind,
                  features, tokenizer_identity(tokenizer))
  path = cache_path(data_cfg, tokenizer)
  cached = _read_cache(path)
  if key in cached:
    return cached[key]
  root = sources.resolve_data_dir(data_dir)
  with sources.build_lock(data_dir, os.path.relpath(path, root)):
    cached = _read_cache(path)  # Another process may have computed it.
    if key not in cached:
      start = time.perf_counter()
      counts, examples = target_counts(
          _Leading(sources.open_source(name, split, data_dir), used),
          tokenizer, targets, keys)
      cached[key] = {
          "entropy_nats": entropy_nats(counts),
          "examples": examples,
          "targets": int(counts.sum()),
          "distinct_targets": int((counts > 0).sum()),
          "seconds": round(time.perf_counter() - start, 3),
      }
      logging.info("Unigram entropy of %s: %s", key, cached[key])
      os.makedirs(os.path.dirname(path), exist_ok=True)
      files.write_json(path, cached)
  return cached[key]


def target_tokens(data_cfg: Any, tokenizer, targets: Targets, *,
                  split: str = "train") -> int:
  """The targets a pass over ``split`` predicts: the corpus a ladder's budgets
  are counted against (its epochs). Counted once with the unigram entropy, and
  cached with it."""
  return int(_split_counts(data_cfg, tokenizer, targets, split)["targets"])
