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
BLEU (greedy, ``eval.num_bleu_examples`` fixed validation pairs) and
validation loss are in the report.

Variants: ``tiny`` (base vs one head, 1 seed), ``default`` (six rows,
2 seeds, the preset's 400 steps; ~30 minutes on 2 CPU cores).
"""

from tfx_jax.sweep import Sweep

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
        overrides={"eval.num_bleu_examples": 64},
        axes=[ROWS], seeds=[0, 1])
  raise ValueError(f"unknown variant {variant!r}; choose tiny or default")
