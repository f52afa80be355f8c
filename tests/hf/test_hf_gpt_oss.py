"""gpt-oss (tfx_jax/hf/gpt_oss.py): hidden-state, logits and greedy-decoding
parity with transformers' ``GptOssForCausalLM``, export -> import
bit-identity, and the settings refused both ways.

Each variant is a tiny random HF model (d_model 32, 4 query heads of 8 in 2
key/value groups, vocab 100, experts 16 wide) with every parameter moved off
its initial value (the sinks, the router's and the experts' biases too), so
that a wrong mapping, or a token routed to another expert, shows in the
logits. The pattern is tests/hf/test_hf_deepseek.py's.
Needs the optional 'hf' extra (torch CPU, transformers); skipped without it.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the HF parity tests need the 'hf' extra: pip install -e .[hf]")
transformers = pytest.importorskip(
    "transformers", reason="the HF parity tests need the 'hf' extra: pip install -e .[hf]")

from tfx_jax.core.errors import ConfigError  # noqa: E402
from tfx_jax.model.families import build_model  # noqa: E402
from tfx_jax.run import hf_interop  # noqa: E402
import hf_parity  # noqa: E402  (tests/)

VOCAB = 100
# float32 throughout (the measured maxima are in docs/huggingface.md).
TOL = 1e-4

_BASE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)

VARIANTS = {
    # GptOssConfig's own RoPE (YaRN 32x from 4096, rope_theta 150000, truncate
    # False) and layers (sliding, full), clamp 7 and alpha 1.702; a window of 4.
    "default": dict(),
    # 3 layers (sliding, sliding, full: global_every=3), 8 experts, 3 per token,
    # tied; a clamp of 0.25 that the gates and up projections reach (alpha 1),
    # and YaRN 4x from 64 with rope_theta 10000, where the unrounded ramp moves
    # the second frequency pair's blend from 0.5 to 0.99.
    "tied_clamped_yarn": dict(
        num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention",
                                          "full_attention"],
        num_local_experts=8, num_experts_per_tok=3, tie_word_embeddings=True,
        swiglu_limit=0.25, swiglu_alpha=1.0, max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                         "original_max_position_embeddings": 64, "truncate": False}),
}



@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """{variant: (HF model in eval mode, its save_pretrained directory)}."""
  return hf_parity.saved_variants(tmp_path_factory, transformers.GptOssConfig,
                                  transformers.GptOssForCausalLM, _BASE, VARIANTS)


@pytest.fixture(scope="module")
def imported(hf_dirs):
  return hf_parity.imported(hf_dirs)


def _ids(seed=0):
  return hf_parity.token_ids(VOCAB, seed)


def _max_diff(hf, cfg, params):
  ids = _ids()
  with torch.no_grad():
    want = hf(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  got = np.asarray(build_model(cfg).apply({"params": params}, ids)["logits"])
  assert got.shape == want.shape
  return float(np.abs(got - want).max())


def test_variants_are_imported_as_their_fields(imported):
  default, other = (imported[v][0] for v in VARIANTS)
  assert (default.activation, default.swiglu_limit, default.swiglu_alpha, default.use_bias,
          default.attention_sinks, default.ffn_type, default.num_experts,
          default.experts_per_token, default.expert_dim, default.router,
          default.router_norm_topk, default.router_use_bias, default.attention_window,
          default.global_every, default.kv_heads, default.attention_head_dim,
          default.tie_embeddings, default.norm_eps) == (
              "swiglu_oss", 7.0, 1.702, True, True, "moe", 4, 2, 16, "softmax", True,
              True, 4, 2, 2, 8, False, 1e-5)
  assert (default.rope_base, default.rope_scaling, default.rope_scaling_factor,
          default.rope_original_max_len, default.rope_yarn_truncate) == (
              150000.0, "yarn", 32.0, 4096, False)
  assert (other.global_every, other.num_experts, other.experts_per_token,
          other.tie_embeddings, other.swiglu_limit, other.swiglu_alpha, other.rope_base,
          other.rope_original_max_len) == (3, 8, 3, True, 0.25, 1.0, 10000.0, 64)


def _final_hidden(cfg, params, ids):
  """Our decoder's output after its final norm (the lm_head's input)."""
  _, state = build_model(cfg).apply(
      {"params": params}, ids, mutable=["intermediates"],
      capture_intermediates=lambda module, method: module.name == "final_norm")
  (hidden,) = state["intermediates"]["decoder"]["final_norm"]["__call__"]
  return np.asarray(hidden)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_hidden_states_and_logits_match_transformers(variant, hf_dirs, imported):
  hf = hf_dirs[variant][0]
  cfg, params = imported[variant]
  ids = _ids()
  with torch.no_grad():
    want = hf.model(input_ids=torch.from_numpy(ids.astype(np.int64))).last_hidden_state
  hidden = float(np.abs(_final_hidden(cfg, params, ids) - want.numpy()).max())
  logits = _max_diff(hf, cfg, params)
  print(f"gpt_oss {variant}: max |hidden diff| = {hidden:.2e}, "
        f"max |logit diff| = {logits:.2e}")
  assert hidden <= TOL and logits <= TOL, (variant, hidden, logits)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_cached_greedy_decoding_matches_generate(variant, hf_dirs, imported):
  hf = hf_dirs[variant][0]
  cfg, params = imported[variant]
  hf_parity.assert_greedy_matches_generate(hf, cfg, params, _ids(seed=1), 12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_then_import_is_bit_identical(variant, hf_dirs, imported, tmp_path):
  cfg, params = imported[variant]
  hf_parity.assert_round_trip(cfg, params, tmp_path, "gpt_oss")
  # ... and transformers loads the export (gate and up interleaved) to the same model.
  reloaded = transformers.GptOssForCausalLM.from_pretrained(tmp_path).eval()
  assert reloaded.config.rope_parameters.get("truncate", True) == cfg.rope_yarn_truncate
  assert _max_diff(reloaded, cfg, params) <= TOL


@pytest.mark.parametrize("variant,change", [
    ("default", "router_bias"),
    ("default", dict(attention_window=0, global_every=0)),
    ("tied_clamped_yarn", dict(swiglu_limit=7.0)),
    ("tied_clamped_yarn", dict(rope_yarn_truncate=True)),
], ids=["router_bias", "window", "swiglu_limit", "rope_yarn_truncate"])
@pytest.mark.slow
def test_each_new_setting_matters(variant, change, hf_dirs, imported):
  """On these inputs, leaving out the router's bias, the windows, the clamp
  or YaRN's unrounded ramp moves the logits far beyond the tolerance: the
  parity above checks each of them."""
  cfg, params = imported[variant]
  if change == "router_bias":
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if "router" in str(path) and "bias" in str(path)
        else x, params)
  else:
    cfg = dataclasses.replace(cfg, **change)
  assert _max_diff(hf_dirs[variant][0], cfg, params) > 100 * TOL


def _hf_config(hf_dirs, variant="default", **changes):
  config = json.loads((hf_dirs[variant][1] / "config.json").read_text())
  config.update(changes)
  return config


@pytest.mark.parametrize("changes,named", [
    (dict(attention_bias=False), "attention_bias=False"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types FS"),
    (dict(rope_parameters=dict(rope_type="llama3", factor=8.0, rope_theta=10000.0)),
     "rope_type='llama3'"),
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
                               original_max_position_embeddings=16, beta_fast=16)),
     "beta_fast=16"),
])
def test_unrepresented_hf_settings_are_refused(changes, named, hf_dirs):
  config = _hf_config(hf_dirs, **changes)
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.architecture_for(config).model_fields(config)


def test_a_config_without_rope_or_layer_types_is_gpt_oss_defaults(hf_dirs):
  config = _hf_config(hf_dirs)
  for key in ("rope_parameters", "layer_types"):
    config.pop(key)
  fields = hf_interop.architecture_for(config).model_fields(config)
  assert {k: fields[k] for k in ("rope_base", "rope_scaling", "rope_scaling_factor",
                                 "rope_original_max_len", "rope_yarn_truncate",
                                 "global_every")} == dict(
      rope_base=150000.0, rope_scaling="yarn", rope_scaling_factor=32.0,
      rope_original_max_len=4096, rope_yarn_truncate=False, global_every=2)


@pytest.mark.parametrize("change,named", [
    (dict(attention_sinks=False), "model.attention_sinks=False"),
    (dict(router_use_bias=False), "model.router_use_bias=False"),
    (dict(activation="swiglu", swiglu_limit=7.0, swiglu_alpha=1.702),
     "model.activation='swiglu'"),
    (dict(shared_experts=1), "model.shared_experts=1"),
    (dict(rope_scaling="ntk", rope_original_max_len=0, rope_yarn_truncate=True),
     "model.rope_scaling='ntk'"),
])
def test_unrepresentable_export_names_the_setting(change, named, imported, tmp_path):
  cfg, params = imported["default"]
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.to_hf(dataclasses.replace(cfg, **change), params, tmp_path)
  assert not (tmp_path / "config.json").exists()
