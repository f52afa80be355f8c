"""The Hugging Face architectures tfx_jax can import and export, declared once.

Each :class:`Architecture` says, in both directions,
  * how an HF ``config.json`` maps onto ``ModelConfig`` fields (``model_fields``)
    and back (``hf_config``), and
  * how each HF weight maps onto the tfx_jax parameter tree (``rules``): a rule
    names one HF tensor, the tfx_jax parameters it becomes, and a pair of
    exact array maps (transposes, reshapes, splits, row slices), so that
    export -> import is bit-identical.

Which canonical variant each architecture is, in ``model.*`` terms:

  LLaMA    decoder_only, pre, rmsnorm, swiglu, rope (half-split), no biases, GQA;
           RoPE scaling linear or yarn (rope_scaling)
  GPT-2    decoder_only, pre, layernorm, gelu_tanh, learned positions, tied
  GPT-NeoX decoder_only, parallel block (use_parallel_residual; sequential
           without), pre, layernorm with biases, gelu, rope over rotary_pct of
           each head (rope_fraction), fused query_key_value, untied embed_out
  Qwen3    as LLaMA plus per-head RMSNorm of queries and keys (qk_norm),
           head_dim of its own; sliding windows where layer_types fit
           attention_window and global_every
  Gemma 2  decoder_only, sandwich, rmsnorm (HF's gain w is 1 + w here),
           geglu_tanh, rope, no biases, GQA, head_dim of its own, embeddings
           x sqrt(d_model), attention and final logit soft-caps, sliding and
           global layers alternating (attention_window, global_every=2), tied
  BERT     encoder_only, post, layernorm, gelu, learned positions, token types,
           embedding norm, MLM head
  T5 1.0   encoder_decoder, pre, rmsnorm, relu, t5_bias, no biases,
           unscaled attention logits, tied, decoder output x d_model^-0.5
           (scale_output)
  T5 v1.1  as T5 1.0 but geglu_tanh (or swiglu), decoder output unscaled,
           tied or untied output; HF states the FFN, the scaling and the
           tying separately, so every combination of the three maps
  BART     encoder_decoder, post, layernorm, gelu, learned positions (HF's
           offset of 2 rows dropped), embedding norms, output bias, tied
  Marian   encoder_decoder, post, layernorm, swish, sinusoidal [sin | cos]
           halves, embeddings x sqrt(d_model), output bias, tied
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from tfx_jax.errors import ConfigError
from tfx_jax.layers.positions import YARN_BETA_FAST, YARN_BETA_SLOW, yarn_attention_factor
from tfx_jax.model_config import GATED_ACTIVATIONS, ModelConfig, is_windowed

Array = np.ndarray

# HF activation names -> model.activation (plain FFN); gated ones are below.
# Exporting, an activation without an HF name becomes the architecture's own,
# so that the settings HF cannot represent show as differences.
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "relu": "relu", "silu": "swish", "swish": "swish"}
_ACTS_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "swish": "silu"}


def _act(name: str, arch: str) -> str:
  if name not in _ACTS:
    raise ConfigError(f"{arch}: activation {name!r} has no model.activation; "
                      f"supported: {', '.join(_ACTS)}.")
  return _ACTS[name]


# ----------------------------------------------------------- array maps
@dataclasses.dataclass(frozen=True)
class Rule:
  """One HF tensor <-> one or more tfx_jax parameters ('/'-joined paths)."""
  hf: str
  tfx: tuple[str, ...]
  to_tfx: Callable[[Array], tuple[Array, ...]]
  to_hf: Callable[..., Array]


def same(hf, tfx):
  return Rule(hf, (tfx,), lambda w: (w,), lambda x: x)


def linear(hf, tfx):
  """torch Linear [out, in] <-> Dense kernel [in, out]."""
  return Rule(hf, (tfx,), lambda w: (w.T,), lambda x: x.T)


def heads_in(hf, tfx, heads):
  """torch Linear [H*K, D] <-> DenseGeneral kernel [D, H, K]."""
  return Rule(hf, (tfx,), lambda w: (w.T.reshape(w.shape[1], heads, -1),),
              lambda x: x.reshape(x.shape[0], -1).T)


def heads_bias(hf, tfx, heads):
  return Rule(hf, (tfx,), lambda b: (b.reshape(heads, -1),), lambda x: x.reshape(-1))


def heads_out(hf, tfx, heads):
  """torch Linear [D, H*K] <-> DenseGeneral kernel [H, K, D]."""
  return Rule(hf, (tfx,), lambda w: (w.T.reshape(heads, -1, w.shape[0]),),
              lambda x: x.reshape(-1, x.shape[-1]).T)


def rows_from(hf, tfx, offset):
  """A learned position table whose first ``offset`` rows are never read (BART)."""
  return Rule(hf, (tfx,), lambda w: (w[offset:],),
              lambda x: np.concatenate([np.zeros((offset, x.shape[1]), x.dtype), x]))


def flat_row(hf, tfx):
  """A [1, V] buffer <-> a [V] vector (BART's and Marian's final_logits_bias)."""
  return Rule(hf, (tfx,), lambda w: (w.reshape(-1),), lambda x: x[None])


def _attention(rules, hf, tfx, heads, kv_heads, names, bias):
  """q, k, v, out of one attention block; ``names`` are HF's four projections."""
  for name, ours, h in zip(names[:3], ("query", "key", "value"), (heads, kv_heads, kv_heads)):
    rules.append(heads_in(f"{hf}.{name}.weight", f"{tfx}/{ours}/kernel", h))
    if bias:
      rules.append(heads_bias(f"{hf}.{name}.bias", f"{tfx}/{ours}/bias", h))
  rules.append(heads_out(f"{hf}.{names[3]}.weight", f"{tfx}/out/kernel", heads))
  if bias:
    rules.append(same(f"{hf}.{names[3]}.bias", f"{tfx}/out/bias"))


