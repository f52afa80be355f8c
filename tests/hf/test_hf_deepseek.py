"""DeepSeek-V3 (tfx_jax/hf/deepseek.py): logits and greedy-decoding parity with
transformers' ``DeepseekV3ForCausalLM``, export -> import bit-identity, and the
settings refused both ways.

Each variant is a tiny random HF model (d_model 32, 4 heads, vocab 100, latent
ranks 16 and 12, heads of 8 + 4 rotated query/key and 6 value dimensions) with
every parameter moved off its initial value, the routers' expert-score
correction bias too, so that a wrong mapping, or a token routed to another
expert, shows in the logits. The pattern is tests/hf/test_hf_convert.py's.
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

from tfx_jax import convert  # noqa: E402
from tfx_jax.core.errors import ConfigError  # noqa: E402
from tfx_jax.model.families import build_model  # noqa: E402
from tfx_jax.run import hf_interop  # noqa: E402
import hf_parity  # noqa: E402  (tests/)

VOCAB, D, HEADS = 100, 32, 4
# float32 throughout (the measured maxima are in docs/huggingface.md).
TOL = 1e-4

_BASE = dict(
    vocab_size=VOCAB, hidden_size=D, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=HEADS,
    kv_lora_rank=16, q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
    first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
    routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True,
    rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2)

VARIANTS = {
    # MLA with query compression (q_a_proj, q_a_layernorm, q_b_proj), every
    # layer dense; DeepSeek's interleaved RoPE (transformers' default).
    "dense": dict(),
    # No query compression (one q_proj, DeepSeek-V2-Lite's), rotate_half RoPE, tied.
    "dense_q_proj": dict(q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True),
    # 3 layers, the first dense, then MoE: 4 routed experts, 2 per token, 1
    # shared, the top 2 renormalised and x 2.5 (routed_scaling_factor).
    "moe": dict(num_hidden_layers=3, first_k_dense_replace=1),
    # Every layer MoE, group-limited: 8 experts in 4 groups of which the best 2
    # are kept, 3 per token, 2 shared, the raw scores x 1.5; no query
    # compression; YaRN 4x from a context of 8 with DeepSeek-V3's mscale =
    # mscale_all_dim = 1. Inputs of 10 tokens, decoded to 22.
    "moe_groups_yarn": dict(
        first_k_dense_replace=0, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=3, n_shared_experts=2, norm_topk_prob=False,
        routed_scaling_factor=1.5, q_lora_rank=None, max_position_embeddings=32,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                         "original_max_position_embeddings": 8, "mscale": 1.0,
                         "mscale_all_dim": 1.0}),
}


def _perturb(model, seed):
  """Moves every parameter and the routers' e_score_correction_bias off its init."""
  g = hf_parity.perturb(model, seed)
  with torch.no_grad():
    for name, b in model.named_buffers():
      if name.endswith("e_score_correction_bias"):
        b.add_(0.2 * torch.randn(b.shape, generator=g))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """{variant: (HF model in eval mode, its save_pretrained directory)}."""
  return hf_parity.saved_variants(tmp_path_factory, transformers.DeepseekV3Config,
                                  transformers.DeepseekV3ForCausalLM, _BASE, VARIANTS,
                                  move=_perturb)


@pytest.fixture(scope="module")
def imported(hf_dirs):
  return hf_parity.imported(hf_dirs)


def _ids(seed=0):
  return hf_parity.token_ids(VOCAB, seed)


def _logits(hf, cfg, params):
  ids = _ids()
  with torch.no_grad():
    want = hf(input_ids=torch.from_numpy(ids.astype(np.int64))).logits.numpy()
  got = np.asarray(build_model(cfg).apply({"params": params}, ids)["logits"])
  return got, want


def _max_diff(hf, cfg, params):
  got, want = _logits(hf, cfg, params)
  assert got.shape == want.shape
  return float(np.abs(got - want).max())


def test_variants_are_imported_as_their_fields(imported):
  dense, q_proj, moe, groups = (imported[v][0] for v in VARIANTS)
  assert (dense.attention_type, dense.mla_kv_rank, dense.mla_q_rank, dense.mla_rope_dim,
          dense.mla_nope_dim, dense.mla_v_dim, dense.ffn_type, dense.tie_embeddings) == (
              "mla", 16, 12, 4, 8, 6, "dense", False)
  assert (q_proj.mla_q_rank, q_proj.tie_embeddings) == (0, True)
  assert (moe.ffn_type, moe.first_dense_layers, moe.num_experts, moe.experts_per_token,
          moe.shared_experts, moe.expert_dim, moe.ffn_dim, moe.router, moe.moe_balance,
          moe.router_norm_topk, moe.router_scale, moe.router_groups) == (
              "moe", 1, 4, 2, 1, 16, 48, "sigmoid", "bias", True, 2.5, 1)
  assert (groups.first_dense_layers, groups.num_experts, groups.router_groups,
          groups.router_topk_groups, groups.router_norm_topk, groups.router_scale,
          groups.rope_scaling, groups.rope_scaling_factor, groups.rope_original_max_len) == (
              0, 8, 4, 2, False, 1.5, "yarn", 4.0, 8)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_logits_match_transformers(variant, hf_dirs, imported):
  diff = _max_diff(hf_dirs[variant][0], *imported[variant])
  print(f"deepseek_v3 {variant}: max |logit diff| = {diff:.2e}")
  assert diff <= TOL, f"{variant}: max |logit diff| {diff:.3g} > {TOL}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.slow
