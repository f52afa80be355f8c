"""T5 1.0 and v1.1: relative position buckets, FFN, output scaling and tying
stated separately."""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import model_head_dim
from tfx_jax.hf.rules import add_attention, add_dense, add_norm, linear, same
from tfx_jax.model.config import GATED_ACTIVATIONS, ModelConfig


# ------------------------------------------------------------------ T5
# feed_forward_proj <-> model.activation: T5 1.0's plain ReLU FFN, T5 v1.1's
# gated ones (HF's gated-gelu is gelu_new, the tanh approximation).
_T5_FFN = {"relu": "relu", "gated-gelu": "geglu_tanh", "gated-silu": "swiglu"}
_T5_FFN_BACK = {act: proj for proj, act in _T5_FFN.items()}


def t5_fields(c, names=None):
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
      d_model=d, num_heads=h, head_dim=model_head_dim(c.get("d_kv", 64), d, h), **width,
      vocab_size=c["vocab_size"], tie_embeddings=tied, scale_output=bool(scaled),
      use_bias=False,
      scale_attention_logits=False, norm_eps=c.get("layer_norm_epsilon", 1e-6),
      t5_num_buckets=c.get("relative_attention_num_buckets", 32),
      t5_max_distance=c.get("relative_attention_max_distance", 128))


def t5_config(m: ModelConfig):
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


def t5_rules(m: ModelConfig):
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
      add_attention(r, f"{hf}.0.SelfAttention", f"{t}/self_attention", h, h, qkvo, False)
      add_norm(r, f"{hf}.0.layer_norm", f"{t}/self_attention_norm", bias=False)
      f = 1
      if stack == "decoder":
        add_attention(r, f"{hf}.1.EncDecAttention", f"{t}/cross_attention", h, h, qkvo, False)
        add_norm(r, f"{hf}.1.layer_norm", f"{t}/cross_attention_norm", bias=False)
        f = 2
      ffn = ((("wi_0", "wi"), ("wi_1", "wv"), ("wo", "wo")) if m.gated
             else (("wi", "wi"), ("wo", "wo")))
      for name, ours in ffn:
        add_dense(r, f"{hf}.{f}.DenseReluDense.{name}", f"{t}/ffn/{ours}", bias=False)
      add_norm(r, f"{hf}.{f}.layer_norm", f"{t}/ffn_norm", bias=False)
    add_norm(r, f"{stack}.final_layer_norm", f"{stack}/final_norm", bias=False)
  return r
