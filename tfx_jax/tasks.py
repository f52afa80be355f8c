"""The tasks, each declared once (``config.task``): the one dispatch point.

A ``Task`` says everything the rest of the code needs to know about a task:
which families can run it, how one raw example becomes batch rows (and
whether rows are packed), what the model is fed, the loss, which evaluation
metrics are meaningful, how evaluation predictions read as text, and what is
sampled at every evaluation during training. The run config, the run setup, the training loop
and the evaluation command look a task up with ``get(name)`` and never switch
on its name. Adding a task is one ``Task(...)`` below plus its row format in
``data/rows.py`` (the data pipeline knows rows, not tasks).

lm        decoder_only: next-token cross entropy over real tokens.
translate encoder_decoder: label-smoothed cross entropy over target tokens.
mlm       encoder_only: cross entropy at the masked positions (BERT).
classify  decoder_only or encoder_only: cross entropy of the class head; for
          decoder_only the LM loss of the same passage is added,
          L = L_FT + lambda * L_PT (GPT-1; textbook chapter 003, eq. 2.18).

Every loss returns sums (not means) so evaluation can add them over batches.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax import texts
from tfx_jax.data import rows as rows_lib
from tfx_jax.errors import ConfigError
from tfx_jax.optim import label_smoothed_cross_entropy

# (scalars, texts) written to TensorBoard at every evaluation.
SampleReport = tuple[dict[str, float], dict[str, str]]


@dataclasses.dataclass(frozen=True)
class Task:
  """One task's declaration (see the module docstring)."""

  name: str
  families: tuple[str, ...]
  rows: rows_lib.RowFormat           # how examples become rows (data/rows.py)
  model_inputs: Callable[[dict], dict]
  # (config, family, *, train) -> loss(outputs, batch) -> (objective, sums):
  # the task's loss with the settings it reads bound (none at evaluation).
  objective: Callable[..., Callable[[dict, dict], tuple]]
  perplexity: bool                   # eval/perplexity is meaningful
  accuracy: bool                     # eval/accuracy is meaningful
  predictions: Callable[[dict], jax.Array]  # outputs -> argmax ids or labels
  # (batch, predictions, tokenizer) -> (hypotheses, references) as text.
  prediction_texts: Callable[..., tuple[list[str], list[str]]]
  # Optional samples generated at every evaluation: config -> inputs, then
  # (run, examples, config) -> SampleReport.
  sample_inputs: Callable[[Any], list] | None = None
  sample_report: Callable[..., SampleReport] | None = None
  # Optional evaluation of a whole split by generating (beam search) instead of
  # the teacher-forced forward: (run, split, *, max_examples, beam_size, alpha) ->
  # (metrics, hypotheses, references).
  score_by_generation: Callable[..., tuple[dict, list[str], list[str]]] | None = None


# ------------------------------------------------------------ model inputs
def _token_inputs(batch: dict) -> dict:
  return {"inputs": batch["inputs"], "segment_ids": batch["segment_ids"],
          "positions": batch["positions"]}


def _translation_inputs(batch: dict) -> dict:
  return {"inputs": batch["inputs"], "decoder_inputs": batch["decoder_inputs"],
          "inputs_segment_ids": (batch["inputs"] > 0).astype(jnp.int32)}


# ------------------------------------------------------------------ losses
def _log_z_sums(logits, weights) -> dict:
  """Sums of log Z and log^2 Z of the softmax over ``logits``' last axis, Z =
  sum_i exp(logit_i), weighted: the output's normaliser, which z-loss keeps
  near 0 (log Z = 0: the logits are log-probabilities already)."""
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  return {"log_z": jnp.sum(log_z * weights), "log_z_sq": jnp.sum(jnp.square(log_z) * weights)}


def _token_sums(logits, batch, smoothing):
  weights = batch["weights"].astype(jnp.float32)
  loss, denom = label_smoothed_cross_entropy(logits, batch["targets"], weights, smoothing)
  # Plain (unsmoothed) NLL for perplexity and train/nll, and accuracy.
  if smoothing:
    nll, _ = label_smoothed_cross_entropy(logits, batch["targets"], weights, 0.0)
  else:
    nll = loss
  correct = jnp.sum((jnp.argmax(logits, -1) == batch["targets"]) * weights)
  return loss, {"loss": loss, "nll": nll, "weight": denom, "correct": correct,
                **_log_z_sums(logits, weights)}


