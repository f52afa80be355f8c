"""Preset sizes against published parameter counts, and the summary command.

Counts come from ``jax.eval_shape`` of the initialiser (``count_params``), so
the 65B preset is counted without allocating anything.
"""

import functools
import importlib.util
import pathlib
import subprocess
import sys
from typing import get_args

import pytest

from tfx_jax.model.config import GATED_ACTIVATIONS, Activation, model_config_from_dict
from tfx_jax.run.footprint import count_params

ROOT = pathlib.Path(__file__).resolve().parents[1]

# REFERENCES.md, "Published sizes".
PUBLISHED = {
    ("translate", "base"): 63.1e6,    # Transformer-base, 37k shared vocab, tied
    ("translate", "big"): 214.2e6,    # Transformer-big, same
    ("lm", "gpt2_small"): 124_439_808,
    ("lm", "llama_7b"): 6_738_415_616,
    ("lm", "llama_13b"): 13_015_864_320,
    ("lm", "llama_33b"): 32_528_943_616,
    ("lm", "llama_65b"): 65_285_660_672,
    ("mlm", "bert_base"): 109.5e6,
}
# Published as exact counts of the same architecture: these must match exactly.
EXACT = {("lm", "gpt2_small"), ("lm", "llama_7b"), ("lm", "llama_13b"),
         ("lm", "llama_33b"), ("lm", "llama_65b")}


