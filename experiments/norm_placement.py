"""Norm placement with and without warmup, each at its own best learning rate
(Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

  python -m tfx_jax.sweep experiments/norm_placement.py:tiny
  python -m tfx_jax.sweep experiments/norm_placement.py --parallel 2
  python -m tfx_jax.report runs/norm_placement

Axes: ``model.norm_position`` post / pre x warmup (``optim.warmup_steps`` 50 of
300 steps, or none), every point trained at each learning rate of ``RATES``
(Adam, cosine decay, gradient clipping off as in the paper) and compared at
its best one on fresh confirmation seeds, paired. A 6-layer d_model 128 LM.

Published direction: post-LN needs the warmup stage, pre-LN does not (IWSLT14:
post-LN without warmup 8.45 BLEU, with warmup ~34; pre-LN without warmup
trains); post-LN's gradient norm at initialisation grows towards the top
layers, pre-LN's does not (Figure 3). The report's tuned-values table and
sensitivity curves give the loss at every rate, so "post-norm fails without
warmup at a rate where pre-norm trains" is read at each rate, and the verdicts
say whether it still holds at each point's best rate. ``train.log_layer_stats``
logs the per-layer gradient norms of the first update, taken at the initial
parameters; runs that do not get below the unigram loss count as stalled.

Variants: ``tiny`` (post vs pre, no warmup, 2 rates, 1 confirmation seed),
``default`` (the 2 x 2 core, four rates, 2 tuning seeds, then 2 confirmation
seeds at each point's chosen rate, 300 steps: 32 + 8 runs, about 38 minutes
on 2 CPU cores with ``--parallel 2``).
"""

from tfx_jax.sweep import Sweep

RATES = [3e-4, 1e-3, 3e-3, 1e-2]
WARMUP = {"optim.warmup_steps": [50, 0]}  # with, without


def _base(steps: int) -> dict:
  return {"model.num_layers": 6, "model.d_model": 128, "model.num_heads": 4,
          "model.norm_type": "layernorm", "optim.grad_clip_norm": 0.0,
          "train.num_steps": steps, "optim.decay_steps": steps,
          "train.log_every_steps": 10, "eval.every_steps": steps // 2,
          "checkpoint.every_steps": steps // 2, "eval.num_samples": 0,
          "model.scan_layers": True, "train.log_layer_stats": True}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="norm_placement_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 3, "model.d_model": 64,
                   "optim.warmup_steps": 0},
        axes=[{"model.norm_position": ["post", "pre"]}],
        tune={"optim.learning_rate": [1e-3, 1e-2]}, seeds=[0], confirm=1)
  if variant == "default":
    return Sweep(
        name="norm_placement", config="configs/lm.py:tiny",
        description="Post- vs pre-LayerNorm, with and without warmup, learning rate "
        "tuned per point, clipping off (Xiong et al. 2020); 6-layer d_model 128 LM.",
        overrides=_base(300),
        axes=[{"model.norm_position": ["post", "pre"]}, WARMUP],
        tune={"optim.learning_rate": RATES}, seeds=[0, 1], confirm=2)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
