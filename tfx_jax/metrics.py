"""TensorBoard logging without TensorFlow.

`MetricWriter` writes event files with tensorboardX; `read_scalars` /
`read_tags` read them back with tensorboard's event accumulator (which runs
without TensorFlow) for tests and reports.

Only the chief process (process 0) writes: on other processes every method is
a no-op, so the training loop can call the writer unconditionally.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterable, Mapping

import numpy as np

# Number of records of each kind loaded by the readers; 0 means all (the
# event accumulator's default keeps a random sample of 10,000 scalars).
_LOAD_EVERYTHING = {"scalars": 0, "tensors": 0}


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
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # flush_secs: keep event files fresh for a live TensorBoard. The file
      # name carries the second it was opened in; the nanosecond suffix keeps a
      # writer opened in the same second (a quick restart) from overwriting the
      # previous file, and keeps files in time order when sorted by name.
      self._writer = SummaryWriter(logdir=self.logdir, flush_secs=30,
                                   filename_suffix=f".{time.time_ns()}")

  def mark_restart(self, step: int) -> None:
    """Drops, in TensorBoard, what an interrupted run logged from ``step`` on.

    A run killed after its last checkpoint may have flushed points past it;
    the resumed run logs those steps again. A ``SessionLog.START`` event at
    ``step`` makes TensorBoard (and :func:`read_scalars`) discard the older
    points at steps >= ``step``, as TensorFlow's summary writers did.
    """
    if self._writer is None:
      return
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
    start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    self._writer.file_writer.add_event(event_pb2.Event(session_log=start), step=step)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one value per tag at `step`; values may be 0-d arrays."""
    if self._writer is None:
      return
    for tag, value in scalars.items():
      self._writer.add_scalar(tag, float(np.asarray(value)), global_step=step)

  def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
    """Writes text (rendered as markdown by TensorBoard) at `step`."""
    if self._writer is None:
      return
    for tag, text in texts.items():
      self._writer.add_text(tag, str(text), global_step=step)

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
                    metric_names: Iterable[str]) -> None:
    """Registers this run in TensorBoard's HParams dashboard.

    Args:
      hparams: flat dict of config values, e.g. {"model.d_model": 512}.
        Values other than bool / number / string are written as strings.
      metric_names: scalar tags (written with `write_scalars` to this same
        logdir) shown as metric columns, e.g. ["eval/loss", "eval/bleu"].

    Unlike tensorboardX's `add_hparams`, which writes a separate sub-run with
    its own copy of the metrics, the experiment and session-start summaries
    go into this run's own event file, so the dashboard reads the real
    metric curves of the run.
    """
    if self._writer is None:
      return
    from tensorboardX.summary import hparams as hparams_summaries  # pylint: disable=g-import-not-at-top
    values = {k: _hparam_value(v) for k, v in hparams.items()}
    experiment, session_start, _ = hparams_summaries(
        values, {name: 0.0 for name in metric_names})
    self._writer.file_writer.add_summary(experiment)
    self._writer.file_writer.add_summary(session_start)

  def flush(self) -> None:
    """Writes every event added so far to disk before returning.

    tensorboardX hands events to a background thread through a queue, and its
    own flush() does not wait for that queue: a ``kill -9`` right after it
    could lose the last points before a checkpoint. The thread is stopped
    (it writes the queue up to its stop marker first) and started again.
    """
    if self._writer is None:
      return
    events = getattr(self._writer.file_writer, "event_writer", None)
    worker = getattr(events, "_worker", None)
    if worker is not None and hasattr(worker, "stop"):
      worker.stop()
      events._worker = type(worker)(events._event_queue, events._ev_writer,  # pylint: disable=protected-access
                                    events._flush_secs)  # pylint: disable=protected-access
      events._worker.start()  # pylint: disable=protected-access
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _load(logdir: str | os.PathLike):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(
      os.fspath(logdir), size_guidance=_LOAD_EVERYTHING)
  accumulator.Reload()
  return accumulator


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
  """Returns {tag: [(step, value), ...]} for the event files in `logdir`.

  Only files directly in `logdir` are read (not subdirectories). When a run
  was resumed from an earlier step, points logged after that step by the
  interrupted run are dropped, as TensorBoard does.
  """
  accumulator = _load(logdir)
  return {
      tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
      for tag in accumulator.Tags()["scalars"]
  }


def _plugin_tags(accumulator, plugin: str) -> dict[str, bytes]:
  try:
    return accumulator.PluginTagToContent(plugin)
  except KeyError:  # nothing of that plugin was written
    return {}


# tensorboardX stores text under "<tag>/text_summary"; the readers strip it.
_TEXT_SUFFIX = "/text_summary"


def _text_tag(tag: str) -> str:
  return tag[:-len(_TEXT_SUFFIX)] if tag.endswith(_TEXT_SUFFIX) else tag


def read_texts(logdir: str | os.PathLike) -> dict[str, list[tuple[int, str]]]:
  """Returns {tag: [(step, text), ...]} of the text summaries in `logdir`."""
  accumulator = _load(logdir)
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
  content = _plugin_tags(_load(logdir), "hparams")
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


def read_tags(logdir: str | os.PathLike) -> dict[str, list[str]]:
  """Returns the tags in `logdir` by kind: "scalars", "texts", "hparams"."""
  accumulator = _load(logdir)
  return {
      "scalars": sorted(accumulator.Tags()["scalars"]),
      "texts": sorted(_text_tag(t) for t in _plugin_tags(accumulator, "text")),
      "hparams": sorted(_plugin_tags(accumulator, "hparams")),
  }
