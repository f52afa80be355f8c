"""Decoder-only language model (GPT / LLaMA style).

  python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/lm_tiny
  python -m tfx_jax.summary --config configs/lm.py:llama_7b

Presets: tiny (default data: the embedded Shakespeare corpus, ~1 minute on
2 CPU cores), small, gpt2_small, llama_7b, llama_13b, llama_33b, llama_65b.
Each preset is one row of ``_PRESETS``, applied over ``_COMMON``.

``moe_variant(preset, ...)`` gives the overrides that turn a preset's dense
FFN into a mixture of experts with the same active, or the same total,
parameters, for a sweep axis of dense vs MoE (experiments/moe.py):

  python -m tfx_jax.summary --config configs/lm.py:tiny --config.model.ffn_type=moe \
      --config.model.expert_d_ff=254     # = moe_variant("tiny")["model.expert_d_ff"]

``matched(preset, match, **variant)`` gives the overrides that turn a preset
into ``variant`` at the preset's budget (``match``: parameters, training FLOPs
per token, or KV-cache bytes per token), the FFN width (or the KV heads)
adjusted; an axis of a sweep is matched by building its values with it:

  axes=[[{}, lm.matched("tiny", "params", activation="swiglu"),
         lm.matched("tiny", "params", num_kv_heads=1)]]
"""

import dataclasses
import functools

from tfx_jax.core.errors import ConfigError
from tfx_jax.run.config_base import apply_overrides, apply_preset, base_config, select_preset
from tfx_jax.model.config import ModelConfig, model_config_from_dict

# Every preset starts from these; a row overrides what its paper does differently.
# No embedding scaling: GPT-2 and LLaMA add positions to E[id] as it is.
_COMMON = {
    "model": dict(family="decoder_only", norm_position="pre", norm_type="layernorm",
                  activation="gelu", position="rope", use_bias=False,
                  tie_embeddings=True, scale_embeddings=False),
}

# LLaMA (Touvron et al. 2023, Table 2): d_model, heads, layers. d_ff follows
# LLaMA's rule: 2/3 * 4d rounded up to a multiple of 256.
_LLAMA = {
    "llama_7b": (4096, 32, 32),
    "llama_13b": (5120, 40, 40),
    "llama_33b": (6656, 52, 60),
    "llama_65b": (8192, 64, 80),
}


def _llama(d_model, num_heads, num_layers):
  return {
      "vocab_size": 32000,
      "model": dict(num_layers=num_layers, d_model=d_model, num_heads=num_heads,
                    max_len=2048, norm_type="rmsnorm", activation="swiglu",
                    ff_multiple_of=256, position="rope", use_bias=False,
                    tie_embeddings=False, norm_eps=1e-6, scan_layers=True, remat="full"),
      "train": dict(seq_len=2048),
      "compute_dtype": "bfloat16",
  }


_PRESETS = {
    "tiny": {
        "vocab_size": 1024,
        "model": dict(num_layers=2, d_model=128, num_heads=4, dropout=0.0, max_len=256),
        "train": dict(num_steps=500, batch_size=16, seq_len=64, log_every_steps=25),
        # The whole validation split (num_batches=0) at steps 0, 250 and 500: 4
        # batches (64 rows) gave the final loss an evaluation standard error of
        # 0.053 nats, as large as the seed-to-seed spread (0.038 at 300 steps); the
        # whole split (3,276 rows) 0.007, under a quarter of it.
        "eval": dict(every_steps=250, num_batches=0, batch_size=16),
        "checkpoint": dict(every_steps=100),
        "optim": dict(learning_rate=3e-3, warmup_steps=30, schedule="cosine"),
    },
    "small": {
        "vocab_size": 8192,
        "model": dict(num_layers=6, d_model=384, num_heads=6, dropout=0.1, max_len=512),
        "train": dict(num_steps=5000, batch_size=32, seq_len=256),
        "optim": dict(learning_rate=1e-3, warmup_steps=500),
    },
    # Radford et al. 2019: 12 layers, d 768, 12 heads, learned positions (1024),
    # GELU, pre-norm LayerNorm, biases, tied embeddings, vocab 50257; dropout 0.1
    # on the residual, embedding and attention probabilities (GPT-1, and GPT-2's
    # released hyper-parameters: resid/embd/attn_pdrop 0.1).
    "gpt2_small": {
        "vocab_size": 50257,
        "compute_dtype": "bfloat16",  # a GPU preset: bf16 compute, float32 parameters
        "model": dict(num_layers=12, d_model=768, num_heads=12, d_ff=3072, max_len=1024,
                      position="learned", activation="gelu", use_bias=True,
                      norm_eps=1e-5, dropout=0.1, attention_dropout=0.1,
                      tie_embeddings=True),
        "train": dict(seq_len=1024),
    },
    **{name: _llama(*sizes) for name, sizes in _LLAMA.items()},
}
PRESETS = tuple(_PRESETS)


