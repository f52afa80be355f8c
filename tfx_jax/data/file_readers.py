"""Documents out of plain text, JSON Lines and Parquet files (``files_corpus``).

``read_documents(paths, features=..., text_layout=..., counts=...)`` yields
``(where, {feature: value})`` for every document of the files, in order; the
format of each file follows its extension (``FORMATS``):

* plain text (``.txt``, ``.text``): the whole file (``text_layout="file"``) or
  each blank-line separated block (``"paragraphs"``) is one ``text``; line
  breaks are kept, ``\\r\\n`` becomes ``\\n``, a byte-order mark is dropped;
* JSON Lines (``.jsonl``, ``.json``): one object per line (a ``.json`` file
  holding one array of objects is read too); ``features`` maps each feature to
  the field it is read from, a dotted name (``translation.en``) reading a
  nested field;
* Parquet (``.parquet``, as Hugging Face ``datasets`` writes with
  ``to_parquet``), read in batches with pyarrow; the same mapping names columns.

A record without a field or column is a ConfigError naming where it is
(``file:line``, ``file (row n)``) and the fields it has. Undecodable bytes are
replaced with U+FFFD and counted (``repairs``); documents with an empty text
and records with a null or negative label are skipped and counted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, get_args

import numpy as np

from tfx_jax.data import repairs
from tfx_jax.data.config import TextLayout
from tfx_jax.core.errors import ConfigError

# extension -> format
FORMATS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".json": "jsonl",
           ".parquet": "parquet"}
FORMAT_CHOICES = ".txt/.text (plain text), .jsonl/.json (JSON Lines), .parquet (Parquet)"
TEXT_LAYOUTS = get_args(TextLayout)
# The config field that names the field or column of each feature.
CONFIG_FIELD = {"text": "text_key", "source": "source_key", "target": "target_key",
                "label": "label_key"}
_PARQUET_BATCH = 1024

Document = tuple[str, dict[str, Any]]  # (where, {feature: value})


def extension(path: str) -> str:
  return os.path.splitext(path)[1].lower()


def format_of(path: str) -> str:
  """The format of ``path`` by its extension; ConfigError listing the choices."""
  if extension(path) not in FORMATS:
    raise ConfigError(f"{path} has an unknown format {extension(path) or '(none)'!r}; "
                      f"the format follows the extension: {FORMAT_CHOICES}.")
  return FORMATS[extension(path)]


def paragraphs(text: str) -> list[str]:
  """Blank-line separated blocks, trailing spaces dropped, line breaks kept."""
  blocks = []
  for block in re.split(r"\n[ \t]*\n", text):
    block = "\n".join(line.rstrip() for line in block.split("\n")).strip("\n")
    if block.strip():
      blocks.append(block)
  return blocks


def _text_documents(path: str, features: Mapping[str, str], text_layout: str,
                    counts: repairs.Counts) -> Iterator[Document]:
  del features  # A text file holds text only.
  with open(path, "rb") as f:
    text = repairs.decode_utf8(f.read(), counts, path)
  text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
  if text_layout == "file":
    yield path, {"text": text}
    return
  for i, block in enumerate(paragraphs(text)):
    yield f"{path} (paragraph {i + 1})", {"text": block}


def _lookup(record: Mapping[str, Any], key: str) -> tuple[bool, Any]:
  """(found, value) of ``key`` in a record; ``a.b`` reads a nested field."""
  if key in record:
    return True, record[key]
  value: Any = record
  for part in key.split("."):
    if not isinstance(value, Mapping) or part not in value:
      return False, None
    value = value[part]
  return True, value


def _fields_of_record(record: Mapping[str, Any], features: Mapping[str, str], where: str,
                      what: str, counts: repairs.Counts) -> dict[str, Any]:
  """{feature: value} of one JSON record or Parquet row (``what``: "field" or
  "column"); a missing key is a ConfigError naming the record's keys."""
  out = {}
  for feature, key in features.items():
    found, value = _lookup(record, key)
    if not found:
      raise ConfigError(
          f"{where} has no {what} {key!r} (data.{CONFIG_FIELD[feature]}); its {what}s: "
          f"{', '.join(map(str, record)) or '(none)'}.")
    if feature != "label":
      if isinstance(value, bytes):
        value = repairs.decode_utf8(value, counts, where)
      elif value is None:
        value = ""
      elif not isinstance(value, str):
        raise ConfigError(f"{where}: {what} {key!r} (data.{CONFIG_FIELD[feature]}) "
                          f"holds a {type(value).__name__}, not text.")
    out[feature] = value
  return out


