"""Bad model configurations fail early with a message that says what to change.

Every error is a ``ConfigError`` (a ``ValueError``) raised by
``model_config_from_dict`` before anything is traced; its message names the
field, the value and, for a choice, the valid choices.
"""

import pathlib
import subprocess
import sys
from typing import get_args

import ml_collections
import pytest

from tfx_jax.run import config_base
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import (Activation, DType, Family, ModelConfig,
                                  NormPosition, NormType, Position, Remat,
                                  model_config_from_dict)

ROOT = pathlib.Path(__file__).resolve().parents[2]

AXES = {"family": Family, "norm_position": NormPosition, "norm_type": NormType,
        "activation": Activation, "position": Position, "remat": Remat, "dtype": DType}


def _error(overrides, seq_len=None) -> str:
  with pytest.raises(ConfigError) as info:
    model_config_from_dict(overrides, seq_len=seq_len)
  assert isinstance(info.value, ValueError)
  return str(info.value)


@pytest.mark.parametrize("field", sorted(AXES))
def test_unknown_axis_value_lists_the_choices(field):
  msg = _error({field: "bogus"})
  assert f"model.{field}" in msg and "'bogus'" in msg
  for choice in get_args(AXES[field]):
    assert choice in msg
  assert "\n" not in msg


@pytest.mark.parametrize("field", sorted(AXES))
def test_every_axis_value_is_accepted(field):
  for choice in get_args(AXES[field]):
    overrides = {field: choice}
    if choice == "rope" or field == "position":
      overrides.update(d_model=64, num_heads=4)
    assert getattr(model_config_from_dict(overrides), field) == choice


