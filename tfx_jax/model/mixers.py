"""The ``model.mixer_pattern`` axis: which token mixer each layer has.

A string over the layers, ``A`` full (softmax) attention and ``D`` Gated
DeltaNet (``model/layers/deltanet.py``), repeated to the depth: ``DDDA`` on 8
layers is DDDADDDA, Qwen3-Next's 3:1 (``full_attention_interval`` 4: layer i is
full attention iff (i + 1) % 4 == 0), as Kimi Linear's. The default "" (or any
run of ``A``) is every layer attention, today's model. A scanned stack
(``model.scan_layers``) scans over the pattern's repeating unit (its shortest
period: ``DADA`` scans ``DA``), each unit's layers unrolled inside, so the
depth must be a multiple of the unit's length.

Validation of the axis and of the ``model.deltanet_*`` fields lives here
(``validate``, called by ``config.validate``).
"""

from __future__ import annotations

import dataclasses

from tfx_jax.core.errors import ConfigError, InactiveSetting

MIXERS = {"A": "full attention", "D": "Gated DeltaNet"}
# The families whose stacks may have D layers: the recurrence is causal, so an
# encoder (bidirectional) has no such layer; the encoder_decoder decoder is not
# built here.
DELTANET_FAMILIES = ("decoder_only",)
DELTANET_FIELDS = ("deltanet_heads", "deltanet_head_dim", "deltanet_v_heads",
                   "deltanet_v_head_dim", "deltanet_conv", "deltanet_chunk")


