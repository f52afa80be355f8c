"""Whole-model behaviour of the three families, for every position scheme.

Causality, padding, packing and cached decoding are properties every
combination must have; each is checked by running the model on a batch of
variants and comparing rows. Models are tiny and run eagerly (no jit): on a
2-core CPU an XLA compile per configuration costs more than the computation.
Eager ops are compiled once per shape, so every batch here has the same
shape (8 rows of 8 tokens, sources too) and the warm-up is shared.
"""

import functools
import itertools
from typing import get_args

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.config import NormPosition, NormType, model_config_from_dict
from tfx_jax.model.families import build_model, stack_layer_params

POSITIONS = ("sinusoidal", "learned", "t5_bias", "rope", "alibi", "none")
DECODER_FAMILIES = ("decoder_only", "encoder_decoder")
FAMILIES = ("decoder_only", "encoder_only", "encoder_decoder")
V = 23  # vocabulary; ids >= 5 are ordinary tokens (0-4 are pad/unk/bos/eos/mask)
B = L = 8  # the shape of every batch

# Rows of one batch that must agree: only a leak could make them differ.
EXACT = dict(rtol=0, atol=1e-6)
# The same tokens laid out differently: summation order may differ.
CLOSE = dict(rtol=1e-5, atol=1e-5)


def _cfg(family, position, **overrides):
  kw = dict(family=family, position=position, num_layers=2, d_model=16, num_heads=4,
            num_kv_heads=2, vocab_size=V, max_len=16)
  kw.update(overrides)
  return model_config_from_dict(kw)


@functools.lru_cache(maxsize=None)
def _model(family, position, **overrides):
  """(cfg, model, params), shared by the tests of one configuration."""
  cfg = _cfg(family, position, **overrides)
  model = build_model(cfg)
  ids = jnp.ones((1, 4), jnp.int32)
  args = (ids,) if family != "encoder_decoder" else (ids, ids)
  params = model.init(jax.random.PRNGKey(0), *args)["params"]
  return cfg, model, params


def _tokens(seed, *shape):
  return np.random.default_rng(seed).integers(5, V, shape).astype(np.int32)


def _other(ids):
  """Different ordinary tokens at every position."""
  return (ids - 5 + 1 + np.arange(ids.size).reshape(ids.shape) % (V - 6)) % (V - 5) + 5


def _rows(*rows):
  """A [B, L] batch: the given rows, then copies of the first."""
  rows = list(rows) + [rows[0]] * (B - len(rows))
  return np.stack(rows).astype(np.int32)


def _logits(model, params, *args, **kwargs):
  out = model.apply({"params": params}, *[jnp.asarray(a) for a in args],
                    **{k: None if v is None else jnp.asarray(v) for k, v in kwargs.items()})
  return np.asarray(out["logits"])


# --------------------------------------------------------------- causality
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.slow
def test_decoder_is_causal(family, position):
  """Row t+1 changes token t+1 of row 0: positions <= t must not notice."""
  _, model, params = _model(family, position)
  ids = _tokens(1, L)
  batch = [ids]
  for t in range(L - 1):
    row = ids.copy()
    row[t + 1] = _other(row[t + 1:t + 2])[0]
    batch.append(row)
  batch = _rows(*batch)
  if family == "decoder_only":
    out = _logits(model, params, batch)
  else:
    out = _logits(model, params, _rows(_tokens(2, L)), batch)
  for t in range(L - 1):
    np.testing.assert_allclose(out[t + 1, :t + 1], out[0, :t + 1], **EXACT,
                               err_msg=f"changing token {t + 1} changed positions <= {t}")
    # Not vacuous: the changed position itself does see its token.
    assert np.abs(out[t + 1, t + 1] - out[0, t + 1]).max() > 1e-4


