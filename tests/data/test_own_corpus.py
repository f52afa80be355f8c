"""Your own corpus (``data.name=files``): text, JSON Lines and Parquet files.

Generated corpora in a temporary folder are converted into a temporary data
dir; the tiny runs (helpers.TINY, a few steps) share one compilation cache.
Most runs use the byte tokenizer; one trains SentencePiece on its corpus.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds

from tfx_jax.run import metrics

from tfx_jax.run import setup as run_setup

from tfx_jax.run import trained_run
from tfx_jax.data import baselines
from tfx_jax.data import file_readers
from tfx_jax.data import files_corpus
from tfx_jax.data import repairs
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax import tasks
from helpers import ROOT, cli_flags, subprocess_env, tiny_config, train, train_cli

# ml_collections loads config files with the deprecated importlib load_module().
# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes"),
              pytest.mark.usefixtures("shared_compilation_cache")]

STEPS = {"train.num_steps": 4, "eval.every_steps": 4, "checkpoint.every_steps": 4}
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "pi", "da", "gu", "fe")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  tfds.disable_progress_bar()
  return str(tmp_path_factory.mktemp("tfds"))


def words(rng: random.Random, n: int) -> str:
  return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
                  for _ in range(n))


def write_text_folder(folder: pathlib.Path, num_files: int = 30, seed: int = 0
                      ) -> pathlib.Path:
  """``num_files`` documents of a few paragraphs; one has an undecodable byte."""
  rng = random.Random(seed)
  folder.mkdir(parents=True, exist_ok=True)
  for i in range(num_files):
    text = "\n\n".join(words(rng, 40) + "." for _ in range(4)) + "\n"
    data = text.encode()
    if i == 3:
      data = data.replace(b"ka", b"k\xff", 1)
    (folder / f"doc{i:02d}.txt").write_bytes(data)
  return folder


def write_jsonl(path: pathlib.Path, records) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def write_parquet(path: pathlib.Path, records) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.Table.from_pylist(records), path)
  return path


def text_records(n: int, seed: int = 0, **extra):
  rng = random.Random(seed)
  return [{"id": i, "body": words(rng, 30), **extra} for i in range(n)]


def labelled_records(n: int, seed: int = 0):
  """Texts whose label is their first syllable's class (learnable, 3 labels)."""
  rng = random.Random(seed)
  names = ("ka", "lo", "mi")
  out = []
  for i in range(n):
    label = names[i % 3]
    out.append({"body": f"{label} " + words(rng, 20), "genre": label})
  return out


def pair_records(n: int, seed: int = 0):
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    source = words(rng, 6)
    out.append({"translation": {"xx": source, "yy": " ".join(reversed(source.split()))}})
  return out


def files_overrides(data_dir, train_files, **data):
  return {"data.name": "files", "data.train_files": str(train_files),
          "data.data_dir": data_dir, "data.tokenizer": "byte",
          **{f"data.{k}": v for k, v in data.items()}}


def manifest(data_dir, data_cfg) -> dict:
  name = sources.dataset_name(data_cfg)
  return files_corpus.manifest(sources.dataset_version(name), data_dir)


def check_finished(workdir, result, steps=4):
  assert (result.status, result.step) == ("finished", steps)
  scalars = metrics.read_scalars(pathlib.Path(workdir) / "tensorboard")
  assert [s for s, _ in scalars["train/loss"]] == list(range(1, steps + 1))
  assert [s for s, _ in scalars["eval/loss"]] == [0, steps]  # step 0: eval.at_start
  return scalars


def must_not_run(*args, **kwargs):
  raise AssertionError("bad input must be reported before anything is compiled")


