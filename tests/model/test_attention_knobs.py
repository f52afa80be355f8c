"""The stability and attention knobs against NumPy: query-key norm, logit
soft-caps, gated attention, sliding windows (and which layers attend fully),
DyT, the parallel block, the largest-logit diagnostic; their errors and their
parameter counts.

Models are tiny and run eagerly, as in test_models.py.
"""

from __future__ import annotations

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.blocks import TransformerLayer
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model.layers.attention import Attention, AttentionSpec
from tfx_jax.model.layers.ffn import FeedForward
from tfx_jax.model.layers.norms import DyT, RMSNorm, norm_factory
from tfx_jax.model.layers.positions import rotary_spec
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, layer_spec
from references import np_attention_layer, np_dense, rand, rope_theta

B, L, D, H, N, K = 2, 6, 16, 4, 2, 4


def _perturbed(params, seed=0):
  """Every parameter moved off its initial value (norm gains, biases, alpha)."""
  leaves, tree = jax.tree.flatten(jax.tree.map(np.asarray, nn.unbox(params)))
  return jax.tree.unflatten(tree, [x + rand(seed + i, *x.shape, scale=0.3)
                                   for i, x in enumerate(leaves)])


CAUSAL = np.tril(np.ones((L, L), bool))[None].repeat(B, 0)


def _attention_case(seed, **kwargs):
  x = rand(seed, B, L, D)
  attn = Attention(AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K, **kwargs))
  kw = dict(mask=jnp.asarray(CAUSAL[:, None]),
            positions_BL=jnp.broadcast_to(jnp.arange(L), (B, L)))
  p = _perturbed(attn.init(jax.random.PRNGKey(seed), jnp.asarray(x), **kw)["params"], seed)
  got = attn.apply({"params": p}, jnp.asarray(x), **kw)
  return x, p, np.asarray(got)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_qk_norm_normalises_each_head_before_rope(kind):
  x, p, got = _attention_case(
      1, qk_norm=norm_factory(kind, 1e-6, jnp.float32, axis="kv"), rotary=rotary_spec(K))
  assert p["query_norm"]["scale"].shape == (K,)  # one gain per head dim, shared by heads
  want = np_attention_layer(x, p, CAUSAL[:, None], qk_norm=kind, inv_freq=rope_theta(K))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_logit_softcap():
  x, p, got = _attention_case(2, logit_softcap=0.5)
  np.testing.assert_allclose(got, np_attention_layer(x, p, CAUSAL[:, None], softcap=0.5),
                             rtol=1e-5, atol=1e-5)
  # The cap binds: without it the output differs.
  assert np.abs(got - np_attention_layer(x, p, CAUSAL[:, None])).max() > 1e-3


@pytest.mark.parametrize("width", [1, K], ids=["headwise", "elementwise"])
def test_attention_gate(width):
  x, p, got = _attention_case(3, gate_width=width)
  assert p["gate"]["kernel"].shape == (D, H, width)
  np.testing.assert_allclose(got, np_attention_layer(x, p, CAUSAL[:, None], gate=True),
                             rtol=1e-5, atol=1e-5)


