"""Norm placement x norm type, with and without warmup at a high learning rate
(Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

  python -m tfx_jax.sweep experiments/norm_placement.py:tiny
  python -m tfx_jax.sweep experiments/norm_placement.py --parallel 2
  python -m tfx_jax.report runs/norm_placement

Axes: ``model.norm_position`` post / pre / sandwich / deepnorm x
``model.norm_type`` layernorm / rmsnorm x (warmup 100 steps | no warmup), all
at Adam lr 1e-2 on a 6-layer LM. Published direction: post-norm without
warmup trains badly or diverges at a high learning rate, pre-norm trains
without warmup (IWSLT14: 8.45 vs ~34 BLEU). With ``train.log_layer_stats`` the report shows the gradient norm per layer near
initialisation: growing towards the top for post-norm, flat for pre-norm
(Xiong's Figure 3).

Variants: ``tiny`` (post vs pre, no warmup), ``default`` (the full grid,
2 seeds, 300 steps; ~20 minutes on 2 CPU cores).
"""

from tfx_jax.sweep import Sweep

WARMUP = {"optim.warmup_steps": [100, 0]}  # with, without (zipped: one axis)


def _base(steps: int) -> dict:
  return {"model.num_layers": 6, "model.d_model": 64, "model.num_heads": 4,
          "optim.learning_rate": 1e-2, "optim.grad_clip_norm": 0.0,
          "train.num_steps": steps, "optim.decay_steps": steps,
          "train.log_every_steps": 10, "eval.every_steps": steps // 2,
          "checkpoint.every_steps": steps // 2, "eval.num_samples": 0,
          "model.scan_layers": True, "train.log_layer_stats": True}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="norm_placement_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 3, "optim.warmup_steps": 0},
        axes=[{"model.norm_position": ["post", "pre"]}], seeds=[0])
  if variant == "default":
    return Sweep(
        name="norm_placement", config="configs/lm.py:tiny",
        description="Post/pre/sandwich/DeepNorm x LayerNorm/RMSNorm, with and without "
        "warmup at lr 1e-2 (Xiong et al. 2020); 6-layer d_model 64 LM.",
        overrides=_base(300),
        axes=[{"model.norm_position": ["post", "pre", "sandwich", "deepnorm"]},
              {"model.norm_type": ["layernorm", "rmsnorm"]}, WARMUP],
        seeds=[0, 1])
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
