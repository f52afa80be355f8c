"""What a task declares (``Task``), and what evaluation does with any task.

A ``Task`` says everything the rest of the code needs to know about a task:
which families can run it, how one raw example becomes batch rows (and
whether rows are packed), what the model is fed, the loss, what its
context-free baseline counts, its loss at initialisation, which evaluation
metrics it reports, how evaluation predictions read as text, and what is
generated at every evaluation during training. Each task module
(``lm.py``, ``translate.py``, ``mlm.py``, ``classify.py``) declares one; the
registry (``registry.py``) looks them up by name.

The model inputs, argmax predictions and prediction texts of the token-level
tasks are below too: several tasks share them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, get_args

import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.model.config import Family
from tfx_jax.tasks import losses

# The evaluation metrics a task can report besides eval/loss (the mean NLL):
# perplexity exp(loss), accuracy and bpb (bits per byte: the NLL in bits over
# the UTF-8 bytes of the targets, which does not depend on the tokenizer) come
# from the summed evaluation forward (``metrics_from_sums``); bleu and chrf
# from decoded text (``generation.py``: eval/bleu at every evaluation, both in
# the evaluate command). Each but perplexity comes with its standard error,
# ``<metric>_se``.
Metric = Literal["perplexity", "accuracy", "bpb", "bleu", "chrf"]
FROM_SUMS: tuple[Metric, ...] = ("perplexity", "accuracy", "bpb")
FROM_GENERATION: tuple[Metric, ...] = ("bleu", "chrf")

# (scalars, texts) written to TensorBoard at every evaluation.
SampleReport = tuple[dict[str, float], dict[str, str]]


@dataclasses.dataclass(frozen=True)
class Task:
  """One task's declaration (see the module docstring).

  Every function that reads run settings takes the run config and reads it
  by attribute only (``config.train.label_smoothing``), so that a ConfigDict
  and a typed run config serve alike.
  """

  name: str
  families: tuple[Family, ...]
  rows: rows_lib.RowFormat           # how examples become rows (the builder)
  model_inputs: Callable[[dict], dict]
  # (config, family, *, train) -> loss(outputs, batch) -> (objective, sums):
  # the task's loss with the settings it reads bound (none at evaluation).
  # Every loss returns sums (not means) so evaluation can add them over batches.
  objective: Callable[..., Callable[[dict, dict], tuple]]
  # What the rows predict, counted for the unigram baseline (data/baselines.py).
  targets: baselines.Targets
  # config -> l0, the loss of the uniform prediction, which a freshly
  # initialised model gives up to its small initial logits.
  initial_loss: Callable[[Any], float]
  metrics: tuple[Metric, ...]        # reported besides eval/loss
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

  def __post_init__(self):
    """The parts agree with each other (a declaration error fails at import)."""
    if not (self.rows.name == self.targets.kind == self.name):
      raise ValueError(f"task {self.name!r}: rows.name={self.rows.name!r} and "
                       f"targets.kind={self.targets.kind!r} must be the task's name")
    if not set(self.targets.keys) <= set(self.rows.keys):
      raise ValueError(f"task {self.name!r}: its targets read {self.targets.keys}, "
                       f"its rows only {self.rows.keys}")
    unknown = [m for m in self.metrics if m not in get_args(Metric)]
    if unknown:
      raise ValueError(f"task {self.name!r}: unknown metrics {unknown}; "
                       f"choices: {get_args(Metric)}")
    if (self.sample_inputs is None) != (self.sample_report is None):
      raise ValueError(f"task {self.name!r}: sample_inputs and sample_report go together")
    if any(m in FROM_GENERATION for m in self.metrics) and self.score_by_generation is None:
      raise ValueError(f"task {self.name!r}: {self.metrics} need score_by_generation")


def metrics_from_sums(task: Task, sums: dict) -> dict[str, float]:
  """eval/loss, eval/perplexity, eval/accuracy, eval/bpb (as the task has
  them) from sums, each mean with its standard error across the evaluated
  rows beside it (eval/loss_se, eval/accuracy_se, eval/bpb_se:
  ``losses.standard_error``; perplexity is exp(loss), so it has none of its
  own). eval/bpb is the split's bits over its bytes (``losses.byte_sums``),
  where the evaluation gathered the targets' bytes and they are not all
  special tokens."""
  w = max(float(sums["weight"]), 1.0)
  loss = float(sums["nll"]) / w
  out = {"eval/loss": loss}
  if "perplexity" in task.metrics:
    out["eval/perplexity"] = float(math.exp(min(loss, 50.0)))
  if "accuracy" in task.metrics:
    out["eval/accuracy"] = float(sums["correct"]) / w
  if "bpb" in task.metrics and float(sums.get("bytes", 0.0)) > 0:
    out["eval/bpb"] = float(sums["bits"]) / float(sums["bytes"])
  for metric, total, weight in (("loss", "nll", "weight"), ("accuracy", "correct", "weight"),
                                ("bpb", "bits", "bytes")):
    se = losses.standard_error(sums, total, weight)
    if f"eval/{metric}" in out and se is not None:
      out[f"eval/{metric}_se"] = se
  if "pt_loss" in sums:
    out["eval/pt_loss"] = float(sums["pt_loss"]) / max(float(sums["pt_weight"]), 1.0)
  return out


def add_sums(total: dict | None, sums: dict) -> dict:
  """Running totals of per-batch sums (host NumPy values), in float64: the
  standard errors subtract sums of squares, which float32 totals over many
  batches would round. Each batch's centred row moments become raw ones
  first (``losses.raw_moments``)."""
  sums = {k: np.asarray(v, np.float64) for k, v in losses.raw_moments(sums).items()}
  return sums if total is None else {k: total[k] + sums[k] for k in total}


# ------------------------------------------------- token-level tasks' parts
def token_inputs(batch: dict) -> dict:
  """Tokens with their packing: lm, mlm, classify."""
  return {"inputs": batch["inputs"], "segment_ids": batch["segment_ids"],
          "positions": batch["positions"]}


def token_predictions(outputs: dict) -> jax.Array:
  """The argmax token at every position."""
  return jnp.argmax(outputs["logits"], -1)


def token_texts(batch, pred, tok):
  """Teacher-forced argmax tokens and the targets at the weighted positions."""
  hyps, refs = [], []
  for i in range(batch["inputs"].shape[0]):
    w = batch["weights"][i] > 0
    if w.any():
      hyps.append(tok.decode([int(t) for t in pred[i][w]]))
      refs.append(tok.decode([int(t) for t in batch["targets"][i][w]]))
  return hyps, refs
