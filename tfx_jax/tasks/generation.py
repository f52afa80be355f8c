"""Evaluation by generating text: BLEU of translations, sampled continuations.

The one module of ``tfx_jax.tasks`` that decodes (through ``tfx_jax.tasks.text_io``,
which runs ``search``); a task module names the functions below in its
declaration and never imports decoding itself.

* at every evaluation during training (``Task.sample_inputs`` and
  ``Task.sample_report``): eval/bleu of greedy translations of the first
  ``eval.num_bleu_examples`` validation pairs, with a few of them as text
  (translate); greedy continuations of a few validation prompts (lm);
* over a whole split (``Task.score_by_generation``, the evaluate command):
  BLEU and chrF of beam-search translations (sacreBLEU, Post 2018).

Each score comes with sacreBLEU's bootstrap standard error (``tasks/bleu.py``).
"""

from __future__ import annotations

from tfx_jax.tasks import text_io as texts
from tfx_jax.tasks.task import SampleReport


# ------------------------------------------------------------- translation
def translation_examples(config) -> list[tuple[str, str]]:
  """The first ``eval.num_bleu_examples`` validation (source, reference) pairs."""
  if config.eval.num_bleu_examples <= 0:
    return []
  return texts.translation_pairs(config, "validation", config.eval.num_bleu_examples)


def translation_report(run, examples, config) -> SampleReport:
  """eval/bleu of greedy translations with its bootstrap standard error
  (eval/bleu_se), and a few of them as text."""
  from tfx_jax.tasks import bleu  # sacrebleu: only where BLEU is computed
  hyps = texts.translate_texts(run, [s for s, _ in examples], beam_size=1)
  score = bleu.corpus_bleu(hyps, [r for _, r in examples])
  shown = "\n\n".join(f"source: {s}  \nhypothesis: {h}  \nreference: {r}"
                      for (s, r), h in list(zip(examples, hyps))[:config.eval.num_samples])
  scalars = {"eval/bleu": score.score}
  if score.se is not None:
    scalars["eval/bleu_se"] = score.se
  return scalars, {"samples": shown}


def translation_scores(run, split, *, max_examples, beam_size, alpha):
  """BLEU and chrF (sacrebleu) of beam-search translations of a split, each
  with its bootstrap standard error (``bleu_se``, ``chrf_se``)."""
  from tfx_jax.tasks import bleu  # sacrebleu: only where BLEU is computed
  pairs = texts.translation_pairs(run.config, split, max_examples)
  hyps = texts.translate_texts(run, [s for s, _ in pairs], beam_size=beam_size,
                               alpha=alpha)
  refs = [r for _, r in pairs]
  metrics = {}
  for name, score in (("bleu", bleu.corpus_bleu(hyps, refs)),
                      ("chrf", bleu.corpus_chrf(hyps, refs))):
    metrics[name] = score.score
    if score.se is not None:
      metrics[f"{name}_se"] = score.se
    metrics[f"{name}_signature"] = score.signature
  metrics.update(num_examples=len(hyps), beam_size=beam_size)
  return metrics, hyps, refs


# ------------------------------------------------------------ continuation
def prompt_examples(config) -> list[tuple[str, str]]:
  """The first four words of a few (``eval.num_samples``) validation documents."""
  n = config.eval.num_samples
  if n <= 0:
    return []
  prompts = []
  for (text,) in texts.read_texts(config.data, "validation", ("text_key",),
                                  limit=50 * n):
    words = text.split()
    if len(words) >= 4:
      prompts.append((" ".join(words[:4]), ""))
    if len(prompts) == n:
      break
  return prompts


def continuation_report(run, examples, config) -> SampleReport:
  """Greedy continuations of the prompts (32 tokens), as text."""
  del config
  prompts = [p for p, _ in examples]
  outs = texts.generate_texts(run, prompts, max_new_tokens=32, greedy=True)
  return {}, {"samples": "\n\n".join(f"{p} **{o}**" for p, o in zip(prompts, outs))}
