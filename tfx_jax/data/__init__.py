"""Data: embedded TFDS corpora, tokenizers and grain input pipelines.

  from tfx_jax.data import pipeline, tokenizer
  from tfx_jax import tasks
  tok = tokenizer.tokenizer_from_config(config.data)
  ds = pipeline.make_dataset(config.data, tasks.get("lm").rows, "train",
                             batch_size=8, seq_len=128, seed=0, tokenizer=tok)

Modules: ``sources`` (TFDS names, embedded builders, feature keys),
``files_corpus`` (``data.name=files``: the user's text, JSON Lines or Parquet
files converted into a TFDS dataset), ``tokenizer`` (SentencePiece / bytes,
special ids), ``repairs`` (counts of skipped or repaired examples), ``rows``
(what every task's row builder shares, and ``RowFormat``), ``pipeline`` (grain
pipelines), ``baselines`` (the unigram entropy of the training targets a task
names: the loss of the best model that ignores context), ``prepare`` (the
command that builds an embedded dataset ahead of time). The tasks themselves
(their row builders and targets) are declared in ``tfx_jax.tasks``, which
imports this package, never the reverse.

The package imports nothing itself, so that importing one data module never
pulls in the others.
"""
