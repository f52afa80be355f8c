"""Corpus BLEU and chrF with sacrebleu (Post 2018): the score, its signature and
its standard error.

Scores are only comparable across papers with the same signature (tokenizer,
casing, smoothing, sacrebleu version), so callers print both.

The standard error is sacreBLEU's bootstrap over sentences (Koehn 2004,
"Statistical significance tests for machine translation evaluation"):
``corpus_score(..., n_bootstrap=N)`` rescores N resamples of the sentences,
with replacement, and keeps half the width of their central 95% (its
``μ = mean ± half-width``); the standard error is that half-width / 1.96, the
normal-equivalent spread. The resampling is seeded (sacreBLEU's
``SACREBLEU_SEED``, default 12345), so the same hypotheses give the same
figure, and the signature names it (``bs:N|seed:S``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

# sacreBLEU's default number of resamples (its --confidence-n).
N_BOOTSTRAP = 1000
Z_975 = 1.959964  # the standard normal's 0.975 quantile


class CorpusScore(NamedTuple):
  """A corpus score (0-100), its sacrebleu signature, and its bootstrap standard
  error (None: fewer than two sentences, or no bootstrap asked for)."""
  score: float
  signature: str
  se: float | None


def _ref_streams(refs: Sequence[str] | Sequence[Sequence[str]], n: int):
  """One reference per hypothesis ([str]) or several streams ([[str], [str]])."""
  if refs and isinstance(refs[0], str):
    streams = [list(refs)]
  else:
    streams = [list(r) for r in refs]
  for s in streams:
    if len(s) != n:
      raise ValueError(f"{n} hypotheses but a reference stream of {len(s)} lines.")
  return streams


def _scored(metric: Metric, hyps, refs, n_bootstrap: int) -> CorpusScore:
  hyps = list(hyps)
  resample = n_bootstrap if len(hyps) > 1 else 1
  result = metric.corpus_score(hyps, _ref_streams(refs, len(hyps)), n_bootstrap=resample)
  # ``_ci`` is the half-width sacrebleu prints as "± ..." (set when resampled).
  se = float(result._ci) / Z_975 if resample > 1 else None  # pylint: disable=protected-access
  return CorpusScore(float(result.score), str(metric.get_signature()), se)


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
                *, tokenize: str = "13a", lowercase: bool = False,
                n_bootstrap: int = N_BOOTSTRAP) -> CorpusScore:
  """Detokenized corpus BLEU (0-100), the sacrebleu signature and the bootstrap
  standard error over ``n_bootstrap`` resamples (1: none).

  ``refs`` is one reference per hypothesis, or a list of reference streams.
  Defaults are sacrebleu's (13a tokenizer, mixed case, exp smoothing).
  """
  return _scored(BLEU(tokenize=tokenize, lowercase=lowercase), hyps, refs, n_bootstrap)


def corpus_chrf(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
                *, word_order: int = 0, n_bootstrap: int = N_BOOTSTRAP) -> CorpusScore:
  """Corpus chrF (word_order=0) or chrF++ (word_order=2), the signature and the
  bootstrap standard error (as ``corpus_bleu``)."""
  return _scored(CHRF(word_order=word_order), hyps, refs, n_bootstrap)