@pytest.mark.parametrize("position", POSITIONS)
def test_encoders_are_bidirectional(position):
  """Changing the last token changes the first position's output."""
  ids = _tokens(3, L)
  batch = _rows(ids, np.concatenate([ids[:-1], _other(ids[-1:])]))
  _, model, params = _model("encoder_only", position)
  out = _logits(model, params, batch)
  assert np.abs(out[1, 0] - out[0, 0]).max() > 1e-4
  _, model, params = _model("encoder_decoder", position)
  enc = np.asarray(model.apply({"params": params}, jnp.asarray(batch), method=model.encode))
  assert np.abs(enc[1, 0] - enc[0, 0]).max() > 1e-4


# ----------------------------------------------------------------- padding
def _padded(real, seg, seed):
  """``real`` tokens at the segment > 0 slots; padding holds random ids (or 0)."""
  ids = np.zeros(len(seg), np.int32) if seed is None else _tokens(seed, len(seg))
  ids[seg > 0] = real
  return ids


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", ["decoder_only", "encoder_only"])
def test_padding_never_changes_real_positions(family, position):
  """Rows 0-3 right-pad the same 5 tokens, rows 4-7 pad them on both sides;
  the padded slots (segment 0) hold different ids in every row, so a real
  position that attended to a padded one would differ between rows."""
  _, model, params = _model(family, position)
  real = _tokens(4, 5)
  right = np.array([1, 1, 1, 1, 1, 0, 0, 0])
  both = np.array([0, 0, 1, 1, 1, 1, 1, 0])
  within = lambda seg: np.maximum(np.cumsum(seg) - 1, 0) * (seg > 0)  # positions
  seeds = (None, 10, 11, 12)
  ids = _rows(*[_padded(real, right, s) for s in seeds], *[_padded(real, both, s) for s in seeds])
  seg = _rows(*[right] * 4, *[both] * 4)
  pos = _rows(*[within(right)] * 4, *[within(both)] * 4)
  out = _logits(model, params, ids, segment_ids=seg, positions=pos)
  real_out = np.stack([out[k][seg[k] > 0] for k in range(B)])
  for k in (1, 2, 3):
    np.testing.assert_allclose(real_out[k], real_out[0], **EXACT)
    np.testing.assert_allclose(real_out[4 + k], real_out[4], **EXACT)
  # Where the padding is does not matter either.
  np.testing.assert_allclose(real_out[4], real_out[0], **CLOSE)


@pytest.mark.parametrize("position", POSITIONS)
def test_encoder_decoder_padding(position):
  _, model, params = _model("encoder_decoder", position)
  src_seg = np.array([1, 1, 1, 1, 1, 0, 0, 0])
  src = _rows(*[_padded(_tokens(5, 5), src_seg, s) for s in (None, 10, 11, 12, 13)])
  src[5:] = src[0]
  tgt = _rows(_tokens(6, L))
  # Padded source tokens (segment 0) never matter...
  out = _logits(model, params, src, tgt, inputs_segment_ids=_rows(src_seg))
  for k in range(1, 5):
    np.testing.assert_allclose(out[k], out[0], **EXACT)
  # ... and by default the segment ids come from the 0 padding of the source.
  default = _logits(model, params, _rows(src[0]), tgt)
  np.testing.assert_allclose(default[0], out[0], **EXACT)
  # Padded target tokens never change real target positions.
  tgt_seg = np.array([1, 1, 1, 1, 1, 1, 0, 0])
  tgt = _rows(*[_padded(_tokens(7, 6), tgt_seg, s) for s in (None, 10, 11, 12)])
  out = _logits(model, params, _rows(src[0]), tgt, decoder_segment_ids=_rows(tgt_seg))
  for k in range(1, 4):
    np.testing.assert_allclose(out[k][:6], out[0][:6], **EXACT)


