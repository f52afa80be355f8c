"""Mixtures of experts: Mixtral, Qwen3-MoE, OLMoE.

Each is its dense relative with a mixture of experts in the FFN's place
(``model.ffn_type='moe'``, model/layers/moe.py), routed as HF routes it: a softmax
over the experts, the top k (``num_experts_per_tok``), their scores
renormalised over the k (Mixtral always; Qwen3-MoE and OLMoE with
``norm_topk_prob``: ``model.router_norm_topk``). HF saves one gate, up and
down matrix per expert (``experts.<j>.*``), which stack into our [E, in, out]
kernels; the router's ``gate.weight`` [E, D] is ``ffn/router/kernel`` [D, E].
What HF's training adds (``router_aux_loss_coef``, jitter) has no effect on the
logits and is not carried; a model whose experts HF cannot route (a sigmoid
router, shared experts, an expert bias, a capacity) does not export.

  Mixtral    LLaMA's block (pre, rmsnorm, swiglu, rope, GQA, no biases), every
             layer MoE of experts intermediate_size wide, a sliding window
             on every layer with sliding_window
  Qwen3-MoE  Qwen3's block (per-head q/k RMSNorm); experts
             moe_intermediate_size wide; the layers in mlp_only_layers (a
             prefix: model.first_dense_layers) and off decoder_sparse_step
             (model.moe_every) dense, intermediate_size wide
  OLMoE      OLMo's block: pre, rmsnorm, swiglu, rope, and q/k RMSNorm over
             all heads together (model.qk_norm_heads='joint'); every layer MoE
"""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import (HF_GATED_ACTIVATIONS, hf_rope_parameters,
                               model_gated_activation, rope_fields)
from tfx_jax.hf.llama import llama_fields, qwen3_config, qwen3_fields
from tfx_jax.hf.rules import (Rule, add_attention, add_dense, add_norm, linear, same,
                              stacked_linear)
from tfx_jax.model.config import ModelConfig, is_moe_layer


def _routing(c, arch: str, *, experts_key: str, norm_topk: bool) -> dict:
  """The model.* fields of HF's router (softmax, top k, renormalised or not)."""
  n = c.get(experts_key, c.get("num_local_experts", c.get("num_experts")))
  if n is None:
    raise ConfigError(f"{arch}: config.json names no number of experts ({experts_key}).")
  return dict(ffn_type="moe", num_experts=int(n), experts_per_token=int(c["num_experts_per_tok"]),
              router="softmax", router_norm_topk=bool(norm_topk), moe_balance="aux_loss")


def _expert_rules(r: list[Rule], hf: str, ours: str, m: ModelConfig,
                  names: tuple[str, str, str]) -> None:
  """The router and the experts of one MoE layer: ``names`` are HF's gate, up
  and down matrices of each expert (``<hf>.experts.<j>.<name>.weight``)."""
  r.append(linear(f"{hf}.gate.weight", f"{ours}/router/kernel"))
  for name, proj in zip(names, ("wi", "wv", "wo")):
    r.append(stacked_linear([f"{hf}.experts.{j}.{name}.weight" for j in range(m.num_experts)],
                            f"{ours}/{proj}/kernel"))


# -------------------------------------------------------------- Mixtral
def mixtral_fields(c, names=None):
  # Mixtral has no biases (and no attention_bias / mlp_bias keys).
  fields = llama_fields({**c, "attention_bias": False, "mlp_bias": False}, names)
  window = c.get("sliding_window")
  return dict(fields, **_routing(c, "mixtral", experts_key="num_local_experts",
                                 norm_topk=True),
              expert_d_ff=c["intermediate_size"],
              attention_window=int(window) if window else 0)


def mixtral_config(m: ModelConfig):
  return dict(
      model_type="mixtral", architectures=["MixtralForCausalLM"], hidden_act="silu",
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.expert_dim,
      num_local_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      tie_word_embeddings=m.tie_embeddings, rms_norm_eps=m.norm_eps,
      sliding_window=m.attention_window or None, router_jitter_noise=0.0,
      output_router_logits=False, rope_parameters=hf_rope_parameters(m))


