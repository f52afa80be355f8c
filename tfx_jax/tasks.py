"""What each task feeds the model and how it is scored (``config.task``).

lm        decoder_only: next-token cross entropy over real tokens.
translate encoder_decoder: label-smoothed cross entropy over target tokens.
mlm       encoder_only: cross entropy at the masked positions (BERT).
classify  decoder_only or encoder_only: cross entropy of the class head; for
          decoder_only the LM loss of the same passage is added,
          L = L_FT + lambda * L_PT (GPT-1; seed 003, eq. 2.18).

Every loss returns sums (not means) so evaluation can add them over batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tfx_jax.errors import ConfigError
from tfx_jax.optim import label_smoothed_cross_entropy

TASKS = ("lm", "translate", "mlm", "classify")
FAMILY_OF_TASK = {
    "lm": ("decoder_only",),
    "translate": ("encoder_decoder",),
    "mlm": ("encoder_only",),
    "classify": ("decoder_only", "encoder_only"),
}


def check_task(task: str, family: str) -> None:
  if task not in TASKS:
    raise ConfigError(f"task={task!r} is not a valid choice; choose one of: "
                      f"{', '.join(TASKS)}.")
  if family not in FAMILY_OF_TASK[task]:
    raise ConfigError(
        f"task={task!r} needs model.family in {FAMILY_OF_TASK[task]}, "
        f"but model.family={family!r}.")


def model_inputs(task: str, batch: dict) -> dict:
  """The keyword arguments of ``model.apply`` for one batch."""
  if task == "translate":
    return {"inputs": batch["inputs"], "decoder_inputs": batch["decoder_inputs"],
            "inputs_segment_ids": (batch["inputs"] > 0).astype(jnp.int32)}
  return {"inputs": batch["inputs"], "segment_ids": batch["segment_ids"],
          "positions": batch["positions"]}


def _token_loss(logits, batch, smoothing):
  weights = batch["weights"].astype(jnp.float32)
  loss, denom = label_smoothed_cross_entropy(logits, batch["targets"], weights, smoothing)
  # Plain (unsmoothed) NLL for perplexity, and accuracy.
  if smoothing:
    nll, _ = label_smoothed_cross_entropy(logits, batch["targets"], weights, 0.0)
  else:
    nll = loss
  correct = jnp.sum((jnp.argmax(logits, -1) == batch["targets"]) * weights)
  return loss, {"loss": loss, "nll": nll, "weight": denom, "correct": correct}


def loss_and_sums(task: str, outputs: dict, batch: dict, *, label_smoothing: float = 0.0,
                  lambda_pt: float = 0.0, family: str = "decoder_only"):
  """(objective to minimise, per-batch sums) for ``task``.

  Sums: ``loss`` (objective summed), ``nll`` (unsmoothed, for perplexity),
  ``weight`` (tokens or examples it was summed over), ``correct``.
  """
  if task in ("lm", "translate", "mlm"):
    loss, sums = _token_loss(outputs["logits"], batch, label_smoothing)
    return loss / jnp.maximum(sums["weight"], 1.0), sums
  # classify: rows with no real token are batch padding.
  real = (batch["segment_ids"].max(-1) > 0).astype(jnp.float32)
  logits = outputs["class_logits"].astype(jnp.float32)
  nll_B = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], -1)[:, 0]
  n = jnp.maximum(real.sum(), 1.0)
  ft = jnp.sum(nll_B * real)
  objective = ft / n
  sums = {"loss": ft, "nll": ft, "weight": real.sum(),
          "correct": jnp.sum((jnp.argmax(logits, -1) == batch["label"]) * real)}
  if family == "decoder_only" and lambda_pt:
    pt, pt_sums = _token_loss(outputs["logits"], batch, 0.0)
    objective = objective + lambda_pt * pt / jnp.maximum(pt_sums["weight"], 1.0)
    sums["pt_loss"] = pt
    sums["pt_weight"] = pt_sums["weight"]
  return objective, sums


def has_accuracy(task: str) -> bool:
  """Whether ``eval/accuracy`` is meaningful (masked-token or class accuracy)."""
  return task in ("mlm", "classify")


def has_perplexity(task: str) -> bool:
  return task in ("lm", "translate", "mlm")