# ----------------------------------------------------------------- packing
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", ["decoder_only", "encoder_only"])
def test_packed_documents_equal_each_alone(family, position):
  """Documents A (3 tokens) and B (5) packed in one row, in either order, give
  the outputs of each alone in a row (right-padded: the padding tests show that
  padded slots are never attended to); positions restart at each document."""
  _, model, params = _model(family, position)
  a, b = _tokens(7, 3), _tokens(8, 5)
  pad = lambda x: np.concatenate([x, np.zeros(L - len(x), np.int32)])
  ids = _rows(np.concatenate([a, b]), np.concatenate([b, a]), pad(a), pad(b))
  seg = _rows([1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 2, 2, 2],
              [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0])
  pos = _rows([0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 1, 2],
              [0, 1, 2, 0, 0, 0, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0])
  out = _logits(model, params, ids, segment_ids=seg, positions=pos)
  a_alone, b_alone = out[2, :3], out[3, :5]
  np.testing.assert_allclose(out[0, :3], a_alone, **CLOSE)
  np.testing.assert_allclose(out[0, 3:], b_alone, **CLOSE)
  np.testing.assert_allclose(out[1, :5], b_alone, **CLOSE)
  np.testing.assert_allclose(out[1, 5:], a_alone, **CLOSE)


def _pair_losses(logits_LV, labels_L):
  """Summed cross-entropy of each target position, [L]."""
  log_probs = jax.nn.log_softmax(jnp.asarray(logits_LV), -1)
  return -np.take_along_axis(np.asarray(log_probs), labels_L[:, None], -1)[:, 0]


@pytest.mark.parametrize("position", POSITIONS)
def test_packed_translation_pairs_equal_each_alone(position):
  """Pairs (source A 3 tokens, target 4) and (source B 4, target 3) packed in
  one row give the per-pair losses of each pair alone: target segment k attends
  to source segment k only."""
  _, model, params = _model("encoder_decoder", position)
  src_a, src_b = _tokens(30, 3), _tokens(31, 4)
  tgt_a, tgt_b = _tokens(32, 4), _tokens(33, 3)
  lab_a, lab_b = _tokens(34, 4), _tokens(35, 3)
  pad = lambda x: np.concatenate([x, np.zeros(L - len(x), np.int32)])
  seg = lambda *lens: pad(np.concatenate([np.full(n, k + 1) for k, n in enumerate(lens)]))
  pos = lambda *lens: pad(np.concatenate([np.arange(n) for n in lens]))
  out = _logits(
      model, params,
      _rows(pad(np.concatenate([src_a, src_b])), pad(src_a), pad(src_b)),
      _rows(pad(np.concatenate([tgt_a, tgt_b])), pad(tgt_a), pad(tgt_b)),
      inputs_segment_ids=_rows(seg(3, 4), seg(3), seg(4)),
      decoder_segment_ids=_rows(seg(4, 3), seg(4), seg(3)),
      inputs_positions=_rows(pos(3, 4), pos(3), pos(4)),
      decoder_positions=_rows(pos(4, 3), pos(4), pos(3)))
  packed_a = _pair_losses(out[0, :4], lab_a)
  packed_b = _pair_losses(out[0, 4:7], lab_b)
  np.testing.assert_allclose(packed_a, _pair_losses(out[1, :4], lab_a), **CLOSE)
  np.testing.assert_allclose(packed_b, _pair_losses(out[2, :3], lab_b), **CLOSE)


# ---------------------------------------------------------- cached decoding
_stacked = stack_layer_params


