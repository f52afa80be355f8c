"""HF ``config.json`` <-> ``model.*`` fields that several architectures share:
activation names, head widths, RoPE (``rope_parameters`` or the older keys)
and sliding-window layers (``layer_types``).

Read from HF: ``model_activation``, ``model_gated_activation``, ``model_head_dim``,
``rope_fields``, ``window_fields``. Written for HF: ``HF_ACTIVATIONS``,
``HF_GATED_ACTIVATIONS``, ``hf_rope_parameters``, ``hf_layer_types``. ``SLIDING``
and ``FULL`` are HF's names of the two layer kinds.
"""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.layers.positions import YARN_BETA_FAST, YARN_BETA_SLOW, yarn_attention_factor
from tfx_jax.model.config import ModelConfig, is_windowed

# HF activation names -> model.activation (plain FFN); gated ones are below.
# Exporting, an activation without an HF name becomes the architecture's own,
# so that the settings HF cannot represent show as differences.
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "relu": "relu", "silu": "swish", "swish": "swish"}
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "swish": "silu"}


def model_activation(name: str, arch: str) -> str:
  """model.activation of HF's activation ``name`` in a plain FFN (ConfigError if none)."""
  if name not in _ACTS:
    raise ConfigError(f"{arch}: activation {name!r} has no model.activation; "
                      f"supported: {', '.join(_ACTS)}.")
  return _ACTS[name]


# Gated FFNs, act(x W_gate) * (x W_up): HF's hidden_act -> model.activation.
_GATED_ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu",
               "gelu_new": "geglu_tanh", "gelu_pytorch_tanh": "geglu_tanh",
               "relu": "reglu", "sigmoid": "glu", "linear": "bilinear"}
HF_GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_pytorch_tanh",
                        "reglu": "relu", "glu": "sigmoid", "bilinear": "linear"}


def model_gated_activation(name: str, arch: str) -> str:
  """model.activation of HF's ``name`` gating an FFN (ConfigError if none)."""
  if name not in _GATED_ACTS:
    raise ConfigError(f"{arch}: activation {name!r} has no gated model.activation; "
                      f"supported: {', '.join(_GATED_ACTS)}.")
  return _GATED_ACTS[name]


# ---------------------------------------------------------------- RoPE
# transformers' rope_type -> model.rope_scaling. Not represented: "dynamic"
# (frequencies that change with the input length), "llama3", "longrope".
_ROPE_TYPES = {"default": "none", "linear": "linear", "yarn": "yarn"}


def rope_fields(c, arch: str, *, longest: int, partial: bool = False,
                 base_key: str = "rope_theta", fraction_key: str = "partial_rotary_factor",
                 fraction_default: float = 1.0) -> dict:
  """The model.rope_* fields of an HF config's RoPE: transformers 5's
  ``rope_parameters``, or the older top-level keys (``rope_theta`` and
  ``rope_scaling``; GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct``, read
  through ``base_key`` and ``fraction_key``). ``longest`` is the model's
  max_position_embeddings. Architectures that rotate whole heads (``partial``
  False) refuse a partial_rotary_factor other than 1."""
  rope = {**(c.get("rope_scaling") or {}), **(c.get("rope_parameters") or {})}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in _ROPE_TYPES:
    raise ConfigError(f"{arch}: RoPE rope_type={kind!r} has no model.rope_scaling; "
                      f"supported: {', '.join(_ROPE_TYPES)}.")
  fraction = rope.get("partial_rotary_factor", c.get(fraction_key))
  fraction = fraction_default if fraction is None else float(fraction)
  if not partial and fraction != 1.0:
    raise ConfigError(f"{arch}: partial_rotary_factor={fraction}; {arch} rotates whole "
                      "heads.")
  fields = dict(rope_base=float(rope.get("rope_theta", c.get(base_key, 10000.0))),
                rope_fraction=fraction, rope_scaling=_ROPE_TYPES[kind])
  if kind == "linear":
    if rope.get("factor") is None:
      raise ConfigError(f"{arch}: RoPE rope_type='linear' without a factor.")
    fields.update(rope_scaling_factor=float(rope["factor"]))
  elif kind == "yarn":
    # As transformers reads them: a top-level original_max_position_embeddings
    # first, then the RoPE's own, then max_position_embeddings; a missing factor
    # is the ratio of the two lengths.
    original = (c.get("original_max_position_embeddings")
                or rope.get("original_max_position_embeddings") or longest)
    factor = rope.get("factor") or longest / original
    unsupported = [
        f"{key}={rope[key]!r}" for key, default in (
            ("beta_fast", YARN_BETA_FAST), ("beta_slow", YARN_BETA_SLOW),
            ("attention_factor", yarn_attention_factor(factor)))
        if rope.get(key) is not None and rope[key] != default]
    if rope.get("mscale") and rope.get("mscale_all_dim"):
      unsupported.append(f"mscale={rope['mscale']!r} with "
                         f"mscale_all_dim={rope['mscale_all_dim']!r}")
    if unsupported:
      raise ConfigError(
          f"{arch}: YaRN with {', '.join(unsupported)} has no model.* equivalent; "
          f"model.rope_scaling='yarn' is the paper's (beta_fast {YARN_BETA_FAST:g}, "
          f"beta_slow {YARN_BETA_SLOW:g}, attention factor 0.1 ln(factor) + 1).")
    # truncate (transformers' default True): the ramp's ends rounded outwards.
    fields.update(rope_scaling_factor=float(factor), rope_original_max_len=int(original),
                  rope_yarn_truncate=bool(rope.get("truncate", True)))
  return fields


