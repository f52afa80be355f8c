"""LLaMA, Qwen3 (LLaMA with per-head query and key norms) and Gemma 2
(sandwich norms with HF's 1 + w gains, soft-caps, alternating sliding layers)."""

from __future__ import annotations

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import (FULL, HF_GATED_ACTIVATIONS, SLIDING, hf_layer_types,
                               hf_rope_parameters, model_gated_activation, model_head_dim,
                               rope_fields, window_fields)
from tfx_jax.hf.rules import Rule, add_attention, add_dense, add_norm, linear, same
from tfx_jax.model.config import ModelConfig


# --------------------------------------------------------------- LLaMA
def llama_fields(c, names=None):
  h, d = c["num_attention_heads"], c["hidden_size"]
  if c.get("attention_bias") != c.get("mlp_bias", False):
    raise ConfigError("llama: attention_bias and mlp_bias differ; model.use_bias is one switch.")
  longest = c.get("max_position_embeddings", 2048)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm",
      activation={"silu": "swiglu"}.get(c.get("hidden_act", "silu"), "unsupported"),
      position="rope", num_layers=c["num_hidden_layers"], d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=model_head_dim(c.get("head_dim"), d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      use_bias=bool(c.get("attention_bias", False)), norm_eps=c["rms_norm_eps"],
      **rope_fields(c, "llama", longest=longest))


def llama_config(m: ModelConfig):
  return dict(
      model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=m.use_bias, mlp_bias=m.use_bias, rms_norm_eps=m.norm_eps,
      rope_parameters=hf_rope_parameters(m))


