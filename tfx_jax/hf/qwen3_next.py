"""Qwen3-Next (``Qwen3NextForCausalLM``): Gated DeltaNet and gated attention
layers, then a mixture of experts with a gated shared expert.

What maps, as transformers' ``models/qwen3_next/modeling_qwen3_next.py`` computes it:

  layers     layer_types (or full_attention_interval k: layer i full iff (i +
             1) % k == 0) as ``model.mixer_pattern``: linear_attention D,
             full_attention A, the pattern's shortest repeating unit
             (``mixers.mixer_unit``; 3:1 is DDDA)
  DeltaNet   ``Qwen3NextGatedDeltaNet`` as model/layers/deltanet.py:
             linear_num_key_heads / linear_key_head_dim as ``deltanet_heads``
             / ``deltanet_head_dim``, linear_num_value_heads /
             linear_value_head_dim as ``deltanet_v_heads`` /
             ``deltanet_v_head_dim`` (each key head serving r = H_v / H value
             heads), linear_conv_kernel_dim as ``deltanet_conv``. Its
             in_proj_qkvz [H (2 d_k + 2 r d_v), D] is laid out per key head
             (q, k, then its r value heads' v, then their z) and in_proj_ba
             [H 2 r, D] per key head (r b, then r a): ``_qkvz``, ``_ba``
             split them; conv1d's channels are q | k | v (``_conv``)
  attention  q_proj [H 2 d, D] per head [query | gate]: the query and the
             elementwise output gate (``model.attention_gate='elementwise'``,
             sigmoid, before o_proj); per-head q/k RMSNorm; partial RoPE
             (partial_rotary_factor, 0.25 by default: ``model.rope_fraction``)
  norms      every RMSNorm but the DeltaNet's gated one is x / rms (1 + w):
             imported as gains 1 + w (``gemma_norm``, as Gemma 2)
  FFN        layers in mlp_only_layers (a prefix: ``first_dense_layers``) or
             off decoder_sparse_step (``moe_every``), or every layer without
             experts (num_experts 0), dense swiglu of intermediate_size; the
             others a softmax top-k mixture (num_experts_per_tok,
             norm_topk_prob as ``router_norm_topk``) of experts
             moe_intermediate_size wide, plus one shared expert
             shared_expert_intermediate_size wide (``shared_experts=1``,
             ``shared_expert_d_ff``) whose output is x sigmoid(x w)
             (shared_expert_gate: ``model.shared_expert_gate``)

Refused with a ConfigError naming the setting: attention_bias=True, a
hidden_act other than silu (the DeltaNet's convolution applies hidden_act,
ours SiLU), linear_num_value_heads not a multiple of linear_num_key_heads,
mlp_only_layers that are not a prefix, layer kinds other than the two, widths
< 1. The multi-token-prediction weights (``mtp.*``) are not part of
transformers' model and are not read.
"""

from __future__ import annotations

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import (HF_GATED_ACTIVATIONS, hf_rope_parameters, model_head_dim,
                               rope_fields)
from tfx_jax.hf.llama import gemma_norm
from tfx_jax.hf.rules import (Rule, add_dense, heads_in, heads_out, linear, same,
                              stacked_linear)
from tfx_jax.model import mixers
from tfx_jax.model.config import ModelConfig, is_moe_layer
from tfx_jax.model.config_moe import shared_dim

