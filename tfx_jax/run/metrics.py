"""TensorBoard logging without TensorFlow.

`MetricWriter` writes event files with tensorboard's own event-file writer
and summary protos; `read_scalars` / `read_tags` read them back with
tensorboard's event accumulator (which runs without TensorFlow) for tests and
reports. Nothing here imports TensorFlow or PyTorch.

Only the chief process (process 0) writes: on other processes every method is
a no-op, so the training loop can call the writer unconditionally.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

# The last evaluation of training, where it reads more than the others
# (eval.final_batches), logs beside its eval/* tags the same metrics over the
# subset the others read (its first batches): eval_subset/loss, ...
SUBSET_PREFIX = "eval_subset/"
SUBSET_LOSS = SUBSET_PREFIX + "loss"


def subset_tags(metrics: Mapping[str, float]) -> dict[str, float]:
  """eval/* metrics of the evaluations' subset under ``SUBSET_PREFIX``."""
  return {SUBSET_PREFIX + tag.removeprefix("eval/"): value for tag, value in metrics.items()}


# Number of records of each kind loaded by the readers; 0 means all (the
# event accumulator's default keeps a random sample of 10,000 scalars).
_LOAD_EVERYTHING = {"scalars": 0, "tensors": 0}
# The HParams dashboard's summary tags (tensorboard/plugins/hparams/metadata.py).
_EXPERIMENT_TAG = "_hparams_/experiment"
_SESSION_START_TAG = "_hparams_/session_start_info"


def _hparam_value(value: Any) -> bool | int | float | str:
  """HParams dashboard values must be bool, number or string."""
  if isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    return value.item()
  return str(value)  # None, tuples, lists: shown as text.


class MetricWriter:
  """Writes scalars, texts and hparams of one run to TensorBoard event files.

  Args:
    logdir: directory of the event files (created if missing).
    is_chief: whether this process writes (pass `jax.process_index() == 0`).
  """

  def __init__(self, logdir: str | os.PathLike, *, is_chief: bool = True):
    self.logdir = os.fspath(logdir)
    self._writer = None
    # Event files of an earlier attempt of this run (killed, then restarted).
    self.had_events = os.path.isdir(self.logdir) and any(
        name.startswith("events.out.tfevents") for name in os.listdir(self.logdir))
    if is_chief:
      from tensorboard.summary.writer import event_file_writer  # pylint: disable=g-import-not-at-top
      # flush_secs: keep event files fresh for a live TensorBoard. The file
      # name carries the second it was opened in; the nanosecond suffix keeps a
      # writer opened in the same second (a quick restart) from overwriting the
      # previous file, and keeps files in time order when sorted by name.
      self._writer = event_file_writer.EventFileWriter(
          self.logdir, flush_secs=30, filename_suffix=f".{time.time_ns()}")

  def _add(self, step: int, **event_fields) -> None:
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                           **event_fields))

  def _add_values(self, step: int, values: list) -> None:
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    self._add(step, summary=summary_pb2.Summary(value=values))

  def mark_restart(self, step: int) -> None:
    """Drops, in TensorBoard, what an interrupted run logged from ``step`` on.

    A run killed after its last checkpoint may have flushed points past it;
    the resumed run logs those steps again. A ``SessionLog.START`` event at
    ``step`` makes TensorBoard (and :func:`read_scalars`) discard the older
    points at steps >= ``step``, as TensorFlow's summary writers did.
    """
    if self._writer is None:
      return
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._add(step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one value per tag at `step`; values may be 0-d arrays."""
    if self._writer is None:
      return
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    self._add_values(step, [summary_pb2.Summary.Value(tag=tag,
                                                      simple_value=float(np.asarray(v)))
                            for tag, v in scalars.items()])

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Writes text (rendered as markdown by TensorBoard) at `step`."""
    if self._writer is None:
      return
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2  # pylint: disable=g-import-not-at-top
    text_plugin = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    values = []
    for tag, text in texts.items():
      tensor = tensor_pb2.TensorProto(
          dtype=types_pb2.DT_STRING, string_val=[str(text).encode("utf-8")],
          tensor_shape=tensor_shape_pb2.TensorShapeProto(
              dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
      values.append(summary_pb2.Summary.Value(tag=tag, metadata=text_plugin, tensor=tensor))
    self._add_values(step, values)

  def write_config_text(self, config: Any, tag: str = "config") -> None:
    """Writes the full run config as a text summary at step 0.

    Accepts a ConfigDict (written as its YAML-like `str`) or any mapping
    (written as indented JSON); shown as a code block so indentation survives
    the markdown rendering.
    """
    if hasattr(config, "to_dict") or not isinstance(config, Mapping):
      text = str(config)
    else:
      text = json.dumps(dict(config), indent=2, sort_keys=True, default=str)
    block = "\n".join("    " + line for line in text.splitlines())
    self.write_texts(0, {tag: block})

  def write_hparams(self, hparams: Mapping[str, Any],
                    metric_names: Iterable[str], first: Sequence[str] = ()) -> None:
    """Registers this run in TensorBoard's HParams dashboard.

    Args:
      hparams: flat dict of config values, e.g. {"model.d_model": 512}.
        Values other than bool / number / string are written as strings.
      metric_names: scalar tags (written with `write_scalars` to this same
        logdir) shown as metric columns, e.g. ["eval/loss", "eval/bleu"].
      first: the fields of ``hparams`` a sweep compares (its axes' and tuned
        fields, the seed), registered before the others and marked as
        differing between runs, so that they are the dashboard's first
        columns among the ~100 fields of a config (TensorBoard keeps the
        registered order, or, since 2.15, sorts the differing ones first).

    The experiment and session-start summaries go into this run's own event
    file (not a separate sub-run with its own copy of the metrics), so the
    dashboard reads the real metric curves of the run.
    """
    if self._writer is None:
      return
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    # pylint: enable=g-import-not-at-top
    start = plugin_data_pb2.SessionStartInfo()
    infos = []
    leading = [name for name in first if name in hparams]
    order = list(dict.fromkeys([*leading, *hparams]))
    for name in order:
      value = _hparam_value(hparams[name])
      if isinstance(value, bool):
        start.hparams[name].bool_value, kind = value, api_pb2.DATA_TYPE_BOOL
      elif isinstance(value, (int, float)):
        start.hparams[name].number_value, kind = float(value), api_pb2.DATA_TYPE_FLOAT64
      else:
        start.hparams[name].string_value, kind = value, api_pb2.DATA_TYPE_STRING
      infos.append(api_pb2.HParamInfo(name=name, type=kind, differs=name in leading))
    experiment = api_pb2.Experiment(
        hparam_infos=infos,
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m))
                      for m in metric_names])

    def value(tag, data):
      metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
          plugin_name="hparams", content=data.SerializeToString()))
      return summary_pb2.Summary.Value(tag=tag, metadata=metadata)

    self._add_values(0, [
        value(_EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
        value(_SESSION_START_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
    ])

  def flush(self) -> None:
    """Writes every event added so far to disk before returning (the writer's
    queue is drained, then the file flushed): nothing logged before a
    checkpoint is lost to a ``kill -9`` after it."""
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def load_events(logdir: str | os.PathLike):
  """TensorBoard's EventAccumulator over the event files in ``logdir``, read.

  A run resumed from a checkpoint logs its restart step again; the reader
  then drops what the interrupted attempt logged after it (as TensorBoard
  does) and warns of "a TensorFlow restart". That is the expected course of
  a resumed run, so its warning is kept off the console.
  """
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(
      os.fspath(logdir), size_guidance=_LOAD_EVERYTHING)
  logger = logging.getLogger("tensorboard")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    accumulator.Reload()
  finally:
    logger.setLevel(level)
  return accumulator


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
  """Returns {tag: [(step, value), ...]} for the event files in `logdir`.

  Only files directly in `logdir` are read (not subdirectories). When a run
  was resumed from an earlier step, points logged after that step by the
  interrupted run are dropped, as TensorBoard does.
  """
  accumulator = load_events(logdir)
  return {
      tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
      for tag in accumulator.Tags()["scalars"]
  }


def _plugin_tags(accumulator, plugin: str) -> dict[str, bytes]:
  try:
    return accumulator.PluginTagToContent(plugin)
  except KeyError:  # nothing of that plugin was written
    return {}


# Event files written before this writer (with tensorboardX) store text under
# "<tag>/text_summary"; the readers strip it.
_TEXT_SUFFIX = "/text_summary"


def _text_tag(tag: str) -> str:
  return tag[:-len(_TEXT_SUFFIX)] if tag.endswith(_TEXT_SUFFIX) else tag


def read_texts(logdir: str | os.PathLike) -> dict[str, list[tuple[int, str]]]:
  """Returns {tag: [(step, text), ...]} of the text summaries in `logdir`."""
  accumulator = load_events(logdir)
  return {
      _text_tag(tag): [(e.step, e.tensor_proto.string_val[0].decode("utf-8"))
                       for e in accumulator.Tensors(tag)]
      for tag in _plugin_tags(accumulator, "text")
  }


def read_hparams(logdir: str | os.PathLike) -> tuple[dict[str, Any], list[str]]:
  """Returns (hparams, metric_names) registered by `write_hparams`.

  Numbers come back as floats (the dashboard stores them as float64).
  """
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  content = _plugin_tags(load_events(logdir), "hparams")
  hparams, metric_names = {}, []
  if "_hparams_/session_start_info" in content:
    data = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"])
    hparams = {k: json_format.MessageToDict(v)
               for k, v in data.session_start_info.hparams.items()}
  if "_hparams_/experiment" in content:
    data = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"])
    metric_names = [m.name.tag for m in data.experiment.metric_infos]
  return hparams, metric_names


def read_hparam_columns(logdir: str | os.PathLike) -> list[tuple[str, bool]]:
  """The HParams dashboard's hyperparameter columns registered by
  `write_hparams`, in registered order: [(name, differs), ...]."""
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  content = _plugin_tags(load_events(logdir), "hparams")
  if _EXPERIMENT_TAG not in content:
    return []
  data = plugin_data_pb2.HParamsPluginData.FromString(content[_EXPERIMENT_TAG])
  return [(info.name, info.differs) for info in data.experiment.hparam_infos]


def read_tags(logdir: str | os.PathLike) -> dict[str, list[str]]:
  """Returns the tags in `logdir` by kind: "scalars", "texts", "hparams"."""
  accumulator = load_events(logdir)
  return {
      "scalars": sorted(accumulator.Tags()["scalars"]),
      "texts": sorted(_text_tag(t) for t in _plugin_tags(accumulator, "text")),
      "hparams": sorted(_plugin_tags(accumulator, "hparams")),
  }
