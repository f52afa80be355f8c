"""BART and Marian: post-norm encoder-decoders with one shared config and
weight layout (learned or sinusoidal positions, output bias)."""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.fields import HF_ACTIVATIONS, model_activation
from tfx_jax.hf.rules import add_attention, add_dense, add_norm, flat_row, rows_from, same
from tfx_jax.model.config import ModelConfig


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
      activation=model_activation(c.get("activation_function", "gelu"), arch),
      num_layers=n_enc, num_encoder_layers=n_enc, num_decoder_layers=n_dec,
      d_model=c["d_model"], num_heads=c["encoder_attention_heads"],
      d_ff=c["encoder_ffn_dim"], vocab_size=c["vocab_size"],
      max_len=c["max_position_embeddings"], tie_embeddings=True, use_bias=True,
      output_bias=True, norm_eps=1e-5, scale_embeddings=bool(c.get("scale_embedding")))


def _seq2seq_config(m: ModelConfig):
  return dict(
      activation_function=HF_ACTIVATIONS.get(m.activation, "gelu"),
      encoder_layers=m.encoder_layers, decoder_layers=m.decoder_layers,
      d_model=m.d_model, encoder_attention_heads=m.num_heads,
      decoder_attention_heads=m.num_heads, encoder_ffn_dim=m.ffn_dim,
      decoder_ffn_dim=m.ffn_dim, vocab_size=m.vocab_size,
      max_position_embeddings=m.max_len, scale_embedding=m.scale_embeddings,
      tie_word_embeddings=True, is_encoder_decoder=True)


def bart_fields(c, names=None):
  return dict(_seq2seq_common(c, "bart"), position="learned", embedding_norm="on")


def bart_config(m: ModelConfig):
  return dict(_seq2seq_config(m), model_type="bart",
              architectures=["BartForConditionalGeneration"])


def marian_fields(c, names=None):
  if not c.get("share_encoder_decoder_embeddings", True) or c.get(
      "decoder_vocab_size", c["vocab_size"]) != c["vocab_size"]:
    raise ConfigError("marian: separate source and target vocabularies are not "
                      "supported (tfx_jax shares one embedding).")
  return dict(_seq2seq_common(c, "marian"), position="sinusoidal",
              sinusoidal_layout="halves", embedding_norm="off")


def marian_config(m: ModelConfig):
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
      add_norm(r, f"{hf_stack}.layernorm_embedding", f"{stack}_embed_norm")
    for i in range(n):
      hf, t = f"{hf_stack}.layers.{i}", f"{stack}/layer_{i}"
      add_attention(r, f"{hf}.self_attn", f"{t}/self_attention", h, h, names, True)
      add_norm(r, f"{hf}.self_attn_layer_norm", f"{t}/self_attention_norm")
      if stack == "decoder":
        add_attention(r, f"{hf}.encoder_attn", f"{t}/cross_attention", h, h, names, True)
        add_norm(r, f"{hf}.encoder_attn_layer_norm", f"{t}/cross_attention_norm")
      add_dense(r, f"{hf}.fc1", f"{t}/ffn/wi")
      add_dense(r, f"{hf}.fc2", f"{t}/ffn/wo")
      add_norm(r, f"{hf}.final_layer_norm", f"{t}/ffn_norm")
  return r


def bart_rules(m: ModelConfig):
  """BART: learned positions (HF's first 2 rows dropped), embedding norms."""
  return _seq2seq_rules(m, learned=True, embed_norm=True)


def marian_rules(m: ModelConfig):
  """Marian: sinusoidal positions (no weights), no embedding norms."""
  return _seq2seq_rules(m, learned=False, embed_norm=False)