def _norm(rules, hf, tfx, bias=True, gain="weight"):
  rules.append(same(f"{hf}.{gain}", f"{tfx}/scale"))
  if bias:
    rules.append(same(f"{hf}.bias", f"{tfx}/bias"))


def _dense(rules, hf, tfx, bias=True):
  rules.append(linear(f"{hf}.weight", f"{tfx}/kernel"))
  if bias:
    rules.append(same(f"{hf}.bias", f"{tfx}/bias"))


# ---------------------------------------------------------------- RoPE
# transformers' rope_type -> model.rope_scaling. Not represented: "dynamic"
# (frequencies that change with the input length), "llama3", "longrope".
_ROPE_TYPES = {"default": "none", "linear": "linear", "yarn": "yarn"}


def _rope_fields(c, arch: str, *, longest: int, partial: bool = False,
                 base_key: str = "rope_theta", fraction_key: str = "partial_rotary_factor",
                 fraction_default: float = 1.0) -> dict:
  """The model.rope_* fields of an HF config's RoPE: transformers 5's
  ``rope_parameters``, or the older top-level keys (``rope_theta`` and
  ``rope_scaling``; GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct``, read
  through ``base_key`` and ``fraction_key``). ``longest`` is the model's
  max_position_embeddings. Architectures that rotate whole heads (``partial``
  False) refuse a partial_rotary_factor other than 1."""
  rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in _ROPE_TYPES:
    raise ConfigError(f"{arch}: RoPE rope_type={kind!r} has no model.rope_scaling; "
                      f"supported: {', '.join(_ROPE_TYPES)}.")
  fraction = rope.get("partial_rotary_factor", c.get(fraction_key))
  fraction = fraction_default if fraction is None else float(fraction)
  if not partial and fraction != 1.0:
    raise ConfigError(f"{arch}: partial_rotary_factor={fraction}; {arch} rotates whole "
                      "heads.")
  fields = dict(rope_base=float(rope.get("rope_theta", c.get(base_key, 10000.0))),
                rope_fraction=fraction, rope_scaling=_ROPE_TYPES[kind])
  if kind == "linear":
    if rope.get("factor") is None:
      raise ConfigError(f"{arch}: RoPE rope_type='linear' without a factor.")
    fields.update(rope_scaling_factor=float(rope["factor"]))
  elif kind == "yarn":
    # As transformers reads them: a top-level original_max_position_embeddings
    # first, then the RoPE's own, then max_position_embeddings; a missing factor
    # is the ratio of the two lengths.
    original = (c.get("original_max_position_embeddings")
                or rope.get("original_max_position_embeddings") or longest)
    factor = rope.get("factor") or longest / original
    unsupported = [
        f"{key}={rope[key]!r}" for key, default in (
            ("beta_fast", YARN_BETA_FAST), ("beta_slow", YARN_BETA_SLOW),
            ("attention_factor", yarn_attention_factor(factor)), ("truncate", True))
        if rope.get(key) is not None and rope[key] != default]
    if rope.get("mscale") and rope.get("mscale_all_dim"):
      unsupported.append(f"mscale={rope['mscale']!r} with "
                         f"mscale_all_dim={rope['mscale_all_dim']!r}")
    if unsupported:
      raise ConfigError(
          f"{arch}: YaRN with {', '.join(unsupported)} has no model.* equivalent; "
          f"model.rope_scaling='yarn' is the paper's (beta_fast {YARN_BETA_FAST:g}, "
          f"beta_slow {YARN_BETA_SLOW:g}, attention factor 0.1 ln(factor) + 1, "
          "truncated ramp).")
    fields.update(rope_scaling_factor=float(factor), rope_original_max_len=int(original))
  return fields