# -------------------------------------------------------------- every format
def test_lm_on_a_text_folder_from_the_command_line_with_sentencepiece(
    tmp_path, data_dir):
  folder = write_text_folder(tmp_path / "my_corpus")
  overrides = files_overrides(data_dir, folder / "*.txt", tokenizer="sentencepiece",
                              vocab_size=384, text_layout="paragraphs")
  code, out, err = train_cli("lm.py:tiny", tmp_path / "run", STEPS, overrides)
  assert code == 0, err[-3000:]
  assert "Finished at step 4" in out
  config = tiny_config("lm.py:tiny", {**STEPS, **overrides})
  info = manifest(data_dir, config.data)
  # 30 files x 4 paragraphs; 6 of 120 held out (0.05 each), the rest trained on.
  assert info["examples"] == {"train": 108, "validation": 6, "test": 6}
  assert info["skipped_or_repaired"] == {"had undecodable bytes (replaced with U+FFFD)": 1}
  # SentencePiece is trained on the corpus's training split, kept with it.
  key = info["key"]
  model = pathlib.Path(data_dir, "tfx_files", key, "tokenizers", "spm_384.model")
  assert model.exists()
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  assert tok.model_path == str(model) and tok.vocab_size == 384
  # The unigram baseline works on it, cached next to the tokenizer.
  entropy = baselines.unigram_entropy(config.data, tok, tasks.get("lm").targets)
  assert 2.0 < entropy < math.log(384)
  assert key in (model.parent / baselines.CACHE_FILE).read_text()
  # With data.train_fraction, the examples a run trains on: the leading 54 of
  # the 108, counted and cached under their own key.
  half = config.data.copy_and_resolve_references()
  half.train_fraction = 0.5
  train_split = sources.open_source(sources.dataset_name(config.data), "train",
                                    config.data.data_dir or None)
  leading = [train_split[i] for i in range(54)]
  expected = baselines.unigram_entropy(config.data, tok, tasks.get("lm").targets,
                                       source=leading)
  assert baselines.unigram_entropy(half, tok, tasks.get("lm").targets) == (
      pytest.approx(expected, rel=1e-12))
  assert expected != pytest.approx(entropy, abs=1e-6)
  assert "train[:54]" in (model.parent / baselines.CACHE_FILE).read_text()


def test_a_corpus_too_small_for_data_vocab_size_gets_the_tokenizer_it_supports(
    tmp_path, data_dir, caplog):
  """A few small files hold fewer than data.vocab_size pieces: SentencePiece
  trains all it finds (not "Vocabulary size too high"), a warning names that
  size, and the ids fit the model's embedding of model.vocab_size rows."""
  folder = write_text_folder(tmp_path / "small", num_files=8)
  config = tiny_config("lm.py:tiny", files_overrides(
      data_dir, folder / "*.txt", tokenizer="sentencepiece", vocab_size=1024))
  with caplog.at_level("WARNING"):
    tok = tokenizer_lib.tokenizer_from_config(config.data)
  assert 300 < tok.vocab_size < 1024
  assert "data.vocab_size=1024 is more than" in caplog.text
  assert f"has {tok.vocab_size} pieces" in caplog.text
  text = (folder / "doc00.txt").read_text()
  ids = tok.encode(text)
  assert max(ids) < tok.vocab_size <= config.model.vocab_size
  assert tok.decode(ids) == text


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_lm_on_json_lines_and_parquet(fmt, tmp_path, data_dir):
  records = text_records(40, seed=1)
  write = write_jsonl if fmt == "jsonl" else write_parquet
  path = write(tmp_path / f"corpus.{fmt}", records)
  overrides = files_overrides(data_dir, path, text_key="body")
  workdir = tmp_path / "run"
  check_finished(workdir, train("lm.py:tiny", workdir, STEPS, overrides))
  config = tiny_config("lm.py:tiny", overrides)
  info = manifest(data_dir, config.data)
  assert info["examples"] == {"train": 36, "validation": 2, "test": 2}
  # Each example is one whole record: held out by document, never by token.
  name = sources.dataset_name(config.data)
  bodies = {r["body"] for r in records}
  seen = []
  for split in files_corpus.SPLITS:
    source = sources.open_source(name, split, data_dir)
    seen += [source[i]["text"].decode() for i in range(len(source))]
  assert sorted(seen) == sorted(bodies)
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  assert baselines.unigram_entropy(config.data, tok, tasks.get("lm").targets) > 0


