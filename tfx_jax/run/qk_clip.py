"""QK-clip (``train.qk_clip`` tau > 0): after each optimizer step, the query and
key projections of every head whose largest attention logit exceeded tau are
scaled down so that the logit would have been tau.

Kimi K2 (arXiv 2507.20534, section 2.1, MuonClip): S_max^h is head h's largest
logit of the step, q_i^h . k_j^h / sqrt(d) over the batch; where S_max^h > tau
(K2: 100), eta_h = tau / S_max^h and W_q^h, W_k^h are each scaled by
sqrt(eta_h), so that the head's logits, bilinear in the two projections, are
scaled by eta_h and the largest becomes tau. Heads under tau are left as they
are. A bias on the projections (``model.use_bias``) is scaled with its kernel
(q = x W_q + b_q scales by sqrt(eta) only if both do); RoPE is linear and
muP's query factor a constant, so neither changes the rule. The logit is the
one the training forward's softmax sees, before any soft-cap and position bias
(``attention.max_logit_per_head``, sown only where the train step asks for it,
so no path changes when QK-clip is off).

Grouped keys (GQA, MQA): a key head is shared by the G query heads of its
group. Megatron-LM's rule is followed (``megatron/core/transformer/attention.py``,
``SelfAttention.clip_qk``, commit d98e8a6, "experimental on GQA"): eta_g =
min(1, tau / max over the group's S_max^h), the minimum of its heads' factors;
each query head of the group is scaled by eta_g^alpha and the group's key head
by eta_g^(1 - alpha), alpha = 1/2 (``qk_clip_alpha``). The group's largest
logit becomes tau; its other heads' logits scale by the same eta_g (a clip
that no head's own factor exceeds). Multi-head attention (G = 1) is K2's rule.
``train/qk_clip_fraction`` is the fraction of query heads whose logits were
rescaled this step, over every attention layer (MLA: its heads).

Rules per attention kind (``RULES``), found by the name the layer sows its
maxima under (``attention.QK_CLIP_KIND`` for the standard layer,
``mla.QK_CLIP_KIND`` for multi-head latent attention). MLA (Kimi K2, section
2.1 and appendix): head h's logit is (q_C . k_C + q_R . k_R) x scale, the
content query q_C and key k_C per head, the rotary query q_R per head and the
rotary key k_R one for every head; with eta_h = min(1, tau / S_max^h), q_C and
k_C are scaled by sqrt(eta_h), q_R by eta_h, and k_R is left untouched (a
shared key scaled for one head would change every head's logits), so each
term, and the head's logits, scale by eta_h. In the parameters
(``model/layers/mla.py``): q_C and q_R are the first d_n and last d_R columns
of head h of the query's up-projection (``q_b_proj`` [.., d_c', H, d_n + d_R]
with query compression; ``q_proj`` [.., D, H, d_n + d_R] without: the down
projection ``q_a_proj`` and its norm are shared by the heads and untouched);
k_C is the first d_n columns of head h of ``kv_b_proj`` [.., d_c, H, d_n + d_v],
whose last d_v (the values) are untouched, as are ``kv_a_proj_with_mqa`` (the
latent and k_R) and the latent norms. The widths are read off the parameters:
d_c from ``kv_a_layernorm``'s gain, d_R = ``kv_a_proj_with_mqa``'s width - d_c,
d_n = the query's per-head width - d_R. None of these projections has a bias.

Hybrid stacks (``model.mixer_pattern`` with D): a Gated DeltaNet layer has no
softmax and sows nothing; the attention (A) layers of the stack are clipped,
looped (``layer_<i>``) or scanned over the pattern's unit
(``layers/layer_<j>``, the maxima and parameters [repeats, ...] alike), and
``train/qk_clip_fraction`` counts their heads only. A stack with no A layer
has nothing to clip (a ConfigError).

The rescale is applied to the parameters after the update (and the MoE expert
bias), outside the optimizer's state, so it composes with every optimizer,
Muon included; it is elementwise per head, so the parameters keep their
shardings; under ``model.scan_layers`` the maxima come stacked [layers, H]
like the parameters. With ``optim.accumulate_steps`` k > 1 it is applied once
per update, at the last micro-batch, from that micro-batch's maxima (as
DeepSeek-V3's expert bias is). No state is added: a resumed run continues
bitwise. ``model.qk_norm`` normalises the queries and keys after the
projections, so scaling the projections cannot lower the logits: the two are
a ConfigError together.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import traverse_util

from tfx_jax.core.errors import ConfigError
from tfx_jax.model import mixers
from tfx_jax.model.layers import mla
from tfx_jax.model.layers.attention import QK_CLIP_COLLECTION, QK_CLIP_KIND

COLLECTION = QK_CLIP_COLLECTION
# The share of eta that the queries take (Megatron-LM's qk_clip_alpha; K2: 1/2).
ALPHA = 0.5
# {model.attention_type: the kind its self-attention sows its maxima under}.
KINDS = {"standard": QK_CLIP_KIND, "mla": mla.QK_CLIP_KIND}


def check(model_cfg, tau: float) -> None:
  """train.qk_clip against the model (before anything is compiled)."""
  if not tau:
    return
  if model_cfg.qk_norm != "none":
    raise ConfigError(
        f"train.qk_clip={tau} rescales the query and key projections, which "
        f"model.qk_norm={model_cfg.qk_norm!r} normalises away (the logits would not "
        "change): set model.qk_norm=none, or train.qk_clip=0 (off).")
  if model_cfg.attention_type not in KINDS:
    raise ConfigError(
        f"train.qk_clip={tau} has no rule for model.attention_type="
        f"{model_cfg.attention_type!r}; the rules: {', '.join(KINDS)}, or "
        "train.qk_clip=0 (off).")
  if "A" not in mixers.layer_mixers(model_cfg.mixer_pattern, model_cfg.num_layers):
    raise ConfigError(
        f"train.qk_clip={tau} clips softmax attention logits, and "
        f"model.mixer_pattern={model_cfg.mixer_pattern!r} on {model_cfg.num_layers} "
        "layers has no attention (A) layer, only Gated DeltaNet (D): put A in the "
        "pattern, or train.qk_clip=0 (off).")


def _scale_heads(proj: Mapping[str, Any], scale_xH: jax.Array) -> dict:
  """A DenseGeneral projection to heads (kernel [..., D, H, K], bias [..., H, K])
  with each head h scaled by scale[..., h]."""
  out = dict(proj)
  kernel = proj["kernel"]
  out["kernel"] = kernel * scale_xH[..., None, :, None].astype(kernel.dtype)
  if "bias" in proj:
    out["bias"] = proj["bias"] * scale_xH[..., :, None].astype(proj["bias"].dtype)
  return out


def standard_rule(attention: Mapping[str, Any], max_logit_xH: jax.Array, tau
                  ) -> tuple[dict, jax.Array]:
  """(the attention's parameters rescaled, [..., H] which query heads were).

  ``attention`` holds ``query`` ([..., D, H, K]) and ``key`` ([..., D, N, K]);
  ``max_logit_xH`` the heads' S_max ([..., H], a leading layer axis under
  scan). Megatron-LM's grouped rule (module docstring)."""
  H = max_logit_xH.shape[-1]
  N = attention["key"]["kernel"].shape[-2]
  G = H // N
  group_max_xN = jnp.max(max_logit_xH.reshape(*max_logit_xH.shape[:-1], N, G), axis=-1)
  # A head that saw no key (-inf) or a non-finite step (skipped) is not clipped.
  over_xN = group_max_xN > tau
  eta_xN = jnp.where(over_xN, tau / jnp.where(over_xN, group_max_xN, 1.0), 1.0)
  out = dict(attention)
  out["query"] = _scale_heads(attention["query"], jnp.repeat(eta_xN ** ALPHA, G, axis=-1))
  out["key"] = _scale_heads(attention["key"], eta_xN ** (1.0 - ALPHA))
  return out, jnp.repeat(over_xN, G, axis=-1)


