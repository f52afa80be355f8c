"""The ``model.ffn_type`` axis's mixture of experts: which layers, and its checks.

The fields are ``ModelConfig``'s (``config.py``, which calls :func:`validate`);
the layer is ``model/layers/moe.py``. Kept apart from ``config.py`` as
``config_attention.py`` is, so that the rules of the axis live in one place;
it reads the config's fields and does not import it.

Routing, as ``moe.route`` computes it for a token's router logits x W_r:
scores r (softmax or sigmoid, ``model.router``); the k best of r + b chosen
(b the expert bias of ``model.moe_balance='bias'``), from the
``model.router_topk_groups`` best of ``model.router_groups`` groups of
consecutive experts where that is fewer than all (DeepSeek-V3's node-limited
routing, ``n_group`` / ``topk_group``: a group's score is the sum of its two
best r + b); the chosen scores, renormalised over the k with
``model.router_norm_topk``, times ``model.router_scale`` (DeepSeek-V3's
``routed_scaling_factor``), weigh the experts. ``model.router_use_bias`` adds
a learned bias to the logits x W_r (gpt-oss's router; it scores as well as
chooses, unlike the expert bias b).
"""

from __future__ import annotations

import dataclasses
import math

from tfx_jax.core.errors import ConfigError, InactiveSetting

# The fields that only a mixture of experts reads, and the one that only the
# bias balancing reads.
MOE_FIELDS = ("num_experts", "experts_per_token", "shared_experts", "expert_d_ff",
              "router", "router_norm_topk", "router_scale", "router_groups",
              "router_topk_groups", "moe_every", "first_dense_layers", "moe_balance",
              "router_bias_rate", "capacity_factor", "shared_expert_d_ff",
              "shared_expert_gate", "router_use_bias")
# The fields that only the shared experts read.
SHARED_FIELDS = ("shared_expert_d_ff", "shared_expert_gate")


def shared_dim(cfg) -> int:
  """Hidden width of the shared experts together (one FFN): ``shared_expert_d_ff``,
  or shared_experts x the expert width when 0 (DeepSeekMoE's); 0 without any."""
  if not cfg.shared_experts:
    return 0
  return cfg.shared_expert_d_ff or cfg.shared_experts * cfg.expert_dim


def is_moe_layer(layer: int, ffn_type: str, moe_every: int, first_dense_layers: int) -> bool:
  """Whether layer ``layer`` (0-based) has a mixture of experts in the FFN's
  place: with ``model.ffn_type='moe'``, the layers from ``first_dense_layers``
  on that are multiples of ``moe_every`` (1-based: k, 2k, ...), as Qwen3-MoE's
  ``decoder_sparse_step`` with its first ``mlp_only_layers`` (DeepSeek-V3's
  ``first_k_dense_replace``)."""
  return (ffn_type == "moe" and layer >= first_dense_layers
          and (layer + 1) % moe_every == 0)


def moe_layers(cfg, num_layers: int) -> tuple[int, ...]:
  """The MoE layers (0-based) of a stack of ``num_layers`` layers of ``cfg``."""
  return tuple(i for i in range(num_layers) if is_moe_layer(
      i, cfg.ffn_type, cfg.moe_every, cfg.first_dense_layers))


def grouped_routing(cfg) -> bool:
  """Whether the router chooses among some of its groups only (fewer kept than
  there are): with every group kept, grouping chooses as plain top-k does."""
  return cfg.router_topk_groups < cfg.router_groups


