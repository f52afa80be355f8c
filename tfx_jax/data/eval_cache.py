"""Evaluation data prepared once: an evaluation pass's batches kept on disk.

Every run of a sweep evaluates on the same rows: the same split, read with
the same tokenizer, packed into the same rows and batched in the same order
(``run_setup.EVAL_SEED``). Preparing them (reading the split, tokenizing,
packing) is the same work in every run and at every evaluation, so the first
pass stores its batches and every later one reads them back:

  <data_dir>/tfx_eval_cache/<key>/key.json        what the key was made of
  <data_dir>/tfx_eval_cache/<key>/000000.npz ...  the batches, in order
  <data_dir>/tfx_eval_cache/<key>/end.json        the pass ended: its batch count

``<data_dir>`` is the run's prepared data (``data.data_dir``, else TFDS's
default); ``TFX_JAX_EVAL_CACHE`` names another directory, and an empty value
turns the cache off.

The key is a hash of everything that shapes the rows: every field of the
resolved data config (so a field added to ``DataConfig`` is covered without
editing this module), the dataset's version (``sources.data_version``), the
tokenizer's identity (its model file's content), the split, and every
argument of the pipeline that made them (row length, batch size, seed,
shard, the task's row format), plus the source of the modules that turn
examples into rows (this package's and the task's row builders) and the
version of grain. A change of any of them is
another key, so a stale cache is never read; an old key's directory is just
left unused.

A pass that stops early (``eval.num_batches``) stores the batches it read;
a later pass reads those and prepares the rest, storing them too. Batch
files are written whole (a temporary file renamed), so several processes may
prepare the same key at once and a killed writer leaves no partial file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from tfx_jax.data import sources

ENV = "TFX_JAX_EVAL_CACHE"
DIRNAME = "tfx_eval_cache"
# Bumped when the files' layout changes.
FORMAT = 1


def root(data_cfg: Any) -> pathlib.Path | None:
  """The cache's directory for a data config (None: the cache is off)."""
  chosen = os.environ.get(ENV)
  if chosen is not None:
    return pathlib.Path(chosen) if chosen else None
  data_dir = getattr(data_cfg, "data_dir", None) or None
  return pathlib.Path(sources.resolve_data_dir(data_dir)) / DIRNAME


def config_fields(data_cfg: Any) -> dict[str, Any]:
  """Every field of a data config (a ``DataConfig`` or a ConfigDict), by name."""
  if dataclasses.is_dataclass(data_cfg):
    return dataclasses.asdict(data_cfg)
  if hasattr(data_cfg, "to_dict"):
    return dict(data_cfg.to_dict())
  return {k: v for k, v in vars(data_cfg).items() if not k.startswith("_")}


@functools.lru_cache(maxsize=None)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # in the cache key only: a rewritten file is hashed again
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def file_digest(path: str | os.PathLike) -> str:
  stat = os.stat(path)
  return _file_digest(os.fspath(path), stat.st_size, stat.st_mtime_ns)


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
  """What makes a tokenizer's ids: its kind and its model file's content."""
  identity: dict[str, Any] = {"kind": type(tokenizer).__name__,
                              "vocab_size": int(tokenizer.vocab_size)}
  path = getattr(tokenizer, "model_path", None)
  if path:
    identity["model_sha256"] = file_digest(path)
    special = pathlib.Path(path).parent / "special_ids.json"
    if special.exists():  # an imported tokenizer's ids (tokenizer.HFTokenizer)
      identity["special_ids_sha256"] = file_digest(special)
  return identity


def code_identity(*functions: Callable) -> dict[str, str]:
  """The source files of ``functions`` (a task's row builders) and of this
  package (reading, tokenizing, packing), hashed: a change of how examples
  become rows is a new key."""
  package = pathlib.Path(__file__).parent
  modules = {*map(str, package.glob("*.py")),
             *(inspect.getsourcefile(inspect.unwrap(f)) for f in functions)}
  out = {os.path.relpath(m, package.parent): file_digest(m)
         for m in sorted(m for m in modules if m)}
  out["grain"] = importlib.metadata.version("grain")
  return out


def make_key(data_cfg: Any, tokenizer: Any, split: str, **settings: Any) -> dict[str, Any]:
  """The content of a cache key: see the module docstring. ``settings`` are
  the pipeline's arguments that shape the rows, JSON-able."""
  return {"format": FORMAT, "data": config_fields(data_cfg),
          "data.version": sources.data_version(data_cfg), "split": split,
          "tokenizer": tokenizer_identity(tokenizer), **settings}