def _decode_incrementally(cfg, params, tgt_BL, src_BS, chunks):
  """Feeds ``tgt`` through the KV cache in pieces of the given lengths."""
  model = build_model(cfg, use_cache=True)
  capacity = jnp.ones(tgt_BL.shape, jnp.int32)
  if cfg.family == "decoder_only":
    cache = model.init(jax.random.PRNGKey(0), inputs=capacity)["cache"]
  else:
    cache = model.init(jax.random.PRNGKey(0), inputs=jnp.asarray(src_BS),
                       decoder_inputs=capacity)["cache"]
    encoded = model.apply({"params": params}, jnp.asarray(src_BS), method=model.encode)
    src_seg = jnp.asarray((src_BS > 0).astype(np.int32))
  outs, start = [], 0
  for n in chunks:
    piece = jnp.asarray(tgt_BL[:, start:start + n])
    if cfg.family == "decoder_only":
      out, mut = model.apply({"params": params, "cache": cache}, piece, mutable=["cache"])
    else:
      out, mut = model.apply({"params": params, "cache": cache}, piece, encoded, src_seg,
                             method=model.decode, mutable=["cache"])
    cache = mut["cache"]
    outs.append(np.asarray(out["logits"]))
    start += n
  assert start == tgt_BL.shape[1]
  return np.concatenate(outs, axis=1)


ONE_AT_A_TIME = [1] * L
PREFILL_THEN_ONE_AT_A_TIME = [3] + [1] * (L - 3)


def _check_cached_decoding(family, position, scan_layers, schedules, **overrides):
  cfg, model, params = _model(family, position, **overrides)
  tgt = np.stack([_tokens(20 + k, L) for k in range(B)])
  # Sources with 0..3 padding tokens at the end.
  src = np.stack([np.where(np.arange(L) < L - k % 4, _tokens(30 + k, L), 0)
                  for k in range(B)])
  # The reference is the full forward pass of the Python-loop stack.
  full = (_logits(model, params, tgt) if family == "decoder_only"
          else _logits(model, params, src, tgt))
  if scan_layers:
    cfg = _cfg(family, position, scan_layers=True, **overrides)
    params = _stacked(params)
  for chunks in schedules:
    np.testing.assert_allclose(_decode_incrementally(cfg, params, tgt, src, chunks), full,
                               **CLOSE, err_msg=f"chunks {chunks}")


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.slow
def test_cached_decoding_equals_full_forward(family, position):
  _check_cached_decoding(family, position, scan_layers=False,
                         schedules=(ONE_AT_A_TIME, PREFILL_THEN_ONE_AT_A_TIME))


# Each position scheme once, the families in turn: the loop stack's cached
# decoding is tested for every pair above, and the scanned stack is the loop
# stack with stacked parameters (test_scan_and_loop_compute_the_same_function).
SCANNED_CASES = [(DECODER_FAMILIES[i % 2], p) for i, p in enumerate(POSITIONS)]


@pytest.mark.parametrize("family,position", SCANNED_CASES)
@pytest.mark.slow
def test_cached_decoding_scanned_layers(family, position):
  """The scanned stack keeps one cache per layer (the cache's leading axis).

  Run with jit disabled: eagerly, ``lax.scan`` compiles its whole body for
  every configuration and input length (seconds each here), while under
  ``disable_jit`` it runs as a Python loop over the layers with the same
  semantics (per-layer slices of the stacked parameters and cache).
  """
  with jax.disable_jit():
    _check_cached_decoding(family, position, scan_layers=True,
                           schedules=(PREFILL_THEN_ONE_AT_A_TIME,))


# The stability and attention knobs (docs/axes.md), every value
# in one of these, each with another position scheme.
KNOBS = {
    "qk_rmsnorm-headwise_gate-window-global_every-dyt": dict(
        position="rope", qk_norm="rmsnorm", attention_gate="headwise",
        attention_window=3, global_every=2, norm_type="dyt"),
    "qk_layernorm-elementwise_gate-parallel-softcaps": dict(
        position="t5_bias", qk_norm="layernorm", attention_gate="elementwise",
        block="parallel", attention_logit_softcap=2.0, final_logit_softcap=3.0),
    "parallel_sandwich-window": dict(
        position="alibi", block="parallel", norm_position="sandwich", attention_window=2),
}


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.slow
def test_cached_decoding_with_attention_knobs(family, knobs):
  overrides = dict(KNOBS[knobs])
  _check_cached_decoding(family, overrides.pop("position"), scan_layers=False,
                         schedules=(PREFILL_THEN_ONE_AT_A_TIME,), **overrides)


