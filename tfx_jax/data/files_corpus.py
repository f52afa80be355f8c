r"""Your own corpus (``data.name=files``): text, JSON Lines or Parquet files.

  python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/mine \
      --config.data.name=files --config.data.train_files='my_corpus/*.txt'

The files are converted once into a TFDS dataset in array_record format,
``<data_dir>/tfx_files/<key>/``, read like any other (``sources``), with the
features of the embedded datasets: ``text``, or ``source`` and ``target`` for
translation pairs, and a ``label`` (ClassLabel) for classification.

Fields (``config.data``):

* ``train_files``, ``validation_files``, ``test_files``: comma-separated glob
  patterns (``**`` recurses). The format follows the extension
  (``file_readers``): ``.txt`` / ``.text`` plain text, ``.jsonl`` / ``.json``
  JSON Lines, ``.parquet`` (as Hugging Face ``datasets`` writes with
  ``to_parquet``; read with pyarrow).
* ``text_layout``: plain text holds one document per file (``file``) or per
  blank-line separated block (``paragraphs``).
* ``text_key`` (default ``text``), ``source_key`` + ``target_key`` (pairs),
  ``label_key``: the JSON fields or Parquet columns read; a dotted key
  (``translation.en``) reads a nested field. Labels are strings (classes in
  sorted order) or integers 0..K-1 (kept); a record with a null or negative
  label is skipped (counted).
* ``holdout_fraction`` (default 0.05), ``holdout_seed`` (default 0): a split
  without files is held out of the training files, by document, never by
  token: documents are ranked by SHA-256 of (``holdout_seed``, document) and
  each held-out split takes the next ``max(1, round(fraction x documents))``.
  A document's split depends on its content only (copies never straddle
  splits), not on the file order or the run's ``seed`` (so the runs of a seed
  sweep share their evaluation data and tokenizer).

The key (``content_key``) hashes every file's path, size and modification time
and the fields above: a second run, a sweep's runs and the processes of one run
reuse the conversion (built once under ``sources.build_lock``); a changed,
added or removed file gives a new key, so a new conversion and tokenizer. Runs
record the key as ``data.version`` and read the conversion they started with:
``data.name=files:<key>`` reads a conversion already built, whatever the files
are now (their config.json names it so). ``corpus.json`` next to
the conversion lists its files, fields, example counts and repairs (undecodable
bytes are replaced with U+FFFD and counted, as in the embedded builders).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from absl import logging
import tensorflow_datasets as tfds

from tfx_jax.core import atomic as files_lib
from tfx_jax.data import builder_base
from tfx_jax.data.config import DataConfig
from tfx_jax.data import file_readers
from tfx_jax.data import repairs
from tfx_jax.core.errors import ConfigError

FILES = "files"  # data.name
TFDS_NAME = "tfx_files"
SPLITS = ("train", "validation", "test")
FILE_FIELDS = {split: f"{split}_files" for split in SPLITS}
DEFAULT_TEXT_KEY = "text"
DEFAULT_HOLDOUT_FRACTION = DataConfig.holdout_fraction
# Changing how files become examples changes every key (a new conversion).
CONVERSION_VERSION = 1
MANIFEST = "corpus.json"


# ------------------------------------------------------------ the config
@dataclasses.dataclass(frozen=True)
class Fields:
  """The ``data.*`` fields that decide what the files become."""

  text_layout: str = "file"
  text_key: str = DEFAULT_TEXT_KEY
  source_key: str = ""
  target_key: str = ""
  label_key: str = ""
  holdout_fraction: float = DEFAULT_HOLDOUT_FRACTION
  holdout_seed: int = 0

  @property
  def pairs(self) -> bool:
    return bool(self.source_key or self.target_key)

  def features(self) -> dict[str, str]:
    """{feature of the converted dataset: the field it is read from}."""
    if self.pairs:
      return {"source": self.source_key, "target": self.target_key}
    out = {"text": self.text_key}
    if self.label_key:
      out["label"] = self.label_key
    return out


@dataclasses.dataclass(frozen=True)
class SourceFile:
  path: str  # absolute
  size: int
  mtime_ns: int

  @property
  def format(self) -> str:
    return file_readers.format_of(self.path)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A files corpus: its key, and (unless pinned by key) its files and fields."""

  key: str
  fields: Fields | None = None
  files: Mapping[str, tuple[SourceFile, ...]] = dataclasses.field(default_factory=dict)

  @property
  def name(self) -> str:
    """The converted dataset's TFDS name."""
    return f"{TFDS_NAME}/{self.key}"

  @property
  def pinned(self) -> bool:
    """Named by key (``files:<key>``): read as converted, files not looked at."""
    return self.fields is None

  @property
  def held_out(self) -> tuple[str, ...]:
    """The splits taken out of the training files (those without files)."""
    return tuple(s for s in SPLITS[1:] if not self.files.get(s))