def mla_rule(attention: Mapping[str, Any], max_logit_xH: jax.Array, tau
             ) -> tuple[dict, jax.Array]:
  """(the MLA layer's parameters rescaled, [..., H] which heads were): Kimi K2's
  rule (module docstring), q_C and k_C by sqrt(eta_h), q_R by eta_h, k_R and the
  values untouched. ``max_logit_xH``: the heads' S_max ([..., H], a leading
  layer axis under scan, as the parameters)."""
  C = attention["kv_a_layernorm"]["scale"].shape[-1]
  R = attention["kv_a_proj_with_mqa"]["kernel"].shape[-1] - C
  query = "q_b_proj" if "q_b_proj" in attention else "q_proj"
  N = attention[query]["kernel"].shape[-1] - R
  over_xH = max_logit_xH > tau
  eta_xH = jnp.where(over_xH, tau / jnp.where(over_xH, max_logit_xH, 1.0), 1.0)

  def scaled(kernel, content_xH, rest_xH):
    # kernel [..., in, H, F]: head h's first N columns by content[h], the rest by rest[h].
    content_F = jnp.arange(kernel.shape[-1]) < N
    factor_xHF = jnp.where(content_F, content_xH[..., None], rest_xH[..., None])
    return kernel * factor_xHF[..., None, :, :].astype(kernel.dtype)

  out = dict(attention)
  out[query] = dict(attention[query], kernel=scaled(
      attention[query]["kernel"], jnp.sqrt(eta_xH), eta_xH))
  out["kv_b_proj"] = dict(attention["kv_b_proj"], kernel=scaled(
      attention["kv_b_proj"]["kernel"], jnp.sqrt(eta_xH), jnp.ones_like(eta_xH)))
  return out, over_xH


# {sown kind: rule(attention params, [..., H] maxima, tau) -> (params, clipped heads)}.
RULES: dict[str, Callable[..., tuple[dict, jax.Array]]] = {QK_CLIP_KIND: standard_rule,
                                                           mla.QK_CLIP_KIND: mla_rule}


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def _set(tree, path, value):
  """``tree`` with the subtree at ``path`` replaced (the dicts on the way copied)."""
  if not path:
    return value
  out = dict(tree)
  out[path[0]] = _set(tree[path[0]], path[1:], value)
  return out


def apply(params, sown: Mapping[str, Any], tau) -> tuple[Any, jax.Array]:
  """(``params`` with every attention clipped at ``tau``, the fraction of query
  heads clipped). ``sown``: the ``COLLECTION`` of the step's forward, each
  attention's maxima at its module's path under its kind's name."""
  clipped, total = jnp.zeros((), jnp.float32), 0
  for path, values in traverse_util.flatten_dict(dict(sown)).items():
    *module, kind = path
    if kind not in RULES:
      raise ConfigError(f"train.qk_clip has no rule for the attention kind {kind!r} sown "
                        f"at {'/'.join(module)}; the rules: {', '.join(RULES)}.")
    # A module applied more than once in the step sows once per call.
    max_xH = jnp.max(jnp.stack(values), axis=0) if len(values) > 1 else values[0]
    new, over = RULES[kind](_get(params, module), max_xH, tau)
    params = _set(params, module, new)
    clipped = clipped + jnp.sum(over.astype(jnp.float32))
    total += over.size
  if not total:
    raise ConfigError("train.qk_clip is set, but no attention layer sowed its logits.")
  return params, clipped / total