def llama_rules(m: ModelConfig, *, qk_norm: bool = False):
  """LLaMA's weights; with ``qk_norm`` Qwen3's too (q_norm, k_norm: one gain per
  head dimension, shared by the heads, as query_norm and key_norm)."""
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    add_attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
               ("q_proj", "k_proj", "v_proj", "o_proj"), m.use_bias)
    if qk_norm:
      add_norm(r, f"{hf}.self_attn.q_norm", f"{t}/self_attention/query_norm", bias=False)
      add_norm(r, f"{hf}.self_attn.k_norm", f"{t}/self_attention/key_norm", bias=False)
    for name, ours in (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo")):
      add_dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", m.use_bias)
    add_norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm", bias=False)
    add_norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm", bias=False)
  add_norm(r, "model.norm", "decoder/final_norm", bias=False)
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


# --------------------------------------------------------------- Qwen3
def qwen3_fields(c, names=None):
  if c.get("attention_bias", False):
    raise ConfigError("qwen3: attention_bias=True puts biases on q, k, v and o but not "
                      "on the MLP; model.use_bias is one switch.")
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  # As Qwen3Config: sliding_window counts only with use_sliding_window, and
  # without layer_types the layers from max_window_layers on are the sliding ones.
  window = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
  layer_types = c.get("layer_types") or [
      SLIDING if window is not None and i >= c.get("max_window_layers", 28) else FULL
      for i in range(n)]
  longest = c.get("max_position_embeddings", 32768)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm", qk_norm="rmsnorm",
      activation=model_gated_activation(c.get("hidden_act", "silu"), "qwen3"),
      position="rope", num_layers=n, d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=model_head_dim(c.get("head_dim", 128), d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=False,
      norm_eps=c.get("rms_norm_eps", 1e-6),
      **window_fields("qwen3", layer_types, window, n),
      **rope_fields(c, "qwen3", longest=longest))


def qwen3_config(m: ModelConfig):
  layer_types = hf_layer_types(m)
  windowed = SLIDING in layer_types
  return dict(
      model_type="qwen3", architectures=["Qwen3ForCausalLM"],
      hidden_act=HF_GATED_ACTIVATIONS.get(m.activation, "silu"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=False, rms_norm_eps=m.norm_eps, rope_parameters=hf_rope_parameters(m),
      use_sliding_window=windowed,
      sliding_window=m.attention_window if windowed else None,
      max_window_layers=0 if windowed else m.num_layers, layer_types=layer_types)


def qwen3_rules(m: ModelConfig):
  """LLaMA's weights with Qwen3's per-head query and key norms."""
  return llama_rules(m, qk_norm=True)


# -------------------------------------------------------------- Gemma 2
def gemma2_fields(c, names=None):
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  for key in ("attention_bias", "use_bidirectional_attention"):
    if c.get(key):
      raise ConfigError(f"gemma2: {key}={c[key]!r} has no model.* equivalent.")
  width = c.get("head_dim", 256)
  # Queries are scaled by query_pre_attn_scalar^-0.5; model.* scales attention
  # logits by the head width's (scale_attention_logits).
  scalar = c.get("query_pre_attn_scalar", 256)
  if scalar != width:
    raise ConfigError(
        f"gemma2: query_pre_attn_scalar={scalar} scales attention logits by "
        f"{scalar}^-0.5, not by head_dim^-0.5 = {width}^-0.5 (the only scaling "
        "model.scale_attention_logits has).")
  cap = lambda key, default: float(c.get(key, default) or 0.0)  # None: off
  # Without layer_types, Gemma2Config alternates: layer 0 sliding, layer 1 full, ...
  layer_types = c.get("layer_types") or [
      SLIDING if (i + 1) % 2 else FULL for i in range(n)]
  longest = c.get("max_position_embeddings", 8192)
  return dict(
      family="decoder_only", norm_position="sandwich", norm_type="rmsnorm",
      activation=model_gated_activation(c.get("hidden_activation", "gelu_pytorch_tanh"),
                                        "gemma2"),
      position="rope", num_layers=n, d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h, head_dim=model_head_dim(width, d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", True)),
      # Gemma2TextScaledWordEmbedding: x hidden_size^0.5, as model.embed_scale.
      scale_embeddings=True, use_bias=False, norm_eps=c.get("rms_norm_eps", 1e-6),
      attention_logit_softcap=cap("attn_logit_softcapping", 50.0),
      final_logit_softcap=cap("final_logit_softcapping", 30.0),
      **window_fields("gemma2", layer_types, c.get("sliding_window", 4096), n),
      **rope_fields(c, "gemma2", longest=longest))


def gemma2_config(m: ModelConfig):
  return dict(
      model_type="gemma2", architectures=["Gemma2ForCausalLM"],
      hidden_activation=HF_GATED_ACTIVATIONS.get(m.activation, "gelu_pytorch_tanh"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, query_pre_attn_scalar=m.attention_head_dim,
      intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=False, rms_norm_eps=m.norm_eps, rope_parameters=hf_rope_parameters(m),
      attn_logit_softcapping=m.attention_logit_softcap or None,
      final_logit_softcapping=m.final_logit_softcap or None,
      # HF builds the sliding mask whether or not a layer reads it, so a window
      # is always named (HF's default where no layer is windowed).
      sliding_window=m.attention_window or 4096, layer_types=hf_layer_types(m))


def gemma_norm(hf, tfx):
  """Gemma's RMSNorm gain w, applied as x_normed * (1 + w) <-> our gain s = 1 + w.

  Imported as s = float32(1 + w) computed in float64, which is HF's float32
  1 + w (one rounding either way); exported as w = s - 1 in float32, exact for
  every s >= 0.5 (Sterbenz's lemma below 2, a multiple of s's ulp above), so
  that export -> import gives s back bit for bit and HF's 1 + w is s again. A
  gain below 0.5 comes back rounded to float32 near 1 (within 2^-24 for |s| < 1).
  """
  return Rule(hf, (tfx,), lambda w: ((w.astype(np.float64) + 1.0).astype(np.float32),),
              lambda s: (s - np.float32(1.0)).astype(np.float32))


# (HF's norm, ours) of a Gemma 2 layer: sandwich norms around each sublayer.
_GEMMA2_NORMS = (("input_layernorm", "self_attention_norm"),
                 ("post_attention_layernorm", "self_attention_post_norm"),
                 ("pre_feedforward_layernorm", "ffn_norm"),
                 ("post_feedforward_layernorm", "ffn_post_norm"))


def gemma2_rules(m: ModelConfig):
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    add_attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
               ("q_proj", "k_proj", "v_proj", "o_proj"), False)
    for name, ours in (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo")):
      add_dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", bias=False)
    for name, ours in _GEMMA2_NORMS:
      r.append(gemma_norm(f"{hf}.{name}.weight", f"{t}/{ours}/scale"))
  r.append(gemma_norm("model.norm.weight", "decoder/final_norm/scale"))
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r
