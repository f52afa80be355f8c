"""BERT: an encoder with token types, an embedding norm and the MLM head."""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.rules import add_attention, add_dense, add_norm, same
from tfx_jax.model.config import ModelConfig


# ---------------------------------------------------------------- BERT
def bert_fields(c, names=None):
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


def bert_config(m: ModelConfig):
  return dict(
      model_type="bert", architectures=["BertForMaskedLM"], hidden_act="gelu",
      num_hidden_layers=m.num_layers, hidden_size=m.d_model,
      num_attention_heads=m.num_heads, intermediate_size=m.ffn_dim,
      vocab_size=m.vocab_size, max_position_embeddings=m.max_len,
      type_vocab_size=m.num_token_types, layer_norm_eps=m.norm_eps,
      tie_word_embeddings=True, position_embedding_type="absolute")


def bert_rules(m: ModelConfig):
  e = "bert.embeddings"
  r = [same(f"{e}.word_embeddings.weight", "embedding/embedding"),
       same(f"{e}.position_embeddings.weight", "positions/embedding"),
       same(f"{e}.token_type_embeddings.weight", "token_types/embedding")]
  add_norm(r, f"{e}.LayerNorm", "embed_norm")
  for i in range(m.num_layers):
    hf, t = f"bert.encoder.layer.{i}", f"encoder/layer_{i}"
    add_attention(r, f"{hf}.attention", f"{t}/self_attention", m.num_heads, m.num_heads,
               ("self.query", "self.key", "self.value", "output.dense"), True)
    add_norm(r, f"{hf}.attention.output.LayerNorm", f"{t}/self_attention_norm")
    add_dense(r, f"{hf}.intermediate.dense", f"{t}/ffn/wi")
    add_dense(r, f"{hf}.output.dense", f"{t}/ffn/wo")
    add_norm(r, f"{hf}.output.LayerNorm", f"{t}/ffn_norm")
  add_dense(r, "cls.predictions.transform.dense", "mlm_dense")
  add_norm(r, "cls.predictions.transform.LayerNorm", "mlm_norm")
  r.append(same("cls.predictions.bias", "mlm_bias"))
  return r
