"""A few rows of the original Transformer's ablation table (Vaswani et al.
2017, Table 3) on the embedded English->German data.

  python -m tfx_jax.sweep experiments/translation.py:tiny
  python -m tfx_jax.sweep experiments/translation.py --parallel 2
  python -m tfx_jax.report runs/translation

Base: ``configs/translate.py:tiny`` (post-norm, sinusoidal, ReLU, label
smoothing 0.1, dropout 0.1, the paper's schedule). Rows: (A) one head and
more heads at the same d_model; (D) no dropout, no label smoothing;
(E) learned instead of sinusoidal positions. Published direction (newstest2013
dev BLEU, base 25.8): one head -0.9 BLEU, too many heads -0.4; no dropout
-1.2 (P_drop 0.0: 24.6); no label smoothing lowers BLEU slightly (25.3 at
eps_ls 0.0 with better perplexity); learned positions about equal (25.7).
Each row is trained at four peak-rate factors of the paper's schedule
(``optim.learning_rate`` x d^-0.5 x min(step^-0.5, step x warmup^-1.5)) on
seed 0 (the tuning stage) and compared at its own rate, the one with the
lower validation loss, on 2 fresh confirmation seeds (1 and 2) trained at each
row's chosen rate (``confirm``), so every comparison is paired over 2 seeds
that the choice of rate never read. Each run takes 2,000 steps of 16 pairs
(about 2.4 epochs of the 13.5k training pairs: regularisation can only pay
once the model would otherwise overfit). The comparisons read the whole test
split: loss, and BLEU of beam-4 decoding (``python -m tfx_jax.evaluate --split
test``, added to every tuned sweep).

Variants: ``tiny`` (base vs one head, 1 seed), ``default`` (six rows x four
rates on seed 0, then seeds 1 and 2 at the chosen rate: 36 runs of about 5.5
minutes each plus 30 s of beam search, about 110 minutes on 2 CPU cores with
``--parallel 2``)::

  python -m tfx_jax.sweep experiments/translation.py --parallel 2
"""

from tfx_jax.sweep import Sweep

# Factors of the paper's schedule (inverse_sqrt). With 0.5 and 1.0 alone every
# row chose 0.5, the end of the grid; with 0.25 added, five of six rows chose
# 0.25, the end again; 0.125 is there to bracket the optimum.
RATES = [0.125, 0.25, 0.5, 1.0]
ROWS = [{}, {"model.num_heads": 1}, {"model.num_heads": 16},
        {"model.dropout": 0.0}, {"train.label_smoothing": 0.0},
        {"model.position": "learned"}]


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "tiny":
    return Sweep(
        name="translation_tiny", config="configs/translate.py:tiny",
        overrides={"train.num_steps": 60, "eval.every_steps": 30,
                   "checkpoint.every_steps": 30, "eval.num_bleu_examples": 16,
                   "optim.warmup_steps": 30},
        axes=[[{}, {"model.num_heads": 1}]], seeds=[0])
  if variant == "default":
    return Sweep(
        name="translation", config="configs/translate.py:tiny",
        description="Transformer-base ablation rows (Vaswani et al. 2017, Table 3) "
        "on the embedded GCC en->de catalog, translate.py:tiny.",
        overrides={"train.num_steps": 2000, "train.batch_size": 16,
                   "optim.warmup_steps": 200, "eval.every_steps": 1000,
                   "checkpoint.every_steps": 500, "eval.num_bleu_examples": 0},
        axes=[ROWS], tune={"optim.learning_rate": RATES}, seeds=[0], confirm=2)
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