def _decoder_rules(m: ModelConfig, *, qk_norm: bool, moe: str,
                   expert_names: tuple[str, str, str]):
  """A decoder of LLaMA-style blocks whose MoE layers' FFN is ``<layer>.<moe>``
  (dense layers: ``<layer>.mlp`` with gate/up/down_proj)."""
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    add_attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
                  ("q_proj", "k_proj", "v_proj", "o_proj"), False)
    if qk_norm:
      add_norm(r, f"{hf}.self_attn.q_norm", f"{t}/self_attention/query_norm", bias=False)
      add_norm(r, f"{hf}.self_attn.k_norm", f"{t}/self_attention/key_norm", bias=False)
    if is_moe_layer(i, m.ffn_type, m.moe_every, m.first_dense_layers):
      _expert_rules(r, f"{hf}.{moe}", f"{t}/ffn", m, expert_names)
    else:
      for name, ours in (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo")):
        add_dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", bias=False)
    add_norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm", bias=False)
    add_norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm", bias=False)
  add_norm(r, "model.norm", "decoder/final_norm", bias=False)
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


def mixtral_rules(m: ModelConfig):
  return _decoder_rules(m, qk_norm=False, moe="block_sparse_moe",
                        expert_names=("w1", "w3", "w2"))


# ------------------------------------------------------------ Qwen3-MoE
def qwen3_moe_fields(c, names=None):
  n = c["num_hidden_layers"]
  dense = sorted(int(i) for i in c.get("mlp_only_layers") or [])
  if dense != list(range(len(dense))):
    raise ConfigError(f"qwen3_moe: mlp_only_layers={dense} is not a prefix of the layers; "
                      "model.first_dense_layers keeps the first layers dense only.")
  fields = dict(qwen3_fields(c, names),
                **_routing(c, "qwen3_moe", experts_key="num_experts",
                           norm_topk=c.get("norm_topk_prob", False)),
                expert_d_ff=c["moe_intermediate_size"],
                moe_every=int(c.get("decoder_sparse_step", 1)), first_dense_layers=len(dense))
  # HF's rule: MoE unless in mlp_only_layers, where (i + 1) % step == 0; ours
  # is the same with the prefix as first_dense_layers (model_config.is_moe_layer).
  if not any(is_moe_layer(i, "moe", fields["moe_every"], len(dense)) for i in range(n)):
    raise ConfigError("qwen3_moe: no layer is a mixture of experts (mlp_only_layers, "
                      "decoder_sparse_step); import it as qwen3.")
  return fields


def qwen3_moe_config(m: ModelConfig):
  return dict(
      qwen3_config(m), model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"],
      intermediate_size=m.ffn_dim, moe_intermediate_size=m.expert_dim,
      num_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
      norm_topk_prob=m.router_norm_topk, decoder_sparse_step=m.moe_every,
      mlp_only_layers=list(range(m.first_dense_layers)), output_router_logits=False)


def qwen3_moe_rules(m: ModelConfig):
  return _decoder_rules(m, qk_norm=True, moe="mlp",
                        expert_names=("gate_proj", "up_proj", "down_proj"))


# ---------------------------------------------------------------- OLMoE
def olmoe_fields(c, names=None):
  for key in ("clip_qkv", "attention_bias"):
    if c.get(key):
      raise ConfigError(f"olmoe: {key}={c[key]!r} has no model.* equivalent.")
  h, d = c["num_attention_heads"], c["hidden_size"]
  longest = c.get("max_position_embeddings", 4096)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm", qk_norm="rmsnorm",
      qk_norm_heads="joint",
      activation=model_gated_activation(c.get("hidden_act", "silu"), "olmoe"),
      position="rope", num_layers=c["num_hidden_layers"], d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h, gated_d_ff=c["intermediate_size"],
      expert_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=False,
      norm_eps=c.get("rms_norm_eps", 1e-5),
      **_routing(c, "olmoe", experts_key="num_experts",
                 norm_topk=c.get("norm_topk_prob", False)),
      **rope_fields(c, "olmoe", longest=longest))


def olmoe_config(m: ModelConfig):
  return dict(
      model_type="olmoe", architectures=["OlmoeForCausalLM"],
      hidden_act=HF_GATED_ACTIVATIONS.get(m.activation, "silu"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      intermediate_size=m.expert_dim, num_experts=m.num_experts,
      num_experts_per_tok=m.experts_per_token, norm_topk_prob=m.router_norm_topk,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      tie_word_embeddings=m.tie_embeddings, rms_norm_eps=m.norm_eps, attention_bias=False,
      clip_qkv=None, output_router_logits=False, rope_parameters=hf_rope_parameters(m))


def olmoe_rules(m: ModelConfig):
  """Qwen3-MoE's names; the q and k norms' gains span all heads (H K, N K)."""
  return _decoder_rules(m, qk_norm=True, moe="mlp",
                        expert_names=("gate_proj", "up_proj", "down_proj"))
