"""Training end to end: every family, TensorBoard output, checkpoints, resumption.

All runs use the tiny overrides of helpers.TINY (1 layer, d_model 32,
batch 4 x 32 tokens, 20 steps) on the embedded datasets in the default TFDS
data dir; one 20-step language-model run is shared by most tests.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil

import numpy as np
import pytest

from tfx_jax.run import metrics
from tfx_jax.records import run_spec
from tfx_jax.records import status as status_lib
from tfx_jax.run import setup as run_setup
from tfx_jax.run import trainer
from tfx_jax.data.sources import embedded_datasets
from tfx_jax.core.errors import ConfigError
from helpers import ROOT, TINY, cli_flags, run_cli, train, train_cli

# ml_collections loads config files with the deprecated importlib load_module().
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.usefixtures("shared_compilation_cache")]

TRAIN_TAGS = ("train/loss", "train/learning_rate", "train/grad_norm",
              "train/tokens_per_sec")


def checkpoint_steps(workdir: pathlib.Path) -> list[int]:
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit())


def must_not_run(*args, **kwargs):
  raise AssertionError("bad input must be reported before data is read or "
                       "anything is built")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  """(workdir, result, scalars) of one 20-step language-model run."""
  workdir = tmp_path_factory.mktemp("lm") / "run"
  result = train("lm.py:tiny", workdir)
  return workdir, result, metrics.read_scalars(workdir / "tensorboard")


def check_run(workdir: pathlib.Path, result: trainer.RunResult, task: str) -> dict:
  """The observable outputs of a finished 20-step run; returns its scalars."""
  assert result.status == "finished" and result.step == 20
  assert status_lib.read_status(workdir).state == "finished"
  logdir = workdir / "tensorboard"
  scalars = metrics.read_scalars(logdir)
  eval_tags = ["eval/loss"]
  if task in ("lm", "translate", "mlm"):
    eval_tags.append("eval/perplexity")
  if task in ("mlm", "classify"):
    eval_tags.append("eval/accuracy")
  assert set(TRAIN_TAGS + tuple(eval_tags)) <= set(scalars)
  for tag in TRAIN_TAGS:
    assert [s for s, _ in scalars[tag]] == list(range(1, 21)), tag
    assert all(math.isfinite(v) for _, v in scalars[tag]), tag
  for tag in eval_tags:  # at initialisation (eval.at_start), then every 10 steps
    assert [s for s, _ in scalars[tag]] == [0, 10, 20], tag
    assert np.float32(result.metrics[tag]) == scalars[tag][-1][1], tag
  losses = [v for _, v in scalars["train/loss"]]
  assert np.mean(losses[-5:]) < np.mean(losses[:5]), losses
  assert scalars["eval/loss"][-1][1] < scalars["eval/loss"][1][1] + 0.05  # from step 10

  tags = metrics.read_tags(logdir)
  assert "config" in tags["texts"]
  assert f"task: {task}" in metrics.read_texts(logdir)["config"][0][1]
  hparams, metric_names = metrics.read_hparams(logdir)
  assert hparams["model.d_model"] == 32 and hparams["task"] == task
  assert "eval/loss" in metric_names
  assert checkpoint_steps(workdir) == [10, 20]
  return scalars


# ----------------------------------------------------------------- families
def test_language_model_end_to_end(lm_run):
  workdir, result, _ = lm_run
  check_run(workdir, result, "lm")
  assert (workdir / "config.json").exists()


def test_status_records_the_train_step_s_memory_and_the_peak_rss(lm_run):
  """status.json: the compiled train step's memory analysis per device
  (``status.compiled_memory``: arguments, outputs, temporaries, their total)
  and the process's peak resident bytes at the end of training."""
  workdir, _, _ = lm_run
  status = status_lib.read_status(workdir)
  memory = status.train_step_memory
  assert list(memory) == list(status_lib.MEMORY_KEYS)
  assert memory["total"] == memory["arguments"] + memory["outputs"] + memory["temporaries"]
  # The arguments hold the float32 parameters and AdamW's two moments of them.
  assert memory["arguments"] >= 3 * 4 * status.num_params
  assert memory["temporaries"] > 0
  # The process held the step's buffers, and more (the interpreter, JAX, the data).
  assert status.peak_rss_bytes > memory["total"]


