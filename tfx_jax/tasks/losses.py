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
* ``row_moments`` and ``standard_error``: the standard error of an evaluation
  mean (loss, accuracy, bits per byte) across the rows of the evaluated
  batches, from sums the evaluation step adds anyway (no second pass, no
  extra host transfer).
* ``byte_sums``: the sums of bits per byte, the NLL in bits over the UTF-8
  bytes of the targets (eval/bpb), comparable across tokenizers.
* ``uniform_token_loss``: their loss at initialisation, ln |V|.
* ``with_router_losses``: a task's training objective plus the load-balancing
  loss and the router z-loss of a mixture of experts (``model/layers/moe.py``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.layers import moe


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
    (loss_sum, weight_sum): divide for the mean loss per real token. The
    per-token losses are ``token_cross_entropy``.
  """
  loss = token_cross_entropy(logits, targets, smoothing, vocab_size)
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  weights = weights.astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(weights)


def token_cross_entropy(logits: jax.Array, targets: jax.Array, smoothing: float = 0.0,
                        vocab_size: int | None = None) -> jax.Array:
  """The label-smoothed cross entropy of every token, [...] float32
  (``label_smoothed_cross_entropy`` documents the arguments).

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
  return jax.nn.logsumexp(logits, axis=-1) - target_term - normalizer


def log_z_sums(logits, weights) -> dict:
  """Sums of log Z and log^2 Z of the softmax over ``logits``' last axis, Z =
  sum_i exp(logit_i), weighted: the output's normaliser, which z-loss keeps
  near 0 (log Z = 0: the logits are log-probabilities already)."""
  log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  return {"log_z": jnp.sum(log_z * weights), "log_z_sq": jnp.sum(jnp.square(log_z) * weights)}


def row_moments(values: dict[str, jax.Array], weights: jax.Array,
                weight: str = "weight") -> dict[str, jax.Array]:
  """The batch's sums ``standard_error`` reads, over its rows (axis 0),
  centred on the batch's own mean.

  With N_r row r's sum of ``weights``, X_r its sum of each weighted value x
  in ``values`` (``{"nll": loss x weight}``, [B, ...]) and m_b = sum_r X_r /
  sum_r N_r the batch's mean of x: ``<x>_shift`` = m_b, ``<x>_csq`` =
  sum_r (X_r - m_b N_r)^2 and ``<x>_cx_<weight>`` = sum_r (X_r - m_b N_r) N_r
  per value, and ``<weight>_sq`` = sum_r N_r^2, and for the default weight
  (the scored tokens) ``rows``, the rows with weight. ``weight`` names
  another denominator (``"bytes"``: bits per byte, whose rows are still the
  scored ones). ``add_sums`` turns them into the raw moments sum_r X_r^2 and
  sum_r X_r N_r in float64 on the host, where they add over batches.

  Why centred: the raw sum_r X_r^2 in float32 carries a rounding of about
  1e-7 x sum_r X_r^2, which the standard error's expanded square cancels
  down to sum_r (X_r - m N_r)^2, 10^3-10^4 times smaller on a language
  model's loss; the centred sums keep the rounding at 1e-7 of what is left,
  so the standard error does not depend on how the rows were split over
  batches, devices or processes.
  """
  n_B = jnp.sum(weights.reshape(weights.shape[0], -1), axis=1)
  out = {f"{weight}_sq": jnp.sum(jnp.square(n_B))}
  if weight == "weight":
    out["rows"] = jnp.sum((n_B > 0).astype(jnp.float32))
  total = jnp.maximum(jnp.sum(n_B), 1.0)
  for name, x in values.items():
    x_B = jnp.sum(x.reshape(x.shape[0], -1), axis=1)
    shift = jnp.sum(x_B) / total
    centred = x_B - shift * n_B
    out[f"{name}_shift"] = shift
    out[f"{name}_csq"] = jnp.sum(jnp.square(centred))
    out[f"{name}_cx_{weight}"] = jnp.sum(centred * n_B)
  return out


def raw_moments(sums: Mapping[str, Any]) -> dict[str, Any]:
  """One batch's ``row_moments`` (host values) as the raw moments that add
  over batches, in float64: ``<x>_sq`` = sum_r X_r^2 and ``<x>_x_<weight>``
  = sum_r X_r N_r in place of ``<x>_shift``, ``<x>_csq`` and
  ``<x>_cx_<weight>`` (X_r - m_b N_r + m_b N_r = X_r, expanded with the same
  m_b and ``<weight>_sq`` that ``standard_error`` later meets again, so their
  float32 rounding cancels exactly). Other sums pass through."""
  out = dict(sums)
  for key in [k for k in sums if k.endswith("_shift")]:
    name = key[:-len("_shift")]
    cx_key = next(k for k in sums if k.startswith(f"{name}_cx_"))
    weight = cx_key[len(f"{name}_cx_"):]
    shift = float(out.pop(key))
    csq, cxw = float(out.pop(f"{name}_csq")), float(out.pop(cx_key))
    weight_sq = float(sums[f"{weight}_sq"])
    out[f"{name}_sq"] = csq + 2.0 * shift * cxw + shift * shift * weight_sq
    out[f"{name}_x_{weight}"] = cxw + shift * weight_sq
  return out


def standard_error(sums: Mapping[str, Any], name: str, weight: str = "weight"
                   ) -> float | None:
  """The standard error of the mean m = sum(``name``) / sum(``weight``) over
  the evaluated rows (None: fewer than two rows, or ``row_moments`` not
  summed). ``weight`` "bytes" with ``name`` "bits" is bits per byte's: the
  same ratio estimate, with each row's bytes in place of its tokens.

  The rows are the sampling unit, each a cluster of tokens: the
  cluster-robust (sandwich) variance of a mean, the linearised variance of a
  ratio estimate (Cochran 1977, "Sampling Techniques", 3rd ed., ch. 6 and
  9A; Liang and Zeger 1986, with the R / (R - 1) small-sample factor):

    SE^2 = R / (R - 1) * sum_r (X_r - m N_r)^2 / (sum_r N_r)^2,

  X_r and N_r row r's sums of the value and the weights, R the rows with
  weight, the square expanded into the raw moments that ``add_sums`` adds in
  float64 on the host from each batch's centred ``row_moments``. Rows with
  one token each (one example per row: classification) give the textbook
  s / sqrt(n). The expansion cancels in float64; the float32 rounding left
  is that of the centred sums, about 1e-7 of the result.

  Why rows and not tokens: the tokens of one row come from one document (or
  a few, packed) and are read in one context, so their losses are
  positively correlated, and the token-level s / sqrt(tokens) would be the
  sampling error of the evaluated tokens as if each were drawn on its own, a
  lower bound that is loosest where rows are long. The evaluation reads rows
  (a fixed shuffle of the split, cut into rows), so the spread of the row
  sums is the honest one. It is still a lower bound where one document
  spans several rows (their losses are correlated too), and it measures how
  far the evaluated sample's mean is from the split's (or the population's);
  runs evaluated on the same sample share part of that error, so in a
  comparison it is an upper bound on what the evaluation adds to the
  seed-to-seed spread.
  """
  needed = (name, f"{name}_sq", f"{name}_x_{weight}", weight, f"{weight}_sq", "rows")
  if any(k not in sums for k in needed):
    return None
  rows, total = float(sums["rows"]), float(sums[weight])
  if rows < 2 or total <= 0:
    return None
  mean = float(sums[name]) / total
  squares = (float(sums[f"{name}_sq"]) - 2.0 * mean * float(sums[f"{name}_x_{weight}"])
             + mean * mean * float(sums[f"{weight}_sq"]))
  return math.sqrt(max(squares, 0.0) * rows / (rows - 1.0)) / total


def token_sums(logits, batch, smoothing) -> tuple[jax.Array, dict]:
  """(objective sum, sums) of next-token predictions ``logits`` against
  ``batch["targets"]`` at ``batch["weights"]`` (``token_loss`` lists the sums)."""
  weights = batch["weights"].astype(jnp.float32)
  loss, denom = label_smoothed_cross_entropy(logits, batch["targets"], weights, smoothing)
  # Plain (unsmoothed) NLL for perplexity and train/nll, and accuracy.
  nll_tokens = token_cross_entropy(logits, batch["targets"]) * weights
  nll = jnp.sum(nll_tokens) if smoothing else loss
  correct_tokens = (jnp.argmax(logits, -1) == batch["targets"]) * weights
  sums = {"loss": loss, "nll": nll, "weight": denom, "correct": jnp.sum(correct_tokens),
          **log_z_sums(logits, weights),
          **row_moments({"nll": nll_tokens, "correct": correct_tokens}, weights)}
  if "target_bytes" in batch:
    sums.update(byte_sums(nll_tokens, batch["target_bytes"] * weights))
  return loss, sums


def byte_sums(nll_tokens: jax.Array, bytes_tokens: jax.Array) -> dict[str, jax.Array]:
  """The sums of bits per byte: ``bits``, the weighted NLL in bits (nats /
  ln 2), ``bytes``, the UTF-8 bytes of the weighted targets (``bytes_tokens``,
  [B, L]: 0 for special tokens, whose bits still count), and their
  ``row_moments`` with the bytes as the weight. Sums, so that bits per byte
  is the split's total bits over its total bytes, whatever the batches and
  processes.

  Its standard error, ``standard_error(sums, "bits", "bytes")``, is the delta
  method's for a ratio of two sums over the evaluated rows (Cochran 1977,
  6.3): with X_r and B_r row r's bits and bytes and b = sum X / sum B,
  Var(b) ~ R / (R - 1) sum_r (X_r - b B_r)^2 / (sum_r B_r)^2, the formula
  of eval/loss_se with bytes in place of tokens."""
  bits_tokens = nll_tokens / math.log(2.0)
  bytes_tokens = bytes_tokens.astype(jnp.float32)
  return {"bits": jnp.sum(bits_tokens), "bytes": jnp.sum(bytes_tokens),
          **row_moments({"bits": bits_tokens}, bytes_tokens, "bytes")}


def token_loss(outputs: dict, batch: dict, *, label_smoothing: float = 0.0,
               z_loss: float = 0.0):
  """(mean objective, sums) of a token-level task (lm, translate, mlm).

  Sums: ``loss`` (objective summed), ``nll`` (unsmoothed, for perplexity),
  ``weight`` (tokens it was summed over), ``correct``, ``log_z`` and
  ``log_z_sq``, and the ``row_moments`` of ``nll`` and ``correct`` (for
  their standard errors; a train step does not return them, so XLA drops
  them); with ``batch["target_bytes"]`` (each target's UTF-8 bytes, which
  the evaluation step gathers: ``run/setup.make_eval_step``) the
  ``byte_sums`` of bits per byte too. With ``z_loss`` c > 0 the objective adds c * log^2 Z per token
  (PaLM, Chowdhery et al. 2022, section 5: c = 1e-4), which keeps the
  softmax normaliser near 1.
  """
  loss, sums = token_sums(outputs["logits"], batch, label_smoothing)
  if z_loss:
    loss = loss + z_loss * sums["log_z_sq"]
  return loss / jnp.maximum(sums["weight"], 1.0), sums


def token_objective(config, family: str, *, train: bool):
  """``token_loss`` with label smoothing (``train.label_smoothing``) and z-loss
  (``train.z_loss``) while training only: evaluation measures the plain loss.
  A mixture of experts adds its router losses while training
  (``with_router_losses``)."""
  del family
  smoothing = float(config.train.label_smoothing) if train else 0.0
  z_loss = float(config.train.z_loss) if train else 0.0
  return with_router_losses(
      functools.partial(token_loss, label_smoothing=smoothing, z_loss=z_loss),
      config, train=train)


def with_router_losses(loss_fn, config, *, train: bool):
  """``loss_fn(outputs, batch) -> (objective, sums)`` plus, while training a
  model with MoE layers (``outputs["moe"]``), ``train.moe_aux_loss`` times the
  load-balancing loss (per batch or per sequence, ``train.moe_aux_scope``;
  with ``model.moe_balance='aux_loss'``) and ``train.router_z_loss`` times the
  router z-loss (ST-MoE), both means over the MoE layers; the sums gain the
  router statistics the train step logs and balances with (``moe.router_sums``).
  Evaluation (``train`` False), and a dense model, have the task's loss alone."""
  if not train or getattr(getattr(config, "model", None), "ffn_type", "dense") != "moe":
    return loss_fn
  balance = config.model.moe_balance == "aux_loss"
  aux_weight = float(config.train.moe_aux_loss) if balance else 0.0
  z_weight = float(config.train.router_z_loss)
  scope = config.train.moe_aux_scope

  def objective(outputs, batch):
    loss, sums = loss_fn(outputs, batch)
    if "moe" not in outputs:
      return loss, sums
    router = moe.router_sums(outputs["moe"], scope)
    loss = loss + aux_weight * router["router/aux_loss"] + z_weight * router["router/z_loss"]
    return loss, {**sums, **router}

  return objective


def uniform_token_loss(config) -> float:
  """l0 of a token-level task: ln |V| (``model.vocab_size``), the cross entropy
  of the uniform prediction over the vocabulary."""
  return math.log(int(config.model.vocab_size))
