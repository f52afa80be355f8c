"""Encoder-only masked language model (BERT style).

  python -m tfx_jax.train --config configs/mlm.py:tiny --workdir runs/mlm_tiny
  python -m tfx_jax.summary --config configs/mlm.py:bert_base

Mask rate 0.15 by default (BERT); ``--config.data.mask_rate=0.2`` as in textbook chapter 003.
Presets: tiny, bert_base. Each preset is one row of ``_PRESETS``, applied over
``_COMMON``.
"""

from tfx_jax.run.config_base import apply_preset, base_config, select_preset

# BERT (Devlin et al. 2019): post-norm, GELU, learned positions, biases, tied,
# no embedding scaling (the embedding LayerNorm normalises the sum instead).
_COMMON = {
    "data": dict(mask_rate=0.15),
    "model": dict(family="encoder_only", norm_position="post", norm_type="layernorm",
                  activation="gelu", position="learned", use_bias=True,
                  tie_embeddings=True, scale_embeddings=False),
}

_PRESETS = {
    "tiny": {
        "vocab_size": 1024,
        "model": dict(num_layers=2, d_model=128, num_heads=4, max_len=128, dropout=0.0),
        "train": dict(num_steps=300, batch_size=16, seq_len=64, log_every_steps=25),
        # The whole validation split (num_batches=0), as configs/lm.py:tiny.
        "eval": dict(every_steps=150, num_batches=0, batch_size=16),
        "checkpoint": dict(every_steps=100),
        "optim": dict(learning_rate=2e-3, warmup_steps=30),
    },
    # BERT-base: dropout 0.1 everywhere (attention probabilities included);
    # Adam(0.9, 0.999, eps 1e-6), weight decay 0.01, lr 1e-4 with 10k warmup
    # steps, then linear decay to 0.
    "bert_base": {
        "vocab_size": 30522,
        "compute_dtype": "bfloat16",  # a GPU preset: bf16 compute, float32 parameters
        "model": dict(num_layers=12, d_model=768, num_heads=12, d_ff=3072, max_len=512,
                      dropout=0.1, attention_dropout=0.1, norm_eps=1e-12),
        "train": dict(num_steps=1_000_000, batch_size=256, seq_len=512),
        "optim": dict(learning_rate=1e-4, warmup_steps=10_000, weight_decay=0.01,
                      schedule="linear", b2=0.999, eps=1e-6),
    },
}
PRESETS = tuple(_PRESETS)


def get_config(preset: str = "tiny"):
  row = select_preset(_PRESETS, preset, "mlm.py")
  c = base_config()
  c.task = "mlm"
  apply_preset(c, _COMMON)
  apply_preset(c, row)
  c.lock()
  return c