def get_config(preset: str = "tiny"):
  row = select_preset(_PRESETS, preset, "lm.py")
  c = base_config()
  c.task = "lm"
  apply_preset(c, _COMMON)
  apply_preset(c, row)
  c.lock()
  return c


def moe_variant(preset: str = "tiny", *, num_experts: int = 8, experts_per_token: int = 2,
                shared_experts: int = 0, match: str = "active") -> dict:
  """``model.*`` overrides of a MoE variant of ``preset`` whose FFN layers
  have as many active (``match="active"``: what a token computes with) or
  total (``"total"``) parameters as the dense FFN, in the dense model's
  activation (each expert gated or not as the preset's FFN).

  A dense FFN of width F with m matrices of D x F (m = 2, or 3 gated) has
  m D F parameters; the MoE layer has a router of D E and experts of width
  F_e, of which k + s are active (k routed, s shared) and E + s exist, so
  the width that matches is
    active: m D F = m D F_e (k + s) + D E  ->  F_e = (m F - E) / (m (k + s)),
    total:  m D F = m D F_e (E + s) + D E  ->  F_e = (m F - E) / (m (E + s)),
  rounded down (``python -m tfx_jax.summary`` prints both counts). Matched
  active parameters is Fedus et al. 2022's and OLMoE's comparison (same
  FLOPs per token); matched total, the same memory.
  """
  if match not in ("active", "total"):
    raise ValueError(f"match={match!r}; choose 'active' or 'total'")
  cfg = model_config_from_dict(get_config(preset).model)
  m = 3 if cfg.gated else 2
  experts = experts_per_token if match == "active" else num_experts
  width = (m * cfg.ffn_dim - num_experts) // (m * (experts + shared_experts))
  if width < 1:
    raise ValueError(f"{preset}: no expert width matches {match} parameters with "
                     f"{num_experts} experts, {experts_per_token} per token and "
                     f"{shared_experts} shared (dense FFN width {cfg.ffn_dim})")
  return {"model.ffn_type": "moe", "model.num_experts": num_experts,
          "model.experts_per_token": experts_per_token,
          "model.shared_experts": shared_experts, "model.expert_d_ff": width}


# What ``matched`` holds equal, by ``match``; within this fraction of the preset.
MATCHES = ("params", "flops", "kv")
MATCH_TOLERANCE = 0.01
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


def _path(key: str) -> str:
  """A variant's key as a config path: a model field by its name (``activation``),
  anything else by its dotted path (``train.seq_len``) or top-level name."""
  return f"model.{key}" if "." not in key and key in _MODEL_FIELDS else key


def _resolved(preset: str, overrides: dict):
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  config = get_config(preset)
  apply_overrides(config, overrides)
  return run_config.resolve(config)


@functools.lru_cache(maxsize=64)
def _shapes(model_cfg: ModelConfig):
  from tfx_jax.run import footprint  # pylint: disable=import-outside-toplevel
  return footprint.param_shapes(model_cfg)


def _budget(run, match: str) -> int:
  """The budget ``match`` of a resolved run (``footprint.budgets``)."""
  from tfx_jax.model import budgets  # pylint: disable=import-outside-toplevel
  from tfx_jax.run import footprint  # pylint: disable=import-outside-toplevel
  if match == "kv":
    return budgets.kv_cache_bytes_per_token(run.model)
  return footprint.budgets(run.model, run.train.seq_len,
                           _shapes(run.model))[footprint.BUDGET_KEYS[match]]


# The field ``match="kv"`` adjusts, by the variant's attention kind
# (``budgets.layer_kinds``), and the values it may take.
_KV_KNOBS = {
    "attention": ("num_kv_heads", lambda cfg: [n for n in range(1, cfg.num_heads + 1)
                                               if cfg.num_heads % n == 0]),
    "mla": ("mla_kv_rank", lambda cfg: range(1, 4 * cfg.d_model + 1)),
}


