"""GPT-2 (Conv1D weights, fused c_attn) and GPT-NeoX (parallel block, partial
RoPE, per-head fused query_key_value)."""

from __future__ import annotations

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import HF_ACTIVATIONS, hf_rope_parameters, model_activation, rope_fields
from tfx_jax.hf.rules import Rule, add_dense, add_norm, heads_out, linear, same
from tfx_jax.model.config import ModelConfig


# --------------------------------------------------------------- GPT-2
def gpt2_fields(c, names=None):
  for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                  ("reorder_and_upcast_attn", False)):
    if c.get(key, ok) != ok:
      raise ConfigError(f"gpt2: {key}={c[key]} has no model.* equivalent.")
  d = c["n_embd"]
  return dict(
      family="decoder_only", norm_position="pre", norm_type="layernorm",
      activation=model_activation(c.get("activation_function", "gelu_new"), "gpt2"),
      position="learned", num_layers=c["n_layer"], d_model=d, num_heads=c["n_head"],
      d_ff=c.get("n_inner") or 4 * d, vocab_size=c["vocab_size"],
      max_len=c["n_positions"], tie_embeddings=bool(c.get("tie_word_embeddings", True)),
      use_bias=True, norm_eps=c.get("layer_norm_epsilon", 1e-5))


def gpt2_config(m: ModelConfig):
  return dict(
      model_type="gpt2", architectures=["GPT2LMHeadModel"],
      activation_function=HF_ACTIVATIONS.get(m.activation, "gelu_new"),
      n_layer=m.num_layers, n_embd=m.d_model, n_head=m.num_heads, n_inner=m.ffn_dim,
      vocab_size=m.vocab_size, n_positions=m.max_len,
      tie_word_embeddings=m.tie_embeddings, layer_norm_epsilon=m.norm_eps,
      # GPT-2's <|endoftext|> is the last id (50256).
      bos_token_id=m.vocab_size - 1, eos_token_id=m.vocab_size - 1)


def _gpt2_qkv(hf, t, m):
  d, h = m.d_model, m.num_heads
  names = [f"{t}/self_attention/{n}/kernel" for n in ("query", "key", "value")]
  biases = [f"{t}/self_attention/{n}/bias" for n in ("query", "key", "value")]
  # Conv1D: weight [in, out]; c_attn's out is [q | k | v].
  w = Rule(f"{hf}.attn.c_attn.weight", tuple(names),
           lambda w: tuple(x.reshape(d, h, -1) for x in np.split(w, 3, axis=1)),
           lambda *xs: np.concatenate([x.reshape(d, -1) for x in xs], axis=1))
  b = Rule(f"{hf}.attn.c_attn.bias", tuple(biases),
           lambda b: tuple(x.reshape(h, -1) for x in np.split(b, 3)),
           lambda *xs: np.concatenate([x.reshape(-1) for x in xs]))
  return [w, b]


def gpt2_rules(m: ModelConfig):
  r = [same("transformer.wte.weight", "embedding/embedding"),
       same("transformer.wpe.weight", "positions/embedding")]
  h = m.num_heads
  for i in range(m.num_layers):
    hf, t = f"transformer.h.{i}", f"decoder/layer_{i}"
    r += _gpt2_qkv(hf, t, m)
    r.append(Rule(f"{hf}.attn.c_proj.weight", (f"{t}/self_attention/out/kernel",),
                  lambda w: (w.reshape(h, -1, w.shape[1]),),
                  lambda x: x.reshape(-1, x.shape[-1])))
    r.append(same(f"{hf}.attn.c_proj.bias", f"{t}/self_attention/out/bias"))
    for name, ours in (("c_fc", "wi"), ("c_proj", "wo")):  # Conv1D: [in, out] already
      r.append(same(f"{hf}.mlp.{name}.weight", f"{t}/ffn/{ours}/kernel"))
      r.append(same(f"{hf}.mlp.{name}.bias", f"{t}/ffn/{ours}/bias"))
    add_norm(r, f"{hf}.ln_1", f"{t}/self_attention_norm")
    add_norm(r, f"{hf}.ln_2", f"{t}/ffn_norm")
  add_norm(r, "transformer.ln_f", "decoder/final_norm")
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


