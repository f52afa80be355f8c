"""Encoder-decoder translation: the original Transformer (Vaswani et al. 2017).

  python -m tfx_jax.train --config configs/translate.py:tiny --workdir runs/mt_tiny
  python -m tfx_jax.summary --config configs/translate.py:base

The default recipe is Transformer-base's: post-norm, sinusoidal positions,
ReLU FFN, Adam(0.9, 0.98, eps 1e-9), lr = d_model^-0.5 * min(step^-0.5,
step * 4000^-1.5), label smoothing 0.1, dropout 0.1, tied embeddings over a
shared vocabulary. Default data: the embedded en->de corpus.
Presets: tiny, base, big.
"""

from tfx_jax.config_base import base_config, set_sizes

PRESETS = ("tiny", "base", "big")


def get_config(preset: str = "base"):
  c = base_config()
  c.task = "translate"
  c.data.name = "tfx_gcc_translate/de"
  set_sizes(c.model, family="encoder_decoder", norm_position="post", scale_embeddings=True,
            norm_type="layernorm", activation="relu", position="sinusoidal",
            use_bias=True, tie_embeddings=True, dropout=0.1, norm_eps=1e-6)
  c.optim.update(optimizer="adam", b1=0.9, b2=0.98, eps=1e-9, schedule="inverse_sqrt",
                 warmup_steps=4000, scale_by_d_model=True, learning_rate=1.0,
                 weight_decay=0.0, grad_clip_norm=0.0)
  c.train.label_smoothing = 0.1
  if preset == "base":
    set_sizes(c.model, num_layers=6, d_model=512, num_heads=8, d_ff=2048,
              vocab_size=37000, max_len=256)
    c.data.vocab_size = 37000
    c.train.update(num_steps=100_000, batch_size=64, seq_len=128)
  elif preset == "big":
    set_sizes(c.model, num_layers=6, d_model=1024, num_heads=16, d_ff=4096,
              vocab_size=37000, max_len=256, dropout=0.3)
    c.data.vocab_size = 37000
    c.train.update(num_steps=300_000, batch_size=64, seq_len=128)
  elif preset == "tiny":
    set_sizes(c.model, num_layers=2, d_model=128, num_heads=4, d_ff=512,
              vocab_size=2048, max_len=64, dropout=0.1)
    c.data.vocab_size = 2048
    c.train.update(num_steps=400, batch_size=32, seq_len=48, log_every_steps=25)
    c.eval.update(every_steps=200, num_batches=4, batch_size=32, num_bleu_examples=32)
    c.checkpoint.every_steps = 200
    # The paper's schedule at this scale: warmup shortened, same shape.
    c.optim.update(warmup_steps=100, learning_rate=0.5)
  else:
    raise ValueError(f"unknown preset {preset!r} for configs/translate.py; choose one "
                     f"of: {', '.join(PRESETS)}")
  c.lock()
  return c