def _within(value: int, target: int) -> bool:
  return abs(value - target) <= MATCH_TOLERANCE * target


def matched(preset: str = "tiny", match: str = "params", *, common=None, **variant) -> dict:
  """The overrides that turn ``preset`` into ``variant`` (model fields by name,
  other fields by dotted path, e.g. ``**{"train.seq_len": 128}``) with one
  field adjusted so that the variant's budget equals the preset's within 1%
  (``MATCH_TOLERANCE``); ``common``: overrides applied to both (a sweep's).

  ``match``: ``"params"`` (total parameters) or ``"flops"`` (training FLOPs per
  token at train.seq_len), both as ``python -m tfx_jax.summary`` counts them,
  adjust the FFN width: ``model.d_ff`` of a plain FFN, ``model.gated_d_ff``
  of a gated one (``ModelConfig.ffn_dim``). Both counts are affine in the
  width, so it is solved from the variant at its own width and at a wider
  one, rounded to an integer and checked. ``"kv"`` (the KV cache's bytes per
  token, ``model/budgets.py``) adjusts the KV heads (``model.num_kv_heads``, a
  divisor of num_heads), or an MLA variant's latent rank
  (``model.mla_kv_rank``): the closest value. A ConfigError where the variant
  sets the adjusted field itself, or no value comes within 1%.
  """
  if match not in MATCHES:
    raise ConfigError(f"matched(match={match!r}): choose one of {', '.join(MATCHES)}.")
  common = {_path(k): v for k, v in (common or {}).items()}
  overrides = {_path(k): v for k, v in variant.items()}
  target = _budget(_resolved(preset, common), match)
  run = _resolved(preset, {**common, **overrides})
  if match == "kv":
    field, value = _match_kv(preset, run.model, target, overrides)
  else:
    field, value = _match_width(preset, match, run, target, {**common, **overrides})
  out = {**overrides, f"model.{field}": value}
  got = _budget(_resolved(preset, {**common, **out}), match)
  if not _within(got, target):
    raise ConfigError(
        f"matched({preset!r}, {match!r}, {variant}): model.{field}={value} gives {got:,} "
        f"against the preset's {target:,}, {100 * abs(got / target - 1):.2f}% away; no "
        f"value of model.{field} comes within {100 * MATCH_TOLERANCE:g}%.")
  return out


def _match_width(preset, match, run, target, overrides) -> tuple[str, int]:
  field = "gated_d_ff" if run.model.gated else "d_ff"
  if f"model.{field}" in overrides:
    raise ConfigError(f"matched adjusts model.{field} (the FFN width) to match {match}: "
                      "leave it out of the variant.")
  width = run.model.ffn_dim
  step = max(8, width // 4)
  b0 = _budget(run, match)
  b1 = _budget(_resolved(preset, {**overrides, f"model.{field}": width + step}), match)
  if b1 == b0:
    raise ConfigError(f"matched({preset!r}, {match!r}): model.{field} does not change "
                      f"this variant's {match} (its FFN width is not the dense FFN's).")
  value = round(width + (target - b0) * step / (b1 - b0))
  if value < 1:
    raise ConfigError(
        f"matched({preset!r}, {match!r}): the variant's {match} at FFN width 1 is already "
        f"above the preset's {target:,}: no model.{field} matches it.")
  return field, value


def _match_kv(preset, model_cfg, target, overrides) -> tuple[str, int]:
  from tfx_jax.model import budgets  # pylint: disable=import-outside-toplevel
  kinds = [k for k in _KV_KNOBS if k in budgets.layer_kinds(model_cfg)]
  if not target or not kinds:
    raise ConfigError(f"matched({preset!r}, 'kv'): the preset or the variant caches no "
                      "keys and values per token (no attention layer that decodes).")
  field, values = _KV_KNOBS[kinds[-1]]
  if f"model.{field}" in overrides:
    raise ConfigError(f"matched adjusts model.{field} to match the KV cache: leave it out "
                      "of the variant.")
  best = min(values(model_cfg), key=lambda v: abs(budgets.kv_cache_bytes_per_token(
      dataclasses.replace(model_cfg, **{field: v})) - target))
  return field, best