def test_mlm_on_a_text_folder(tmp_path, data_dir):
  folder = write_text_folder(tmp_path / "texts", num_files=12)
  workdir = tmp_path / "run"
  scalars = check_finished(workdir, train("mlm.py:tiny", workdir, STEPS,
                                          files_overrides(data_dir, folder / "*.txt")))
  assert "eval/accuracy" in scalars


def test_translate_on_json_lines_pairs(tmp_path, data_dir):
  path = write_jsonl(tmp_path / "pairs.jsonl", pair_records(60))
  overrides = files_overrides(data_dir, path, source_key="translation.xx",
                              target_key="translation.yy")
  workdir = tmp_path / "run"
  check_finished(workdir, train("translate.py:tiny", workdir, STEPS, overrides))
  config = tiny_config("translate.py:tiny", overrides)
  name = sources.dataset_name(config.data)
  assert set(sources.features(name, data_dir).keys()) == {"source", "target"}
  example = sources.open_source(name, "validation", data_dir)[0]
  assert example["target"].decode().split() == example["source"].decode().split()[::-1]
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  assert baselines.unigram_entropy(config.data, tok, tasks.get("translate").targets) > 0


def test_classify_with_labels(tmp_path, data_dir):
  train_path = write_jsonl(tmp_path / "train.jsonl", labelled_records(60))
  valid_path = write_parquet(tmp_path / "valid.parquet", labelled_records(9, seed=1))
  overrides = {**files_overrides(data_dir, train_path, text_key="body",
                                 label_key="genre", validation_files=str(valid_path)),
               "model.num_classes": 3}
  workdir = tmp_path / "run"
  scalars = check_finished(workdir, train("finetune.py:tiny", workdir, STEPS, overrides))
  assert "eval/accuracy" in scalars
  config = tiny_config("finetune.py:tiny", overrides)
  name = sources.dataset_name(config.data)
  assert sources.features(name, data_dir)["label"].names == ["ka", "lo", "mi"]
  info = manifest(data_dir, config.data)
  assert info["held_out"] == ["test"]  # validation comes from its files
  assert info["examples"] == {"train": 57, "validation": 9, "test": 3}
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  entropy = baselines.unigram_entropy(config.data, tok, tasks.get("classify").targets)
  assert abs(entropy - 1.0986) < 0.01  # ln 3: balanced labels
  # Fewer classes than labels is refused before anything is compiled.
  with pytest.raises(ConfigError, match=r"model.num_classes=2 .* \(3\)"):
    train("finetune.py:tiny", tmp_path / "run2", STEPS, {**overrides, "model.num_classes": 2})


def test_readers_of_each_format(tmp_path):
  counts = repairs.Counts("test")

  def read(path, **features):
    return [doc for _, doc in file_readers.read_documents(
        [str(path)], features=features or {"text": "text"}, text_layout="paragraphs",
        counts=counts)]

  text = tmp_path / "a.txt"
  text.write_bytes(b"\xef\xbb\xbfFirst line\r\nsecond  \r\n \r\n\r\nNext.\n\n\n")
  assert read(text) == [{"text": "First line\nsecond"}, {"text": "Next."}]
  array = tmp_path / "b.json"  # to_json(lines=False): one array of records
  array.write_text(json.dumps([{"t": "x", "y": True}, {"t": " ", "y": 0},
                               {"t": "z", "y": None}, {"t": "w", "y": -1}]))
  assert read(array, text="t", label="y") == [{"text": "x", "label": 1}]
  assert counts.counts == {"skipped (empty text)": 1,
                           "skipped (no label: null or negative)": 2}
  nested = write_parquet(tmp_path / "c.parquet", pair_records(3))
  pairs = read(nested, source="translation.xx", target="translation.yy")
  assert [p["target"].split() for p in pairs] == [p["source"].split()[::-1] for p in pairs]
  with pytest.raises(ConfigError, match=r"c.parquet \(row 1\) has no column 'translation.zz'"):
    read(nested, source="translation.zz", target="translation.yy")
  lines = tmp_path / "d.jsonl"
  lines.write_text('{"text": "a"}\n[1, 2]\n')
  with pytest.raises(ConfigError, match=r"d.jsonl:2 is a JSON list, not an object"):
    read(lines)