def is_files(name: str) -> bool:
  """Whether data.name ``name`` reads files (``files`` or ``files:<key>``)."""
  return str(name).partition(":")[0] == FILES


def is_converted_name(name: str) -> bool:
  """Whether ``name`` is the TFDS name of a conversion (``tfx_files/<key>``)."""
  return str(name).partition(":")[0].startswith(TFDS_NAME + "/")


def _get(data_cfg: Any, field: str, default: Any = None) -> Any:
  value = getattr(data_cfg, field, None)
  return default if value is None else value


def fields_of(data_cfg: Any) -> Fields:
  """The conversion fields of a data config, checked (ConfigError otherwise)."""
  layout = str(_get(data_cfg, "text_layout", "file"))
  if layout not in file_readers.TEXT_LAYOUTS:
    raise ConfigError(f"data.text_layout={layout!r} is not a valid choice; choose one "
                      f"of: {', '.join(file_readers.TEXT_LAYOUTS)} (one document per file, or per "
                      "blank-line separated block).")
  fraction = _get(data_cfg, "holdout_fraction", DEFAULT_HOLDOUT_FRACTION)
  if not isinstance(fraction, (int, float)) or not 0.0 < fraction < 0.5:
    raise ConfigError(f"data.holdout_fraction={fraction!r} is not valid: must be in "
                      "(0, 0.5), the share of the training documents held out for each "
                      "of validation and test when their files are not given.")
  fields = Fields(
      text_layout=layout, text_key=str(_get(data_cfg, "text_key", "") or DEFAULT_TEXT_KEY),
      source_key=str(_get(data_cfg, "source_key", "")),
      target_key=str(_get(data_cfg, "target_key", "")),
      label_key=str(_get(data_cfg, "label_key", "")),
      holdout_fraction=float(fraction), holdout_seed=int(_get(data_cfg, "holdout_seed", 0)))
  if fields.pairs and not (fields.source_key and fields.target_key):
    missing = "data.target_key" if fields.source_key else "data.source_key"
    raise ConfigError(f"data.name=files reads pairs from data.source_key and "
                      f"data.target_key; {missing} is not set.")
  if fields.pairs and fields.label_key:
    raise ConfigError("data.label_key cannot be combined with data.source_key/"
                      "data.target_key: a files corpus holds texts with labels "
                      "(task=classify) or pairs (task=translate).")
  return fields


