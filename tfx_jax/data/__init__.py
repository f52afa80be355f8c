"""Data: embedded TFDS corpora, tokenizers and grain input pipelines.

  from tfx_jax.data import pipeline, tokenizer
  tok = tokenizer.tokenizer_from_config(config.data)
  ds = pipeline.make_dataset(config.data, "lm", "train", batch_size=8,
                             seq_len=128, seed=0, tokenizer=tok)

Modules: ``sources`` (TFDS names, embedded builders, feature keys),
``files_corpus`` (``data.name=files``: the user's text, JSON Lines or Parquet
files converted into a TFDS dataset), ``tokenizer`` (SentencePiece / bytes,
special ids), ``repairs`` (counts of skipped or repaired examples), ``rows``
(per-task row builders), ``pipeline`` (grain pipelines), ``baselines`` (the unigram
entropy of a task's training targets: the loss of the best model that ignores
context), ``prepare`` (the command that builds an embedded dataset ahead of
time).

The package imports nothing itself, so that importing one data module never
pulls in the others.
"""
