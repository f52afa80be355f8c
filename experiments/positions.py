"""Position schemes and length extrapolation (Press et al. 2022, "Train Short,
Test Long: Attention with Linear Biases"), and RoPE scaled at evaluation
(Chen et al. 2023, position interpolation; Peng et al. 2023, YaRN).

  python -m tfx_jax.sweep experiments/positions.py:tiny
  python -m tfx_jax.sweep experiments/positions.py --parallel 2
  python -m tfx_jax.report runs/positions

All six ``model.position`` schemes, trained at 64 tokens and evaluated after
training on the test split in windows of 1x, 2x, 4x and 8x that length
(``python -m tfx_jax.evaluate --lengths 1x,2x,4x,8x --split test``). The RoPE
runs are evaluated twice more with their rotary positions scaled for the 8x
window, as trained otherwise: linear interpolation (``--rope_scaling linear
--rope_scaling_factor 8``) and YaRN (``--rope_scaling yarn``, from the 64-token
training context), each a row of its own in the report's length table.

Token embeddings: every scheme gets the paper's embedding scale, N(0, 1/d)
scaled by sqrt(d) (``model.embedding_init=normal``,
``model.scale_embeddings=True``; Vaswani et al. 2017, and fairseq, whose models
the ALiBi paper trains). With the LM config's default (Glorot-uniform over
vocab x d_model, unscaled: std ~0.04 per dimension) the sinusoidal table
(std ~0.71) drowns the tokens, which made sinusoidal positions look worse than
none at the training length.

Published direction (WikiText-103, trained at 512): sinusoidal and rotary
perplexity explodes beyond the training length, T5 bias degrades slowly, ALiBi
stays flat or improves; learned positions cannot go beyond what they were
trained on. Position interpolation and YaRN extend a RoPE model's context;
the papers fine-tune briefly after scaling (YaRN also reports results without
fine-tuning), here they are applied at evaluation only.

Each scheme is compared at its own best learning rate (``RATES``, chosen on
the validation split of the tuning seeds), on 2 fresh confirmation seeds,
paired.

Variants: ``tiny`` (alibi vs rope, with the scaled evaluations, 1 seed), ``default`` (all six, three
learning rates, 2 tuning seeds, then 2 confirmation seeds at each scheme's
chosen rate, 800 steps: 36 + 12 runs, about 60 minutes on 2 CPU cores with
``--parallel 2``).
"""

from tfx_jax.sweep import Evaluation, Sweep

SCHEMES = ["sinusoidal", "learned", "t5_bias", "rope", "alibi", "none"]
RATES = [1e-3, 3e-3, 1e-2]
# The paper's embedding scale for every scheme (see the docstring).
EMBEDDINGS = {"model.embedding_init": "normal", "model.scale_embeddings": True}


def _evaluations(max_batches: int) -> list:
  lengths = ["--lengths", "1x,2x,4x,8x", "--max_batches", str(max_batches), "--split", "test"]
  rope = {"model.position": "rope"}
  return [lengths,
          Evaluation([*lengths, "--rope_scaling", "linear", "--rope_scaling_factor", "8"],
                     when=rope),
          Evaluation([*lengths, "--rope_scaling", "yarn", "--rope_scaling_factor", "8"],
                     when=rope)]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="positions_tiny", config="configs/lm.py:tiny",
        overrides={**EMBEDDINGS, "train.num_steps": 60, "model.d_model": 64,
                   "model.max_len": 512, "eval.every_steps": 30,
                   "checkpoint.every_steps": 30, "eval.num_samples": 0,
                   "optim.warmup_steps": 10},
        axes=[{"model.position": ["alibi", "rope"]}], seeds=[0],
        evaluations=_evaluations(2))
  if variant == "default":
    return Sweep(
        name="positions", config="configs/lm.py:tiny",
        description="Six position schemes trained at 64 tokens, perplexity at 1x-8x "
        "the training length (Press et al. 2022); RoPE also with linear and YaRN "
        "scaling at evaluation; every scheme with N(0, 1/d) x sqrt(d) token embeddings.",
        overrides={**EMBEDDINGS, "train.num_steps": 800, "model.max_len": 512,
                   "eval.every_steps": 200, "checkpoint.every_steps": 200,
                   "eval.num_samples": 0, "optim.warmup_steps": 50},
        axes=[{"model.position": SCHEMES}], tune={"optim.learning_rate": RATES},
        seeds=[0, 1], confirm=2, evaluations=_evaluations(8))
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
