"""The three Transformer families as Flax Linen modules.

``build_model(cfg, deterministic=..., use_cache=...)`` is the entry point. Train,
eval and cached-generation modules of one config share the same parameter tree; they only
differ in the ``deterministic`` (dropout off) and ``use_cache`` (KV cache) flags,
as in the Flax WMT example.

Inputs follow the batch contract: int32 token ids with 0 = padding,
``segment_ids`` (0 = padding, 1..k = packed document) and ``positions``
(index within the document). Every family returns a dict with ``logits``
[B, L, V] (the textbook chapter's Generator returns log_softmax of these; we keep logits
and take log_softmax in the loss / decoder), plus ``class_logits`` [B, C] when
``num_classes > 0``, and ``moe`` ({stack: RouterStats} of its MoE layers,
model/layers/moe.py) when ``model.ffn_type='moe'``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.blocks import Stack
from tfx_jax.model.layers import products
from tfx_jax.model.layers.attention import softcap
from tfx_jax.model.layers.norms import norm_factory
from tfx_jax.model.layers.positions import (LearnedPositions, T5RelativeBias, alibi_bias,
                                            sinusoidal)
from tfx_jax.model import parametrization
from tfx_jax.model.config import ModelConfig
# The config's resolution into layer specs (model/specs.py), re-exported: the
# families' and the tests' one import.
from tfx_jax.model.specs import (_DTYPES, PositionScheme, base_glorot,  # noqa: F401
                                 layer_spec, learned_position_init, position_scheme,
                                 qk_norm_for, readout_input, token_init)

# A new classification head starts near uniform predictions, as in GPT and BERT
# (normal, std 0.02): on top of a pretrained stack, whose final hidden states
# are large, a Xavier head starts out confidently wrong and recovers slowly.
CLASSIFIER_INIT = nn.initializers.normal(0.02)


def _with_router_stats(out: dict, **stacks) -> dict:
  """``out`` with ``moe`` = the router statistics of the stacks that have MoE layers."""
  moe = {name: stats for name, stats in stacks.items() if stats}
  return {**out, "moe": moe} if moe else out


# ------------------------------------------------------------------- helpers
def _segments(ids_BL, segment_ids, cache_index):
  """The segment ids a causal stack's mask is built from (ones where none are
  given); None while decoding from a cache, whose mask is the cache's."""
  if cache_index is not None:
    return None
  return _defaults(ids_BL, segment_ids, None)[0]


def attention_mask(q_seg_BL, k_seg_BS, *, causal: bool):
  """[B, 1, L, S] boolean: same segment, key not padding, and (causal) key <= query."""
  mask = (q_seg_BL[:, :, None] == k_seg_BS[:, None, :]) & (k_seg_BS[:, None, :] > 0)
  if causal:
    L, S = q_seg_BL.shape[1], k_seg_BS.shape[1]
    mask = mask & (jnp.arange(S)[None, :] <= jnp.arange(L)[:, None])[None]
  return mask[:, None]


def window_mask(mask_BhLS, q_pos_BL, k_pos_BS, window: int, *, causal: bool):
  """``mask`` and keys within ``window`` positions of the query, itself
  included: q - k < window (causal; later keys are masked already), |q - k| <
  window (bidirectional). None when ``window`` is 0 (no windowed layer)."""
  if not window:
    return None
  dist_BLS = q_pos_BL[:, :, None] - k_pos_BS[:, None, :]
  if not causal:
    dist_BLS = jnp.abs(dist_BLS)
  return mask_BhLS & (dist_BLS < window)[:, None]


def _defaults(inputs_BL, segment_ids, positions):
  B, L = inputs_BL.shape
  if segment_ids is None:
    segment_ids = jnp.ones((B, L), jnp.int32)
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
  return segment_ids, positions


class CacheIndex(nn.Module):
  """Where the next tokens go in the KV cache (a ``cache`` variable).

  The initialising call (``model.init`` with use_cache=True and inputs as long as
  the cache should be) creates the cache and returns ``(None, capacity)``;
  later calls return ``(index, capacity)`` and advance the index.
  """

  @nn.compact
  def __call__(self, length: int):
    initialized = self.has_variable("cache", "index")
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    # Only the shape of this marker is used: it records the cache capacity.
    marker = self.variable("cache", "capacity", lambda: jnp.zeros((length,), jnp.int8))
    if not initialized:
      return None, length
    i = index.value
    index.value = i + length
    return i, marker.value.shape[0]


