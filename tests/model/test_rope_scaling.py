"""Partial and scaled rotary positions against slow NumPy references.

``model.rope_fraction`` (GPT-NeoX's partial rotary) and ``model.rope_scaling``
(linear position interpolation, static NTK-aware base scaling, YaRN): each
resolved frequency table and attention factor is recomputed here with Python
loops from the papers' formulas, and YaRN also against transformers' own
``_compute_yarn_parameters`` where transformers is installed. Eager: these are
tiny computations.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.layers.positions import rope, rotary_spec, yarn_attention_factor
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import position_scheme
from references import jnp_rope, np_rope, rand, rope_theta


def _np_yarn(dims, base, factor, original):
  """YaRN frequencies with transformers' defaults, written out per pair."""
  def index(turns):  # the pair index at which L theta_i / (2 pi) = turns
    return dims * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
  low = max(math.floor(index(32)), 0)
  high = min(math.ceil(index(1)), dims - 1)
  if low == high:
    high += 0.001
  out = []
  for i, theta in enumerate(rope_theta(dims, base)):
    ramp = min(max((i - low) / (high - low), 0.0), 1.0)
    keep = 1.0 - ramp
    out.append(theta / factor * (1.0 - keep) + theta * keep)
  return out


# ------------------------------------------------------------ frequencies
@pytest.mark.parametrize("dims,base", [(8, 10000.0), (4, 500.0), (16, 10000.0)])
def test_unscaled_frequencies_are_over_the_rotated_width(dims, base):
  spec = rotary_spec(dims, base)
  assert spec.dims == dims and spec.attention_factor == 1.0
  np.testing.assert_allclose(spec.inv_freq, rope_theta(dims, base), rtol=1e-12)


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
def test_linear_divides_every_frequency(factor):
  spec = rotary_spec(16, 10000.0, "linear", factor)
  np.testing.assert_allclose(spec.inv_freq, [t / factor for t in rope_theta(16, 10000.0)],
                             rtol=1e-12)
  assert spec.attention_factor == 1.0


def test_linear_scaling_is_position_interpolation():
  """Chen et al. 2023: the scaled model at position t is the unscaled one at t / s."""
  x = rand(1, 1, 6, 2, 8)
  positions = np.asarray([[0, 1, 5, 9, 20, 63]])
  scaled = rope(jnp.asarray(x), jnp.asarray(positions), rotary_spec(8, scaling="linear",
                                                                   factor=4.0))
  interpolated = rope(jnp.asarray(x), jnp.asarray(positions / 4.0, np.float32),
                      rotary_spec(8))
  np.testing.assert_allclose(np.asarray(scaled), np.asarray(interpolated), atol=1e-6)


@pytest.mark.parametrize("dims,factor", [(8, 2.0), (16, 4.0), (64, 8.0)])
def test_ntk_raises_the_base(dims, factor):
  spec = rotary_spec(dims, 10000.0, "ntk", factor)
  want = rope_theta(dims, 10000.0 * factor ** (dims / (dims - 2)))
  np.testing.assert_allclose(spec.inv_freq, want, rtol=1e-12)
  assert spec.attention_factor == 1.0
  # The highest frequency is kept, the lowest interpolated by exactly s.
  theta = rope_theta(dims, 10000.0)
  assert spec.inv_freq[0] == pytest.approx(theta[0], rel=1e-12)
  assert spec.inv_freq[-1] == pytest.approx(theta[-1] / factor, rel=1e-12)


YARN_CASES = [  # (rotated width, base, factor, original context)
    (8, 10000.0, 4.0, 8),        # low == high: the ramp is a step
    (64, 10000.0, 4.0, 2048),    # LLaMA-like: a real ramp inside the head
    (128, 500000.0, 8.0, 8192),  # LLaMA 3-like
    (16, 10000.0, 2.0, 100000),  # every pair turns > 1 time: high clamped to r - 1
    (32, 10000.0, 1.0, 512),     # factor 1: the unscaled table
]


@pytest.mark.parametrize("dims,base,factor,original", YARN_CASES)
def test_yarn_frequencies_and_attention_factor(dims, base, factor, original):
  spec = rotary_spec(dims, base, "yarn", factor, original)
  np.testing.assert_allclose(spec.inv_freq, _np_yarn(dims, base, factor, original),
                             rtol=1e-12)
  want = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
  assert spec.attention_factor == pytest.approx(want, rel=1e-15)
  theta = rope_theta(dims, base)
  # Every frequency lies between its interpolated and its original value.
  for got, t in zip(spec.inv_freq, theta):
    assert t / factor * (1 - 1e-12) <= got <= t * (1 + 1e-12)


