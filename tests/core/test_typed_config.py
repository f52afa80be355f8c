"""The run config as typed sections: generated defaults, one resolution, the
derived values that adapt, and shared settings that are inactive at some points
of a sweep."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from tfx_jax.run import config_base

from tfx_jax.run import optim

from tfx_jax.run import config as run_config

from tfx_jax.core import typed_config
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model.config import ModelConfig
from tfx_jax.sweep import spec as spec_lib
from tfx_jax.sweep import validate
from helpers import ROOT, load_config, sweep_in_process


def test_every_section_default_comes_from_its_dataclass():
  config = config_base.base_config()
  for name, kind in run_config.SECTIONS.items():
    fields = {f.name: f.default for f in dataclasses.fields(kind)}
    assert config[name].to_dict() == fields, name
  model = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name != "dtype"}
  assert {k: v for k, v in config.model.to_dict().items() if k != "dtype"} == model
  # Choices come from the Literal types, where the dataclass declares them.
  assert optim.OPTIMIZERS == typing.get_args(typed_config.field_types(
      optim.OptimSection)["optimizer"]) == tuple(optim.OptimConfig.registry)


def test_resolve_gives_typed_sections_and_keeps_the_config_as_given():
  config = load_config("lm.py:tiny")
  config.optim.learning_rate = 2e-3
  run = run_config.resolve(config)
  assert isinstance(run.optim, optim.OptimConfig) and run.optim.learning_rate == 2e-3
  assert run.optim.decay_steps == config.train.num_steps  # derived: the run's length
  assert run.model.family == "decoder_only" and run.train.seq_len == config.train.seq_len
  assert run.to_dict() == config.to_dict()  # config.json: the config as given
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.optim.learning_rate = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("section, field, value, message", [
    ("optim", "schedule", "cosin", "optim.schedule='cosin' is not a valid choice; choose "
     "one of: inverse_sqrt, cosine, linear, constant, wsd."),
    ("train", "on_nonfinite", "ignore", "train.on_nonfinite='ignore' is not a valid "
     "choice; choose one of: stop, skip."),
    ("data", "tokenizer", "bpe", "data.tokenizer='bpe' is not a valid choice; choose one "
     "of: sentencepiece, byte, hf."),
    ("eval", "num_batches", -1, "eval.num_batches=-1 is not valid: must be >= 0 (0: the "
     "whole split)."),
])
def test_a_bad_value_names_the_field_and_its_choices(section, field, value, message):
  config = load_config("lm.py:tiny")
  with config.unlocked():
    config[section][field] = value
  with pytest.raises(ConfigError) as e:
    run_config.resolve(config)
  assert message in str(e.value)


def test_a_short_run_caps_the_warmup_it_did_not_choose_and_says_so():
  """``--config.train.num_steps=30`` on a preset whose warmup is 30 steps: the
  cosine decay, derived to end at step 30, keeps a warmup of a tenth of the run."""
  config = load_config("lm.py:tiny")
  config.train.num_steps = 30
  assert config.optim.warmup_steps == 30 and config.optim.decay_steps == 0
  run = run_config.resolve(config)
  assert (run.optim.warmup_steps, run.optim.decay_steps) == (3, 30)
  (note,) = run.notes
  assert "optim.warmup_steps=30" in note and "train.num_steps=30" in note
  assert "capped at 3 steps" in note
  # A decay end the user set is not adapted: the error names both fields.
  config.optim.decay_steps = 20
  with pytest.raises(ConfigError, match=r"optim.decay_steps=20 is not valid: must be > "
                     r"optim.warmup_steps \(30\)"):
    run_config.resolve(config)


def test_an_inactive_setting_is_refused_in_a_single_run():
  config = load_config("lm.py:tiny")
  config.model.rope_scaling_factor = 2.0
  with pytest.raises(InactiveSetting, match="has no effect with model.rope_scaling='none'"
                     ) as e:
    run_config.resolve(config)
  assert (e.value.field, e.value.default) == ("model.rope_scaling_factor", 1.0)


_sweep = sweep_in_process


@pytest.mark.parametrize("values", ["none,linear,ntk,yarn", "linear,ntk,yarn"])
def test_a_shared_setting_inactive_at_some_points_runs_there_at_its_default(
    tmp_path, capsys, values):
  """The natural grid of the scaling methods with their baseline: the factor and the
  original length are shared, and each point runs with what it reads."""
  shared = ["--config.model.rope_scaling_factor=2.0",
            "--config.model.rope_original_max_len=64"]
  code, out, err = _sweep(
      ["--config", "configs/lm.py:tiny", "--axis", f"model.rope_scaling={values}",
       *shared, "--dry-run", "--name", "scaling", "--workdir", tmp_path / "runs"], capsys)
  assert code == 0, err
  assert f"scaling: {len(values.split(','))} runs" in out
  assert "model.rope_original_max_len=64 has no effect at this point" in out
  assert not (tmp_path / "runs").exists()
  sweep = spec_lib.Sweep(name="scaling", config=str(ROOT / "configs/lm.py") + ":tiny",
                         axes=[{"model.rope_scaling": values.split(",")}],
                         overrides={"model.rope_scaling_factor": 2.0,
                                    "model.rope_original_max_len": 64})
  axes, runs = spec_lib.expand(sweep)
  notes = validate.check_runs(sweep.config, axes, runs)
  overrides = {run.values[0]["model.rope_scaling"]: run.overrides for run in runs}
  # yarn reads both settings; linear and ntk not the original length; none neither.
  assert overrides["yarn"]["model.rope_original_max_len"] == 64
  assert overrides["yarn"]["model.rope_scaling_factor"] == 2.0
  for method in ("linear", "ntk"):
    assert overrides[method]["model.rope_original_max_len"] == 0
    assert overrides[method]["model.rope_scaling_factor"] == 2.0
  assert "rope_scaling-yarn_s0" not in notes
  assert notes["rope_scaling-ntk_s0"] == [
      "model.rope_original_max_len=64 has no effect at this point; the run leaves it at 0"]
  if "none" in values:
    assert overrides["none"]["model.rope_scaling_factor"] == 1.0
    assert len(notes["rope_scaling-none_s0"]) == 2
  # Each run, as its own process will resolve it, is valid.
  for run in runs:
    config = load_config("lm.py:tiny")
    config_base.apply_overrides(config, run.overrides)
    run_config.resolve(config)


def test_a_point_whose_own_value_is_inactive_is_still_an_error(tmp_path, capsys):
  """The axis sets the factor itself: the point at 2.0 with no scaling method is the
  axis's own mistake, named as such; the base is not blamed."""
  code, _, err = _sweep(
      ["--config", "configs/lm.py:tiny", "--axis", "model.rope_scaling_factor=1.0,2.0",
       "--dry-run", "--name", "factor", "--workdir", tmp_path / "runs"], capsys)
  assert code == 2
  assert "axis model.rope_scaling_factor (run rope_scaling_factor-2.0_s0)" in err
  assert "base config" not in err


