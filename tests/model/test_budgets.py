"""Matched budgets: the KV cache per token and the recurrent state per sequence
against hand counts (tfx_jax/model/budgets.py), ``summary``'s budget lines,
configs/lm.py's ``matched`` within 1% on every preset (parameters, training
FLOPs per token, KV bytes), its errors, and the points table's budget columns."""

import types

import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.model import budgets
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.records.summary import RunSummary
from tfx_jax.report.sections import selection
from tfx_jax.run import config as run_config
from tfx_jax.run import footprint
from tfx_jax.run.config_base import apply_overrides
from tfx_jax import summary

from helpers import _config_module, run_command

lm = _config_module("lm.py", "_budgets_lm")


def _resolved(preset, overrides=None):
  config = lm.get_config(preset)
  apply_overrides(config, overrides or {})
  return run_config.resolve(config)


@pytest.mark.parametrize("fields, want", [
    # 2 x kv heads x head width x layers x bytes
    (dict(num_layers=2, d_model=128, num_heads=4), 2 * 4 * 32 * 2 * 4),
    (dict(num_layers=2, d_model=128, num_heads=4, num_kv_heads=1), 2 * 1 * 32 * 2 * 4),
    (dict(num_layers=3, d_model=64, num_heads=4, num_kv_heads=2, head_dim=48,
          dtype="bfloat16"), 2 * 2 * 48 * 3 * 2),
    (dict(family="encoder_decoder", num_layers=2, num_decoder_layers=5, d_model=64,
          num_heads=2), 2 * 2 * 32 * 5 * 4),  # the decoder's self-attention only
    (dict(family="encoder_only", num_layers=2, d_model=64, num_heads=2), 0),
])
def test_kv_bytes_against_a_hand_count(fields, want):
  cfg = model_config_from_dict(fields)
  assert budgets.kv_cache_bytes_per_token(cfg) == want
  assert budgets.recurrent_state_bytes_per_sequence(cfg) == 0


def test_the_layer_kinds_dispatch_mla_and_deltanet_layers():
  # A stand-in with the fields of model.attention_type and model.mixer_pattern.
  cfg = types.SimpleNamespace(
      family="decoder_only", decoder_layers=8, dtype="bfloat16", mixer_pattern="DDDA",
      attention_type="mla", mla_kv_rank=512, mla_rope_dim=64, mla_nope_dim=128,
      mla_q_rank=0, mla_v_dim=0, head_dim=0, d_model=512, num_heads=8, position="rope",
      deltanet_heads=4, deltanet_head_dim=32, deltanet_v_heads=0, deltanet_v_head_dim=0,
      kv_heads=8, attention_head_dim=64)
  assert budgets.layer_kinds(cfg) == ("deltanet",) * 3 + ("mla",) + ("deltanet",) * 3 + ("mla",)
  assert budgets.kv_cache_bytes_per_token(cfg) == 2 * (512 + 64) * 2  # d_c + d_R, 2 layers
  assert budgets.recurrent_state_bytes_per_sequence(cfg) == 6 * 4 * 32 * 32 * 2
  # Qwen3-Next's grouped values: 8 value heads of 16 read by the 4 key heads of 32.
  cfg.deltanet_v_heads, cfg.deltanet_v_head_dim = 8, 16
  assert budgets.recurrent_state_bytes_per_sequence(cfg) == 6 * 8 * 32 * 16 * 2
  cfg.deltanet_v_heads = cfg.deltanet_v_head_dim = 0
  cfg.attention_type = "standard"
  assert budgets.kv_cache_bytes_per_token(cfg) == 2 * (2 * 8 * 64) * 2


def test_derived_widths_are_counted_as_built():
  # MLA's 0 fields: d_n = 64 / 4 = 16, d_R = 2 x (16 // 4) = 8, d_c = 4 d_n = 64,
  # d_v = d_n; its latent and rotary key per token and layer.
  mla = model_config_from_dict(dict(num_layers=2, d_model=64, num_heads=4,
                                    position="rope", attention_type="mla"))
  assert budgets.kv_cache_bytes_per_token(mla) == (64 + 8) * 2 * 4
  # DeltaNet's 0 fields: num_heads heads of the attention head width.
  hybrid = model_config_from_dict(dict(num_layers=4, d_model=64, num_heads=4,
                                       mixer_pattern="DA"))
  assert budgets.recurrent_state_bytes_per_sequence(hybrid) == 2 * 4 * 16 * 16 * 4
  assert budgets.kv_cache_bytes_per_token(hybrid) == 2 * 2 * 4 * 16 * 4


