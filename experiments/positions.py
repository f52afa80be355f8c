"""Position schemes and length extrapolation (Press et al. 2022, "Train Short,
Test Long: Attention with Linear Biases"), and RoPE scaled at evaluation only
(Chen et al. 2023, position interpolation; Peng et al. 2023, YaRN).

  python -m tfx_jax.sweep experiments/positions.py:tiny
  python -m tfx_jax.sweep experiments/positions.py --parallel 2
  python -m tfx_jax.report runs/positions

All six ``model.position`` schemes trained at 64 tokens on contiguous text,
as Press et al. train and evaluate (``data.packing=stream``: the split's
paragraphs concatenated with an end-of-document token and cut into windows,
no mask at document ends, positions running through each window; with
``documents`` packing the Shakespeare paragraphs, median 28 tokens, left the
model rarely seeing a context as long as its training length). After training
each run is scored on the test split in windows of 1x, 2x, 4x and 8x that
length (``python -m tfx_jax.evaluate --lengths 1x,2x,4x,8x --split test
--max_batches 128``), every length on the same first 65,536 tokens of the test
stream (128 windows of 512; the whole stream is 167,966 tokens), so each
length reads 64k tokens, where the last run read 4,096.

RoPE at evaluation only: the RoPE runs are scored twice more with their
rotary positions scaled for the 8x window, with no fine-tuning: linear
interpolation (``--rope_scaling linear --rope_scaling_factor 8``) and YaRN
(``--rope_scaling yarn``, from the 64-token training context), each a row of
its own in the report's length table. Chen et al. (and YaRN's main results)
fine-tune for a few hundred steps after scaling; that setting is not tested
here.

Equal starts: every scheme gets the paper's token-embedding scale, N(0, 1/d)
scaled by sqrt(d) (``model.embedding_init=normal``,
``model.scale_embeddings=True``; Vaswani et al. 2017, and fairseq, whose models
the ALiBi paper trains), and the learned position table starts as the tokens
do (``model.learned_position_init=token``; GPT-2's std 0.02, norm ~0.23
against token vectors of norm ~11, left learned positions no better than
none). The other schemes have no table: the sweep runs them with the field at
its default, which computes the same.

Published direction (WikiText-103, trained at 512): sinusoidal and rotary
perplexity rises beyond the training length, T5 bias degrades slowly, ALiBi
stays flat or improves; learned positions cannot go beyond what they were
trained on. YaRN extends a RoPE model's context at evaluation alone (its
"no fine-tuning" rows); linear interpolation needs its fine-tuning.

Each scheme is compared at its own best learning rate, chosen on the
validation split of tuning seed 0 over its own grid (``tune``): T5 bias and
RoPE over {3e-3, 1e-2, 3e-2}, the other four schemes over {1e-3, 3e-3, 1e-2,
3e-2}. Then 4 fresh confirmation seeds per
scheme at its chosen rate, paired. Power: the last run's paired differences
had a seed spread of 0.4 perplexity for ALiBi vs RoPE at 8x (26 apart) and
1.7 for T5 bias vs RoPE at 8x (15 apart): 4 seeds detect both with more than
90% power at the strictest Holm level of the report's 25 comparisons (3 seeds:
36% for T5 bias); sinusoidal vs RoPE at 8x (spread 4.1, 12 apart) would need
6-7.

Variants: ``tiny`` (alibi vs rope, stream packing, with the scaled
evaluations, 1 seed, 60 steps: a smoke test), ``default`` (six schemes x 3
or four rates on seed 0, then 4 confirmation seeds at each scheme's rate,
800 steps of 1,024 tokens: 22 + 24 = 46 runs of about 200 s each with their
evaluations (five of the validation split, the test split, the four lengths;
three times for RoPE) and start-up: about 150 core-minutes, about 75 minutes
on 2 CPU cores with ``--parallel 2``).
"""

from tfx_jax.sweep import Claim, Equivalent, Evaluation, Sweep