def test_cached_greedy_decoding_matches_generate(variant, hf_dirs, imported):
  hf = hf_dirs[variant][0]
  cfg, params = imported[variant]
  hf_parity.assert_greedy_matches_generate(hf, cfg, params, _ids(seed=1), 12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_export_then_import_is_bit_identical(variant, hf_dirs, imported, tmp_path):
  hf = hf_dirs[variant][0]
  cfg, params = imported[variant]
  hf_parity.assert_round_trip(cfg, params, tmp_path, "deepseek_v3")
  # ... and transformers loads the export (interleaved RoPE) to the same model.
  reloaded = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp_path).eval()
  assert reloaded.config.rope_interleave
  assert _max_diff(reloaded, cfg, params) <= TOL


@pytest.mark.parametrize("variant,change", [
    ("moe", "expert_bias"),  # the correction bias chooses experts
    ("moe", dict(router_scale=1.0)),
    ("moe_groups_yarn", dict(router_groups=1, router_topk_groups=1)),
    ("moe_groups_yarn", dict(rope_scaling="none", rope_scaling_factor=1.0,
                             rope_original_max_len=0)),
], ids=["expert_bias", "router_scale", "router_groups", "yarn"])
@pytest.mark.slow
def test_each_routing_and_rope_setting_matters(variant, change, hf_dirs, imported):
  """On these inputs, leaving out the expert bias, routed_scaling_factor, the
  group limit or YaRN moves the logits far beyond the tolerance: the parity
  above checks each of them."""
  cfg, params = imported[variant]
  if change == "expert_bias":
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if "expert_bias" in str(path) else x, params)
  else:
    cfg = dataclasses.replace(cfg, **change)
  assert _max_diff(hf_dirs[variant][0], cfg, params) > 100 * TOL


def _hf_config(hf_dirs, variant="dense", **changes):
  config = json.loads((hf_dirs[variant][1] / "config.json").read_text())
  config.update(changes)
  return config


_YARN = dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
             original_max_position_embeddings=8)


@pytest.mark.parametrize("changes,named", [
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(num_key_value_heads=2), "num_key_value_heads=2"),
    (dict(v_head_dim=0), "v_head_dim=0"),
    (dict(hidden_act="quick_gelu"), "activation 'quick_gelu'"),
    # transformers' own defaults: YaRN's factor on the rotated part only.
    (dict(rope_parameters=_YARN), "mscale=None, mscale_all_dim=None"),
    (dict(rope_parameters=dict(_YARN, mscale=1.0, mscale_all_dim=0.707)),
     "mscale=1.0, mscale_all_dim=0.707"),
    (dict(rope_parameters=dict(_YARN, mscale=1.0, mscale_all_dim=1.0,
                               attention_factor=1.2)), "attention_factor=1.2"),
    (dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0,
                               mscale_all_dim=1.0)), "rope_type='linear'"),
    (dict(rope_parameters=dict(_YARN, mscale=1.0, mscale_all_dim=1.0, beta_fast=16)),
     "beta_fast=16"),
])
def test_unrepresented_hf_settings_are_refused(changes, named, hf_dirs):
  config = _hf_config(hf_dirs, **changes)
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.architecture_for(config).model_fields(config)


def test_every_group_kept_is_plain_top_k(hf_dirs):
  """n_group = topk_group keeps every group: the choices of plain top-k, imported
  as one group (as transformers computes it, the mask is all ones)."""
  config = _hf_config(hf_dirs, "moe_groups_yarn", n_group=4, topk_group=4)
  fields = hf_interop.architecture_for(config).model_fields(config)
  assert (fields["router_groups"], fields["router_topk_groups"]) == (1, 1)


def test_a_refused_checkpoint_exits_2_naming_the_setting(hf_dirs, tmp_path, capsys):
  src = hf_dirs["dense"][1]
  bad = tmp_path / "hf"
  bad.mkdir()
  (bad / "config.json").write_text(json.dumps(_hf_config(hf_dirs, attention_bias=True)))
  (bad / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
  assert convert.main(["from-hf", "--hf-dir", str(bad), "--workdir",
                       str(tmp_path / "run")]) == 2
  assert "attention_bias=True" in capsys.readouterr().err


@pytest.mark.parametrize("change,named", [
    (dict(router="softmax"), "model.router='softmax'"),
    (dict(moe_balance="aux_loss"), "model.moe_balance=False"),
    (dict(capacity_factor=1.25), "model.capacity_factor=1.25"),
    (dict(moe_every=2), "model.moe_every=2"),
    (dict(use_bias=True), "model.use_bias=True"),
    (dict(attention_logit_softcap=5.0), "model.attention_logit_softcap=5.0"),
])
def test_unrepresentable_export_names_the_setting(change, named, imported, tmp_path):
  cfg, params = imported["moe"]
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.to_hf(dataclasses.replace(cfg, **change), params, tmp_path)
  assert not (tmp_path / "config.json").exists()
