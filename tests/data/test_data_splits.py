"""The embedded datasets' held-out splits and the unigram-entropy baseline.

The split rules are checked without building anything; the baseline's cache on
`tfx_gcc_translate/de` built into a temporary data dir (the built datasets'
contents are checked in test_data.py).
"""

import collections
import hashlib
import json
import math
import os

import ml_collections
import numpy as np
import pytest
from scipy import stats as scipy_stats
import tensorflow_datasets as tfds

from tfx_jax.data import baselines
from tfx_jax.data import gcc_translate
from tfx_jax.data import shakespeare
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax import tasks


def data_config(name, data_dir=None, **overrides):
  fields = dict(name=name, data_dir=data_dir, tokenizer="byte", vocab_size=8000,
                mask_rate=0.15, text_key="", source_key="", target_key="",
                label_key="", tokenizer_dataset="")
  fields.update(overrides)
  return ml_collections.ConfigDict(fields)


# ----------------------------------------------------------------- splits


def test_shakespeare_holds_out_one_work_per_genre_and_split():
  held_out = shakespeare.HELD_OUT_WORKS
  assert set(held_out) == {"validation", "test"}
  for split, works in held_out.items():
    genres = sorted(shakespeare.GENRE_OF_WORK[w] for w in works)
    assert genres == sorted(shakespeare.GENRES), split
  assert not set(shakespeare.VALIDATION_WORKS) & set(shakespeare.TEST_WORKS)
  works = list(shakespeare.GENRE_OF_WORK)
  splits = shakespeare.split_works(works)
  assert sorted(w for names in splits.values() for w in names) == sorted(works)
  for split, works_of_split in shakespeare.split_works(works[::-1]).items():
    assert sorted(works_of_split) == sorted(splits[split])  # Order-free.
  # Every genre keeps training works, so the genre labels are learnable.
  assert {shakespeare.GENRE_OF_WORK[w] for w in splits["train"]} == set(
      shakespeare.GENRES)
  with pytest.raises(ValueError, match="lovers_complaint"):
    shakespeare.split_works([w for w in works if w != "lovers_complaint"])