def mixer_unit(pattern: str) -> str:
  """The repeating unit of a pattern: its shortest period p with the pattern
  p repeated ("" -> "A"; "DADA" -> "DA"; "DDDA" -> "DDDA"; "AAA" -> "A")."""
  pattern = pattern or "A"
  n = len(pattern)
  for p in range(1, n + 1):
    if n % p == 0 and pattern[:p] * (n // p) == pattern:
      return pattern[:p]
  return pattern


def layer_mixers(pattern: str, num_layers: int) -> str:
  """The pattern repeated to ``num_layers`` layers (cut at the depth)."""
  unit = mixer_unit(pattern)
  return (unit * (num_layers // len(unit) + 1))[:num_layers]


def deltanet_heads(cfg) -> int:
  """H of the D layers: ``deltanet_heads``, or ``num_heads`` when 0."""
  return cfg.deltanet_heads or cfg.num_heads


def deltanet_head_dim(cfg) -> int:
  """d_k of the D layers: ``deltanet_head_dim``, or the attention head width when 0."""
  return cfg.deltanet_head_dim or cfg.attention_head_dim


def deltanet_v_heads(cfg) -> int:
  """H_v, the value heads of the D layers (one state each): ``deltanet_v_heads``,
  or the key heads ``deltanet_heads(cfg)`` when 0. Key head h serves value heads
  h r ... h r + r - 1, r = H_v / H (Qwen3-Next's grouped value heads)."""
  return cfg.deltanet_v_heads or deltanet_heads(cfg)


def deltanet_v_head_dim(cfg) -> int:
  """d_v of the D layers: ``deltanet_v_head_dim``, or d_k when 0."""
  return cfg.deltanet_v_head_dim or deltanet_head_dim(cfg)


def deltanet_state_values(cfg) -> int:
  """Values of one D layer's recurrent state per sequence: H_v x d_k x d_v (the
  one count of it: budgets and FLOP counts read this)."""
  return deltanet_v_heads(cfg) * deltanet_head_dim(cfg) * deltanet_v_head_dim(cfg)


def has_deltanet(cfg) -> bool:
  """Whether some layer of ``cfg`` is a Gated DeltaNet layer."""
  return "D" in layer_mixers(cfg.mixer_pattern, cfg.num_layers)


def validate(cfg) -> None:
  """``model.mixer_pattern`` and ``model.deltanet_*``: valid characters, set
  only where a D layer reads them, a family with a causal stack, and a depth
  that a scanned stack's unit divides."""
  defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
  bad = sorted(set(cfg.mixer_pattern) - set(MIXERS))
  if bad:
    raise ConfigError(
        f"model.mixer_pattern={cfg.mixer_pattern!r} has {', '.join(map(repr, bad))}; "
        "each character is one layer's token mixer, one of: "
        + ", ".join(f"{c} ({what})" for c, what in MIXERS.items())
        + " (e.g. 'DDDA', Qwen3-Next's 3:1; '' = every layer A).")
  if not has_deltanet(cfg):
    for name in DELTANET_FIELDS:
      if getattr(cfg, name) != defaults[name]:
        raise InactiveSetting(
            f"model.{name}", defaults[name],
            f"model.{name}={getattr(cfg, name)!r} is read by the Gated DeltaNet layers "
            f"only, and model.mixer_pattern={cfg.mixer_pattern!r} has none among "
            f"{cfg.num_layers} layers; leave it at {defaults[name]!r} or put D in the "
            "pattern.")
    return
  if cfg.family not in DELTANET_FAMILIES:
    raise ConfigError(
        f"model.mixer_pattern={cfg.mixer_pattern!r} has Gated DeltaNet (D) layers, a "
        f"causal recurrence, which model.family={cfg.family!r} does not have here; use "
        f"family one of: {', '.join(DELTANET_FAMILIES)} (or a pattern of A only).")
  if cfg.value_residual != "none":
    raise ConfigError(
        f"model.value_residual={cfg.value_residual!r} mixes the first layer's attention "
        f"values into the later layers; model.mixer_pattern={cfg.mixer_pattern!r} has "
        "Gated DeltaNet layers, whose values it does not reach here: use "
        "model.value_residual=none, or a pattern of A only.")
  for name in ("deltanet_heads", "deltanet_head_dim", "deltanet_v_heads",
               "deltanet_v_head_dim", "deltanet_conv"):
    if getattr(cfg, name) < 0:
      raise ConfigError(f"model.{name} must be >= 0 (0 = "
                        + {"deltanet_heads": "model.num_heads",
                           "deltanet_head_dim": "the attention head width",
                           "deltanet_v_heads": "the key heads, deltanet_heads",
                           "deltanet_v_head_dim": "the key width, deltanet_head_dim",
                           "deltanet_conv": "no short convolution"}[name]
                        + f"), got {getattr(cfg, name)}.")
  if deltanet_v_heads(cfg) % deltanet_heads(cfg):
    h = deltanet_heads(cfg)
    raise ConfigError(
        f"model.deltanet_v_heads={cfg.deltanet_v_heads} is not a multiple of the "
        f"{h} key heads (model.deltanet_heads, 0 = num_heads): each key head serves "
        f"the same number of value heads; choose one of {h}, {2 * h}, {3 * h}, ... "
        "(or 0 = as many as the key heads).")
  if cfg.deltanet_chunk < 1:
    raise ConfigError(f"model.deltanet_chunk must be >= 1 (fla: 64), got "
                      f"{cfg.deltanet_chunk}.")
  if cfg.parametrization != "sp":
    raise ConfigError(
        f"model.parametrization={cfg.parametrization!r} has no rules for the Gated "
        "DeltaNet layers' projections and gates here; use parametrization='sp' with D "
        "layers.")
  unit = mixer_unit(cfg.mixer_pattern)
  if cfg.scan_layers and cfg.num_layers % len(unit):
    raise ConfigError(
        f"model.scan_layers=True scans the mixer pattern's unit {unit!r} ({len(unit)} "
        f"layers) over the stack, so model.num_layers={cfg.num_layers} must be a "
        f"multiple of {len(unit)}; choose num_layers among "
        f"{', '.join(str(len(unit) * m) for m in range(1, 4))}, ..., or "
        "scan_layers=False.")