def test_a_tuned_value_is_resolved_once_per_run_in_the_sweep(tmp_path, capsys,
                                                             monkeypatch):
  calls = []
  real = optim.resolve
  monkeypatch.setattr(optim, "resolve", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
  code, out, err = _sweep(
      ["--config", "configs/lm.py:tiny", "--axis", "model.norm_position=post,pre",
       "--tune", "optim.learning_rate=3e-4,3e-3", "--dry-run", "--name", "once",
       "--workdir", tmp_path / "runs"], capsys)
  assert code == 0, err
  assert len(calls) == 4  # one resolution per run, none again to build or to check
  assert {c.learning_rate for c in calls} == {3e-4, 3e-3}
  assert "--config.optim.learning_rate=0.0003" in out


def test_a_tuple_of_ints_field_reads_lists_and_names_a_bad_item():
  kind = typed_config.field_types(run_config.CheckpointConfig)["keep_steps"]
  assert typed_config.check_value("checkpoint", "keep_steps", kind, [18, 27]) == (18, 27)
  assert typed_config.check_value("checkpoint", "keep_steps", kind, ()) == ()
  with pytest.raises(ConfigError, match=r"checkpoint.keep_steps\[0\] must be an integer"):
    typed_config.check_value("checkpoint", "keep_steps", kind, ["18"])
  with pytest.raises(ConfigError, match="checkpoint.keep_steps must be a tuple of ints"):
    typed_config.check_value("checkpoint", "keep_steps", kind, 18)