# ------------------------------------------------------- the held-out splits
def test_held_out_splits_are_whole_documents_fixed_by_their_text(tmp_path, data_dir):
  records = text_records(100, seed=3)
  records += [dict(records[0], id=1000), dict(records[0], id=1001)]  # copies
  first = write_jsonl(tmp_path / "a" / "corpus.jsonl", records)
  shuffled = list(records)
  random.Random(0).shuffle(shuffled)
  second = write_jsonl(tmp_path / "b" / "corpus.jsonl", shuffled)

  def splits(path, **fields):
    cfg = tiny_config("lm.py:tiny", files_overrides(data_dir, path, text_key="body",
                                                    **fields)).data
    name = sources.dataset_name(cfg)
    out = {}
    for split in files_corpus.SPLITS:
      source = sources.open_source(name, split, data_dir)
      out[split] = sorted(source[i]["text"].decode() for i in range(len(source)))
    return out

  a, b = splits(first), splits(second)
  assert a == b  # The file order does not matter.
  assert [len(a[s]) for s in files_corpus.SPLITS] == [92, 5, 5]  # 102 x 0.05 -> 5
  copies = [s for s in files_corpus.SPLITS if records[0]["body"] in a[s]]
  assert len(copies) == 1 and a[copies[0]].count(records[0]["body"]) == 3
  other = splits(first, holdout_seed=1, holdout_fraction=0.1)
  assert [len(other[s]) for s in files_corpus.SPLITS] == [82, 10, 10]
  assert other["validation"] != a["validation"]


# --------------------------------------------------------- reuse and change
def test_converted_once_reused_and_rebuilt_when_a_file_changes(tmp_path, data_dir,
                                                               monkeypatch):
  folder = write_text_folder(tmp_path / "texts", num_files=10)
  overrides = files_overrides(data_dir, folder / "*.txt")
  cfg = tiny_config("lm.py:tiny", overrides).data
  name = sources.dataset_name(cfg)
  info = pathlib.Path(data_dir, "tfx_files", sources.dataset_version(name), "1.0.0",
                      "dataset_info.json")
  built_at = info.stat().st_mtime_ns
  build = files_corpus.build

  def rebuilt(*args, **kwargs):
    raise RuntimeError("converted again")

  monkeypatch.setattr(files_corpus, "build", rebuilt)
  assert sources.dataset_name(cfg) == name  # Reused in this process,
  script = ("from tfx_jax.run.config_base import base_config; "
            "from tfx_jax.data import sources; d = base_config().data; "
            f"d.update({({k[5:]: str(v) for k, v in overrides.items()})!r}); "
            "print(sources.dataset_name(d))")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                        env=subprocess_env(tmp_path / "cache"), capture_output=True,
                        text=True, timeout=300)
  assert proc.stdout.split() == [name], proc.stderr[-2000:]  # and in another one.
  assert info.stat().st_mtime_ns == built_at
  # Named by its key, a conversion deleted since is converted again from the
  # same files; a key that they no longer give is refused.
  monkeypatch.setattr(files_corpus, "build", build)
  shutil.rmtree(info.parent.parent)
  pinned = tiny_config("lm.py:tiny", {**overrides, "data.name": f"files:{name[-16:]}"}).data
  assert sources.dataset_name(pinned) == name and info.exists()
  with pytest.raises(ConfigError, match="no files corpus of key 0123456789abcdef"):
    sources.dataset_name(tiny_config("lm.py:tiny", {
        **overrides, "data.name": "files:0123456789abcdef"}).data)
  monkeypatch.setattr(files_corpus, "build", rebuilt)
  with open(folder / "doc05.txt", "a") as f:
    f.write("\nOne more line.\n")
  with pytest.raises(RuntimeError, match="converted again"):
    sources.dataset_name(cfg)  # A modified file: a new conversion.
  monkeypatch.setattr(files_corpus, "build", build)
  changed = sources.dataset_name(cfg)
  assert changed != name and info.exists()  # The old one stays for its runs.
  os.remove(folder / "doc09.txt")
  assert sources.dataset_name(cfg) not in (name, changed)  # A removed file too.


