"""``config.data``: which dataset a run reads and how it is tokenized.

One frozen dataclass with the section's fields, types and choices; the
ConfigDict's defaults come from it (``config_base``) and the run config reads
it back once (``run_config.resolve``). The checks that need the task (its row
format) or the files (``data.name=files``) stay with the task and with
``files_corpus``; the ones here need nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tfx_jax.core import typed_config

# sentencepiece: trained on the training split (data.vocab_size); byte: UTF-8
# bytes; hf: a Hugging Face tokenizer file (data.tokenizer_file), as
# python -m tfx_jax.convert from-hf copies it into the run's workdir.
TokenizerKind = Literal["sentencepiece", "byte", "hf"]
# data.name=files: a .txt document per file, or per blank-line separated block.
TextLayout = Literal["file", "paragraphs"]
# How lm and mlm make rows of seq_len tokens (docs/data.md, "Packing: documents or a stream"). documents: whole
# documents packed first-fit, attention masked per document, positions
# restarting at 0 in each (a document longer than a row is cut into rows).
# stream: the split's documents concatenated in dataset order, each followed
# by the tokenizer's end-of-document token, cut into consecutive windows of
# seq_len: attention and positions run straight through a window, across
# document ends, as Press et al. 2022 train and evaluate (contiguous text).
Packing = Literal["documents", "stream"]


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """``config.data``."""

  name: str = "tfx_shakespeare"
  data_dir: str | None = None
  tokenizer: TokenizerKind = "sentencepiece"
  tokenizer_file: str | None = None
  vocab_size: int = 4096
  mask_rate: float = 0.15  # mlm: BERT's share of masked tokens
  packing: Packing = "documents"
  # Train on this leading fraction of the training split's documents (in
  # dataset order: the same documents for every seed), e.g. to make
  # over-fitting reachable within a budget; validation and test are whole.
  train_fraction: float = 1.0
  # The split is read as this many grain pipelines (strided shards), divided
  # among the processes; each process reads only its own. The global batch is
  # one sub-batch per shard, so a fixed count gives the same batches on any
  # number of processes that divides it or is a multiple of it. 0: one shard
  # per process when the run starts (a resumed run keeps its checkpoint's).
  num_shards: int = 0
  text_key: str | None = None
  source_key: str | None = None
  target_key: str | None = None
  label_key: str | None = None
  # data.name=files: your own corpus (tfx_jax/data/files_corpus.py). Comma-
  # separated glob patterns of .txt/.text, .jsonl/.json or .parquet files; the
  # *_key fields above name their JSON fields / Parquet columns (text_key
  # default: "text"). A split without files is held out of train_files by
  # document: holdout_fraction of its documents each, ranked by a hash of
  # (holdout_seed, document), so a run's seed does not change the splits.
  train_files: str | None = None
  validation_files: str | None = None
  test_files: str | None = None
  text_layout: TextLayout = "file"
  holdout_fraction: float = 0.05
  holdout_seed: int = 0

  def check(self) -> "DataConfig":
    typed_config.need(self.vocab_size > 0, "data.vocab_size", self.vocab_size, "must be > 0")
    typed_config.need(self.num_shards >= 0, "data.num_shards", self.num_shards,
                      "must be >= 0 (0: one data shard per process)")
    typed_config.need(0.0 < self.train_fraction <= 1.0, "data.train_fraction",
                      self.train_fraction, "must be in (0, 1] (1: the whole training split)")
    return self
