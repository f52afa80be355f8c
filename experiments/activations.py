"""Feed-forward activations at matched parameters (Shazeer 2020, "GLU Variants
Improve Transformer").

  python -m tfx_jax.sweep experiments/activations.py:tiny      # ~2 minutes
  python -m tfx_jax.sweep experiments/activations.py --parallel 2
  python -m tfx_jax.report runs/activations

Gated FFNs use d_ff = 2/3 * 4 * d_model (the model's default for gated
activations), so every point has the same parameter count up to rounding, as
in the paper (d_ff 3072 plain vs 2048 gated). Published direction (T5-base,
65k steps): the gated variants beat ReLU by 0.03-0.055 nats of held-out
log-perplexity; ReLU, GELU and Swish are within ~0.015 of each other.

Each activation's learning rate is chosen over ``RATES`` on the validation
split of tuning seed 0;
then each activation runs 8 fresh confirmation seeds at its chosen rate
(``confirm``), and the comparisons read those, seeds paired, at the full
alpha (a fixed number of seeds, so no sequential correction is needed).
Power: the last run's paired differences against GELU had a seed spread of
0.028-0.031 nats for the gated variants (0.044-0.046 apart) and 0.012 for
ReLU (0.028 apart); with Holm over the 3 comparisons, 8 paired seeds detect
the gated differences with about 80% power (5 would give 40%) and ReLU's
with more than 99%. Its 5 seeds were the seeds that chose the rate; these
are not.

Variants: ``tiny`` (smoke test), ``default`` (two plain, two gated, three
learning rates on seed 0, then 8 confirmation seeds, 1000 steps of the tiny
LM: 12 tuning and 32 confirmation runs, about 2.5 minutes each at the last
run's 8,700-10,900 tokens/s with evaluations: about 55 minutes on 2 CPU
cores with ``--parallel 2``), ``full`` (all eight, 5 tuning and 3
confirmation seeds, a 4-layer d_model 256 LM: for a GPU or a long night).
"""

from tfx_jax.sweep import Claim, Sweep

PLAIN = ["relu", "gelu", "swish"]
GATED = ["glu", "reglu", "geglu", "swiglu", "bilinear"]
RATES = [1e-3, 3e-3, 1e-2]
SHAZEER = "Shazeer 2020"


def _claims() -> list[Claim]:
  """Shazeer's Table 1 (T5-base, 65k steps, held-out log-perplexity), each
  against GELU at matched parameters."""
  return [
      Claim("geglu_vs_gelu", SHAZEER, "at matched parameters the gated GeGLU FFN reaches "
            "a lower loss than GELU (-0.041 nats in the paper)",
            compare=("geglu", "gelu"), metric="eval/loss", expect="lower"),
      Claim("swiglu_vs_gelu", SHAZEER, "at matched parameters the gated SwiGLU FFN reaches "
            "a lower loss than GELU (-0.039 nats in the paper)",
            compare=("swiglu", "gelu"), metric="eval/loss", expect="lower"),
      Claim("relu_vs_gelu", SHAZEER, "ReLU trails GELU (+0.014 nats in the paper)",
            compare=("relu", "gelu"), metric="eval/loss", expect="higher")]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="activations_tiny", config="configs/lm.py:tiny",
        overrides={"train.num_steps": 60, "model.d_model": 64, "eval.every_steps": 30,
                   "checkpoint.every_steps": 30, "eval.num_samples": 0,
                   "optim.warmup_steps": 10},
        axes=[{"model.activation": ["relu", "swiglu"]}], seeds=[0, 1])
  if variant == "default":
    return Sweep(
        name="activations", config="configs/lm.py:tiny",
        description="Plain vs gated FFN activations at matched parameters "
        "(Shazeer 2020), tiny decoder-only LM on the embedded Shakespeare corpus.",
        overrides={"train.num_steps": 1000, "eval.every_steps": 250,
                   "checkpoint.every_steps": 250,
                   "eval.num_samples": 0, "optim.warmup_steps": 50},
        axes=[{"model.activation": ["relu", "gelu", "geglu", "swiglu"]}],
        tune={"optim.learning_rate": RATES}, seeds=[0], confirm=8, claims=_claims())
  if variant == "full":
    return Sweep(
        name="activations_full", config="configs/lm.py:tiny",
        overrides={"model.num_layers": 4, "model.d_model": 256, "model.num_heads": 8,
                   "train.num_steps": 5000, "train.seq_len": 128,
                   "model.dropout": 0.0, "eval.every_steps": 1000,
                   "checkpoint.every_steps": 1000,
                   "optim.warmup_steps": 200},
        axes=[{"model.activation": PLAIN + GATED}],
        tune={"optim.learning_rate": RATES}, seeds=[0, 1, 2, 3, 4], confirm=3)
  raise ValueError(f"unknown variant {variant!r}; choose tiny, default or full")
