"""Qwen3-Next (tfx_jax/hf/qwen3_next.py): logits and greedy-decoding parity with
transformers' ``Qwen3NextForCausalLM``, export -> import bit-identity, and the
settings refused both ways.

Each variant is a tiny random HF model in float32 (d_model 32, 4 attention
heads of 8 in 2 key/value groups, a quarter of each rotated; Gated DeltaNet
layers of 2 key heads of 8 serving 4 value heads of 6) with every parameter
moved off its initial value, so that a wrong mapping (of the per-key-head
in_proj_qkvz / in_proj_ba layout, of a 1 + w gain, of a gate) or a token
routed to another expert shows in the logits. On CPU transformers runs its
torch chunked and recurrent delta rules. Needs the optional 'hf' extra
(torch CPU, transformers); skipped without it.
"""

import dataclasses
import json

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
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
    linear_key_head_dim=8, linear_num_value_heads=4, linear_value_head_dim=6,
    linear_conv_kernel_dim=4, num_experts=0, rms_norm_eps=1e-6,
    max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)

VARIANTS = {
    # Layers DDDA (full_attention_interval 4), every FFN dense.
    "dense": dict(),
    # DADA (layer_types), tied; layer 0 dense (mlp_only_layers), layers 1-3 a
    # mixture of 4 experts, 2 per token renormalised, and a gated shared expert
    # of width 24.
    "moe": dict(layer_types=["linear_attention", "full_attention"] * 2,
                tie_word_embeddings=True, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=16, shared_expert_intermediate_size=24,
                mlp_only_layers=[0], norm_topk_prob=True),
}



@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """{variant: (HF model in eval mode, its save_pretrained directory)}."""
  return hf_parity.saved_variants(tmp_path_factory, transformers.Qwen3NextConfig,
                                  transformers.Qwen3NextForCausalLM, _BASE, VARIANTS)


@pytest.fixture(scope="module")
def imported(hf_dirs):
  return hf_parity.imported(hf_dirs)


def _ids(seed=0):
  return hf_parity.token_ids(VOCAB, seed)


def _max_diffs(hf, cfg, params):
  """Max |diff| of the last hidden states (the final norm's output, HF's
  ``last_hidden_state``) and of the logits."""
  ids = _ids()
  with torch.no_grad():
    out = hf(input_ids=torch.from_numpy(ids.astype(np.int64)))
    want_hidden = hf.model(input_ids=torch.from_numpy(ids.astype(np.int64)))
  want_hidden = want_hidden.last_hidden_state.numpy()
  got, state = build_model(cfg).apply(
      {"params": params}, ids, mutable=["intermediates"],
      capture_intermediates=lambda module, _: module.name == "final_norm")
  hidden = np.asarray(state["intermediates"]["decoder"]["final_norm"]["__call__"][0])
  logits = np.asarray(got["logits"])
  assert logits.shape == out.logits.shape and hidden.shape == want_hidden.shape
  return (float(np.abs(hidden - want_hidden).max()),
          float(np.abs(logits - out.logits.numpy()).max()))


def test_variants_are_imported_as_their_fields(imported):
  dense, moe = imported["dense"][0], imported["moe"][0]
  assert (dense.mixer_pattern, dense.deltanet_heads, dense.deltanet_head_dim,
          dense.deltanet_v_heads, dense.deltanet_v_head_dim, dense.deltanet_conv,
          dense.attention_gate, dense.qk_norm, dense.rope_dims, dense.ffn_type) == (
              "DDDA", 2, 8, 4, 6, 4, "elementwise", "rmsnorm", 2, "dense")
  assert (moe.mixer_pattern, moe.ffn_type, moe.first_dense_layers, moe.num_experts,
          moe.experts_per_token, moe.expert_dim, moe.shared_experts,
          moe.shared_expert_d_ff, moe.shared_expert_gate, moe.tie_embeddings) == (
              "DA", "moe", 1, 4, 2, 16, 1, 24, True, True)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_hidden_states_and_logits_match_transformers(variant, hf_dirs, imported):
  hidden, logits = _max_diffs(hf_dirs[variant][0], *imported[variant])
  print(f"qwen3_next {variant}: max |hidden diff| = {hidden:.2e}, "
        f"max |logit diff| = {logits:.2e}")
  assert hidden <= TOL and logits <= TOL, (variant, hidden, logits)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_cached_greedy_decoding_matches_generate(variant, hf_dirs, imported):
  """Prefill by the chunked rule, then one recurrent step per token, against
  HF's generate with its conv and recurrent states."""
  hf = hf_dirs[variant][0]
  cfg, params = imported[variant]
  hf_parity.assert_greedy_matches_generate(hf, cfg, params, _ids(seed=1), 12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_then_import_is_bit_identical(variant, imported, tmp_path):
  cfg, params = imported[variant]
  hf_parity.assert_round_trip(cfg, params, tmp_path, "qwen3_next")


@pytest.mark.slow
def test_transformers_loads_the_export_to_the_same_model(imported, tmp_path):
  cfg, params = imported["moe"]
  hf_interop.to_hf(cfg, params, tmp_path)
  reloaded = transformers.Qwen3NextForCausalLM.from_pretrained(tmp_path).eval()
  assert max(_max_diffs(reloaded, cfg, params)) <= TOL


def _hf_config(hf_dirs, variant="dense", **changes):
  config = json.loads((hf_dirs[variant][1] / "config.json").read_text())
  config.update(changes)
  return config


@pytest.mark.parametrize("changes,named", [
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(linear_num_value_heads=3), "linear_num_value_heads=3 is not a multiple"),
    (dict(linear_conv_kernel_dim=0), "linear_conv_kernel_dim=0"),
    (dict(layer_types=["linear_attention", "sliding_attention"] * 2), "layer_types"),
    (dict(num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1]),
     "mlp_only_layers=\\[1\\] is not a prefix"),
])
def test_unrepresented_hf_settings_are_refused(changes, named, hf_dirs):
  config = _hf_config(hf_dirs, **changes)
  with pytest.raises(ConfigError, match=named):
    hf_interop.architecture_for(config).model_fields(config)


@pytest.mark.parametrize("change,named", [
    (dict(shared_expert_gate=False), "model.shared_expert_gate=False"),
    (dict(router="sigmoid"), "model.router='sigmoid'"),
    (dict(attention_gate="headwise"), "model.attention_gate='headwise'"),
    (dict(capacity_factor=1.25), "model.capacity_factor=1.25"),
])
def test_unrepresentable_export_names_the_setting(change, named, imported, tmp_path):
  cfg, params = imported["moe"]
  with pytest.raises(ConfigError, match=named):
    hf_interop.to_hf(dataclasses.replace(cfg, **change), params, tmp_path)
  assert not (tmp_path / "config.json").exists()