def _rope_config(m: ModelConfig, *, partial: bool = False) -> dict:
  """``rope_parameters`` of model.rope_*. Scalings without an HF rope_type (ntk)
  are written as the default, and a fraction where the architecture rotates
  whole heads is left out: both show as differences
  (convert.export_architecture)."""
  rope = {"rope_type": "default", "rope_theta": m.rope_base}
  if partial:
    rope.update(partial_rotary_factor=m.rope_fraction)
  if m.rope_scaling in ("linear", "yarn"):
    rope.update(rope_type=m.rope_scaling, factor=m.rope_scaling_factor)
  if m.rope_scaling == "yarn":
    rope.update(original_max_position_embeddings=m.rope_original_max_len)
  return rope


def _head_dim(width, d: int, h: int) -> int:
  """model.head_dim of an HF head width: 0 (derived) where it is d_model / num_heads."""
  if width is None or (d % h == 0 and width == d // h):
    return 0
  return int(width)


# Sliding-window attention: HF names each layer's kind in layer_types.
_SLIDING, _FULL = "sliding_attention", "full_attention"


def _window_fields(arch: str, layer_types, window, num_layers: int) -> dict:
  """model.attention_window and model.global_every of HF's per-layer attention
  kinds: none sliding (0, 0), all sliding (window, 0), or layers k, 2k, ...
  (1-based) full and the others sliding (window, k). HF's sliding window keeps
  key k for query q iff q - k < sliding_window (masking_utils), as
  model.attention_window does. Other patterns are refused."""
  kinds = sorted(set(layer_types) - {_SLIDING, _FULL})
  if kinds or len(layer_types) != num_layers:
    raise ConfigError(
        f"{arch}: layer_types must name each of the {num_layers} layers "
        f"{_SLIDING!r} or {_FULL!r}; got {list(layer_types)!r}.")
  sliding = [kind == _SLIDING for kind in layer_types]
  if not any(sliding):
    return dict(attention_window=0, global_every=0)
  if not window:
    raise ConfigError(f"{arch}: layer_types has {_SLIDING!r} layers but sliding_window "
                      f"is {window!r}.")
  every = 0 if all(sliding) else sliding.index(False) + 1
  if sliding != [is_windowed(i, window, every) for i in range(num_layers)]:
    pattern = "".join("S" if x else "F" for x in sliding)
    raise ConfigError(
        f"{arch}: layer_types {pattern} (S sliding, F full) has no model.* equivalent; "
        "model.global_every k makes layers k, 2k, ... (1-based) full and the others "
        "sliding.")
  return dict(attention_window=int(window), global_every=every)


def _layer_types(m: ModelConfig) -> list[str]:
  return [_SLIDING if is_windowed(i, m.attention_window, m.global_every) else _FULL
          for i in range(m.num_layers)]


# Gated FFNs, act(x W_gate) * (x W_up): HF's hidden_act -> model.activation.
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu",
               "gelu_new": "geglu_tanh", "gelu_pytorch_tanh": "geglu_tanh",
               "relu": "reglu", "sigmoid": "glu", "linear": "bilinear"}
_GATED_ACTS_BACK = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh",
                    "reglu": "relu", "glu": "sigmoid", "bilinear": "linear"}


def _gated_act(name: str, arch: str) -> str:
  if name not in _GATED_ACTS:
    raise ConfigError(f"{arch}: activation {name!r} has no gated model.activation; "
                      f"supported: {', '.join(_GATED_ACTS)}.")
  return _GATED_ACTS[name]


# --------------------------------------------------------------- LLaMA
def _llama_fields(c, names=None):
  h, d = c["num_attention_heads"], c["hidden_size"]
  if c.get("attention_bias") != c.get("mlp_bias", False):
    raise ConfigError("llama: attention_bias and mlp_bias differ; model.use_bias is one switch.")
  longest = c.get("max_position_embeddings", 2048)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm",
      activation={"silu": "swiglu"}.get(c.get("hidden_act", "silu"), "unsupported"),
      position="rope", num_layers=c["num_hidden_layers"], d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=_head_dim(c.get("head_dim"), d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)),
      use_bias=bool(c.get("attention_bias", False)), norm_eps=c["rms_norm_eps"],
      **_rope_fields(c, "llama", longest=longest))


def _llama_config(m: ModelConfig):
  return dict(
      model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu",
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=m.use_bias, mlp_bias=m.use_bias, rms_norm_eps=m.norm_eps,
      rope_parameters=_rope_config(m))


