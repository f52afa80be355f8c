"""classify: one label per passage (decoder_only or encoder_only).

Rows: one padded row per example: inputs (bos + passage), segment_ids,
positions, label, and the passage's next-token targets and weights (for
L_PT); a passage longer than its row is truncated (counted), an example with
a blank text or a label outside [0, num_classes) skipped.
Loss: cross entropy of the class head (``classify_loss``); for decoder_only
the LM loss of the same passage is added, L = L_FT + lambda * L_PT (GPT-1,
Radford et al. 2018, eq. 5; textbook chapter 003, eq. 2.18).
Baseline: the entropy of the labels' distribution (the loss of predicting
the class frequencies). l0 = ln(model.num_classes). Metrics: accuracy.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.tasks import losses
from tfx_jax.tasks.task import Task, token_inputs


def classify_rows(example, index, *, tok, keys, seq_len, counts, n_classes):
  """The row of one labelled passage (module docstring); ``n_classes`` None:
  labels are only checked to be >= 0."""
  del index
  label = int(np.asarray(example[keys.label_key]))
  if label < 0 or (n_classes is not None and label >= n_classes):
    counts.add("skipped (label out of range)", f"{label}, num_classes "
               f"{n_classes if n_classes is not None else 'unknown'}")
    return []
  text = rows_lib.nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  ids = tok.encode(text)
  if len(ids) >= seq_len:
    counts.add("truncated (longer than seq_len)")
  inputs = ([tok.bos_id] + ids)[:seq_len]
  targets = (ids + [tok.eos_id])[:seq_len]
  return [{
      "inputs": rows_lib.pad(inputs, seq_len),
      "segment_ids": rows_lib.pad(np.ones(len(inputs)), seq_len),
      "positions": rows_lib.pad(np.arange(len(inputs)), seq_len),
      "label": np.int32(label),
      "targets": rows_lib.pad(targets, seq_len),
      "weights": rows_lib.pad(np.ones(len(targets)), seq_len, np.float32),
  }]


def classify_targets(example, tok, keys) -> list[int] | None:
  """The label, for an example ``classify_rows`` keeps."""
  del tok
  label = int(np.asarray(example[keys.label_key]))
  if label < 0 or not rows_lib.example_text(example, keys.text_key).strip():
    return None
  return [label]


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
  correct_B = (jnp.argmax(logits, -1) == batch["label"]) * real
  sums = {"loss": ft, "nll": ft, "weight": real.sum(), "correct": jnp.sum(correct_B),
          **losses.log_z_sums(logits, real),
          # One example per row: the standard errors across examples.
          **losses.row_moments({"nll": nll_B * real, "correct": correct_B}, real)}
  if z_loss:
    objective = objective + z_loss * sums["log_z_sq"] / n
  if lambda_pt:
    pt, pt_sums = losses.token_sums(outputs["logits"], batch, 0.0)
    objective = objective + lambda_pt * pt / jnp.maximum(pt_sums["weight"], 1.0)
    sums["pt_loss"] = pt
    sums["pt_weight"] = pt_sums["weight"]
  return objective, sums


def classify_objective(config, family: str, *, train: bool):
  """L_PT (``finetune.lambda_pt``) for decoder-only models, which predict tokens;
  z-loss (``train.z_loss``) while training."""
  lambda_pt = float(config.finetune.lambda_pt) if family == "decoder_only" else 0.0
  z_loss = float(config.train.z_loss) if train else 0.0
  return losses.with_router_losses(
      functools.partial(classify_loss, lambda_pt=lambda_pt, z_loss=z_loss), config,
      train=train)


def uniform_class_loss(config) -> float:
  """l0: ln(model.num_classes), the cross entropy of the uniform prediction
  over the classes (ln |V| for a config without two classes)."""
  classes = int(config.model.num_classes or 0)
  return math.log(classes) if classes > 1 else losses.uniform_token_loss(config)


def class_predictions(outputs: dict) -> jax.Array:
  """The argmax class of every row."""
  return jnp.argmax(outputs["class_logits"], -1)


def label_texts(batch, pred, tok):
  """Predicted and true labels of the real rows, as text."""
  del tok
  real = batch["segment_ids"].max(-1) > 0
  return ([str(int(p)) for p, r in zip(pred, real) if r],
          [str(int(l)) for l, r in zip(batch["label"], real) if r])


TASK = Task(
    "classify", ("decoder_only", "encoder_only"),
    rows=rows_lib.RowFormat("classify", classify_rows, packed=False, labelled=True,
                            keys=("text_key", "label_key")),
    model_inputs=token_inputs,
    objective=classify_objective,
    targets=baselines.Targets("classify", classify_targets, ("label_key", "text_key")),
    initial_loss=uniform_class_loss,
    metrics=("accuracy",),
    predictions=class_predictions,
    prediction_texts=label_texts,
)
