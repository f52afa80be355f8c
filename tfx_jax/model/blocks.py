"""Transformer layers and stacks: the ``model.norm_position`` axis lives here.

A layer is a list of sublayers F (self-attention, cross-attention, FFN), each
wrapped in a residual connection whose form is the norm placement (textbook chapter 004):

  post      x <- Norm(x + F(x))                     (Vaswani et al. 2017, BERT)
  pre       x <- x + F(Norm(x)), final Norm          (GPT-2, LLaMA)
  sandwich  x <- x + Norm(F(Norm(x))), final Norm    (CogView, Ding et al. 2021)
  deepnorm  x <- Norm(alpha * x + F(x))              (DeepNet, Wang et al. 2022)

Dropout is applied to F(x) before it joins the residual stream (the paper's
"residual dropout"); for sandwich it is applied after the inner norm.

The ``model.block`` axis: ``sequential`` applies the sublayers one after the
other, as above; ``parallel`` feeds every sublayer the same input and adds
their branches at once, x <- x + F1(Norm1(x)) + F2(Norm2(x)) (GPT-J, GPT-NeoX,
PaLM), with each sublayer's own norm; it needs a placement whose norms sit in
the branches (pre, sandwich).

``model.attention_window`` W > 0 restricts self-attention to keys within W
positions of the query (itself included: q - k < W, |q - k| < W in encoders),
as Mistral; with ``model.global_every`` k, layers k, 2k, ... (1-based) attend
to every key instead, as Gemma 2 alternates (k = 2).

The ``model.ffn_type`` axis: the FFN sublayer is one dense FFN, or in the MoE
layers (``model.moe_every``, ``model.first_dense_layers``) a mixture of
experts (``model/layers/moe.py``). Each layer returns its router statistics; a stack
returns them stacked over its MoE layers (``{}`` without any).

The ``model.mixer_pattern`` axis (``model/mixers.py``): the token mixer of the
first sublayer, self-attention (A) or Gated DeltaNet (D,
``model/layers/deltanet.py``, the sublayer ``deltanet``); a scanned stack with
both scans a :class:`PatternUnit` (the pattern's unit, its layers unrolled).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.model.layers.attention import QK_CLIP_COLLECTION, Attention, AttentionSpec
from tfx_jax.model.layers.deltanet import DeltaNetSpec, GatedDeltaNet
from tfx_jax.model.layers import probes
from tfx_jax.model.layers.ffn import FeedForward
from tfx_jax.model.layers.mla import MlaSpec, MultiHeadLatentAttention
from tfx_jax.model.layers.moe import MixtureOfExperts, MoeSpec
from tfx_jax.model.config import is_moe_layer, is_nope_layer, is_windowed
from tfx_jax.model.layers import value_residual as vres


# ------------------------------------------------------------- norm placement
def _post(x, f, norm, drop, alpha, name):
  return norm(name=f"{name}_norm")(x + drop(f(x)))


def _pre(x, f, norm, drop, alpha, name):
  return x + drop(f(norm(name=f"{name}_norm")(x)))


def _sandwich(x, f, norm, drop, alpha, name):
  return x + drop(norm(name=f"{name}_post_norm")(f(norm(name=f"{name}_norm")(x))))


def _deepnorm(x, f, norm, drop, alpha, name):
  # DeepNet uses LayerNorm here; with norm_type=rmsnorm this is the RMSNorm variant.
  return norm(name=f"{name}_norm")(alpha * x + drop(f(x)))


_RESIDUALS = {"post": _post, "pre": _pre, "sandwich": _sandwich, "deepnorm": _deepnorm}
# Placements whose residual stream is un-normalised at the top of the stack.
_FINAL_NORM = {"post": False, "pre": True, "sandwich": True, "deepnorm": False}


# What a sublayer adds to the stream, for the placements a parallel block takes
# (model_config.PARALLEL_NORM_POSITIONS): the same parameters as their
# sequential residuals above.
def _pre_branch(x, f, norm, drop, name):
  return drop(f(norm(name=f"{name}_norm")(x)))


def _sandwich_branch(x, f, norm, drop, name):
  return drop(norm(name=f"{name}_post_norm")(f(norm(name=f"{name}_norm")(x))))


_BRANCHES = {"pre": _pre_branch, "sandwich": _sandwich_branch}


@dataclasses.dataclass(frozen=True)
class FfnSpec:
  """The FFN sublayer of one stack's layers, resolved from ``model.*``: a dense
  FFN, or in the MoE layers a mixture of experts (``moe``)."""
  d_ff: int
  act: Callable[[jax.Array], jax.Array]
  gated: bool
  use_bias: bool
  dropout: float  # inside the FFN, after the activation
  vo_gain: float  # DeepNorm beta; 1.0 otherwise
  vo_distribution: str  # "normal" for DeepNorm (Xavier-normal), else "uniform"
  dtype: Any
  platform: str = "cpu"  # the backend compiled for (the products' form)
  moe: MoeSpec | None = None  # the mixture of experts of the MoE layers; None: dense
  up: Callable[[jax.Array], jax.Array] | None = None  # gated: x V's map (ffn_activation)
  moe_every: int = 1
  first_dense_layers: int = 0

  def is_moe(self, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) has a mixture of experts as its FFN."""
    return self.moe is not None and is_moe_layer(layer, "moe", self.moe_every,
                                                 self.first_dense_layers)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """Resolved (not raw-config) hyper-parameters of one stack's layers: the
  specs of its parts (``attention``, ``cross_attention``, ``ffn``, each passed
  whole to its layer) and how the layer joins them (norm placement, block,
  residual dropout, attention windows)."""
  attention: AttentionSpec | MlaSpec  # self-attention (model.attention_type)
  ffn: FfnSpec
  norm: Callable[..., nn.Module]  # norm_factory(...) partial: norm(name=...)
  residual: Callable[..., jax.Array]
  final_norm: bool
  alpha: float  # DeepNorm residual scale; 1.0 otherwise
  dropout: float  # residual dropout, on each sublayer's output
  dtype: Any
  # Attention to the encoder's output (decoder of encoder_decoder); None: none.
  cross_attention: AttentionSpec | None = None
  # model.block='parallel': the branch function of the placement; None: sequential.
  parallel_branch: Callable[..., jax.Array] | None = None
  attention_window: int = 0  # 0: every layer attends to every key
  global_every: int = 0
  # CompleteP's m_L^-alpha on every residual branch (model/parametrization.py);
  # 1.0: none.
  branch_multiplier: float = 1.0
  # ---- model.nope_every, model.value_residual ----
  nope_every: int = 0  # layers k, 2k, ... (1-based) skip RoPE; 0: none
  # V_n mixed with the first layer's values (layers/value_residual.py); None: off.
  value_residual: vres.ValueResidualSpec | None = None
  # ---- model.mixer_pattern: the pattern's unit ("A": every layer attention)
  # and the D layers' Gated DeltaNet (None without D layers).
  mixer_unit: str = "A"
  deltanet: DeltaNetSpec | None = None

  def windowed(self, layer: int) -> bool:
    """Whether self-attention of layer ``layer`` (0-based) is windowed."""
    return is_windowed(layer, self.attention_window, self.global_every)

  def nope(self, layer: int) -> bool:
    """Whether self-attention of layer ``layer`` (0-based) skips RoPE."""
    return is_nope_layer(layer, self.nope_every)

  def is_deltanet(self, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) mixes tokens with Gated DeltaNet."""
    return self.mixer_unit[layer % len(self.mixer_unit)] == "D"


def residual_for(norm_position: str):
  """The one dispatch point of ``model.norm_position``: (residual fn, final norm?)."""
  return _RESIDUALS[norm_position], _FINAL_NORM[norm_position]


def parallel_branch_for(block: str, norm_position: str):
  """The one dispatch point of ``model.block``: None (sequential) or the branch
  function of ``norm_position`` (validated by model_config)."""
  return _BRANCHES[norm_position] if block == "parallel" else None


class TransformerLayer(nn.Module):
  """Self-attention, optional cross-attention, FFN; scan-compatible signature.

  ``window_mask`` is the self-attention mask restricted to the window (None
  without ``model.attention_window``); ``windowed`` says whether this layer
  uses it (a bool, or a scanned boolean when the layers alternate). Returns
  (output, router statistics): ``RouterStats`` in a MoE layer, None else.

  ``nope`` (``model.nope_every``): this layer's self-attention has no RoPE.
  With ``model.value_residual`` the first argument and output is the pair
  (x, V_1) (layers/value_residual.py) and ``first`` says this is layer 1.
  ``deltanet_layer``: Gated DeltaNet in self-attention's place.
  """
  spec: LayerSpec
  use_cache: bool = False
  deterministic: bool = True
  moe_layer: bool = False
  deltanet_layer: bool = False

  @nn.compact
  def __call__(self, x_BLD, mask, bias, positions_BL, encoded_BSD, cross_mask,
               cache_index, window_mask=None, segment_ids_BL=None, windowed=False,
               nope=False, first=False):
    s = self.spec
    # model.value_residual: the values of layer 1 travel with the stream.
    value_hook, carried = None, {}
    if s.value_residual is not None:
      x_BLD, first_BLNK = x_BLD
      lambdas = vres.value_lambdas(self, s.value_residual)
      value_hook = lambda v: vres.mix_values(v, first_BLNK, first, lambdas, carried)
    drop = lambda y: nn.Dropout(s.dropout)(y, deterministic=self.deterministic)

    def attention(name, spec):
      # ---- model.attention_type: the layer of the spec specs.layer_spec resolved.
      layer = MultiHeadLatentAttention if isinstance(spec, MlaSpec) else Attention
      return layer(spec, use_cache=self.use_cache, deterministic=self.deterministic,
                   name=name)

    self_mask = mask
    if window_mask is not None:
      self_mask = (window_mask if windowed is True else mask if windowed is False
                   else jnp.where(windowed, window_mask, mask))
    self_attn = None if self.deltanet_layer else attention("self_attention", s.attention)
    # The segment ids go with the mask only where it is their plain mask (no
    # window): a kernel may then rebuild it from them (model/layers/tpu_attention.py).
    sublayers = [("self_attention", lambda y: self_attn(
        y, mask=self_mask, bias=bias, positions_BL=positions_BL, cache_index=cache_index,
        segment_ids_BL=segment_ids_BL if window_mask is None else None, nope=nope,
        value_hook=value_hook))]
    if self.deltanet_layer:  # model.mixer_pattern D: reset at each segment start
      mixer = GatedDeltaNet(s.deltanet, use_cache=self.use_cache,
                            deterministic=self.deterministic, name="deltanet")
      sublayers = [("deltanet", lambda y: mixer(y, cache_index=cache_index,
                                                segment_ids_BL=segment_ids_BL))]
    if s.cross_attention is not None:
      cross_attn = attention("cross_attention", s.cross_attention)
      sublayers.append(("cross_attention",
                        lambda y: cross_attn(y, encoded_BSD, mask=cross_mask)))
    ffn, stats = self._ffn(mask)
    sublayers.append(("ffn", ffn))
    if s.branch_multiplier != 1.0:
      scaled = lambda f: lambda y: f(y) * jnp.asarray(s.branch_multiplier, s.dtype)
      sublayers = [(name, scaled(f)) for name, f in sublayers]
    if probes.collecting(self):
      # The coordinate check: each branch's RMS as it joins the residual stream
      # (its multiplier applied, before dropout).
      probed = lambda name, f: lambda y: probes.sow_rms(self, f"{name}_output", f(y))
      sublayers = [(name, probed(name, f)) for name, f in sublayers]
    if s.parallel_branch is None:
      for name, f in sublayers:
        x_BLD = s.residual(x_BLD, f, s.norm, drop, s.alpha, name)
    else:
      branches = [s.parallel_branch(x_BLD, f, s.norm, drop, name) for name, f in sublayers]
      x_BLD = x_BLD + sum(branches)
    if s.value_residual is not None:
      return (x_BLD.astype(s.dtype), carried["first"]), stats.get("router")
    return x_BLD.astype(s.dtype), stats.get("router")

  def _ffn(self, mask):
    """The FFN sublayer (the one dispatch point of ``model.ffn_type``, through
    ``moe_layer``), and a dict its router statistics land in when it runs."""
    f = self.spec.ffn
    stats = {}
    kernel_init = nn.initializers.variance_scaling(
        f.vo_gain**2, "fan_avg", f.vo_distribution)
    if not self.moe_layer:
      return FeedForward(
          d_ff=f.d_ff, act=f.act, gated=f.gated, use_bias=f.use_bias, dropout=f.dropout,
          deterministic=self.deterministic, kernel_init=kernel_init, dtype=f.dtype,
          platform=f.platform, up=f.up, name="ffn"), stats
    moe = MixtureOfExperts(
        f.moe, act=f.act, gated=f.gated, use_bias=f.use_bias, dropout=f.dropout,
        deterministic=self.deterministic, vo_gain=f.vo_gain,
        vo_distribution=f.vo_distribution, dtype=f.dtype, platform=f.platform, up=f.up,
        name="ffn")

    def ffn(y_BLD):
      # A real token attends to itself; a padding token (segment 0) to nothing.
      real_BL = (jnp.ones(y_BLD.shape[:2], bool) if mask is None
                 else jnp.any(mask, axis=-1)[:, 0])
      out, stats["router"] = moe(y_BLD, real_BL)
      return out
    return ffn, stats


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _layer_class(remat: str, scan_layers: bool):
  """TransformerLayer, rematerialised under ``model.remat``'s policy."""
  if remat == "none":
    return TransformerLayer
  return nn.remat(TransformerLayer, policy=_REMAT_POLICIES[remat],
                  prevent_cse=not scan_layers)


