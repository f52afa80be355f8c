"""Config files, presets and command-line overrides.

Also the helpers that test_train.py and test_reliability.py share: the tiny
run configuration (``tiny_config``), the same overrides as command-line flags
(``cli_flags``), and the training command run in this process (``run_cli``)
or in a subprocess (``train_command``, ``subprocess_env``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from tfx_jax import run_config
from tfx_jax.errors import ConfigError
from tfx_jax.models import build_model, dummy_inputs

# ml_collections loads config files with the deprecated importlib load_module().
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_FILES = sorted(p.name for p in (ROOT / "configs").glob("*.py"))

# Every training test shrinks a preset with these overrides: seconds on a CPU.
# The vocabulary stays the preset's (= data.vocab_size), so the SentencePiece
# model prepared once in the default TFDS data dir is reused. decay_steps is
# pinned so that runs of different lengths share one learning-rate schedule
# (and one compiled train step).
TINY = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.d_ff": 64,
    "train.batch_size": 4,
    "train.seq_len": 32,
    "train.num_steps": 20,
    "train.log_every_steps": 1,
    "eval.every_steps": 10,
    "eval.num_batches": 2,
    "eval.batch_size": 4,
    "eval.num_samples": 0,
    "eval.num_bleu_examples": 0,
    "checkpoint.every_steps": 10,
    "optim.warmup_steps": 5,
    "optim.decay_steps": 20,
}


def load_config(spec: str):
  """``"lm.py:tiny"`` -> the locked ConfigDict of configs/lm.py, preset tiny."""
  file, _, preset = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location(
      f"_config_{file[:-3]}", ROOT / "configs" / file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


def tiny_config(spec: str = "lm.py:tiny", overrides: dict | None = None):
  """``spec`` shrunk by ``TINY``, then ``overrides`` ({"train.num_steps": 10})."""
  config = load_config(spec)
  config.update_from_flattened_dict({**TINY, **(overrides or {})})
  return config


def cli_flags(overrides: dict | None = None) -> list[str]:
  """``TINY`` + ``overrides`` as ``--config.a.b=v`` flags (same values as tiny_config)."""
  return [f"--config.{k}={v}" for k, v in {**TINY, **(overrides or {})}.items()]


def train_command(spec: str, workdir, overrides: dict | None = None) -> list[str]:
  return [sys.executable, "-m", "tfx_jax.train", "--config", f"configs/{spec}",
          "--workdir", str(workdir), *cli_flags(overrides)]


def subprocess_env(cache_dir) -> dict:
  """Environment of training subprocesses: CPU, one shared compilation cache."""
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
              JAX_COMPILATION_CACHE_DIR=str(cache_dir),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@contextlib.contextmanager
def compilation_cache(cache_dir):
  """JAX's persistent compilation cache in ``cache_dir``, for this block only.

  Runs of the same tiny config then compile their steps once per session,
  in this process and in the training subprocesses (``subprocess_env``).
  """
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=import-outside-toplevel
  settings = {"jax_compilation_cache_dir": str(cache_dir),
              "jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": 0}
  old = {name: getattr(jax.config, name) for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  cc.reset_cache()
  try:
    yield
  finally:
    for name, value in old.items():
      jax.config.update(name, value)
    cc.reset_cache()


def run_cli(args: list[str]) -> tuple[int, str, str]:
  """Runs ``python -m tfx_jax.train ARGS`` in this process: (exit code, stdout, stderr).

  The real entry point (absl flag parsing, config overrides, error handling)
  runs; ``run_main`` resets the command's own flag registry on every call.
  """
  from tfx_jax import cli, train  # pylint: disable=import-outside-toplevel
  argv = ["tfx_jax.train", *[str(a) for a in args]]
  old_argv, sys.argv = sys.argv, argv  # ml_collections reads overrides from sys.argv
  out, err = io.StringIO(), io.StringIO()
  code = 0
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      cli.run_main(train.main, train.FLAGS)
  except SystemExit as e:
    code = 0 if e.code is None else e.code
  finally:
    sys.argv = old_argv
  return code, out.getvalue(), err.getvalue()


def presets(file: str) -> tuple[str, ...]:
  spec = importlib.util.spec_from_file_location(f"_presets_{file[:-3]}",
                                                ROOT / "configs" / file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.PRESETS


ALL_PRESETS = [(f, p) for f in CONFIG_FILES for p in presets(f)]
TINY_PRESETS = [(f, p) for f, p in ALL_PRESETS if "tiny" in p]


# --------------------------------------------------------------------- tests
def test_every_config_file_has_presets_and_a_tiny_one():
  assert CONFIG_FILES == ["finetune.py", "lm.py", "mlm.py", "translate.py"]
  assert {f for f, _ in TINY_PRESETS} == set(CONFIG_FILES)


@pytest.mark.parametrize("file,preset", ALL_PRESETS)
def test_every_preset_loads_locked_and_validates(file, preset):
  config = load_config(f"{file}:{preset}")
  with pytest.raises(AttributeError):
    config.model.nrom = "rmsnorm"  # locked: a typo cannot add a field
  model_cfg = run_config.validate_run_config(config)  # no data read, nothing compiled
  assert model_cfg.vocab_size >= config.data.vocab_size
  assert model_cfg.dtype == (config.compute_dtype or config.model.dtype)


@pytest.mark.parametrize("file,preset", TINY_PRESETS)
def test_tiny_presets_build_the_model(file, preset):
  config = load_config(f"{file}:{preset}")
  model_cfg = run_config.validate_run_config(config)
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
  assert run_config.validate_run_config(config).dtype == "float32"
  config.compute_dtype = "bfloat16"
  assert run_config.validate_run_config(config).dtype == "bfloat16"
  assert run_config.validate_run_config(load_config("lm.py:llama_7b")).dtype == "bfloat16"
  legacy = tiny_config(overrides={"model.dtype": "bfloat16"})  # still accepted
  assert run_config.validate_run_config(legacy).dtype == "bfloat16"
  legacy.compute_dtype = "float32"  # the default: the alias decides
  assert run_config.validate_run_config(legacy).dtype == "bfloat16"
  legacy.model.dtype = "float32"
  legacy.compute_dtype = "bfloat16"
  with pytest.raises(ConfigError, match="compute_dtype='bfloat16' and model.dtype="):
    run_config.validate_run_config(legacy)
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
  assert run_config.validate_run_config(c).activation == "swiglu"


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

