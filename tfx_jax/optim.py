"""Learning-rate schedules, optimizers and the label-smoothed loss.

Everything is built from the `optim` section of a run config; the fields read
are listed in `make_schedule` and `make_optimizer`. Invalid values raise
`ConfigError` naming the field, the value and the valid choices.

Step convention: optax calls a schedule with `count`, the number of updates
already applied (0 for the first update). The formulas below are written, as in
the papers, for a step counted from 1, so every schedule evaluates them at
`step = count + 1`. The first update therefore gets a small non-zero learning
rate (e.g. `d_model^-0.5 * warmup^-1.5` for the Transformer schedule) and
`schedule(warmup_steps - 1)` is the peak, i.e. the rate of update number
`warmup_steps`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from tfx_jax.errors import ConfigError


OPTIMIZERS = ("adam", "adamw", "adafactor")
SCHEDULES = ("inverse_sqrt", "cosine", "linear", "constant")

# Leaf names that never get weight decay, whatever their rank: with scan over
# layers a bias or norm scale of shape [D] is stored stacked as [layers, D], so
# rank alone does not identify them.
NO_DECAY_NAMES = ("bias", "scale")


def _choice(cfg: Any, field: str, choices: tuple[str, ...]) -> str:
  value = getattr(cfg, field)
  if value not in choices:
    raise ConfigError(
        f"optim.{field}={value!r} is not valid; choose one of {list(choices)}")
  return value


def _check(ok: bool, field: str, value: Any, requirement: str) -> None:
  if not ok:
    raise ConfigError(f"optim.{field}={value!r} is not valid: {requirement}")


def check_config(optim_cfg: Any, *, num_train_steps: int) -> None:
  """Every check of the ``optim`` section, without building anything.

  ``make_schedule`` and ``make_optimizer`` call it first; the run config's
  validation calls it alone (``run_config.validate_run_config``).
  """
  kind = _choice(optim_cfg, "schedule", SCHEDULES)
  _choice(optim_cfg, "optimizer", OPTIMIZERS)
  lr = float(optim_cfg.learning_rate)
  warmup = int(optim_cfg.warmup_steps)
  _check(lr > 0, "learning_rate", lr, "must be > 0")
  _check(warmup >= 0, "warmup_steps", warmup, "must be >= 0")
  if optim_cfg.scale_by_d_model:
    _check(kind == "inverse_sqrt", "scale_by_d_model", True,
           f"only valid with schedule='inverse_sqrt' (got schedule={kind!r})")
    _check(warmup > 0, "warmup_steps", warmup,
           "must be > 0 when scale_by_d_model is set")
  if kind == "inverse_sqrt":
    _check(warmup > 0, "warmup_steps", warmup,
           "must be > 0 for schedule='inverse_sqrt'")
  if kind in ("cosine", "linear"):
    decay_steps = int(optim_cfg.decay_steps) or int(num_train_steps)
    _check(decay_steps > warmup, "decay_steps", decay_steps,
           f"must be > warmup_steps ({warmup}) for schedule={kind!r}")
  if kind == "cosine":
    min_ratio = float(optim_cfg.min_lr_ratio)
    _check(0.0 <= min_ratio <= 1.0, "min_lr_ratio", min_ratio, "must be in [0, 1]")
  for field in ("b1", "b2"):
    value = float(getattr(optim_cfg, field))
    _check(0.0 <= value < 1.0, field, value, "must be in [0, 1)")
  _check(float(optim_cfg.eps) > 0, "eps", optim_cfg.eps, "must be > 0")
  weight_decay = float(optim_cfg.weight_decay)
  _check(weight_decay >= 0, "weight_decay", weight_decay, "must be >= 0")
  _check(float(optim_cfg.grad_clip_norm) >= 0, "grad_clip_norm", optim_cfg.grad_clip_norm,
         "must be >= 0 (0 = off)")
  _check(int(optim_cfg.accumulate_steps) >= 1, "accumulate_steps",
         optim_cfg.accumulate_steps, "must be >= 1 (1 = off)")
  if optim_cfg.optimizer == "adam":
    _check(weight_decay == 0, "weight_decay", weight_decay,
           "optimizer='adam' has no weight decay; use optimizer='adamw' or "
           "set weight_decay=0.0")


def make_schedule(optim_cfg: Any, *, d_model: int,
                  num_train_steps: int) -> optax.Schedule:
  """Returns the learning-rate schedule as a function of optax's update count.

  Fields read: schedule, learning_rate, warmup_steps, scale_by_d_model, and
  for "cosine" also decay_steps (0 = `num_train_steps`), min_lr_ratio; for
  "linear" also decay_steps. `d_model` (the model width) is used only with
  scale_by_d_model; `num_train_steps` (the number of optimizer updates) only
  by "cosine" and "linear".

  With `step = count + 1` (see the module docstring) and
  `peak = learning_rate`:

  - "inverse_sqrt": `peak * min(step / warmup, sqrt(warmup / step))`: linear
    warmup, then decay with the inverse square root of the step. With
    `scale_by_d_model` the peak is `learning_rate * d_model^-0.5 *
    warmup^-0.5`, which makes this exactly the schedule of "Attention Is All
    You Need" (eq. 3), `lr = d_model^-0.5 * min(step^-0.5, step *
    warmup^-1.5)`, scaled by `learning_rate` (1.0 in the paper recipe).
  - "cosine": linear warmup to `peak` over `warmup_steps`, then half-cosine
    decay to `min_lr_ratio * peak` at step `decay_steps` (default: the last
    update), constant afterwards.
  - "linear": linear warmup to `peak` over `warmup_steps`, then linear decay
    to 0 at step `decay_steps` (default: the last update), 0 afterwards. BERT's
    schedule (Devlin et al. 2019; HF `get_linear_schedule_with_warmup`);
    min_lr_ratio is not read.
  - "constant": linear warmup to `peak` (no warmup if warmup_steps is 0),
    then constant.
  """
  check_config(optim_cfg, num_train_steps=num_train_steps)
  kind = optim_cfg.schedule
  lr = float(optim_cfg.learning_rate)
  warmup = int(optim_cfg.warmup_steps)
  if optim_cfg.scale_by_d_model:
    d_model = int(d_model)
    if d_model <= 0:
      raise ConfigError(f"model.d_model={d_model!r} must be > 0")
    lr = lr * d_model**-0.5 * warmup**-0.5

  def warmup_factor(step):
    if warmup == 0:
      return jnp.ones_like(step)
    return jnp.minimum(step / warmup, 1.0)

  decay_steps = int(optim_cfg.decay_steps) or int(num_train_steps)

  if kind == "inverse_sqrt":

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      return lr * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))

  elif kind == "cosine":
    min_ratio = float(optim_cfg.min_lr_ratio)

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      progress = jnp.clip((step - warmup) / (decay_steps - warmup), 0.0, 1.0)
      cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
      decayed = lr * (min_ratio + (1.0 - min_ratio) * cosine)
      return jnp.where(step <= warmup, lr * warmup_factor(step), decayed)

  elif kind == "linear":

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      remaining = jnp.clip((decay_steps - step) / (decay_steps - warmup), 0.0, 1.0)
      return jnp.where(step <= warmup, lr * warmup_factor(step), lr * remaining)

  else:  # constant

    def schedule(count):
      step = jnp.asarray(count, jnp.float32) + 1.0
      return lr * warmup_factor(step)

  return schedule


def decay_mask(params: Any) -> Any:
  """Pytree of bools: True where weight decay applies.

  Biases and norm scales are excluded: every leaf of rank <= 1 and every leaf
  whose name is in `NO_DECAY_NAMES` (stacked per-layer copies included).
  """

  def leaf_name(path) -> str:
    for key in reversed(path):
      if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
      if isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
        return key.name
    return ""

  return jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.ndim(p) > 1 and leaf_name(path) not in NO_DECAY_NAMES,
      params)


def make_optimizer(optim_cfg: Any, *, d_model: int,
                   num_train_steps: int) -> optax.GradientTransformation:
  """Returns clip -> optimizer (-> gradient accumulation) built from config.

  Fields read: optimizer, grad_clip_norm (0 = off), weight_decay,
  accumulate_steps (1 = off), b1, b2, eps (adam / adamw), plus the schedule
  fields of `make_schedule` (which also takes `d_model`, `num_train_steps`).

  - "adam": Adam without weight decay (weight_decay must be 0; use "adamw").
  - "adamw": Adam with decoupled weight decay (Loshchilov & Hutter), masked
    by `decay_mask`. Note that optax multiplies the decay by the learning
    rate, as in PyTorch's AdamW.
  - "adafactor": optax's Adafactor defaults (factored second moments,
    decay_rate 0.8, update clipping 1.0, step scaled by parameter RMS, no
    momentum); b1, b2, eps are not used. weight_decay becomes
    `weight_decay_rate`, masked by `decay_mask`.

  With accumulate_steps = k > 1 the whole chain is wrapped in
  `optax.MultiSteps`: gradients of k consecutive calls are averaged and
  applied once, so clipping acts on the averaged gradient and the schedule
  counts real updates, not micro-batches.
  """
  schedule = make_schedule(optim_cfg, d_model=d_model,
                           num_train_steps=num_train_steps)
  name = optim_cfg.optimizer
  weight_decay = float(optim_cfg.weight_decay)
  clip = float(optim_cfg.grad_clip_norm)
  accumulate = int(optim_cfg.accumulate_steps)

  if name == "adam":
    opt = optax.adam(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2,
                     eps=optim_cfg.eps)
  elif name == "adamw":
    opt = optax.adamw(schedule, b1=optim_cfg.b1, b2=optim_cfg.b2,
                      eps=optim_cfg.eps, weight_decay=weight_decay,
                      mask=decay_mask)
  else:  # adafactor
    opt = optax.adafactor(
        schedule,
        weight_decay_rate=weight_decay or None,
        weight_decay_mask=decay_mask if weight_decay else None)

  if clip > 0:
    opt = optax.chain(optax.clip_by_global_norm(clip), opt)
  if accumulate > 1:
    opt = optax.MultiSteps(opt, every_k_schedule=accumulate)
  return opt


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
