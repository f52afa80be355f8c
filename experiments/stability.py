"""Learning-rate sensitivity with and without query-key norm and z-loss
(Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities").

  python -m tfx_jax.sweep experiments/stability.py:tiny
  python -m tfx_jax.sweep experiments/stability.py --parallel 2
  python -m tfx_jax.report runs/stability

Axes: ``model.qk_norm`` none / layernorm x ``train.z_loss`` 0 / 1e-4 (PaLM's),
each point trained at every learning rate of a wide grid (``optim.learning_rate``
1e-3 to 3e-1 in half-decade steps) and compared at its best one on fresh
confirmation seeds, paired.
Published direction: without qk-layernorm the attention logits grow and the
final loss rises steeply at high learning rates (attention-logit growth); with
it the loss-vs-rate curve is flatter (lower learning-rate sensitivity); z-loss
keeps the output logits' normaliser near 1 and prevents the divergence that
output-logit growth causes. The report's sensitivity plots are the paper's
Figure 1 at this scale; ``train.log_layer_stats`` records
``layer_stats/max_attention_logit/decoder_<NN>`` and every run logs
``train/output_log_z``.

Variants: ``tiny`` (qk_norm only, two rates, one seed and one confirmation
seed, 40 steps: a smoke test), ``default`` (the 2 x 2 grid, six rates, 2
tuning seeds, then 2 confirmation seeds at each point's chosen rate, 300 steps
of a 4-layer d_model 128 LM; 48 + 8 runs, about 30 minutes on 2 CPU cores
(AMD EPYC) with ``--parallel 2``).
"""

from tfx_jax.sweep import Sweep

RATES = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1]


def _base(steps: int) -> dict:
  return {"model.num_layers": 4, "model.d_model": 128, "model.num_heads": 4,
          "model.position": "rope", "model.norm_type": "layernorm",
          "train.num_steps": steps, "optim.decay_steps": steps,
          "optim.warmup_steps": steps // 10, "train.log_every_steps": 10,
          "eval.every_steps": steps // 2, "checkpoint.every_steps": steps // 2,
          "eval.num_samples": 0, "model.scan_layers": True,
          "train.log_layer_stats": True}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="stability_tiny", config="configs/lm.py:tiny",
        overrides={**_base(40), "model.num_layers": 2, "model.d_model": 64},
        axes=[{"model.qk_norm": ["none", "layernorm"]}],
        tune={"optim.learning_rate": [3e-3, 3e-2]}, seeds=[0], confirm=1)
  if variant == "default":
    return Sweep(
        name="stability", config="configs/lm.py:tiny",
        description="qk-layernorm x z-loss across learning rates 1e-3..3e-1 "
        "(Wortsman et al. 2023); 4-layer d_model 128 LM, 300 steps.",
        overrides=_base(300),
        axes=[{"model.qk_norm": ["none", "layernorm"]}, {"train.z_loss": [0.0, 1e-4]}],
        tune={"optim.learning_rate": RATES}, seeds=[0, 1], confirm=2)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
