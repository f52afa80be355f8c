"""DeepSeek-V3 (``DeepseekV3ForCausalLM``): multi-head latent attention, dense
layers, then mixtures of experts with shared experts and a sigmoid router.

What maps, as transformers' ``modeling_deepseek_v3.py`` computes it:

  attention  ``model.attention_type='mla'`` (model/layers/mla.py): kv_lora_rank
             = mla_kv_rank, q_lora_rank = mla_q_rank (None: 0, one q_proj),
             qk_rope_head_dim = mla_rope_dim, qk_nope_head_dim = mla_nope_dim,
             v_head_dim = mla_v_dim; logits x (d_n + d_R)^-0.5; the latent
             norms' eps 1e-6 (transformers does not pass rms_norm_eps to them)
  RoPE       over the d_R part. ``rope_interleave`` True (transformers' default,
             DeepSeek's checkpoints) pairs dimensions (2i, 2i + 1): the d_R
             rotated output columns of q_b_proj / q_proj (per head) and of
             kv_a_proj_with_mqa are permuted to our halves layout
             (``mla.deinterleave_rope``); False (rotate_half) is ours as it
             is. Exports write the interleaved layout.
  YaRN       transformers multiplies every logit by m(mscale_all_dim)^2 and
             the rotated part's cos and sin by
             m(mscale) / m(mscale_all_dim) (m(x) = 0.1 x ln(factor) + 1);
             our MLA multiplies every logit by m(1)^2 and leaves cos and sin:
             the same where mscale = mscale_all_dim = 1 (DeepSeek-V3's
             config), which exports write. Other values are refused, as are
             the RoPE settings LLaMA's import refuses (fields.rope_fields).
  FFN        the first first_k_dense_replace layers dense (swiglu,
             intermediate_size: ``model.first_dense_layers``), the others
             ``ffn_type='moe'``: n_routed_experts experts moe_intermediate_size
             wide, num_experts_per_tok per token, n_shared_experts shared
             experts (one FFN n_shared_experts x moe_intermediate_size wide,
             as transformers' shared_experts), ``router='sigmoid'``,
             norm_topk_prob as ``router_norm_topk`` (transformers adds 1e-20 to
             the sum: no float32 difference for sums of sigmoids),
             routed_scaling_factor as ``router_scale``, n_group / topk_group as
             ``router_groups`` / ``router_topk_groups`` (every group kept: 1 /
             1, the same choices). e_score_correction_bias is
             ``moe_balance='bias'``'s expert bias: added to the scores to
             choose the experts, never to the weights, in both. Every layer
             dense (first_k_dense_replace >= num_hidden_layers) is
             ``ffn_type='dense'``.

Refused with a ConfigError naming the setting: attention_bias=True (biases on
q_a_proj, kv_a_proj_with_mqa and o_proj but not on the MLP; model.use_bias is
one switch), num_key_value_heads other than num_attention_heads (MLA has no
key/value groups), widths < 1. The multi-token-prediction modules
(num_nextn_predict_layers; a checkpoint's extra layer) are not part of
transformers' model and are not read. On export, a model DeepSeek-V3 cannot
represent (a softmax router, the auxiliary-loss balancing, a capacity, MoE
layers off a dense prefix, biases, ...) names those settings
(hf_interop.export_architecture).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import (HF_GATED_ACTIVATIONS, hf_rope_parameters,
                               model_gated_activation, rope_fields)
from tfx_jax.hf.rules import (Rule, add_dense, add_norm, heads_in, heads_out, linear, same,
                              stacked_linear)
from tfx_jax.model.config import ModelConfig, is_moe_layer
from tfx_jax.model.config_attention import mla_dims
from tfx_jax.model.config_moe import grouped_routing
from tfx_jax.model.layers.mla import deinterleave_rope
from tfx_jax.model.layers.positions import yarn_attention_factor

_ARCH = "deepseek_v3"
# transformers' DeepseekV3Config defaults, for keys a config.json leaves out.
_WIDTHS = (("kv_lora_rank", 512), ("qk_rope_head_dim", 64), ("qk_nope_head_dim", 128),
           ("v_head_dim", 128))
_FFN = (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo"))


# ------------------------------------------------------------------ fields
def _rope(c, longest: int) -> dict:
  """The model.rope_* fields of DeepSeek-V3's RoPE, its softmax scale checked."""
  rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
  ms, ms_all, att = (rope.pop(k, None) for k in ("mscale", "mscale_all_dim",
                                                    "attention_factor"))
  fields = rope_fields({**c, "rope_scaling": None, "rope_parameters": rope}, _ARCH,
                       longest=longest)
  kind = fields["rope_scaling"]
  if kind == "none":  # transformers reads none of the three without a scaling
    return fields
  factor = fields["rope_scaling_factor"]
  m = lambda x: 0.1 * x * math.log(factor) + 1.0 if factor > 1 else 1.0  # yarn_get_mscale
  # transformers: every logit x m(mscale_all_dim)^2 (yarn_apply_mscale, for any
  # rope_type but the default); YaRN's cos and sin x a, so the rotated part's
  # logits x a^2 more (_compute_yarn_parameters).
  every = m(ms_all) ** 2 if ms_all else 1.0
  rotated = 1.0
  if kind == "yarn":
    a = att if att is not None else (m(ms) / m(ms_all) if ms and ms_all else m(1.0))
    rotated = a * a
  ours = yarn_attention_factor(factor) ** 2 if kind == "yarn" else 1.0
  if not (math.isclose(every, ours, rel_tol=1e-12) and math.isclose(rotated, 1.0,
                                                                     rel_tol=1e-12)):
    raise ConfigError(
        f"{_ARCH}: RoPE rope_type={kind!r} with mscale={ms!r}, mscale_all_dim={ms_all!r}, "
        f"attention_factor={att!r} multiplies every attention logit by {every:.6g} "
        f"and the rotated part's by {rotated:.6g} more; model.attention_type='mla' with "
        f"model.rope_scaling={kind!r} multiplies every logit by {ours:.6g} and the "
        "rotated part by 1 (DeepSeek-V3's mscale = mscale_all_dim = 1 with yarn; "
        "none of the three with linear).")
  return fields


