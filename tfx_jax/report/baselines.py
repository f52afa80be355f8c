"""What each run's loss is judged against: ``schema.Baseline`` per run.

The unigram entropy of the training targets (the loss of the best model that
ignores context; a run not below it has stalled) comes from the prepared data
(``tfx_jax.data.baselines``, computed once per dataset, tokenizer and task and
kept with the data), counting the targets the run's task names
(``Task.targets``). The task's l0 (``Task.initial_loss``: ln |V|, or ln of
the number of classes for classification) is the loss of the uniform
prediction, which a freshly initialised model gives up to its small initial
logits: the report's loss at initialisation where a point's runs did not
evaluate at step 0 (runs made before ``eval.at_start``; otherwise the mean of
those evaluations, ``sections.selection.initial_loss``).
Runs whose workdir holds no config.json yet get an unknown baseline.
"""

from __future__ import annotations

import json
import pathlib

from tfx_jax.report.schema import Baseline
from tfx_jax.records.sweep import SweepRecord

UNKNOWN = Baseline(None, None)


def _run_config(workdir: pathlib.Path):
  from tfx_jax.run.config_base import base_config  # pylint: disable=import-outside-toplevel
  path = workdir / "config.json"
  if not path.exists():
    return None
  config = base_config()
  config.update(json.loads(path.read_text()))
  return config


def _key(config) -> tuple:
  d = config.data
  return (config.task, d.name, d.data_dir, d.tokenizer, d.vocab_size, d.tokenizer_file,
          d.text_key, d.source_key, d.target_key, d.label_key, d.train_files,
          d.validation_files, d.test_files, d.text_layout, d.holdout_fraction,
          d.holdout_seed,
          config.model.vocab_size, config.model.num_classes)


def baseline(config) -> Baseline:
  """The Baseline of one run config (reads the prepared data once per key): the
  unigram entropy of the targets its task names, and its task's l0."""
  from tfx_jax.data import baselines as data_baselines  # pylint: disable=import-outside-toplevel
  from tfx_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from tfx_jax import tasks  # pylint: disable=import-outside-toplevel
  task = tasks.get(config.task)
  tok = tokenizer_lib.tokenizer_from_config(config.data)
  entropy = data_baselines.unigram_entropy(config.data, tok, task.targets)
  return Baseline(unigram_entropy=entropy, initial_loss=task.initial_loss(config))


def of_runs(sweep_dir: pathlib.Path, record: SweepRecord) -> dict[str, Baseline]:
  """{run name: Baseline}, computed once per dataset, tokenizer and task."""
  cache: dict[tuple, Baseline] = {}
  out = {}
  for entry in record.runs:
    config = _run_config(pathlib.Path(sweep_dir) / entry.name)
    if config is None:
      out[entry.name] = UNKNOWN
      continue
    key = _key(config)
    if key not in cache:
      cache[key] = baseline(config)
    out[entry.name] = cache[key]
  return out
