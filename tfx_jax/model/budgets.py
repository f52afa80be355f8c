"""What decoding a model holds in memory: the KV cache per token and the
recurrent state per sequence, from the config alone (no shapes traced).

A fair comparison says what it holds equal (docs/fair-comparisons.md,
"Matched budgets"): parameters, training FLOPs per token (both counted from
the parameter shapes, ``run/footprint.py``) or the bytes a decoder caches.
These are the third: per layer of the decoding stack (a decoder-only model's
layers, an encoder-decoder's decoder; an encoder-only model decodes nothing
and caches nothing), each by its kind (``layer_kinds``):

  attention (standard: MHA, GQA, MQA): keys and values of every kv head,
      2 x num_kv_heads x head_dim values per token (``Attention._update_cache``);
  mla (multi-head latent attention, DeepSeek-V2 section 2.1.4): the compressed
      latent and the shared rotary key, d_c + d_R = mla_kv_rank + mla_rope_dim
      values per token;
  deltanet (Gated DeltaNet): no per-token cache; the recurrent state S of
      d_k x d_v per value head, H_v x d_k x d_v values per sequence
      (``mixers.deltanet_state_values``: deltanet_v_heads x deltanet_head_dim
      x deltanet_v_head_dim, 0 fields resolved), whatever its length
      (``recurrent_state_bytes_per_sequence``).

Values are in the compute dtype (``model.dtype``), the dtype the cache is
written in. A sliding window (``model.attention_window``) holds at most the
window's tokens of its layers: the bytes per token are the same, the
sequence's total stops growing at the window. An encoder-decoder's
cross-attention caches the encoder's keys and values once per source token
(the attention formula per source token), not per generated token: it is not
counted here.
"""

from __future__ import annotations

from typing import Callable

import dataclasses

import jax.numpy as jnp

from tfx_jax.model import config_attention, mixers

# The layer kinds of a mixer pattern (``model.mixer_pattern``): A full
# attention, D Gated DeltaNet.
PATTERN_KINDS = {"A": "attention", "D": "deltanet"}


def dtype_bytes(cfg) -> int:
  """Bytes of one value of the compute dtype."""
  return jnp.dtype(cfg.dtype).itemsize


def decoding_layers(cfg) -> int:
  """The layers of the stack that decodes (and caches): 0 for encoder-only."""
  return {"decoder_only": cfg.decoder_layers, "encoder_decoder": cfg.decoder_layers,
          "encoder_only": 0}[cfg.family]


def layer_kinds(cfg) -> tuple[str, ...]:
  """The kind of each decoding layer: ``model.mixer_pattern`` repeated to the
  depth where a model has one (A attention, D deltanet), attention otherwise;
  an attention layer is ``mla`` under ``model.attention_type='mla'``. The one
  dispatch point of the budgets' layer kinds (the fields are read where the
  config has them)."""
  n = decoding_layers(cfg)
  pattern = getattr(cfg, "mixer_pattern", "") or "A"
  attention = "mla" if getattr(cfg, "attention_type", "standard") == "mla" else "attention"
  kinds = [PATTERN_KINDS[pattern[i % len(pattern)]] for i in range(n)]
  return tuple(attention if k == "attention" else k for k in kinds)


def _mla_latent(cfg) -> int:
  dims = config_attention.mla_dims(cfg)  # 0 fields resolved: the widths built
  return dims.kv_rank + dims.rope_dim


# {layer kind: values cached per token}; a kind without an entry caches none.
# Each reads the widths the layer is built with (0 fields resolved).
KV_VALUES_PER_TOKEN: dict[str, Callable[..., int]] = {
    "attention": lambda cfg: 2 * cfg.kv_heads * cfg.attention_head_dim,
    "mla": _mla_latent,
}
# {layer kind: values of recurrent state per sequence}.
STATE_VALUES_PER_SEQUENCE: dict[str, Callable[..., int]] = {
    "deltanet": mixers.deltanet_state_values,
}


def kv_cache_bytes_per_token(cfg) -> int:
  """Bytes the decoding stack caches per token, summed over its layers by kind
  (module docstring): standard attention 2 x kv_heads x head_dim x layers x
  bytes of the compute dtype."""
  return dtype_bytes(cfg) * sum(KV_VALUES_PER_TOKEN[k](cfg) for k in layer_kinds(cfg)
                                if k in KV_VALUES_PER_TOKEN)


def recurrent_state_bytes_per_sequence(cfg) -> int:
  """Bytes of recurrent state per sequence (DeltaNet layers: heads x d_k x
  d_v each); 0 for a model of attention layers only."""
  return dtype_bytes(cfg) * sum(STATE_VALUES_PER_SEQUENCE[k](cfg) for k in layer_kinds(cfg)
                                if k in STATE_VALUES_PER_SEQUENCE)


@dataclasses.dataclass(frozen=True)
class TokenMixing:
  """What a model's token mixing multiplies per token, for the FLOP counts
  (``run/footprint.py``'s Kaplan count, ``scale/flops.py``'s PaLM count).

  attention_layers: the layers that attend over the context (an
      encoder-decoder's cross-attention counted as a layer of its own);
  attention_width: their width per key, H x (d_qk + d_v) / 2 (standard
      attention H x head_dim; MLA, DeepSeek-V2, H x (d_n + d_R + d_v) / 2: its
      scores read d_n + d_R, its weighted sum d_v per head);
  deltanet_layers, deltanet_state: the Gated DeltaNet layers and the values
      of one's state, H_v x d_k x d_v, which every token multiplies three times
      (k^T S, the rank-one update, S^T q) whatever the context length.
  """
  attention_layers: int
  attention_width: float
  deltanet_layers: int
  deltanet_state: int


def token_mixing(cfg) -> TokenMixing:
  """The model's :class:`TokenMixing` (the one place its layer kinds are counted)."""
  if cfg.family == "decoder_only":
    kinds = layer_kinds(cfg)
  else:
    n = {"encoder_only": cfg.encoder_layers,
         "encoder_decoder": cfg.encoder_layers + 2 * cfg.decoder_layers}[cfg.family]
    kinds = ("mla" if getattr(cfg, "attention_type", "standard") == "mla" else "attention",) * n
  if getattr(cfg, "attention_type", "standard") == "mla":
    d = config_attention.mla_dims(cfg)
    width = cfg.num_heads * (d.nope_dim + d.rope_dim + d.v_dim) / 2
  else:
    width = cfg.num_heads * cfg.attention_head_dim
  deltanet = sum(k == "deltanet" for k in kinds)
  state = STATE_VALUES_PER_SEQUENCE["deltanet"](cfg) if deltanet else 0
  return TokenMixing(attention_layers=len(kinds) - deltanet, attention_width=width,
                     deltanet_layers=deltanet, deltanet_state=state)
