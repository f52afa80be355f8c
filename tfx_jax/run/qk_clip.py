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
rescaled this step, over every attention layer.

Rules per attention kind (``RULES``), found by the name the layer sows its
maxima under (``attention.QK_CLIP_KIND`` for the standard layer). Kimi K2's
rule for multi-head latent attention, for the MLA layer to register under its
own name: the per-head content parts q_C and k_C scaled by sqrt(eta_h), the
per-head rotary query q_R by eta_h, and the rotary key k_R, shared by every
head, left untouched.

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
from tfx_jax.model.layers.attention import QK_CLIP_COLLECTION, QK_CLIP_KIND

COLLECTION = QK_CLIP_COLLECTION
# The share of eta that the queries take (Megatron-LM's qk_clip_alpha; K2: 1/2).
ALPHA = 0.5


def check(model_cfg, tau: float) -> None:
  """train.qk_clip against the model (before anything is compiled)."""
  if tau and model_cfg.qk_norm != "none":
    raise ConfigError(
        f"train.qk_clip={tau} rescales the query and key projections, which "
        f"model.qk_norm={model_cfg.qk_norm!r} normalises away (the logits would not "
        "change): set model.qk_norm=none, or train.qk_clip=0 (off).")
  if tau and model_cfg.attention_type != "standard":
    raise ConfigError(
        f"train.qk_clip={tau} has a rule for standard attention's query and key "
        f"projections only; model.attention_type={model_cfg.attention_type!r} has no "
        "rule here yet: use attention_type=standard, or train.qk_clip=0 (off).")
  if tau and "D" in model_cfg.mixer_pattern:
    raise ConfigError(
        f"train.qk_clip={tau} clips attention logits, and the rule here walks stacks of "
        f"attention layers only; model.mixer_pattern={model_cfg.mixer_pattern!r} has "
        "Gated DeltaNet layers: use a pattern of A only, or train.qk_clip=0 (off).")


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


# {sown kind: rule(attention params, [..., H] maxima, tau) -> (params, clipped heads)}.
RULES: dict[str, Callable[..., tuple[dict, jax.Array]]] = {QK_CLIP_KIND: standard_rule}


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