# ------------------------------------------------------------ GPT-NeoX
def gpt_neox_fields(c, names=None):
  # HF's MLP always has biases; attention_bias switches those of attention only.
  if not c.get("attention_bias", True):
    raise ConfigError("gpt_neox: attention_bias=False drops the attention biases but "
                      "keeps the MLP's; model.use_bias is one switch.")
  longest = c.get("max_position_embeddings", 2048)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="layernorm",
      activation=model_activation(c.get("hidden_act", "gelu"), "gpt_neox"), position="rope",
      # use_parallel_residual: x + Attn(N1(x)) + MLP(N2(x)); else sequential.
      block="parallel" if c.get("use_parallel_residual", True) else "sequential",
      num_layers=c["num_hidden_layers"], d_model=c["hidden_size"],
      num_heads=c["num_attention_heads"], d_ff=c["intermediate_size"],
      vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=True,
      norm_eps=c.get("layer_norm_eps", 1e-5),
      # rotary_pct (HF's default 0.25) of each head rotated, rotary_emb_base.
      **rope_fields(c, "gpt_neox", longest=longest, partial=True,
                     base_key="rotary_emb_base", fraction_key="rotary_pct",
                     fraction_default=0.25))


def gpt_neox_config(m: ModelConfig):
  return dict(
      model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"],
      hidden_act=HF_ACTIVATIONS.get(m.activation, "gelu"),
      use_parallel_residual=m.block == "parallel", num_hidden_layers=m.num_layers,
      hidden_size=m.d_model, num_attention_heads=m.num_heads,
      intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=True, layer_norm_eps=m.norm_eps,
      rope_parameters=hf_rope_parameters(m, partial=True))


def _gpt_neox_qkv(hf, t, heads):
  """query_key_value, a torch Linear [3 H K, D] whose output HF views as
  [H, 3 K] and splits per head into q | k | v: rows laid out [H, 3, K] (not
  GPT-2's [3, H, K]) <-> query, key, value kernels [D, H, K], biases [H, K]."""
  kernels = tuple(f"{t}/self_attention/{n}/kernel" for n in ("query", "key", "value"))
  biases = tuple(f"{t}/self_attention/{n}/bias" for n in ("query", "key", "value"))
  w = Rule(f"{hf}.query_key_value.weight", kernels,
           lambda w: tuple(w.reshape(heads, 3, -1, w.shape[1])[:, j].transpose(2, 0, 1)
                           for j in range(3)),
           lambda *xs: np.stack([x.transpose(1, 2, 0) for x in xs], axis=1).reshape(
               -1, xs[0].shape[0]))
  b = Rule(f"{hf}.query_key_value.bias", biases,
           lambda b: tuple(b.reshape(heads, 3, -1)[:, j] for j in range(3)),
           lambda *xs: np.stack(xs, axis=1).reshape(-1))
  return [w, b]


def gpt_neox_rules(m: ModelConfig):
  r = [same("gpt_neox.embed_in.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"gpt_neox.layers.{i}", f"decoder/layer_{i}"
    r += _gpt_neox_qkv(f"{hf}.attention", t, m.num_heads)
    r.append(heads_out(f"{hf}.attention.dense.weight", f"{t}/self_attention/out/kernel",
                       m.num_heads))
    r.append(same(f"{hf}.attention.dense.bias", f"{t}/self_attention/out/bias"))
    add_dense(r, f"{hf}.mlp.dense_h_to_4h", f"{t}/ffn/wi")
    add_dense(r, f"{hf}.mlp.dense_4h_to_h", f"{t}/ffn/wo")
    # The same two norms in both blocks: N1 before attention, N2 before the MLP.
    add_norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm")
    add_norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm")
  add_norm(r, "gpt_neox.final_layer_norm", "decoder/final_norm")
  if not m.tie_embeddings:
    # transformers 5 names it lm_head in the model and embed_out in the file.
    r.append(linear("embed_out.weight", "output/kernel"))
  return r
