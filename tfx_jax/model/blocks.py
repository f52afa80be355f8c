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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.layers.attention import Attention
from tfx_jax.model.layers.ffn import FeedForward
from tfx_jax.model.layers.moe import MixtureOfExperts, MoeSpec
from tfx_jax.model.layers.positions import RotarySpec
from tfx_jax.model.config import is_moe_layer, is_windowed


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
class LayerSpec:
  """Resolved (not raw-config) hyper-parameters of one stack's layers."""
  num_heads: int
  num_kv_heads: int
  head_dim: int
  d_ff: int
  act: Callable[[jax.Array], jax.Array]
  gated: bool
  norm: Callable[..., nn.Module]  # norm_factory(...) partial: norm(name=...)
  residual: Callable[..., jax.Array]
  final_norm: bool
  alpha: float  # DeepNorm residual scale; 1.0 otherwise
  qk_init: Any
  vo_gain: float  # DeepNorm beta; 1.0 otherwise
  vo_distribution: str  # "normal" for DeepNorm (Xavier-normal), else "uniform"
  use_bias: bool
  scale_logits: bool  # attention logits / sqrt(head_dim)
  dropout: float
  attention_dropout: float
  rotary: RotarySpec | None  # RoPE of self-attention; None: none
  cross_attention: bool
  dtype: Any
  causal: bool = False  # self-attention masks are causal (decoder stacks)
  # model.block='parallel': the branch function of the placement; None: sequential.
  parallel_branch: Callable[..., jax.Array] | None = None
  qk_norm: Callable[..., nn.Module] | None = None  # per-head norm of q and k
  attention_logit_softcap: float = 0.0
  gate_width: int = 0  # attention gates per head (0: none)
  attention_window: int = 0  # 0: every layer attends to every key
  global_every: int = 0
  moe: MoeSpec | None = None  # the mixture of experts of the MoE layers; None: dense
  moe_every: int = 1
  first_dense_layers: int = 0
  # The backend the program is compiled for ("cpu", "gpu", "tpu"): the
  # attention kernel and product form of every layer (models.build_model).
  platform: str = "cpu"

  def windowed(self, layer: int) -> bool:
    """Whether self-attention of layer ``layer`` (0-based) is windowed."""
    return is_windowed(layer, self.attention_window, self.global_every)

  def is_moe(self, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) has a mixture of experts as its FFN."""
    return self.moe is not None and is_moe_layer(layer, "moe", self.moe_every,
                                                 self.first_dense_layers)


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
  """
  spec: LayerSpec
  use_cache: bool = False
  deterministic: bool = True
  moe_layer: bool = False

  @nn.compact
  def __call__(self, x_BLD, mask, bias, positions_BL, encoded_BSD, cross_mask,
               cache_index, window_mask=None, segment_ids_BL=None, windowed=False):
    s = self.spec
    drop = lambda y: nn.Dropout(s.dropout)(y, deterministic=self.deterministic)

    def attention(name, rotary, causal=False):
      return Attention(
          num_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
          use_bias=s.use_bias, dropout=s.attention_dropout, rotary=rotary,
          qk_init=s.qk_init, vo_gain=s.vo_gain, vo_distribution=s.vo_distribution,
          scale_logits=s.scale_logits, use_cache=self.use_cache,
          deterministic=self.deterministic, dtype=s.dtype, causal=causal,
          qk_norm=s.qk_norm, logit_softcap=s.attention_logit_softcap,
          gate_width=s.gate_width, platform=s.platform, name=name)

    self_mask = mask
    if window_mask is not None:
      self_mask = (window_mask if windowed is True else mask if windowed is False
                   else jnp.where(windowed, window_mask, mask))
    self_attn = attention("self_attention", s.rotary, causal=s.causal)
    # The segment ids go with the mask only where it is their plain mask (no
    # window): a kernel may then rebuild it from them (model/layers/tpu_attention.py).
    sublayers = [("self_attention", lambda y: self_attn(
        y, mask=self_mask, bias=bias, positions_BL=positions_BL, cache_index=cache_index,
        segment_ids_BL=segment_ids_BL if window_mask is None else None))]
    if s.cross_attention:
      cross_attn = attention("cross_attention", None)
      sublayers.append(("cross_attention",
                        lambda y: cross_attn(y, encoded_BSD, mask=cross_mask)))
    ffn, stats = self._ffn(mask)
    sublayers.append(("ffn", ffn))
    if s.parallel_branch is None:
      for name, f in sublayers:
        x_BLD = s.residual(x_BLD, f, s.norm, drop, s.alpha, name)
    else:
      branches = [s.parallel_branch(x_BLD, f, s.norm, drop, name) for name, f in sublayers]
      x_BLD = x_BLD + sum(branches)
    return x_BLD.astype(s.dtype), stats.get("router")

  def _ffn(self, mask):
    """The FFN sublayer (the one dispatch point of ``model.ffn_type``, through
    ``moe_layer``), and a dict its router statistics land in when it runs."""
    s = self.spec
    stats = {}
    kernel_init = nn.initializers.variance_scaling(
        s.vo_gain**2, "fan_avg", s.vo_distribution)
    if not self.moe_layer:
      return FeedForward(
          d_ff=s.d_ff, act=s.act, gated=s.gated, use_bias=s.use_bias, dropout=s.dropout,
          deterministic=self.deterministic, kernel_init=kernel_init, dtype=s.dtype,
          platform=s.platform, name="ffn"), stats
    moe = MixtureOfExperts(
        s.moe, act=s.act, gated=s.gated, use_bias=s.use_bias, dropout=s.dropout,
        deterministic=self.deterministic, vo_gain=s.vo_gain,
        vo_distribution=s.vo_distribution, dtype=s.dtype, platform=s.platform, name="ffn")

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
    layer_cls = TransformerLayer
    if self.remat != "none":
      layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[self.remat],
                           prevent_cse=not self.scan_layers)
    windowed = [self.spec.windowed(i) for i in range(self.num_layers)]
    moe = [self.spec.is_moe(i) for i in range(self.num_layers)]
    if window_mask is None:
      windowed = [False] * self.num_layers
    args = (mask, bias, positions_BL, encoded_BSD, cross_mask, cache_index, window_mask,
            segment_ids_BL)
    if self.scan_layers:
      same = len(set(windowed)) == 1
      scanned = nn.scan(
          layer_cls, variable_axes={"params": 0, "cache": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast,) * (len(args) + same) + ((0,) if not same else ()),
          length=self.num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
      # Layers alike: one Python bool for all; alternating: one bool per layer.
      kind = windowed[0] if same else jnp.asarray(windowed)
      # model_config: a scanned stack's layers are all MoE or all dense.
      x_BLD, stats = scanned(self.spec, self.use_cache, self.deterministic, moe[0],
                             name="layers")(x_BLD, *args, kind)
    else:
      per_layer = []
      for i in range(self.num_layers):
        x_BLD, layer_stats = layer_cls(self.spec, self.use_cache, self.deterministic,
                                       moe[i], name=f"layer_{i}")(x_BLD, *args, windowed[i])
        per_layer.append(layer_stats)
      per_layer = [st for st in per_layer if st is not None]
      stats = jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer) if per_layer else None
    if self.spec.final_norm:
      x_BLD = self.spec.norm(name="final_norm")(x_BLD)
    return x_BLD, ({} if stats is None else stats)