SCHEMES = ["sinusoidal", "learned", "t5_bias", "rope", "alibi", "none"]
RATES = [1e-3, 3e-3, 1e-2, 3e-2]
# T5 bias and RoPE chose 1e-2 in both runs; 1e-3 was far worse (see the docstring).
HIGH_RATES = [3e-3, 1e-2, 3e-2]
# Equal starts for every scheme (see the docstring); learned_position_init is
# read by the learned scheme only.
EMBEDDINGS = {"model.embedding_init": "normal", "model.scale_embeddings": True,
              "model.learned_position_init": "token"}
# Windows of the longest (8x) length each length reads: 128 x 512 = 65,536
# test tokens, the same tokens at every length (scoring.extrapolation).
WINDOWS = 128


def _evaluations(max_batches: int) -> list:
  lengths = ["--lengths", "1x,2x,4x,8x", "--max_batches", str(max_batches), "--split", "test"]
  rope = {"model.position": "rope"}
  return [lengths,
          Evaluation([*lengths, "--rope_scaling", "linear", "--rope_scaling_factor", "8"],
                     when=rope),
          Evaluation([*lengths, "--rope_scaling", "yarn", "--rope_scaling_factor", "8"],
                     when=rope)]


def _tune() -> dict:
  """Each scheme's own rate grid (see the docstring)."""
  grid = lambda scheme: {"values": HIGH_RATES if scheme in ("t5_bias", "rope") else RATES,
                         "when": {"model.position": scheme}}
  return {"optim.learning_rate": [grid(s) for s in SCHEMES]}


PRESS = "Press et al. 2022"


def _claims() -> list[Claim]:
  """What the papers claim, each read against RoPE (the base) and relative to
  the training length where it is about extrapolation: ln ppl@kx - ln ppl@1x
  per seed, so a gap already there at 1x is not counted as extrapolation."""
  out = []
  for scheme, expect, words in (("alibi", "lower", "ALiBi degrades less than RoPE"),
                                ("t5_bias", "lower", "T5 bias degrades less than RoPE"),
                                ("sinusoidal", "higher", "sinusoidal degrades more than RoPE")):
    for k in ("2x", "8x"):
      out.append(Claim(
          f"{scheme}_{k}", PRESS, f"beyond the training length {words} ({k}, relative to 1x)",
          compare=(scheme, "rope"), metric=f"ppl@{k}/1x", expect=expect))
  for scheme in ("alibi", "t5_bias", "sinusoidal"):
    out.append(Claim(
        f"{scheme}_level_1x", PRESS, f"at the training length {scheme} and RoPE are "
        "within 0.5 perplexity (their Table: 19.65-20.07)",
        compare=(scheme, "rope"), metric="ppl@1x", expect=Equivalent(0.5)))
  out.append(Claim(
      "yarn_8x", "Peng et al. 2023", "YaRN extends a RoPE model's context at evaluation "
      "alone (no fine-tuning): lower perplexity at 8x than as trained",
      compare=("rope", None), metric="evaluation/yarn-x8-from64/ppl@8x", expect="lower"))
  return out


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="positions_tiny", config="configs/lm.py:tiny",
        overrides={**EMBEDDINGS, "data.packing": "stream", "train.num_steps": 60,
                   "model.d_model": 64, "model.max_len": 512, "eval.every_steps": 30,
                   "checkpoint.every_steps": 30, "eval.num_samples": 0,
                   "optim.warmup_steps": 10},
        axes=[{"model.position": ["alibi", "rope"]}], seeds=[0],
        evaluations=_evaluations(2))
  if variant == "default":
    return Sweep(
        name="positions", config="configs/lm.py:tiny",
        description="Six position schemes trained at 64 tokens of contiguous text "
        "(stream packing), test perplexity at 1x-8x the training length on 65,536 "
        "tokens per length (Press et al. 2022); RoPE also with linear and YaRN "
        "scaling at evaluation only (no fine-tuning); every scheme with N(0, 1/d) x "
        "sqrt(d) token embeddings and the learned table at the tokens' scale.",
        overrides={**EMBEDDINGS, "data.packing": "stream", "train.num_steps": 800,
                   "model.max_len": 512, "eval.every_steps": 200,
                   "checkpoint.every_steps": 200, "eval.num_samples": 0,
                   "optim.warmup_steps": 50},
        axes=[{"model.position": SCHEMES}], tune=_tune(), seeds=[0], confirm=4,
        evaluations=_evaluations(WINDOWS), claims=_claims())
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