def _config_module(name):
  spec = importlib.util.spec_from_file_location(f"_tfx_configs_{name}",
                                                ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _model_cfg(name, preset):
  config = _config_module(name).get_config(preset)
  return model_config_from_dict(config.model, seq_len=config.train.seq_len)


@pytest.mark.parametrize("name,preset", sorted(PUBLISHED), ids=lambda v: str(v))
def test_preset_parameter_count(name, preset):
  count = count_params(_model_cfg(name, preset))
  want = PUBLISHED[(name, preset)]
  assert abs(count - want) / want < 0.01, f"{name}:{preset} has {count:,} parameters"
  if (name, preset) in EXACT:
    assert count == want


@pytest.mark.parametrize("name", ["lm", "translate", "mlm"])
def test_every_preset_gives_a_valid_model_config(name):
  module = _config_module(name)
  assert module.PRESETS
  for preset in module.PRESETS:
    cfg = _model_cfg(name, preset)
    assert cfg.family == {"lm": "decoder_only", "translate": "encoder_decoder",
                          "mlm": "encoder_only"}[name]


def test_llama_feed_forward_sizes():
  """LLaMA's hidden size: 2/3 * 4d rounded up to a multiple of 256."""
  sizes = {preset: _model_cfg("lm", preset).ffn_dim
           for preset in ("llama_7b", "llama_13b", "llama_33b", "llama_65b")}
  assert sizes == {"llama_7b": 11008, "llama_13b": 13824, "llama_33b": 17920,
                   "llama_65b": 22016}


def test_summary_command_prints_the_table():
  proc = subprocess.run(
      [sys.executable, "-m", "tfx_jax.summary", "--config", "configs/lm.py:llama_7b"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  end = lines.index("params: 6738415616")
  assert lines[0].split()[:2] == ["module", "params"]
  # A dense model computes with all its parameters; 2 N + 2 n_layer n_ctx d_attn
  # FLOPs per token forward (Kaplan et al. 2020), 3x that to train.
  assert lines[end + 1] == "active params: 6738415616 (100.0% of 6738415616)"
  n = 6738415616 - 32000 * 4096  # the embedding table is read, not multiplied
  forward = 2 * n + 2 * 32 * 2048 * 4096
  assert lines[end + 2] == (f"FLOPs per token (seq_len 2048): forward {forward:,}  "
                            f"train {3 * forward:,}")
  body = lines[1:end]
  assert any(line.startswith("decoder/") for line in body)
  assert any(line.startswith("embedding") for line in body)
  # The per-module rows add up to the total.
  assert sum(int(line.split()[-2].replace(",", "")) for line in body) == 6738415616


@pytest.mark.parametrize("name", ["lm", "translate", "mlm", "finetune"])
def test_every_preset_has_one_vocabulary(name):
  """Presets are table rows; vocab_size is given once and sets model and data."""
  module = _config_module(name)
  for preset in module.PRESETS:
    config = module.get_config(preset)
    assert config.model.vocab_size == config.data.vocab_size, preset
  with pytest.raises(ValueError, match="choose one of"):
    module.get_config("no_such_preset")


def test_a_typo_in_a_preset_table_is_an_error():
  from tfx_jax.run.config_base import apply_preset, base_config
  config = base_config()
  apply_preset(config, {"vocab_size": 77, "model": {"d_model": 32},
                        "compute_dtype": "bfloat16"})
  assert (config.model.vocab_size, config.data.vocab_size) == (77, 77)
  assert (config.model.d_model, config.compute_dtype) == (32, "bfloat16")
  for row in ({"model": {"d_modle": 32}}, {"optimm": {"b1": 0.9}}, {"sed": 1}):
    with pytest.raises(KeyError):
      apply_preset(config, row)


def test_paper_presets_use_their_papers_training_settings():
  """BERT and GPT-2 drop attention probabilities at 0.1 like everything else;
  BERT decays the learning rate linearly to 0."""
  bert = _config_module("mlm").get_config("bert_base")
  gpt2 = _config_module("lm").get_config("gpt2_small")
  for config in (bert, gpt2):
    assert (config.model.dropout, config.model.attention_dropout) == (0.1, 0.1)
  assert (bert.optim.schedule, bert.optim.warmup_steps) == ("linear", 10_000)


# ------------------------------------------ activations compared at equal size
CONFIG_FILES = ("lm", "translate", "mlm", "finetune")


def _count(config, **model_overrides):
  """Parameters of a config's model. Counted with scan_layers (one traced layer:
  same parameters, stacked), so that the big presets count in a second."""
  model = dict(config.model.to_dict(), scan_layers=True, **model_overrides)
  return _count_model(model_config_from_dict(model))


# The presets of configs/finetune.py are those of lm.py and mlm.py, and several
# tests count one model: each is traced once.
_count_model = functools.cache(count_params)


@pytest.mark.parametrize("name", CONFIG_FILES)
@pytest.mark.slow
def test_every_activation_has_the_parameters_of_the_ungated_model(name):
  """Shazeer 2020 compares the FFN variants at matched parameters: on every
  preset, each gated activation is within 1% of the ungated model (d_ff is the
  ungated width; gated widths are 2/3 of it)."""
  module = _config_module(name)
  for preset in module.PRESETS:
    config = module.get_config(preset)
    counts = {a: _count(config, activation=a) for a in get_args(Activation)}
    assert counts["relu"] == counts["gelu"] == counts["swish"], preset
    for activation in GATED_ACTIVATIONS:
      ratio = counts[activation] / counts["relu"]
      assert abs(ratio - 1) < 0.01, (preset, activation, counts[activation], counts["relu"])
  # An unmatched gated width is an explicit request.
  config = module.get_config(module.PRESETS[0])
  wide = _count(config, activation="swiglu", gated_d_ff=3 * config.model.d_model)
  assert wide != _count(config, activation="swiglu")


def test_summary_shows_the_matched_count_of_a_gated_activation():
  config = _config_module("translate").get_config("tiny")
  proc = subprocess.run(
      [sys.executable, "-m", "tfx_jax.summary", "--config", "configs/translate.py:tiny",
       "--config.model.activation=swiglu"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  total = int(next(line for line in proc.stdout.splitlines()
                   if line.startswith("params: ")).removeprefix("params: "))
  assert total == _count(config, activation="swiglu")
  assert abs(total / _count(config, activation="relu") - 1) < 0.01


def test_gpu_presets_compute_in_bfloat16_and_cpu_presets_in_float32():
  """Paper-scale presets are meant for accelerators: bf16 compute (float32
  parameters); the presets sized for 2 CPU cores keep float32."""
  gpu = {"lm": ["gpt2_small", "llama_7b", "llama_65b"], "mlm": ["bert_base"],
         "translate": ["base", "big"]}
  cpu = {"lm": ["tiny", "small"], "mlm": ["tiny"], "translate": ["tiny"]}
  for table, dtype in ((gpu, "bfloat16"), (cpu, "float32")):
    for name, presets in table.items():
      for preset in presets:
        assert _config_module(name).get_config(preset).compute_dtype == dtype, preset