def _moe_fields(c, dense_layers: int) -> dict:
  """The ``ffn_type='moe'`` fields of DeepSeek-V3's routed and shared experts."""
  groups, kept = int(c.get("n_group") or 1), int(c.get("topk_group") or 1)
  if kept >= groups:  # every group kept: plain top-k
    groups = kept = 1
  return dict(
      ffn_type="moe", num_experts=int(c.get("n_routed_experts", 256)),
      experts_per_token=int(c.get("num_experts_per_tok") or 8),
      shared_experts=int(c.get("n_shared_experts") or 0),
      expert_d_ff=int(c.get("moe_intermediate_size", 2048)), router="sigmoid",
      router_norm_topk=bool(c.get("norm_topk_prob", True)),
      router_scale=float(c.get("routed_scaling_factor", 2.5)), router_groups=groups,
      router_topk_groups=kept, first_dense_layers=dense_layers, moe_balance="bias")


def deepseek_v3_fields(c, names=None):
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  if c.get("attention_bias", False):
    raise ConfigError(f"{_ARCH}: attention_bias=True puts biases on q_a_proj, "
                      "kv_a_proj_with_mqa and o_proj but not on the MLP; model.use_bias "
                      "is one switch.")
  kv = c.get("num_key_value_heads") or h
  if kv != h:
    raise ConfigError(
        f"{_ARCH}: num_key_value_heads={kv} with num_attention_heads={h}; MLA expands "
        "its latent into one key and value per query head (model.attention_type='mla' "
        "has no key/value groups).")
  widths = {key: c.get(key, default) for key, default in _WIDTHS}
  q_rank = c.get("q_lora_rank", 1536)
  bad = [f"{k}={v!r}" for k, v in dict(widths, q_lora_rank=q_rank).items()
         if (v is None and k != "q_lora_rank") or (v is not None and v < 1)]
  if bad:
    raise ConfigError(f"{_ARCH}: {', '.join(bad)}: MLA's widths must be >= 1 "
                      "(q_lora_rank None: no query compression).")
  dense_layers = int(c.get("first_k_dense_replace", 3) or 0)
  longest = c.get("max_position_embeddings", 4096)
  fields = dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm",
      activation=model_gated_activation(c.get("hidden_act", "silu"), _ARCH),
      position="rope", num_layers=n, d_model=d, num_heads=h, attention_type="mla",
      mla_kv_rank=int(widths["kv_lora_rank"]), mla_q_rank=int(q_rank or 0),
      mla_rope_dim=int(widths["qk_rope_head_dim"]),
      mla_nope_dim=int(widths["qk_nope_head_dim"]), mla_v_dim=int(widths["v_head_dim"]),
      gated_d_ff=c.get("intermediate_size", 18432), vocab_size=c["vocab_size"],
      max_len=longest, tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      use_bias=False, norm_eps=c.get("rms_norm_eps", 1e-6), **_rope(c, longest))
  if dense_layers < n:
    fields.update(_moe_fields(c, dense_layers))
  return fields


