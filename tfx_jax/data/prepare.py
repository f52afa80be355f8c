r"""Builds an embedded dataset and its SentencePiece tokenizer.

  python -m tfx_jax.data.prepare --name tfx_shakespeare [--data_dir D]
  python -m tfx_jax.data.prepare --name all --vocab_size 8000

Training pipelines do the same on first use; this only does it ahead of time.
Other TFDS datasets are prepared with TFDS itself:
`tfds build --file_format=array_record <name>`.
"""


from absl import flags

from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib

FLAGS = new_flags()
_NAME = flags.DEFINE_string(
    "name", None, "Embedded dataset name, or 'all'.", required=True,
    flag_values=FLAGS)
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data dir (default: $TFDS_DATA_DIR or "
    "~/tensorflow_datasets).", flag_values=FLAGS)
_VOCAB_SIZE = flags.DEFINE_integer(
    "vocab_size", 8000, "SentencePiece vocabulary size; 0 skips the tokenizer.",
    flag_values=FLAGS)


def prepare(name: str, data_dir: str | None, vocab_size: int) -> None:
  """Builds `name` (array_record) and trains its tokenizer if missing."""
  builder = sources.prepare(name, data_dir)
  splits = {s: i.num_examples for s, i in builder.info.splits.items()}
  print(f"{name}: {builder.data_dir} {splits}")
  spec = sources.dataset_spec(name)
  if vocab_size and not spec.tokenizer_dataset:
    keys = ((spec.source_key, spec.target_key) if spec.target_key
            else (spec.text_key,))
    tok = tokenizer_lib.load_tokenizer("sentencepiece", vocab_size, name,
                                       data_dir, text_keys=keys)
    print(f"{name}: tokenizer {tok.model_path} (vocab {tok.vocab_size})")


def main(argv):
  del argv
  names = (sources.embedded_datasets() if _NAME.value == "all"
           else [_NAME.value])
  for name in names:
    prepare(name, _DATA_DIR.value, _VOCAB_SIZE.value)


if __name__ == "__main__":
  run_main(main, FLAGS)
