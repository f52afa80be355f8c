"""The validated config resolved into what the layers take: the position
scheme, the embeddings' and readout's initialisation under each
parametrization, and one stack's :class:`LayerSpec` (attention, FFN, norm
placement). Each axis has its one dispatch point here or in the layer it
names; ``families.py`` builds the modules from these.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.blocks import FfnSpec, LayerSpec, parallel_branch_for, residual_for
from tfx_jax.model.layers.attention import AttentionSpec, xavier
from tfx_jax.model.layers.deltanet import DeltaNetSpec
from tfx_jax.model.layers.ffn import ffn_activation
from tfx_jax.model.layers.mla import mla_spec
from tfx_jax.model.layers.moe import moe_spec
from tfx_jax.model.layers.norms import JointHeads, norm_factory
from tfx_jax.model.layers.positions import RotarySpec, rotary_spec
from tfx_jax.model.layers.value_residual import ValueResidualSpec
from tfx_jax.model import mixers, parametrization
from tfx_jax.model.config import ModelConfig, deepnorm_constants
from tfx_jax.model.config_attention import mla_dims

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class PositionScheme:
  """``model.position`` resolved once: what goes where."""
  absolute: str | None  # "sinusoidal" | "learned" | None: added to embeddings
  rotary: RotarySpec | None  # rotate q/k inside attention
  bias: str | None  # "t5" | "alibi" | None: added to attention logits


def position_scheme(cfg: ModelConfig) -> PositionScheme:
  """The one dispatch point of ``model.position``; RoPE's fields (base, rotated
  fraction, scaling) are resolved here into the constants attention uses."""
  rotary = None
  if cfg.position == "rope":
    rotary = rotary_spec(cfg.rope_dims, cfg.rope_base, cfg.rope_scaling,
                         cfg.rope_scaling_factor, cfg.rope_original_max_len,
                         yarn_truncate=cfg.rope_yarn_truncate)
  return {
      "sinusoidal": PositionScheme("sinusoidal", None, None),
      "learned": PositionScheme("learned", None, None),
      "rope": PositionScheme(None, rotary, None),
      "t5_bias": PositionScheme(None, None, "t5"),
      "alibi": PositionScheme(None, None, "alibi"),
      "none": PositionScheme(None, None, None),
  }[cfg.position]


def token_init(cfg: ModelConfig):
  """The token table's initializer (``model.embedding_init``): Glorot-uniform
  over (vocab, d_model), or N(0, 1/d_model) as tensor2tensor and fairseq.

  Under mup/completep the table is an input weight, whose initialisation does
  not change with width: the base width's (``parametrization.embedding_width``).
  """
  width = parametrization.embedding_width(cfg)
  if cfg.embedding_init == "normal":
    return nn.initializers.normal(width ** -0.5)
  return base_glorot(cfg.vocab_size, width, cfg.d_model)


def base_glorot(fixed: int, base: int, actual: int):
  """Glorot-uniform for a [fixed, actual] or [actual, fixed] matrix with the
  variance of the base width's, 2 / (fixed + base): the initialisation of an
  input weight or a readout under muP (constant in width). Exactly
  ``xavier_uniform`` where the base is the actual width."""
  if base == actual:
    return nn.initializers.xavier_uniform()
  return nn.initializers.variance_scaling((fixed + actual) / (fixed + base), "fan_avg",
                                          "uniform")


def learned_position_init(cfg: ModelConfig):
  """The one dispatch point of ``model.learned_position_init``: (initializer,
  scale) of the learned position table.

  small: N(0, 0.02^2), unscaled (GPT-2, BERT). token: every entry drawn as the
  token table's are (``token_init`` at the token table's shape, so Glorot's
  fan is the vocabulary's, not max_len's) and scaled as tokens are
  (``embed_scale``): positions start the size of the tokens they are added to.
  """
  if cfg.learned_position_init == "small":
    return nn.initializers.normal(0.02), 1.0
  tokens = token_init(cfg)

  def like_tokens(key, shape, dtype=jnp.float32):
    # Glorot's bound sqrt(6 / (fan_in + fan_out)) of the (vocab, d_model) table.
    table_shape = (cfg.vocab_size, parametrization.embedding_width(cfg))
    if cfg.embedding_init == "xavier":
      limit = (6.0 / sum(table_shape)) ** 0.5
      return jax.random.uniform(key, shape, dtype, -limit, limit)
    return tokens(key, shape, dtype)

  return like_tokens, cfg.embed_scale


def readout_input(cfg: ModelConfig, x):
  """The readout's input times muP's mup_output_multiplier / m (``MuReadout``);
  ``x`` itself under sp (no multiply: bitwise today's program)."""
  multiplier = parametrization.output_multiplier(cfg)
  return x if multiplier == 1.0 else x * jnp.asarray(multiplier, x.dtype)


# The one dispatch point of ``model.attention_gate``: gates per head.
_GATE_WIDTHS = {"none": lambda k: 0, "headwise": lambda k: 1, "elementwise": lambda k: k}


def qk_norm_for(cfg: ModelConfig):
  """The one dispatch point of ``model.qk_norm_heads``: the query-key norm
  factory (None without ``model.qk_norm``), per head or over all heads jointly."""
  if cfg.qk_norm == "none":
    return None
  make = norm_factory(cfg.qk_norm, cfg.norm_eps, _DTYPES[cfg.dtype], axis="kv")
  return make if cfg.qk_norm_heads == "per_head" else functools.partial(JointHeads, make=make)


def layer_spec(cfg: ModelConfig, stack: str, *, cross_attention: bool,
               platform: str = "cpu") -> LayerSpec:
  """Resolves the config into the hyper-parameters of one stack's layers, for
  a program compiled for ``platform`` (``build_model``)."""
  act, gated, up = ffn_activation(cfg.activation, cfg.swiglu_limit, cfg.swiglu_alpha)
  residual, final_norm = residual_for(cfg.norm_position)
  alpha, beta, dist = 1.0, 1.0, "uniform"  # Xavier-uniform, as in the textbook chapters' code
  qk_init = xavier(1.0, "uniform")
  if cfg.norm_position == "deepnorm":
    alpha, beta = deepnorm_constants(cfg.family, cfg.encoder_layers,
                                     cfg.decoder_layers)[stack]
    # DeepNet: Xavier-normal, gain beta on FFN / value / output, gain 1 on q, k.
    dist = "normal"
    qk_init = xavier(1.0, "normal")
  dtype = _DTYPES[cfg.dtype]
  attention = AttentionSpec(
      num_heads=cfg.num_heads, num_kv_heads=cfg.kv_heads, head_dim=cfg.attention_head_dim,
      use_bias=cfg.use_bias, dropout=cfg.attention_dropout,
      rotary=position_scheme(cfg).rotary, qk_init=qk_init, vo_gain=beta,
      vo_distribution=dist, dtype=dtype, scale_logits=cfg.scale_attention_logits,
      causal=stack == "decoder", qk_norm=qk_norm_for(cfg),
      logit_softcap=cfg.attention_logit_softcap,
      gate_width=_GATE_WIDTHS[cfg.attention_gate](cfg.attention_head_dim),
      platform=platform, query_scale=parametrization.query_scale(cfg),
      # model.attention_sinks, model.nope_temperature
      sinks=cfg.attention_sinks, nope_temperature=cfg.nope_temperature)
  # ---- model.attention_type: its one dispatch point (cross-attention stays standard).
  self_attention = attention
  if cfg.attention_type == "mla":
    self_attention = mla_spec(cfg, attention, _GATE_WIDTHS[cfg.attention_gate](
        mla_dims(cfg).v_dim))
  ffn = FfnSpec(
      d_ff=cfg.ffn_dim, act=act, gated=gated, use_bias=cfg.use_bias, dropout=cfg.dropout,
      up=up, vo_gain=beta, vo_distribution=dist, dtype=dtype, platform=platform,
      moe=moe_spec(cfg, router_init_scale=parametrization.router_init_scale(cfg)),
      moe_every=cfg.moe_every, first_dense_layers=cfg.first_dense_layers)
  return LayerSpec(
      attention=self_attention, ffn=ffn,
      norm=norm_factory(cfg.norm_type, cfg.norm_eps, dtype),
      residual=residual, final_norm=final_norm, alpha=alpha, dropout=cfg.dropout,
      dtype=dtype,
      # Cross-attention: the same heads, without positions, not causal.
      cross_attention=(dataclasses.replace(attention, rotary=None, causal=False)
                       if cross_attention else None),
      parallel_branch=parallel_branch_for(cfg.block, cfg.norm_position),
      attention_window=cfg.attention_window, global_every=cfg.global_every,
      branch_multiplier=parametrization.branch_multiplier(
          cfg, cfg.encoder_layers if stack == "encoder" else cfg.decoder_layers),
      # model.nope_every, model.value_residual
      nope_every=cfg.nope_every, value_residual=value_residual_spec(cfg),
      **_mixer_fields(cfg, stack, attention, platform))


def value_residual_spec(cfg: ModelConfig) -> ValueResidualSpec | None:
  """The one dispatch point of ``model.value_residual``."""
  return {"none": None, "fixed": ValueResidualSpec(learned=False),
          "learned": ValueResidualSpec(learned=True)}[cfg.value_residual]


# ---- model.mixer_pattern: the D layers' Gated DeltaNet (model/mixers.py) ----
def _mixer_fields(cfg: ModelConfig, stack: str, attention: AttentionSpec,
                  platform: str) -> dict:
  """The LayerSpec fields of ``model.mixer_pattern``: the pattern's unit and the
  DeltaNet spec (projections initialised as the attention's), or nothing for a
  stack of attention layers only (model.mixers.validate: decoder_only)."""
  if stack != "decoder" or not mixers.has_deltanet(cfg):
    return {}
  return dict(mixer_unit=mixers.mixer_unit(cfg.mixer_pattern), deltanet=DeltaNetSpec(
      num_heads=mixers.deltanet_heads(cfg), head_dim=mixers.deltanet_head_dim(cfg),
      v_heads=mixers.deltanet_v_heads(cfg), v_head_dim=mixers.deltanet_v_head_dim(cfg),
      conv_width=cfg.deltanet_conv, chunk=cfg.deltanet_chunk, use_bias=cfg.use_bias,
      qk_init=attention.qk_init, vo_init=xavier(attention.vo_gain, attention.vo_distribution),
      norm_eps=cfg.norm_eps, dtype=attention.dtype, platform=platform))