def test_flops_count_mla_widths_and_deltanet_states():
  seq = 64
  # RoPE and a tied table: N is every parameter (the table is the output projection).
  fields = dict(num_layers=4, d_model=64, num_heads=4, vocab_size=128, position="rope")
  def counts(**changes):
    cfg = model_config_from_dict(dict(fields, **changes))
    assert cfg.tie_embeddings
    shapes = footprint.param_shapes(cfg)
    n = footprint.active_params(cfg, shapes)
    return cfg, n, footprint.flops_per_token(cfg, seq, shapes)["forward"]
  cfg, n, forward = counts()
  assert forward == 2 * n + 2 * 4 * seq * 64
  # MLA: its scores read d_n + d_R = 24 and its sum d_v = 16 per head.
  cfg, n, forward = counts(attention_type="mla", mla_nope_dim=16, mla_rope_dim=8,
                           mla_v_dim=16, mla_kv_rank=32)
  assert forward == 2 * n + round(2 * 4 * seq * 4 * (16 + 8 + 16) / 2)
  # DeltaNet layers attend over no context: 3 products of a 4 x 16 x 16 state.
  cfg, n, forward = counts(mixer_pattern="DDDA")
  assert forward == 2 * n + 2 * 1 * seq * 64 + 6 * 3 * 4 * 16 * 16
  from tfx_jax.scale import flops
  assert flops.attention_flops_per_token(cfg, seq) == 12 * 1 * 64 * seq + 18 * 3 * 4 * 16 * 16


def test_summary_prints_the_three_budgets():
  code, out, err = run_command(summary, ["--config", f"{lm.__file__}:tiny"])
  assert code == 0, err
  run = _resolved("tiny")
  b = footprint.budgets(run.model, run.train.seq_len)
  assert (f"budgets: params {b['params']:,}  non-embedding params "
          f"{b['non_embedding_params']:,}  train FLOPs per token (seq_len 64) "
          f"{b['train_flops_per_token']:,}") in out
  assert "KV cache per token (float32): 2,048 bytes" in out
  # The non-embedding count is the ladder's: without the token table (tied).
  assert b["non_embedding_params"] == b["params"] - 1024 * 128


def _check_matched(preset, match, variant):
  over = lm.matched(preset, match, **variant)
  key = footprint.BUDGET_KEYS[match]
  target = footprint.budgets(_resolved(preset).model, _resolved(preset).train.seq_len)[key]
  run = _resolved(preset, over)
  got = footprint.budgets(run.model, run.train.seq_len)[key]
  assert abs(got / target - 1) <= 0.01, (preset, match, variant, over, got, target)
  return over


def test_matched_params_on_the_tiny_preset():
  over = _check_matched("tiny", "params", {"activation": "swiglu"})
  assert set(over) == {"model.activation", "model.gated_d_ff"}


def _variants(preset):
  """An activation of the other kind (gated <-> plain) and half the KV heads."""
  cfg = _resolved(preset).model
  return [{"activation": "gelu" if cfg.gated else "swiglu"},
          {"num_kv_heads": cfg.num_heads // 2}]


@pytest.mark.slow
@pytest.mark.parametrize("preset", lm.PRESETS)
@pytest.mark.parametrize("match", ["params", "flops"])
def test_matched_params_and_flops_on_every_preset(preset, match):
  for variant in _variants(preset):
    _check_matched(preset, match, variant)


@pytest.mark.parametrize("preset", lm.PRESETS)
def test_matched_kv_on_every_preset(preset):
  cfg = _resolved(preset).model
  target = budgets.kv_cache_bytes_per_token(cfg)
  for variant in ({"num_layers": 2 * cfg.num_layers}, _variants(preset)[0]):
    over = lm.matched(preset, "kv", **variant)
    got = budgets.kv_cache_bytes_per_token(_resolved(preset, over).model)
    assert abs(got / target - 1) <= 0.01, (preset, variant, over)
  # Twice the layers: half the KV heads.
  assert lm.matched(preset, "kv", num_layers=2 * cfg.num_layers)["model.num_kv_heads"] == (
      cfg.num_heads // 2)


def test_matched_errors_are_config_errors():
  with pytest.raises(ConfigError, match="no value of model.num_kv_heads comes within 1%"):
    lm.matched("tiny", "kv", num_layers=3)  # 4/3 of the cache: no divisor of 4 heads
  with pytest.raises(ConfigError, match="leave it out of the variant"):
    lm.matched("tiny", "kv", num_kv_heads=2)
  with pytest.raises(ConfigError, match="choose one of params, flops, kv"):
    lm.matched("tiny", "memory")


def test_the_points_table_shows_budgets_only_where_runs_recorded_them():
  b = {"params": 10, "non_embedding_params": 8, "train_flops_per_token": 60,
       "kv_bytes_per_token": 2048, "state_bytes_per_sequence": 0}
  recorded = {(0,): [(None, RunSummary("finished", budgets=b))]}
  assert [key for key, _ in selection._budget_columns(recorded)] == [
      "params", "non_embedding_params", "train_flops_per_token", "kv_bytes_per_token"]
  assert selection._budget_columns({(0,): [(None, RunSummary("finished"))]}) == []