def test_yarn_attention_factor_values():
  assert yarn_attention_factor(1.0) == 1.0
  assert yarn_attention_factor(0.5) == 1.0
  assert yarn_attention_factor(math.e) == pytest.approx(1.1)
  assert yarn_attention_factor(16.0) == pytest.approx(1 + 0.1 * math.log(16.0))


@pytest.mark.parametrize("dims,base,factor,original", YARN_CASES[:4])
def test_yarn_matches_transformers(dims, base, factor, original):
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch")
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  heads = 2
  config = transformers.LlamaConfig(
      hidden_size=dims * heads, num_attention_heads=heads, head_dim=dims,
      num_hidden_layers=1, intermediate_size=8, vocab_size=8,
      max_position_embeddings=int(original * factor),
      rope_parameters={"rope_type": "yarn", "rope_theta": base, "factor": factor,
                       "original_max_position_embeddings": original})
  inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
  spec = rotary_spec(dims, base, "yarn", factor, original)
  # transformers computes in float32; we compute in float64 and round once.
  np.testing.assert_allclose(np.float32(spec.inv_freq), inv_freq.numpy(), rtol=3e-7)
  assert spec.attention_factor == attention_factor


# --------------------------------------------------------------- rotation
@pytest.mark.parametrize("head_dim,fraction", [(8, 0.5), (16, 0.25), (8, 1.0), (12, 0.5)])
def test_partial_rotation_matches_numpy(head_dim, fraction):
  """GPT-NeoX's rotary_pct: the first int(head_dim * fraction) dimensions rotate
  with frequencies over that width, the rest pass through bit for bit."""
  cfg = model_config_from_dict(dict(position="rope", d_model=4 * head_dim, num_heads=4,
                                    rope_fraction=fraction))
  spec = position_scheme(cfg).rotary
  dims = int(head_dim * fraction)
  assert spec.dims == cfg.rope_dims == dims
  x = rand(2, 2, 5, 3, head_dim)
  positions = np.asarray([[0, 1, 2, 3, 4], [7, 3, 0, 11, 30]])
  got = np.asarray(rope(jnp.asarray(x), jnp.asarray(positions), spec))
  np.testing.assert_allclose(got, np_rope(x, positions, rope_theta(dims, 10000.0)),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[..., dims:], x[..., dims:])


@pytest.mark.parametrize("scaling,factor,original", [
    ("linear", 4.0, 0), ("ntk", 4.0, 0), ("yarn", 4.0, 16)])
def test_scaled_partial_rotation_matches_numpy(scaling, factor, original):
  """The scaled frequencies over the rotated width; YaRN's factor multiplies the
  rotated dimensions (cos and sin), never the ones passed through."""
  spec = rotary_spec(8, 10000.0, scaling, factor, original)
  x = rand(3, 2, 4, 2, 12)
  positions = np.asarray([[0, 5, 17, 40], [3, 2, 1, 0]])
  got = np.asarray(rope(jnp.asarray(x), jnp.asarray(positions), spec))
  want = np_rope(x, positions, spec.inv_freq, scale=spec.attention_factor)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(got[..., 8:], x[..., 8:])
  if scaling == "yarn":
    norms = np.linalg.norm(got[..., :8], axis=-1) / np.linalg.norm(x[..., :8], axis=-1)
    np.testing.assert_allclose(norms, 0.1 * math.log(4.0) + 1.0, rtol=1e-5)