_ARCH = "qwen3_next"
_LINEAR, _FULL = "linear_attention", "full_attention"
_KINDS = {_LINEAR: "D", _FULL: "A"}
_FFN = (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo"))
# transformers' Qwen3NextConfig defaults, for keys a config.json leaves out.
_LINEAR_DEFAULTS = (("linear_num_key_heads", 16), ("linear_key_head_dim", 128),
                    ("linear_num_value_heads", 32), ("linear_value_head_dim", 128),
                    ("linear_conv_kernel_dim", 4))


# ------------------------------------------------------------------ fields
def _layer_types(c, n: int) -> list[str]:
  """HF's layer kinds, as Qwen3NextConfig derives them without layer_types."""
  kinds = c.get("layer_types")
  if kinds is None:
    k = c.get("full_attention_interval", 4)
    kinds = [_LINEAR if (i + 1) % k else _FULL for i in range(n)]
  bad = sorted(set(kinds) - set(_KINDS))
  if bad or len(kinds) != n:
    raise ConfigError(f"{_ARCH}: layer_types must name each of the {n} layers "
                      f"{_LINEAR!r} or {_FULL!r}; got {list(kinds)!r}.")
  return list(kinds)


def _deltanet_fields(c) -> dict:
  w = {key: c.get(key, default) for key, default in _LINEAR_DEFAULTS}
  bad = [f"{k}={v!r}" for k, v in w.items() if v is None or v < 1]
  if bad:
    raise ConfigError(f"{_ARCH}: {', '.join(bad)}: the Gated DeltaNet's widths must be "
                      ">= 1.")
  if w["linear_num_value_heads"] % w["linear_num_key_heads"]:
    raise ConfigError(
        f"{_ARCH}: linear_num_value_heads={w['linear_num_value_heads']} is not a multiple "
        f"of linear_num_key_heads={w['linear_num_key_heads']} (each key head serves the "
        "same number of value heads).")
  return dict(deltanet_heads=int(w["linear_num_key_heads"]),
              deltanet_head_dim=int(w["linear_key_head_dim"]),
              deltanet_v_heads=int(w["linear_num_value_heads"]),
              deltanet_v_head_dim=int(w["linear_value_head_dim"]),
              deltanet_conv=int(w["linear_conv_kernel_dim"]))


def _moe_fields(c, n: int) -> dict:
  """The ``ffn_type='moe'`` fields, or {} where no layer has experts."""
  experts = int(c.get("num_experts", 512) or 0)
  dense = sorted(int(i) for i in c.get("mlp_only_layers") or [])
  if dense != list(range(len(dense))):
    raise ConfigError(f"{_ARCH}: mlp_only_layers={dense} is not a prefix of the layers; "
                      "model.first_dense_layers keeps the first layers dense only.")
  step = int(c.get("decoder_sparse_step", 1))
  if not experts or not any(is_moe_layer(i, "moe", step, len(dense)) for i in range(n)):
    return {}
  shared = c.get("shared_expert_intermediate_size", 512)
  if not shared or shared < 1:
    raise ConfigError(f"{_ARCH}: shared_expert_intermediate_size={shared!r}; the shared "
                      "expert's width must be >= 1.")
  return dict(ffn_type="moe", num_experts=experts,
              experts_per_token=int(c.get("num_experts_per_tok", 10)), router="softmax",
              router_norm_topk=bool(c.get("norm_topk_prob", True)), moe_balance="aux_loss",
              expert_d_ff=int(c.get("moe_intermediate_size", 512)), moe_every=step,
              first_dense_layers=len(dense), shared_experts=1,
              shared_expert_d_ff=int(shared), shared_expert_gate=True)


def qwen3_next_fields(c, names=None):
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  if c.get("attention_bias", False):
    raise ConfigError(f"{_ARCH}: attention_bias=True puts biases on q, k, v and o but not "
                      "on the MLP or the DeltaNet; model.use_bias is one switch.")
  act = c.get("hidden_act", "silu")
  if act not in ("silu", "swish"):
    raise ConfigError(f"{_ARCH}: hidden_act={act!r}; the Gated DeltaNet's convolution "
                      "applies hidden_act, and model.mixer_pattern's D layers SiLU: "
                      "supported: silu.")
  pattern = "".join(_KINDS[kind] for kind in _layer_types(c, n))
  longest = c.get("max_position_embeddings", 32768)
  fields = dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm", qk_norm="rmsnorm",
      attention_gate="elementwise", activation="swiglu", position="rope", num_layers=n,
      d_model=d, num_heads=h, num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=model_head_dim(c.get("head_dim", 256), d, h),
      gated_d_ff=c.get("intermediate_size", 5632), vocab_size=c["vocab_size"],
      max_len=longest, tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      use_bias=False, norm_eps=c.get("rms_norm_eps", 1e-6),
      **rope_fields(c, _ARCH, longest=longest, partial=True, fraction_default=0.25),
      **_moe_fields(c, n))
  if "D" in pattern:
    fields.update(mixer_pattern=mixers.mixer_unit(pattern), **_deltanet_fields(c))
  return fields


