"""The ``model.activation`` axis's own numbers: gpt-oss's clamped SwiGLU.

The fields are ``ModelConfig``'s (``config.py``, which calls :func:`validate`);
the activation is ``model/layers/ffn.py``'s. Kept apart from ``config.py`` as
``config_moe.py`` is; it reads the config's fields and does not import it.

``activation='swiglu_oss'`` (OpenAI's gpt-oss; transformers'
``GptOssExperts._apply_gate``), for a gate g = x W and an up projection u = x V:

  g' = min(g, l),  u' = clip(u, -l, l),  h = g' sigmoid(alpha g') (u' + 1)

with l = ``model.swiglu_limit`` (gpt-oss: 7) and alpha = ``model.swiglu_alpha``
(gpt-oss: 1.702, the sigmoid gain with which x sigmoid(1.702 x) approximates
GELU, Hendrycks & Gimpel 2016).
"""

from __future__ import annotations

import dataclasses
import math

from tfx_jax.core.errors import ConfigError, InactiveSetting

# The fields that only activation='swiglu_oss' reads.
SWIGLU_OSS_FIELDS = ("swiglu_limit", "swiglu_alpha")


def validate(cfg) -> None:
  """model.swiglu_limit and model.swiglu_alpha: finite and > 0, and set only
  with ``model.activation='swiglu_oss'``, the one activation that reads them."""
  defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
  if cfg.activation != "swiglu_oss":
    for name in SWIGLU_OSS_FIELDS:
      if getattr(cfg, name) != defaults[name]:
        raise InactiveSetting(
            f"model.{name}", defaults[name],
            f"model.{name}={getattr(cfg, name)!r} is read by model.activation="
            f"'swiglu_oss' only (activation is {cfg.activation!r}); leave it at "
            f"{defaults[name]!r} or set model.activation=swiglu_oss.")
    return
  for name in SWIGLU_OSS_FIELDS:
    value = getattr(cfg, name)
    if not (math.isfinite(value) and value > 0):
      raise ConfigError(f"model.{name} must be finite and > 0 (gpt-oss: "
                        f"{defaults[name]}), got {value}.")
