"""The validated model configuration: one frozen dataclass, checked once.

Flow: ``configs/*.py`` (a locked ``ConfigDict``) -> :func:`model_config_from_dict`
-> :class:`ModelConfig` -> Linen modules. Every ablation axis is a ``Literal``
field validated here, before anything is traced or compiled; layers receive the
resolved values (constants, callables), never the config strings.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal, Mapping, get_args

from tfx_jax.core import typed_config
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import config_attention, config_ffn, config_moe, mixers, parametrization
from tfx_jax.model.config_moe import is_moe_layer, moe_layers  # noqa: F401 (re-exported)
from tfx_jax.model.config_attention import AttentionType
from tfx_jax.model.parametrization import Parametrization

Family = Literal["encoder_decoder", "decoder_only", "encoder_only"]
NormPosition = Literal["post", "pre", "sandwich", "deepnorm"]
# dyt: Dynamic Tanh, gamma * tanh(alpha x) + beta (Zhu et al. 2025), where a norm stands.
NormType = Literal["layernorm", "rmsnorm", "dyt"]
# Per-head norm of queries and keys before RoPE (Dehghani et al. 2023; Qwen3, OLMo 2).
QKNorm = Literal["none", "layernorm", "rmsnorm"]
# What the query-key norm normalises: each head's vector on its own (one gain
# per head dimension, shared by the heads: Qwen3), or all heads' queries (keys)
# as one vector (one gain per element: OLMo 2, OLMoE).
QKNormHeads = Literal["per_head", "joint"]
# sequential: x + F2(N2(x + F1(N1(x)))); parallel: x + F1(N1(x)) + F2(N2(x)) (GPT-J, PaLM).
Block = Literal["sequential", "parallel"]
# A sigmoid gate on each head's attention output, from the layer input (Qiu et al. 2025).
AttentionGate = Literal["none", "headwise", "elementwise"]
# swiglu_oss: gpt-oss's clamped SwiGLU (model/layers/ffn.py, config_ffn.py).
Activation = Literal["relu", "gelu", "gelu_tanh", "swish", "glu", "reglu", "geglu",
                     "geglu_tanh", "swiglu", "bilinear", "swiglu_oss"]
Position = Literal["sinusoidal", "learned", "t5_bias", "rope", "alibi", "none"]
# Names of the policies in blocks._REMAT_POLICIES (docs/configs.md, "Sizes, dtype, schedules and optimizers"); every
# choice here must have a policy there.
Remat = Literal["none", "full", "dots", "dots_with_no_batch_dims"]
DType = Literal["float32", "bfloat16"]
# "auto": encoder_only with post-norm only (BERT), the behaviour before the field.
EmbeddingNorm = Literal["auto", "on", "off"]
SinusoidalLayout = Literal["interleaved", "halves"]
# The token embedding table's initialisation: Glorot-uniform over (vocab,
# d_model), or N(0, 1/d_model) as Vaswani et al. (tensor2tensor, fairseq), which
# with ``scale_embeddings`` gives unit-variance embeddings.
EmbeddingInit = Literal["xavier", "normal"]
# The learned position table's start (model.position='learned'): small, N(0,
# 0.02^2) as GPT-2 and BERT; token, the token table's own distribution
# (embedding_init) and scale (scale_embeddings), so that positions start the
# size of the tokens they are added to, as every other scheme can.
LearnedPositionInit = Literal["small", "token"]
# RoPE context extension: positions interpolated (Chen et al. 2023), the base
# raised ("NTK-aware"), or YaRN (Peng et al. 2023); see model/layers/positions.py.
RopeScaling = Literal["none", "linear", "ntk", "yarn"]
# The FFN's place: one dense FFN, or a mixture of experts (model/layers/moe.py).
FfnType = Literal["dense", "moe"]
# Router scores: softmax over the experts (Switch, Mixtral) or a sigmoid per
# expert (DeepSeek-V3).
Router = Literal["softmax", "sigmoid"]
# Load balancing: the auxiliary loss (Switch / GShard; its weight is
# train.moe_aux_loss), the auxiliary-loss-free bias (DeepSeek-V3), or none.
MoeBalance = Literal["aux_loss", "bias", "none"]
# ResFormer's value residual (model/layers/value_residual.py): none, V_n <- 0.5
# V_n + 0.5 V_1 (fixed), or two learned weights per layer (learned).
ValueResidual = Literal["none", "fixed", "learned"]



@dataclasses.dataclass(frozen=True)
class Samples:
  """Values of a numeric axis that the ablation-grid tests try (through the type:
  ``Annotated[float, Samples(0.0, 5.0)]``); the first is the default (off)."""
  values: tuple


SoftCap = Annotated[float, Samples((0.0, 5.0))]  # c * tanh(x / c); 0 = off
Window = Annotated[int, Samples((0, 2))]  # sliding-window width; 0 = full attention
GlobalEvery = Annotated[int, Samples((0, 2))]  # every k-th layer full; 0 = none
# Expert capacity C = ceil(factor * tokens * k / experts); 0 = dropless.
CapacityFactor = Annotated[float, Samples((0.0, 2.0))]
NopeEvery = Annotated[int, Samples((0, 2))]  # layers k, 2k, ... without RoPE; 0 = none
# ---- model.mixer_pattern (Gated DeltaNet hybrids; model/mixers.py) ----
# One character per layer, repeated to the depth: A full attention, D Gated
# DeltaNet; "" = every layer A.
MixerPattern = Annotated[str, Samples(("", "D"))]

# Norm placements whose norms sit inside each sublayer's branch: the ones a
# parallel block can use (post and deepnorm normalise the sum itself).
PARALLEL_NORM_POSITIONS = ("pre", "sandwich")

GATED_ACTIVATIONS = ("glu", "reglu", "geglu", "geglu_tanh", "swiglu", "bilinear",
                     "swiglu_oss")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything the model code needs, validated. See ``configs/`` for defaults."""

  family: Family = "decoder_only"
  norm_position: NormPosition = "pre"
  norm_type: NormType = "layernorm"
  activation: Activation = "gelu"
  # activation='swiglu_oss' only: its clamp and sigmoid gain (gpt-oss: 7, 1.702)
  swiglu_limit: float = 7.0
  swiglu_alpha: float = 1.702
  position: Position = "learned"
  num_layers: int = 2
  num_encoder_layers: int = 0  # encoder_decoder only; 0 = num_layers
  num_decoder_layers: int = 0  # encoder_decoder only; 0 = num_layers
  d_model: int = 64
  num_heads: int = 4
  num_kv_heads: int = 0  # 0 = num_heads (multi-head); 1 = MQA; else GQA
  # Width of each attention head; 0 = d_model // num_heads. > 0: heads of that
  # width whatever d_model is (q, k, v [D, H, head_dim], out [H, head_dim, D]),
  # as Qwen3 (1024 = 16 x 64, heads of 128) and Gemma 2 (2304, 8 heads of 256).
  head_dim: int = 0
  d_ff: int = 0  # ungated FFN width; 0 = 4 * d_model. Gated: see ffn_dim
  gated_d_ff: int = 0  # gated FFN width as given (unmatched); 0 = derived from d_ff
  ff_multiple_of: int = 8  # the derived gated width is rounded up to this (LLaMA: 256)
  dropout: float = 0.0
  attention_dropout: float = 0.0
  vocab_size: int = 256
  max_len: int = 512
  tie_embeddings: bool = True
  scale_embeddings: bool = False  # token embeddings x sqrt(d_model) (Vaswani et al.)
  embedding_init: EmbeddingInit = "xavier"  # the token table: xavier, normal N(0, 1/d_model)
  learned_position_init: LearnedPositionInit = "small"
  use_bias: bool = True
  # Divide attention logits by sqrt(d_k), d_k the head width (Vaswani et al.); T5
  # does not (folded into its initialisation).
  scale_attention_logits: bool = True
  output_bias: bool = False  # a learned bias on the vocabulary logits (BART, Marian)
  # The final hidden state x d_model^-0.5 before the vocabulary projection (T5 1.0:
  # Mesh TensorFlow's rescaling for an output projection shared with the embedding).
  scale_output: bool = False
  num_token_types: int = 0  # > 0: BERT's token-type (segment A/B) embeddings
  embedding_norm: EmbeddingNorm = "auto"  # a norm after embeddings + positions
  sinusoidal_layout: SinusoidalLayout = "interleaved"  # paper; "halves": [sin | cos]
  norm_eps: float = 1e-6
  rope_base: float = 10000.0
  # Fraction of each head's dimensions that RoPE rotates: the first int(d_k *
  # fraction) of the head width d_k (see rope_dims); the rest pass through unrotated.
  rope_fraction: float = 1.0
  rope_scaling: RopeScaling = "none"
  rope_scaling_factor: float = 1.0  # s: the context is extended s times
  rope_original_max_len: int = 0  # yarn: the context length the model was trained at
  # yarn: the ramp's ends rounded outwards (transformers' truncate; gpt-oss: False)
  rope_yarn_truncate: bool = True
  t5_num_buckets: int = 32
  t5_max_distance: int = 128
  num_classes: int = 0  # > 0 adds a classification head
  scan_layers: bool = False
  remat: Remat = "none"
  dtype: DType = "float32"  # compute dtype; params stay float32
  # ---- stability and attention knobs (docs/axes.md) ----------
  qk_norm: QKNorm = "none"
  qk_norm_heads: QKNormHeads = "per_head"
  attention_logit_softcap: SoftCap = 0.0  # Gemma 2: 50
  final_logit_softcap: SoftCap = 0.0  # Gemma 2: 30
  block: Block = "sequential"
  attention_window: Window = 0  # keys within this distance of the query (itself included)
  global_every: GlobalEvery = 0  # with a window: layers k, 2k, ... (1-based) attend fully
  attention_gate: AttentionGate = "none"
  # ---- mixture of experts (model/layers/moe.py, config_moe.py; docs/axes.md) ----
  ffn_type: FfnType = "dense"
  num_experts: int = 8
  experts_per_token: int = 2  # k of the top-k routing
  shared_experts: int = 0  # experts every token passes through (DeepSeekMoE)
  # Hidden width of the shared experts together; 0 = shared_experts x expert_dim.
  # Qwen3-Next: one shared expert of shared_expert_intermediate_size.
  shared_expert_d_ff: int = 0
  shared_expert_gate: bool = False  # their output x sigmoid(x w), w [D] (Qwen3-Next)
  # Hidden width of each expert; 0 = the dense FFN's (ffn_dim), as Switch and
  # Mixtral, whose experts are copies of the dense FFN. > 0: as given.
  expert_d_ff: int = 0
  router: Router = "softmax"
  # The k chosen scores renormalised to sum to 1 (Mixtral, Qwen3-30B-A3B); off:
  # the raw scores weigh the experts (OLMoE, Switch).
  router_norm_topk: bool = True
  # The routed experts' weights x this, after any renormalisation (DeepSeek-V3's
  # routed_scaling_factor: 2.5); the shared experts are not scaled.
  router_scale: float = 1.0
  # Group-limited routing (DeepSeek-V3's n_group / topk_group: 8 / 4): the k
  # experts come from the router_topk_groups best of router_groups groups of
  # consecutive experts (config_moe.py); 1 / 1: plain top-k.
  router_groups: int = 1
  router_topk_groups: int = 1
  router_use_bias: bool = False  # a learned bias on the router logits (gpt-oss)
  moe_every: int = 1  # layers k, 2k, ... (1-based) are MoE, the others dense
  first_dense_layers: int = 0  # the first layers stay dense (DeepSeek-V3: 3)
  moe_balance: MoeBalance = "aux_loss"
  # u of DeepSeek-V3's bias update b_i <- b_i + u sign(mean load - load_i).
  router_bias_rate: float = 0.001
  capacity_factor: CapacityFactor = 0.0
  # ---- hyperparameter transfer (model/parametrization.py; docs/axes.md) ----
  parametrization: Parametrization = "sp"
  mup_base_d_model: int = 0  # the proxy's width (mup, completep)
  mup_base_layers: int = 0  # the proxy's layers per stack (completep)
  depth_alpha: float = 1.0  # completep: branches x m_L^-alpha (0.5: depth-muP)
  mup_output_multiplier: float = 1.0  # the readout's alpha_out (MuReadout's output_mult)
  mup_attention_scale: float = 0.0  # logits q.k x scale / d_head; 0 = sqrt(base head width)
  # ---- attention sinks, value residual, interleaved NoPE (docs/axes.md) ----
  # A learned logit per query head in every softmax's denominator (gpt-oss).
  attention_sinks: bool = False
  value_residual: ValueResidual = "none"
  nope_every: NopeEvery = 0  # with rope: layers k, 2k, ... (1-based) have none (Llama 4: 4)
  nope_temperature: bool = False  # Llama 4's query temperature on those layers
  # ---- attention type (model/config_attention.py, model/layers/mla.py) ----
  # standard (today's, GQA/MQA through num_kv_heads) or mla (DeepSeek-V2/V3's
  # multi-head latent attention); mla_*: its widths, 0 = derived (config_attention).
  attention_type: AttentionType = "standard"
  mla_kv_rank: int = 0  # d_c, the KV latent; 0 = 4 x mla_nope_dim
  mla_q_rank: int = 0  # d_c', the query latent; 0 = no query compression
  mla_rope_dim: int = 0  # d_R, decoupled RoPE width; 0 = d_nope/2 (even) with rope
  mla_nope_dim: int = 0  # d_nope per head; 0 = the head width
  mla_v_dim: int = 0  # d_v per head; 0 = mla_nope_dim
  # ---- token mixers: Gated DeltaNet hybrids (model/mixers.py; docs/axes.md) ----
  mixer_pattern: MixerPattern = ""  # e.g. "DDDA" (Qwen3-Next 3:1); "" = all attention
  deltanet_heads: int = 0  # 0 = num_heads
  deltanet_head_dim: int = 0  # d_k per head; 0 = the attention head width
  # Value heads (Qwen3-Next's linear_num_value_heads, a multiple of the key heads
  # deltanet_heads, which each serve as many in turn) and their width d_v; 0 = as keys.
  deltanet_v_heads: int = 0
  deltanet_v_head_dim: int = 0
  deltanet_conv: int = 4  # short causal depthwise conv width; 0 = off
  deltanet_chunk: int = 64  # tokens per chunk of the chunked form (fla: 64)

  # ---- derived quantities -------------------------------------------------
  @property
  def attention_head_dim(self) -> int:
    """Width of each attention head: ``head_dim``, or d_model / num_heads when 0."""
    return self.head_dim or self.d_model // self.num_heads

  @property
  def rope_dims(self) -> int:
    """Dimensions of each head that RoPE rotates, int(head width * rope_fraction):
    GPT-NeoX's ``rotary_ndims = int(head_size * rotary_pct)``; with
    ``attention_type='mla'`` the width of its decoupled RoPE part, d_R."""
    if self.attention_type == "mla":
      return config_attention.mla_dims(self).rope_dim
    return int(self.attention_head_dim * self.rope_fraction)

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def gated(self) -> bool:
    return self.activation in GATED_ACTIVATIONS

  @property
  def ffn_dim(self) -> int:
    """Hidden size of the FFN.

    ``d_ff`` is the width of the plain (ungated) FFN, 4 * d_model when 0, for
    every activation, so that the activation axis compares models of equal
    size. Gated variants (Shazeer 2020) have three matrices instead of two;
    the paper compares them at matched parameters and compute by taking 2/3
    of the plain width (3072 -> 2048). Here 2/3 of ``d_ff`` is rounded up to
    ``ff_multiple_of`` as LLaMA does (multiple of 256: 4 * 4096 -> 11008).
    ``gated_d_ff`` > 0 asks for an unmatched gated width instead; ungated
    activations ignore it.
    """
    plain = self.d_ff or 4 * self.d_model
    if not self.gated:
      return plain
    if self.gated_d_ff:
      return self.gated_d_ff
    m = self.ff_multiple_of
    return m * -(-(2 * plain // 3) // m)

  @property
  def expert_dim(self) -> int:
    """Hidden width of each expert (and of each shared expert): ``expert_d_ff``,
    or the dense FFN's width ``ffn_dim`` when 0 (every expert a copy of the
    dense FFN's shape, so top-1 routing has the dense model's active size)."""
    return self.expert_d_ff or self.ffn_dim

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers or self.num_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def embed_scale(self) -> float:
    # Vaswani et al. 2017, section 3.4: "we multiply those weights by
    # sqrt(d_model)", whatever is added to them (fairseq does the same for every
    # position scheme). GPT-2, BERT and LLaMA do not scale. Its own field, so that
    # the position axis changes positions only.
    return math.sqrt(self.d_model) if self.scale_embeddings else 1.0

  @property
  def has_embedding_norm(self) -> bool:
    """``embedding_norm`` resolved: "auto" is BERT's embedding LayerNorm, i.e. on
    for encoder_only with post-norm (whose stream is otherwise un-normalised at
    the first layer's input) and off elsewhere."""
    if self.embedding_norm == "auto":
      return self.family == "encoder_only" and self.norm_position == "post"
    return self.embedding_norm == "on"


def is_windowed(layer: int, attention_window: int, global_every: int) -> bool:
  """Whether layer ``layer`` (0-based) attends within ``model.attention_window``:
  every layer when ``global_every`` is 0, else all but layers k, 2k, ... (1-based),
  which attend fully (Gemma 2: k = 2, layer 0 windowed). False without a window."""
  return bool(attention_window) and not (global_every and (layer + 1) % global_every == 0)


def is_nope_layer(layer: int, nope_every: int) -> bool:
  """Whether layer ``layer`` (0-based) has no RoPE (``model.nope_every`` k):
  layers k, 2k, ... (1-based), Llama 4's ``no_rope_layers`` at interval 4,
  (i + 1) % 4 == 0."""
  return bool(nope_every) and (layer + 1) % nope_every == 0


def deepnorm_constants(family: str, num_encoder_layers: int,
                       num_decoder_layers: int) -> dict[str, tuple[float, float]]:
  """DeepNorm (alpha, beta) per stack, from DeepNet (Wang et al. 2022), Table 1.

  encoder-only / decoder-only with N layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4).
  encoder-decoder with N encoder and M decoder layers:
    encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
    decoder alpha = (3M)^(1/4),          beta = (12M)^(-1/4).
  Returns ``{"encoder": (alpha, beta), "decoder": (alpha, beta)}`` for the
  stacks the family has.
  """
  n, m = num_encoder_layers, num_decoder_layers
  if family == "encoder_decoder":
    return {
        "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** (1 / 4), (12 * m) ** (-1 / 4)),
    }
  if family == "encoder_only":
    return {"encoder": ((2 * n) ** (1 / 4), (8 * n) ** (-1 / 4))}
  return {"decoder": ((2 * m) ** (1 / 4), (8 * m) ** (-1 / 4))}


_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}


def validate(cfg: ModelConfig, *, seq_len: int | None = None) -> ModelConfig:
  """Checks cross-field constraints; returns ``cfg`` unchanged if valid."""

  def positive(name, allow_zero=False):
    v = getattr(cfg, name)
    if v < 0 or (v == 0 and not allow_zero):
      raise ConfigError(
          f"model.{name} must be {'>= 0' if allow_zero else '> 0'}, got {v}.")

  for name in ("num_layers", "d_model", "num_heads", "vocab_size", "max_len",
               "ff_multiple_of", "t5_num_buckets", "t5_max_distance"):
    positive(name)
  for name in ("num_encoder_layers", "num_decoder_layers", "num_kv_heads", "head_dim",
               "d_ff", "gated_d_ff", "num_classes", "num_token_types"):
    positive(name, allow_zero=True)
  for name in ("dropout", "attention_dropout"):
    v = getattr(cfg, name)
    if not 0.0 <= v < 1.0:
      raise ConfigError(f"model.{name} must be in [0, 1), got {v}.")
  if cfg.norm_eps <= 0:
    raise ConfigError(f"model.norm_eps must be > 0, got {cfg.norm_eps}.")
  if cfg.rope_base <= 1:
    raise ConfigError(f"model.rope_base must be > 1, got {cfg.rope_base}.")
  if not cfg.head_dim and cfg.d_model % cfg.num_heads:
    raise ConfigError(
        f"model.d_model={cfg.d_model} is not divisible by model.num_heads="
        f"{cfg.num_heads}; choose num_heads among the divisors of d_model, or set "
        "model.head_dim (the width of each head).")
  if cfg.num_heads % cfg.kv_heads:
    raise ConfigError(
        f"model.num_kv_heads={cfg.num_kv_heads} does not divide model.num_heads="
        f"{cfg.num_heads}; use a divisor of num_heads (1 = multi-query, "
        f"{cfg.num_heads} or 0 = multi-head).")
  config_attention.validate(cfg)  # model.attention_type and its mla_* fields
  mla = cfg.attention_type == "mla"  # its RoPE width is checked there
  if cfg.position == "rope" and not mla and cfg.attention_head_dim % 2:
    width = (f"model.head_dim = {cfg.head_dim}" if cfg.head_dim else
             f"d_model/num_heads = {cfg.d_model}/{cfg.num_heads} = "
             f"{cfg.attention_head_dim}")
    raise ConfigError(f"model.position='rope' needs an even head dimension, but {width}.")
  if cfg.position != "rope":
    for name in ("rope_fraction", "rope_scaling", "rope_scaling_factor",
                 "rope_original_max_len", "rope_yarn_truncate"):
      if getattr(cfg, name) != _FIELDS[name].default:
        raise InactiveSetting(
            f"model.{name}", _FIELDS[name].default,
            f"model.{name}={getattr(cfg, name)!r} needs model.position='rope' (position "
            f"is {cfg.position!r}); leave it at {_FIELDS[name].default!r} or use rope.")
  if cfg.position != "learned" and cfg.learned_position_init != "small":
    raise InactiveSetting(
        "model.learned_position_init", "small",
        f"model.learned_position_init={cfg.learned_position_init!r} sets the learned "
        f"position table's start; model.position is {cfg.position!r}, which has none: "
        "leave it at 'small' or use model.position='learned'.")
  if not 0.0 < cfg.rope_fraction <= 1.0:
    raise ConfigError(f"model.rope_fraction must be in (0, 1], got {cfg.rope_fraction}.")
  if cfg.position == "rope" and (cfg.rope_dims == 0 or cfg.rope_dims % 2):
    raise ConfigError(
        f"model.rope_fraction={cfg.rope_fraction} rotates int({cfg.attention_head_dim} x "
        f"{cfg.rope_fraction}) = {cfg.rope_dims} dimensions of each head; RoPE rotates "
        "pairs, so choose a fraction that gives an even number > 0.")
  if cfg.rope_scaling_factor < 1.0:
    raise ConfigError(
        f"model.rope_scaling_factor must be >= 1, got {cfg.rope_scaling_factor}.")
  if cfg.rope_scaling == "none" and cfg.rope_scaling_factor != 1.0:
    raise InactiveSetting(
        "model.rope_scaling_factor", 1.0,
        f"model.rope_scaling_factor={cfg.rope_scaling_factor} has no effect with "
        "model.rope_scaling='none'; choose one of: "
        f"{', '.join(get_args(RopeScaling)[1:])}.")
  positive("rope_original_max_len", allow_zero=True)
  if cfg.rope_scaling == "yarn" and not cfg.rope_original_max_len:
    raise ConfigError(
        "model.rope_scaling='yarn' needs model.rope_original_max_len > 0, the context "
        "length the model was trained at (YaRN scales each frequency by how many "
        "turns it makes over that length).")
  if cfg.rope_scaling != "yarn" and cfg.rope_original_max_len:
    raise InactiveSetting(
        "model.rope_original_max_len", 0,
        f"model.rope_original_max_len={cfg.rope_original_max_len} is read by "
        f"model.rope_scaling='yarn' only (rope_scaling is {cfg.rope_scaling!r}); "
        "leave it at 0.")
  if cfg.rope_scaling != "yarn" and not cfg.rope_yarn_truncate:
    raise InactiveSetting(
        "model.rope_yarn_truncate", True,
        "model.rope_yarn_truncate=False is read by model.rope_scaling='yarn' only "
        f"(rope_scaling is {cfg.rope_scaling!r}); leave it at True.")
  if cfg.rope_scaling == "ntk" and cfg.rope_dims <= 2:
    raise ConfigError(
        "model.rope_scaling='ntk' raises the base to the power r/(r-2) of the rotated "
        f"width r, which needs r > 2; this model rotates {cfg.rope_dims} dimensions "
        "per head.")
  if cfg.position == "t5_bias" and cfg.t5_num_buckets < 4:
    raise ConfigError(
        f"model.t5_num_buckets must be >= 4, got {cfg.t5_num_buckets}.")
  if cfg.family != "encoder_decoder" and (cfg.num_encoder_layers or
                                           cfg.num_decoder_layers):
    raise InactiveSetting(
        "model.num_encoder_layers" if cfg.num_encoder_layers else "model.num_decoder_layers",
        0,
        "model.num_encoder_layers / model.num_decoder_layers apply to "
        f"family='encoder_decoder' only (family is {cfg.family!r}); "
        "set model.num_layers instead.")
  if cfg.family == "encoder_decoder" and cfg.num_classes:
    raise ConfigError(
        "model.num_classes (a classification head) is available for "
        "family='decoder_only' and 'encoder_only', not 'encoder_decoder'.")
  if cfg.num_token_types and cfg.family == "encoder_decoder":
    raise ConfigError(
        "model.num_token_types (token-type embeddings) is available for "
        "family='decoder_only' and 'encoder_only', not 'encoder_decoder'.")
  if cfg.qk_norm == "none" and cfg.qk_norm_heads != "per_head":
    raise InactiveSetting(
        "model.qk_norm_heads", "per_head",
        f"model.qk_norm_heads={cfg.qk_norm_heads!r} says what model.qk_norm normalises, "
        "which is 'none': set model.qk_norm (layernorm, rmsnorm) or leave it at 'per_head'.")
  for name in ("attention_logit_softcap", "final_logit_softcap"):
    if getattr(cfg, name) < 0:
      raise ConfigError(f"model.{name} must be >= 0 (0 = off), got {getattr(cfg, name)}.")
  positive("attention_window", allow_zero=True)
  positive("global_every", allow_zero=True)
  if cfg.global_every and not cfg.attention_window:
    raise InactiveSetting(
        "model.global_every", 0,
        f"model.global_every={cfg.global_every} chooses which layers attend fully "
        "among windowed ones; set model.attention_window > 0 as well (0 = every "
        "layer attends fully).")
  if cfg.block == "parallel" and cfg.norm_position not in PARALLEL_NORM_POSITIONS:
    raise ConfigError(
        f"model.block='parallel' sums the sublayers of one input, each through its "
        f"own norm: model.norm_position must be one of {', '.join(PARALLEL_NORM_POSITIONS)}"
        f" (got {cfg.norm_position!r}, which normalises the residual stream itself).")
  config_ffn.validate(cfg)  # model.swiglu_*
  config_moe.validate(cfg)
  _validate_attention_2026(cfg)
  parametrization.validate(cfg)
  mixers.validate(cfg)  # model.mixer_pattern, model.deltanet_*
  capacity = position_capacity(cfg)
  if seq_len is not None and capacity is not None and seq_len > capacity:
    raise ConfigError(
        f"sequence length {seq_len} is longer than model.max_len={cfg.max_len}, "
        "which learned absolute positions cannot represent; raise model.max_len "
        "or use a relative scheme (model.position = rope, alibi, t5_bias).")
  return cfg


def _validate_attention_2026(cfg: ModelConfig) -> None:
  """model.value_residual, model.nope_every and model.nope_temperature: in
  range, and set only where they change the model (model.attention_sinks
  composes with every setting)."""
  stacks = {"decoder_only": (cfg.decoder_layers,), "encoder_only": (cfg.encoder_layers,),
            "encoder_decoder": (cfg.encoder_layers, cfg.decoder_layers)}[cfg.family]
  if cfg.value_residual != "none" and min(stacks) < 2:
    raise ConfigError(
        f"model.value_residual={cfg.value_residual!r} mixes the first layer's values "
        f"into layers 2, 3, ...; a stack of this model has {min(stacks)} layer, so it "
        "would change nothing: use at least 2 layers per stack, or "
        f"model.value_residual='none' (choices: {', '.join(get_args(ValueResidual))}).")
  if cfg.nope_every < 0:
    raise ConfigError(f"model.nope_every must be >= 0 (0 = off), got {cfg.nope_every}.")
  if cfg.nope_every and cfg.position != "rope":
    raise InactiveSetting(
        "model.nope_every", 0,
        f"model.nope_every={cfg.nope_every} removes RoPE from layers k, 2k, ...; "
        f"model.position is {cfg.position!r}, which has no RoPE: leave it at 0 or use "
        f"model.position='rope' (choices: {', '.join(get_args(Position))}).")
  if cfg.nope_every > max(stacks):
    raise ConfigError(
        f"model.nope_every={cfg.nope_every} is more than the {max(stacks)} layers of "
        "every stack, so no layer would be without RoPE: choose k in 1.."
        f"{max(stacks)}, or 0 (off).")
  if cfg.nope_temperature and not cfg.nope_every:
    raise InactiveSetting(
        "model.nope_temperature", False,
        "model.nope_temperature=True scales the queries of the layers without RoPE; "
        "model.nope_every is 0, so there are none: set model.nope_every > 0 (Llama 4: "
        "4) or leave it at False.")


def model_config_from_dict(d: Mapping[str, Any] | Any, *,
                           seq_len: int | None = None) -> ModelConfig:
  """Builds and validates a :class:`ModelConfig` from ``config.model``.

  Raises :class:`ConfigError` naming the field, the value and the valid
  choices for unknown keys, wrong types, out-of-range values and incompatible
  combinations (:class:`InactiveSetting` for a setting that would have no
  effect). Nothing is traced or compiled here.
  """
  return validate(typed_config.read(ModelConfig, "model", d), seq_len=seq_len)


def position_capacity(cfg: ModelConfig) -> int | None:
  """The longest sequence the position scheme can represent, or None (no limit).

  Learned absolute positions end at ``model.max_len``; every other scheme
  (sinusoidal, relative biases, rotary, none) extends to any length.
  """
  return cfg.max_len if cfg.position == "learned" else None