def qwen3_next_config(m: ModelConfig):
  moe = m.ffn_type == "moe"
  kinds = mixers.layer_mixers(m.mixer_pattern, m.num_layers)
  return dict(
      model_type=_ARCH, architectures=["Qwen3NextForCausalLM"],
      hidden_act=HF_GATED_ACTIVATIONS.get(m.activation, "silu"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=False, rms_norm_eps=m.norm_eps,
      rope_parameters=hf_rope_parameters(m, partial=True),
      layer_types=[_LINEAR if kind == "D" else _FULL for kind in kinds],
      linear_num_key_heads=mixers.deltanet_heads(m),
      linear_key_head_dim=mixers.deltanet_head_dim(m),
      linear_num_value_heads=mixers.deltanet_v_heads(m),
      linear_value_head_dim=mixers.deltanet_v_head_dim(m),
      linear_conv_kernel_dim=m.deltanet_conv,
      num_experts=m.num_experts if moe else 0, num_experts_per_tok=m.experts_per_token,
      moe_intermediate_size=m.expert_dim, shared_expert_intermediate_size=shared_dim(m),
      norm_topk_prob=m.router_norm_topk, decoder_sparse_step=m.moe_every,
      mlp_only_layers=list(range(m.first_dense_layers)), output_router_logits=False)


# ------------------------------------------------------------------ weights
def _qkvz(hf, t, heads, k_dim, v_heads, v_dim):
  """in_proj_qkvz [H (2 K + 2 r V), D], per key head q, k, then its r value
  heads' v, then their z <-> query, key [D, H, K], value, gate [D, H_v, V]."""
  rv = v_heads // heads * v_dim
  cuts = np.cumsum([k_dim, k_dim, rv])

  def to_tfx(w):
    parts = np.split(w.T.reshape(w.shape[1], heads, -1), cuts, axis=-1)
    return tuple(p if i < 2 else p.reshape(w.shape[1], v_heads, v_dim)
                 for i, p in enumerate(parts))

  def to_hf(q, k, v, z):
    D = q.shape[0]
    grouped = [q, k, v.reshape(D, heads, rv), z.reshape(D, heads, rv)]
    return np.concatenate(grouped, axis=-1).reshape(D, -1).T

  return Rule(hf, tuple(f"{t}/{p}/kernel" for p in ("query", "key", "value", "gate")),
              to_tfx, to_hf)


def _ba(hf, t, heads, v_heads):
  """in_proj_ba [H 2 r, D], per key head r b then r a <-> beta, decay [D, H_v]."""
  r = v_heads // heads

  def to_tfx(w):
    wt = w.T.reshape(w.shape[1], heads, 2 * r)
    return wt[..., :r].reshape(-1, v_heads), wt[..., r:].reshape(-1, v_heads)

  def to_hf(b, a):
    D = b.shape[0]
    return np.concatenate([b.reshape(D, heads, r), a.reshape(D, heads, r)],
                          axis=-1).reshape(D, -1).T

  return Rule(hf, (f"{t}/beta/kernel", f"{t}/decay/kernel"), to_tfx, to_hf)


def _conv(hf, t, shapes):
  """conv1d.weight [C, 1, W], channels q | k | v <-> the [W, heads, width]
  kernels of ``shapes`` (tap W - 1 the current token in both)."""
  cuts = np.cumsum([h * w for h, w in shapes])[:-1]

  def to_tfx(w):
    return tuple(part.T.reshape(-1, *shape)
                 for part, shape in zip(np.split(w[:, 0], cuts), shapes))

  def to_hf(*kernels):
    return np.concatenate([x.reshape(x.shape[0], -1).T for x in kernels])[:, None]

  return Rule(hf, tuple(f"{t}/{p}_conv" for p in ("query", "key", "value")), to_tfx, to_hf)


def _query_gate(hf, t, heads):
  """q_proj [H 2 K, D], per head [query | gate] <-> query, gate [D, H, K]."""
  def to_tfx(w):
    wt = w.T.reshape(w.shape[1], heads, -1)
    half = wt.shape[-1] // 2
    return wt[..., :half], wt[..., half:]

  return Rule(hf, (f"{t}/query/kernel", f"{t}/gate/kernel"), to_tfx,
              lambda q, g: np.concatenate([q, g], axis=-1).reshape(q.shape[0], -1).T)


def _deltanet_rules(r, hf, t, m: ModelConfig):
  H, K = mixers.deltanet_heads(m), mixers.deltanet_head_dim(m)
  Hv, V = mixers.deltanet_v_heads(m), mixers.deltanet_v_head_dim(m)
  r.append(_qkvz(f"{hf}.in_proj_qkvz.weight", t, H, K, Hv, V))
  r.append(_ba(f"{hf}.in_proj_ba.weight", t, H, Hv))
  r.append(_conv(f"{hf}.conv1d.weight", t, ((H, K), (H, K), (Hv, V))))
  for name in ("A_log", "dt_bias"):
    r.append(same(f"{hf}.{name}", f"{t}/{name}"))
  r.append(same(f"{hf}.norm.weight", f"{t}/out_norm"))
  r.append(heads_out(f"{hf}.out_proj.weight", f"{t}/out/kernel", Hv))


def _attention_rules(r, hf, t, m: ModelConfig):
  r.append(_query_gate(f"{hf}.q_proj.weight", t, m.num_heads))
  r.append(heads_in(f"{hf}.k_proj.weight", f"{t}/key/kernel", m.kv_heads))
  r.append(heads_in(f"{hf}.v_proj.weight", f"{t}/value/kernel", m.kv_heads))
  r.append(heads_out(f"{hf}.o_proj.weight", f"{t}/out/kernel", m.num_heads))
  r.append(gemma_norm(f"{hf}.q_norm.weight", f"{t}/query_norm/scale"))
  r.append(gemma_norm(f"{hf}.k_norm.weight", f"{t}/key_norm/scale"))


def _moe_rules(r, hf, t, m: ModelConfig):
  r.append(linear(f"{hf}.gate.weight", f"{t}/router/kernel"))
  for name, ours in _FFN:
    r.append(stacked_linear([f"{hf}.experts.{j}.{name}.weight"
                             for j in range(m.num_experts)], f"{t}/{ours}/kernel"))
    add_dense(r, f"{hf}.shared_expert.{name}", f"{t}/shared/{ours}", bias=False)
  r.append(linear(f"{hf}.shared_expert_gate.weight", f"{t}/shared_gate/kernel"))


def qwen3_next_rules(m: ModelConfig):
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  kinds = mixers.layer_mixers(m.mixer_pattern, m.num_layers)
  for i, kind in enumerate(kinds):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    if kind == "D":
      _deltanet_rules(r, f"{hf}.linear_attn", f"{t}/deltanet", m)
    else:
      _attention_rules(r, f"{hf}.self_attn", f"{t}/self_attention", m)
    if is_moe_layer(i, m.ffn_type, m.moe_every, m.first_dense_layers):
      _moe_rules(r, f"{hf}.mlp", f"{t}/ffn", m)
    else:
      for name, ours in _FFN:
        add_dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", bias=False)
    mixer_norm = "deltanet_norm" if kind == "D" else "self_attention_norm"
    r.append(gemma_norm(f"{hf}.input_layernorm.weight", f"{t}/{mixer_norm}/scale"))
    r.append(gemma_norm(f"{hf}.post_attention_layernorm.weight", f"{t}/ffn_norm/scale"))
  r.append(gemma_norm("model.norm.weight", "decoder/final_norm/scale"))
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r
