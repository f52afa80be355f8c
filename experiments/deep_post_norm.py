"""Deep stacks: post-norm vs pre-norm vs DeepNorm, learning rate tuned per point
(Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers").

  python -m tfx_jax.sweep experiments/deep_post_norm.py:tiny
  python -m tfx_jax.sweep experiments/deep_post_norm.py --parallel 2
  python -m tfx_jax.report runs/deep_post_norm

``model.norm_position`` post / pre / deepnorm x depth 6 / 24 (scanned layers:
compile time flat in depth), every point trained at each rate of ``RATES``
with the same warmup, and compared at its best rate on 2 fresh confirmation
seeds, paired; each norm is compared with pre-norm at the same depth (pre-norm
is the axis's base).
600 steps, so that 24 layers are not simply under-trained. The report's
tuned-values table gives the loss of every point at every rate: the paper's
claim is read at the rates where 6-layer post-norm trains.

Published direction: at a rate where a shallow post-LN model trains, post-LN
degrades or diverges as depth grows; DeepNorm (x_{l+1} = LN(alpha x_l +
F(x_l)), alpha = (2N)^(1/4), beta-scaled init) trains the deep stack and
matches or beats pre-LN.

Variants: ``tiny`` (post vs deepnorm at 12 layers), ``default`` (3 norms x 2
depths x three rates, 2 tuning seeds, then 2 confirmation seeds at each
point's chosen rate, 600 steps of a d_model 64 LM: 36 + 12 runs, about 80
minutes on 2 CPU cores with ``--parallel 2``: a 6-layer run takes ~80 s, a
24-layer one ~5 minutes).
"""

from tfx_jax.sweep import Sweep

RATES = [1e-3, 3e-3, 1e-2]


def _base(steps: int) -> dict:
  return {"model.d_model": 64, "model.num_heads": 4, "model.scan_layers": True,
          "optim.warmup_steps": steps // 10, "train.num_steps": steps,
          "optim.decay_steps": steps, "eval.every_steps": steps // 2,
          "checkpoint.every_steps": steps // 2, "eval.num_samples": 0}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="deep_post_norm_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 12, "optim.learning_rate": 5e-3},
        axes=[{"model.norm_position": ["post", "deepnorm"]}], seeds=[0])
  if variant == "default":
    return Sweep(
        name="deep_post_norm", config="configs/lm.py:tiny",
        description="Post-norm vs pre-norm vs DeepNorm at depth 6 and 24, learning "
        "rate tuned per point (Wang et al. 2022); d_model 64 LM, 600 steps.",
        overrides=_base(600),
        axes=[{"model.norm_position": ["pre", "post", "deepnorm"]},
              {"model.num_layers": [6, 24]}],
        tune={"optim.learning_rate": RATES}, seeds=[0, 1], confirm=2)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
