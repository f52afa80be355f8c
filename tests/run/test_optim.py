"""Schedules, optimizers and loss against hand-written formulas; the traced
hyperparameters (one program for a grid, the same bits as constants); Muon's
parameter groups for every family."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from tfx_jax.run import optim
from tfx_jax.tasks import losses


def _cfg(**overrides):
  cfg = ml_collections.ConfigDict(dict(
      optimizer="adamw", learning_rate=1e-3, schedule="constant",
      warmup_steps=0, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0,
      grad_clip_norm=0.0, decay_steps=1000, min_lr_ratio=0.1,
      scale_by_d_model=False, accumulate_steps=1))
  cfg.update(overrides)
  return cfg


def _resolved(cfg, d_model, num_train_steps):
  resolved, _ = optim.resolve(cfg, num_train_steps=num_train_steps)
  return resolved, optim.hyperparameters(resolved, d_model=d_model)


def _schedule(cfg, d_model=512, num_train_steps=1000):
  return optim.make_schedule(*_resolved(cfg, d_model, num_train_steps))


def _optimizer(cfg, d_model=512, num_train_steps=1000):
  return optim.build(*_resolved(cfg, d_model, num_train_steps)).tx


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
  with pytest.raises(optim.ConfigError, match="adafactor") as e:
    _optimizer(_cfg(optimizer="sgd"))
  assert f"choose one of: {', '.join(optim.OptimConfig.registry)}." in str(e.value)


def test_every_registered_optimizer_is_a_choice_with_its_own_fields_on_the_command_line():
  """The flat section (the ConfigDict, ``--config.optim.<field>``) holds the
  shared fields and each optimizer's own, at the class's defaults; resolving
  gives the chosen optimizer's class with exactly its fields."""
  shared = {f.name for f in dataclasses.fields(optim.OptimConfig)}
  flat = {f.name: f.default for f in dataclasses.fields(optim.OptimSection)}
  assert optim.OPTIMIZERS == tuple(optim.OptimConfig.registry)
  owned = [f for cls in optim.OptimConfig.registry.values() for f in cls.own_fields()]
  assert len(owned) == len(set(owned))  # each flag has one owner
  assert set(flat) == {"optimizer", *shared, *owned}
  for name, cls in optim.OptimConfig.registry.items():
    resolved, _ = optim.resolve({"optimizer": name}, num_train_steps=100)
    assert type(resolved) is cls and resolved.optimizer == name
    assert {f.name for f in dataclasses.fields(resolved)} == shared | set(cls.own_fields())
    assert all(getattr(resolved, f) == flat[f] for f in cls.own_fields())
    # Its own float fields are tuned values, traced in the step.
    hp = optim.hyperparameters(resolved, d_model=8)
    assert set(hp.own) == set(cls.traced_fields()) <= set(cls.own_fields())


def test_an_optimizer_cannot_take_a_field_another_one_owns():
  @dataclasses.dataclass(frozen=True)
  class Clash(optim.OptimConfig):
    lion_b1: float = 0.5

  with pytest.raises(TypeError, match="lion_b1"):
    optim.OptimConfig.register_subclass("clash")(Clash)
  assert "clash" not in optim.OptimConfig.registry


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


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
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
  from tfx_jax.run import config_base
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


# ------------------------------------------------------------------ wsd
@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_warms_up_holds_then_decays_over_the_last_fraction(shape):
  """Hägele et al. 2024: warmup, the peak until the last decay_fraction of the
  steps, then linear or 1-sqrt down to min_lr_ratio x peak."""
  schedule = _schedule(_cfg(schedule="wsd", learning_rate=1e-3, warmup_steps=10,
                            decay_steps=100, decay_fraction=0.2, decay_shape=shape,
                            min_lr_ratio=0.1))
  s = (lambda p: p) if shape == "linear" else math.sqrt
  expected = {0: 1e-4, 9: 1e-3, 50: 1e-3, 79: 1e-3}  # step = count + 1
  for step in (85, 90, 95, 100):
    expected[step - 1] = 1e-3 * (0.1 + 0.9 * (1 - s((step - 80) / 20)))
  for count, want in expected.items():
    np.testing.assert_allclose(_lr(schedule, count), want, rtol=1e-5)
  assert _lr(schedule, 10_000) == pytest.approx(1e-4, rel=1e-5)


def test_wsd_warmup_must_end_before_the_decay_starts():
  with pytest.raises(optim.ConfigError, match="optim.warmup_steps"):
    _schedule(_cfg(schedule="wsd", warmup_steps=90, decay_steps=100, decay_fraction=0.2))
  with pytest.raises(optim.ConfigError, match="optim.decay_fraction"):
    _schedule(_cfg(schedule="wsd", decay_fraction=0.0))