def test_the_loss_at_initialisation_is_evaluated_at_step_0(lm_run, tmp_path):
  """eval.at_start (the default): one evaluation before the first update,
  logged at step 0 as the ordinary eval/* scalars (the report's l0), near
  ln |V| for a fresh model; the first update's layer statistics still come
  at step 1; eval.at_start=false evaluates at the periodic steps only."""
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  workdir, _, scalars = lm_run
  step, loss = scalars["eval/loss"][0]
  assert step == 0 and abs(loss - math.log(1024)) < 0.1, loss
  entry = collect.RunEntry(name="run", seed=0, values=(), overrides={})
  assert collect.read_run(workdir, entry).initial["eval/loss"] == loss
  short = {"train.num_steps": 2, "train.log_every_steps": 2, "eval.every_steps": 2,
           "checkpoint.every_steps": 2}
  train("lm.py:tiny", tmp_path / "stats", short, {"train.log_layer_stats": True,
                                                   "train.layer_stats_init_batches": 1})
  got = metrics.read_scalars(tmp_path / "stats" / "tensorboard")
  assert [s for s, _ in got["eval/loss"]] == [0, 2]
  assert [s for s, _ in got["layer_stats/grad_norm/decoder_00"]] == [1, 2]
  # At initialisation, on the first batch with the first step's dropout key:
  # the gradient that the first update takes.
  (init,) = got["layer_stats/init_grad_norm/all/decoder_00"]
  assert init[0] == 0
  assert init[1] == pytest.approx(got["layer_stats/grad_norm/decoder_00"][0][1], rel=1e-5)
  assert [s for s, _ in got["train/loss"]] == [1, 2]
  train("lm.py:tiny", tmp_path / "off", short, {"eval.at_start": False})
  got = metrics.read_scalars(tmp_path / "off" / "tensorboard")
  assert [s for s, _ in got["eval/loss"]] == [2]
  assert collect.read_run(tmp_path / "off", entry).initial == {}


@pytest.mark.parametrize("spec,task", [
    ("translate.py:tiny", "translate"),
    ("mlm.py:tiny", "mlm"),
    ("finetune.py:mlm_tiny", "classify"),  # encoder_only, from scratch
])
def test_family_end_to_end(spec, task, tmp_path):
  workdir = tmp_path / "run"
  check_run(workdir, train(spec, workdir), task)


def test_classifier_fine_tuned_from_a_language_model(lm_run, tmp_path, capsys):
  pretrained, _, _ = lm_run
  workdir = tmp_path / "run"
  result = train("finetune.py:tiny", workdir,
                 {"finetune.init_checkpoint": str(pretrained)})
  out = capsys.readouterr().out
  # Every pretrained array is loaded; only the class head is new.
  line = next(l for l in out.splitlines() if l.startswith("Loaded "))
  loaded, total = map(int, line.split()[1].split("/"))
  assert loaded == total - 2 and line.endswith("new: classifier/bias, classifier/kernel."), line
  scalars = check_run(workdir, result, "classify")
  assert "eval/pt_loss" in scalars  # L = L_FT + lambda * L_PT (decoder_only)


# --------------------------------------------------------------- resumption
def test_resumed_run_matches_a_straight_run_bitwise(lm_run, tmp_path, capsys):
  _, straight, expected = lm_run
  workdir = tmp_path / "run"
  first = train("lm.py:tiny", workdir, {"train.num_steps": 10})
  assert (first.status, first.step) == ("finished", 10)
  second = train("lm.py:tiny", workdir)
  assert "Resumed from step 10" in capsys.readouterr().out
  got = metrics.read_scalars(workdir / "tensorboard")
  for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss",
              "eval/perplexity"):
    assert got[tag] == expected[tag], tag
  # The first attempt evaluated step 0; the resumed one does not again.
  assert [s for s, _ in got["eval/loss"]] == [0, 10, 20]
  assert second.metrics == straight.metrics
  assert checkpoint_steps(workdir) == [10, 20]