@pytest.mark.slow
def test_cached_decoding_alternating_windows_scanned():
  """Windowed and fully attending layers alternate inside one scan."""
  overrides = dict(KNOBS["qk_rmsnorm-headwise_gate-window-global_every-dyt"])
  with jax.disable_jit():
    _check_cached_decoding("decoder_only", overrides.pop("position"), scan_layers=True,
                           schedules=(PREFILL_THEN_ONE_AT_A_TIME,), **overrides)


@pytest.mark.parametrize("width", [6, 2])
@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.slow
def test_heads_of_their_own_width(family, width):
  """model.head_dim wider (6) or narrower (2) than d_model / num_heads (16 / 4):
  q, k, v [D, H, K] and out [H, K, D], the cross-attention's too, and cached
  decoding unchanged."""
  _, _, params = _model(family, "rope", head_dim=width)
  kv_heads = {"query": 4, "key": 2, "value": 2}
  checked = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(nn.unbox(params)):
    names = [k.key for k in path]
    if len(names) > 2 and names[-3].endswith("attention") and names[-1] == "kernel":
      want = ((4, width, 16) if names[-2] == "out" else (16, kv_heads[names[-2]], width))
      assert leaf.shape == want, names
      checked += 1
  # 4 kernels per attention: 2 layers, and 2 encoder layers + 2 decoder layers
  # with cross-attention.
  assert checked == (8 if family == "decoder_only" else 24)
  _check_cached_decoding(family, "rope", scan_layers=False,
                         schedules=(PREFILL_THEN_ONE_AT_A_TIME,), head_dim=width)


@pytest.mark.slow
def test_cached_decoding_multi_query():
  _check_cached_decoding("decoder_only", "rope", scan_layers=False,
                         schedules=(PREFILL_THEN_ONE_AT_A_TIME,), num_kv_heads=1)


# Partial and scaled RoPE (head_dim 4: a fraction of 0.5 rotates one pair); the
# pre-training length of YaRN (4) is shorter than the batch (8).
ROPE_VARIANTS = {
    "partial": dict(rope_fraction=0.5),
    "linear": dict(rope_scaling="linear", rope_scaling_factor=2.0),
    "ntk": dict(rope_scaling="ntk", rope_scaling_factor=4.0),
    "yarn": dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=4),
    "partial_yarn": dict(rope_fraction=0.5, rope_scaling="yarn", rope_scaling_factor=4.0,
                         rope_original_max_len=4),
}


@pytest.mark.parametrize("variant", ROPE_VARIANTS)
@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.slow
def test_cached_decoding_with_partial_and_scaled_rope(family, variant):
  """The cache holds keys rotated with their own positions under every RoPE
  variant; the scanned stack too."""
  overrides = ROPE_VARIANTS[variant]
  _check_cached_decoding(family, "rope", scan_layers=False,
                         schedules=(PREFILL_THEN_ONE_AT_A_TIME,), **overrides)
  with jax.disable_jit():
    _check_cached_decoding(family, "rope", scan_layers=True,
                           schedules=(PREFILL_THEN_ONE_AT_A_TIME,), **overrides)


@pytest.mark.slow
def test_scan_and_loop_compute_the_same_function():
  """The scanned stack is the loop with its layer parameters stacked."""
  for family in DECODER_FAMILIES:
    _, loop_model, loop_params = _model(family, "rope")
    scan_model = build_model(_cfg(family, "rope", scan_layers=True))
    ids = _rows(*[_tokens(13 + k, L) for k in range(B)])
    args = (ids,) if family == "decoder_only" else (ids, ids)
    abstract = jax.eval_shape(lambda: scan_model.init(
        jax.random.PRNGKey(0), *[jnp.asarray(a) for a in args])["params"])
    params = _stacked(loop_params)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, nn.unbox(abstract))
    with jax.disable_jit():  # see test_cached_decoding_scanned_layers
      scanned = _logits(scan_model, params, *args)
    np.testing.assert_allclose(scanned, _logits(loop_model, loop_params, *args), **CLOSE)