def test_max_attention_logit_is_the_largest_allowed_logit():
  x = rand(4, B, L, D)
  attn = Attention(AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K))
  mask = jnp.asarray(CAUSAL[:, None])
  p = _perturbed(attn.init(jax.random.PRNGKey(4), jnp.asarray(x), mask=mask)["params"])
  _, sown = attn.apply({"params": p}, jnp.asarray(x), mask=mask, mutable=["intermediates"])
  got = float(sown["intermediates"]["max_attention_logit"][0])
  q, k = np_dense(x, p["query"]), np.repeat(np_dense(x, p["key"]), H // N, axis=2)
  logits = np.einsum("blhk,bshk->bhls", q, k) / math.sqrt(K)
  want = np.where(CAUSAL[:, None], logits, -np.inf).max()
  assert logits.max() > want  # a masked (future) key holds a larger one
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_dyt_against_numpy():
  x = rand(5, B, L, D, scale=3.0)
  p = _perturbed(DyT().init(jax.random.PRNGKey(0), jnp.asarray(x))["params"])
  assert p["alpha"].shape == ()
  got = DyT().apply({"params": p}, jnp.asarray(x))
  want = np.tanh(p["alpha"] * x.astype(np.float64)) * p["scale"] + p["bias"]
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
  init = nn.unbox(DyT().init(jax.random.PRNGKey(0), jnp.asarray(x))["params"])
  assert float(init["alpha"]) == 0.5  # the paper's alpha_0


# --------------------------------------------------------- the parallel block
@pytest.mark.parametrize("norm_position", ["pre", "sandwich"])
def test_parallel_block_formula(norm_position):
  """x + Attn(N1(x)) + FFN(N2(x)), composed by hand from the sublayers."""
  cfg = model_config_from_dict(dict(
      family="decoder_only", norm_position=norm_position, block="parallel",
      norm_type="rmsnorm", num_layers=2, d_model=D, num_heads=H, num_kv_heads=N,
      d_ff=24, activation="gelu", position="none"))
  spec = layer_spec(cfg, "decoder", cross_attention=False)
  x = jnp.asarray(rand(6, B, L, D, scale=2.0))
  mask = jnp.asarray(CAUSAL[:, None])
  args = (mask, None, jnp.broadcast_to(jnp.arange(L), (B, L)), None, None, None)
  layer = TransformerLayer(spec)
  p = _perturbed(layer.init(jax.random.PRNGKey(6), x, *args)["params"])
  got, _ = layer.apply({"params": p}, x, *args)
  norm = lambda name, y: RMSNorm(eps=cfg.norm_eps).apply({"params": p[name]}, y)
  attn = lambda y: Attention(AttentionSpec(num_heads=H, num_kv_heads=N, head_dim=K)).apply(
      {"params": p["self_attention"]}, y, mask=mask)
  ffn = lambda y: FeedForward(d_ff=24, act=lambda v: jax.nn.gelu(v, approximate=False),
                              gated=False).apply({"params": p["ffn"]}, y)
  want = x
  for name, f in (("self_attention", attn), ("ffn", ffn)):
    branch = f(norm(f"{name}_norm", x))  # every branch reads the layer input
    if norm_position == "sandwich":
      branch = norm(f"{name}_post_norm", branch)
    want = want + branch
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ sliding windows
@pytest.mark.parametrize("family", ["decoder_only", "encoder_only"])
@pytest.mark.parametrize("window,global_every", [(2, 0), (3, 2), (2, 3)])
@pytest.mark.slow
def test_window_reaches_only_keys_within_it(family, window, global_every):
  """Changing the token at position 0 changes a windowed layer's outputs only
  at the positions whose window holds position 0 (q < window; for encoders
  also through later layers' windows), and a fully attending layer's
  everywhere; with one layer of each kind the receptive fields add up."""
  layers = 3
  cfg = model_config_from_dict(dict(
      family=family, num_layers=layers, d_model=D, num_heads=H, vocab_size=23,
      max_len=16, position="rope", attention_window=window, global_every=global_every))
  spec = layer_spec(cfg, "decoder" if family == "decoder_only" else "encoder",
                    cross_attention=False)
  kinds = [spec.windowed(i) for i in range(layers)]
  assert kinds == [not (global_every and (i + 1) % global_every == 0) for i in range(layers)]
  ids = np.random.default_rng(0).integers(5, 23, (1, 10)).astype(np.int32)
  changed = ids.copy()
  changed[0, 0] = 5 if ids[0, 0] != 5 else 6
  model = build_model(cfg)
  params = model.init(jax.random.PRNGKey(0), jnp.asarray(ids))["params"]
  a = np.asarray(model.apply({"params": params}, jnp.asarray(ids))["logits"])
  b = np.asarray(model.apply({"params": params}, jnp.asarray(changed))["logits"])
  reach = 0  # the furthest position position 0 reaches, layer by layer
  for windowed in kinds:
    reach = reach + window - 1 if windowed else ids.shape[1] - 1
  reach = min(reach, ids.shape[1] - 1)
  differs = np.abs(a - b).max(-1)[0] > 1e-6
  np.testing.assert_array_equal(differs, np.arange(ids.shape[1]) <= reach)


# -------------------------------------------------------- errors and sizes
@pytest.mark.parametrize("fields,named", [
    (dict(block="parallel", norm_position="post"), "model.block='parallel'"),
    (dict(block="parallel", norm_position="deepnorm"), "model.norm_position must be one of pre, sandwich"),
    (dict(global_every=2), "model.global_every=2"),
    (dict(attention_window=-1), "model.attention_window must be >= 0"),
    (dict(attention_logit_softcap=-1.0), "model.attention_logit_softcap must be >= 0"),
    (dict(final_logit_softcap=-0.5), "model.final_logit_softcap must be >= 0"),
    (dict(qk_norm="dyt"), "model.qk_norm='dyt' is not a valid choice; choose one of: none, layernorm, rmsnorm"),
    (dict(attention_gate="scalar"), "choose one of: none, headwise, elementwise"),
    (dict(block="serial"), "choose one of: sequential, parallel"),
])
def test_invalid_settings_name_the_field(fields, named):
  with pytest.raises(ConfigError, match=re.escape(named)):
    model_config_from_dict(dict(family="decoder_only", **fields))


def _count(cfg):
  shapes = jax.eval_shape(lambda r: build_model(cfg).init(r, jnp.ones((1, 4), jnp.int32)),
                          jax.random.PRNGKey(0))["params"]
  return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.unbox(shapes)))