def test_a_muon_run_shows_its_groups_and_resumes_bitwise(tmp_path, capsys):
  """optim.optimizer=muon: the group of every parameter printed and written
  beside the config; its state (momentum, Adam moments) resumes exactly."""
  import json
  muon = {"optim.optimizer": "muon"}
  straight = train("lm.py:tiny", tmp_path / "straight", muon)
  out = capsys.readouterr().out
  assert "Parameter groups of optim.optimizer=muon" in out
  assert "decoder/layer_*/self_attention/{key,out,query,value}/kernel" in out
  written = json.loads((tmp_path / "straight" / trainer.OPTIMIZER_GROUPS).read_text())
  assert "embedding/embedding" in written["groups"]["adam"]["parameters"]
  assert written["groups"]["muon"]["parameters"][
      "decoder/layer_0/self_attention/out/kernel"]["reduction_axes"] == [0, 1]
  workdir = tmp_path / "run"
  train("lm.py:tiny", workdir, muon, {"train.num_steps": 10})
  resumed = train("lm.py:tiny", workdir, muon)
  assert "Resumed from step 10" in capsys.readouterr().out
  expected = metrics.read_scalars(tmp_path / "straight" / "tensorboard")
  got = metrics.read_scalars(workdir / "tensorboard")
  for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss"):
    assert got[tag] == expected[tag], tag
  assert resumed.metrics == straight.metrics


def test_finished_run_started_again_does_nothing(lm_run, monkeypatch, capsys):
  workdir, _, _ = lm_run
  before = status_lib.read_status(workdir)
  event_files = sorted(os.listdir(workdir / "tensorboard"))
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  monkeypatch.setattr(run_setup, "load_tokenizer", must_not_run)
  result = train("lm.py:tiny", workdir)
  assert (result.status, result.step) == ("finished", 20)
  assert "already finished at step 20" in capsys.readouterr().out
  assert sorted(os.listdir(workdir / "tensorboard")) == event_files
  assert checkpoint_steps(workdir) == [10, 20]
  status = status_lib.read_status(workdir)
  assert (status.state, status.step) == ("finished", 20)
  # What training measured is kept (this process trained nothing).
  assert (status.train_step_memory, status.peak_rss_bytes) == (
      before.train_step_memory, before.peak_rss_bytes)
  assert status.train_step_memory and status.peak_rss_bytes


def test_incompatible_config_in_an_existing_workdir(lm_run, monkeypatch):
  workdir, _, _ = lm_run
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  code, _, err = train_cli("lm.py:tiny", workdir, {"model.d_model": 64, "train.batch_size": 8,
                                                   "optim.learning_rate": 1e-2})
  assert code == 2 and "Traceback" not in err
  assert "model.d_model: saved 32 -> new 64" in err
  assert "train.batch_size: saved 4 -> new 8" in err
  assert "learning_rate" not in err  # may change between sessions
  assert status_lib.read_status(workdir).state == "finished"