@pytest.mark.parametrize("overrides,field", [
    ({"optimizer": "adamw", "lion_b1": 0.95}, "optim.lion_b1"),
    ({"optimizer": "lion", "b2": 0.95}, "optim.b2"),
    ({"optimizer": "adamw", "adam_learning_rate_ratio": 0.5}, "optim.adam_learning_rate_ratio"),
    ({"optimizer": "adam", "muon_momentum": 0.9}, "optim.muon_momentum"),
    ({"schedule": "cosine", "decay_fraction": 0.5}, "optim.decay_fraction"),
    ({"schedule": "linear", "decay_shape": "linear"}, "optim.decay_shape")])
def test_a_field_of_another_optimizer_or_schedule_is_an_inactive_setting(overrides, field):
  with pytest.raises(optim.InactiveSetting, match=field) as e:
    _optimizer(_cfg(**overrides))
  assert e.value.field == field


def test_decay_shape_lists_its_choices():
  with pytest.raises(optim.ConfigError, match="1-sqrt"):
    _optimizer(_cfg(schedule="wsd", decay_shape="cosine"))


# ---------------------------------------------------- first steps vs NumPy
def _steps(cfg, params, grads, n=2):
  opt = _optimizer(cfg)
  state = opt.init(params)
  out = []
  for g in grads[:n]:
    updates, state = jax.jit(opt.update)(g, state, params)
    params = optax.apply_updates(params, updates)
    out.append(jax.tree.map(np.asarray, params))
  return out


def _random_tree(rng, shapes):
  return {k: {"kernel" if len(s) > 1 else "scale": jnp.asarray(rng.normal(size=s), jnp.float32)}
          for k, s in shapes.items()}


def test_adamw_and_clipping_first_steps_match_numpy():
  rng = np.random.default_rng(0)
  params = _random_tree(rng, {"wi": (4, 3), "norm": (3,)})
  grads = [_random_tree(rng, {"wi": (4, 3), "norm": (3,)}) for _ in range(2)]
  lr, b1, b2, eps, wd, clip = 1e-2, 0.9, 0.98, 1e-9, 0.1, 1.0
  got = _steps(_cfg(learning_rate=lr, weight_decay=wd, grad_clip_norm=clip), params, grads)
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  m = jax.tree.map(np.zeros_like, p)
  v = jax.tree.map(np.zeros_like, p)
  for t, g in enumerate(grads, start=1):
    g = jax.tree.map(lambda x: np.asarray(x, np.float64), g)
    norm = np.sqrt(sum(np.sum(x**2) for x in jax.tree.leaves(g)))
    g = jax.tree.map(lambda x: x * min(1.0, clip / norm), g)
    m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
    v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_**2, v, g)
    for k in p:
      for name in p[k]:
        step = (m[k][name] / (1 - b1**t)) / (np.sqrt(v[k][name] / (1 - b2**t)) + eps)
        decay = wd * p[k][name] if name == "kernel" else 0.0  # norms: no decay
        p[k][name] = p[k][name] - lr * (step + decay)
    for k in p:
      for name in p[k]:
        np.testing.assert_allclose(got[t - 1][k][name], p[k][name], rtol=1e-5, atol=1e-7)


def test_lion_first_steps_match_numpy():
  """Chen et al. 2023, Algorithm 2: u = sign(b1 m + (1 - b1) g); m <- b2 m + (1 - b2) g;
  p <- p - lr (u + wd p), the decay masked as AdamW's."""
  rng = np.random.default_rng(1)
  params = _random_tree(rng, {"wi": (4, 3), "norm": (3,)})
  grads = [_random_tree(rng, {"wi": (4, 3), "norm": (3,)}) for _ in range(2)]
  lr, b1, b2, wd = 1e-2, 0.8, 0.95, 0.5
  got = _steps(_cfg(optimizer="lion", learning_rate=lr, weight_decay=wd, lion_b1=b1,
                    lion_b2=b2), params, grads)
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  m = jax.tree.map(np.zeros_like, p)
  for t, g in enumerate(grads):
    for k in p:
      for name in p[k]:
        g_ = np.asarray(g[k][name], np.float64)
        u = np.sign(b1 * m[k][name] + (1 - b1) * g_)
        m[k][name] = b2 * m[k][name] + (1 - b2) * g_
        decay = wd * p[k][name] if name == "kernel" else 0.0
        p[k][name] = p[k][name] - lr * (u + decay)
        np.testing.assert_allclose(got[t][k][name], p[k][name], rtol=1e-5, atol=1e-7)


