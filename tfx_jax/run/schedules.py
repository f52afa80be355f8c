"""The learning-rate schedules of ``optim.schedule``.

Step convention: optax calls a schedule with `count`, the number of updates
already applied (0 for the first update). The formulas below are written, as in
the papers, for a step counted from 1, so every schedule evaluates them at
`step = count + 1`. The first update therefore gets a small non-zero learning
rate (e.g. `d_model^-0.5 * warmup^-1.5` for the Transformer schedule) and
`schedule(warmup_steps - 1)` is the peak, i.e. the rate of update number
`warmup_steps`.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax


def make_schedule(cfg, hp) -> optax.Schedule:
  """Returns the learning-rate schedule as a function of optax's update count.

  ``cfg`` is a resolved ``optim`` section (``optim.resolve``): it gives the kind
  (schedule, decay_shape) and whether there is a warmup; ``hp``
  (``optim.hyperparameters``, or the same traced) the values: the peak
  learning_rate, warmup_steps, and for "cosine" and "wsd" also decay_steps and
  min_lr_ratio, for "wsd" decay_fraction; for "linear" decay_steps.

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
  - "wsd" (warmup-stable-decay; Zhai et al. 2022, Hu et al. 2024 MiniCPM,
    Hägele et al. 2024): linear warmup, `peak` until the decay starts at
    `decay_steps * (1 - decay_fraction)`, then down to `min_lr_ratio * peak`
    at `decay_steps`: with progress `p` through the decay, the rate is
    `peak * (m + (1 - m) * (1 - s(p)))`, `s(p) = p` ("linear") or `sqrt(p)`
    ("1-sqrt", Hägele et al.'s cooldown, eq. 3); constant afterwards. A
    run's checkpoint from the stable phase continues into any decay length.
  """
  kind = cfg.schedule
  has_warmup = cfg.warmup_steps > 0
  lr, warmup, decay_steps = hp.learning_rate, hp.warmup_steps, hp.decay_steps
  # A quotient by a value of ``hp`` is a product with its reciprocal: XLA
  # rewrites `x / c` so for a constant c (trace_hyperparameters=False), and
  # the traced program must compute the same bits.
  per = lambda span: 1.0 / span

  def warmup_factor(step):
    if not has_warmup:
      return jnp.ones_like(step)
    return jnp.minimum(step * per(warmup), 1.0)

  def warmed(step, after):
    if not has_warmup:
      return after
    return jnp.where(step <= warmup, lr * warmup_factor(step), after)

  def from_one(count):
    return jnp.asarray(count, jnp.float32) + 1.0

  if kind == "inverse_sqrt":

    def schedule(count):
      step = from_one(count)
      return lr * jnp.minimum(step * per(warmup), jnp.sqrt(warmup / step))

  elif kind == "cosine":

    def schedule(count):
      step = from_one(count)
      progress = jnp.clip((step - warmup) * per(decay_steps - warmup), 0.0, 1.0)
      cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
      return warmed(step, lr * (hp.min_lr_ratio + (1.0 - hp.min_lr_ratio) * cosine))

  elif kind == "linear":

    def schedule(count):
      step = from_one(count)
      remaining = jnp.clip((decay_steps - step) * per(decay_steps - warmup), 0.0, 1.0)
      return warmed(step, lr * remaining)

  elif kind == "wsd":
    shape = jnp.sqrt if cfg.decay_shape == "1-sqrt" else (lambda p: p)

    def schedule(count):
      step = from_one(count)
      length = hp.decay_fraction * decay_steps
      progress = jnp.clip((step - (decay_steps - length)) * per(length), 0.0, 1.0)
      remaining = 1.0 - shape(progress)
      return warmed(step, lr * (hp.min_lr_ratio + (1.0 - hp.min_lr_ratio) * remaining))

  else:  # constant

    def schedule(count):
      step = from_one(count)
      return lr * warmup_factor(step)

  return schedule