def test_damaged_latest_checkpoint_falls_back_to_the_previous(lm_run, tmp_path, caplog,
                                                              capsys):
  source, _, expected = lm_run
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir)
  for path in (workdir / "checkpoints" / "20" / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":  # the array data
      path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
  result = train("lm.py:tiny", workdir, {"train.num_steps": 30})
  assert "falling back to step 10" in caplog.text
  assert "Resumed from step 10" in capsys.readouterr().out
  assert (result.status, result.step) == ("finished", 30)
  got = dict(metrics.read_scalars(workdir / "tensorboard")["train/loss"])
  assert [got[s] for s in range(1, 21)] == [v for _, v in expected["train/loss"]]


# ------------------------------------------------------------ a run's spec
def _spec_run_config(workdir: pathlib.Path) -> dict:
  return json.loads((workdir / "config.json").read_text())


def test_a_run_from_its_spec_trains_bitwise_as_from_override_flags(tmp_path):
  """``python -m tfx_jax.train --spec`` (a sweep's run) and ``--config FILE
  --config.a.b=v`` with the same values: the same config and the same losses,
  bitwise; the spec's compared fields lead TensorBoard's HParams columns."""
  overrides = {**TINY, "train.num_steps": 6, "eval.every_steps": 3,
               "optim.learning_rate": 0.003, "model.activation": "swiglu",
               "train.label_smoothing": 0.1}
  flags_dir, spec_dir = tmp_path / "flags", tmp_path / "spec"
  code, _, err = run_cli(["--config", ROOT / "configs" / "lm.py:tiny", "--workdir", flags_dir,
                          *cli_flags(overrides), "--config.seed=1"])
  assert code == 0, err
  spec = run_spec.RunSpec(config=str(ROOT / "configs" / "lm.py:tiny"), overrides=overrides,
                          seed=1, axis_fields=("model.activation",),
                          tuned_fields=("optim.learning_rate",), sweep="s", name="r")
  path = run_spec.write(spec_dir, spec)
  code, _, err = run_cli(["--spec", path, "--workdir", spec_dir])
  assert code == 0, err
  assert _spec_run_config(spec_dir) == _spec_run_config(flags_dir)
  from_flags = metrics.read_scalars(flags_dir / "tensorboard")
  from_spec = metrics.read_scalars(spec_dir / "tensorboard")
  for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss"):
    assert from_spec[tag] == from_flags[tag], tag  # (step, value) pairs, exactly
  assert [s for s, _ in from_spec["train/loss"]] == list(range(1, 7))
  columns = [name for name, _ in metrics.read_hparam_columns(spec_dir / "tensorboard")]
  assert columns[:3] == ["model.activation", "optim.learning_rate", "seed"]
  assert not any(differs for _, differs in
                 metrics.read_hparam_columns(flags_dir / "tensorboard"))


def test_a_bad_spec_is_refused_before_anything_runs(tmp_path, monkeypatch):
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  spec = run_spec.RunSpec(config=str(ROOT / "configs" / "lm.py:tiny"),
                          overrides={"model.activation": "swiglu"}, seed=0,
                          evaluations=(("--split", "test"),))
  path = run_spec.write(tmp_path / "r", spec)
  for args, message in [
      (["--spec", tmp_path / "none.json"], "no such file"),
      (["--spec", path, "--config", ROOT / "configs" / "lm.py:tiny"], "Exactly one of"),
      (["--spec", path, "--evaluate=--split test"], "the spec names the run's evaluations"),
      ([], "Exactly one of")]:
    code, _, err = run_cli([*args, "--workdir", tmp_path / "r"])
    assert code == 2 and message in err and "Traceback" not in err, (args, err)
  bad = run_spec.RunSpec(config=spec.config, overrides={"model.activaton": "swiglu"}, seed=0)
  code, _, err = run_cli(["--spec", run_spec.write(tmp_path / "b", bad),
                          "--workdir", tmp_path / "b"])
  assert code == 2 and "did you mean" in err.lower() and "model.activation" in err
  data = spec.to_json()
  data["seed"] = "0"
  (tmp_path / "r" / run_spec.FILENAME).write_text(json.dumps(data))
  code, _, err = run_cli(["--spec", path, "--workdir", tmp_path / "r"])
  assert code == 2 and "seed: an integer" in err


# --------------------------------------------------------------- bad input
def test_unwritable_workdir_fails_before_any_work(tmp_path, monkeypatch):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  workdir = blocker / "run"  # cannot be created, even by root
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  monkeypatch.setattr(run_setup, "load_tokenizer", must_not_run)
  with pytest.raises(ConfigError, match="not writable") as error:
    train("lm.py:tiny", workdir)
  assert str(workdir) in str(error.value)
  code, _, err = train_cli("lm.py:tiny", workdir)
  assert code == 2 and "not writable" in err and "Traceback" not in err


def test_unknown_dataset_lists_the_available_ones(tmp_path, monkeypatch):
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  code, _, err = train_cli("lm.py:tiny", tmp_path / "run", {"data.name": "tfx_shakespaere"})
  assert code == 2 and "Traceback" not in err
  assert "data.name='tfx_shakespaere'" in err
  for name in embedded_datasets():
    assert name in err
