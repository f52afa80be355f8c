"""Hyperparameter transfer: does the best learning rate stay put as the model
grows? Standard parametrization vs muP vs CompleteP on the tiny LM (Yang et
al. 2022, "Tensor Programs V"; Dey et al. 2025, "Don't be lazy: CompleteP
enables compute-efficient deep transformers").

  python -m tfx_jax.sweep experiments/transfer.py --parallel 2
  python -m tfx_jax.sweep experiments/transfer.py:depth --parallel 2
  python -m tfx_jax.report runs/transfer

``default`` (width): ``model.parametrization`` sp / mup / completep (base
shape d_model 32, 2 layers) x ``model.d_model`` 32, 64, 128, 256 (4 heads,
so head widths 8 to 64; the FFN 4 d_model), 2 layers, each point trained at
every rate of ``optim.learning_rate`` 1e-3 to 1e-1 in half-decade steps on
seeds 0 and 1. Every run sees the same 204,800 tokens (200 steps of 16 x 64),
AdamW without weight decay, cosine schedule with 20 warmup steps. At the base
width the three parametrizations are the same model; CompleteP at its base
depth is muP but for Adam's epsilon in the blocks (eps / m).

``depth``: sp vs completep (base shape d_model 32, 2 layers: width rules the
identity, so only CompleteP's depth rules act) x ``model.num_layers`` 2, 4, 8
at d_model 32, the same grid, seeds and budget.

The report's transfer check fits, per parametrization and size, the optimum
of the loss in log learning rate (a parabola through the grid's best rate and
its neighbours, its interval by a bootstrap over the seeds) and the shift of
the optimum per doubling of the size: a parametrization *transfers* where
that shift is within a factor sqrt(2) per doubling, *drifts* where its
interval excludes no shift.

Measured on a 2-core Intel Xeon (Sapphire Rapids class): ``default`` 120
runs, 118 core-minutes summed over the runs (about 60 minutes of
``--parallel 2``; the machine was shared with other work for most of it, so
alone it is less), a d_model 256 run 1.5-2 core-minutes, a d_model 32 run
about 20 core-seconds, evaluations (the whole validation and test splits)
38% of the time; ``depth`` 60 runs, 33 core-minutes (17 minutes). Each fits
one session of ``--parallel 2``.

Published direction (TP5 Figure 1; Dey et al. Figure 1): under SP the optimal
Adam rate of a Transformer falls as d_model grows, under muP it stays; under
muP wider is better at every rate; under CompleteP the optimum stays as depth
grows (and drifts under SP).
"""

from tfx_jax.sweep import Claim, Equivalent, Sweep

RATES = [1e-3, 3.16e-3, 1e-2, 3.16e-2, 1e-1]
SEEDS = [0, 1]
STEPS = 200

SP = {"model.parametrization": "sp"}


def _mup(base_d_model: int) -> dict:
  return {"model.parametrization": "mup", "model.mup_base_d_model": base_d_model}


def _completep(base_d_model: int, base_layers: int) -> dict:
  return {"model.parametrization": "completep", "model.mup_base_d_model": base_d_model,
          "model.mup_base_layers": base_layers}


YANG = "Yang et al. 2022 (Tensor Programs V), Figure 1"
DEY = "Dey et al. 2025 (CompleteP), Figure 1"
# A factor sqrt(2) per doubling, in log2 units: the report's transfer band.
WITHIN_SQRT2 = Equivalent(0.5)


def _width_claims() -> list[Claim]:
  """TP5's Figure 1 in width: the optimum drifts under SP and stays under muP
  (CompleteP at its base depth too), and under muP wider is better at every rate."""
  mup = {"model.parametrization": "mup"}
  return [
      Claim("sp_optimum_drifts", YANG, "under the standard parametrization the optimal "
            "Adam learning rate falls as d_model grows", compare=(SP, None),
            metric="transfer/shift", expect="lower"),
      Claim("mup_optimum_stays", YANG, "under muP the optimal learning rate stays put as "
            "d_model grows (within a factor sqrt(2) per doubling)", compare=(mup, None),
            metric="transfer/shift", expect=WITHIN_SQRT2),
      Claim("completep_optimum_stays_width", DEY, "under CompleteP (muP in width) the "
            "optimal learning rate stays put as d_model grows",
            compare=({"model.parametrization": "completep"}, None),
            metric="transfer/shift", expect=WITHIN_SQRT2),
      Claim("mup_wider_better", YANG, "under muP wider is better at every learning rate: "
            "d_model 256 has a lower loss than d_model 32 at each rate of the grid",
            compare=({"model.d_model": 256}, {"model.d_model": 32}), context=mup,
            metric="every_rate/eval/loss", expect="lower"),
  ]


def _depth_claims() -> list[Claim]:
  """Dey et al.'s Figure 1 in depth: the optimum stays under CompleteP and
  drifts under SP."""
  return [
      Claim("completep_optimum_stays_depth", DEY, "under CompleteP the optimal learning "
            "rate stays put as depth grows (within a factor sqrt(2) per doubling)",
            compare=({"model.parametrization": "completep"}, None),
            metric="transfer/shift", expect=WITHIN_SQRT2),
      Claim("sp_optimum_drifts_depth", DEY, "under the standard parametrization the "
            "optimal learning rate falls as depth grows", compare=(SP, None),
            metric="transfer/shift", expect="lower"),
  ]


def _base(steps: int) -> dict:
  return {"model.num_layers": 2, "model.num_heads": 4, "train.num_steps": steps,
          "optim.warmup_steps": steps // 10, "optim.schedule": "cosine",
          "optim.optimizer": "adamw", "optim.weight_decay": 0.0,
          "eval.every_steps": steps, "checkpoint.every_steps": steps // 2,
          "train.log_every_steps": steps // 10, "eval.num_samples": 0}


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="transfer_tiny", config="configs/lm.py:tiny",
        overrides={**_base(10), "eval.num_batches": 2},
        axes=[[SP, _mup(16)], {"model.d_model": [16, 32]}],
        tune={"optim.learning_rate": [3e-3, 1e-2, 3e-2]}, seeds=[0])
  if variant == "default":
    return Sweep(
        name="transfer", config="configs/lm.py:tiny",
        description="sp vs muP vs CompleteP (base d_model 32, 2 layers) at d_model 32-256, "
        "learning rates 1e-3..1e-1, 2 seeds, 204,800 tokens per run (Yang et al. 2022; "
        "Dey et al. 2025).",
        overrides=_base(STEPS),
        axes=[[SP, _mup(32), _completep(32, 2)], {"model.d_model": [32, 64, 128, 256]}],
        tune={"optim.learning_rate": RATES}, seeds=SEEDS, claims=_width_claims())
  if variant == "depth":
    return Sweep(
        name="transfer_depth", config="configs/lm.py:tiny",
        description="sp vs CompleteP (base d_model 32, 2 layers) at 2, 4, 8 layers, "
        "d_model 32, learning rates 1e-3..1e-1, 2 seeds, 204,800 tokens per run (Dey et "
        "al. 2025).",
        overrides={**_base(STEPS), "model.d_model": 32},
        axes=[[SP, _completep(32, 2)], {"model.num_layers": [2, 4, 8]}],
        tune={"optim.learning_rate": RATES}, seeds=SEEDS, claims=_depth_claims())
  raise ValueError(f"unknown variant {variant!r}; choose tiny, default or depth")