def check_config(data_cfg: Any, rows: Any) -> None:
  """Every check of the files fields that reads no file content: the fields,
  the needs of the task's rows (``rows.RowFormat``: pairs, labels) and the
  patterns (each must match files of a known format). Another data.name must
  leave the ``*_files`` fields unset."""
  name = str(data_cfg.name)
  if not is_files(name):
    given = [f"data.{f}" for f in FILE_FIELDS.values() if _get(data_cfg, f)]
    if given:
      raise ConfigError(
          f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set, but "
          f"data.name={name!r}: the *_files fields are read by data.name=files "
          "only; set --config.data.name=files to train on them, or unset them.")
    return
  fields = fields_of(data_cfg)
  reads = set(rows.keys)
  if "source_key" in reads and not fields.pairs:
    raise ConfigError(
        f"task={rows.name!r} reads pairs: with data.name=files set data.source_key and "
        "data.target_key to the fields (JSON Lines) or columns (Parquet) of each pair.")
  if fields.pairs and "source_key" not in reads:
    raise ConfigError(
        f"data.source_key/data.target_key make a corpus of pairs, but task="
        f"{rows.name!r} reads texts (data.text_key, default 'text'); unset them.")
  if rows.labelled and not fields.label_key:
    raise ConfigError(
        f"task={rows.name!r} reads labels: with data.name=files set data.label_key to "
        "the field (JSON Lines) or column (Parquet) that holds each text's label.")
  resolve(data_cfg)


# ---------------------------------------------------------- the files
def _patterns(value: str) -> list[str]:
  return [p.strip() for p in str(value).split(",") if p.strip()]


def match_files(field: str, value: str) -> tuple[SourceFile, ...]:
  """The files of ``data.<field>`` (comma-separated globs), sorted, once each.

  A pattern that matches no file, or a file of an unknown format, is a
  ConfigError naming it.
  """
  paths: set[str] = set()
  for pattern in _patterns(value):
    matched = [os.path.abspath(p) for p in glob.glob(os.path.expanduser(pattern),
                                                     recursive=True)
               if os.path.isfile(p)]
    if not matched:
      hint = (f"; it is a directory: match its files, e.g. "
              f"'{os.path.join(pattern, '*.txt')}'" if os.path.isdir(pattern) else "")
      raise ConfigError(f"data.{field}: no file matches {pattern!r} (relative patterns "
                        f"are read from {os.getcwd()}){hint}.")
    for path in matched:
      try:
        file_readers.format_of(path)
      except ConfigError as e:
        raise ConfigError(f"data.{field}: {e}") from None
    paths.update(matched)
  if not paths:
    raise ConfigError(f"data.{field}={value!r} names no pattern.")
  out = []
  for path in sorted(paths):
    stat = os.stat(path)
    out.append(SourceFile(path, stat.st_size, stat.st_mtime_ns))
  return tuple(out)


def content_key(fields: Fields, files: Mapping[str, Sequence[SourceFile]]) -> str:
  """16 hex digits of SHA-256 over the files (path, size, mtime) and fields."""
  held_out = [s for s in SPLITS[1:] if not files.get(s)]
  described = {
      "conversion": CONVERSION_VERSION,
      "fields": {"text_layout": fields.text_layout, "features": fields.features(),
                 **({"holdout": [fields.holdout_fraction, fields.holdout_seed,
                                 held_out]} if held_out else {})},
      "files": {s: [[f.path, f.size, f.mtime_ns] for f in files.get(s, ())]
                for s in SPLITS},
  }
  text = json.dumps(described, sort_keys=True)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def resolve(data_cfg: Any) -> Corpus:
  """The corpus ``data_cfg`` names: for ``files``, its files matched and
  stat-ed (``resolve_files``); for ``files:<key>``, the conversion of that
  key, whatever the files are now (not looked at)."""
  _, key = str(data_cfg.name).partition(":")[::2]
  if not key:
    return resolve_files(data_cfg)
  if not re.fullmatch(r"[0-9a-f]{16}", key):
    raise ConfigError(f"data.name={data_cfg.name!r}: {key!r} is not a corpus key "
                      "(16 hex digits, as a run records in data.version).")
  return Corpus(key)