def reference_bucket(source):
  digest = hashlib.sha256(source.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") % 100


def test_gcc_split_is_three_hash_ranges_of_the_source():
  messages = [f"invalid operand {i} for {op!r}" for i in range(4000)
              for op in ("asm", "%")]
  split = {m: gcc_translate.split_of(m) for m in messages}
  for m in messages:
    bucket = reference_bucket(m)
    # Validation is 1.0.0's (buckets 0-4); test takes buckets 5-9 from train.
    expected = ("validation" if bucket < 5 else "test" if bucket < 10
                else "train")
    assert split[m] == expected
  share = collections.Counter(split.values())
  assert abs(share["validation"] / len(messages) - 0.05) < 0.01
  assert abs(share["test"] / len(messages) - 0.05) < 0.01


def test_builders_declare_a_new_version_with_a_release_note():
  for builder in (shakespeare.TfxShakespeare, shakespeare.TfxShakespeareGenre,
                  gcc_translate.TfxGccTranslate):
    version = str(builder.VERSION)
    assert version != "1.0.0" and "test split" in builder.RELEASE_NOTES[version]


def test_tokenizers_are_kept_per_version(tmp_path):
  root = str(tmp_path)
  current = str(shakespeare.TfxShakespeare.VERSION)
  assert tokenizer_lib.tokenizer_path("tfx_shakespeare", root, 1024) == str(
      tmp_path / "tfx_shakespeare" / "tokenizers" / current / "spm_1024.model")
  # 1.0.0's tokenizers stay where runs trained on 1.0.0 found them.
  assert tokenizer_lib.tokenizer_path("tfx_shakespeare:1.0.0", root, 1024) == str(
      tmp_path / "tfx_shakespeare" / "tokenizers" / "spm_1024.model")
  assert tokenizer_lib.tokenizer_path("tfx_gcc_translate", root, 8) == str(
      tmp_path / "tfx_gcc_translate" / "de" / "tokenizers" / current /
      "spm_8.model")
  assert tokenizer_lib.tokenizer_path("lm1b", root, 8) == str(
      tmp_path / "lm1b" / "tokenizers" / "spm_8.model")
  spec = sources.dataset_spec("tfx_shakespeare_genre:1.0.0")
  assert spec.tokenizer_dataset == "tfx_shakespeare:1.0.0"
  assert spec.label_key == "label"


# ----------------------------------------------------------------- baseline


def numpy_entropy(ids):
  _, counts = np.unique(np.asarray(ids), return_counts=True)
  p = counts / counts.sum()
  return float(-(p * np.log(p)).sum())


def test_unigram_entropy_matches_scipy():
  rng = np.random.default_rng(15)
  counts = rng.integers(0, 50, 100)
  counts[[3, 17]] = 0
  assert baselines.entropy_nats(counts) == pytest.approx(scipy_stats.entropy(counts), rel=1e-12)
  assert baselines.entropy_nats([5, 0, 5]) == pytest.approx(math.log(2))
  assert baselines.entropy_nats(np.bincount([4, 4, 4])) == 0.0
  with pytest.raises(ValueError):
    baselines.entropy_nats([0, 0])
  with pytest.raises(ValueError):
    baselines.entropy_nats([3, -1])


TEXTS = ["To be, or not to be", "", "that is the question:",
         "Whether 'tis nobler in the mind to suffer", "   \n"]


def test_lm_and_mlm_entropy_match_numpy():
  tok = tokenizer_lib.ByteTokenizer()
  source = [{"text": t.encode()} for t in TEXTS]
  lm_ids = [i for t in TEXTS if t.strip() for i in tok.encode(t) + [tok.eos_id]]
  cfg = data_config("memory")
  assert baselines.unigram_entropy(cfg, tok, tasks.get("lm").targets, source=source) == (
      pytest.approx(numpy_entropy(lm_ids), rel=1e-12))
  mlm_ids = [i for t in TEXTS if t.strip() for i in tok.encode(t)]
  assert baselines.unigram_entropy(cfg, tok, tasks.get("mlm").targets, source=source) == (
      pytest.approx(numpy_entropy(mlm_ids), rel=1e-12))
  # Uniform over k labels: log k.
  labelled = [{"text": b"x", "label": i % 4} for i in range(8)] + [
      {"text": b"x", "label": -1}]
  assert baselines.unigram_entropy(cfg, tok, tasks.get("classify").targets, source=labelled) == (
      pytest.approx(np.log(4)))


def test_translate_entropy_matches_numpy():
  tok = tokenizer_lib.ByteTokenizer()
  pairs = [("file not found", "Datei nicht gefunden"),
           ("invalid operand", "ungültiger Operand"),
           ("", "leer"),  # Skipped as the rows skip it.
           ("unused variable {0}", "unbenutzte Variable {0}")]
  source = [{"en": en.encode(), "de": de.encode()} for en, de in pairs]
  ids = [i for en, de in pairs if en for i in tok.encode(de) + [tok.eos_id]]
  cfg = data_config("memory", source_key="en", target_key="de")
  assert baselines.unigram_entropy(cfg, tok, tasks.get("translate").targets, source=source) == (
      pytest.approx(numpy_entropy(ids), rel=1e-12))
  with pytest.raises(ConfigError, match="choices: lm, translate, mlm"):
    baselines.unigram_entropy(cfg, tok, tasks.get("summarize").targets, source=source)


def test_different_tokenizers_get_different_keys(tmp_path):
  rng = np.random.default_rng(0)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  texts = [" ".join("".join(rng.choice(letters, rng.integers(2, 8)))
                    for _ in range(12)) for _ in range(500)]
  keys = set()
  for vocab in (300, 320):
    path = str(tmp_path / f"spm_{vocab}.model")
    tokenizer_lib.train_sentencepiece(texts, path, vocab)
    identity = baselines.tokenizer_identity(
        tokenizer_lib.SentencePieceTokenizer(path))
    keys.add(baselines.cache_key("d", "1.0.0", "train", "lm", ["text"],
                                 identity))
  keys.add(baselines.cache_key(
      "d", "1.0.0", "train", "lm", ["text"],
      baselines.tokenizer_identity(tokenizer_lib.ByteTokenizer())))
  assert len(keys) == 3


class CountingTokenizer(tokenizer_lib.ByteTokenizer):
  calls = 0

  def encode(self, text):
    CountingTokenizer.calls += 1
    return super().encode(text)


@pytest.fixture(scope="module")
def gcc_data_dir(tmp_path_factory):
  """tfx_gcc_translate/de built into a temporary data dir.

  The catalog is taken from where it is already unpacked (the system or the
  default data dir's downloads), else the builder fetches it.
  """
  path = tmp_path_factory.mktemp("tfds")
  shared = os.path.join(sources.resolve_data_dir(None), "downloads")
  try:
    catalog = gcc_translate.find_catalog("de", shared, fetch=False)
  except ConfigError:
    catalog = None
  if catalog and catalog.startswith(shared):
    os.makedirs(path / "downloads")
    os.symlink(os.path.join(shared, gcc_translate.PACKAGE),
               path / "downloads" / gcc_translate.PACKAGE)
  tfds.disable_progress_bar()
  sources.prepare("tfx_gcc_translate/de", str(path))
  return str(path)


@pytest.mark.slow
def test_entropy_is_computed_once_and_kept_with_the_data(gcc_data_dir,
                                                         monkeypatch):
  cfg = data_config("tfx_gcc_translate/de", gcc_data_dir)
  tok = CountingTokenizer()
  CountingTokenizer.calls = 0
  first = baselines.unigram_entropy(cfg, tok, tasks.get("translate").targets)
  train = sources.open_source("tfx_gcc_translate/de", "train", gcc_data_dir)
  assert CountingTokenizer.calls == 2 * len(train)  # Each side of each pair once.
  expected = numpy_entropy(np.concatenate([
      tok.encode(train[i]["de"].decode()) + [tok.eos_id]
      for i in range(len(train))]))
  assert first == pytest.approx(expected, rel=1e-12)
  path = os.path.join(tokenizer_lib.tokenizer_dir("tfx_gcc_translate/de",
                                                  gcc_data_dir),
                      baselines.CACHE_FILE)
  with open(path) as f:
    cache = json.load(f)
  (key,) = cache
  assert key.startswith(f"tfx_gcc_translate/de:"
                        f"{gcc_translate.TfxGccTranslate.VERSION} train "
                        "translate(en,de) byte vocab=261")
  assert cache[key]["examples"] == len(train)

  CountingTokenizer.calls = 0
  def must_not_count(*args, **kwargs):
    raise AssertionError("recomputed a cached entropy")
  monkeypatch.setattr(baselines, "target_counts", must_not_count)
  assert baselines.unigram_entropy(cfg, tok, tasks.get("translate").targets) == first
  assert CountingTokenizer.calls == 0
  monkeypatch.undo()

  # Another tokenizer (a SentencePiece model) is another entry of the file.
  spm_cfg = data_config("tfx_gcc_translate/de", gcc_data_dir,
                        tokenizer="sentencepiece", vocab_size=400)
  spm = tokenizer_lib.tokenizer_from_config(spm_cfg)
  assert os.path.dirname(spm.model_path) == os.path.dirname(path)
  other = baselines.unigram_entropy(spm_cfg, spm, tasks.get("translate").targets)
  with open(path) as f:
    cache = json.load(f)
  assert len(cache) == 2 and cache[key]["entropy_nats"] == first
  assert other != first and other > 0