def hf_rope_parameters(m: ModelConfig, *, partial: bool = False) -> dict:
  """``rope_parameters`` of model.rope_*. Scalings without an HF rope_type (ntk)
  are written as the default, and a fraction where the architecture rotates
  whole heads is left out: both show as differences
  (convert.export_architecture)."""
  rope = {"rope_type": "default", "rope_theta": m.rope_base}
  if partial:
    rope.update(partial_rotary_factor=m.rope_fraction)
  if m.rope_scaling in ("linear", "yarn"):
    rope.update(rope_type=m.rope_scaling, factor=m.rope_scaling_factor)
  if m.rope_scaling == "yarn":
    rope.update(original_max_position_embeddings=m.rope_original_max_len)
    if not m.rope_yarn_truncate:  # transformers' default is True
      rope.update(truncate=False)
  return rope


def model_head_dim(width, d: int, h: int) -> int:
  """model.head_dim of an HF head width: 0 (derived) where it is d_model / num_heads."""
  if width is None or (d % h == 0 and width == d // h):
    return 0
  return int(width)


# Sliding-window attention: HF names each layer's kind in layer_types.
SLIDING, FULL = "sliding_attention", "full_attention"


def window_fields(arch: str, layer_types, window, num_layers: int) -> dict:
  """model.attention_window and model.global_every of HF's per-layer attention
  kinds: none sliding (0, 0), all sliding (window, 0), or layers k, 2k, ...
  (1-based) full and the others sliding (window, k). HF's sliding window keeps
  key k for query q iff q - k < sliding_window (masking_utils), as
  model.attention_window does. Other patterns are refused."""
  kinds = sorted(set(layer_types) - {SLIDING, FULL})
  if kinds or len(layer_types) != num_layers:
    raise ConfigError(
        f"{arch}: layer_types must name each of the {num_layers} layers "
        f"{SLIDING!r} or {FULL!r}; got {list(layer_types)!r}.")
  sliding = [kind == SLIDING for kind in layer_types]
  if not any(sliding):
    return dict(attention_window=0, global_every=0)
  if not window:
    raise ConfigError(f"{arch}: layer_types has {SLIDING!r} layers but sliding_window "
                      f"is {window!r}.")
  every = 0 if all(sliding) else sliding.index(False) + 1
  if sliding != [is_windowed(i, window, every) for i in range(num_layers)]:
    pattern = "".join("S" if x else "F" for x in sliding)
    raise ConfigError(
        f"{arch}: layer_types {pattern} (S sliding, F full) has no model.* equivalent; "
        "model.global_every k makes layers k, 2k, ... (1-based) full and the others "
        "sliding.")
  return dict(attention_window=int(window), global_every=every)


def hf_layer_types(m: ModelConfig) -> list[str]:
  """HF's layer_types of model.attention_window and model.global_every."""
  return [SLIDING if is_windowed(i, m.attention_window, m.global_every) else FULL
          for i in range(m.num_layers)]