def _llama_rules(m: ModelConfig, *, qk_norm: bool = False):
  """LLaMA's weights; with ``qk_norm`` Qwen3's too (q_norm, k_norm: one gain per
  head dimension, shared by the heads, as query_norm and key_norm)."""
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    _attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
               ("q_proj", "k_proj", "v_proj", "o_proj"), m.use_bias)
    if qk_norm:
      _norm(r, f"{hf}.self_attn.q_norm", f"{t}/self_attention/query_norm", bias=False)
      _norm(r, f"{hf}.self_attn.k_norm", f"{t}/self_attention/key_norm", bias=False)
    for name, ours in (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo")):
      _dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", m.use_bias)
    _norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm", bias=False)
    _norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm", bias=False)
  _norm(r, "model.norm", "decoder/final_norm", bias=False)
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


# --------------------------------------------------------------- GPT-2
def _gpt2_fields(c, names=None):
  for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                  ("reorder_and_upcast_attn", False)):
    if c.get(key, ok) != ok:
      raise ConfigError(f"gpt2: {key}={c[key]} has no model.* equivalent.")
  d = c["n_embd"]
  return dict(
      family="decoder_only", norm_position="pre", norm_type="layernorm",
      activation=_act(c.get("activation_function", "gelu_new"), "gpt2"),
      position="learned", num_layers=c["n_layer"], d_model=d, num_heads=c["n_head"],
      d_ff=c.get("n_inner") or 4 * d, vocab_size=c["vocab_size"],
      max_len=c["n_positions"], tie_embeddings=bool(c.get("tie_word_embeddings", True)),
      use_bias=True, norm_eps=c.get("layer_norm_epsilon", 1e-5))