def resolve_files(data_cfg: Any) -> Corpus:
  """The corpus of the ``*_files`` fields of ``data_cfg``: its files matched
  and stat-ed, its fields checked, and its key."""
  fields = fields_of(data_cfg)
  if not _get(data_cfg, "train_files"):
    raise ConfigError(
        "data.name=files needs data.train_files: comma-separated glob patterns of "
        ".txt/.text, .jsonl/.json or .parquet files, e.g. "
        "--config.data.train_files='my_corpus/*.txt'.")
  files = {split: match_files(field, _get(data_cfg, field))
           for split, field in FILE_FIELDS.items() if _get(data_cfg, field)}
  if fields.pairs or fields.label_key:
    for split, split_files in files.items():
      for f in split_files:
        if f.format == "text":
          what = "pairs" if fields.pairs else "labels"
          raise ConfigError(
              f"data.{FILE_FIELDS[split]}: {f.path} is plain text, which holds no "
              f"{what} (data.{'source_key' if fields.pairs else 'label_key'} is set); "
              "use JSON Lines (.jsonl) or Parquet (.parquet) files.")
  return Corpus(content_key(fields, files), fields, files)


def conversion_dir(key: str, data_dir: str) -> str:
  """``<data_dir>/tfx_files/<key>``: the conversion, its manifest, its tokenizers."""
  return os.path.join(data_dir, TFDS_NAME, key)


def is_built(corpus: Corpus, data_dir: str) -> bool:
  return os.path.exists(os.path.join(conversion_dir(corpus.key, data_dir),
                                     str(TfxFiles.VERSION), "dataset_info.json"))


def built_keys(data_dir: str) -> list[str]:
  """Keys of the conversions in ``data_dir``, newest first."""
  root = os.path.join(data_dir, TFDS_NAME)
  keys = [k for k in os.listdir(root) if re.fullmatch(r"[0-9a-f]{16}", k)] if (
      os.path.isdir(root)) else []
  return sorted(keys, key=lambda k: -os.path.getmtime(os.path.join(root, k)))


def documents(files: Sequence[SourceFile], fields: Fields, counts: repairs.Counts
              ) -> Iterator[file_readers.Document]:
  """The usable documents of ``files`` (``file_readers.read_documents``)."""
  return file_readers.read_documents([f.path for f in files], features=fields.features(),
                                     text_layout=fields.text_layout, counts=counts)