def test_a_resumed_run_refuses_a_changed_corpus_and_reads_the_old_by_key(
    tmp_path, data_dir, capsys):
  folder = write_text_folder(tmp_path / "texts", num_files=10)
  overrides = files_overrides(data_dir, folder / "*.txt")
  workdir = tmp_path / "run"
  check_finished(workdir, train("lm.py:tiny", workdir, STEPS, overrides))
  key = sources.data_version(tiny_config("lm.py:tiny", overrides).data)
  (folder / "doc02.txt").write_text("A rewritten document.\n")
  more = {**overrides, "train.num_steps": 8, "eval.every_steps": 8}
  with pytest.raises(ConfigError) as error:
    train("lm.py:tiny", workdir, STEPS, more)
  message = str(error.value)
  assert f"modified {folder / 'doc02.txt'}" in message and key in message
  assert f"--config.data.name=files:{key}" in message
  # Evaluation reads the corpus the run was trained on (config.json names it).
  run = trained_run.load_run(workdir)
  assert run.config.data.name == f"files:{key}"
  # Resumed on that corpus, by its key.
  result = train("lm.py:tiny", workdir, STEPS, {**more, "data.name": f"files:{key}"})
  assert (result.status, result.step) == ("finished", 8)
  assert "Resumed from step 4" in capsys.readouterr().out


# --------------------------------------------------------------- bad input
def _errors(tmp_path):
  """(overrides, words the error must contain) for each bad input."""
  good = write_jsonl(tmp_path / "good.jsonl", text_records(20))
  no_key = tmp_path / "no_key.jsonl"
  no_key.write_text('{"body": "a text"}\n\n{"title": "x", "id": 2}\n')
  table = write_parquet(tmp_path / "t.parquet", [{"content": "x", "id": 1}])
  empty = tmp_path / "empty"
  empty.mkdir()
  for i in range(3):
    (empty / f"{i}.txt").write_text("  \n\n")
  train_labels = write_jsonl(tmp_path / "l_train.jsonl", labelled_records(30))
  other_labels = write_jsonl(tmp_path / "l_valid.jsonl", [{"body": "x", "genre": "zz"},
                                                          {"body": "y", "genre": "ka"}])
  (tmp_path / "data.csv").write_text("text\nx\n")
  (tmp_path / "one.txt").write_text("A single document.\n\nOf two paragraphs.\n")
  return [
      ({"data.train_files": str(tmp_path / "nothing" / "*.txt")},
       ["data.train_files: no file matches", "nothing/*.txt"]),
      ({"data.train_files": str(empty)},
       ["no file matches", "it is a directory: match its files", "empty/*.txt"]),
      ({"data.train_files": str(tmp_path / "data.csv")},
       ["unknown format '.csv'", ".txt/.text", ".jsonl/.json", ".parquet"]),
      ({"data.train_files": str(no_key), "data.text_key": "body"},
       [f"{no_key}:3 has no field 'body' (data.text_key); its fields: title, id"]),
      ({"data.train_files": str(table), "data.text_key": "body"},
       [f"{table} has no column 'body' (data.text_key); its columns: content, id"]),
      ({"data.train_files": str(empty / "*.txt")},
       ["data.train_files", "hold no text (empty corpus)"]),
      ({"data.train_files": str(tmp_path / "one.txt")},
       ["data.train_files holds 1 document(s): too few to hold out validation and test",
        "data.validation_files", "data.text_layout=paragraphs"]),
      ({"data.train_files": str(good), "data.text_key": "body",
        "data.holdout_fraction": 0.6},
       ["data.holdout_fraction=0.6 is not valid", "(0, 0.5)"]),
      ({"data.train_files": f"{good},{tmp_path / 'missing.jsonl'}"},
       ["no file matches", "missing.jsonl"]),
      ({"data.train_files": str(good), "data.text_layout": "lines"},
       ["data.text_layout='lines'", "file, paragraphs"]),
      ({"data.train_files": None},
       ["data.name=files needs data.train_files", "my_corpus/*.txt"]),
      ({"data.name": "tfx_shakespeare", "data.train_files": str(good)},
       ["data.train_files is set, but data.name='tfx_shakespeare'",
        "--config.data.name=files"]),
      ({"task": "classify", "model.num_classes": 3, "data.train_files": str(good),
        "data.text_key": "body"},
       ["task='classify' reads labels", "data.label_key"]),
      ({"task": "classify", "model.num_classes": 3, "data.train_files": str(train_labels),
        "data.validation_files": str(other_labels), "data.text_key": "body",
        "data.label_key": "genre"},
       ["labels of data.validation_files differ", "Only in validation: 'zz'",
        "only in train: 'lo', 'mi'"]),
  ]