# ---------------------------------------------------------- norm placement
def _abstract_params(cfg):
  """The parameter tree's structure and shapes (``jax.eval_shape``: nothing computed)."""
  from tfx_jax.model.families import dummy_inputs
  model = build_model(cfg)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                           **dummy_inputs(cfg)))["params"]


def _param_paths(params):
  from flax import traverse_util
  return {"/".join(k) for k in traverse_util.flatten_dict(nn.unbox(params))}


@pytest.mark.parametrize("norm_position,layer_norms,final_norm", [
    ("post", {"self_attention_norm", "ffn_norm"}, False),
    ("pre", {"self_attention_norm", "ffn_norm"}, True),
    ("sandwich", {"self_attention_norm", "self_attention_post_norm", "ffn_norm",
                  "ffn_post_norm"}, True),
    ("deepnorm", {"self_attention_norm", "ffn_norm"}, False),
])
@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_norm_placement_structure(norm_position, layer_norms, final_norm, norm_type):
  cfg = _cfg("decoder_only", "none", num_layers=1, norm_position=norm_position,
             norm_type=norm_type)
  paths = _param_paths(_abstract_params(cfg))
  norms = {p.split("/")[2] for p in paths if p.startswith("decoder/layer_0/")
           and p.split("/")[2].endswith("norm")}
  assert norms == layer_norms
  assert any(p.startswith("decoder/final_norm/") for p in paths) == final_norm
  has_bias = any(p.endswith("norm/bias") for p in paths)
  assert has_bias == (norm_type == "layernorm")


@pytest.mark.parametrize("family", FAMILIES)
def test_norm_axes_change_only_the_norms_parameters(family):
  """Across every norm placement and norm type, the parameters outside the
  norms are the same (names and shapes); a norm owns a [d_model] scale, plus a
  [d_model] bias for LayerNorm, plus a bias and a scalar alpha for DyT, and
  nothing else."""
  from flax import traverse_util
  outside = {}
  for norm_position, norm_type in itertools.product(
      get_args(NormPosition), get_args(NormType)):
    cfg = _cfg(family, "learned", num_layers=2, norm_position=norm_position,
               norm_type=norm_type)
    flat = traverse_util.flatten_dict(nn.unbox(_abstract_params(cfg)))
    in_norm = lambda path: any(name.endswith("norm") for name in path[:-1])
    outside[(norm_position, norm_type)] = {
        "/".join(k): v.shape for k, v in flat.items() if not in_norm(k)}
    leaves = {"layernorm": {"scale": (cfg.d_model,), "bias": (cfg.d_model,)},
              "rmsnorm": {"scale": (cfg.d_model,)},
              "dyt": {"scale": (cfg.d_model,), "bias": (cfg.d_model,), "alpha": ()}}
    norms = {k[:-1] for k in flat if in_norm(k)}
    assert norms, (norm_position, norm_type)
    for norm in norms:
      own = {k[-1]: v.shape for k, v in flat.items() if k[:-1] == norm}
      assert own == leaves[norm_type], norm
  reference = outside[("pre", "layernorm")]
  for key, shapes in outside.items():
    assert shapes == reference, key


def test_encoder_decoder_layers_have_cross_attention():
  cfg = _cfg("encoder_decoder", "none", num_layers=1, norm_position="sandwich")
  paths = _param_paths(_abstract_params(cfg))
  assert any(p.startswith("decoder/layer_0/cross_attention/") for p in paths)
  assert any(p.startswith("decoder/layer_0/cross_attention_post_norm/") for p in paths)
  assert not any(p.startswith("encoder/layer_0/cross_attention") for p in paths)


