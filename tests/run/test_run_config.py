"""What a config means is checked without devices; the devices when a run starts."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import jax
import pytest

from tfx_jax.run import config as run_config

from tfx_jax.run import setup as run_setup

from tfx_jax.run import sharding
from tfx_jax import tasks
from tfx_jax.run.config_base import load_config_file
from tfx_jax.core.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lm_tiny():
  return load_config_file(str(ROOT / "configs" / "lm.py") + ":tiny")


@pytest.fixture
def no_devices(monkeypatch):
  """Any look at devices or processes fails the test."""
  def refuse(*args, **kwargs):
    raise AssertionError("the config's meaning was checked against devices")
  for name in ("devices", "local_devices", "device_count", "local_device_count",
               "process_count", "process_index"):
    monkeypatch.setattr(jax, name, refuse)


def test_an_8_device_mesh_validates_without_devices(no_devices):
  config = _lm_tiny()
  config.mesh.fsdp = 8
  assert run_config.resolve(config).model.family == "decoder_only"


@pytest.mark.parametrize("field, value, message", [
    ("fsdp", 0, "mesh.fsdp=0 is not valid: must be a positive integer or -1"),
    ("tensor", -1, "mesh.data and mesh.tensor are all -1"),
])
def test_mesh_sizes_are_checked_without_devices(no_devices, field, value, message):
  config = _lm_tiny()
  config.mesh[field] = value
  with pytest.raises(ConfigError, match=message):
    run_config.resolve(config)


def test_a_batch_that_explicit_mesh_sizes_cannot_split_fails_without_devices(no_devices):
  config = _lm_tiny()
  config.mesh.data, config.mesh.fsdp = 2, 4
  config.train.batch_size = 12
  with pytest.raises(ConfigError, match=r"train.batch_size=12 .*mesh.data x mesh.fsdp = 8"):
    run_config.resolve(config)


def test_the_mesh_is_checked_against_the_devices_when_a_run_starts():
  config = _lm_tiny()
  config.mesh.fsdp = 8
  n = jax.device_count()
  with pytest.raises(ConfigError) as e:
    run_setup.check_devices(config)
  message = str(e.value)
  assert "config.mesh.fsdp=8" in message
  assert f"sees {n} " in message and "Sizes that fit" in message


def test_make_mesh_names_the_fields_and_the_sizes_that_fit():
  devices = jax.devices()[:1] * 6  # shapes only: the mesh is never used
  with pytest.raises(ConfigError, match=r"config.mesh.tensor=4: .* needs a multiple of 4 "
                     r"devices, but this process sees 6 .* each one of \[1, 2, 3, 6\]"):
    sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 4}, devices)
  with pytest.raises(ConfigError, match="needs exactly 4 devices"):
    sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 1}, devices)


def test_train_with_an_8_way_mesh_on_one_cpu_exits_2_naming_the_field(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "tfx_jax.train", "--config", "configs/lm.py:tiny",
       f"--workdir={workdir}", "--config.mesh.fsdp=8"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "config.mesh.fsdp=8" in proc.stderr and "Traceback" not in proc.stderr
  assert not workdir.exists()  # nothing written, nothing compiled


# ----------------------------------------------------------- one place each
def test_every_task_loss_and_row_builder_takes_only_its_own_settings():
  import inspect
  for task in tasks.TASKS.values():
    params = inspect.signature(task.rows.build).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), task.name
  assert set(inspect.signature(tasks.token_loss).parameters) == {
      "outputs", "batch", "label_smoothing", "z_loss"}
  assert set(inspect.signature(tasks.classify_loss).parameters) == {
      "outputs", "batch", "lambda_pt", "z_loss"}
  config = _lm_tiny()
  config.train.label_smoothing = 0.1
  config.train.z_loss = 1e-4
  assert tasks.get("lm").objective(config, "decoder_only", train=True).keywords == {
      "label_smoothing": 0.1, "z_loss": 1e-4}
  # Evaluation measures the plain loss: neither smoothing nor z-loss.
  assert tasks.get("lm").objective(config, "decoder_only", train=False).keywords == {
      "label_smoothing": 0.0, "z_loss": 0.0}
  assert tasks.get("classify").objective(config, "encoder_only", train=True).keywords == {
      "lambda_pt": 0.0, "z_loss": 1e-4}


def test_a_row_format_is_bound_to_the_settings_its_builder_names():
  bound = tasks.get("lm").rows.bind(tok="T", keys="K", seq_len=8, counts="C", seed=1,
                                    mask_rate=0.2, n_classes=None, target_seq_len=8)
  assert bound.keywords == {"tok": "T", "keys": "K", "seq_len": 8, "counts": "C"}
  assert all(task.rows.name == name for name, task in tasks.TASKS.items())


def test_a_resume_compares_the_dataset_version_apart_from_the_name():
  from tfx_jax.run import checkpoint as ckpt_lib
  saved = {"data.name": "tfx_shakespeare", "data.version": "1.0.0", "compute_dtype": None}
  newer = {"data.name": "tfx_shakespeare", "data.version": "1.1.0",
           "compute_dtype": "float32"}
  with pytest.raises(ConfigError, match="data.version: saved '1.0.0' -> new '1.1.0'"):
    ckpt_lib.check_compatible(run_config.resume_view(saved), run_config.resume_view(newer),
                              run_config.RESUME_FIELDS)
  # Naming the version resumes it: the same dataset at the same version.
  pinned = {"data.name": "tfx_shakespeare:1.0.0", "data.version": "1.0.0",
            "compute_dtype": "float32"}
  ckpt_lib.check_compatible(run_config.resume_view(saved), run_config.resume_view(pinned),
                            run_config.RESUME_FIELDS)


@pytest.mark.parametrize("num_batches, final_batches, message", [
    (4, -2, "eval.final_batches=-2 is not valid: must be -1 (as eval.num_batches), 0 (the "
     "whole split) or a number of batches > 0."),
    (4, 3, "eval.final_batches=3 is not valid: reads at least the batches of the other "
     "evaluations (eval.num_batches=4; 0: the whole split): -1 (as eval.num_batches), 0 "
     "(the whole split) or a number >= eval.num_batches."),
    (0, 8, "eval.final_batches=8 is not valid: reads at least the batches of the other "
     "evaluations (eval.num_batches=0;"),
])
def test_eval_final_batches_names_its_choices(no_devices, num_batches, final_batches,
                                              message):
  config = _lm_tiny()
  config.eval.num_batches, config.eval.final_batches = num_batches, final_batches
  with pytest.raises(ConfigError) as e:
    run_config.resolve(config)
  assert message in str(e.value)


def test_the_last_evaluation_reads_eval_final_batches(no_devices):
  """eval.final_batches at train.num_steps only; -1: every evaluation as
  eval.num_batches (the default, today's behaviour)."""
  config = _lm_tiny()
  config.train.num_steps, config.eval.num_batches = 100, 2
  for final, last in ((-1, 2), (0, 0), (2, 2), (5, 5)):
    config.eval.final_batches = final
    ev = run_config.resolve(config).eval
    assert [ev.batches_at(s, 100) for s in (0, 50, 99, 100)] == [2, 2, 2, last]