def _json_documents(path: str, features: Mapping[str, str], text_layout: str,
                    counts: repairs.Counts) -> Iterator[Document]:
  del text_layout
  with open(path, "rb") as f:
    head = f.read(64).removeprefix(b"\xef\xbb\xbf").lstrip()
  if head.startswith(b"["):  # One JSON array of objects (to_json(lines=False)).
    with open(path, "rb") as f:
      text = repairs.decode_utf8(f.read(), counts, path).removeprefix("\ufeff")
    try:
      records = json.loads(text)
    except json.JSONDecodeError as e:
      raise ConfigError(f"{path}: not valid JSON ({e}).") from None
    for i, record in enumerate(records):
      where = f"{path} (record {i + 1})"
      if not isinstance(record, dict):
        raise ConfigError(f"{where} is a JSON {type(record).__name__}, not an object.")
      yield where, _fields_of_record(record, features, where, "field", counts)
    return
  with open(path, "rb") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        record = json.loads(repairs.decode_utf8(line, counts, where).removeprefix("\ufeff"))
      except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not a JSON object ({e.msg}); JSON Lines files "
                          "hold one object per line.") from None
      if not isinstance(record, dict):
        raise ConfigError(f"{where} is a JSON {type(record).__name__}, not an object; "
                          "JSON Lines files hold one object per line.")
      yield where, _fields_of_record(record, features, where, "field", counts)


def _parquet_documents(path: str, features: Mapping[str, str], text_layout: str,
                       counts: repairs.Counts) -> Iterator[Document]:
  del text_layout
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    table = pq.ParquetFile(path)
  except (pa.ArrowException, OSError) as e:
    raise ConfigError(f"{path}: not a readable Parquet file ({e}).") from None
  names = table.schema_arrow.names
  columns = []
  for feature, key in features.items():
    column = key if key in names else key.split(".")[0]  # a.b: a struct column
    if column not in names:
      raise ConfigError(f"{path} has no column {key!r} (data.{CONFIG_FIELD[feature]}); "
                        f"its columns: {', '.join(names)}.")
    if column not in columns:
      columns.append(column)
  row = 0
  for batch in table.iter_batches(batch_size=_PARQUET_BATCH, columns=columns):
    for record in batch.to_pylist():
      row += 1
      where = f"{path} (row {row})"
      yield where, _fields_of_record(record, features, where, "column", counts)


_READERS = {"text": _text_documents, "jsonl": _json_documents,
            "parquet": _parquet_documents}


def label_value(value: Any, where: str, key: str) -> int | str | None:
  """A label as a string or a non-negative integer; None: no label (null or
  negative, as Hugging Face datasets mark unlabelled test examples)."""
  if value is None:
    return None
  if isinstance(value, (bool, np.bool_)):
    return int(value)
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, (int, np.integer)):
    return None if value < 0 else int(value)
  if isinstance(value, str):
    return value
  raise ConfigError(f"{where}: label {key!r} (data.label_key) holds {value!r}, a "
                    f"{type(value).__name__}; labels are strings or integers.")


def read_documents(paths: Sequence[str], *, features: Mapping[str, str],
                   text_layout: str, counts: repairs.Counts) -> Iterator[Document]:
  """(where, {feature: value}) of every usable document of ``paths``, in order.

  ``features`` maps ``text`` (or ``source`` and ``target``) and optionally
  ``label`` to the JSON field / Parquet column each is read from. Documents
  with an empty text and records without a label are skipped and counted.
  """
  for path in paths:
    for where, doc in _READERS[format_of(path)](path, features, text_layout, counts):
      texts = [doc[k] for k in ("text", "source", "target") if k in doc]
      if not all(t.strip() for t in texts):
        counts.add("skipped (empty text)", where)
        continue
      if "label" in doc:
        label = label_value(doc["label"], where, features["label"])
        if label is None:
          counts.add("skipped (no label: null or negative)", where)
          continue
        doc["label"] = label
      yield where, doc
