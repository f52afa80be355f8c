"""The loss of the best model that ignores context: unigram entropy of targets.

A model that predicts every target from the same distribution q, whatever
comes before it, has cross-entropy -sum_t p(t) log q(t) on targets distributed
as p, which is least, and equal to the entropy H(p) = -sum_t p(t) log p(t), at
q = p (Gibbs' inequality). With p the empirical distribution of the training
targets, H(p) in nats is the loss a run must get below to have learnt anything
from context; a run whose final eval loss is not below it has stalled.

The targets are those of the task's rows (`rows.py`), counted with the run's
tokenizer:

* lm:        the text's tokens and eos, per document (bos is never a target);
* translate: the target's tokens and eos, per pair;
* mlm:       the text's tokens (the maskable positions: not bos or eos), i.e.
             the unigram distribution of the text;
* classify:  the labels.

Examples that the rows skip (empty text, an empty side of a pair, a negative
label) are skipped here too; rows truncated to `seq_len` are counted whole.

`unigram_entropy` computes it once per dataset version, split, task, feature
keys and tokenizer (kind, vocabulary size, model file hash, special ids) and
keeps it in `unigram_entropy.json`: next to the SentencePiece model, or, for
the byte and hf tokenizers, in the dataset's tokenizer directory
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

from tfx_jax import files
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.errors import ConfigError

CACHE_FILE = "unigram_entropy.json"
# Ids are counted in chunks of this many with np.bincount.
_CHUNK = 1 << 20
# Examples read at once from a source that reads in batches (array_record).
_READ_BATCH = 1024


def _lm_targets(example, tok, keys) -> list[int] | None:
  text = rows_lib.example_text(example, keys.text_key)
  if not text.strip():
    return None
  return tok.encode(text) + [tok.eos_id]


def _translate_targets(example, tok, keys) -> list[int] | None:
  source = tok.encode(rows_lib.example_text(example, keys.source_key))
  target = tok.encode(rows_lib.example_text(example, keys.target_key))
  if not source or not target:
    return None
  return target + [tok.eos_id]


def _mlm_targets(example, tok, keys) -> list[int] | None:
  text = rows_lib.example_text(example, keys.text_key)
  if not text.strip():
    return None
  return [i for i in tok.encode(text) if i not in (tok.bos_id, tok.eos_id)]


def _classify_targets(example, tok, keys) -> list[int] | None:
  del tok
  label = int(np.asarray(example[keys.label_key]))
  if label < 0 or not rows_lib.example_text(example, keys.text_key).strip():
    return None
  return [label]


@dataclasses.dataclass(frozen=True)
class Targets:
  """What a task's rows predict: `ids(example, tok, keys)`, a list of target
  ids or labels (None: the rows skip the example), and the feature keys (names
  of `sources.DatasetSpec` fields) it reads."""

  ids: Callable[..., list[int] | None]
  keys: tuple[str, ...]


TARGETS: dict[str, Targets] = {
    "lm": Targets(_lm_targets, ("text_key",)),
    "translate": Targets(_translate_targets, ("source_key", "target_key")),
    "mlm": Targets(_mlm_targets, ("text_key",)),
    "classify": Targets(_classify_targets, ("label_key", "text_key")),
}


def _targets_of(task: str) -> Targets:
  if task not in TARGETS:
    raise ConfigError(f"task={task!r} has no unigram baseline; choices: "
                      f"{', '.join(TARGETS)}.")
  return TARGETS[task]


def _examples(source: Sequence[Mapping[str, Any]]) -> Iterator[Mapping]:
  """Every example once, in order; in batches where the source reads them so."""
  read_many = getattr(source, "__getitems__", None)
  for start in range(0, len(source), _READ_BATCH):
    indices = list(range(start, min(start + _READ_BATCH, len(source))))
    if read_many is not None:
      yield from read_many(indices)
    else:
      yield from (source[i] for i in indices)


def target_counts(source: Sequence[Mapping[str, Any]], tokenizer, task: str,
                  keys: sources.DatasetSpec) -> tuple[np.ndarray, int]:
  """(count of each target id or label, examples counted) over `source`.

  Each example is tokenized once; `source` is any random-access sequence of
  example dicts (a TFDS data source, or a list in tests).
  """
  targets_of = _targets_of(task).ids
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


def entropy_nats(counts: np.ndarray) -> float:
  """H(p) = -sum p log p (nats) of the empirical distribution `counts`."""
  counts = np.asarray(counts, np.float64)
  counts = counts[counts > 0]
  if not len(counts):
    raise ValueError("no targets to take the entropy of")
  p = counts / counts.sum()
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


def cache_key(dataset: str, version: str, split: str, task: str,
              features: Sequence[str], tokenizer: Mapping[str, Any]) -> str:
  """One line naming everything the entropy depends on."""
  digest = (tokenizer["model_sha256"] or "none")[:16]
  return (f"{dataset}:{version} {split} {task}({','.join(features)}) "
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


def unigram_entropy(data_cfg: Any, tokenizer, task: str, *,
                    split: str = "train",
                    source: Sequence[Mapping[str, Any]] | None = None) -> float:
  """Entropy (nats) of the unigram distribution of `task`'s targets in `split`.

  The loss of the best model that ignores context (module docstring). Read
  from the cache kept with the prepared data, else computed by streaming the
  split once and cached; many processes at once compute it once
  (`sources.build_lock`).

  Args:
    data_cfg: the run's data config (`name`, `data_dir`, feature keys).
    tokenizer: the run's tokenizer (`tokenizer.tokenizer_from_config`).
    task: "lm", "translate", "mlm" or "classify" (the task's row format).
    split: the split whose targets are counted (the training split).
    source: example dicts to count instead of the dataset (in memory, tests);
      nothing is cached then.
  """
  keys = sources.resolve_keys(data_cfg)
  if source is not None:
    counts, _ = target_counts(source, tokenizer, task, keys)
    return entropy_nats(counts)
  features = [getattr(keys, field) for field in _targets_of(task).keys]
  data_dir = getattr(data_cfg, "data_dir", None) or None
  name = sources.canonical_name(sources.dataset_name(data_cfg))
  key = cache_key(name, sources.dataset_version(name, data_dir), split, task,
                  features, tokenizer_identity(tokenizer))
  path = cache_path(data_cfg, tokenizer)
  cached = _read_cache(path)
  if key in cached:
    return float(cached[key]["entropy_nats"])
  root = sources.resolve_data_dir(data_dir)
  with sources.build_lock(data_dir, os.path.relpath(path, root)):
    cached = _read_cache(path)  # Another process may have computed it.
    if key not in cached:
      start = time.perf_counter()
      counts, examples = target_counts(
          sources.open_source(name, split, data_dir), tokenizer, task, keys)
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
  return float(cached[key]["entropy_nats"])
