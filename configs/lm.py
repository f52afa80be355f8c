"""Decoder-only language model (GPT / LLaMA style).

  python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/lm_tiny
  python -m tfx_jax.summary --config configs/lm.py:llama_7b

Presets: tiny (default data: the embedded Shakespeare corpus, ~1 minute on
2 CPU cores), small, gpt2_small, llama_7b, llama_13b, llama_33b, llama_65b.
Each preset is one row of ``_PRESETS``, applied over ``_COMMON``.

``moe_variant(preset, ...)`` gives the overrides that turn a preset's dense
FFN into a mixture of experts with the same active, or the same total,
parameters, for a sweep axis of dense vs MoE (experiments/moe.py):

  python -m tfx_jax.summary --config configs/lm.py:tiny --config.model.ffn_type=moe \
      --config.model.expert_d_ff=254     # = moe_variant("tiny")["model.expert_d_ff"]
"""

from tfx_jax.run.config_base import apply_preset, base_config, select_preset
from tfx_jax.model.config import model_config_from_dict

# Every preset starts from these; a row overrides what its paper does differently.
# No embedding scaling: GPT-2 and LLaMA add positions to E[id] as it is.
_COMMON = {
    "model": dict(family="decoder_only", norm_position="pre", norm_type="layernorm",
                  activation="gelu", position="rope", use_bias=False,
                  tie_embeddings=True, scale_embeddings=False),
}

# LLaMA (Touvron et al. 2023, Table 2): d_model, heads, layers. d_ff follows
# LLaMA's rule: 2/3 * 4d rounded up to a multiple of 256.
_LLAMA = {
    "llama_7b": (4096, 32, 32),
    "llama_13b": (5120, 40, 40),
    "llama_33b": (6656, 52, 60),
    "llama_65b": (8192, 64, 80),
}


def _llama(d_model, num_heads, num_layers):
  return {
      "vocab_size": 32000,
      "model": dict(num_layers=num_layers, d_model=d_model, num_heads=num_heads,
                    max_len=2048, norm_type="rmsnorm", activation="swiglu",
                    ff_multiple_of=256, position="rope", use_bias=False,
                    tie_embeddings=False, norm_eps=1e-6, scan_layers=True, remat="full"),
      "train": dict(seq_len=2048),
      "compute_dtype": "bfloat16",
  }


_PRESETS = {
    "tiny": {
        "vocab_size": 1024,
        "model": dict(num_layers=2, d_model=128, num_heads=4, dropout=0.0, max_len=256),
        "train": dict(num_steps=500, batch_size=16, seq_len=64, log_every_steps=25),
        # The whole validation split (num_batches=0) at steps 0, 250 and 500: 4
        # batches (64 rows) gave the final loss an evaluation standard error of
        # 0.053 nats, as large as the seed-to-seed spread (0.038 at 300 steps); the
        # whole split (3,276 rows) 0.007, under a quarter of it.
        "eval": dict(every_steps=250, num_batches=0, batch_size=16),
        "checkpoint": dict(every_steps=100),
        "optim": dict(learning_rate=3e-3, warmup_steps=30, schedule="cosine"),
    },
    "small": {
        "vocab_size": 8192,
        "model": dict(num_layers=6, d_model=384, num_heads=6, dropout=0.1, max_len=512),
        "train": dict(num_steps=5000, batch_size=32, seq_len=256),
        "optim": dict(learning_rate=1e-3, warmup_steps=500),
    },
    # Radford et al. 2019: 12 layers, d 768, 12 heads, learned positions (1024),
    # GELU, pre-norm LayerNorm, biases, tied embeddings, vocab 50257; dropout 0.1
    # on the residual, embedding and attention probabilities (GPT-1, and GPT-2's
    # released hyper-parameters: resid/embd/attn_pdrop 0.1).
    "gpt2_small": {
        "vocab_size": 50257,
        "compute_dtype": "bfloat16",  # a GPU preset: bf16 compute, float32 parameters
        "model": dict(num_layers=12, d_model=768, num_heads=12, d_ff=3072, max_len=1024,
                      position="learned", activation="gelu", use_bias=True,
                      norm_eps=1e-5, dropout=0.1, attention_dropout=0.1,
                      tie_embeddings=True),
        "train": dict(seq_len=1024),
    },
    **{name: _llama(*sizes) for name, sizes in _LLAMA.items()},
}
PRESETS = tuple(_PRESETS)


def get_config(preset: str = "tiny"):
  row = select_preset(_PRESETS, preset, "lm.py")
  c = base_config()
  c.task = "lm"
  apply_preset(c, _COMMON)
  apply_preset(c, row)
  c.lock()
  return c


def moe_variant(preset: str = "tiny", *, num_experts: int = 8, experts_per_token: int = 2,
                shared_experts: int = 0, match: str = "active") -> dict:
  """``model.*`` overrides of a MoE variant of ``preset`` whose FFN layers
  have as many active (``match="active"``: what a token computes with) or
  total (``"total"``) parameters as the dense FFN, in the dense model's
  activation (each expert gated or not as the preset's FFN).

  A dense FFN of width F with m matrices of D x F (m = 2, or 3 gated) has
  m D F parameters; the MoE layer has a router of D E and experts of width
  F_e, of which k + s are active (k routed, s shared) and E + s exist, so
  the width that matches is
    active: m D F = m D F_e (k + s) + D E  ->  F_e = (m F - E) / (m (k + s)),
    total:  m D F = m D F_e (E + s) + D E  ->  F_e = (m F - E) / (m (E + s)),
  rounded down (``python -m tfx_jax.summary`` prints both counts). Matched
  active parameters is Fedus et al. 2022's and OLMoE's comparison (same
  FLOPs per token); matched total, the same memory.
  """
  if match not in ("active", "total"):
    raise ValueError(f"match={match!r}; choose 'active' or 'total'")
  cfg = model_config_from_dict(get_config(preset).model)
  m = 3 if cfg.gated else 2
  experts = experts_per_token if match == "active" else num_experts
  width = (m * cfg.ffn_dim - num_experts) // (m * (experts + shared_experts))
  if width < 1:
    raise ValueError(f"{preset}: no expert width matches {match} parameters with "
                     f"{num_experts} experts, {experts_per_token} per token and "
                     f"{shared_experts} shared (dense FFN width {cfg.ffn_dim})")
  return {"model.ffn_type": "moe", "model.num_experts": num_experts,
          "model.experts_per_token": experts_per_token,
          "model.shared_experts": shared_experts, "model.expert_d_ff": width}
