"""Schedules, optimizer chain and loss against hand-written formulas."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tfx_jax import optim
from tfx_jax.tasks import losses


def _cfg(**overrides):
  cfg = ml_collections.ConfigDict(dict(
      optimizer="adamw", learning_rate=1e-3, schedule="constant",
      warmup_steps=0, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0,
      grad_clip_norm=0.0, decay_steps=1000, min_lr_ratio=0.1,
      scale_by_d_model=False, accumulate_steps=1))
  cfg.update(overrides)
  return cfg


def _schedule(cfg, d_model=512, num_train_steps=1000):
  resolved, _ = optim.resolve(cfg, num_train_steps=num_train_steps)
  return optim.make_schedule(resolved, d_model=d_model)


def _optimizer(cfg, d_model=512, num_train_steps=1000):
  resolved, _ = optim.resolve(cfg, num_train_steps=num_train_steps)
  return optim.make_optimizer(resolved, d_model=d_model)


def _lr(schedule, count):
  return float(schedule(count))


def test_transformer_paper_schedule():
  cfg = _cfg(schedule="inverse_sqrt", learning_rate=1.0, warmup_steps=4000,
             scale_by_d_model=True)
  schedule = _schedule(cfg, d_model=512)

  def paper(step):  # Vaswani et al. 2017, eq. 3; step counted from 1.
    return 512**-0.5 * min(step**-0.5, step * 4000**-1.5)

  for step in (1, 2, 100, 3999, 4000, 4001, 10_000, 100_000):
    np.testing.assert_allclose(_lr(schedule, step - 1), paper(step), rtol=1e-5)
  peak = _lr(schedule, 3999)  # update number 4000
  np.testing.assert_allclose(peak, 512**-0.5 * 4000**-0.5, rtol=1e-5)
  assert abs(peak - 7.0e-4) < 1e-5
  assert _lr(schedule, 0) > 0  # first update does not get a zero rate


def test_inverse_sqrt_without_d_model_peaks_at_learning_rate():
  schedule = _schedule(
      _cfg(schedule="inverse_sqrt", learning_rate=2e-3, warmup_steps=100))
  np.testing.assert_allclose(_lr(schedule, 99), 2e-3, rtol=1e-6)
  np.testing.assert_allclose(_lr(schedule, 49), 2e-3 * 50 / 100, rtol=1e-6)
  np.testing.assert_allclose(_lr(schedule, 399), 2e-3 * math.sqrt(100 / 400),
                             rtol=1e-6)


def test_cosine_endpoints_and_midpoint():
  schedule = _schedule(
      _cfg(schedule="cosine", learning_rate=1e-3, warmup_steps=10,
           decay_steps=110, min_lr_ratio=0.1))
  np.testing.assert_allclose(_lr(schedule, 0), 1e-3 / 10, rtol=1e-6)
  np.testing.assert_allclose(_lr(schedule, 9), 1e-3, rtol=1e-6)  # peak
  np.testing.assert_allclose(_lr(schedule, 59), 1e-3 * (0.1 + 0.9 * 0.5),
                             rtol=1e-5)  # halfway through the decay
  np.testing.assert_allclose(_lr(schedule, 109), 1e-4, rtol=1e-5)  # end
  np.testing.assert_allclose(_lr(schedule, 10_000), 1e-4, rtol=1e-5)


def test_linear_warmup_then_decay_to_zero():
  """BERT: linear warmup to the peak, then linear decay to 0 at decay_steps."""
  schedule = _schedule(_cfg(schedule="linear", learning_rate=1e-3, warmup_steps=10,
                            decay_steps=110))
  np.testing.assert_allclose(_lr(schedule, 0), 1e-3 / 10, rtol=1e-6)
  np.testing.assert_allclose(_lr(schedule, 9), 1e-3, rtol=1e-6)  # peak
  np.testing.assert_allclose(_lr(schedule, 59), 1e-3 * 0.5, rtol=1e-5)  # midpoint
  np.testing.assert_allclose(_lr(schedule, 84), 1e-3 * 0.25, rtol=1e-5)
  assert _lr(schedule, 109) == pytest.approx(0.0, abs=1e-12)  # end
  assert _lr(schedule, 10_000) == pytest.approx(0.0, abs=1e-12)
  # decay_steps 0 = num_train_steps
  default = _schedule(_cfg(schedule="linear", warmup_steps=0, decay_steps=0),
                      num_train_steps=50)
  np.testing.assert_allclose(_lr(default, 24), 1e-3 * 0.5, rtol=1e-5)
  with pytest.raises(optim.ConfigError, match="decay_steps"):
    _schedule(_cfg(schedule="linear", warmup_steps=10, decay_steps=10))


def test_cosine_decay_steps_default_to_num_train_steps():
  schedule = _schedule(_cfg(schedule="cosine", warmup_steps=0, decay_steps=0,
                            min_lr_ratio=0.0), num_train_steps=50)
  np.testing.assert_allclose(_lr(schedule, 24), 1e-3 * 0.5, rtol=1e-5)
  assert _lr(schedule, 49) == pytest.approx(0.0, abs=1e-12)


def test_constant_with_and_without_warmup():
  assert _lr(_schedule(_cfg()), 0) == pytest.approx(1e-3)
  schedule = _schedule(_cfg(warmup_steps=4))
  assert [_lr(schedule, c) for c in range(6)] == pytest.approx(
      [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_schedule_works_under_jit():
  schedule = _schedule(
      _cfg(schedule="inverse_sqrt", warmup_steps=10))
  np.testing.assert_allclose(jax.jit(schedule)(jnp.int32(9)), 1e-3, rtol=1e-6)


@pytest.mark.parametrize("field,value", [
    ("optimizer", "sgd"), ("schedule", "exponential"), ("accumulate_steps", 0),
    ("grad_clip_norm", -1.0)])
def test_invalid_values_name_field_and_choices(field, value):
  with pytest.raises(optim.ConfigError, match=f"optim.{field}"):
    _optimizer(_cfg(**{field: value}))


def test_invalid_choice_lists_valid_choices():
  with pytest.raises(optim.ConfigError, match="adafactor"):
    _optimizer(_cfg(optimizer="sgd"))


def test_scale_by_d_model_requires_inverse_sqrt():
  with pytest.raises(optim.ConfigError, match="scale_by_d_model"):
    _schedule(_cfg(schedule="cosine", warmup_steps=10,
                             scale_by_d_model=True))


def test_adam_with_weight_decay_is_rejected():
  with pytest.raises(optim.ConfigError, match="weight_decay"):
    _optimizer(_cfg(optimizer="adam", weight_decay=0.1))


def _first_moment(opt_state):
  return optax.tree_utils.tree_get(opt_state, "mu")


def test_clipping_clips_the_gradient_seen_by_adam():
  params = {"w": jnp.zeros((2, 2))}
  grads = {"w": jnp.full((2, 2), 3.0)}  # global norm 6
  for clip, expected_norm in ((1.0, 1.0), (0.0, 6.0)):
    opt = _optimizer(_cfg(grad_clip_norm=clip))
    _, state = jax.jit(opt.update)(grads, opt.init(params), params)
    mu = _first_moment(state)["w"]
    # After one step Adam's first moment is (1 - b1) * gradient.
    np.testing.assert_allclose(optax.tree.norm(mu) / 0.1, expected_norm,
                               rtol=1e-5)


def test_weight_decay_mask_skips_biases_and_norm_scales():
  params = {
      "dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones((4,))},
      "norm": {"scale": jnp.ones((4,))},
      # Scanned layers stack per-layer vectors into rank-2 arrays.
      "layers": {"norm": {"scale": jnp.ones((2, 4))},
                 "mlp": {"bias": jnp.ones((2, 4)),
                         "kernel": jnp.ones((2, 4, 4))}},
  }
  mask = optim.decay_mask(params)
  assert mask == {
      "dense": {"kernel": True, "bias": False},
      "norm": {"scale": False},
      "layers": {"norm": {"scale": False},
                 "mlp": {"bias": False, "kernel": True}},
  }
  # With zero gradients only the decayed leaves move.
  opt = _optimizer(_cfg(weight_decay=0.5, learning_rate=0.1))
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(opt.update)(zeros, opt.init(params), params)
  moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
  assert moved == mask


@pytest.mark.parametrize("name", ["adam", "adamw", "adafactor"])
def test_every_optimizer_reduces_a_quadratic(name):
  opt = _optimizer(
      _cfg(optimizer=name, learning_rate=0.1, grad_clip_norm=1.0,
           weight_decay=0.0))
  params = {"w": jnp.full((4, 4), 2.0)}
  state = opt.init(params)
  loss = lambda p: jnp.sum(p["w"] ** 2)
  for _ in range(5):
    updates, state = jax.jit(opt.update)(jax.grad(loss)(params), state, params)
    params = optax.apply_updates(params, updates)
  assert loss(params) < 0.9 * 64.0


def test_gradient_accumulation_applies_every_k_steps():
  opt = _optimizer(_cfg(optimizer="adam", accumulate_steps=2))
  params = {"w": jnp.ones((2, 2))}
  state = opt.init(params)
  grads = {"w": jnp.ones((2, 2))}
  updates, state = jax.jit(opt.update)(grads, state, params)
  assert not jnp.any(updates["w"])
  updates, state = jax.jit(opt.update)(grads, state, params)
  assert jnp.all(updates["w"] < 0)


def _ce_reference(logits, targets, weights, smoothing, vocab):
  """Loop-based KL(soft targets || softmax) in float64."""
  logits = np.asarray(logits, np.float64)
  total = 0.0
  for idx in np.ndindex(*targets.shape):
    row = logits[idx][:vocab]
    logp = row - np.log(np.sum(np.exp(row - row.max()))) - row.max()
    q = np.full(vocab, smoothing / (vocab - 1))
    q[targets[idx]] = 1.0 - smoothing
    kl = np.sum(np.where(q > 0, q * (np.log(np.maximum(q, 1e-300)) - logp), 0))
    total += weights[idx] * kl
  return total


def test_cross_entropy_matches_reference_and_excludes_padding():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, size=(2, 5))
  weights = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
  for smoothing in (0.0, 0.1):
    loss_sum, weight_sum = losses.label_smoothed_cross_entropy(
        jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32), targets,
        weights, smoothing)
    ref = _ce_reference(np.asarray(jnp.asarray(logits, jnp.bfloat16),
                                   np.float32), targets, weights, smoothing, 7)
    np.testing.assert_allclose(loss_sum, ref, rtol=1e-5)
    assert float(weight_sum) == 8.0
  # Garbage at padded positions does not change the result.
  noisy = logits.copy()
  noisy[0, 3:] = 1e4
  a = losses.label_smoothed_cross_entropy(logits, targets, weights, 0.1)
  b = losses.label_smoothed_cross_entropy(noisy, targets, weights, 0.1)
  np.testing.assert_allclose(a[0], b[0], rtol=1e-6)


def test_zero_smoothing_is_plain_cross_entropy():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 4, 11)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, size=(3, 4)))
  loss_sum, weight_sum = losses.label_smoothed_cross_entropy(
      logits, targets, None, 0.0)
  plain = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  np.testing.assert_allclose(loss_sum, jnp.sum(plain), rtol=1e-6)
  assert float(weight_sum) == 12.0


def test_smoothed_loss_reaches_zero_at_the_target_distribution():
  vocab, smoothing = 6, 0.2
  q = np.full(vocab, smoothing / (vocab - 1))
  q[2] = 1 - smoothing
  loss_sum, _ = losses.label_smoothed_cross_entropy(
      jnp.log(jnp.asarray(q, jnp.float32))[None], jnp.array([2]), None,
      smoothing)
  assert abs(float(loss_sum)) < 1e-5


def test_padded_vocab_gets_no_smoothing_mass():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 8)).astype(np.float32)
  logits[:, 6:] = -1e9  # two padding entries of the vocabulary
  targets = rng.integers(0, 6, size=(4,))
  weights = np.ones(4, np.float32)
  loss_sum, _ = losses.label_smoothed_cross_entropy(
      logits, targets, weights, 0.1, vocab_size=6)
  ref = _ce_reference(logits, targets, weights, 0.1, 6)
  np.testing.assert_allclose(loss_sum, ref, rtol=1e-5)


def test_cross_entropy_is_stable_for_large_bf16_logits():
  # Values exactly representable in bfloat16.
  logits = jnp.array([[8192, -8192, 0], [-4096, 4096, 1024]], jnp.bfloat16)
  loss_sum, _ = losses.label_smoothed_cross_entropy(
      logits, jnp.array([0, 2]), None, 0.0)
  # Row 0 is certain and right (loss 0); row 1 is off by 4096 - 1024.
  np.testing.assert_allclose(loss_sum, 3072.0, rtol=1e-6)


def test_base_config_optim_section_builds():
  from tfx_jax import config_base
  config = config_base.base_config()
  opt = _optimizer(config.optim, d_model=64, num_train_steps=200)
  params = {"w": jnp.ones((2, 2))}
  updates, _ = jax.jit(opt.update)(params, opt.init(params), params)
  assert jnp.all(jnp.isfinite(updates["w"]))


def test_weight_decay_mask_sees_through_partitioning_boxes():
  import flax.linen as nn
  params = {
      "norm": {"scale": nn.LogicallyPartitioned(jnp.ones((2, 4)),
                                                ("layers", "embed"))},
      "mlp": {"kernel": nn.LogicallyPartitioned(jnp.ones((4, 8)),
                                                ("embed", "mlp"))},
  }
  mask = optim.decay_mask(nn.unbox(params))
  assert mask == {"norm": {"scale": False}, "mlp": {"kernel": True}}
  boxed = optim.decay_mask(params)
  assert nn.unbox(boxed) == mask


@pytest.mark.parametrize("smoothing,vocab_size", [(0.0, None), (0.1, None), (0.1, 6)])
def test_cross_entropy_and_gradient_equal_the_one_hot_formula(smoothing, vocab_size):
  """The logsumexp form equals -sum(q * log_softmax) with the soft targets built
  explicitly (value and gradient, float32 rounding)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(3, 5, 8)) * 3, jnp.float32)
  targets = jnp.asarray(rng.integers(0, vocab_size or 8, size=(3, 5)))
  weights = jnp.asarray(rng.integers(0, 2, size=(3, 5)), jnp.float32)
  V, vocab = 8, vocab_size or 8
  low = smoothing / (vocab - 1)
  real = (jnp.arange(V) < vocab).astype(jnp.float32)

  def reference(z):
    one_hot = jax.nn.one_hot(targets, V)
    q = one_hot * (1 - smoothing) + (1 - one_hot) * low * real
    norm = -((1 - smoothing) * jnp.log(1 - smoothing) + (vocab - 1) * low
             * jnp.log(low + 1e-20))
    return jnp.sum((optax.softmax_cross_entropy(z, q) - norm) * weights)

  ours = lambda z: losses.label_smoothed_cross_entropy(z, targets, weights, smoothing,
                                                       vocab_size)[0]
  np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-6, atol=1e-5)
  np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits),
                             rtol=1e-5, atol=1e-6)
