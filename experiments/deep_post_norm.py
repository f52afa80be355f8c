"""Deep stacks: post-norm vs pre-norm vs DeepNorm (Wang et al. 2022,
"DeepNet: Scaling Transformers to 1,000 Layers").

  python -m tfx_jax.sweep experiments/deep_post_norm.py:tiny
  python -m tfx_jax.sweep experiments/deep_post_norm.py --parallel 2
  python -m tfx_jax.report runs/deep_post_norm

``model.norm_position`` post / pre / deepnorm x depth 6 / 24, same learning
rate and warmup for every point, scanned layers (compile time flat in
depth). Published direction: post-norm degrades or diverges as depth grows;
DeepNorm (x_{l+1} = LN(alpha x_l + F(x_l)), alpha = (2N)^(1/4), beta-scaled
init) trains deep stacks at the same learning rate as shallow ones.

Variants: ``tiny`` (post vs deepnorm at 12 layers), ``default`` (2 seeds,
300 steps of a d_model 64 LM; ~20 minutes on 2 CPU cores).
"""

from tfx_jax.sweep import Sweep


def _base(steps: int) -> dict:
  return {"model.d_model": 64, "model.num_heads": 4, "model.scan_layers": True,
          "optim.learning_rate": 5e-3, "optim.warmup_steps": 30,
          "train.num_steps": steps, "optim.decay_steps": steps,
          "eval.every_steps": steps // 2, "checkpoint.every_steps": steps // 2,
          "eval.num_samples": 0}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="deep_post_norm_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 12},
        axes=[{"model.norm_position": ["post", "deepnorm"]}], seeds=[0])
  if variant == "default":
    return Sweep(
        name="deep_post_norm", config="configs/lm.py:tiny",
        description="Post-norm vs pre-norm vs DeepNorm at depth 6 and 24 "
        "(Wang et al. 2022); d_model 64 LM, lr 5e-3, 30 warmup steps.",
        overrides=_base(300),
        axes=[{"model.norm_position": ["post", "pre", "deepnorm"]},
              {"model.num_layers": [6, 24]}],
        seeds=[0, 1])
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
