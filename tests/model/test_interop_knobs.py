"""The model fields that make the published architectures points of the design
space (GPT-2's tanh GELU, BERT's token types, BART's embedding norms and
output bias, Marian's [sin | cos] table, T5's unscaled attention, T5 1.0's
scaled output), each against its formula, and their defaults leaving every
model as it was."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.model.layers.attention import dot_product_attention
from tfx_jax.model.layers.ffn import activation_fn
from tfx_jax.model.layers.positions import sinusoidal
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.families import build_model, dummy_inputs, init_params

nn_unbox = nn.unbox


def _cfg(**kw):
  base = dict(d_model=16, num_heads=4, num_layers=1, vocab_size=32, max_len=16)
  return model_config_from_dict({**base, **kw})


def _paths(cfg):
  params = nn_unbox(jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0))))
  return {"/".join(str(getattr(k, "key", k)) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_sinusoidal_halves_is_sin_then_cos():
  pos = jnp.arange(7)[None]
  d = 8
  angle = np.arange(7)[:, None] / 10000 ** (2 * np.arange(d // 2) / d)[None]
  want = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
  np.testing.assert_allclose(sinusoidal(pos, d, "halves")[0], want, atol=1e-6)
  inter = np.asarray(sinusoidal(pos, d)[0])
  np.testing.assert_array_equal(inter[:, 0::2], np.asarray(sinusoidal(pos, d, "halves")[0])[:, :4])


def test_gelu_tanh_is_the_tanh_approximation():
  x = jnp.linspace(-4, 4, 33)
  want = 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
  for name, gated in (("gelu_tanh", False), ("geglu_tanh", True)):
    fn, is_gated = activation_fn(name)
    assert is_gated == gated
    np.testing.assert_allclose(fn(x), want, atol=1e-6)


@pytest.mark.slow
def test_unscaled_attention_is_scaled_attention_of_sqrt_dk_queries():
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(r, (2, 5, 4, 8)) for r in (k1, k2, k3))
  np.testing.assert_allclose(
      dot_product_attention(q, k, v, scale_logits=False),
      dot_product_attention(q * math.sqrt(8), k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["decoder_only", "encoder_only", "encoder_decoder"])
def test_embedding_norm_for_every_family(family):
  names = {"encoder_decoder": ("encoder_embed_norm", "decoder_embed_norm")}.get(
      family, ("embed_norm",))
  on = _paths(_cfg(family=family, embedding_norm="on"))
  off = _paths(_cfg(family=family, embedding_norm="off"))
  for n in names:
    assert f"{n}/scale" in on and not any(p.startswith(n) for p in off)
  # "auto" is the behaviour before the field: BERT's, encoder_only post-norm only.
  for position in ("pre", "post"):
    auto = _paths(_cfg(family=family, norm_position=position))
    expect = family == "encoder_only" and position == "post"
    assert ("embed_norm/scale" in auto) == expect


def test_defaults_add_no_parameters():
  for family in ("decoder_only", "encoder_only", "encoder_decoder"):
    paths = _paths(_cfg(family=family))
    assert not any(p.startswith(("token_types", "output_bias", "encoder_embed_norm",
                                 "decoder_embed_norm")) for p in paths)


@pytest.mark.slow
def test_output_bias_is_added_to_the_logits():
  cfg = _cfg(output_bias=True)
  params = init_params(cfg, jax.random.PRNGKey(0))
  params = nn_unbox(params)
  ids = jnp.array([[1, 2, 3]])
  model = build_model(cfg)
  base = model.apply({"params": params}, ids)["logits"]
  bias = jnp.arange(32, dtype=jnp.float32)
  shifted = model.apply({"params": {**params, "output_bias": bias}}, ids)["logits"]
  np.testing.assert_allclose(shifted - base, jnp.broadcast_to(bias, base.shape), atol=1e-5)


# The module whose output is the projection's input, per family.
_PROJECTED = {"decoder_only": "decoder", "encoder_decoder": "decoder",
              "encoder_only": "mlm_norm"}


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("family", ["decoder_only", "encoder_only", "encoder_decoder"])
def test_scale_output_scales_the_projected_hidden_state(family, tie):
  """T5 1.0: logits = (h x d_model^-0.5) W (+ biases), W = E^T when tied; the
  hidden state h and the parameters are those of the unscaled model."""
  cfg = _cfg(family=family, tie_embeddings=tie, output_bias=True)
  scaled = dataclasses.replace(cfg, scale_output=True)
  assert _paths(scaled) == _paths(cfg)
  params = nn_unbox(init_params(cfg, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)
  params["output_bias"] = jnp.asarray(rng.normal(size=32), jnp.float32)
  if family == "encoder_only":
    params["mlm_bias"] = jnp.asarray(rng.normal(size=32), jnp.float32)
  ids = jnp.array([[1, 2, 3, 4, 5]])
  args = (ids, ids) if family == "encoder_decoder" else (ids,)
  name = _PROJECTED[family]
  run = lambda c: build_model(c).apply(
      {"params": params}, *args, capture_intermediates=lambda m, _: m.name == name,
      mutable=["intermediates"])
  (out, state), (out_scaled, state_scaled) = run(cfg), run(scaled)
  (h,) = state["intermediates"][name]["__call__"]
  (h_scaled,) = state_scaled["intermediates"][name]["__call__"]
  if isinstance(h, tuple):  # a stack: (hidden states, its MoE layers' router statistics)
    h, h_scaled = h[0], h_scaled[0]
  np.testing.assert_array_equal(h_scaled, h)
  h = np.asarray(h, np.float64)
  w = (np.asarray(params["embedding"]["embedding"], np.float64).T if tie
       else np.asarray(params["output"]["kernel"], np.float64))
  bias = np.asarray(params["output_bias"], np.float64)
  if family == "encoder_only":
    bias = bias + np.asarray(params["mlm_bias"], np.float64)
  for logits, scale in ((out_scaled, cfg.d_model**-0.5), (out, 1.0)):
    np.testing.assert_allclose(logits["logits"], (h * scale) @ w + bias,
                               rtol=1e-5, atol=1e-5)


def test_token_types_default_to_type_zero():
  cfg = _cfg(family="encoder_only", num_token_types=2)
  params = nn_unbox(init_params(cfg, jax.random.PRNGKey(0)))
  ids = jnp.array([[5, 6, 7, 8]])
  model = build_model(cfg)
  zero = model.apply({"params": params}, ids)["logits"]
  np.testing.assert_array_equal(
      zero, model.apply({"params": params}, ids, token_types=jnp.zeros_like(ids))["logits"])
  other = model.apply({"params": params}, ids, token_types=jnp.ones_like(ids))["logits"]
  assert not np.allclose(zero, other)
  with pytest.raises(ConfigError, match="num_token_types"):
    _cfg(family="encoder_decoder", num_token_types=2)


def test_inputs_of_every_new_field_build():
  cfg = _cfg(family="encoder_decoder", position="sinusoidal", sinusoidal_layout="halves",
             scale_attention_logits=False, output_bias=True, embedding_norm="on",
             activation="geglu_tanh")
  params = init_params(cfg, jax.random.PRNGKey(0))
  out = build_model(cfg).apply({"params": nn_unbox(params)}, **dummy_inputs(cfg))
  assert np.isfinite(np.asarray(out["logits"])).all()


def test_hf_tokenizer_reads_a_sentencepiece_model_and_the_models_special_ids(tmp_path):
  import json

  import sentencepiece as spm

  from tfx_jax.data.tokenizer import HFTokenizer
  text = ["the cat sat on the mat", "a dog ran to the cat", "on the mat a dog sat"] * 20
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_prefix=str(tmp_path / "spiece"), vocab_size=20,
      model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
  path = str(tmp_path / "spiece.model")
  tok = HFTokenizer(path)  # T5's layout: pad 0, eos 1, unk 2, no bos
  assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.vocab_size) == (0, 1, 2, 20)
  ids = tok.encode("the cat sat")
  assert tok.decode(ids + [tok.eos_id]) == "the cat sat"
  # The imported model's config wins (decoder start = T5's pad).
  (tmp_path / "special_ids.json").write_text(json.dumps(
      {"eos_token_id": 1, "decoder_start_token_id": 0, "bos_token_id": None}))
  assert HFTokenizer(path).bos_id == 0
