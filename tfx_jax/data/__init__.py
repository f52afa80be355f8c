"""Data: embedded TFDS corpora, tokenizers and grain input pipelines.

  ds = make_dataset(config.data, "lm", "train", batch_size=8, seq_len=128,
                    seed=0, tokenizer=tokenizer_from_config(config.data))
"""

from tfx_jax.data.pipeline import TASKS
from tfx_jax.data.pipeline import make_dataset
from tfx_jax.data.pipeline import num_classes
from tfx_jax.data.pipeline import skip_counts
from tfx_jax.data.sources import embedded_datasets
from tfx_jax.data.sources import open_source
from tfx_jax.data.sources import prepare
from tfx_jax.data.tokenizer import load_tokenizer
from tfx_jax.data.tokenizer import tokenizer_from_config

__all__ = [
    "TASKS",
    "embedded_datasets",
    "load_tokenizer",
    "make_dataset",
    "num_classes",
    "open_source",
    "prepare",
    "skip_counts",
    "tokenizer_from_config",
]