def test_post_norm_encoder_normalises_embeddings():
  """BERT: a post-norm encoder has an embedding norm; pre-norm has a final norm."""
  post = _param_paths(_abstract_params(_cfg("encoder_only", "learned", norm_position="post")))
  pre = _param_paths(_abstract_params(_cfg("encoder_only", "learned", norm_position="pre")))
  assert any(p.startswith("embed_norm/") for p in post)
  assert not any(p.startswith("encoder/final_norm/") for p in post)
  assert not any(p.startswith("embed_norm/") for p in pre)
  assert any(p.startswith("encoder/final_norm/") for p in pre)


# ------------------------------------------------------------ model details
def _stack_inputs(model, params, *args):
  """The hidden states each Stack (encoder/decoder) receives, in call order."""
  from tfx_jax.model.blocks import Stack
  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, Stack) and context.method_name == "__call__":
      seen.append(np.asarray(args[0]))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    model.apply({"params": params}, *[jnp.asarray(a) for a in args])
  return seen


def _absolute_positions(cfg, params, stack_index):
  """What the position scheme adds to the token embeddings of one stack."""
  from tfx_jax.model.layers.positions import sinusoidal
  if cfg.position == "sinusoidal":
    return np.asarray(sinusoidal(jnp.arange(L)[None], cfg.d_model))
  if cfg.position == "learned":
    name = ("positions" if cfg.family != "encoder_decoder"
            else ("encoder_positions", "decoder_positions")[stack_index])
    return np.asarray(nn.unbox(params[name]["embedding"]))[:L]
  return 0.0


@pytest.mark.parametrize("scale", [False, True], ids=["unscaled", "scaled"])
@pytest.mark.parametrize("family", FAMILIES)
def test_position_scheme_changes_positions_only(family, scale):
  """With the same embedding table, every position scheme feeds each stack
  E[id] (x sqrt(d_model) with scale_embeddings, Vaswani et al. 3.4) plus its
  own absolute positions: the token-embedding part is identical across schemes."""
  ids = _rows(*[_tokens(14 + k, L) for k in range(B)])
  args = (ids,) if family != "encoder_decoder" else (ids, ids)
  table = None
  for position in POSITIONS:
    cfg, model, params = _model(family, position, scale_embeddings=scale)
    params = dict(params)
    if table is None:
      table = params["embedding"]
    params["embedding"] = table  # the same parameters for every scheme
    want = np.asarray(nn.unbox(table["embedding"]))[ids] * (
        np.sqrt(cfg.d_model) if scale else 1.0)
    got = np.asarray(model.apply({"params": params}, jnp.asarray(ids),
                                 method="embed_tokens"))
    np.testing.assert_array_equal(got, want.astype(np.float32))
    inputs = _stack_inputs(model, params, *args)
    assert len(inputs) == (2 if family == "encoder_decoder" else 1)
    for i, stack_input in enumerate(inputs):
      np.testing.assert_allclose(stack_input - _absolute_positions(cfg, params, i), want,
                                 **CLOSE, err_msg=position)


@pytest.mark.slow
def test_bert_embedding_norm_comes_before_dropout():
  """BERT: LayerNorm(E[id] + P[pos]), then dropout. The stack input is 0 where
  dropped and the normalised embedding / (1 - p) elsewhere; dropout before the
  norm would leave no exact zeros."""
  rate = 0.5
  cfg, _, params = _model("encoder_only", "learned", norm_position="post", dropout=rate)
  model = build_model(cfg, deterministic=False)
  ids = _rows(*[_tokens(20 + k, L) for k in range(B)])
  seen = []

  def record(next_fun, args, kwargs, context):
    if context.module.name == "encoder" and context.method_name == "__call__":
      seen.append(np.asarray(args[0]))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    model.apply({"params": params}, jnp.asarray(ids), rngs={"dropout": jax.random.PRNGKey(1)})
  (got,) = seen
  x = (np.asarray(nn.unbox(params["embedding"]["embedding"]))[ids]
       + np.asarray(nn.unbox(params["positions"]["embedding"]))[:L])
  norm = nn.unbox(params["embed_norm"])
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  normed = (x - mean) / np.sqrt(var + cfg.norm_eps) * norm["scale"] + norm["bias"]
  kept = got != 0
  assert 0.3 < kept.mean() < 0.7
  np.testing.assert_allclose(got[kept], normed[kept] / (1 - rate), **CLOSE)