def _stack_stats(per_layer):
  """Router statistics stacked over the layers that have them, or None."""
  per_layer = [st for st in per_layer if st is not None]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer) if per_layer else None


# The collections a scanned stack stacks per layer (QK-clip's per-head maxima too).
_SCANNED = {"params": 0, "cache": 0, "intermediates": 0, probes.COLLECTION: 0,
            QK_CLIP_COLLECTION: 0}


# ---- model.mixer_pattern: a scanned stack of mixed layers scans this unit.
class PatternUnit(nn.Module):
  """One repeat of the mixer pattern's unit, its layers (``layer_0``, ...)
  unrolled: the body a scanned stack of A and D layers scans. ``flags``: the
  layers' per-layer flags (windowed, nope, first), each one entry per layer
  of the unit (a tuple, or a scanned array where the repeats differ)."""
  spec: LayerSpec
  use_cache: bool = False
  deterministic: bool = True
  moe_layer: bool = False
  deltanet_layers: tuple[bool, ...] = ()
  remat: str = "none"

  @nn.compact
  def __call__(self, carry, mask, bias, positions_BL, encoded_BSD, cross_mask,
               cache_index, window_mask=None, segment_ids_BL=None, *flags):
    layer_cls = _layer_class(self.remat, True)
    per_layer = []
    for j, deltanet in enumerate(self.deltanet_layers):
      carry, stats = layer_cls(self.spec, self.use_cache, self.deterministic, self.moe_layer,
                               deltanet, name=f"layer_{j}")(
          carry, mask, bias, positions_BL, encoded_BSD, cross_mask, cache_index,
          window_mask, segment_ids_BL, *(flag[j] for flag in flags))
      per_layer.append(stats)
    return carry, _stack_stats(per_layer)


