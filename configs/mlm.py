"""Encoder-only masked language model (BERT style).

  python -m tfx_jax.train --config configs/mlm.py:tiny --workdir runs/mlm_tiny
  python -m tfx_jax.summary --config configs/mlm.py:bert_base

Mask rate 0.15 by default (BERT); ``--config.data.mask_rate=0.2`` as in seed 003.
Presets: tiny, bert_base.
"""

from tfx_jax.config_base import base_config, set_sizes

PRESETS = ("tiny", "bert_base")


def get_config(preset: str = "tiny"):
  c = base_config()
  c.task = "mlm"
  c.data.mask_rate = 0.15
  # BERT (Devlin et al. 2019): post-norm, GELU, learned positions, biases, tied.
  set_sizes(c.model, family="encoder_only", norm_position="post", norm_type="layernorm",
            activation="gelu", position="learned", use_bias=True, tie_embeddings=True)
  if preset == "tiny":
    set_sizes(c.model, num_layers=2, d_model=128, num_heads=4, vocab_size=1024,
              max_len=128, dropout=0.0)
    c.data.vocab_size = 1024
    c.train.update(num_steps=300, batch_size=16, seq_len=64, log_every_steps=25)
    c.eval.update(every_steps=100, num_batches=4, batch_size=16)
    c.checkpoint.every_steps = 100
    c.optim.update(learning_rate=2e-3, warmup_steps=30)
  elif preset == "bert_base":
    set_sizes(c.model, num_layers=12, d_model=768, num_heads=12, d_ff=3072,
              vocab_size=30522, max_len=512, dropout=0.1, norm_eps=1e-12)
    c.data.vocab_size = 30522
    c.train.update(num_steps=1_000_000, batch_size=256, seq_len=512)
    c.optim.update(learning_rate=1e-4, warmup_steps=10_000, weight_decay=0.01,
                   schedule="cosine", b2=0.999, eps=1e-6)
  else:
    raise ValueError(f"unknown preset {preset!r} for configs/mlm.py; choose one of: "
                     f"{', '.join(PRESETS)}")
  c.lock()
  return c