def holdout_rank(doc: Mapping[str, Any], seed: int) -> int:
  """A document's place in the held-out order: SHA-256 of the seed and its
  text (the source of a pair), as an integer."""
  text = doc["source"] if "source" in doc else doc["text"]
  digest = hashlib.sha256(f"{seed}\x00{text}".encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big")


# ---------------------------------------------------------------- the plan
def split_of(cuts: Mapping[str, int], rank: int) -> str:
  """The split of a training document of ``rank``: the first held-out split
  whose cut it is under (cuts rise in SPLITS order), else train."""
  for split, cut in cuts.items():
    if rank <= cut:
      return split
  return "train"


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a first pass over the files found: the held-out cut points, the
  examples of each split, the label set and what was skipped or repaired."""

  cuts: dict[str, int]  # held-out split -> highest rank it takes
  examples: dict[str, int]
  labels: list[int | str] | None  # the training labels (None: no labels)
  counts: dict[str, int]

  def class_names(self) -> list[str] | None:
    """ClassLabel names: integer labels keep their values (0..max), strings
    are classes in sorted order."""
    if self.labels is None:
      return None
    if all(isinstance(l, int) for l in self.labels):
      return [str(i) for i in range(max(self.labels) + 1)]
    return [str(l) for l in self.labels]


def _describe_labels(labels) -> str:
  return ", ".join(map(repr, sorted(labels, key=str))) or "(none)"


def _check_labels(key: str, labels: Mapping[str, set], given: Sequence[str]) -> list:
  """The training label set, after checking it against the given splits'."""
  train = labels["train"]
  if len({type(l) for split_labels in labels.values() for l in split_labels}) > 1:
    raise ConfigError(f"data.label_key={key!r} holds both strings and integers; use "
                      "one kind for every label.")
  for split in given:
    if labels[split] != train:
      raise ConfigError(
          f"data.label_key={key!r}: the labels of data.{FILE_FIELDS[split]} differ "
          f"from those of data.train_files; every split needs the same label set. Only "
          f"in {split}: {_describe_labels(labels[split] - train)}; only in train: "
          f"{_describe_labels(train - labels[split])}.")
  if len(train) < 2:
    raise ConfigError(f"data.label_key={key!r}: the training documents have "
                      f"{len(train)} label(s) ({_describe_labels(train)}); a classifier "
                      "needs at least 2.")
  return sorted(train)


def plan(corpus: Corpus) -> Plan:
  """Reads every document once to check the corpus before anything is
  written (keys present, no split empty, one label set in every split) and
  ranks the training documents to hold out the splits without files."""
  fields, held_out = corpus.fields, corpus.held_out
  counts = repairs.Counts(f"files corpus {corpus.key}")
  found = {}  # split of the files -> [(rank, label)] of its documents
  for split, split_files in corpus.files.items():
    found[split] = [(holdout_rank(doc, fields.holdout_seed), doc.get("label"))
                    for _, doc in documents(split_files, fields, counts)]
    if not found[split]:
      raise ConfigError(
          f"data.{FILE_FIELDS[split]}: the {len(split_files)} file(s) it matches hold "
          f"no text (empty corpus); skipped: {dict(counts.counts) or 'nothing'}.")
  cuts = {}
  if held_out:
    n = len(found["train"])
    share = max(1, round(fields.holdout_fraction * n))
    if n - share * len(held_out) < 1:
      raise ConfigError(
          f"data.train_files holds {n} document(s): too few to hold out "
          f"{' and '.join(held_out)} (at least one document each, "
          f"data.holdout_fraction={fields.holdout_fraction} of them) and train on "
          f"the rest; add documents or give data.{FILE_FIELDS[held_out[0]]}"
          f"{', or set data.text_layout=paragraphs' if fields.text_layout == 'file' else ''}.")
    ranks = sorted(rank for rank, _ in found["train"])
    cuts = {split: ranks[(i + 1) * share - 1] for i, split in enumerate(held_out)}
  examples = {split: 0 for split in SPLITS}
  labels: dict[str, set] = {split: set() for split in SPLITS}
  for split, docs in found.items():
    for rank, label in docs:
      into = split_of(cuts, rank) if split == "train" else split
      examples[into] += 1
      labels[into].add(label)
  label_set = None
  if fields.label_key:
    label_set = _check_labels(fields.label_key, labels,
                              [s for s in SPLITS[1:] if s not in held_out])
  return Plan(cuts, examples, label_set, dict(counts.counts))


# ------------------------------------------------------------- the builder
class _Uncounted:
  """A second pass's counts: the first already counted and logged them."""

  def add(self, kind: str, detail: str = "", **kwargs) -> None:
    del kind, detail, kwargs


class TfxFiles(builder_base.PackageBuilder, skip_registration=True):
  """One files corpus as a TFDS dataset; its config is the corpus key.

  Not registered: the conversion is read back by name (``tfx_files/<key>``)
  from its files, as any prepared TFDS dataset.
  """

  name = TFDS_NAME
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(self, corpus: Corpus, corpus_plan: Plan, data_dir: str):
    self._corpus, self._plan = corpus, corpus_plan
    config = tfds.core.BuilderConfig(
        name=corpus.key, version=self.VERSION,
        description="a files corpus, keyed by its files and fields")
    super().__init__(data_dir=data_dir, config=config, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    features = {name: tfds.features.Text() for name in self._corpus.fields.features()
                if name != "label"}
    if self._plan.labels is not None:
      features["label"] = tfds.features.ClassLabel(names=self._plan.class_names())
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__, features=tfds.features.FeaturesDict(features),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in SPLITS}

  def _generate_examples(self, split):
    corpus, fields = self._corpus, self._corpus.fields
    counts = _Uncounted()  # The plan counted (and logged) them.
    from_train = split in corpus.held_out or (split == "train" and corpus.held_out)
    source = "train" if from_train else split
    for i, (_, doc) in enumerate(documents(corpus.files.get(source, ()), fields, counts)):
      if from_train and split_of(self._plan.cuts,
                                 holdout_rank(doc, fields.holdout_seed)) != split:
        continue
      yield i, doc


def build(corpus: Corpus, data_dir: str) -> None:
  """Checks and converts ``corpus`` into ``<data_dir>/tfx_files/<key>``."""
  logging.info("Converting a files corpus (key %s) into %s.", corpus.key,
               conversion_dir(corpus.key, data_dir))
  corpus_plan = plan(corpus)
  os.makedirs(conversion_dir(corpus.key, data_dir), exist_ok=True)
  files_lib.write_json(os.path.join(conversion_dir(corpus.key, data_dir), MANIFEST), {
      "key": corpus.key,
      "fields": dataclasses.asdict(corpus.fields),
      "files": {split: [dataclasses.asdict(f) for f in files]
                for split, files in corpus.files.items()},
      "held_out": list(corpus.held_out),
      "examples": corpus_plan.examples,
      "labels": corpus_plan.class_names(),
      "skipped_or_repaired": corpus_plan.counts,
  })
  builder = TfxFiles(corpus, corpus_plan, data_dir)
  builder.download_and_prepare(
      file_format="array_record",
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  repaired = {k: v for k, v in corpus_plan.counts.items() if v}
  logging.info("Converted files corpus %s: %s%s", corpus.key, corpus_plan.examples,
               f"; {repaired}" if repaired else "")


def manifest(key: str, data_dir: str) -> dict[str, Any] | None:
  """The ``corpus.json`` of conversion ``key`` (None when not there)."""
  try:
    with open(os.path.join(conversion_dir(key, data_dir), MANIFEST)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def describe_change(saved_key: str, corpus: Corpus, data_dir: str) -> str:
  """What differs between conversion ``saved_key`` and ``corpus``: the files
  added, removed or modified, or the fields; and how to read the old one."""
  old = manifest(saved_key, data_dir)
  changes = []
  if old is not None and not corpus.pinned:
    for split in SPLITS:
      before = {f["path"]: f for f in old.get("files", {}).get(split, [])}
      now = {f.path: f for f in corpus.files.get(split, ())}
      for path in sorted(now.keys() - before.keys()):
        changes.append(f"{split}: added {path}")
      for path in sorted(before.keys() - now.keys()):
        changes.append(f"{split}: removed {path}")
      for path in sorted(before.keys() & now.keys()):
        b, n = before[path], now[path]
        if (b["size"], b["mtime_ns"]) != (n.size, n.mtime_ns):
          changes.append(f"{split}: modified {path} ({b['size']} -> {n.size} bytes)")
    if old.get("fields") != dataclasses.asdict(corpus.fields):
      diffs = [f"data.{k}: {v!r} -> {getattr(corpus.fields, k)!r}"
               for k, v in old.get("fields", {}).items()
               if getattr(corpus.fields, k, v) != v]
      changes.extend(diffs or ["the fields that shape the corpus"])
  shown = "; ".join(changes[:10]) + (f"; and {len(changes) - 10} more" if
                                     len(changes) > 10 else "")
  where = (f"--config.data.name=files:{saved_key} reads the corpus as it was (its "
           f"conversion is still in {conversion_dir(saved_key, data_dir)})"
           if old is not None else
           f"its conversion is no longer in {data_dir}: restore the files as they were")
  return (f"the files corpus changed (key {saved_key} -> {corpus.key}"
          f"{': ' + shown if shown else ''}); {where}")