def _gpt2_config(m: ModelConfig):
  return dict(
      model_type="gpt2", architectures=["GPT2LMHeadModel"],
      activation_function=_ACTS_BACK.get(m.activation, "gelu_new"),
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


def _gpt2_rules(m: ModelConfig):
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
    _norm(r, f"{hf}.ln_1", f"{t}/self_attention_norm")
    _norm(r, f"{hf}.ln_2", f"{t}/ffn_norm")
  _norm(r, "transformer.ln_f", "decoder/final_norm")
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


# ---------------------------------------------------------------- BERT
def _bert_fields(c, names=None):
  if c.get("position_embedding_type", "absolute") != "absolute":
    raise ConfigError("bert: only absolute position embeddings are supported.")
  if c.get("hidden_act", "gelu") != "gelu":
    raise ConfigError("bert: the MLM head computes exact GELU; hidden_act must be 'gelu'.")
  return dict(
      family="encoder_only", norm_position="post", norm_type="layernorm",
      activation="gelu", position="learned", num_layers=c["num_hidden_layers"],
      d_model=c["hidden_size"], num_heads=c["num_attention_heads"],
      d_ff=c["intermediate_size"], vocab_size=c["vocab_size"],
      max_len=c["max_position_embeddings"], num_token_types=c.get("type_vocab_size", 2),
      tie_embeddings=True, use_bias=True, norm_eps=c.get("layer_norm_eps", 1e-12),
      embedding_norm="on")


def _bert_config(m: ModelConfig):
  return dict(
      model_type="bert", architectures=["BertForMaskedLM"], hidden_act="gelu",
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, intermediate_size=m.ffn_dim,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      type_vocab_size=m.num_token_types, layer_norm_eps=m.norm_eps,
      tie_word_embeddings=True, position_embedding_type="absolute")


def _bert_rules(m: ModelConfig):
  e = "bert.embeddings"
  r = [same(f"{e}.word_embeddings.weight", "embedding/embedding"),
       same(f"{e}.position_embeddings.weight", "positions/embedding"),
       same(f"{e}.token_type_embeddings.weight", "token_types/embedding")]
  _norm(r, f"{e}.LayerNorm", "embed_norm")
  for i in range(m.num_layers):
    hf, t = f"bert.encoder.layer.{i}", f"encoder/layer_{i}"
    _attention(r, f"{hf}.attention", f"{t}/self_attention", m.num_heads, m.num_heads,
               ("self.query", "self.key", "self.value", "output.dense"), True)
    _norm(r, f"{hf}.attention.output.LayerNorm", f"{t}/self_attention_norm")
    _dense(r, f"{hf}.intermediate.dense", f"{t}/ffn/wi")
    _dense(r, f"{hf}.output.dense", f"{t}/ffn/wo")
    _norm(r, f"{hf}.output.LayerNorm", f"{t}/ffn_norm")
  _dense(r, "cls.predictions.transform.dense", "mlm_dense")
  _norm(r, "cls.predictions.transform.LayerNorm", "mlm_norm")
  r.append(same("cls.predictions.bias", "mlm_bias"))
  return r


# ------------------------------------------------------------------ T5
# feed_forward_proj <-> model.activation: T5 1.0's plain ReLU FFN, T5 v1.1's
# gated ones (HF's gated-gelu is gelu_new, the tanh approximation).
_T5_FFN = {"relu": "relu", "gated-gelu": "geglu_tanh", "gated-silu": "swiglu"}
_T5_FFN_BACK = {act: proj for proj, act in _T5_FFN.items()}


def _t5_fields(c, names=None):
  proj = c.get("feed_forward_proj", "relu")
  if proj not in _T5_FFN:
    raise ConfigError(f"t5: feed_forward_proj={proj!r} has no model.activation; "
                      "supported: relu (T5 1.0), gated-gelu, gated-silu (T5 v1.1).")
  act = _T5_FFN[proj]
  # T5 1.0 multiplies the decoder output by d_model^-0.5 before the output
  # projection; v1.1 does not. transformers >= 5 says which in
  # scale_decoder_outputs; earlier configs said it with tie_word_embeddings
  # (true: tied and scaled, T5 1.0; false: untied and unscaled, v1.1).
  scaled = c.get("scale_decoder_outputs")
  if scaled is None:
    scaled = c.get("tie_word_embeddings", True) is not False
  # Whether the output projection is the shared embedding: from the weights
  # when there are any (transformers >= 5 ties every T5 whose checkpoint has no
  # lm_head of its own, whatever tie_word_embeddings says), else from the config.
  tied = ("lm_head.weight" not in names if names is not None
          else c.get("tie_word_embeddings", True) is not False)
  d, h = c["d_model"], c["num_heads"]
  width = (dict(gated_d_ff=c["d_ff"]) if act in GATED_ACTIVATIONS
           else dict(d_ff=c["d_ff"]))
  return dict(
      family="encoder_decoder", norm_position="pre", norm_type="rmsnorm",
      activation=act, position="t5_bias",
      num_layers=c["num_layers"], num_encoder_layers=c["num_layers"],
      num_decoder_layers=c.get("num_decoder_layers") or c["num_layers"],
      d_model=d, num_heads=h, head_dim=_head_dim(c.get("d_kv", 64), d, h), **width,
      vocab_size=c["vocab_size"], tie_embeddings=tied, scale_output=bool(scaled),
      use_bias=False,
      scale_attention_logits=False, norm_eps=c.get("layer_norm_epsilon", 1e-6),
      t5_num_buckets=c.get("relative_attention_num_buckets", 32),
      t5_max_distance=c.get("relative_attention_max_distance", 128))


def _t5_config(m: ModelConfig):
  # Both switches stated: transformers >= 5 reads the scaling from
  # scale_decoder_outputs and the tying from the weights (an untied export
  # carries lm_head.weight), so every combination loads as it is.
  return dict(
      model_type="t5", architectures=["T5ForConditionalGeneration"],
      feed_forward_proj=_T5_FFN_BACK.get(m.activation, "gated-gelu"),
      num_layers=m.encoder_layers, num_decoder_layers=m.decoder_layers,
      d_model=m.d_model, num_heads=m.num_heads, d_kv=m.attention_head_dim, d_ff=m.ffn_dim,
      vocab_size=m.vocab_size, tie_word_embeddings=m.tie_embeddings,
      scale_decoder_outputs=m.scale_output, layer_norm_epsilon=m.norm_eps,
      relative_attention_num_buckets=m.t5_num_buckets,
      relative_attention_max_distance=m.t5_max_distance, decoder_start_token_id=0,
      pad_token_id=0, eos_token_id=1, is_encoder_decoder=True)


def _t5_rules(m: ModelConfig):
  r = [same("shared.weight", "embedding/embedding")]
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  h = m.num_heads
  qkvo = ("q", "k", "v", "o")
  for stack, n in (("encoder", m.encoder_layers), ("decoder", m.decoder_layers)):
    r.append(same(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                  f"{stack}_relative_bias/rel_embedding"))
    for i in range(n):
      hf, t = f"{stack}.block.{i}.layer", f"{stack}/layer_{i}"
      _attention(r, f"{hf}.0.SelfAttention", f"{t}/self_attention", h, h, qkvo, False)
      _norm(r, f"{hf}.0.layer_norm", f"{t}/self_attention_norm", bias=False)
      f = 1
      if stack == "decoder":
        _attention(r, f"{hf}.1.EncDecAttention", f"{t}/cross_attention", h, h, qkvo, False)
        _norm(r, f"{hf}.1.layer_norm", f"{t}/cross_attention_norm", bias=False)
        f = 2
      ffn = ((("wi_0", "wi"), ("wi_1", "wv"), ("wo", "wo")) if m.gated
             else (("wi", "wi"), ("wo", "wo")))
      for name, ours in ffn:
        _dense(r, f"{hf}.{f}.DenseReluDense.{name}", f"{t}/ffn/{ours}", bias=False)
      _norm(r, f"{hf}.{f}.layer_norm", f"{t}/ffn_norm", bias=False)
    _norm(r, f"{stack}.final_layer_norm", f"{stack}/final_norm", bias=False)
  return r


# ------------------------------------------------------- BART and Marian
def _seq2seq_common(c, arch):
  for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
               ("encoder_ffn_dim", "decoder_ffn_dim")):
    if c[a] != c[b]:
      raise ConfigError(f"{arch}: {a}={c[a]} != {b}={c[b]}; tfx_jax stacks share "
                        "num_heads and d_ff.")
  if c.get("normalize_before", False) or c.get("add_final_layer_norm", False):
    raise ConfigError(f"{arch}: pre-norm variants (mBART) are not supported.")
  n_enc, n_dec = c["encoder_layers"], c["decoder_layers"]
  return dict(
      family="encoder_decoder", norm_position="post", norm_type="layernorm",
      activation=_act(c.get("activation_function", "gelu"), arch),
      num_layers=n_enc, num_encoder_layers=n_enc, num_decoder_layers=n_dec,
      d_model=c["d_model"], num_heads=c["encoder_attention_heads"],
      d_ff=c["encoder_ffn_dim"], vocab_size=c["vocab_size"],
      max_len=c["max_position_embeddings"], tie_embeddings=True, use_bias=True,
      output_bias=True, norm_eps=1e-5, scale_embeddings=bool(c.get("scale_embedding")))


