"""Config files, presets and command-line overrides."""

from __future__ import annotations

import json
import subprocess

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from tfx_jax.run import config as run_config
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.families import build_model, dummy_inputs
from helpers import (ALL_PRESETS, CONFIG_FILES, ROOT, load_config, run_cli, subprocess_env,
                     tiny_config, train_command)

# ml_collections loads config files with the deprecated importlib load_module().
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

TINY_PRESETS = [(f, p) for f, p in ALL_PRESETS if "tiny" in p]


def test_every_config_file_has_presets_and_a_tiny_one():
  assert CONFIG_FILES == ["finetune.py", "lm.py", "mlm.py", "translate.py"]
  assert {f for f, _ in TINY_PRESETS} == set(CONFIG_FILES)


@pytest.mark.parametrize("file,preset", ALL_PRESETS)
def test_every_preset_loads_locked_and_validates(file, preset):
  config = load_config(f"{file}:{preset}")
  with pytest.raises(AttributeError):
    config.model.nrom = "rmsnorm"  # locked: a typo cannot add a field
  model_cfg = run_config.resolve(config).model  # no data read, nothing compiled
  assert model_cfg.vocab_size >= config.data.vocab_size
  assert model_cfg.dtype == (config.compute_dtype or config.model.dtype)


@pytest.mark.parametrize("file,preset", TINY_PRESETS)
def test_tiny_presets_build_the_model(file, preset):
  config = load_config(f"{file}:{preset}")
  model_cfg = run_config.resolve(config).model
  model = build_model(model_cfg)
  inputs = dummy_inputs(model_cfg, 2, config.train.seq_len)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), **inputs))
  n_params = sum(x.size for x in jax.tree.leaves(shapes["params"]))
  assert n_params > 10_000
  if config.task == "classify":
    out = jax.eval_shape(lambda: model.apply(model.init(jax.random.PRNGKey(0), **inputs),
                                             **inputs))
    assert out["class_logits"].shape == (2, model_cfg.num_classes)


def test_finetune_presets_match_their_pretraining_presets():
  for finetune_preset, pretrain in (("tiny", "lm.py:tiny"), ("mlm_tiny", "mlm.py:tiny")):
    ft = load_config(f"finetune.py:{finetune_preset}").model.to_dict()
    pre = load_config(pretrain).model.to_dict()
    assert {k: v for k, v in ft.items() if k != "num_classes"} == \
           {k: v for k, v in pre.items() if k != "num_classes"}


def test_unknown_preset_lists_the_presets():
  with pytest.raises(ValueError, match="gpt2_small"):
    load_config("lm.py:gpt3")
  code, _, err = run_cli(["--config", "configs/lm.py:gpt3", "--workdir", "/tmp/unused"])
  assert code == 2 and "gpt2_small" in err and "Traceback" not in err


def test_compute_dtype_is_the_one_dtype_field_and_model_dtype_its_deprecated_alias():
  config = tiny_config()
  assert config.compute_dtype == "float32" and config.model.dtype is None
  assert run_config.resolve(config).model.dtype == "float32"
  config.compute_dtype = "bfloat16"
  assert run_config.resolve(config).model.dtype == "bfloat16"
  assert run_config.resolve(load_config("lm.py:llama_7b")).model.dtype == "bfloat16"
  legacy = tiny_config(overrides={"model.dtype": "bfloat16"})  # still accepted
  assert run_config.resolve(legacy).model.dtype == "bfloat16"
  legacy.compute_dtype = "float32"  # the default: the alias decides
  assert run_config.resolve(legacy).model.dtype == "bfloat16"
  legacy.model.dtype = "float32"
  legacy.compute_dtype = "bfloat16"
  with pytest.raises(ConfigError, match="compute_dtype='bfloat16' and model.dtype="):
    run_config.resolve(legacy)
  # A checkpoint's config written with model.dtype resumes under compute_dtype.
  old = {"model.dtype": "float32", "compute_dtype": None, "model.d_model": 32}
  new = run_config.flatten_config(tiny_config())
  assert run_config.resume_view(old)["compute_dtype"] == run_config.resume_view(new)[
      "compute_dtype"] == "float32"


def test_overrides_of_every_type_parse():
  argv = ["prog", "--config", str(ROOT / "configs/lm.py") + ":tiny",
          "--config.model.activation=swiglu", "--config.model.num_layers=3",
          "--config.model.use_bias=true", "--config.optim.learning_rate=2e-4",
          "--config.finetune.init_checkpoint=/runs/x", "--config.seed=7"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  c = values.config
  assert (c.model.activation, c.model.num_layers, c.model.use_bias) == ("swiglu", 3, True)
  assert c.optim.learning_rate == 2e-4 and isinstance(c.optim.learning_rate, float)
  assert c.finetune.init_checkpoint == "/runs/x" and c.seed == 7
  assert run_config.resolve(c).model.activation == "swiglu"


def test_override_through_the_real_command(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("cli") / "run"
  cache = tmp_path_factory.getbasetemp() / "jax_cache"
  overrides = {"model.activation": "swiglu", "train.num_steps": 2,
               "eval.every_steps": 2, "eval.num_batches": 1}
  proc = subprocess.run(train_command("lm.py:tiny", workdir, overrides), cwd=ROOT,
                        env=subprocess_env(cache), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Finished at step 2" in proc.stdout
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["activation"] == "swiglu" and saved["train"]["num_steps"] == 2
  assert json.loads((workdir / "status.json").read_text())["state"] == "finished"