def test_tied_logits_are_hidden_times_embedding_transpose():
  _, model, params = _model("decoder_only", "rope")
  assert "output" not in params
  ids = jnp.asarray(_rows(*[_tokens(15 + k, L) for k in range(B)]))
  _, state = model.apply({"params": params}, ids, capture_intermediates=True,
                         mutable=["intermediates"])
  # The stack returns its hidden states and its MoE layers' router statistics.
  ((hidden, router),) = state["intermediates"]["decoder"]["__call__"]
  assert router == {}
  emb = np.asarray(nn.unbox(params["embedding"]["embedding"]))
  np.testing.assert_allclose(_logits(model, params, ids), np.asarray(hidden) @ emb.T,
                             **CLOSE)


def test_decoder_only_classifier_reads_last_real_token():
  """GPT-1 fine-tuning: the class logits come from the last real token's state."""
  cfg, model, params = _model("decoder_only", "learned", num_classes=3)
  ids = _tokens(16, L)
  seg3 = np.array([1, 1, 1, 0, 0, 0, 0, 0])
  batch = _rows(ids, _padded(ids[:3], seg3, None), _padded(ids[:3], seg3, 10))
  seg = _rows(np.ones(L, np.int32), seg3, seg3)
  out, state = model.apply({"params": params}, jnp.asarray(batch), jnp.asarray(seg),
                           capture_intermediates=lambda m, _: m.name == "decoder",
                           mutable=["intermediates"])
  class_logits = np.asarray(out["class_logits"])
  assert class_logits.shape == (B, 3)
  ((hidden, _),) = state["intermediates"]["decoder"]["__call__"]  # (x, router stats)
  w = nn.unbox(params["classifier"])
  head = lambda h: np.asarray(h) @ np.asarray(w["kernel"]) + np.asarray(w["bias"])
  np.testing.assert_allclose(class_logits[0], head(hidden[0, L - 1]), **CLOSE)
  np.testing.assert_allclose(class_logits[1], head(hidden[1, 2]), **CLOSE)
  # Causal: the state at position 2 of the full row is the same.
  np.testing.assert_allclose(class_logits[1], head(hidden[0, 2]), **CLOSE)
  np.testing.assert_allclose(class_logits[2], class_logits[1], **EXACT)


def test_encoder_only_classifier_pools_the_first_token():
  """BERT: tanh(dense(h_0)) -> classifier."""
  cfg, model, params = _model("encoder_only", "learned", num_classes=3)
  batch = _rows(*[_tokens(40 + k, L) for k in range(B)])
  out, state = model.apply({"params": params}, jnp.asarray(batch),
                           capture_intermediates=lambda m, _: m.name == "encoder",
                           mutable=["intermediates"])
  ((hidden, _),) = state["intermediates"]["encoder"]["__call__"]  # (x, router stats)
  p = nn.unbox(params)
  pooled = np.tanh(np.asarray(hidden[:, 0]) @ np.asarray(p["pooler"]["kernel"])
                   + np.asarray(p["pooler"]["bias"]))
  want = pooled @ np.asarray(p["classifier"]["kernel"]) + np.asarray(p["classifier"]["bias"])
  np.testing.assert_allclose(np.asarray(out["class_logits"]), want, **CLOSE)