def _seq2seq_config(m: ModelConfig):
  return dict(
      activation_function=_ACTS_BACK.get(m.activation, "gelu"),
      encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
      d_model=m.d_model, encoder_attention_heads=m.num_heads,
      decoder_attention_heads=m.num_heads, encoder_ffn_dim=m.ffn_dim,
      decoder_ffn_dim=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, scale_embedding=m.scale_embeddings,
      tie_word_embeddings=True, is_encoder_decoder=True)


def _bart_fields(c, names=None):
  return dict(_seq2seq_common(c, "bart"), position="learned", embedding_norm="on")


def _bart_config(m: ModelConfig):
  return dict(_seq2seq_config(m), model_type="bart",
              architectures=["BartForConditionalGeneration"])


def _marian_fields(c, names=None):
  if not c.get("share_encoder_decoder_embeddings", True) or c.get(
      "decoder_vocab_size", c["vocab_size"]) != c["vocab_size"]:
    raise ConfigError("marian: separate source and target vocabularies are not "
                      "supported (tfx_jax shares one embedding).")
  return dict(_seq2seq_common(c, "marian"), position="sinusoidal",
              sinusoidal_layout="halves", embedding_norm="off")


def _marian_config(m: ModelConfig):
  # Marian's own special ids: eos 0, pad (= decoder start) the last id; the
  # imported model's ids, where known, replace these (convert.to_hf).
  return dict(_seq2seq_config(m), model_type="marian", architectures=["MarianMTModel"],
              share_encoder_decoder_embeddings=True, decoder_vocab_size=m.vocab_size,
              eos_token_id=0, pad_token_id=m.vocab_size - 1,
              decoder_start_token_id=m.vocab_size - 1)


def _seq2seq_rules(m: ModelConfig, *, learned: bool, embed_norm: bool):
  r = [same("model.shared.weight", "embedding/embedding"),
       flat_row("final_logits_bias", "output_bias")]
  h = m.num_heads
  names = ("q_proj", "k_proj", "v_proj", "out_proj")
  for stack, n in (("encoder", m.encoder_layers), ("decoder", m.decoder_layers)):
    hf_stack = f"model.{stack}"
    if learned:
      r.append(rows_from(f"{hf_stack}.embed_positions.weight", f"{stack}_positions/embedding", 2))
    if embed_norm:
      _norm(r, f"{hf_stack}.layernorm_embedding", f"{stack}_embed_norm")
    for i in range(n):
      hf, t = f"{hf_stack}.layers.{i}", f"{stack}/layer_{i}"
      _attention(r, f"{hf}.self_attn", f"{t}/self_attention", h, h, names, True)
      _norm(r, f"{hf}.self_attn_layer_norm", f"{t}/self_attention_norm")
      if stack == "decoder":
        _attention(r, f"{hf}.encoder_attn", f"{t}/cross_attention", h, h, names, True)
        _norm(r, f"{hf}.encoder_attn_layer_norm", f"{t}/cross_attention_norm")
      _dense(r, f"{hf}.fc1", f"{t}/ffn/wi")
      _dense(r, f"{hf}.fc2", f"{t}/ffn/wo")
      _norm(r, f"{hf}.final_layer_norm", f"{t}/ffn_norm")
  return r


# ------------------------------------------------------------ GPT-NeoX
def _gpt_neox_fields(c, names=None):
  # HF's MLP always has biases; attention_bias switches those of attention only.
  if not c.get("attention_bias", True):
    raise ConfigError("gpt_neox: attention_bias=False drops the attention biases but "
                      "keeps the MLP's; model.use_bias is one switch.")
  longest = c.get("max_position_embeddings", 2048)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="layernorm",
      activation=_act(c.get("hidden_act", "gelu"), "gpt_neox"), position="rope",
      # use_parallel_residual: x + Attn(N1(x)) + MLP(N2(x)); else sequential.
      block="parallel" if c.get("use_parallel_residual", True) else "sequential",
      num_layers=c["num_hidden_layers"], d_model=c["hidden_size"],
      num_heads=c["num_attention_heads"], d_ff=c["intermediate_size"],
      vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=True,
      norm_eps=c.get("layer_norm_eps", 1e-5),
      # rotary_pct (HF's default 0.25) of each head rotated, rotary_emb_base.
      **_rope_fields(c, "gpt_neox", longest=longest, partial=True,
                     base_key="rotary_emb_base", fraction_key="rotary_pct",
                     fraction_default=0.25))