# Jordan's quintic coefficients (optax.contrib's default).
NS = (3.4445, -4.7750, 2.0315)


def _newton_schulz(g, steps=5):
  """The reference iteration in float64: X <- a X + (b A + c A^2) X, A = X X^T,
  from X = G / ||G||_F, on the wide orientation."""
  x = np.asarray(g, np.float64)
  tall = x.shape[0] > x.shape[1]
  x = x.T if tall else x
  x = x / (np.linalg.norm(x) + 1e-8)
  a, b, c = NS
  for _ in range(steps):
    A = x @ x.T
    x = a * x + (b * A + c * A @ A) @ x
  return x.T if tall else x


def test_newton_schulz_reference_orthogonalises():
  g = np.random.default_rng(2).normal(size=(48, 16))
  singular = np.linalg.svd(_newton_schulz(g), compute_uv=False)
  # Not exactly 1: the coefficients trade accuracy for speed (Jordan: roughly
  # uniform in [0.5, 1.5]); far from G's own spread.
  assert singular.min() > 0.6 and singular.max() < 1.3
  assert np.ptp(np.linalg.svd(g, compute_uv=False)) > 3 * np.ptp(singular)


def test_muon_first_step_is_the_scaled_orthogonalised_gradient():
  """Every Muon leaf moves by -lr (0.2 sqrt(max(fan_in, fan_out)) NS(G) + wd W)
  (Moonlight's update RMS), per layer of a scanned stack and over (heads, kv)
  of attention kernels; the embedding moves as AdamW at ratio x lr."""
  rng = np.random.default_rng(3)
  shapes = {"wi": (8, 24), "query": (8, 2, 4), "out": (2, 4, 8)}
  params = {"decoder": {"layers": {k: {"kernel": jnp.asarray(rng.normal(size=(2, *s)),
                                                              jnp.float32)}
                                   for k, s in shapes.items()}},
            "embedding": {"embedding": jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)}}
  grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
  lr, wd, ratio = 1e-2, 0.1, 0.5
  [got] = _steps(_cfg(optimizer="muon", learning_rate=lr, weight_decay=wd,
                      adam_learning_rate_ratio=ratio), params, [grads], n=1)
  for name, shape in shapes.items():
    w = np.asarray(params["decoder"]["layers"][name]["kernel"], np.float64)
    g = np.asarray(grads["decoder"]["layers"][name]["kernel"], np.float64)
    fan_in = shape[0] * (shape[1] if name == "out" else 1)
    for layer in range(2):
      # Nesterov at the first step: the momentum's direction is the gradient's,
      # and the Frobenius normalisation removes its scale.
      o = _newton_schulz(g[layer].reshape(fan_in, -1)).reshape(shape)
      want = w[layer] - lr * (0.2 * math.sqrt(max(fan_in, w[layer].size // fan_in)) * o
                              + wd * w[layer])
      np.testing.assert_allclose(got["decoder"]["layers"][name]["kernel"][layer], want,
                                 rtol=1e-5, atol=1e-6, err_msg=name)
  # AdamW's first step is lr * sign(g) (bias-corrected), plus the decay.
  e = np.asarray(params["embedding"]["embedding"], np.float64)
  want = e - ratio * lr * (np.sign(np.asarray(grads["embedding"]["embedding"])) + wd * e)
  np.testing.assert_allclose(got["embedding"]["embedding"], want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------- muon's groups, by family
# The input (reduction) axes of each kernel by its logical names, read off the
# layers: projections from the residual stream read `embed`, the FFN's output
# reads `mlp`, the attention's output reads (heads, kv).
READS = {"query": ("embed",), "key": ("embed",), "value": ("embed",), "gate": ("embed",),
         "wi": ("embed",), "wv": ("embed",), "mlm_dense": ("embed",), "pooler": ("embed",),
         "wo": ("mlp",), "out": ("heads", "kv"), "router": ("embed",),
         # MLA: the query's and the keys' and values' up-projections read their latents.
         "q_proj": ("embed",), "q_a_proj": ("embed",), "q_b_proj": ("latent",),
         "kv_a_proj_with_mqa": ("embed",), "kv_b_proj": ("latent",),
         # Gated DeltaNet's per-head gate projections.
         "decay": ("embed",), "beta": ("embed",)}
HEAD_AXES = ("vocab", "classes")
# Model variants of a spec ("lm.py:tiny+mla"), and leaves each must send to
# each group (path endings), so that the variant is known to be there.
VARIANTS = {
    "moe": ({"ffn_type": "moe", "num_experts": 4, "experts_per_token": 2}, {}),
    "mla": ({"attention_type": "mla"},
            {"muon": ["self_attention/q_proj/kernel", "self_attention/kv_b_proj/kernel"],
             "adam": ["self_attention/kv_a_layernorm/scale"]}),
    "mla_q": ({"attention_type": "mla", "mla_q_rank": 8},
              {"muon": ["self_attention/q_a_proj/kernel", "self_attention/q_b_proj/kernel"],
               "adam": ["self_attention/q_a_layernorm/scale"]}),
    # Gated DeltaNet: projections to Muon; the short convolutions, A_log, the
    # dt bias and the output norm's gain to Adam.
    "da": ({"mixer_pattern": "DA", "num_layers": 2},
           {"muon": ["deltanet/query/kernel", "deltanet/decay/kernel", "deltanet/beta/kernel",
                     "deltanet/gate/kernel", "deltanet/out/kernel"],
            "adam": ["deltanet/query_conv", "deltanet/key_conv", "deltanet/value_conv",
                     "deltanet/A_log", "deltanet/dt_bias", "deltanet/out_norm"]}),
}


@pytest.mark.parametrize("spec", ["lm.py:tiny", "mlm.py:tiny", "translate.py:tiny",
                                  "finetune.py:tiny", "finetune.py:mlm_tiny", "lm.py:tiny+moe",
                                  "lm.py:tiny+mla", "lm.py:tiny+mla_q", "lm.py:tiny+da"])
@pytest.mark.parametrize("scan", [False, True])
def test_every_parameter_of_every_family_gets_its_group(spec, scan):
  """Muon: every hidden kernel, its reduction axes those the layer reads and
  the layer axis of a scanned stack and the expert axis of a mixture of
  experts batch axes; Adam: embeddings, heads, norms, biases, and MLA's and
  Gated DeltaNet's vectors and short convolutions. Checked against the
  parameters' logical axis names."""
  import flax.linen as nn
  from flax import traverse_util
  from tfx_jax.run import muon
  from tfx_jax.run import config as run_config
  from tfx_jax.model.families import build_model, dummy_inputs
  from helpers import load_config
  spec, _, variant = spec.partition("+")
  config = load_config(spec)
  config.model.scan_layers = scan
  model, pinned = VARIANTS[variant] if variant else ({}, {})
  config.model.update(model)
  model_cfg = run_config.resolve(config).model
  boxed = jax.eval_shape(lambda k: build_model(model_cfg).init(
      {"params": k}, **dummy_inputs(model_cfg)), jax.random.PRNGKey(0))["params"]
  groups = muon.assignment(boxed)
  flat = traverse_util.flatten_dict(boxed, sep="/",
                                    is_leaf=lambda _, v: isinstance(v, nn.LogicallyPartitioned))
  assert set(groups["muon"]["parameters"]) | set(groups["adam"]["parameters"]) == set(flat)
  assert groups["muon"]["count"] > 0 and groups["adam"]["count"] > 0
  for path, box in flat.items():
    names = box.names if isinstance(box, nn.LogicallyPartitioned) else ()
    module, leaf = (["", *path.split("/")])[-2:]
    if leaf != "kernel" or any(a in names for a in HEAD_AXES):
      assert path in groups["adam"]["parameters"], path
      continue
    entry = groups["muon"]["parameters"][path]
    reduction = tuple(names[a] for a in entry["reduction_axes"])
    output = tuple(names[a] for a in entry["output_axes"])
    assert reduction == READS[module], path
    # Every axis is read or written, but a scanned stack's layer axis and the
    # expert axis.
    assert sorted(reduction + output, key=str) == sorted(
        (n for n in names if n not in ("layers", "expert")), key=str), path
    assert ("layers" in names) == (scan and "/layers/" in path), path
  if scan:
    assert any("/layers/" in p for p in groups["muon"]["parameters"])
  for group, endings in pinned.items():
    for ending in endings:
      assert any(p.endswith("/" + ending) for p in groups[group]["parameters"]), (group, ending)


# ------------------------------------------- traced values: one program, same bits
def _sharded(overrides):
  from tfx_jax.run import config as run_config
  from tfx_jax.run import setup as run_setup
  from helpers import tiny_config
  resolved = run_config.resolve(tiny_config("lm.py:tiny", overrides))
  return run_setup.ShardedRun(resolved, resolved.model)


def _batches(n, seed=0):
  rng = np.random.default_rng(seed)
  for _ in range(n):
    ids = rng.integers(5, 200, size=(4, 33)).astype(np.int32)
    yield {"inputs": ids[:, :-1], "targets": ids[:, 1:],
           "segment_ids": np.ones((4, 32), np.int32),
           "positions": np.tile(np.arange(32, dtype=np.int32), (4, 1)),
           "weights": np.ones((4, 32), np.float32)}


def _lowered_text(overrides) -> str:
  from tfx_jax.run import sharding
  run = _sharded(overrides)
  batch = sharding.global_batch(next(_batches(1)), run.mesh)
  return run.train_step().lower(run.abstract_state, batch, run.step_hparams()).as_text()


TUNED = {"optim.learning_rate": 2e-3, "optim.weight_decay": 0.05, "optim.warmup_steps": 3,
         "optim.b1": 0.8, "optim.b2": 0.95, "optim.eps": 1e-8, "train.num_steps": 40,
         "optim.min_lr_ratio": 0.2, "optim.grad_clip_norm": 0.5}


def test_runs_differing_only_in_tuned_values_lower_to_one_program():
  """The whole grid shares one compiled step (and one persistent-cache entry)."""
  base = {"optim.weight_decay": 0.1}
  text = _lowered_text(base)
  assert _lowered_text({**base, **TUNED}) == text
  # The constant form compiles the values in: another program per value.
  constant = {**base, "optim.trace_hyperparameters": False}
  assert _lowered_text(constant) != _lowered_text({**constant, **TUNED})


@pytest.mark.parametrize("name", [name for name, cls in optim.OptimConfig.registry.items()
                                  if cls.traced_fields()])
def test_an_optimizers_own_tuned_values_are_arguments_of_the_program(name):
  """Its own float fields (muon_momentum, lion_b1, ...) are traced as the
  shared ones are: one program whatever their values."""
  cls = optim.OptimConfig.registry[name]
  base = {"optim.optimizer": name}
  halved = {f"optim.{f}": 0.5 * getattr(cls, f) for f in cls.traced_fields()}
  assert _lowered_text({**base, **halved}) == _lowered_text(base)


@pytest.mark.parametrize("overrides", [
    {"optim.weight_decay": 0.1},
    {"optim.optimizer": "muon", "optim.schedule": "wsd", "optim.decay_fraction": 0.5,
     "optim.accumulate_steps": 2, "model.scan_layers": True, "optim.weight_decay": 0.1}])
@pytest.mark.slow
def test_traced_and_constant_forms_give_the_same_bits(overrides):
  from tfx_jax.run import sharding
  got = []
  for trace in (True, False):
    run = _sharded({**overrides, "optim.trace_hyperparameters": trace})
    state, step, hparams = run.init_state(), run.train_step(), run.step_hparams()
    metrics = []
    for batch in _batches(5):
      state, m = step(state, sharding.global_batch(batch, run.mesh), hparams)
      metrics.append({k: np.asarray(v) for k, v in m.items()})
    got.append((metrics, jax.tree.map(np.asarray, state.params)))
  (traced, params_t), (constant, params_c) = got
  for a, b in zip(traced, constant):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  jax.tree.map(np.testing.assert_array_equal, params_t, params_c)
  # The logged rate is the one the step used: the warmup's, then the schedule's.
  assert traced[0]["learning_rate"] == np.float32(3e-3) * np.float32(1 / 5)


def test_summary_prints_the_optimizer_state_size():
  from tfx_jax.run import footprint
  from tfx_jax.run import config as run_config
  from helpers import tiny_config
  sizes = {}
  for name in ("adamw", "lion", "muon"):
    run = run_config.resolve(tiny_config("lm.py:tiny", {"optim.optimizer": name}))
    line = footprint.optimizer_state(run, run.model)
    sizes[name] = int(line.split(": ")[1].split(" values")[0].replace(",", ""))
  from flax import traverse_util
  shapes = traverse_util.unflatten_dict(footprint.param_shapes(run.model), sep="/")
  n = footprint.count_params(run.model)
  n_muon = run.optim.parameter_groups(shapes)["muon"]["params"]
  assert 0 < n_muon < n
  adamw, _ = optim.resolve({"optimizer": "adamw"}, num_train_steps=10)
  assert adamw.parameter_groups(shapes) is None
  # Two moments (AdamW) or one (Lion) per parameter, plus the step counters;
  # Muon: one moment of its matrices, two of the rest, its NS coefficients.
  assert sizes["adamw"] == 2 * n + 2
  assert sizes["lion"] == n + 2
  assert sizes["muon"] == n_muon + 2 * (n - n_muon) + 3 + 4