def deepseek_v3_config(m: ModelConfig):
  dims = mla_dims(m)
  # A model without RoPE gets DeepSeek's derived rotated width, so that the
  # position shows as a difference (export_architecture).
  rope_dim = dims.rope_dim or mla_dims(dataclasses.replace(m, position="rope")).rope_dim
  moe = m.ffn_type == "moe"
  grouped = moe and grouped_routing(m)
  rope = hf_rope_parameters(m)
  if m.rope_scaling == "yarn":
    rope.update(mscale=1.0, mscale_all_dim=1.0)  # m(1)^2 on every logit, as ours
  return dict(
      model_type=_ARCH, architectures=["DeepseekV3ForCausalLM"],
      hidden_act=HF_GATED_ACTIVATIONS.get(m.activation, "silu"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.num_heads,
      q_lora_rank=dims.q_rank or None, kv_lora_rank=dims.kv_rank,
      qk_rope_head_dim=rope_dim, qk_nope_head_dim=dims.nope_dim,
      v_head_dim=dims.v_dim, intermediate_size=m.ffn_dim,
      moe_intermediate_size=m.expert_dim,
      first_k_dense_replace=m.first_dense_layers if moe else m.num_layers,
      n_routed_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
      n_shared_experts=m.shared_experts, norm_topk_prob=m.router_norm_topk,
      routed_scaling_factor=m.router_scale,
      n_group=m.router_groups if grouped else 1,
      topk_group=m.router_topk_groups if grouped else 1,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      tie_word_embeddings=m.tie_embeddings, rms_norm_eps=m.norm_eps,
      attention_bias=False, rope_interleave=True, rope_parameters=rope,
      output_router_logits=False)


# ------------------------------------------------------------------ weights
def _columns(before: int, rope_dim: int, interleave: bool) -> np.ndarray:
  """Our column j of a [before | rotated] output is transformers' column
  order[j]: the rotated part de-interleaved (``interleave``) or as it is."""
  rotated = deinterleave_rope(rope_dim) if interleave else np.arange(rope_dim)
  return np.concatenate([np.arange(before), before + rotated])


def _permuted_linear(hf, tfx, order):
  """torch Linear [out, in] <-> Dense kernel [in, out], the outputs in ``order``."""
  back = np.argsort(order)
  return Rule(hf, (tfx,), lambda w: (w.T[:, order],), lambda x: x[:, back].T)


def _permuted_heads_in(hf, tfx, heads, order):
  """torch Linear [H K, D] <-> kernel [D, H, K], each head's K outputs in ``order``."""
  back = np.argsort(order)
  return Rule(hf, (tfx,), lambda w: (w.T.reshape(w.shape[1], heads, -1)[..., order],),
              lambda x: x[..., back].reshape(x.shape[0], -1).T)


def _attention_rules(r: list[Rule], hf: str, t: str, m: ModelConfig, interleave: bool):
  dims, h = mla_dims(m), m.num_heads
  q_columns = _columns(dims.nope_dim, dims.rope_dim, interleave)
  if dims.q_rank:
    r.append(linear(f"{hf}.q_a_proj.weight", f"{t}/q_a_proj/kernel"))
    add_norm(r, f"{hf}.q_a_layernorm", f"{t}/q_a_layernorm", bias=False)
    r.append(_permuted_heads_in(f"{hf}.q_b_proj.weight", f"{t}/q_b_proj/kernel", h,
                                q_columns))
  else:
    r.append(_permuted_heads_in(f"{hf}.q_proj.weight", f"{t}/q_proj/kernel", h, q_columns))
  r.append(_permuted_linear(f"{hf}.kv_a_proj_with_mqa.weight",
                            f"{t}/kv_a_proj_with_mqa/kernel",
                            _columns(dims.kv_rank, dims.rope_dim, interleave)))
  add_norm(r, f"{hf}.kv_a_layernorm", f"{t}/kv_a_layernorm", bias=False)
  # Per head [k_nope | v], as transformers splits kv_b_proj's view(..., H, N + V).
  r.append(heads_in(f"{hf}.kv_b_proj.weight", f"{t}/kv_b_proj/kernel", h))
  r.append(heads_out(f"{hf}.o_proj.weight", f"{t}/out/kernel", h))


def _moe_rules(r: list[Rule], hf: str, t: str, m: ModelConfig):
  """Router, expert bias, routed experts (stacked) and shared experts of ``<hf>.mlp``."""
  r.append(linear(f"{hf}.gate.weight", f"{t}/router/kernel"))
  r.append(same(f"{hf}.gate.e_score_correction_bias", f"{t}/expert_bias"))
  for name, ours in _FFN:
    r.append(stacked_linear([f"{hf}.experts.{j}.{name}.weight"
                             for j in range(m.num_experts)], f"{t}/{ours}/kernel"))
    if m.shared_experts:
      add_dense(r, f"{hf}.shared_experts.{name}", f"{t}/shared/{ours}", bias=False)


def _rules(m: ModelConfig, interleave: bool):
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    _attention_rules(r, f"{hf}.self_attn", f"{t}/self_attention", m, interleave)
    if is_moe_layer(i, m.ffn_type, m.moe_every, m.first_dense_layers):
      _moe_rules(r, f"{hf}.mlp", f"{t}/ffn", m)
    else:
      for name, ours in _FFN:
        add_dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", bias=False)
    add_norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm", bias=False)
    add_norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm", bias=False)
  add_norm(r, "model.norm", "decoder/final_norm", bias=False)
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


def deepseek_v3_rules(m: ModelConfig):
  """The weights in DeepSeek's interleaved RoPE layout (what exports write)."""
  return _rules(m, interleave=True)


def deepseek_v3_checkpoint_rules(m: ModelConfig, c: dict):
  """The weights of a checkpoint of config ``c``: its ``rope_interleave``
  (transformers' default True; None or False: rotate_half, our layout)."""
  return _rules(m, interleave=bool(c.get("rope_interleave", True)))