class Stack(nn.Module):
  """``num_layers`` layers (a Python loop or one ``nn.scan``) and the final norm.

  Returns (output, router statistics of the MoE layers stacked in layer order,
  ``{}`` without any).
  """
  spec: LayerSpec
  num_layers: int
  scan_layers: bool = False
  remat: str = "none"
  use_cache: bool = False
  deterministic: bool = True

  @nn.compact
  def __call__(self, x_BLD, mask, bias, positions_BL, encoded_BSD=None, cross_mask=None,
               cache_index=None, window_mask=None, segment_ids_BL=None):
    """``segment_ids_BL``: the ids ``mask`` was built from (see Attention)."""
    # The coordinate check's input layer: the embeddings as the stack reads them.
    probes.sow_rms(self, "embedding", x_BLD)
    layer_cls = _layer_class(self.remat, self.scan_layers)
    windowed = [self.spec.windowed(i) for i in range(self.num_layers)]
    moe = [self.spec.ffn.is_moe(i) for i in range(self.num_layers)]
    deltanet = [self.spec.is_deltanet(i) for i in range(self.num_layers)]
    if window_mask is None:
      windowed = [False] * self.num_layers
    # Per-layer flags (windowed, nope, first) and the carry: x, or (x, V_1)
    # with model.value_residual.
    flags = [windowed, [self.spec.nope(i) for i in range(self.num_layers)],
             [i == 0 and self.spec.value_residual is not None
              for i in range(self.num_layers)]]
    carry = x_BLD
    if self.spec.value_residual is not None:
      a = self.spec.attention
      carry = (x_BLD, vres.initial_values(x_BLD, a.num_kv_heads, a.head_dim, a.dtype))
    args = (mask, bias, positions_BL, encoded_BSD, cross_mask, cache_index, window_mask,
            segment_ids_BL)
    unit = len(self.spec.mixer_unit)
    if self.scan_layers and unit > 1:
      carry, stats = self._scan_units(carry, args, flags, moe[0], deltanet[:unit])
    elif self.scan_layers:
      same = [len(set(flag)) == 1 for flag in flags]
      scanned = nn.scan(
          layer_cls, variable_axes=_SCANNED,
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast,) * len(args) + tuple(
              nn.broadcast if alike else 0 for alike in same),
          length=self.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      # Layers alike: one Python bool for all; alternating: one bool per layer.
      kinds = [flag[0] if alike else jnp.asarray(flag) for flag, alike in zip(flags, same)]
      # model_config: a scanned stack's layers are all MoE or all dense.
      carry, stats = scanned(self.spec, self.use_cache, self.deterministic, moe[0],
                             deltanet[0], name="layers")(carry, *args, *kinds)
    else:
      per_layer = []
      for i in range(self.num_layers):
        carry, layer_stats = layer_cls(self.spec, self.use_cache, self.deterministic,
                                       moe[i], deltanet[i], name=f"layer_{i}")(
                                           carry, *args, *(flag[i] for flag in flags))
        per_layer.append(layer_stats)
      stats = _stack_stats(per_layer)
    x_BLD = carry[0] if self.spec.value_residual is not None else carry
    if self.spec.final_norm:
      x_BLD = self.spec.norm(name="final_norm")(x_BLD)
    return x_BLD, ({} if stats is None else stats)

  def _scan_units(self, carry, args, flags, moe_layer, deltanet_unit):
    """``nn.scan`` over the repeats of the mixer pattern's unit (``model.mixers``:
    the depth is a multiple of its length); router statistics in layer order."""
    unit = len(deltanet_unit)
    repeats = self.num_layers // unit
    flags_RU = [np.asarray(flag, bool).reshape(repeats, unit) for flag in flags]
    same = [bool((f == f[0]).all()) for f in flags_RU]
    scanned = nn.scan(
        PatternUnit, variable_axes=_SCANNED,
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args) + tuple(
            nn.broadcast if alike else 0 for alike in same),
        length=repeats, metadata_params={nn.PARTITION_NAME: "layers"})
    kinds = [tuple(bool(w) for w in f[0]) if alike else jnp.asarray(f)
             for f, alike in zip(flags_RU, same)]
    carry, stats = scanned(self.spec, self.use_cache, self.deterministic, moe_layer,
                           tuple(deltanet_unit), self.remat, name="layers")(
                               carry, *args, *kinds)
    # [repeats, unit, ...] -> [layers, ...] (model_config: all MoE or all dense).
    stats = None if stats is None else jax.tree.map(
        lambda a: a.reshape(-1, *a.shape[2:]), stats)
    return carry, stats