def token_loss(outputs: dict, batch: dict, *, label_smoothing: float = 0.0,
               z_loss: float = 0.0):
  """(mean objective, sums) of a token-level task (lm, translate, mlm).

  Sums: ``loss`` (objective summed), ``nll`` (unsmoothed, for perplexity),
  ``weight`` (tokens it was summed over), ``correct``, ``log_z`` and
  ``log_z_sq``. With ``z_loss`` c > 0 the objective adds c * log^2 Z per
  token (PaLM, Chowdhery et al. 2022, section 5: c = 1e-4), which keeps the
  softmax normaliser near 1.
  """
  loss, sums = _token_sums(outputs["logits"], batch, label_smoothing)
  if z_loss:
    loss = loss + z_loss * sums["log_z_sq"]
  return loss / jnp.maximum(sums["weight"], 1.0), sums


def classify_loss(outputs: dict, batch: dict, *, lambda_pt: float = 0.0,
                  z_loss: float = 0.0):
  """(objective, sums) of classification; rows with no real token are padding.

  With ``lambda_pt`` > 0 the LM loss of the same passage is added (decoder-only
  fine-tuning, L = L_FT + lambda * L_PT). ``log_z`` and z-loss are those of
  the class head's softmax.
  """
  real = (batch["segment_ids"].max(-1) > 0).astype(jnp.float32)
  logits = outputs["class_logits"].astype(jnp.float32)
  nll_B = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], -1)[:, 0]
  n = jnp.maximum(real.sum(), 1.0)
  ft = jnp.sum(nll_B * real)
  objective = ft / n
  sums = {"loss": ft, "nll": ft, "weight": real.sum(),
          "correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * real),
          **_log_z_sums(logits, real)}
  if z_loss:
    objective = objective + z_loss * sums["log_z_sq"] / n
  if lambda_pt:
    pt, pt_sums = _token_sums(outputs["logits"], batch, 0.0)
    objective = objective + lambda_pt * pt / jnp.maximum(pt_sums["weight"], 1.0)
    sums["pt_loss"] = pt
    sums["pt_weight"] = pt_sums["weight"]
  return objective, sums


def _token_objective(config, family: str, *, train: bool):
  """Label smoothing (``train.label_smoothing``) and z-loss (``train.z_loss``)
  while training only."""
  del family
  smoothing = float(config.train.label_smoothing) if train else 0.0
  z_loss = float(config.train.z_loss) if train else 0.0
  return functools.partial(token_loss, label_smoothing=smoothing, z_loss=z_loss)


def _classify_objective(config, family: str, *, train: bool):
  """L_PT (``finetune.lambda_pt``) for decoder-only models, which predict tokens;
  z-loss (``train.z_loss``) while training."""
  lambda_pt = float(config.finetune.lambda_pt) if family == "decoder_only" else 0.0
  z_loss = float(config.train.z_loss) if train else 0.0
  return functools.partial(classify_loss, lambda_pt=lambda_pt, z_loss=z_loss)


# ------------------------------------------------------------- predictions
def _token_predictions(outputs: dict) -> jax.Array:
  return jnp.argmax(outputs["logits"], -1)


def _class_predictions(outputs: dict) -> jax.Array:
  return jnp.argmax(outputs["class_logits"], -1)


def _token_texts(batch, pred, tok):
  """Teacher-forced argmax tokens and the targets at the weighted positions."""
  hyps, refs = [], []
  for i in range(batch["inputs"].shape[0]):
    w = batch["weights"][i] > 0
    if w.any():
      hyps.append(tok.decode([int(t) for t in pred[i][w]]))
      refs.append(tok.decode([int(t) for t in batch["targets"][i][w]]))
  return hyps, refs


def _label_texts(batch, pred, tok):
  del tok
  real = batch["segment_ids"].max(-1) > 0
  return ([str(int(p)) for p, r in zip(pred, real) if r],
          [str(int(l)) for l, r in zip(batch["label"], real) if r])


# -------------------------------------------- samples at every evaluation
def _translation_examples(config):
  """The first ``eval.num_bleu_examples`` validation (source, reference) pairs."""
  if config.eval.num_bleu_examples <= 0:
    return []
  return texts.translation_pairs(config, "validation", config.eval.num_bleu_examples)