@pytest.mark.parametrize("overrides,seq_len,needles", [
    # d_model not divisible by num_heads
    (dict(d_model=10, num_heads=4), None,
     ["model.d_model=10", "model.num_heads=4", "model.head_dim"]),
    # RoPE rotates pairs: the head dimension must be even (12 / 4 = 3)
    (dict(position="rope", d_model=12, num_heads=4), None,
     ["model.position='rope'", "even head dimension", "= 3"]),
    # GQA: num_kv_heads must divide num_heads
    (dict(num_heads=4, num_kv_heads=3), None, ["model.num_kv_heads=3", "num_heads=4"]),
    # learned absolute positions cannot represent positions >= max_len
    (dict(position="learned", max_len=16), 32, ["model.max_len=16", "32"]),
    # zero or negative sizes
    (dict(num_heads=0), None, ["model.num_heads", "> 0", "got 0"]),
    (dict(num_layers=0), None, ["model.num_layers", "got 0"]),
    (dict(d_model=-8), None, ["model.d_model", "got -8"]),
    (dict(vocab_size=0), None, ["model.vocab_size", "got 0"]),
    (dict(num_kv_heads=-1), None, ["model.num_kv_heads", "got -1"]),
    (dict(head_dim=-4), None, ["model.head_dim", "got -4"]),
    # an explicit head width: RoPE needs it even (d_model / num_heads is not read)
    (dict(position="rope", d_model=16, num_heads=4, head_dim=5), None,
     ["model.position='rope'", "even head dimension", "model.head_dim = 5"]),
    # dropout rates in [0, 1)
    (dict(dropout=-0.1), None, ["model.dropout", "-0.1"]),
    (dict(attention_dropout=1.0), None, ["model.attention_dropout", "1.0"]),
    (dict(norm_eps=0.0), None, ["model.norm_eps", "0.0"]),
    # fields of another family
    (dict(family="decoder_only", num_encoder_layers=2), None,
     ["model.num_encoder_layers", "encoder_decoder"]),
    (dict(family="encoder_decoder", num_classes=3), None, ["model.num_classes"]),
], ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_invalid_values(overrides, seq_len, needles):
  msg = _error(overrides, seq_len)
  for needle in needles:
    assert needle in msg, msg


def test_learned_positions_accept_max_len_and_relative_schemes_any_length():
  cfg = model_config_from_dict(dict(position="learned", max_len=16), seq_len=16)
  assert (cfg.position, cfg.max_len) == ("learned", 16)
  for position in ("rope", "alibi", "t5_bias", "sinusoidal", "none"):
    cfg = model_config_from_dict(dict(position=position, max_len=16), seq_len=64)
    assert cfg.position == position  # longer than max_len is fine without a table


@pytest.mark.parametrize("field,value,needle", [
    ("num_layers", "2", "must be an integer"),
    ("d_model", 8.5, "must be an integer"),
    ("num_heads", True, "must be an integer"),
    ("dropout", "0.1", "must be a number"),
    ("dropout", float("nan"), "must be finite"),
    ("tie_embeddings", 1, "must be true or false"),
    ("scan_layers", "yes", "must be true or false"),
    ("activation", 3, "not a valid choice"),
])
def test_wrong_types(field, value, needle):
  msg = _error({field: value})
  assert f"model.{field}" in msg and repr(value) in msg and needle in msg


def test_unknown_field_suggests_the_closest():
  msg = _error({"nrom_type": "rmsnorm"})
  assert "model.nrom_type" in msg and "Did you mean 'norm_type'?" in msg
  assert "activation" in msg  # the valid fields are listed


def test_defaults_and_locked_config_dict():
  """The locked ConfigDict of the configs converts as is; unset placeholders
  keep the dataclass default."""
  model = config_base.model_defaults()
  model.lock()
  assert model_config_from_dict(model) == ModelConfig()
  with_placeholder = ml_collections.ConfigDict(
      {"d_ff": ml_collections.config_dict.placeholder(int), "activation": "swiglu"})
  assert model_config_from_dict(with_placeholder).d_ff == ModelConfig().d_ff


def test_derived_sizes():
  cfg = model_config_from_dict(dict(d_model=64, num_heads=8, num_kv_heads=2))
  assert (cfg.attention_head_dim, cfg.kv_heads) == (8, 2)
  assert model_config_from_dict(dict(num_heads=4)).kv_heads == 4  # 0 = multi-head
  # head_dim > 0: heads of that width, whatever d_model / num_heads is (or whether
  # num_heads divides d_model at all).
  for d, heads, width in ((64, 8, 16), (64, 8, 4), (30, 4, 8)):
    cfg = model_config_from_dict(dict(d_model=d, num_heads=heads, head_dim=width,
                                      position="rope", rope_fraction=0.5))
    assert (cfg.attention_head_dim, cfg.rope_dims) == (width, width // 2)
  assert model_config_from_dict(dict(d_model=64, activation="gelu")).ffn_dim == 256
  # Gated: 2/3 of 4d = 170.67 -> 170, rounded up to a multiple of 8 -> 176.
  assert model_config_from_dict(dict(d_model=64, activation="swiglu")).ffn_dim == 176
  # An explicit d_ff is the ungated width: gated gets 2/3 of it (66 -> 72), so
  # the activation axis compares models of equal size; gated_d_ff opts out.
  assert model_config_from_dict(dict(d_model=64, activation="swiglu",
                                     d_ff=100)).ffn_dim == 72
  assert model_config_from_dict(dict(d_model=64, activation="relu",
                                     d_ff=100)).ffn_dim == 100
  assert model_config_from_dict(dict(d_model=64, activation="swiglu", d_ff=100,
                                     gated_d_ff=100)).ffn_dim == 100
  assert model_config_from_dict(dict(d_model=64, activation="gelu",
                                     gated_d_ff=100)).ffn_dim == 256  # ungated: unused
  llama = dict(activation="swiglu", ff_multiple_of=256, num_heads=32)
  for d, hidden in ((4096, 11008), (5120, 13824), (6656, 17920), (8192, 22016)):
    assert model_config_from_dict(dict(llama, d_model=d)).ffn_dim == hidden
  enc_dec = model_config_from_dict(dict(family="encoder_decoder", num_layers=6,
                                        num_decoder_layers=2))
  assert (enc_dec.encoder_layers, enc_dec.decoder_layers) == (6, 2)


def _summary(*overrides):
  return subprocess.run(
      [sys.executable, "-m", "tfx_jax.summary", "--config", "configs/lm.py:tiny",
       *overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_summary_cli_bad_value_is_one_line_exit_2():
  proc = _summary("--config.model.position=foo")
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: ") and "Traceback" not in proc.stderr
  for needle in ("model.position", "'foo'", "sinusoidal", "rope", "alibi", "t5_bias"):
    assert needle in lines[0]
  assert proc.stdout == ""


def test_summary_cli_unknown_field_is_one_line_exit_2():
  proc = _summary("--config.model.nrom_type=rmsnorm")
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
  assert "nrom_type" in lines[0] and "norm_type" in lines[0]
