"""Encoder-decoder translation: the original Transformer (Vaswani et al. 2017).

  python -m tfx_jax.train --config configs/translate.py:tiny --workdir runs/mt_tiny
  python -m tfx_jax.summary --config configs/translate.py:base

The default recipe is Transformer-base's: post-norm, sinusoidal positions,
ReLU FFN, N(0, 1/d_model) embeddings x sqrt(d_model), Adam(0.9, 0.98, eps 1e-9), lr =
d_model^-0.5 * min(step^-0.5, step * 4000^-1.5), label smoothing 0.1,
dropout 0.1, tied embeddings over a shared vocabulary. Default data: the
embedded en->de corpus.
Presets: tiny, base, big. Each preset is one row of ``_PRESETS``, applied over
``_COMMON``.
"""

from tfx_jax.run.config_base import apply_preset, base_config, select_preset

# Vaswani et al. 2017, section 3.4 scales the embeddings by sqrt(d_model);
# scale_embeddings keeps that whatever model.position is set to. The token
# table is N(0, 1/d_model) as in tensor2tensor, the paper's code, so scaled
# tokens have unit variance beside the sinusoidal table's 0.71 (Glorot-uniform
# scaled would be ~0.34 at d=128, V=2048: positions would drown the tokens).
# With model.position=learned, set model.learned_position_init=token: the
# table then starts as the tokens do (GPT-2's 0.02 would start ~50 times smaller).
_COMMON = {
    "data": dict(name="tfx_gcc_translate/de"),
    "model": dict(family="encoder_decoder", norm_position="post", norm_type="layernorm",
                  activation="relu", position="sinusoidal", use_bias=True,
                  tie_embeddings=True, scale_embeddings=True, embedding_init="normal",
                  dropout=0.1, norm_eps=1e-6),
    "optim": dict(optimizer="adam", b1=0.9, b2=0.98, eps=1e-9, schedule="inverse_sqrt",
                  warmup_steps=4000, scale_by_d_model=True, learning_rate=1.0,
                  weight_decay=0.0, grad_clip_norm=0.0),
    "train": dict(label_smoothing=0.1),
}

_PRESETS = {
    "tiny": {
        "vocab_size": 2048,
        "model": dict(num_layers=2, d_model=128, num_heads=4, d_ff=512, max_len=64,
                      dropout=0.1),
        "train": dict(num_steps=400, batch_size=32, seq_len=48, log_every_steps=25),
        # The whole validation split (num_batches=0: 709 pairs), as configs/lm.py:tiny.
        "eval": dict(every_steps=200, num_batches=0, batch_size=32, num_bleu_examples=32),
        "checkpoint": dict(every_steps=200),
        # The paper's schedule at this scale: warmup shortened, same shape.
        "optim": dict(warmup_steps=100, learning_rate=0.5),
    },
    "base": {
        "vocab_size": 37000,
        "compute_dtype": "bfloat16",  # a GPU preset: bf16 compute, float32 parameters
        "model": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, max_len=256),
        "train": dict(num_steps=100_000, batch_size=64, seq_len=128),
    },
    "big": {
        "vocab_size": 37000,
        "compute_dtype": "bfloat16",
        "model": dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, max_len=256,
                      dropout=0.3),
        "train": dict(num_steps=300_000, batch_size=64, seq_len=128),
    },
}
PRESETS = tuple(_PRESETS)


def get_config(preset: str = "base"):
  row = select_preset(_PRESETS, preset, "translate.py")
  c = base_config()
  c.task = "translate"
  apply_preset(c, _COMMON)
  apply_preset(c, row)
  c.lock()
  return c
