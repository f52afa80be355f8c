"""Checkpoints of a run: train state, data-iterator state and config.

`Checkpointer` wraps an orbax `CheckpointManager` whose step directories hold
three items:

  <directory>/<step>/state    PyTree of arrays (step, params, opt_state, rng)
  <directory>/<step>/data     JSON: the input pipeline's iterator state
  <directory>/<step>/config   JSON: the flattened run config

Guarantees:
- Atomic: orbax writes into `<step>.orbax-checkpoint-tmp-*` and renames the
  directory only once every item is complete, so a save killed half-way
  leaves a tmp directory that is never listed as a step (and is removed the
  next time a `Checkpointer` opens the directory).
- Resumable past damage: `restore()` of the latest step falls back to the
  previous step, with a warning saying which, when a checkpoint cannot be
  read (files deleted or truncated).
- No shape-mismatch tracebacks: the saved array shapes are compared with the
  restore target first and every difference is reported in one ConfigError;
  `check_compatible` does the same for config fields.

`save` must be called on every process: orbax coordinates multi-host writes
(the JSON items are written by the primary process only).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shutil
import tempfile
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from absl import logging
import jax
import orbax.checkpoint as ocp

from tfx_jax.core.errors import ConfigError


def ensure_writable(workdir: str | os.PathLike) -> pathlib.Path:
  """Creates `workdir` if needed and checks a file can be written in it.

  Raises ConfigError (naming the directory and the OS error) otherwise; call
  it before any other work so a bad --workdir fails immediately.
  """
  path = pathlib.Path(workdir).expanduser().absolute()
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".write_test_"):
      pass
  except OSError as e:
    raise ConfigError(
        f"workdir {str(path)!r} is not writable: {e.strerror or e}") from e
  return path


def _json_value(value: Any) -> Any:
  """Round-trips `value` through JSON (tuples become lists, others str)."""
  return json.loads(json.dumps(value, default=str))


def _encode_data_state(data_state: Any) -> dict[str, Any]:
  # Grain's DataLoader iterators return their state as JSON bytes, dataset
  # iterators as dicts; both are stored losslessly in a JSON item.
  if data_state is None:
    return {"kind": "none"}
  if isinstance(data_state, bytes):
    return {"kind": "bytes",
            "value": base64.b64encode(data_state).decode("ascii")}
  return {"kind": "json", "value": data_state}


def _decode_data_state(stored: Mapping[str, Any]) -> Any:
  if stored["kind"] == "none":
    return None
  if stored["kind"] == "bytes":
    return base64.b64decode(stored["value"])
  return stored["value"]


def _matches(field: str, prefixes: Iterable[str]) -> bool:
  for prefix in prefixes:
    prefix = prefix.rstrip(".")
    if field == prefix or field.startswith(prefix + "."):
      return True
  return False


def check_compatible(saved_config: Mapping[str, Any],
                     new_config: Mapping[str, Any],
                     fields: Iterable[str],
                     lead: str = "the checkpoint was written with a different config "
                                 "and cannot be resumed",
                     hint: str = "use a new workdir, or set them back") -> None:
  """Raises ConfigError if a checkpoint cannot be resumed under a new config.

  Args:
    saved_config: flattened config stored with the checkpoint
      ({"model.d_model": 512, ...}).
    new_config: flattened config of the run that wants to resume.
    fields: dotted keys or prefixes whose values must match, e.g.
      ["model", "data.name", "data.tokenizer", "data.vocab_size"]; "model"
      covers every "model.*" key.

  The error, after ``lead`` (what cannot be done) and ``hint`` (what to do
  instead), lists every differing
  field as `saved -> new`; a field present on one side only shows `<absent>`
  on the other.
  """
  fields = list(fields)
  saved = {k: _json_value(v) for k, v in saved_config.items()
           if _matches(k, fields)}
  new = {k: _json_value(v) for k, v in new_config.items()
         if _matches(k, fields)}
  absent = "<absent>"
  diffs = [
      f"  {key}: saved {saved.get(key, absent)!r} -> new {new.get(key, absent)!r}"
      for key in sorted(saved.keys() | new.keys())
      if saved.get(key, absent) != new.get(key, absent)
  ]
  if diffs:
    raise ConfigError(
        f"{lead}; these fields must match ({hint}):\n" + "\n".join(diffs))


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  shapes = {}
  for path, leaf in leaves:
    shape = tuple(leaf.shape)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      # Typed PRNG keys are stored as their raw uint32 key data.
      shape = jax.eval_shape(jax.random.key_data, leaf).shape
    shapes[".".join(_key_name(k) for k in path)] = shape
  return shapes


def _check_shapes(saved_metadata: Any, abstract_state: Any) -> None:
  saved = _shapes_by_path(saved_metadata)
  new = _shapes_by_path(abstract_state)
  absent = "<absent>"
  diffs = [
      f"  {path}: saved {saved.get(path, absent)} -> new {new.get(path, absent)}"
      for path in sorted(saved.keys() | new.keys())
      if saved.get(path) != new.get(path)
  ]
  if diffs:
    shown = diffs[:20] + ([f"  ... and {len(diffs) - 20} more"]
                          if len(diffs) > 20 else [])
    raise ConfigError(
        "the checkpoint's arrays do not match the model being restored "
        "(was the model config changed?):\n" + "\n".join(shown))


class Restored(NamedTuple):
  state: Any        # the restored PyTree, structured like the target
  data_state: Any   # as passed to save(): dict, bytes or None
  config: dict[str, Any]  # flattened config saved with the checkpoint


def damage_text(error: BaseException, step_dir: pathlib.Path) -> str:
  """What is wrong with a step's checkpoint, in one short line: the error's
  kind and the file it names under ``step_dir`` (the deepest one), e.g.
  ``ValueError NOT_FOUND reading 3/state/d/44a34f10``.

  TensorStore's errors run to thousands of characters (every driver's spec,
  escaped) and orbax's over several lines; the whole error is logged at INFO.
  """
  texts, cause = [], error
  while cause is not None and len(texts) < 5:  # the chain orbax raises from
    texts.append(str(cause))
    cause = cause.__cause__ or cause.__context__
  under = re.escape(str(step_dir)) + r"(?=$|[/\s\"'\\\]])(?:/[^\s\"'\\\[\],;:]*)?"
  named = [m.rstrip("/") for m in re.findall(under, "\n".join(texts))]
  lines = str(error).strip().splitlines()
  first = lines[0].strip() if lines else ""
  code = re.match(r"([A-Z][A-Z_]+): ", first)  # absl/TensorStore status codes
  what = code.group(1) if code else (first[:117] + "..." if len(first) > 120 else first)
  text = f"{type(error).__name__} {what}".strip()
  if named:
    text += f" reading {os.path.relpath(max(named, key=len), step_dir.parent)}"
  return text


class Checkpointer:
  """Saves and restores (state, data_state, config) per step with orbax.

  Args:
    directory: checkpoint directory (created; ConfigError if not writable).
    max_to_keep: number of most recent checkpoints kept on disk.
    save_interval_steps: `save(step, ...)` writes only when step is a
      multiple of this (or with force=True).
    keep_steps: steps whose checkpoints are kept whatever `max_to_keep` says
      (orbax's `CustomSteps` preservation beside `LatestN`): a trunk's branch
      points. Saving them is the caller's (`save` of those steps).
    read_only: another run's checkpoints, read and never written: nothing is
      created, saved, deleted, cleaned up or set aside (a run branching from
      them, or fine-tuning from them, while that run may still be writing).
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
               save_interval_steps: int = 1, keep_steps: Iterable[int] = (),
               read_only: bool = False):
    if max_to_keep < 1:
      raise ConfigError(f"checkpoint max_to_keep={max_to_keep} must be >= 1")
    if save_interval_steps < 1:
      raise ConfigError(
          f"checkpoint save_interval_steps={save_interval_steps} must be >= 1")
    self.read_only = read_only
    policies = ocp.checkpoint_managers
    if read_only:
      self.directory = pathlib.Path(directory).expanduser().absolute()
      if not self.directory.is_dir():
        raise ConfigError(f"no checkpoint directory {str(self.directory)!r}")
      options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0,
                                             create=False)
    else:
      self.directory = ensure_writable(directory)
      latest = policies.LatestN(max_to_keep)
      options = ocp.CheckpointManagerOptions(
          save_decision_policy=policies.FixedIntervalPolicy(save_interval_steps),
          preservation_policy=(policies.AnyPreservationPolicy(
              [latest, policies.CustomSteps(list(keep_steps))]) if keep_steps else latest),
          cleanup_tmp_directories=True,
          enable_async_checkpointing=True,
      )
    # Handlers are registered up front so that a fresh manager can read
    # metadata and single items (config) of checkpoints it did not write.
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    state_handler = ocp.handlers.StandardCheckpointHandler()
    registry.add("state", ocp.args.StandardSave, state_handler)
    registry.add("state", ocp.args.StandardRestore, state_handler)
    for item in ("data", "config"):
      json_handler = ocp.handlers.JsonCheckpointHandler()
      registry.add(item, ocp.args.JsonSave, json_handler)
      registry.add(item, ocp.args.JsonRestore, json_handler)
    # Orbax warns on every read-only open that it is read-only, as asked.
    asked = lambda record: not str(record.msg).startswith("Given directory is read only")
    logger = logging.get_absl_logger()
    logger.addFilter(asked)
    try:
      self._manager = ocp.CheckpointManager(
          self.directory, options=options, handler_registry=registry)
    finally:
      logger.removeFilter(asked)

  def save(self, step: int, state: Any, data_state: Any,
           config: Mapping[str, Any], force: bool = False) -> bool:
    """Starts writing a checkpoint of `step` in the background.

    Args:
      step: training step (the step directory's name).
      state: PyTree of jax arrays (typed PRNG keys included).
      data_state: iterator state: a JSON-able dict, bytes, or None.
      config: flattened run config (JSON-able values; tuples come back as
        lists).
      force: save even if `step` is not on the save interval.

    Returns:
      Whether a save was started (False off-interval or if `step` exists).
    Call `wait()` before reading the files or exiting.
    """
    if step in self._manager.all_steps():
      return False
    return self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(_encode_data_state(data_state)),
            config=ocp.args.JsonSave(
                {k: _json_value(v) for k, v in config.items()})),
        force=force)

  def wait(self) -> None:
    """Blocks until background saves (and old-step deletion) are done."""
    self._manager.wait_until_finished()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def _candidates(self, step: int | None) -> list[int]:
    self._manager.reload()
    if step is not None:
      if step not in self._manager.all_steps():
        raise ConfigError(
            f"no checkpoint for step {step} in {str(self.directory)!r}; "
            f"available steps: {self.all_steps()}")
      return [step]
    return sorted(self._manager.all_steps(), reverse=True)

  def _with_fallback(self, step: int | None, read: Callable[[int], Any]):
    """Runs `read(step)` on `step`, or on the newest readable checkpoint."""
    candidates = self._candidates(step)
    if not candidates:
      raise ConfigError(f"no checkpoint in {str(self.directory)!r}")
    errors = []
    for i, candidate in enumerate(candidates):
      try:
        result = read(candidate)
      except ConfigError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        # Any failure to read a listed step means a damaged checkpoint.
        reason = damage_text(e, self.directory / str(candidate))
        errors.append(f"step {candidate}: {reason}")
        following = candidates[i + 1] if i + 1 < len(candidates) else None
        moved = self._set_aside(candidate) if step is None else None
        logging.info("checkpoint at step %d: the full error: %s", candidate, e)
        logging.warning(
            "checkpoint at step %d in %s is unreadable (%s); %s%s",
            candidate, self.directory, reason,
            f"moved it to {moved}; " if moved else "",
            f"falling back to step {following}" if following is not None
            else "no older checkpoint left")
        continue
      if errors:
        logging.warning("restored step %d instead of step %d", candidate,
                        candidates[0])
      return candidate, result
    raise ConfigError(
        f"no readable checkpoint in {str(self.directory)!r}:\n  " +
        "\n  ".join(errors))

  def _set_aside(self, step: int) -> str | None:
    """Renames a damaged step directory to ``<step>.damaged`` (kept for inspection).

    Otherwise the damaged step would stay the "latest" one: a later save of
    that step would be skipped, and every restart would fall back again.
    """
    if jax.process_index() != 0 or self.read_only:
      return None
    src = self.directory / str(step)
    dst = self.directory / f"{step}.damaged"
    try:
      if dst.exists():
        shutil.rmtree(dst)
      os.replace(src, dst)
    except OSError:
      return None
    self._manager.reload()
    return str(dst)

  def read_latest_config(self) -> tuple[int, dict[str, Any]]:
    """(step, flattened config) of the newest readable checkpoint."""

    def read(s):
      return dict(self._manager.restore(
          s, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config)

    return self._with_fallback(None, read)

  def read_config(self, step: int | None = None) -> dict[str, Any]:
    """Returns the flattened config saved with `step` (default: latest).

    Use it to rebuild the model of a finished run (evaluation, generation)
    before its arrays can be restored.
    """

    def read(s):
      return dict(self._manager.restore(
          s, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config)

    return self._with_fallback(step, read)[1]

  def restore(
      self,
      step: int | None = None,
      abstract_state: Any = None,
      *,
      check_config: Callable[[dict[str, Any]], None] | None = None,
  ) -> Restored:
    """Restores (state, data_state, config) of `step`, default the latest.

    Args:
      step: step to restore; None means the latest readable one: a damaged
        latest checkpoint is skipped with a warning for the one before it.
        An explicit step never falls back.
      abstract_state: restore target: a PyTree of `jax.ShapeDtypeStruct`
        with `.sharding` (e.g. from `jax.eval_shape` plus the state's
        shardings); arrays come back with those shardings and structure.
        Saved shapes are checked against it first. None restores the arrays
        as saved (single-process use only).
      check_config: called with the saved flattened config before any array
        is read, e.g. `lambda saved: check_compatible(saved, new, fields)`;
        the ConfigError it raises propagates.

    Raises:
      ConfigError: no checkpoint, no readable checkpoint, incompatible config
        or array shapes.
    """

    def read(s):
      if check_config is not None:
        check_config(dict(self._manager.restore(
            s, args=ocp.args.Composite(config=ocp.args.JsonRestore())).config))
      if abstract_state is None:
        state_args = ocp.args.StandardRestore()
      else:
        metadata = self._manager.item_metadata(s)["state"]
        if metadata is None:
          raise FileNotFoundError(f"metadata of the state item of step {s}")
        _check_shapes(metadata.tree, abstract_state)
        state_args = ocp.args.StandardRestore(abstract_state)
      return self._manager.restore(
          s, args=ocp.args.Composite(
              state=state_args, data=ocp.args.JsonRestore(),
              config=ocp.args.JsonRestore()))

    step, restored = self._with_fallback(step, read)
    logging.info("restored checkpoint of step %d from %s", step,
                 self.directory)
    return Restored(state=restored.state,
                    data_state=_decode_data_state(restored.data),
                    config=dict(restored.config))

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