def _gpt_neox_config(m: ModelConfig):
  return dict(
      model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"],
      hidden_act=_ACTS_BACK.get(m.activation, "gelu"),
      use_parallel_residual=m.block == "parallel", num_hidden_layers=m.num_layers,
      hidden_size=m.d_model, num_attention_heads=m.num_heads,
      intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=True, layer_norm_eps=m.norm_eps,
      rope_parameters=_rope_config(m, partial=True))


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


def _gpt_neox_rules(m: ModelConfig):
  r = [same("gpt_neox.embed_in.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"gpt_neox.layers.{i}", f"decoder/layer_{i}"
    r += _gpt_neox_qkv(f"{hf}.attention", t, m.num_heads)
    r.append(heads_out(f"{hf}.attention.dense.weight", f"{t}/self_attention/out/kernel",
                       m.num_heads))
    r.append(same(f"{hf}.attention.dense.bias", f"{t}/self_attention/out/bias"))
    _dense(r, f"{hf}.mlp.dense_h_to_4h", f"{t}/ffn/wi")
    _dense(r, f"{hf}.mlp.dense_4h_to_h", f"{t}/ffn/wo")
    # The same two norms in both blocks: N1 before attention, N2 before the MLP.
    _norm(r, f"{hf}.input_layernorm", f"{t}/self_attention_norm")
    _norm(r, f"{hf}.post_attention_layernorm", f"{t}/ffn_norm")
  _norm(r, "gpt_neox.final_layer_norm", "decoder/final_norm")
  if not m.tie_embeddings:
    # transformers 5 names it lm_head in the model and embed_out in the file.
    r.append(linear("embed_out.weight", "output/kernel"))
  return r


# --------------------------------------------------------------- Qwen3
def _qwen3_fields(c, names=None):
  if c.get("attention_bias", False):
    raise ConfigError("qwen3: attention_bias=True puts biases on q, k, v and o but not "
                      "on the MLP; model.use_bias is one switch.")
  h, d, n = c["num_attention_heads"], c["hidden_size"], c["num_hidden_layers"]
  # As Qwen3Config: sliding_window counts only with use_sliding_window, and
  # without layer_types the layers from max_window_layers on are the sliding ones.
  window = c.get("sliding_window", 4096) if c.get("use_sliding_window", False) else None
  layer_types = c.get("layer_types") or [
      _SLIDING if window is not None and i >= c.get("max_window_layers", 28) else _FULL
      for i in range(n)]
  longest = c.get("max_position_embeddings", 32768)
  return dict(
      family="decoder_only", norm_position="pre", norm_type="rmsnorm", qk_norm="rmsnorm",
      activation=_gated_act(c.get("hidden_act", "silu"), "qwen3"), position="rope",
      num_layers=n, d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h,
      head_dim=_head_dim(c.get("head_dim", 128), d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", False)), use_bias=False,
      norm_eps=c.get("rms_norm_eps", 1e-6),
      **_window_fields("qwen3", layer_types, window, n),
      **_rope_fields(c, "qwen3", longest=longest))


def _qwen3_config(m: ModelConfig):
  layer_types = _layer_types(m)
  windowed = _SLIDING in layer_types
  return dict(
      model_type="qwen3", architectures=["Qwen3ForCausalLM"],
      hidden_act=_GATED_ACTS_BACK.get(m.activation, "silu"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=False, rms_norm_eps=m.norm_eps, rope_parameters=_rope_config(m),
      use_sliding_window=windowed,
      sliding_window=m.attention_window if windowed else None,
      max_window_layers=0 if windowed else m.num_layers, layer_types=layer_types)


# -------------------------------------------------------------- Gemma 2
def _gemma2_fields(c, names=None):
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
      _SLIDING if (i + 1) % 2 else _FULL for i in range(n)]
  longest = c.get("max_position_embeddings", 8192)
  return dict(
      family="decoder_only", norm_position="sandwich", norm_type="rmsnorm",
      activation=_gated_act(c.get("hidden_activation", "gelu_pytorch_tanh"), "gemma2"),
      position="rope", num_layers=n, d_model=d, num_heads=h,
      num_kv_heads=c.get("num_key_value_heads") or h, head_dim=_head_dim(width, d, h),
      gated_d_ff=c["intermediate_size"], vocab_size=c["vocab_size"], max_len=longest,
      tie_embeddings=bool(c.get("tie_word_embeddings", True)),
      # Gemma2TextScaledWordEmbedding: x hidden_size^0.5, as model.embed_scale.
      scale_embeddings=True, use_bias=False, norm_eps=c.get("rms_norm_eps", 1e-6),
      attention_logit_softcap=cap("attn_logit_softcapping", 50.0),
      final_logit_softcap=cap("final_logit_softcapping", 30.0),
      **_window_fields("gemma2", layer_types, c.get("sliding_window", 4096), n),
      **_rope_fields(c, "gemma2", longest=longest))


def _gemma2_config(m: ModelConfig):
  return dict(
      model_type="gemma2", architectures=["Gemma2ForCausalLM"],
      hidden_activation=_GATED_ACTS_BACK.get(m.activation, "gelu_pytorch_tanh"),
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, num_key_value_heads=m.kv_heads,
      head_dim=m.attention_head_dim, query_pre_attn_scalar=m.attention_head_dim,
      intermediate_size=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, tie_word_embeddings=m.tie_embeddings,
      attention_bias=False, rms_norm_eps=m.norm_eps, rope_parameters=_rope_config(m),
      attn_logit_softcapping=m.attention_logit_softcap or None,
      final_logit_softcapping=m.final_logit_softcap or None,
      # HF builds the sliding mask whether or not a layer reads it, so a window
      # is always named (HF's default where no layer is windowed).
      sliding_window=m.attention_window or 4096, layer_types=_layer_types(m))


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


def _gemma2_rules(m: ModelConfig):
  r = [same("model.embed_tokens.weight", "embedding/embedding")]
  for i in range(m.num_layers):
    hf, t = f"model.layers.{i}", f"decoder/layer_{i}"
    _attention(r, f"{hf}.self_attn", f"{t}/self_attention", m.num_heads, m.kv_heads,
               ("q_proj", "k_proj", "v_proj", "o_proj"), False)
    for name, ours in (("gate_proj", "wi"), ("up_proj", "wv"), ("down_proj", "wo")):
      _dense(r, f"{hf}.mlp.{name}", f"{t}/ffn/{ours}", bias=False)
    for name, ours in _GEMMA2_NORMS:
      r.append(gemma_norm(f"{hf}.{name}.weight", f"{t}/{ours}/scale"))
  r.append(gemma_norm("model.norm.weight", "decoder/final_norm/scale"))
  if not m.tie_embeddings:
    r.append(linear("lm_head.weight", "output/kernel"))
  return r


# --------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class Architecture:
  name: str
  model_type: str  # HF config.json "model_type"
  family: str
  task: str  # the tfx_jax task of a converted run
  # (HF config, names of the HF weights or None) -> model.* fields
  model_fields: Callable[..., dict]
  hf_config: Callable[[ModelConfig], dict]
  rules: Callable[[ModelConfig], list[Rule]]


ARCHITECTURES = {
    "llama": Architecture("llama", "llama", "decoder_only", "lm", _llama_fields,
                          _llama_config, _llama_rules),
    "gpt2": Architecture("gpt2", "gpt2", "decoder_only", "lm", _gpt2_fields,
                         _gpt2_config, _gpt2_rules),
    "gpt_neox": Architecture("gpt_neox", "gpt_neox", "decoder_only", "lm",
                             _gpt_neox_fields, _gpt_neox_config, _gpt_neox_rules),
    "qwen3": Architecture("qwen3", "qwen3", "decoder_only", "lm", _qwen3_fields,
                          _qwen3_config, lambda m: _llama_rules(m, qk_norm=True)),
    "gemma2": Architecture("gemma2", "gemma2", "decoder_only", "lm", _gemma2_fields,
                           _gemma2_config, _gemma2_rules),
    "bert": Architecture("bert", "bert", "encoder_only", "mlm", _bert_fields,
                         _bert_config, _bert_rules),
    "t5": Architecture("t5", "t5", "encoder_decoder", "translate", _t5_fields,
                       _t5_config, _t5_rules),
    "bart": Architecture(
        "bart", "bart", "encoder_decoder", "translate", _bart_fields, _bart_config,
        lambda m: _seq2seq_rules(m, learned=True, embed_norm=True)),
    "marian": Architecture(
        "marian", "marian", "encoder_decoder", "translate", _marian_fields,
        _marian_config, lambda m: _seq2seq_rules(m, learned=False, embed_norm=False)),
}


def architecture_for(hf_config: dict) -> Architecture:
  """The architecture of an HF ``config.json`` (by ``model_type``)."""
  kind = hf_config.get("model_type")
  for arch in ARCHITECTURES.values():
    if arch.model_type == kind:
      return arch
  raise ConfigError(f"HF model_type={kind!r} is not supported; supported: "
                    f"{', '.join(a.model_type for a in ARCHITECTURES.values())}.")
