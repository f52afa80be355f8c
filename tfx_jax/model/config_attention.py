"""The ``model.attention_type`` axis: its fields, their derived widths, their checks.

``standard``
  Today's multi-head attention (``model/layers/attention.py``), with
  ``model.num_kv_heads`` for GQA/MQA. Every ``model.mla_*`` field must stay at
  its default (0): a model is bitwise what it was before the field.
``mla``
  Multi-head latent attention (DeepSeek-V2, Section 2.1; DeepSeek-V3;
  ``model/layers/mla.py``), with the widths below. 0 means "derived", as
  ``head_dim`` and ``d_ff`` do, with DeepSeek-V2/V3's proportions (d_nope 128,
  d_R 64, d_v 128, d_c 512 = 4 d_nope):

  ============== ===== ==================================================
  field          name  0 means
  ============== ===== ==================================================
  mla_nope_dim   d_n   the head width (``head_dim``, or d_model / heads)
  mla_v_dim      d_v   d_n
  mla_rope_dim   d_R   with ``position='rope'``: d_n / 2 rounded down to an
                       even number, at least 2; other positions: no
                       decoupled RoPE part (and a value > 0 is an error)
  mla_kv_rank    d_c   4 d_n
  mla_q_rank     d_c'  no query compression: q = h W_Q (DeepSeek-V2-Lite)
  ============== ===== ==================================================

Kept apart from ``config.py`` (which calls :func:`validate`) so that the
attention type's rules live in one place; like ``parametrization.py`` it reads
the config's fields and does not import it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from tfx_jax.core.errors import ConfigError, InactiveSetting

AttentionType = Literal["standard", "mla"]
ATTENTION_TYPES = get_args(AttentionType)

# The fields only MLA reads, with their defaults (0: derived, or no query
# compression for mla_q_rank).
MLA_FIELDS = {"mla_kv_rank": 0, "mla_q_rank": 0, "mla_rope_dim": 0, "mla_nope_dim": 0,
              "mla_v_dim": 0}
# Positions whose scheme has no rotation for MLA's decoupled key: they act
# outside attention (learned, sinusoidal) or add a bias to its logits (t5_bias,
# alibi), which MLA's logits take as standard attention's do.
NO_ROPE_POSITIONS = ("learned", "sinusoidal", "t5_bias", "alibi", "none")


@dataclasses.dataclass(frozen=True)
class MlaDims:
  """MLA's widths, the derived ones resolved (see the module docstring)."""
  kv_rank: int  # d_c, the KV latent
  q_rank: int  # d_c', the query latent; 0: no query compression
  rope_dim: int  # d_R, the decoupled RoPE query and key width; 0: none
  nope_dim: int  # d_n, the per-head query/key width without position
  v_dim: int  # d_v, the per-head value width


def mla_dims(cfg) -> MlaDims:
  """The MLA widths of ``cfg`` (``model.mla_*`` with 0 resolved)."""
  nope = cfg.mla_nope_dim or cfg.head_dim or cfg.d_model // cfg.num_heads
  rope = cfg.mla_rope_dim
  if not rope and cfg.position == "rope":
    rope = 2 * max(1, nope // 4)
  return MlaDims(kv_rank=cfg.mla_kv_rank or 4 * nope, q_rank=cfg.mla_q_rank,
                 rope_dim=rope, nope_dim=nope, v_dim=cfg.mla_v_dim or nope)


def validate(cfg) -> None:
  """The attention type's fields: in range, and set only where they are read
  (``ConfigError`` / ``InactiveSetting``, naming the field and the choices)."""
  if cfg.attention_type == "standard":
    for name, default in MLA_FIELDS.items():
      if getattr(cfg, name) != default:
        raise InactiveSetting(
            f"model.{name}", default,
            f"model.{name}={getattr(cfg, name)!r} is read by model.attention_type='mla' "
            f"only (attention_type is 'standard'); leave it at {default} or set "
            f"model.attention_type=mla (choices: {', '.join(ATTENTION_TYPES)}).")
    return
  for name in MLA_FIELDS:
    if getattr(cfg, name) < 0:
      raise ConfigError(f"model.{name} must be >= 0 (0 = {_ZERO[name]}), got "
                        f"{getattr(cfg, name)}.")
  if cfg.num_kv_heads:
    raise InactiveSetting(
        "model.num_kv_heads", 0,
        f"model.num_kv_heads={cfg.num_kv_heads} groups the key/value heads of standard "
        "attention; model.attention_type='mla' has one latent shared by every head "
        "(its cache is model.mla_kv_rank + model.mla_rope_dim per token): leave "
        "num_kv_heads at 0, or set model.attention_type=standard.")
  if cfg.position != "rope" and cfg.mla_rope_dim:
    raise InactiveSetting(
        "model.mla_rope_dim", 0,
        f"model.mla_rope_dim={cfg.mla_rope_dim} is the width of MLA's decoupled RoPE "
        f"key and query, which needs model.position='rope' (position is "
        f"{cfg.position!r}, which has no rotation: MLA has no RoPE part with "
        f"{', '.join(NO_ROPE_POSITIONS)}); leave it at 0 or use position=rope.")
  dims = mla_dims(cfg)
  if dims.rope_dim % 2:
    raise ConfigError(
        f"model.mla_rope_dim={dims.rope_dim}: RoPE rotates pairs of dimensions, so "
        "the decoupled RoPE width must be even (DeepSeek-V3: 64), or 0 (derived).")
  if cfg.rope_fraction != 1.0:
    raise ConfigError(
        f"model.rope_fraction={cfg.rope_fraction} with model.attention_type='mla': MLA "
        "rotates the whole of its decoupled RoPE part and none of the rest; set its "
        "width with model.mla_rope_dim instead and leave rope_fraction at 1.0.")
  no_rule = {
      "qk_norm": (cfg.qk_norm != "none", "MLA normalises its latents (RMSNorm on the "
                  "query and KV latents, as DeepSeek-V3) and has no per-head query-key "
                  "norm; use model.qk_norm=none"),
      "parametrization": (cfg.parametrization != "sp", "muP has no rule yet for MLA's "
                          "latent ranks and its logits' scale over d_nope + d_R; use "
                          "model.parametrization=sp"),
      "attention_sinks": (cfg.attention_sinks, "MLA's softmax has no sink logits here; "
                          "use model.attention_sinks=false"),
      "nope_every": (cfg.nope_every != 0, "MLA's position part is its decoupled RoPE "
                     "width (model.mla_rope_dim); use model.nope_every=0"),
      "value_residual": (cfg.value_residual != "none", "MLA's values come from its "
                         "latent, which the value residual does not mix; use "
                         "model.value_residual=none"),
  }
  for name, (bad, why) in no_rule.items():
    if bad:
      raise ConfigError(f"model.attention_type='mla' has no rule for model.{name}="
                        f"{getattr(cfg, name)!r}: {why} (or attention_type=standard).")


_ZERO = {"mla_kv_rank": "4 x mla_nope_dim", "mla_q_rank": "no query compression",
         "mla_rope_dim": "derived from mla_nope_dim with position=rope, none otherwise",
         "mla_nope_dim": "the head width", "mla_v_dim": "mla_nope_dim"}
