"""bf16 computation against float32: does the tiny LM train the same?

  python -m tfx_jax.sweep experiments/mixed_precision.py --parallel 2 --equivalence-margin 0.02
  python -m tfx_jax.report runs/mixed_precision

Axis: ``compute_dtype`` float32 / bfloat16. In bf16 the products and
activations are bf16; parameters, the optimizer state and the softmax / loss
statistics stay float32 (docs/configs.md, ``compute_dtype``). The claim to
check is that bf16 trains like float32: the report's paired difference in
test loss, with its interval, against an equivalence band of 0.02 nats
(``--equivalence-margin 0.02``).

Variants: ``tiny`` (1 seed, 40 steps: a smoke test), ``default`` (the tiny LM's
500 steps, 4 seeds: 8 runs, about 6 minutes on 2 CPU cores with
``--parallel 2``).
"""

from tfx_jax.sweep import Claim, Equivalent, Sweep

AXIS = {"compute_dtype": ["float32", "bfloat16"]}


def _claims() -> list[Claim]:
  """bf16 trains like float32 with the same hyperparameters (Kalamkar et al.
  2019), within the sweep's band of 0.02 nats (``--equivalence-margin``)."""
  return [Claim(
      "bf16_level", "Kalamkar et al. 2019", "bf16 computation with float32 parameters, "
      "optimizer state and loss statistics trains like float32",
      compare=("bfloat16", "float32"), metric="eval/loss", expect=Equivalent(0.02))]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="mixed_precision_tiny", config="configs/lm.py:tiny",
        overrides={"train.num_steps": 40, "eval.every_steps": 20,
                   "checkpoint.every_steps": 20, "eval.num_samples": 0,
                   "optim.warmup_steps": 10},
        axes=[AXIS], seeds=[0])
  if variant == "default":
    return Sweep(
        name="mixed_precision", config="configs/lm.py:tiny",
        description="float32 vs bf16 computation (float32 parameters, optimizer and "
        "loss statistics) on the tiny LM, 4 seeds paired.",
        overrides={"eval.num_samples": 0}, axes=[AXIS], seeds=[0, 1, 2, 3],
        evaluations=[["--split", "test"]], claims=_claims())
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
