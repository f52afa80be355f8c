"""The losses the tasks share: label-smoothed cross entropy, z-loss, token loss.

Every loss returns sums (not means) so evaluation can add them over batches;
the task modules bind the settings each loss reads (``token_objective``).

* ``label_smoothed_cross_entropy``: the cross entropy against targets smoothed
  over the vocabulary (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4),
  as a KL divergence so that 0 is attainable.
* ``log_z_sums``: log Z of the output softmax, which z-loss keeps near 0
  (PaLM, Chowdhery et al. 2022, section 5).
* ``token_loss``: the objective of the token-level tasks (lm, translate, mlm)
  and its sums.
* ``uniform_token_loss``: their loss at initialisation, ln |V|.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from tfx_jax.errors import ConfigError


def label_smoothed_cross_entropy(
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    smoothing: float = 0.0,
    vocab_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Weighted, label-smoothed cross entropy, summed over tokens.

  Args:
    logits: [..., V] (any float dtype; computed in float32).
    targets: [...] int ids.
    weights: [...] float, 0 at padding (None = all ones).
    smoothing: epsilon of label smoothing, in [0, 1); a Python float (static
      under jit).
    vocab_size: number of real tokens when the logits' last axis is padded
      (e.g. to a multiple of 128); the smoothing mass goes to real tokens
      only. Defaults to `logits.shape[-1]`.

  Returns:
    (loss_sum, weight_sum): divide for the mean loss per real token.

  Targets are `1 - smoothing` on the true id and `smoothing / (V - 1)` on each
  other real id. As in the flax WMT example, the entropy of that target
  distribution (a constant) is subtracted, so the loss is the KL divergence
  to the smoothed targets: 0 is attainable and smoothing = 0 gives plain
  cross entropy (the constant is then 0).
  """
  if not 0.0 <= smoothing < 1.0:
    raise ConfigError(f"label_smoothing={smoothing!r} must be in [0, 1)")
  padded_vocab = logits.shape[-1]
  vocab = padded_vocab if vocab_size is None else int(vocab_size)
  logits = logits.astype(jnp.float32)

  confidence = 1.0 - smoothing
  low_confidence = smoothing / (vocab - 1)
  # Entropy of the soft targets; 0 * log(0) is taken as 0.
  normalizer = -(confidence * jnp.log(confidence) +
                 (vocab - 1) * low_confidence * jnp.log(low_confidence + 1e-20))

  # -sum_j q_j log_softmax(z)_j = logsumexp(z) - sum_j q_j z_j (the q_j sum to
  # 1), with q_t = confidence and q_j = low_confidence on the other real ids.
  # Written this way no [.., V] one-hot or target array is built, and the
  # backward pass is one softmax: at vocabulary 8192 this is the largest
  # elementwise cost of a training step.
  # A gather measured faster on CPU than a compare-and-select or a one-hot sum.
  logit_t = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32),
                                axis=-1)[..., 0]
  target_term = confidence * logit_t
  if smoothing:
    real = (jnp.arange(padded_vocab) < vocab).astype(jnp.float32)
    real_t = (targets < vocab).astype(jnp.float32)
    target_term = (target_term - low_confidence * real_t * logit_t
                   + low_confidence * jnp.sum(logits * real, axis=-1))
  loss = jax.nn.logsumexp(logits, axis=-1) - target_term - normalizer
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  weights = weights.astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(weights)


def log_z_sums(logits, weights) -> dict:
  """Sums of log Z and log^2 Z of the softmax over ``logits``' last axis, Z =
  sum_i exp(logit_i), weighted: the output's normaliser, which z-loss keeps
  near 0 (log Z = 0: the logits are log-probabilities already)."""
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  return {"log_z": jnp.sum(log_z * weights), "log_z_sq": jnp.sum(jnp.square(log_z) * weights)}


def token_sums(logits, batch, smoothing) -> tuple[jax.Array, dict]:
  """(objective sum, sums) of next-token predictions ``logits`` against
  ``batch["targets"]`` at ``batch["weights"]`` (``token_loss`` lists the sums)."""
  weights = batch["weights"].astype(jnp.float32)
  loss, denom = label_smoothed_cross_entropy(logits, batch["targets"], weights, smoothing)
  # Plain (unsmoothed) NLL for perplexity and train/nll, and accuracy.
  if smoothing:
    nll, _ = label_smoothed_cross_entropy(logits, batch["targets"], weights, 0.0)
  else:
    nll = loss
  correct = jnp.sum((jnp.argmax(logits, -1) == batch["targets"]) * weights)
  return loss, {"loss": loss, "nll": nll, "weight": denom, "correct": correct,
                **log_z_sums(logits, weights)}


def token_loss(outputs: dict, batch: dict, *, label_smoothing: float = 0.0,
               z_loss: float = 0.0):
  """(mean objective, sums) of a token-level task (lm, translate, mlm).

  Sums: ``loss`` (objective summed), ``nll`` (unsmoothed, for perplexity),
  ``weight`` (tokens it was summed over), ``correct``, ``log_z`` and
  ``log_z_sq``. With ``z_loss`` c > 0 the objective adds c * log^2 Z per
  token (PaLM, Chowdhery et al. 2022, section 5: c = 1e-4), which keeps the
  softmax normaliser near 1.
  """
  loss, sums = token_sums(outputs["logits"], batch, label_smoothing)
  if z_loss:
    loss = loss + z_loss * sums["log_z_sq"]
  return loss / jnp.maximum(sums["weight"], 1.0), sums


def token_objective(config, family: str, *, train: bool):
  """``token_loss`` with label smoothing (``train.label_smoothing``) and z-loss
  (``train.z_loss``) while training only: evaluation measures the plain loss."""
  del family
  smoothing = float(config.train.label_smoothing) if train else 0.0
  z_loss = float(config.train.z_loss) if train else 0.0
  return functools.partial(token_loss, label_smoothing=smoothing, z_loss=z_loss)


def uniform_token_loss(config) -> float:
  """l0 of a token-level task: ln |V| (``model.vocab_size``), the cross entropy
  of the uniform prediction over the vocabulary."""
  return math.log(int(config.model.vocab_size))
