"""The ``model.parametrization`` axis: standard, muP, CompleteP.

How the initialisation, the forward multipliers and the optimizer's per-group
learning rates change with the model's width and depth, so that a learning
rate tuned on a small proxy (the base shape, ``model.mup_base_d_model`` and
``model.mup_base_layers``) stays the best one as the model grows.

``sp``
  Today's parametrization (the default): nothing here applies, and
  parameters, updates and checkpoints are what they were before the field.
``mup``
  muP for Adam (Yang et al. 2022, "Tensor Programs V"; the ``mup`` package's
  ``MuReadout`` and ``MuAdam``), in base units: at the base width every value
  is the standard one, and with the width multiplier m = d_model /
  mup_base_d_model

  - token and position tables (input weights) keep the base width's
    initialisation (Glorot over [vocab, base d_model]; N(0, 1/base d_model));
    their Adam rate is eta;
  - hidden matrices (fan-in and fan-out both grow with width) keep Glorot's
    variance, which is the base's / m; Adam rate eta / m, weight decay x m
    (optax, like PyTorch's AdamW, decays by rate x decay: the product stays
    eta x lambda, ``MuAdamW``);
  - the readout (the vocabulary projection, tied or not, and a
    classification head) keeps the base's initialisation and multiplies its
    input by ``mup_output_multiplier`` / m (``MuReadout``); Adam rate eta;
  - other matrices whose fan-in grows and whose fan-out does not (a mixture
    of experts' router) are readouts in TP5's Table 3 form, the same rule
    without a forward multiplier: initial variance the base's / m^2, Adam rate
    eta / m, weight decay x m;
  - attention logits are q.k x ``mup_attention_scale`` / d_head instead of
    q.k / sqrt(d_head); the scale's default (0) is sqrt(the base head width),
    so that the base model's logits are the standard ones (the package's
    example uses 8 / d_head for heads of 64);
  - biases and norm gains: Adam rate eta.
``completep``
  muP in width plus CompleteP in depth (Dey et al. 2025, Table 1), with the
  depth multiplier m_L = layers / mup_base_layers of each stack and alpha =
  ``model.depth_alpha`` (1: CompleteP; 0.5: depth-muP, Yang et al. 2023 and
  Bordelon et al. 2023): every residual branch is x + m_L^-alpha
  F(Norm(x)); the hidden matrices' Adam rate is eta m^-1 m_L^(alpha - 1)
  and their weight decay lambda m; the blocks' norm gains and biases have the
  rate eta m_L^(alpha - 1); Adam's epsilon for every array in the blocks is
  eps m^-1 m_L^-alpha; the initialisation, embeddings, final norm and readout are
  muP's.

The optimizer side of these rules (``run/param_groups.py``) classifies each
parameter by its fan-in and fan-out axes (Muon's split, ``run/muon.py``) and
by which of them grow with width (the shapes of the model at d_model and 2
d_model: the ``mup`` package's base-shape comparison). The width multiplier is
one number, m = d_model / mup_base_d_model: a width set explicitly (``d_ff``,
``head_dim``, ``expert_d_ff``, ``gated_d_ff``) must grow with d_model as the
derived ones do.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from tfx_jax.core.errors import ConfigError, InactiveSetting

Parametrization = Literal["sp", "mup", "completep"]
PARAMETRIZATIONS = get_args(Parametrization)

# The fields this module reads, with their defaults (the "off" values).
FIELDS = {"mup_base_d_model": 0, "mup_base_layers": 0, "depth_alpha": 1.0,
          "mup_output_multiplier": 1.0, "mup_attention_scale": 0.0}
# Fields read only under some parametrizations.
READ_BY = {"mup_base_d_model": ("mup", "completep"), "mup_output_multiplier": ("mup", "completep"),
           "mup_attention_scale": ("mup", "completep"), "mup_base_layers": ("completep",),
           "depth_alpha": ("completep",)}
# Widths set explicitly that must grow with d_model (the width multiplier is one
# number): the shape comparison of run/param_groups.py doubles them with it.
WIDTH_FIELDS = ("d_model", "d_ff", "gated_d_ff", "expert_d_ff", "head_dim")
# The norm placement whose branch ends in the sublayer itself: CompleteP's
# x + m_L^-alpha F(Norm(x)) is defined for them only.
BRANCH_NORM_POSITIONS = ("pre",)


def transfers(cfg) -> bool:
  """Whether ``cfg`` uses a width-transfer parametrization (mup, completep)."""
  return cfg.parametrization != "sp"


def width_mult(cfg) -> float:
  """m = d_model / mup_base_d_model (1 under sp)."""
  return cfg.d_model / cfg.mup_base_d_model if transfers(cfg) else 1.0


def depth_mult(cfg, num_layers: int) -> float:
  """m_L = layers / mup_base_layers of a stack of ``num_layers`` (completep; else 1)."""
  return num_layers / cfg.mup_base_layers if cfg.parametrization == "completep" else 1.0


def branch_multiplier(cfg, num_layers: int) -> float:
  """m_L^-alpha on every residual branch of a stack of ``num_layers`` layers
  (exactly 1.0 unless completep)."""
  if cfg.parametrization != "completep":
    return 1.0
  return depth_mult(cfg, num_layers) ** -cfg.depth_alpha


def base_head_dim(cfg) -> int:
  """The head width of the base shape: ``head_dim`` scaled back, or the base
  d_model over the heads."""
  if cfg.head_dim:
    return max(1, round(cfg.head_dim / width_mult(cfg)))
  return cfg.mup_base_d_model // cfg.num_heads


def query_scale(cfg) -> float:
  """The factor on the queries that turns the logits' q.k / sqrt(d_head) (or q.k
  without ``scale_attention_logits``) into muP's q.k x scale / d_head; exactly
  1.0 under sp."""
  if not transfers(cfg):
    return 1.0
  d_head = cfg.head_dim or cfg.d_model // cfg.num_heads
  alpha = cfg.mup_attention_scale or math.sqrt(base_head_dim(cfg))
  target = alpha / d_head
  return target * math.sqrt(d_head) if cfg.scale_attention_logits else target


def output_multiplier(cfg) -> float:
  """The readout's input multiplier, mup_output_multiplier / m (``MuReadout``);
  exactly 1.0 under sp."""
  if not transfers(cfg):
    return 1.0
  return cfg.mup_output_multiplier / width_mult(cfg)


def embedding_width(cfg) -> int:
  """The width whose initialisation the token table takes: the base width under
  mup/completep (input weights are constant in width), else d_model."""
  return cfg.mup_base_d_model if transfers(cfg) else cfg.d_model


def router_init_scale(cfg) -> float:
  """The router's variance scale over its fan-in: Switch's 0.1, divided by m
  under mup/completep (a readout in Table 3 form: variance the base's / m^2)."""
  return 0.1 / width_mult(cfg)


def validate(cfg) -> None:
  """The parametrization's fields: in range, set only where read, and with no
  other field that has no rule under it (ConfigError / InactiveSetting)."""
  kind = cfg.parametrization
  for name, readers in READ_BY.items():
    value = getattr(cfg, name)
    if kind not in readers and value != FIELDS[name]:
      raise InactiveSetting(
          f"model.{name}", FIELDS[name],
          f"model.{name}={value!r} is read by model.parametrization in "
          f"{', '.join(map(repr, readers))} only (parametrization is {kind!r}); leave it "
          f"at {FIELDS[name]!r} or set model.parametrization={readers[0]}.")
  if kind == "sp":
    return
  if cfg.mup_base_d_model <= 0:
    raise ConfigError(
        f"model.parametrization={kind!r} needs model.mup_base_d_model > 0: the width "
        "of the proxy the learning rate was tuned on (e.g. "
        f"--config.model.mup_base_d_model={cfg.d_model} to tune at this width).")
  if not cfg.head_dim and cfg.mup_base_d_model % cfg.num_heads:
    raise ConfigError(
        f"model.mup_base_d_model={cfg.mup_base_d_model} is not divisible by "
        f"model.num_heads={cfg.num_heads}: the base shape's heads would not be whole.")
  if kind == "completep":
    if cfg.mup_base_layers <= 0:
      raise ConfigError(
          "model.parametrization='completep' needs model.mup_base_layers > 0: the depth "
          f"of the proxy (e.g. --config.model.mup_base_layers={cfg.num_layers}).")
    if not 0.0 < cfg.depth_alpha <= 1.0:
      raise ConfigError(f"model.depth_alpha must be in (0, 1] (1: CompleteP; 0.5: "
                        f"depth-muP), got {cfg.depth_alpha}.")
    if cfg.norm_position not in BRANCH_NORM_POSITIONS:
      raise ConfigError(
          f"model.parametrization='completep' scales each residual branch, x + m_L^-alpha "
          f"F(Norm(x)), a rule defined where the norm sits in the branch: "
          f"model.norm_position must be one of {', '.join(BRANCH_NORM_POSITIONS)} (got "
          f"{cfg.norm_position!r}).")
  if cfg.mup_output_multiplier <= 0:
    raise ConfigError(f"model.mup_output_multiplier must be > 0, got "
                      f"{cfg.mup_output_multiplier}.")
  if cfg.mup_attention_scale < 0:
    raise ConfigError(f"model.mup_attention_scale must be >= 0 (0 = sqrt of the base head "
                      f"width), got {cfg.mup_attention_scale}.")
  no_rule = {
      "scale_embeddings": (cfg.scale_embeddings, "multiplies the embeddings by "
                           "sqrt(d_model), which grows with width where muP keeps the "
                           "input layer's output constant; set it to False"),
      "scale_output": (cfg.scale_output, "multiplies the readout's input by "
                       "d_model^-0.5, in place of muP's mup_output_multiplier / m; set "
                       "it to False"),
      "attention_gate": (cfg.attention_gate == "headwise", "'headwise' has a gate kernel "
                         "[embed, heads] whose fan-out does not grow with width, a "
                         "readout with no multiplier of its own; use 'elementwise' or "
                         "'none'"),
  }
  for name, (bad, why) in no_rule.items():
    if bad:
      raise ConfigError(
          f"model.parametrization={kind!r} has no rule for model.{name}="
          f"{getattr(cfg, name)!r}: it {why}.")