@pytest.mark.parametrize("fields,per_layer,once", [
    (dict(qk_norm="rmsnorm"), 2 * K, 0),
    (dict(qk_norm="layernorm"), 4 * K, 0),
    (dict(attention_gate="headwise"), D * H + H, 0),
    (dict(attention_gate="elementwise"), D * H * K + H * K, 0),
    # Each norm (two per layer and the final one): alpha, and a bias beside the gain.
    (dict(norm_type="dyt"), 2 * (1 + D), 1 + D),
    (dict(block="parallel"), 0, 0),
    (dict(attention_window=2, global_every=2, attention_logit_softcap=50.0,
          final_logit_softcap=30.0), 0, 0),
])
def test_parameter_counts(fields, per_layer, once):
  base = dict(family="decoder_only", num_layers=3, d_model=D, num_heads=H, num_kv_heads=N,
              vocab_size=23, position="rope", norm_type="rmsnorm")
  cfg = model_config_from_dict({**base, **fields})
  assert _count(cfg) - _count(model_config_from_dict(base)) == 3 * per_layer + once


@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_new_parameters_carry_logical_axis_names(scan_layers):
  """Every parameter has a logical name per dimension (how sharding finds its
  mesh axes): the gates, the query-key norms and DyT's alpha included."""
  cfg = model_config_from_dict(dict(
      family="decoder_only", num_layers=2, d_model=D, num_heads=H, num_kv_heads=N,
      vocab_size=23, position="rope", qk_norm="layernorm", attention_gate="elementwise",
      norm_type="dyt", block="parallel", scan_layers=scan_layers))
  boxed = jax.eval_shape(lambda r: build_model(cfg).init(r, jnp.ones((1, 4), jnp.int32)),
                         jax.random.PRNGKey(0))["params"]
  leaves = jax.tree_util.tree_leaves_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  names = {jax.tree_util.keystr(p): x for p, x in leaves}
  assert any("gate" in k for k in names) and any("query_norm" in k for k in names)
  assert any("alpha" in k for k in names)
  for path, leaf in names.items():
    assert isinstance(leaf, nn.LogicallyPartitioned), path
    assert len(leaf.names) == len(leaf.value.shape), (path, leaf.names)


@pytest.mark.slow
def test_embedding_init_sets_the_token_tables_scale():
  """``embedding_init=normal`` is N(0, 1/d_model) (Vaswani et al.); with
  ``scale_embeddings`` the embeddings have unit variance, against Glorot's
  sqrt(2 / (vocab + d_model))."""
  base = dict(family="decoder_only", num_layers=1, d_model=64, num_heads=2, vocab_size=4096,
              max_len=16)
  ids = jnp.zeros((1, 4), jnp.int32)
  stds = {}
  for init in ("xavier", "normal"):
    model = build_model(model_config_from_dict({**base, "embedding_init": init}))
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
    stds[init] = float(jnp.std(params["embedding"]["embedding"]))
  assert stds["normal"] == pytest.approx(64 ** -0.5, rel=0.02)
  assert stds["xavier"] == pytest.approx((2 / (4096 + 64)) ** 0.5, rel=0.02)


@pytest.mark.parametrize("family,stack", [("decoder_only", "learned"),
                                          ("encoder_decoder", "decoder_learned")])
@pytest.mark.parametrize("init,scaled", [("xavier", False), ("xavier", True),
                                         ("normal", True)])
def test_learned_position_init_token_starts_positions_as_the_tokens(family, stack, init,
                                                                    scaled):
  """``learned_position_init=token``: the position vectors added to the tokens
  have the token vectors' spread (the same initialisation and embed scale);
  ``small`` is GPT-2's N(0, 0.02^2) whatever the tokens are."""
  base = dict(family=family, num_layers=1, d_model=64, num_heads=2, vocab_size=4096,
              max_len=512, position="learned", embedding_init=init,
              scale_embeddings=scaled)
  ids = jnp.arange(4096, dtype=jnp.int32)[None]
  positions = jnp.arange(512, dtype=jnp.int32)[None]
  args = (ids[:, :4],) if family == "decoder_only" else (ids[:, :4], ids[:, :4])
  stds = {}
  for start in ("small", "token"):
    model = build_model(model_config_from_dict({**base, "learned_position_init": start}))
    params = nn.unbox(model.init(jax.random.PRNGKey(0), *args)["params"])
    added = model.apply({"params": params}, positions,
                        method=lambda m, p: getattr(m, stack)(p))
    tokens = model.apply({"params": params}, ids, method="embed_tokens")
    stds[start] = float(jnp.std(added)), float(jnp.std(tokens))
  position_std, token_std = stds["token"]
  assert position_std == pytest.approx(token_std, rel=0.03)
  assert stds["small"][0] == pytest.approx(0.02, rel=0.03)


def test_learned_position_init_needs_learned_positions():
  base = dict(family="decoder_only", position="rope", learned_position_init="token")
  with pytest.raises(InactiveSetting, match="learned_position_init='token'.*'rope'"):
    model_config_from_dict(base)
  assert model_config_from_dict({**base, "position": "learned"}).learned_position_init == "token"
