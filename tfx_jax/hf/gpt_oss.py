"""gpt-oss (``GptOssForCausalLM``): GQA attention with a learned sink per head,
sliding and full layers alternating, and a mixture of experts with biases and
a clamped SwiGLU in every layer.

What maps, as transformers' ``modeling_gpt_oss.py`` computes it:

  attention  q, k, v and o_proj with biases (attention_bias, as
             ``model.use_bias``), GQA, head_dim of its own, logits x
             head_dim^-0.5; ``sinks`` [H] is ``model.attention_sinks``'s
             parameter: one logit per head in every softmax's denominator,
             after the mask (eager_attention_forward, transformers' default
             here, which concatenates it to the logits and drops its column)
  windows    layer_types (default: layer 0 sliding, 1 full, ...) as
             ``model.attention_window`` = sliding_window with
             ``model.global_every`` (fields.window_fields)
  RoPE       rope (half-split, rotate_half), default rope_theta 150000 and
             YaRN 32x from 4096 with ``truncate`` False: the ramp's ends are
             left unrounded (``model.rope_yarn_truncate``); cos and sin x
             0.1 ln(factor) + 1, as ``model.rope_scaling='yarn'``
  router     ``router.weight`` [E, D] and ``router.bias`` [E]
             (``model.router_use_bias``); the top k of the logits, a softmax
             over those k: ``router='softmax'`` with ``router_norm_topk``
             (the softmax over all E experts renormalised over its top k is
             the same number)
  experts    ``model.activation='swiglu_oss'`` (model/layers/ffn.py) with
             swiglu_limit and swiglu_alpha; ``gate_up_proj`` [E, D, 2F] holds
             each expert's gate and up columns interleaved (gate 2j, up 2j + 1),
             split into ``wi`` and ``wv`` [E, D, F] and their biases
             (``gate_up_proj_bias`` [E, 2F]); ``down_proj`` [E, F, D] and
             ``down_proj_bias`` [E, D] are ``wo``'s as they are
  norms      pre, rmsnorm (rms_norm_eps), untied lm_head or tied

Refused with a ConfigError naming the setting: attention_bias=False (the
router and experts keep their biases; ``model.use_bias`` is one switch), a
layer_types pattern ``model.global_every`` cannot express, and the RoPE
settings LLaMA's import refuses (fields.rope_fields). ``hidden_act`` is read
by no module of transformers' model and is not carried; neither are
router_aux_loss_coef and output_router_logits (training only). On export, a
model gpt-oss cannot represent (no sinks, no router bias, another
activation, a dense layer, shared experts, ...) names those settings
(hf_interop.export_architecture).
"""

from __future__ import annotations

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import (FULL, SLIDING, hf_layer_types, hf_rope_parameters,
                               model_head_dim, rope_fields, window_fields)
from tfx_jax.hf.rules import Rule, add_attention, add_dense, add_norm, linear, same
from tfx_jax.model.config import ModelConfig

_ARCH = "gpt_oss"
# GptOssConfig's RoPE where config.json names none (its __post_init__).
_DEFAULT_THETA = 150000.0
_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                 "truncate": False, "original_max_position_embeddings": 4096}


# ------------------------------------------------------------------ fields
def gpt_oss_fields(c, names=None):
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  if not c.get("attention_bias", True):
    raise ConfigError(f"{_ARCH}: attention_bias=False leaves the router and the experts "
                      "their biases; model.use_bias is one switch.")
  # As GptOssConfig: without layer_types, layer 0 sliding, layer 1 full, ...
  layer_types = c.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
  if not (c.get("rope_parameters") or c.get("rope_scaling")):
    c = dict(c, rope_parameters=_DEFAULT_ROPE)
  longest = c.get("max_position_embeddings", 131072)
  width = int(c.get("intermediate_size", 2880))
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm",
      activation="swiglu_oss", swiglu_limit=float(c.get("swiglu_limit", 7.0)),
      swiglu_alpha=float(c.get("swiglu_alpha", 1.702)), position="rope",
      num_layers=n, d_model=d, num_heads=h, num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=model_head_dim(c.get("head_dim", 64), d, h), gated_d_ff=width,
      expert_d_ff=width, vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=True,
      norm_eps=c.get("rms_norm_eps", 1e-5), attention_sinks=True, ffn_type="moe",
      num_experts=int(c.get("num_local_experts", c.get("num_experts", 128))),
      experts_per_token=int(c.get("num_experts_per_tok", 4)), router="softmax",
      router_norm_topk=True, router_use_bias=True, moe_balance="aux_loss",
      **window_fields(_ARCH, layer_types, c.get("sliding_window", 128), n),
      **rope_fields({**c, "rope_theta": c.get("rope_theta", _DEFAULT_THETA)}, _ARCH,
                    longest=longest))


def gpt_oss_config(m: ModelConfig):
  return dict(
      model_type=_ARCH, architectures=["GptOssForCausalLM"],
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.expert_dim,
      num_local_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      tie_word_embeddings=m.tie_embeddings, rms_norm_eps=m.norm_eps, attention_bias=True,
      swiglu_limit=m.swiglu_limit, swiglu_alpha=m.swiglu_alpha,
      # transformers builds the sliding mask whether or not a layer reads it, so
      # a window is always named (GptOssConfig's default where none is used).
      sliding_window=m.attention_window or 128, layer_types=hf_layer_types(m),
      rope_parameters=hf_rope_parameters(m), output_router_logits=False)


# ------------------------------------------------------------------ weights
def _interleaved(hf, gate, up):
  """gpt-oss's [..., 2F] gate/up tensor (gate column 2j, up 2j + 1) <-> two [..., F]."""
  def join(g, u):
    return np.stack([g, u], axis=-1).reshape(*g.shape[:-1], -1)
  return Rule(hf, (gate, up), lambda w: (w[..., 0::2], w[..., 1::2]), join)


def _moe_rules(r: list[Rule], hf: str, t: str):
  """Router (weight and bias) and the experts of ``<hf>`` = ``model.layers.<i>.mlp``."""
  add_dense(r, f"{hf}.router", f"{t}/router", bias=True)
  e = f"{hf}.experts"
  r.append(_interleaved(f"{e}.gate_up_proj", f"{t}/wi/kernel", f"{t}/wv/kernel"))
  r.append(_interleaved(f"{e}.gate_up_proj_bias", f"{t}/wi/bias", f"{t}/wv/bias"))
  # Stored [E, in, out] (transformers' is_transposed experts), as our kernels.
  r.append(same(f"{e}.down_proj", f"{t}/wo/kernel"))
  r.append(same(f"{e}.down_proj_bias", f"{t}/wo/bias"))


def gpt_oss_rules(m: ModelConfig):
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    add_attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
                  ("q_proj", "k_proj", "v_proj", "o_proj"), True)
    r.append(same(f"{hf}.self_attn.sinks", f"{t}/self_attention/sinks"))
    _moe_rules(r, f"{hf}.mlp", f"{t}/ffn")
    add_norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm", bias=False)
    add_norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm", bias=False)
  add_norm(r, "model.norm", "decoder/final_norm", bias=False)
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r
