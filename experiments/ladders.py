"""Does the effect hold at scale? Ladders of model sizes and training lengths,
a loss-against-compute fit per variant, and each variant's compute
multiplier over the base with its interval and its trend.

  python -m tfx_jax.sweep experiments/ladders.py:activations --dry-run
  python -m tfx_jax.sweep experiments/ladders.py:activations --parallel 2
  python -m tfx_jax.report runs/ladder_activations

Every ladder: the tiny decoder-only LM (2 layers, vocabulary 1,024, the
embedded Shakespeare corpus, 16 x 64 tokens per step) at d_model 32, 48, 64,
96 and 128 with 2 heads (muP's base shape has the run's heads, so the heads
widen: 16 to 64; the FFN 4 d_model, gated FFNs 2/3 of it), so the
non-embedding parameters span 15.8x (about 25K to 394K); each trains 8 and 16
tokens per non-embedding parameter (at most 3.5 epochs of the 1.78M-token
training split). Five rungs, so that at each budget the backtest's fit
without the largest rung still has 4 rungs for its 3 constants. The schedule is wsd (20 warmup
steps, the last 20% of each budget decaying as 1 - sqrt to a tenth): the two
budgets of a (rung, variant, rate, seed) branch from one trunk run, so the
stable phase is trained once (``Ladder(branch=True)``).

Tuning: muP (``model.parametrization=mup``, base width 32, untied embeddings:
with tied ones the transfer experiment's optimum did not move with width but
wider was not better, docs/results.md), the learning rate tuned over
``RATES`` at the two smallest rungs only (``tune_at``), every larger rung at
the rate its nearest smaller proxy chose; the transfer check reads the two
proxy rungs. Then every point (rung x budget x variant) runs 3 fresh
confirmation seeds at its rate (the transferred rungs straight away, with
no transfer-stage run); the fits, multipliers and verdicts read those only.

Measured on a 2-core Intel Xeon (Sapphire Rapids class), ``--parallel 2``:
``activations`` took 53 minutes (4 of tuning, 49 of confirmation): 126 runs,
42 of them trunks, 1.77 core-hours, evaluations 8% of the train steps' time
(docs/results.md); ``optimizers`` (Muon's Newton-Schulz steps) and ``moe``
cost more per step.

Intermediate evaluations read 4 batches of the fixed evaluation shuffle
(``eval.num_batches``); the last one and the test pass read the whole
split (``eval.final_batches=0``), as the tuning choice needs.

Variants:
- ``default``: the ``activations`` ladder.
- ``activations``: GELU vs SwiGLU at matched parameters (Shazeer 2020): is the
  gated FFN a constant compute multiplier?
- ``optimizers``: AdamW vs Muon (Jordan et al. 2024; Wen et al. 2025 measure
  Muon's speedup shrinking from about 1.4x at 0.1B to 1.1x at 1.2B).
- ``moe``: dense vs a 4-expert top-1 MoE FFN at matched active parameters
  (each expert the dense FFN's width): does the MoE's gain grow with scale?
- ``tiny``: 2 rungs x 2 budgets x 2 variants, no tuning, seconds per run
  (the tests' end-to-end ladder).
"""

from tfx_jax.sweep import Claim, Equivalent, Ladder, Sweep

RATES = [3.16e-3, 1e-2, 3.16e-2]
WIDTHS = (32, 48, 64, 96, 128)
TOKENS_PER_PARAM = [8, 16]
CONFIRM = 3
# A multiplier is constant where its ln slope against ln compute lies within
# +-0.02 per e-fold (the report's trend label, ``report.multiplier.BAND``).
TREND_BAND = 0.02

BASE = {
    "model.parametrization": "mup", "model.mup_base_d_model": 32,
    "model.tie_embeddings": False, "model.num_heads": 2,
    "optim.schedule": "wsd", "optim.warmup_steps": 20, "optim.decay_fraction": 0.2,
    "eval.every_steps": 250, "eval.num_batches": 4, "eval.final_batches": 0,
    "eval.num_samples": 0, "checkpoint.every_steps": 250, "train.log_every_steps": 50,
}


def _ladder(widths=WIDTHS, tokens_per_param=TOKENS_PER_PARAM) -> Ladder:
  return Ladder(rungs=[{"model.d_model": d} for d in widths],
                tokens_per_param=tokens_per_param)


