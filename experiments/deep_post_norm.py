"""Deep stacks: post-norm vs pre-norm vs DeepNorm, learning rate tuned per point
(Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers").

  python -m tfx_jax.sweep experiments/deep_post_norm.py:tiny
  python -m tfx_jax.sweep experiments/deep_post_norm.py --parallel 2
  python -m tfx_jax.report runs/deep_post_norm

``model.norm_position`` post / pre / deepnorm x depth (scanned layers: compile
time flat in depth): 6 layers trained 600 steps, 24 layers 1,200 (the depth
and its run length are one axis, zipped), so that a 24-layer post-LN run that
stalls has had twice the steps to leave the unigram plateau, and "fails"
reads as more than "starts late". Every point is trained at each rate of
its grid (``RATES``, 3e-4 to 1e-2; ``GRIDS``: also 1e-4 for post-LN and 3e-2
for pre-LN at 24 layers) with the same 60-step warmup and a cosine decay over
its own length. Each point is
compared at its best rate on 3 fresh confirmation seeds, paired (the last
run's DeepNorm vs pre-LN at 24 layers, -0.039 nats with a paired spread of
0.004, resolves with 3), each norm against pre-LN at the same depth. The
report counts stalled runs (final validation loss not below the unigram
loss) in its tables and marks every run, stalled ones included, on its loss
against rate plot; its tuned-values table gives every point's loss at every
rate.

Layer statistics on: ``train.layer_stats_init_batches=16`` logs each layer's
gradient norm (all of its arrays) at the initial parameters, the mean of the
first 16 batches (``layer_stats/init_grad_norm/all/decoder_<NN>``: the
report's per-layer table and plot), and ``train.log_layer_stats`` the
gradient, parameter and update norms and the largest attention logit of
every layer during training (``layer_stats/*/decoder_<NN>``, TensorBoard).

Published direction: at a rate where a shallow post-LN model trains, post-LN
degrades or diverges as depth grows; DeepNorm (x_{l+1} = LN(alpha x_l +
F(x_l)), alpha = (2N)^(1/4), beta-scaled init) trains the deep stack and
matches or beats pre-LN.

Variants: ``tiny`` (post vs deepnorm at 12 layers, 40 steps, one seed: a smoke
test), ``default`` (3 norms x 2 depths x 4 or 5 rates on seed 0, then 3
confirmation seeds at each point's rate, d_model 64 LM: 12 + 9 runs of 6
layers and 600 steps, about 2 minutes each at the last run's 7,300-8,900
tokens/s with evaluations, and 14 + 9 runs of 24 layers and 1,200 steps,
about 12 minutes each at 2,300-2,600 tokens/s with five evaluations: about
150 minutes on 2 CPU cores with ``--parallel 2``; on a 2-vCPU AMD EPYC
without AVX-512 the runs went at half those rates, 1,200 tokens/s at 24
layers: 16-17 minutes a 24-layer run and 3 a 6-layer one; the whole sweep
measured 411 core-minutes there, about 3.4 hours).
"""

from tfx_jax.sweep import Sweep

RATES = [3e-4, 1e-3, 3e-3, 1e-2]
# Depth and its run length move together (see the docstring).
DEPTH = {"model.num_layers": [6, 24], "train.num_steps": [600, 1200]}
# Each point's grid: RATES, widened where this grid's first run chose its edge
# (post-LN at 24 layers chose 3e-4, pre-LN at 24 layers 1e-2).
GRIDS = {("post", 24): [1e-4, *RATES], ("pre", 24): [*RATES, 3e-2]}


def _rates() -> dict:
  """``tune``: a learning-rate grid for each norm x depth."""
  return {"optim.learning_rate": [
      {"values": GRIDS.get((norm, depth), RATES),
       "when": {"model.norm_position": norm, "model.num_layers": depth}}
      for norm in ("pre", "post", "deepnorm") for depth in DEPTH["model.num_layers"]]}


def _base(steps: int) -> dict:
  return {"model.d_model": 64, "model.num_heads": 4, "model.scan_layers": True,
          "optim.warmup_steps": 60, "train.num_steps": steps,
          "eval.every_steps": 300, "checkpoint.every_steps": 300,
          "eval.num_samples": 0, "train.log_layer_stats": True,
          "train.layer_stats_init_batches": 16}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="deep_post_norm_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 12, "optim.learning_rate": 5e-3,
                   "optim.warmup_steps": 4, "eval.every_steps": 20,
                   "checkpoint.every_steps": 20, "train.layer_stats_init_batches": 2},
        axes=[{"model.norm_position": ["post", "deepnorm"]}], seeds=[0])
  if variant == "default":
    return Sweep(
        name="deep_post_norm", config="configs/lm.py:tiny",
        description="Post-norm vs pre-norm vs DeepNorm at depth 6 (600 steps) and 24 "
        "(1,200 steps), learning rate tuned per point over 3e-4..1e-2, widened to 1e-4 "
        "(post-LN) and 3e-2 (pre-LN) at 24 layers (Wang et al. 2022); d_model 64 LM, "
        "per-layer gradient norms at initialisation.",
        overrides=_base(600),
        axes=[{"model.norm_position": ["pre", "post", "deepnorm"]}, DEPTH],
        tune=_rates(), seeds=[0], confirm=3)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