def test_bad_input_exits_2_naming_the_problem_before_anything_is_built(
    tmp_path, monkeypatch):
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  data_dir = tmp_path / "tfds"
  for overrides, expected in _errors(tmp_path):
    flags = {**files_overrides(str(data_dir), ""), **overrides}
    if flags["data.train_files"] is None:
      del flags["data.train_files"]
    code, _, err = train_cli("lm.py:tiny", tmp_path / "run", STEPS, flags)
    assert code == 2 and "Traceback" not in err, (overrides, err[-2000:])
    for part in expected:
      assert part in err, (part, err[-2000:])
  # Every error came before the conversion: nothing was converted.
  assert not list(data_dir.glob("tfx_files/*/1.0.0"))


def test_translate_needs_pairs_and_text_files_hold_no_labels(tmp_path, data_dir):
  folder = write_text_folder(tmp_path / "texts", num_files=4)
  cases = [
      ("translate.py:tiny", {}, "task='translate' reads pairs"),
      ("lm.py:tiny", {"data.source_key": "a", "data.target_key": "b"},
       "make a corpus of pairs, but task='lm'"),
      ("lm.py:tiny", {"data.source_key": "a"}, "data.target_key is not set"),
      ("finetune.py:tiny", {"data.label_key": "genre"}, "is plain text, which holds no labels"),
  ]
  for spec, extra, message in cases:
    overrides = {**files_overrides(data_dir, folder / "*.txt"), **extra}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
      train(spec, tmp_path / "run", STEPS, overrides)


# -------------------------------------------------------------------- sweep
@pytest.mark.slow
def test_a_sweep_on_a_files_corpus_converts_it_once(tmp_path):
  folder = write_text_folder(tmp_path / "texts", num_files=12)
  data_dir = tmp_path / "tfds"
  flags = cli_flags({**STEPS, **files_overrides(str(data_dir), folder / "*.txt")})
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.norm_type=layernorm,rmsnorm",
          "--name", "files", "--workdir", tmp_path / "sweeps", "--parallel", "2", *flags]
  proc = subprocess.run([sys.executable, "-m", "tfx_jax.sweep", *map(str, args)],
                        cwd=ROOT, env=subprocess_env(tmp_path / "cache"),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = json.loads((tmp_path / "sweeps" / "files" / "sweep.json").read_text())
  assert [r["state"] for r in record["runs"]] == ["finished", "finished"]
  assert record["report_split"] == "validation"
  conversions = list((data_dir / "tfx_files").iterdir())
  assert len(conversions) == 1 and (conversions[0] / "1.0.0").is_dir()
  for entry in record["runs"]:
    scalars = metrics.read_scalars(tmp_path / "sweeps" / "files" / entry["name"]
                                   / "tensorboard")
    assert [s for s, _ in scalars["eval/loss"]] == [0, 4]
  # The report judges the runs against the unigram baseline of the corpus.
  report = json.loads((tmp_path / "sweeps" / "files" / "report.json").read_text())
  entropies = {b["unigram_entropy"] for b in report["baselines"].values()}
  assert len(entropies) == 1 and 0 < entropies.pop() < math.log(261)  # byte tokenizer