def _sweep(name: str, description: str, axes, **changes) -> Sweep:
  fields = dict(
      name=f"ladder_{name}", config="configs/lm.py:tiny", description=description,
      overrides=dict(BASE), axes=axes, ladder=_ladder(),
      tune={"optim.learning_rate": RATES}, tune_at={"model.d_model": list(WIDTHS[:2])},
      seeds=[0], confirm=CONFIRM)
  fields.update(changes)
  return Sweep(**fields)


MOE = {"model.ffn_type": "moe", "model.num_experts": 4, "model.experts_per_token": 1}


def _claims(variant: str) -> list[Claim]:
  """Each ladder's two claims: the variant's compute multiplier over the base
  at every rung, and its trend with compute."""
  if variant == "activations":
    return [
        Claim("swiglu_multiplier", "Shazeer 2020", "the gated SwiGLU FFN is worth more "
              "training compute than GELU at matched parameters (a compute multiplier "
              "above 1; T5-base: -0.039 nats at a fixed budget)",
              compare=("swiglu", None), metric="ladder/multiplier", expect="higher"),
        Claim("swiglu_multiplier_constant", "Shazeer 2020", "the gated FFN's gain is a "
              "constant compute multiplier across model sizes (the paper measures one "
              "size; later work uses it at every size)",
              compare=("swiglu", None), metric="ladder/trend", expect=Equivalent(TREND_BAND))]
  if variant == "optimizers":
    return [
        Claim("muon_multiplier", "Wen et al. 2025", "Muon reaches AdamW's loss with less "
              "compute (about 1.4x at 0.1B parameters)",
              compare=("muon", None), metric="ladder/multiplier", expect="higher"),
        Claim("muon_multiplier_shrinks", "Wen et al. 2025", "Muon's speedup over AdamW "
              "shrinks as models grow (1.4x at 0.1B to 1.1x at 1.2B)",
              compare=("muon", None), metric="ladder/trend", expect="lower")]
  return [
      Claim("moe_multiplier", "Fedus et al. 2022", "a top-1 MoE FFN is worth more "
            "training compute than the dense FFN at matched active parameters",
            compare=(MOE, None), metric="ladder/multiplier", expect="higher"),
      Claim("moe_multiplier_grows", "Krajewski et al. 2024", "the MoE's compute "
            "multiplier over dense grows with the training compute (Clark et al. 2022 "
            "found routing's gain diminishing with size)",
            compare=(MOE, None), metric="ladder/trend", expect="higher")]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "default":
    variant = "activations"
  if variant == "activations":
    return _sweep("activations", "GELU vs SwiGLU at matched parameters on a ladder of "
                  "5 widths x 2 budgets (Shazeer 2020): the gated FFN's compute multiplier "
                  "and its trend.",
                  axes=[{"model.activation": ["gelu", "swiglu"]}], claims=_claims(variant))
  if variant == "optimizers":
    return _sweep("optimizers", "AdamW vs Muon on a ladder of 5 widths x 2 budgets "
                  "(Wen et al. 2025: Muon's speedup shrinks with scale).",
                  axes=[{"optim.optimizer": ["adamw", "muon"]}], claims=_claims(variant))
  if variant == "moe":
    return _sweep("moe", "Dense vs a 4-expert top-1 MoE FFN at matched active parameters "
                  "on a ladder of 5 widths x 2 budgets: does the MoE's gain grow?",
                  axes=[[{}, MOE]], claims=_claims(variant))
  if variant == "tiny":
    tiny = dict(BASE, **{"optim.warmup_steps": 5, "eval.every_steps": 40,
                         "checkpoint.every_steps": 40, "train.log_every_steps": 20,
                         "optim.learning_rate": 1e-2})
    return Sweep(name="ladder_tiny", config="configs/lm.py:tiny", overrides=tiny,
                 axes=[{"model.activation": ["gelu", "swiglu"]}],
                 ladder=_ladder(widths=(32, 48), tokens_per_param=[1, 2]), seeds=[0])
  raise ValueError(f"unknown variant {variant!r}: choose default (= activations), "
                   "activations, optimizers, moe or tiny.")
