"""Decoder-only language model (GPT / LLaMA style).

  python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/lm_tiny
  python -m tfx_jax.summary --config configs/lm.py:llama_7b

Presets: tiny (default data: the embedded Shakespeare corpus, ~1 minute on
2 CPU cores), gpt2_small, llama_7b, llama_13b, llama_33b, llama_65b.
"""

from tfx_jax.config_base import base_config, set_sizes

# LLaMA (Touvron et al. 2023, Table 2): d_model, heads, layers. d_ff follows
# LLaMA's rule: 2/3 * 4d rounded up to a multiple of 256.
_LLAMA = {
    "llama_7b": (4096, 32, 32),
    "llama_13b": (5120, 40, 40),
    "llama_33b": (6656, 52, 60),
    "llama_65b": (8192, 64, 80),
}
PRESETS = ("tiny", "small", "gpt2_small") + tuple(_LLAMA)


def get_config(preset: str = "tiny"):
  c = base_config()
  c.task = "lm"
  m = c.model
  set_sizes(m, family="decoder_only", norm_position="pre", norm_type="layernorm",
            activation="gelu", position="rope", use_bias=False, tie_embeddings=True)
  if preset == "tiny":
    set_sizes(m, num_layers=2, d_model=128, num_heads=4, dropout=0.0, max_len=256,
              vocab_size=1024)
    c.data.vocab_size = 1024
    c.train.update(num_steps=500, batch_size=16, seq_len=64, log_every_steps=25)
    c.eval.update(every_steps=100, num_batches=4, batch_size=16)
    c.checkpoint.every_steps = 100
    c.optim.update(learning_rate=3e-3, warmup_steps=30, schedule="cosine")
  elif preset == "small":
    set_sizes(m, num_layers=6, d_model=384, num_heads=6, dropout=0.1, max_len=512,
              vocab_size=8192)
    c.data.vocab_size = 8192
    c.train.update(num_steps=5000, batch_size=32, seq_len=256)
    c.optim.update(learning_rate=1e-3, warmup_steps=500)
  elif preset == "gpt2_small":
    # Radford et al. 2019: 12 layers, d 768, 12 heads, learned positions (1024),
    # GELU, pre-norm LayerNorm, biases, tied embeddings, vocab 50257.
    set_sizes(m, num_layers=12, d_model=768, num_heads=12, d_ff=3072, vocab_size=50257,
              max_len=1024, position="learned", activation="gelu", use_bias=True,
              norm_eps=1e-5, dropout=0.1, tie_embeddings=True)
    c.data.vocab_size = 50257
    c.train.seq_len = 1024
  elif preset in _LLAMA:
    d, h, n = _LLAMA[preset]
    set_sizes(m, num_layers=n, d_model=d, num_heads=h, vocab_size=32000, max_len=2048,
              norm_type="rmsnorm", activation="swiglu", ff_multiple_of=256,
              position="rope", use_bias=False, tie_embeddings=False, norm_eps=1e-6,
              scan_layers=True, remat="full", dtype="bfloat16")
    c.data.vocab_size = 32000
    c.train.seq_len = 2048
    c.compute_dtype = "bfloat16"
  else:
    raise ValueError(f"unknown preset {preset!r} for configs/lm.py; choose one of: "
                     f"{', '.join(PRESETS)}")
  c.lock()
  return c
