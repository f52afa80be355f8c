"""Corpus BLEU and chrF with sacrebleu (Post 2018), returning the score and its signature.

Scores are only comparable across papers with the same signature (tokenizer,
casing, smoothing, sacrebleu version), so callers print both.
"""

from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF


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


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
                *, tokenize: str = "13a", lowercase: bool = False) -> tuple[float, str]:
  """Detokenized corpus BLEU (0-100) and the sacrebleu signature string.

  ``refs`` is one reference per hypothesis, or a list of reference streams.
  Defaults are sacrebleu's (13a tokenizer, mixed case, exp smoothing).
  """
  metric = BLEU(tokenize=tokenize, lowercase=lowercase)
  result = metric.corpus_score(list(hyps), _ref_streams(refs, len(hyps)))
  return float(result.score), str(metric.get_signature())


def corpus_chrf(hyps: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]],
                *, word_order: int = 0) -> tuple[float, str]:
  """Corpus chrF (word_order=0) or chrF++ (word_order=2) and the signature string."""
  metric = CHRF(word_order=word_order)
  result = metric.corpus_score(list(hyps), _ref_streams(refs, len(hyps)))
  return float(result.score), str(metric.get_signature())