class _Family(nn.Module):
  """Shared pieces: embeddings, absolute positions, relative biases, output."""
  cfg: ModelConfig
  deterministic: bool = True
  use_cache: bool = False  # a KV cache for token-by-token generation
  platform: str = "cpu"  # the backend compiled for (build_model resolves it)

  def _make_embedder(self):
    cfg = self.cfg
    return nn.Embed(
        cfg.vocab_size, cfg.d_model, dtype=_DTYPES[cfg.dtype], name="embedding",
        embedding_init=nn.with_logical_partitioning(token_init(cfg), ("vocab", "embed")))

  def _make_positions(self, name):
    cfg = self.cfg
    if position_scheme(cfg).absolute == "learned":
      init, scale = learned_position_init(cfg)
      return LearnedPositions(cfg.max_len, cfg.d_model, init=init, scale=scale, name=name)
    return None

  def _make_bias(self, name, *, bidirectional):
    cfg = self.cfg
    if position_scheme(cfg).bias == "t5":
      return T5RelativeBias(cfg.num_heads, bidirectional,
                            init_std=parametrization.embedding_width(cfg)**-0.5,
                            num_buckets=cfg.t5_num_buckets,
                            max_distance=cfg.t5_max_distance, name=name)
    return None

  def _make_embed_norm(self, name):
    """The embedding norm (``model.embedding_norm``), or None."""
    cfg = self.cfg
    if not cfg.has_embedding_norm:
      return None
    return norm_factory(cfg.norm_type, cfg.norm_eps, _DTYPES[cfg.dtype])(name=name)

  def _make_token_types(self):
    """BERT's token-type (segment A / B) table, added to every token."""
    cfg = self.cfg
    if not cfg.num_token_types:
      return None
    return nn.Embed(
        cfg.num_token_types, cfg.d_model, dtype=_DTYPES[cfg.dtype], name="token_types",
        embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02),
                                                    (None, "embed")))

  def embed_tokens(self, ids_BL):
    """Token embeddings before positions are added: E[id], x sqrt(d_model) with
    ``scale_embeddings``. The same for every position scheme."""
    return self.embedding(ids_BL) * self.cfg.embed_scale

  def _embed(self, ids_BL, positions_BL, learned, norm=None, token_types=None):
    """Stack input: token embeddings + absolute positions (+ token types), then
    the embedding norm (if any), then dropout, in BERT's order (LayerNorm, then
    dropout). ``token_types`` [B, L] defaults to type 0 (BERT's single segment)."""
    cfg = self.cfg
    x = self.embed_tokens(ids_BL)
    kind = position_scheme(cfg).absolute
    if kind == "sinusoidal":
      x = x + sinusoidal(positions_BL, cfg.d_model, cfg.sinusoidal_layout)
    elif kind == "learned":
      x = x + learned(positions_BL)
    if cfg.num_token_types:
      if token_types is None:
        token_types = jnp.zeros_like(ids_BL)
      x = x + self.token_types(token_types)
    x = x.astype(_DTYPES[cfg.dtype])
    if norm is not None:
      x = norm(x)
    return self.embed_dropout(x, deterministic=self.deterministic)

  def _bias(self, t5, q_pos_BL, k_pos_BS):
    kind = position_scheme(self.cfg).bias
    if kind == "t5":
      return t5(q_pos_BL, k_pos_BS)
    if kind == "alibi":
      return alibi_bias(q_pos_BL, k_pos_BS, self.cfg.num_heads)
    return None

  def _causal_inputs(self, ids_BL, segment_ids, positions, t5):
    """Mask, windowed mask, bias, positions and cache index of a causal
    (decoder) stack."""
    segment_ids, positions = _defaults(ids_BL, segment_ids, positions)
    index = None
    if self.use_cache:
      index, capacity = self.decode_index(ids_BL.shape[1])
    window = self.cfg.attention_window
    if index is None:
      mask = attention_mask(segment_ids, segment_ids, causal=True)
      windowed = window_mask(mask, positions, positions, window, causal=True)
      return mask, windowed, self._bias(t5, positions, positions), positions, None
    B, L = ids_BL.shape
    positions = jnp.broadcast_to(index + jnp.arange(L, dtype=jnp.int32), (B, L))
    k_pos = jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (B, capacity))
    mask = (k_pos[:, None, :] <= positions[:, :, None])[:, None]
    windowed = window_mask(mask, positions, k_pos, window, causal=True)
    return mask, windowed, self._bias(t5, positions, k_pos), positions, index

  def _setup_common(self):
    """Token embedding, embedding dropout and (untied) output projection."""
    cfg = self.cfg
    self.embedding = self._make_embedder()
    self.embed_dropout = nn.Dropout(cfg.dropout)
    if not cfg.tie_embeddings:
      self.output = nn.Dense(
          cfg.vocab_size, use_bias=False, dtype=_DTYPES[cfg.dtype],
          dot_general=products.dot_general_for(_DTYPES[cfg.dtype], self.platform),
          kernel_init=nn.with_logical_partitioning(
              base_glorot(cfg.vocab_size, parametrization.embedding_width(cfg),
                          cfg.d_model), ("embed", "vocab")))
    if cfg.output_bias:
      self.output_bias = self.param("output_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,))

  def _logits(self, x_BLD, head_bias=None):
    """Final projection to the vocabulary: tied (x E^T) or its own matrix, of x
    d_model^-0.5 with ``model.scale_output`` (T5 1.0), plus the output bias with
    ``model.output_bias`` (and BERT's MLM bias, ``head_bias``), then soft-capped
    with ``model.final_logit_softcap`` (Gemma 2: 30 tanh(logits / 30))."""
    # Over tokens flattened to one axis: a plain [T, D] x [D, V] product (no
    # transposed copy of the [T, V] gradient for the weight's on CPU).
    x_TD = x_BLD.reshape(-1, x_BLD.shape[-1])
    if self.cfg.scale_output:
      x_TD = x_TD * self.cfg.d_model**-0.5
    x_TD = readout_input(self.cfg, x_TD)
    if self.cfg.tie_embeddings and products.uses_fast_products(_DTYPES[self.cfg.dtype],
                                                               self.platform):
      # x E^T through the bf16 product (Embed.attend's own product is bf16 -> bf16).
      dtype = _DTYPES[self.cfg.dtype]
      logits = products.matmul(x_TD.astype(dtype), self.embedding.embedding.astype(dtype).T,
                               jnp.float32)
    elif self.cfg.tie_embeddings:
      logits = self.embedding.attend(x_TD).astype(jnp.float32)
    else:
      logits = self.output(x_TD).astype(jnp.float32)
    logits = logits.reshape(*x_BLD.shape[:-1], logits.shape[-1])
    if self.cfg.output_bias:
      logits = logits + self.output_bias
    if head_bias is not None:
      logits = logits + head_bias
    return softcap(logits, self.cfg.final_logit_softcap)

  def _stack(self, stack, n, *, cross_attention, use_cache):
    cfg = self.cfg
    return Stack(layer_spec(cfg, stack, cross_attention=cross_attention,
                            platform=self.platform), n,
                 scan_layers=cfg.scan_layers, remat=cfg.remat, use_cache=use_cache,
                 deterministic=self.deterministic, name=stack)

  def _setup_single_stack(self, *, causal: bool):
    """Embedding, positions and the one stack of decoder-only / encoder-only."""
    cfg = self.cfg
    self._setup_common()
    self.learned = self._make_positions("positions")
    self.token_types = self._make_token_types()
    self.embed_norm = self._make_embed_norm("embed_norm")
    self.t5 = self._make_bias("relative_bias", bidirectional=not causal)
    if causal:
      self.decoder = self._stack("decoder", cfg.decoder_layers, cross_attention=False,
                                 use_cache=self.use_cache)
    else:
      self.encoder = self._stack("encoder", cfg.encoder_layers, cross_attention=False,
                                 use_cache=False)


class DecoderOnly(_Family):
  """GPT / LLaMA: causal LM; optional classification head on the last real token."""

  def setup(self):
    cfg = self.cfg
    self._setup_single_stack(causal=True)
    self.decode_index = CacheIndex()
    if cfg.num_classes:
      self.classifier = nn.Dense(
          cfg.num_classes, name="classifier",
          kernel_init=nn.with_logical_partitioning(CLASSIFIER_INIT, ("embed", "classes")))

  def __call__(self, inputs, segment_ids=None, positions=None, token_types=None):
    cfg = self.cfg
    mask, windowed, bias, positions, index = self._causal_inputs(
        inputs, segment_ids, positions, self.t5)
    x = self._embed(inputs, positions, self.learned, self.embed_norm, token_types)
    x, router = self.decoder(x, mask, bias, positions, cache_index=index,
                             window_mask=windowed,
                             segment_ids_BL=_segments(inputs, segment_ids, index))
    out = _with_router_stats({"logits": self._logits(x)}, decoder=router)
    if self.cfg.num_classes:
      seg, _ = _defaults(inputs, segment_ids, None)
      # GPT-1 fine-tuning: the last real token's final hidden state.
      last_B = jnp.maximum(jnp.sum(seg > 0, axis=1) - 1, 0)
      h_BD = jnp.take_along_axis(x, last_B[:, None, None], axis=1)[:, 0]
      out["class_logits"] = self.classifier(readout_input(cfg, h_BD.astype(jnp.float32)))
    return out


class EncoderOnly(_Family):
  """BERT: bidirectional encoder, masked-LM head, optional classification head."""

  def setup(self):
    cfg = self.cfg
    self._setup_single_stack(causal=False)
    norm = norm_factory(cfg.norm_type, cfg.norm_eps, _DTYPES[cfg.dtype])
    dense = lambda n, axes, name: nn.Dense(
        n, dtype=_DTYPES[cfg.dtype], name=name, use_bias=cfg.use_bias,
        dot_general=products.dot_general_for(_DTYPES[cfg.dtype], self.platform),
        kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), axes))
    # BERT's MLM transform: dense + gelu + norm, then the (tied) vocab projection + bias.
    self.mlm_dense = dense(cfg.d_model, ("embed", "embed_out"), "mlm_dense")
    self.mlm_norm = norm(name="mlm_norm")
    self.mlm_bias = self.param("mlm_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("vocab",)), (cfg.vocab_size,))
    if cfg.num_classes:
      self.pooler = dense(cfg.d_model, ("embed", "embed_out"), "pooler")
      self.classifier = nn.Dense(
          cfg.num_classes, name="classifier",
          kernel_init=nn.with_logical_partitioning(CLASSIFIER_INIT, ("embed", "classes")))

  def __call__(self, inputs, segment_ids=None, positions=None, token_types=None):
    cfg = self.cfg
    segment_ids, positions = _defaults(inputs, segment_ids, positions)
    mask = attention_mask(segment_ids, segment_ids, causal=False)
    windowed = window_mask(mask, positions, positions, cfg.attention_window, causal=False)
    bias = self._bias(self.t5, positions, positions)
    x = self._embed(inputs, positions, self.learned, self.embed_norm, token_types)
    x, router = self.encoder(x, mask, bias, positions, window_mask=windowed,
                             segment_ids_BL=segment_ids)
    h = self.mlm_norm(jax.nn.gelu(self.mlm_dense(x), approximate=False))
    out = _with_router_stats({"logits": self._logits(h, self.mlm_bias)}, encoder=router)
    if cfg.num_classes:
      # BERT's pooler: tanh(dense) of the first token (BOS / [CLS]).
      pooled = jnp.tanh(self.pooler(x[:, 0]))
      out["class_logits"] = self.classifier(readout_input(cfg, pooled.astype(jnp.float32)))
    return out


class EncoderDecoder(_Family):
  """The original Transformer; ``encode`` and ``decode`` are callable on their own.

  One shared vocabulary: the encoder and decoder share the input embedding;
  ``tie_embeddings`` also ties the output projection to it (the paper's
  three-way tying).
  """

  def setup(self):
    cfg = self.cfg
    self._setup_common()
    self.encoder_learned = self._make_positions("encoder_positions")
    self.decoder_learned = self._make_positions("decoder_positions")
    self.encoder_embed_norm = self._make_embed_norm("encoder_embed_norm")
    self.decoder_embed_norm = self._make_embed_norm("decoder_embed_norm")
    self.encoder_t5 = self._make_bias("encoder_relative_bias", bidirectional=True)
    self.decoder_t5 = self._make_bias("decoder_relative_bias", bidirectional=False)
    self.encoder = self._stack("encoder", cfg.encoder_layers, cross_attention=False,
                               use_cache=False)
    self.decoder = self._stack("decoder", cfg.decoder_layers, cross_attention=True,
                               use_cache=self.use_cache)
    self.decode_index = CacheIndex()

  def encode(self, inputs, inputs_segment_ids=None, inputs_positions=None):
    """Source ids [B, S] -> encoder output [B, S, D]."""
    return self._encode(inputs, inputs_segment_ids, inputs_positions)[0]

  def _encode(self, inputs, inputs_segment_ids=None, inputs_positions=None):
    """(encoder output, the encoder's router statistics)."""
    if inputs_segment_ids is None:
      inputs_segment_ids = (inputs > 0).astype(jnp.int32)
    seg, pos = _defaults(inputs, inputs_segment_ids, inputs_positions)
    mask = attention_mask(seg, seg, causal=False)
    windowed = window_mask(mask, pos, pos, self.cfg.attention_window, causal=False)
    bias = self._bias(self.encoder_t5, pos, pos)
    x = self._embed(inputs, pos, self.encoder_learned, self.encoder_embed_norm)
    return self.encoder(x, mask, bias, pos, window_mask=windowed, segment_ids_BL=seg)

  def decode(self, decoder_inputs, encoded, inputs_segment_ids,
             decoder_segment_ids=None, decoder_positions=None, encoder_router=None):
    """Target prefix [B, L] attending to ``encoded`` -> {"logits": [B, L, V]}
    (and ``moe``, with ``encoder_router`` the encoder's statistics, if any)."""
    mask, windowed, bias, pos, index = self._causal_inputs(
        decoder_inputs, decoder_segment_ids, decoder_positions, self.decoder_t5)
    B, L = decoder_inputs.shape
    q_seg = jnp.ones((B, L), jnp.int32) if (decoder_segment_ids is None or
                                            index is not None) else decoder_segment_ids
    # Cross-attention: target segment k sees the real tokens of source segment k
    # only (packed pairs stay apart). Unpacked targets are segment 1, as are
    # unpacked sources (inputs > 0).
    cross_mask = attention_mask(q_seg, inputs_segment_ids, causal=False)
    x = self._embed(decoder_inputs, pos, self.decoder_learned, self.decoder_embed_norm)
    x, router = self.decoder(x, mask, bias, pos, encoded, cross_mask, index, windowed,
                             _segments(decoder_inputs, decoder_segment_ids, index))
    return _with_router_stats({"logits": self._logits(x)}, encoder=encoder_router or {},
                              decoder=router)

  def __call__(self, inputs, decoder_inputs, inputs_segment_ids=None,
               decoder_segment_ids=None, inputs_positions=None, decoder_positions=None):
    if inputs_segment_ids is None:
      inputs_segment_ids = (inputs > 0).astype(jnp.int32)
    encoded, router = self._encode(inputs, inputs_segment_ids, inputs_positions)
    return self.decode(decoder_inputs, encoded, inputs_segment_ids, decoder_segment_ids,
                       decoder_positions, encoder_router=router)


_FAMILIES = {"decoder_only": DecoderOnly, "encoder_only": EncoderOnly,
             "encoder_decoder": EncoderDecoder}


def build_model(cfg: ModelConfig, *, deterministic: bool = True,
                use_cache: bool = False, platform: str | None = None) -> nn.Module:
  """The one dispatch point of ``model.family``.

  ``platform`` is the backend the program is compiled for ("cpu", "gpu",
  "tpu"), which picks the attention kernel and product form of the layers;
  None: this host's default backend. A run's set-up passes its mesh's
  (``run_setup.ShardedRun``), so a step compiled ahead of time for a TPU on a
  CPU host (``python -m tfx_jax.compile``) is the TPU's program.
  """
  if platform is None:
    platform = jax.default_backend()
  return _FAMILIES[cfg.family](cfg, deterministic=deterministic, use_cache=use_cache,
                               platform=platform)


def stack_layer_params(params, unit: int = 1):
  """Loop-layout parameters (``layer_0``, ``layer_1``, ...) in the ``scan_layers``
  layout (one ``layers`` subtree with a leading layer axis).

  Lets a checkpoint trained with ``scan_layers=False`` be used by the same
  model with ``scan_layers=True``. ``unit`` > 1 (``model.mixer_pattern``'s
  unit length, ``blocks.PatternUnit``): ``layers/layer_j`` stacks layers j,
  j + unit, ... along the leading axis of the unit's repeats.
  """
  params = dict(nn.unbox(params))
  stacked = lambda layers: jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  for stack in ("encoder", "decoder"):
    if stack in params:
      tree = dict(params[stack])
      names = sorted((k for k in tree if k.startswith("layer_")),
                     key=lambda k: int(k.split("_")[1]))
      if names:
        layers = [tree.pop(k) for k in names]
        tree["layers"] = (stacked(layers) if unit == 1 else
                          {f"layer_{j}": stacked(layers[j::unit]) for j in range(unit)})
      params[stack] = tree
  return params


def dummy_inputs(cfg: ModelConfig, batch: int = 1, length: int = 8) -> dict:
  """Keyword inputs of the right structure for ``init`` / ``eval_shape``."""
  ids = jnp.ones((batch, length), jnp.int32)
  if cfg.family == "encoder_decoder":
    return {"inputs": ids, "decoder_inputs": ids}
  return {"inputs": ids}


def init_params(cfg: ModelConfig, rng, batch: int = 1, length: int = 8):
  """Initialised (boxed, logically-annotated) parameters."""
  model = build_model(cfg)
  return model.init({"params": rng}, **dummy_inputs(cfg, batch, length))["params"]
