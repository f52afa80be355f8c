"""Position schemes and length extrapolation (Press et al. 2022, "Train Short,
Test Long: Attention with Linear Biases").

  python -m tfx_jax.sweep experiments/positions.py:tiny
  python -m tfx_jax.sweep experiments/positions.py --parallel 2
  python -m tfx_jax.report runs/positions

All six ``model.position`` schemes, trained at 64 tokens and evaluated after
training on windows of 1x, 2x, 4x and 8x that length
(``python -m tfx_jax.evaluate --lengths 1x,2x,4x,8x``). Published direction
(WikiText-103, trained at 512): sinusoidal and rotary perplexity explodes
beyond the training length, T5 bias degrades slowly, ALiBi stays flat or
improves. Learned positions cannot go beyond what they were trained on.

Variants: ``tiny`` (alibi vs sinusoidal, 1 seed), ``default`` (all six,
2 seeds, 800 steps; ~25 minutes on 2 CPU cores).
"""

from tfx_jax.sweep import Sweep

SCHEMES = ["sinusoidal", "learned", "t5_bias", "rope", "alibi", "none"]
LENGTHS = [["--lengths", "1x,2x,4x,8x", "--max_batches", "8"]]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="positions_tiny", config="configs/lm.py:tiny",
        overrides={"train.num_steps": 60, "model.d_model": 64, "model.max_len": 512,
                   "eval.every_steps": 30, "checkpoint.every_steps": 30,
                   "eval.num_samples": 0, "optim.warmup_steps": 10},
        axes=[{"model.position": ["sinusoidal", "alibi"]}], seeds=[0],
        evaluations=[["--lengths", "1x,2x,4x,8x", "--max_batches", "2"]])
  if variant == "default":
    return Sweep(
        name="positions", config="configs/lm.py:tiny",
        description="Six position schemes trained at 64 tokens, perplexity at 1x-8x "
        "the training length (Press et al. 2022).",
        overrides={"train.num_steps": 800, "model.max_len": 512,
                   "eval.every_steps": 200, "checkpoint.every_steps": 200,
                   "eval.num_samples": 0, "optim.warmup_steps": 50},
        axes=[{"model.position": SCHEMES}], seeds=[0, 1], evaluations=LENGTHS)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