def key_dir(base: pathlib.Path, key: Mapping[str, Any]) -> pathlib.Path:
  text = json.dumps(key, sort_keys=True, default=str)
  return base / hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomic(path: pathlib.Path, write: Callable[[Any], None]) -> None:
  """``write(file)`` to a temporary file beside ``path``, then renamed onto it."""
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def _savable(batch: Any) -> bool:
  return isinstance(batch, Mapping) and all(isinstance(v, np.ndarray) for v in batch.values())


class CachedPass:
  """One pass over an evaluation split's batches, read from the cache where it
  has them and prepared by ``live`` (a lazy iterable: nothing is read until it
  is iterated) where not, those stored for the next pass."""

  def __init__(self, live: Iterable[Mapping[str, np.ndarray]], directory: pathlib.Path,
               key: Mapping[str, Any]):
    self.live, self.directory, self.key = live, directory, key

  def _path(self, i: int) -> pathlib.Path:
    return self.directory / f"{i:06d}.npz"

  def _end(self) -> int | None:
    try:
      return int(json.loads((self.directory / "end.json").read_text())["batches"])
    except (FileNotFoundError, ValueError, KeyError):
      return None

  def _load(self, i: int) -> dict[str, np.ndarray] | None:
    try:
      with np.load(self._path(i)) as data:
        return {k: data[k] for k in data.files}
    except (FileNotFoundError, ValueError, OSError):
      return None

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    end = self._end()
    n = 0
    while end is None or n < end:
      batch = self._load(n)
      if batch is None:
        break
      yield batch
      n += 1
    if end is not None and n == end:
      return
    yield from self._prepare(skip=n)

  def _prepare(self, skip: int) -> Iterator[dict[str, np.ndarray]]:
    """The live pass from batch ``skip`` on (the ones before it are prepared
    again, not stored again), each batch stored as it is read."""
    self.directory.mkdir(parents=True, exist_ok=True)
    key_file = self.directory / "key.json"
    if not key_file.exists():
      _write_atomic(key_file, lambda f: f.write(
          json.dumps(self.key, indent=1, sort_keys=True, default=str).encode()))
    count = 0
    for i, batch in enumerate(self.live):
      count = i + 1
      if i < skip:
        continue
      if not _savable(batch):  # not arrays: serve it, keep nothing
        yield batch
        continue
      _write_atomic(self._path(i), lambda f, b=batch: np.savez(f, **b))
      yield batch
    _write_atomic(self.directory / "end.json",
                  lambda f: f.write(json.dumps({"batches": count}).encode()))


def cached_pass(live: Iterable, data_cfg: Any, tokenizer: Any, split: str,
                **settings: Any) -> Iterable:
  """``live`` (one pass over ``split``'s batches) read through the cache, or
  ``live`` itself where the cache is off."""
  base = root(data_cfg)
  if base is None:
    return live
  key = make_key(data_cfg, tokenizer, split, **settings)
  return CachedPass(live, key_dir(base, key), key)


# make_dataset's arguments that are not settings of the rows' values: read by
# their identity (the data config, the tokenizer, the row format) or not
# shaping the rows at all (read threads).
_IDENTIFIED = ("data_cfg", "tokenizer", "rows", "source", "read_threads")


def pipeline_pass(ds: Iterable, arguments: Mapping[str, Any]) -> Iterable:
  """``pipeline.make_dataset``'s one pass over a split (``num_epochs=1``: an
  evaluation), read through the cache; ``arguments`` is the call as made.
  Every argument is in the key, so one added to the pipeline is covered;
  in-memory sources (``source=``) are not cached."""
  if arguments.get("source") is not None:
    return ds
  rows = arguments["rows"]
  functions = [f for f in (rows.build, getattr(rows, "window", None)) if f is not None]
  settings = {k: v for k, v in arguments.items() if k not in _IDENTIFIED}
  return cached_pass(ds, arguments["data_cfg"], arguments["tokenizer"],
                     str(arguments["split"]),
                     rows={"name": rows.name, "packed": rows.packed,
                           "code": code_identity(*functions)},
                     **{k: v for k, v in settings.items() if k != "split"})

