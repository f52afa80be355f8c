"""Event files written by MetricWriter read back without TensorFlow."""

import ml_collections
import numpy as np
import pytest

from tfx_jax.run import metrics


def test_scalars_and_texts_round_trip(tmp_path):
  with metrics.MetricWriter(tmp_path) as writer:
    writer.write_scalars(1, {"train/loss": 2.5, "train/lr": np.float32(1e-3)})
    writer.write_scalars(2, {"train/loss": np.array(2.0)})
    writer.write_scalars(2, {"eval/loss": 3.25})
    writer.write_texts(2, {"samples": "to be *or* not"})

  scalars = metrics.read_scalars(tmp_path)
  assert scalars["train/loss"] == [(1, 2.5), (2, 2.0)]
  assert scalars["eval/loss"] == [(2, 3.25)]
  assert scalars["train/lr"] == [(1, pytest.approx(1e-3))]
  assert metrics.read_texts(tmp_path) == {"samples": [(2, "to be *or* not")]}
  tags = metrics.read_tags(tmp_path)
  assert tags["scalars"] == ["eval/loss", "train/loss", "train/lr"]
  assert tags["texts"] == ["samples"]
  assert tags["hparams"] == []


def test_hparams_are_registered_for_the_dashboard(tmp_path):
  with metrics.MetricWriter(tmp_path) as writer:
    writer.write_hparams(
        {"model.d_model": 64, "model.norm_type": "rms", "optim.lr": 1e-3,
         "model.tie": True, "data.shape": (2, 3), "model.dropout": None},
        ["eval/loss", "eval/bleu"])
    writer.write_scalars(10, {"eval/loss": 1.5})

  tags = metrics.read_tags(tmp_path)
  assert tags["hparams"] == ["_hparams_/experiment",
                             "_hparams_/session_start_info"]
  hparams, metric_names = metrics.read_hparams(tmp_path)
  assert hparams == {"model.d_model": 64.0, "model.norm_type": "rms",
                     "optim.lr": 1e-3, "model.tie": True,
                     "data.shape": "(2, 3)", "model.dropout": "None"}
  assert metric_names == ["eval/loss", "eval/bleu"]
  # The metric columns read the run's own curves (no hidden sub-run).
  assert metrics.read_scalars(tmp_path) == {"eval/loss": [(10, 1.5)]}
  assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []


def test_config_text_is_written(tmp_path):
  config = ml_collections.ConfigDict({"model": {"d_model": 64}, "seed": 0})
  with metrics.MetricWriter(tmp_path) as writer:
    writer.write_config_text(config)
  (step, text), = metrics.read_texts(tmp_path)["config"]
  assert step == 0
  assert "d_model: 64" in text and "seed: 0" in text


def test_non_chief_writes_nothing(tmp_path):
  writer = metrics.MetricWriter(tmp_path / "logs", is_chief=False)
  writer.write_scalars(1, {"loss": 1.0})
  writer.write_hparams({"a": 1}, ["loss"])
  writer.flush()
  writer.close()
  assert not (tmp_path / "logs").exists()



def test_a_resumed_run_reads_as_one_run_without_a_restart_warning(tmp_path, caplog):
  """An attempt killed after its checkpoint at step 2 logged up to step 4; the
  resumed attempt marks its restart and logs 3 again: the killed attempt's
  steps after 2 are dropped, and the reader's "TensorFlow restart" warning,
  the expected course of a resume, stays off the console."""
  with metrics.MetricWriter(tmp_path) as writer:
    for step in range(1, 5):
      writer.write_scalars(step, {"train/loss": float(10 - step)})
  with metrics.MetricWriter(tmp_path) as writer:
    writer.mark_restart(3)
    writer.write_scalars(3, {"train/loss": 0.5})
  with caplog.at_level("WARNING"):
    assert metrics.read_scalars(tmp_path)["train/loss"] == [(1, 9.0), (2, 8.0), (3, 0.5)]
  assert not [r for r in caplog.records if "restart" in r.getMessage()]


def test_a_sweep_s_compared_fields_are_the_first_hparams_columns(tmp_path):
  """TensorBoard's HParams view of a sweep lists ~100 config fields: the
  sweep's axes, tuned fields and seed (``first``) are registered first and
  marked as differing, so they lead in the registered order and in the order
  TensorBoard 2.15+ shows (differing columns first, then by name)."""
  from tensorboard.plugins.hparams import api_pb2  # pylint: disable=import-outside-toplevel
  from tensorboard.plugins.hparams import backend_context  # pylint: disable=import-outside-toplevel
  config = {f"data.field_{i:02d}": i for i in range(40)}
  config.update({"model.activation": "swiglu", "model.d_model": 64,
                 "optim.learning_rate": 3e-3, "seed": 1, "train.num_steps": 20})
  first = ("model.activation", "optim.learning_rate", "seed", "model.not_in_config")
  with metrics.MetricWriter(tmp_path) as writer:
    writer.write_hparams(config, ["eval/loss"], first=first)
  columns = metrics.read_hparam_columns(tmp_path)
  assert [name for name, _ in columns[:3]] == list(first[:3])
  assert [name for name, differs in columns if differs] == list(first[:3])
  assert sorted(name for name, _ in columns) == sorted(config)  # each field once
  experiment = api_pb2.Experiment(hparam_infos=[
      api_pb2.HParamInfo(name=name, differs=differs) for name, differs in columns])
  backend_context._sort_and_reduce_to_hparams_limit(experiment)  # pylint: disable=protected-access
  assert {info.name for info in experiment.hparam_infos[:3]} == set(first[:3])
  # Without ``first`` (a run outside a sweep): the config's order, nothing marked.
  with metrics.MetricWriter(tmp_path / "plain") as writer:
    writer.write_hparams(config, ["eval/loss"])
  assert metrics.read_hparam_columns(tmp_path / "plain") == [(k, False) for k in config]