@pytest.mark.parametrize("dims", [8, 4])
def test_scaled_partial_gradient_is_the_transposed_rotation(dims):
  """rope's own backward against autodiff of the plain formula, with a partial
  width and YaRN's attention factor."""
  spec = rotary_spec(dims, 10000.0, "yarn", 4.0, 16)
  r = np.random.default_rng(6)
  x = jnp.asarray(r.normal(size=(2, 7, 3, 8)), jnp.float32)
  positions = jnp.asarray(r.integers(0, 50, size=(2, 7)))
  w = jnp.asarray(r.normal(size=x.shape), jnp.float32)

  def plain(x):
    return jnp_rope(x, positions, spec.inv_freq, scale=spec.attention_factor)

  got = jax.grad(lambda x: jnp.sum(jnp.sin(rope(x, positions, spec)) * w))(x)
  want = jax.grad(lambda x: jnp.sum(jnp.sin(plain(x)) * w))(x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_scaled_scores_depend_only_on_offset():
  """Every scaling keeps RoPE relative: q.k depends on i - j only."""
  for spec in (rotary_spec(8, scaling="ntk", factor=4.0),
               rotary_spec(4, scaling="yarn", factor=4.0, original_max_len=8)):
    q, k = rand(8, 1, 1, 1, 8), rand(9, 1, 1, 1, 8)

    def score(i, j, spec=spec, q=q, k=k):
      qi = rope(jnp.asarray(q), jnp.asarray([[i]]), spec)
      kj = rope(jnp.asarray(k), jnp.asarray([[j]]), spec)
      return float(jnp.sum(qi * kj))

    for i, j in [(5, 2), (17, 0)]:
      assert score(i + 7, j + 7) == pytest.approx(score(i, j), rel=1e-4, abs=1e-4)


# ------------------------------------------------------------ validation
def _error(**overrides) -> str:
  with pytest.raises(ConfigError) as info:
    model_config_from_dict(dict(d_model=32, num_heads=4, **overrides))
  return str(info.value)


@pytest.mark.parametrize("overrides,needles", [
    (dict(position="learned", rope_fraction=0.5),
     ["model.rope_fraction=0.5", "needs model.position='rope'", "'learned'"]),
    (dict(position="alibi", rope_scaling="yarn"),
     ["model.rope_scaling='yarn'", "needs model.position='rope'"]),
    (dict(position="sinusoidal", rope_scaling_factor=2.0),
     ["model.rope_scaling_factor=2.0", "needs model.position='rope'"]),
    (dict(position="none", rope_original_max_len=64),
     ["model.rope_original_max_len=64", "needs model.position='rope'"]),
    (dict(position="rope", rope_fraction=0.0), ["model.rope_fraction", "(0, 1]"]),
    (dict(position="rope", rope_fraction=1.5), ["model.rope_fraction", "(0, 1]"]),
    # head_dim 8: 8 x 0.3 = 2.4 -> 2 is fine, 8 x 0.4 -> 3 is odd, 8 x 0.1 -> 0
    (dict(position="rope", rope_fraction=0.4), ["model.rope_fraction=0.4", "= 3", "even"]),
    (dict(position="rope", rope_fraction=0.1), ["model.rope_fraction=0.1", "= 0"]),
    (dict(position="rope", rope_scaling="dynamic"),
     ["model.rope_scaling='dynamic'", "none, linear, ntk, yarn"]),
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=0.5),
     ["model.rope_scaling_factor", ">= 1", "0.5"]),
    (dict(position="rope", rope_scaling_factor=2.0),
     ["model.rope_scaling_factor=2.0", "rope_scaling='none'"]),
    (dict(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0),
     ["model.rope_scaling='yarn'", "model.rope_original_max_len"]),
    (dict(position="rope", rope_scaling="linear", rope_scaling_factor=4.0,
          rope_original_max_len=16), ["model.rope_original_max_len=16", "'yarn' only"]),
    (dict(position="rope", rope_scaling="yarn", rope_scaling_factor=4.0,
          rope_original_max_len=-1), ["model.rope_original_max_len", "got -1"]),
    (dict(position="rope", rope_fraction=0.25, rope_scaling="ntk", rope_scaling_factor=2.0),
     ["model.rope_scaling='ntk'", "r > 2", "rotates 2"]),
], ids=lambda v: repr(v) if isinstance(v, dict) else None)
def test_invalid_rope_settings(overrides, needles):
  msg = _error(**overrides)
  for needle in needles:
    assert needle in msg, msg
  assert "\n" not in msg


def test_valid_rope_settings_resolve_to_one_spec():
  cfg = model_config_from_dict(dict(
      d_model=32, num_heads=4, position="rope", rope_fraction=0.5, rope_scaling="yarn",
      rope_scaling_factor=4.0, rope_original_max_len=16))
  assert position_scheme(cfg).rotary == rotary_spec(4, 10000.0, "yarn", 4.0, 16)
  assert position_scheme(model_config_from_dict(dict(position="learned"))).rotary is None
