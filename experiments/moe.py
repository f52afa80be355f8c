"""Dense vs mixture-of-experts FFN at matched active parameters, and the
router's balancing: auxiliary loss vs the auxiliary-loss-free bias.

  python -m tfx_jax.sweep experiments/moe.py:tiny --workdir runs/moe_tiny --parallel 2
  python -m tfx_jax.sweep experiments/moe.py --parallel 2 --until-resolved 4
  python -m tfx_jax.report runs/moe

Points (each a row of overrides; ``configs/lm.py``'s ``moe_variant`` sets the
expert width so that every MoE point computes with as many parameters per
token as the dense FFN, router included):
  dense          the tiny LM's FFN (d_ff 512)
  moe            8 experts, top-2, of width 254; Switch/GShard load-balancing
                 loss (train.moe_aux_loss 0.01, per batch)
  moe_shared     the same with one shared expert (DeepSeekMoE), width 169
  moe_bias       8 experts, top-2, balanced by DeepSeek-V3's expert bias
                 (model.router_bias_rate 0.001) instead of the loss
The MoE models hold 2.5x (with the shared expert 2.0x) the dense model's
parameters, 1.31M (1.04M) against 0.53M, all with 0.53M active.
Every MoE point routes with capacity factor 1.25 (``CAPACITY``: Switch
Transformers' training setting, Fedus et al. 2022, section 2.2 and Table 1;
the overflow is dropped and logged as ``layer_stats/dropped_tokens``). The
dropless dispatch computes the same products in a grouped matmul that XLA's
CPU backend runs ~15x slower than the batched one (a MoE step 3.6x a dense
one against 1.3x), which would triple the sweep's cost here.

Published direction: at matched active parameters (FLOPs per token) the MoE
reaches a lower loss (Fedus et al. 2022, "Switch Transformers", Figure 1;
Muennighoff et al. 2024, "OLMoE", section 4: MoE vs dense at matched active
compute); a shared expert helps little at this granularity (OLMoE, section
4.1.3); the bias balancing matches or beats the auxiliary loss, whose
gradient interferes with the language-modelling one (Wang et al. 2024,
"Auxiliary-Loss-Free Load Balancing"; DeepSeek-V3, section 2.1.2).

Each point's learning rate is chosen over ``RATES`` on the tuning seeds; then
every point runs 2 fresh confirmation seeds at its chosen rate (``confirm``)
and the comparisons read those, seeds paired. The report compares moe,
moe_shared and moe_bias each against dense (the axis's base value), and, as
the claims above need (``comparisons``), moe_shared against moe (does the
shared expert help?) and moe_bias against moe (bias balancing against the
auxiliary loss): five comparisons per compared metric, one Holm family.

Variants: ``tiny`` (smoke test: dense and MoE, one seed, 20 steps, about a
minute with ``--parallel 2``), ``default`` (four points, three learning rates,
2 tuning seeds, then 2 confirmation seeds, 1000 steps of the tiny LM).
"""

import pathlib

from tfx_jax.run.config_base import load_config_module
from tfx_jax.sweep import Claim, Equivalent, Sweep

RATES = [1e-3, 3e-3, 1e-2]
CAPACITY = 1.25


def _lm_configs():
  """configs/lm.py, loaded by path (configs/ is not a package)."""
  return load_config_module(pathlib.Path(__file__).resolve().parents[1] / "configs" / "lm.py")


def points() -> list[dict]:
  """The rows of the comparison: dense, MoE, MoE with a shared expert, MoE
  balanced by the expert bias, all at the dense model's active parameters."""
  lm = _lm_configs()
  capacity = {"model.capacity_factor": CAPACITY}
  moe = dict(lm.moe_variant("tiny", num_experts=8, experts_per_token=2), **capacity)
  shared = dict(lm.moe_variant("tiny", num_experts=8, experts_per_token=2, shared_experts=1),
                **capacity)
  return [{}, moe, shared, dict(moe, **{"model.moe_balance": "bias"})]


# The points as the report names them: dense is the axis's base; the plain MoE
# sets no model.moe_balance (the auxiliary loss is the default), so no field of
# it tells it from the bias point and it is named by its whole value label.
DENSE = "base"
MOE = ("ffn_type=moe,num_experts=8,experts_per_token=2,shared_experts=0,expert_d_ff=254,"
       "capacity_factor=1.25")
SHARED = {"model.shared_experts": 1}
BIAS = {"model.moe_balance": "bias"}
SWITCH_OLMOE = "Fedus et al. 2022; Muennighoff et al. 2024"


def _claims() -> list[Claim]:
  """What the papers claim, on the test loss of the confirmation seeds."""
  out = [Claim(f"{name}_vs_dense", SWITCH_OLMOE, f"at matched active parameters (FLOPs per "
               f"token) a mixture of experts{words} reaches a lower loss than the dense FFN",
               compare=(point, DENSE), metric="eval/loss", expect="lower")
         for name, point, words in (("moe", MOE, ""),
                                    ("shared", SHARED, " with a shared expert"),
                                    ("bias", BIAS, " balanced by the expert bias"))]
  # No difference: within the report's default margin for a loss, 0.01 nats,
  # under a seventh of what the MoE gains over dense in the last run (0.072).
  out.append(Claim(
      "shared_expert_level", "Muennighoff et al. 2024 (OLMoE, section 4.1.3)",
      "at fine granularity a shared expert adds nothing: the MoE with one shared "
      "expert (its routed experts narrower, the active parameters the same) reaches "
      "the same loss as without", compare=(SHARED, MOE), metric="eval/loss",
      expect=Equivalent(0.01)))
  # "Matches or beats": the papers report the bias ahead (lower perplexity), so
  # the claim is read as their result, a lower loss.
  out.append(Claim(
      "bias_vs_loss", "Wang et al. 2024; DeepSeek-V3 (section 2.1.2)",
      "balancing by the auxiliary-loss-free expert bias reaches a lower loss than the "
      "auxiliary loss, whose gradient interferes with the language-modelling one",
      compare=(BIAS, MOE), metric="eval/loss", expect="lower"))
  return out


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="moe_tiny", config="configs/lm.py:tiny",
        overrides={"train.num_steps": 20, "eval.every_steps": 20, "eval.num_batches": 2,
                   "eval.at_start": False, "checkpoint.every_steps": 20,
                   "eval.num_samples": 0, "optim.warmup_steps": 5},
        axes=[points()[:2]], seeds=[0])
  if variant == "default":
    dense, moe, shared, bias = points()
    return Sweep(
        name="moe", config="configs/lm.py:tiny",
        description="Dense vs mixture-of-experts FFN (8 experts, top-2, with and "
        "without a shared expert) at matched active parameters, and auxiliary-loss vs "
        "bias balancing, tiny decoder-only LM on the embedded Shakespeare corpus.",
        overrides={"train.num_steps": 1000, "eval.every_steps": 250,
                   "checkpoint.every_steps": 250, "eval.num_samples": 0,
                   "optim.warmup_steps": 50},
        axes=[[dense, moe, shared, bias]], comparisons=[(shared, moe), (bias, moe)],
        tune={"optim.learning_rate": RATES}, seeds=[0, 1], confirm=2, claims=_claims())
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
