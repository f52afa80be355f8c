"""Tokenizers with the project's fixed special ids: pad 0, unk 1, bos 2, eos 3, mask 4.

* `ByteTokenizer`: UTF-8 bytes, id = byte + 5, vocabulary 261; needs no training.
* `SentencePieceTokenizer`: a unigram SentencePiece model trained once on the
  train split of a dataset and stored with the prepared data, in
  `tokenizer_dir`: `<data_dir>/<dataset>/tokenizers/<version>/spm_<vocab>.model`
  for an embedded dataset (the train split is that version's), else
  `<data_dir>/<dataset>/tokenizers/spm_<vocab>.model`; later runs reuse it.
  `byte_fallback` maps characters unseen in training to byte pieces instead of
  unk. Text is not normalised (identity rule, whitespace kept), so line breaks
  of verse survive and `decode(encode(s)) == s`. `<vocab>` (`data.vocab_size`)
  is an upper bound: a train split too small for it gets as many pieces as
  SentencePiece finds, with a warning naming that size.
* `HFTokenizer` (`data.tokenizer=hf`, `data.tokenizer_file`): the tokenizer of
  an imported Hugging Face checkpoint, a SentencePiece model or a
  `tokenizer.json` (read with the `tokenizers` package), with that model's own
  special ids (from `special_ids.json` next to the file, as
  `python -m tfx_jax.convert from-hf` writes it).

Each tokenizer's `byte_lengths()` is the UTF-8 bytes every id decodes to (an
int32 table indexed by id), which bits per byte (eval/bpb) divides by: special
ids (pad, unk, bos, eos, mask, control pieces) count 0 bytes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, get_args

from absl import logging
import numpy as np
import sentencepiece as spm

from tfx_jax.data import sources
from tfx_jax.data.config import TokenizerKind
from tfx_jax.core.errors import ConfigError

PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3, 4
NUM_SPECIAL = 5
MASK_PIECE = "<mask>"
TOKENIZER_KINDS = get_args(TokenizerKind)
# Sentences fed to the SentencePiece trainer, evenly spaced over the train split.
MAX_TRAIN_SENTENCES = 200_000
_SPECIAL_IDS = frozenset({PAD_ID, BOS_ID, EOS_ID})
# SentencePiece's meta-space (U+2581): the one space byte it stands for.
META_SPACE = "\u2581"


def piece_bytes(piece: str) -> int:
  """The UTF-8 bytes a SentencePiece (or WordPiece) piece decodes to, its
  meta-space a space. Read per id, so the space of the dummy prefix that
  SentencePiece puts before a text's first word (and decoding drops) counts
  too: one byte more per document than the text has."""
  return len(piece.replace(META_SPACE, " ").encode("utf-8"))


def sentencepiece_byte_lengths(sp: spm.SentencePieceProcessor,
                               special: Iterable[int]) -> np.ndarray:
  """``byte_lengths`` of a SentencePiece model: 0 for ``special`` ids and its
  control, unknown and unused pieces, 1 for a byte-fallback piece <0xNN>,
  else ``piece_bytes``."""
  out = np.zeros(sp.get_piece_size(), np.int32)
  skip = set(special)
  for i in range(len(out)):
    if i in skip or sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
      continue
    out[i] = 1 if sp.is_byte(i) else piece_bytes(sp.id_to_piece(i))
  return out


class _SpecialIds:
  pad_id = PAD_ID
  unk_id = UNK_ID
  bos_id = BOS_ID
  eos_id = EOS_ID
  mask_id = MASK_ID


class ByteTokenizer(_SpecialIds):
  """UTF-8 bytes shifted past the special ids."""

  vocab_size = 256 + NUM_SPECIAL

  def encode(self, text: str) -> list[int]:
    return [b + NUM_SPECIAL for b in text.encode("utf-8")]

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(int(i) - NUM_SPECIAL for i in ids
                 if NUM_SPECIAL <= int(i) < self.vocab_size)
    return data.decode("utf-8", errors="replace")

  def byte_lengths(self) -> np.ndarray:
    """1 byte per id past the specials (module docstring)."""
    return (np.arange(self.vocab_size) >= NUM_SPECIAL).astype(np.int32)


class SentencePieceTokenizer(_SpecialIds):
  """A trained SentencePiece model with the special ids above."""

  def __init__(self, model_path: str):
    self.model_path = model_path
    self._sp = spm.SentencePieceProcessor(model_file=model_path)
    got = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(),
           self._sp.eos_id(), self._sp.piece_to_id(MASK_PIECE))
    if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID):
      raise ConfigError(f"{model_path} has special ids {got}, expected "
                        f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID)}; delete it "
                        "to retrain")
    self.vocab_size = self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    # A model whose vocabulary is larger than the tokenizer's (model.vocab_size
    # > data.vocab_size) may generate ids past it: they decode to nothing.
    return self._sp.decode([int(i) for i in ids
                            if int(i) not in _SPECIAL_IDS and int(i) < self.vocab_size])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def byte_lengths(self) -> np.ndarray:
    """The UTF-8 bytes of each piece (``sentencepiece_byte_lengths``)."""
    return sentencepiece_byte_lengths(self._sp, (PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID))


class HFTokenizer:
  """An imported model's tokenizer file, with that model's special ids.

  Encoding adds no special tokens (as the project's tokenizers: the tasks add
  bos / eos); ids missing from ``special_ids.json`` fall back to the file's own
  (SentencePiece) or to the project's defaults.
  """

  def __init__(self, path: str):
    self.model_path = path
    if not os.path.exists(path):
      raise ConfigError(f"data.tokenizer_file={path!r} does not exist.")
    if path.endswith(".json"):
      try:
        import tokenizers
      except ImportError as e:
        raise ConfigError("data.tokenizer=hf with a tokenizer.json needs the "
                          "'tokenizers' package (pip install -e .[hf]).") from e
      self._tok = tokenizers.Tokenizer.from_file(path)
      self._sp = None
      self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
      own = {}
    else:
      self._sp = spm.SentencePieceProcessor(model_file=path)
      self.vocab_size = self._sp.get_piece_size()
      own = {"pad": self._sp.pad_id(), "unk": self._sp.unk_id(),
             "bos": self._sp.bos_id(), "eos": self._sp.eos_id()}
    ids = {}
    special = os.path.join(os.path.dirname(path), "special_ids.json")
    if os.path.exists(special):
      with open(special) as f:
        ids = {k.replace("_token_id", ""): v for k, v in json.load(f).items()
               if isinstance(v, int)}

    def pick(name, default):
      for value in (ids.get(name), own.get(name)):
        if value is not None and value >= 0:
          return value
      return default

    self.pad_id = pick("pad", PAD_ID)
    self.unk_id = pick("unk", UNK_ID)
    self.bos_id = pick("decoder_start", pick("bos", BOS_ID))
    self.eos_id = pick("eos", EOS_ID)
    self.mask_id = pick("mask", MASK_ID)
    self._special = frozenset({self.pad_id, self.bos_id, self.eos_id})
    # The special ids the files declare (not the project's defaults filled
    # in above, which may be ordinary tokens of this vocabulary).
    self._declared = frozenset(v for v in [*ids.values(), *own.values()]
                               if v is not None and v >= 0)

  def encode(self, text: str) -> list[int]:
    if self._sp is not None:
      return self._sp.encode(text)
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids if int(i) not in self._special]
    if self._sp is not None:
      return self._sp.decode(ids)
    return self._tok.decode(ids)

  def byte_lengths(self) -> np.ndarray:
    """The UTF-8 bytes of each id (module docstring), 0 for the special ids
    the files declare. A SentencePiece model: ``sentencepiece_byte_lengths``.
    A tokenizer.json: 0 for its special added tokens too; with a byte-level
    decoder (GPT-2's BPE), each character of a token is one byte (GPT-2's
    table maps every byte to one character); otherwise ``piece_bytes`` of the
    token, a WordPiece continuation's '##' dropped and a byte-fallback token
    <0xNN> 1 byte."""
    if self._sp is not None:
      return sentencepiece_byte_lengths(self._sp, self._declared)
    out = np.zeros(self.vocab_size, np.int32)
    skip = set(self._declared) | {i for i, t in self._tok.get_added_tokens_decoder().items()
                                  if t.special}
    byte_level = "ByteLevel" in type(self._tok.decoder).__name__
    for i in range(self.vocab_size):
      token = self._tok.id_to_token(i)
      if i in skip or token is None:
        continue
      if byte_level:
        out[i] = len(token)
      elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        out[i] = 1
      else:
        out[i] = piece_bytes(token[2:] if token.startswith("##") else token)
    return out


Tokenizer = ByteTokenizer | SentencePieceTokenizer | HFTokenizer


# Tokenizers of the embedded datasets' first version were stored before the
# directory named the version (1.1.0 moved works out of train).
_UNVERSIONED = "1.0.0"


def tokenizer_dir(dataset_name: str, data_dir: str | None) -> str:
  """Where the tokenizers trained on a dataset's train split are stored.

  An embedded dataset's train split changes between versions, so its
  tokenizers are kept per version: `name:1.0.0` finds the one that version's
  runs were trained with.
  """
  name, _ = sources.split_version(sources.canonical_name(dataset_name))
  path = os.path.join(sources.resolve_data_dir(data_dir), *name.split("/"),
                      "tokenizers")
  version = sources.embedded_version(dataset_name)
  if version is not None and version != _UNVERSIONED:
    path = os.path.join(path, version)
  return path


def tokenizer_path(dataset_name: str, data_dir: str | None, vocab_size: int
                   ) -> str:
  return os.path.join(tokenizer_dir(dataset_name, data_dir),
                      f"spm_{vocab_size}.model")


def train_sentencepiece(texts: Iterable[str], model_path: str,
                        vocab_size: int) -> None:
  """Trains a unigram model on `texts` and writes it atomically to model_path.

  `vocab_size` is an upper bound (SentencePiece's hard_vocab_limit=False): texts
  too few for it give as many pieces as SentencePiece finds in them, instead of
  failing with "Vocabulary size too high"; `load_tokenizer` warns with the size.
  A corpus that supports `vocab_size` gets the same pieces either way.
  """
  if vocab_size < 300:
    raise ConfigError(
        f"data.vocab_size={vocab_size} is too small for SentencePiece with byte "
        "fallback (256 byte pieces + 5 specials); use >= 300, or "
        "data.tokenizer='byte'")
  os.makedirs(os.path.dirname(model_path), exist_ok=True)
  with tempfile.TemporaryDirectory(dir=os.path.dirname(model_path)) as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts),
          model_prefix=prefix,
          model_type="unigram",
          vocab_size=vocab_size,
          hard_vocab_limit=False,
          pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
          user_defined_symbols=[MASK_PIECE],
          byte_fallback=True,
          character_coverage=0.9995,
          normalization_rule_name="identity",
          remove_extra_whitespaces=False,
          allow_whitespace_only_pieces=True,
          split_digits=True,
          input_sentence_size=MAX_TRAIN_SENTENCES,
          shuffle_input_sentence=True,
          max_sentence_length=16384,
          num_threads=max(1, min(16, os.cpu_count() or 1)),
          minloglevel=2,
      )
    except RuntimeError as e:
      raise ConfigError(
          f"SentencePiece training with data.vocab_size={vocab_size} failed "
          f"({str(e).strip()[:300]})") from e
    os.replace(prefix + ".model", model_path)


def _train_texts(dataset_name: str, data_dir: str | None,
                 keys: Sequence[str]) -> Iterator[str]:
  source = sources.open_source(dataset_name, "train", data_dir)
  step = max(1, len(source) // MAX_TRAIN_SENTENCES)
  for index in range(0, len(source), step):
    example = source[index]
    for key in keys:
      value = example[key]
      text = (value.decode("utf-8", errors="replace")
              if isinstance(value, bytes) else str(value))
      if text.strip():
        yield text


def load_tokenizer(
    kind: Literal["sentencepiece", "byte"],
    vocab_size: int = 8000,
    dataset_name: str | None = None,
    data_dir: str | None = None,
    *,
    text_keys: Sequence[str] | None = None,
) -> Tokenizer:
  """Returns the tokenizer of `kind`, training a SentencePiece model if needed.

  Args:
    kind: "sentencepiece" or "byte" (ids: byte + 5, vocab 261, no training).
    vocab_size: SentencePiece vocabulary size, including the 5 special ids.
    dataset_name: dataset whose train split the SentencePiece model is trained
      on; the model is stored next to the prepared data and reused.
    data_dir: TFDS data dir (None: $TFDS_DATA_DIR or ~/tensorflow_datasets).
    text_keys: features to train on; default: the dataset's text feature, or
      source and target features of a translation dataset (shared vocabulary).
  """
  if kind == "byte":
    return ByteTokenizer()
  if kind != "sentencepiece":
    raise ConfigError(f"data.tokenizer={kind!r}; choices: "
                      f"{', '.join(TOKENIZER_KINDS)}")
  if not dataset_name:
    raise ConfigError("data.name must be set to train a SentencePiece tokenizer")
  path = tokenizer_path(dataset_name, data_dir, vocab_size)
  if not os.path.exists(path):
    # Once across processes: the others wait, then load the trained model.
    with sources.build_lock(data_dir, os.path.relpath(
        path, sources.resolve_data_dir(data_dir))):
      if not os.path.exists(path):
        if text_keys is None:
          spec = sources.dataset_spec(dataset_name)
          text_keys = ((spec.source_key, spec.target_key) if spec.target_key
                       else (spec.text_key,))
        logging.info("Training SentencePiece (vocab %d) on %s train[%s] -> %s",
                     vocab_size, dataset_name, ",".join(text_keys), path)
        train_sentencepiece(_train_texts(dataset_name, data_dir, text_keys), path,
                            vocab_size)
  tok = SentencePieceTokenizer(path)
  if tok.vocab_size < vocab_size:
    # Ids stay below the tokenizer's size, so a model.vocab_size embedding
    # still fits them: its rows from tok.vocab_size on are never a target.
    logging.warning(
        "data.vocab_size=%d is more than the train split of %s supports: its "
        "SentencePiece tokenizer has %d pieces (ids 0..%d), all SentencePiece "
        "finds in it. The model's embedding keeps model.vocab_size rows, of "
        "which ids %d and above never occur; --config.model.vocab_size=%d drops "
        "them, and more text gives a larger vocabulary.", vocab_size, dataset_name,
        tok.vocab_size, tok.vocab_size - 1, tok.vocab_size, tok.vocab_size)
  return tok


def tokenizer_from_config(data_cfg) -> Tokenizer:
  """`load_tokenizer` from the fields of a data config.

  Reads `name`, `data_dir`, `tokenizer`, `vocab_size`, the feature keys and
  `tokenizer_dataset` (train the SentencePiece model on another dataset, e.g.
  the pretraining corpus before fine-tuning; tfx_shakespeare_genre uses
  tfx_shakespeare's by default). A dataset with both `source_key` and
  `target_key` features (translation) gets one vocabulary for both languages.
  """
  keys = sources.resolve_keys(data_cfg)
  data_dir = getattr(data_cfg, "data_dir", None) or None
  kind = getattr(data_cfg, "tokenizer", None) or "sentencepiece"
  vocab_size = int(getattr(data_cfg, "vocab_size", None) or 8000)
  if kind == "hf":
    path = getattr(data_cfg, "tokenizer_file", None)
    if not path:
      raise ConfigError("data.tokenizer=hf needs data.tokenizer_file (an HF "
                        "tokenizer.json or SentencePiece model).")
    return HFTokenizer(path)
  if kind != "sentencepiece":
    return load_tokenizer(kind, vocab_size)
  own = sources.dataset_name(data_cfg)
  name = keys.tokenizer_dataset or own
  if name != own:
    keys = sources.dataset_spec(name)
  text_keys = (keys.text_key,)
  names = set(sources.features(name, data_dir).keys())
  if keys.target_key and {keys.source_key, keys.target_key} <= names:
    text_keys = (keys.source_key, keys.target_key)
  return load_tokenizer(kind, vocab_size, name, data_dir, text_keys=text_keys)