def _translation_report(run, examples, config) -> SampleReport:
  """eval/bleu of greedy translations, and a few of them as text."""
  from tfx_jax import bleu  # sacrebleu: only where BLEU is computed
  hyps = texts.translate_texts(run, [s for s, _ in examples], beam_size=1)
  score, _ = bleu.corpus_bleu(hyps, [r for _, r in examples])
  shown = "\n\n".join(f"source: {s}  \nhypothesis: {h}  \nreference: {r}"
                      for (s, r), h in list(zip(examples, hyps))[:config.eval.num_samples])
  return {"eval/bleu": score}, {"samples": shown}


def _translation_split(run, split, *, max_examples, beam_size, alpha):
  """BLEU and chrF (sacrebleu) of beam-search translations of a split."""
  from tfx_jax import bleu  # sacrebleu: only where BLEU is computed
  pairs = texts.translation_pairs(run.config, split, max_examples)
  hyps = texts.translate_texts(run, [s for s, _ in pairs], beam_size=beam_size,
                               alpha=alpha)
  refs = [r for _, r in pairs]
  b, b_sig = bleu.corpus_bleu(hyps, refs)
  c, c_sig = bleu.corpus_chrf(hyps, refs)
  metrics = {"bleu": b, "chrf": c, "bleu_signature": b_sig, "chrf_signature": c_sig,
             "num_examples": len(hyps), "beam_size": beam_size}
  return metrics, hyps, refs


def _prompt_examples(config):
  """The first four words of a few validation documents, as prompts."""
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


def _continuation_report(run, examples, config) -> SampleReport:
  del config
  prompts = [p for p, _ in examples]
  outs = texts.generate_texts(run, prompts, max_new_tokens=32, greedy=True)
  return {}, {"samples": "\n\n".join(f"{p} **{o}**" for p, o in zip(prompts, outs))}


# ----------------------------------------------------------- the registry
_TASKS = (
    Task("lm", ("decoder_only",), rows_lib.FORMATS["lm"], model_inputs=_token_inputs,
         objective=_token_objective, perplexity=True, accuracy=False,
         predictions=_token_predictions, prediction_texts=_token_texts,
         sample_inputs=_prompt_examples, sample_report=_continuation_report),
    Task("translate", ("encoder_decoder",), rows_lib.FORMATS["translate"],
         model_inputs=_translation_inputs, objective=_token_objective, perplexity=True,
         accuracy=False, predictions=_token_predictions, prediction_texts=_token_texts,
         sample_inputs=_translation_examples, sample_report=_translation_report,
         score_by_generation=_translation_split),
    Task("mlm", ("encoder_only",), rows_lib.FORMATS["mlm"], model_inputs=_token_inputs,
         objective=_token_objective, perplexity=True, accuracy=True,
         predictions=_token_predictions, prediction_texts=_token_texts),
    Task("classify", ("decoder_only", "encoder_only"), rows_lib.FORMATS["classify"],
         model_inputs=_token_inputs, objective=_classify_objective, perplexity=False,
         accuracy=True, predictions=_class_predictions, prediction_texts=_label_texts),
)
TASKS: dict[str, Task] = {t.name: t for t in _TASKS}


def get(name: str) -> Task:
  """The declaration of task ``name``; ConfigError listing the choices otherwise."""
  if name not in TASKS:
    raise ConfigError(f"task={name!r} is not a valid choice; choices: "
                      f"{', '.join(TASKS)}.")
  return TASKS[name]


def check_task(name: str, family: str) -> Task:
  """The task, after checking that ``family`` can run it."""
  task = get(name)
  if family not in task.families:
    raise ConfigError(f"task={name!r} needs model.family in {task.families}, "
                      f"but model.family={family!r}.")
  return task


def metrics_from_sums(task: Task, sums: dict) -> dict[str, float]:
  """eval/loss, eval/perplexity, eval/accuracy (as the task has them) from sums."""
  w = max(float(sums["weight"]), 1.0)
  loss = float(sums["nll"]) / w
  out = {"eval/loss": loss}
  if task.perplexity:
    out["eval/perplexity"] = float(math.exp(min(loss, 50.0)))
  if task.accuracy:
    out["eval/accuracy"] = float(sums["correct"]) / w
  if "pt_loss" in sums:
    out["eval/pt_loss"] = float(sums["pt_loss"]) / max(float(sums["pt_weight"]), 1.0)
  return out


def add_sums(total: dict | None, sums: dict) -> dict:
  """Running totals of per-batch sums (host NumPy values)."""
  sums = {k: np.asarray(v) for k, v in sums.items()}
  return sums if total is None else {k: total[k] + sums[k] for k in total}