def validate(cfg) -> None:
  """The mixture-of-experts fields: in range, and set only where they are read."""
  defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
  if cfg.ffn_type != "moe":
    for name in MOE_FIELDS:
      if getattr(cfg, name) != defaults[name]:
        raise InactiveSetting(
            f"model.{name}", defaults[name],
            f"model.{name}={getattr(cfg, name)!r} is read by model.ffn_type='moe' only "
            f"(ffn_type is {cfg.ffn_type!r}); leave it at {defaults[name]!r} "
            "or set model.ffn_type=moe.")
    return
  for name in ("num_experts", "experts_per_token", "moe_every", "router_groups",
               "router_topk_groups"):
    if getattr(cfg, name) < 1:
      raise ConfigError(f"model.{name} must be >= 1, got {getattr(cfg, name)}.")
  for name in ("shared_experts", "expert_d_ff", "first_dense_layers", "shared_expert_d_ff"):
    if getattr(cfg, name) < 0:
      raise ConfigError(f"model.{name} must be >= 0, got {getattr(cfg, name)}.")
  for name in SHARED_FIELDS:
    if not cfg.shared_experts and getattr(cfg, name) != defaults[name]:
      raise InactiveSetting(
          f"model.{name}", defaults[name],
          f"model.{name}={getattr(cfg, name)!r} is read by the shared experts only, "
          "and model.shared_experts is 0: set model.shared_experts >= 1 (Qwen3-Next: "
          f"1) or leave it at {defaults[name]!r}.")
  if cfg.experts_per_token > cfg.num_experts:
    raise ConfigError(
        f"model.experts_per_token={cfg.experts_per_token} is more than "
        f"model.num_experts={cfg.num_experts}; choose k in 1..{cfg.num_experts}.")
  if not (math.isfinite(cfg.router_scale) and cfg.router_scale > 0):
    raise ConfigError(f"model.router_scale must be > 0 (1 = the scores as they are; "
                      f"DeepSeek-V3: 2.5), got {cfg.router_scale}.")
  _validate_groups(cfg)
  if not (math.isfinite(cfg.capacity_factor) and cfg.capacity_factor >= 0):
    raise ConfigError(f"model.capacity_factor must be >= 0 (0 = dropless), got "
                      f"{cfg.capacity_factor}.")
  if not (math.isfinite(cfg.router_bias_rate) and cfg.router_bias_rate > 0):
    raise ConfigError(f"model.router_bias_rate must be > 0 (DeepSeek-V3: 0.001), got "
                      f"{cfg.router_bias_rate}.")
  if cfg.moe_balance != "bias" and cfg.router_bias_rate != defaults["router_bias_rate"]:
    raise InactiveSetting(
        "model.router_bias_rate", defaults["router_bias_rate"],
        f"model.router_bias_rate={cfg.router_bias_rate} is the rate of the expert "
        f"bias, read with model.moe_balance='bias' only (moe_balance is "
        f"{cfg.moe_balance!r}).")
  stacks = {"decoder_only": (cfg.decoder_layers,), "encoder_only": (cfg.encoder_layers,),
            "encoder_decoder": (cfg.encoder_layers, cfg.decoder_layers)}[cfg.family]
  for n in stacks:
    if not moe_layers(cfg, n):
      raise ConfigError(
          f"model.ffn_type='moe' with model.first_dense_layers={cfg.first_dense_layers} "
          f"and model.moe_every={cfg.moe_every} leaves no MoE layer among {n}; lower "
          "them, or use model.ffn_type=dense.")
    if cfg.scan_layers and len(moe_layers(cfg, n)) != n:
      raise ConfigError(
          "model.scan_layers=True scans one layer over the stack, so every layer must "
          f"be alike; model.moe_every={cfg.moe_every} and model.first_dense_layers="
          f"{cfg.first_dense_layers} mix dense and MoE layers: set model.scan_layers="
          "False, or moe_every=1 and first_dense_layers=0.")


def _validate_groups(cfg) -> None:
  """model.router_groups G and model.router_topk_groups: G divides the experts,
  at most G groups kept, and where fewer are kept, groups of two experts or
  more (a group's score is its two best) holding the k chosen."""
  groups, kept, E = cfg.router_groups, cfg.router_topk_groups, cfg.num_experts
  if E % groups:
    raise ConfigError(f"model.router_groups={groups} must divide model.num_experts={E} "
                      "into groups of consecutive experts (1 = one group: plain top-k).")
  if kept > groups:
    raise ConfigError(f"model.router_topk_groups={kept} is more than model.router_groups="
                      f"{groups}; choose 1..{groups} (= {groups}: every group, plain top-k).")
  if kept < groups and E // groups < 2:
    raise ConfigError(
        f"model.router_groups={groups} gives groups of {E // groups} expert; a group's "
        "score is the sum of its two best, so the groups need two experts or more "
        "(fewer groups), or keep them all (model.router_topk_groups = router_groups).")
  if kept < groups and cfg.experts_per_token > kept * (E // groups):
    raise ConfigError(
        f"model.experts_per_token={cfg.experts_per_token} is more than the "
        f"{kept * (E // groups)} experts of the model.router_topk_groups={kept} groups "
        "kept; keep more groups, or choose fewer experts per token.")
