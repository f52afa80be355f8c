"""The attention and token-mixing axes of 2026 at a matched budget: latent
attention against grouped keys, attention sinks with sliding windows, the
value residual, Gated DeltaNet hybrids, and how interleaved NoPE and the
hybrids extrapolate past the training length.

  python -m tfx_jax.sweep experiments/attention.py:tiny --parallel 2     # ~2 minutes
  python -m tfx_jax.sweep experiments/attention.py:kv --parallel 2
  python -m tfx_jax.report runs/attention_kv

Every variant trains the tiny decoder-only LM (d_model 128, 4 heads of 32,
vocabulary 1,024, the embedded Shakespeare corpus, 16 x 64 tokens per step)
for ``STEPS`` steps; ``value_residual``, ``hybrid`` and ``extrapolation`` at
4 layers (a value residual needs layers after the first to act on, a 3:1
pattern needs 4), the others at the preset's 2. What each comparison holds
equal is stated per variant; every point's total parameters, training FLOPs
per token and KV-cache bytes per token are in the report's point table, so a
reader sees what was not held equal. ``configs/lm.py``'s ``matched`` sets
the FFN width that holds the parameters equal (within 1%).

Variants:

- ``kv``: multi-head attention (the base) against grouped keys (GQA, 2 KV
  heads), one KV head (MQA) and DeepSeek-V2's multi-head latent attention at
  its default widths (latent 4 x 32, decoupled RoPE 16), all at the base's
  parameters; then MLA with its latent cut so that its cache equals GQA's
  (``MLA_AT_GQA``: d_c + d_R = 2 x 2 KV heads x 32 = 128 elements per token
  per layer), at the same parameters. DeepSeek-V2 (appendix D.1-D.2): MHA
  beats GQA and MQA, and MLA beats MHA with a far smaller cache.
- ``sinks``: a sliding window of 16 tokens on every other layer (gpt-oss
  alternates windowed and full layers) without and with a learned sink logit
  per head (gpt-oss; StreamingLLM's pre-training with a sink token: no loss
  at the training length). Streaming past the training length with an
  evicting cache, the sinks' main use, is not tested here.
- ``value_residual``: none, fixed (V_n <- 0.5 V_1 + 0.5 V_n, ResFormer) and
  learned lambdas per layer; the same parameters up to the lambdas (2 per
  layer). ResFormer: the same loss with about 16% fewer parameters, so a
  lower loss at the same parameters.
- ``hybrid``: 0, 1/4, 1/2 and 3/4 of the layers Gated DeltaNet (``""``,
  ``DAAA``, ``DADA``, ``DDDA``: Qwen3-Next's 3:1 is the last) at the
  full-attention model's parameters (the FFN narrower where DeltaNet layers
  hold more). Gated DeltaNet paper, Qwen3-Next, Kimi Linear: hybrids at
  least match full attention at matched parameters (the papers' hybrids are
  ahead, so the claim is read as a lower loss).
- ``extrapolation``: trained at 64 tokens of contiguous text
  (``data.packing=stream``), scored on the test split at 1x-8x that length,
  every length on the same first 65,536 tokens (as ``positions.py``): RoPE on
  every layer (the base), RoPE with every fourth layer NoPE (Llama 4's
  ``nope_every`` 4), the 3:1 DeltaNet hybrid with RoPE in its attention
  layer, and the hybrid with that layer NoPE (Kimi Linear's full-attention
  layers have no position encoding); each at the base's parameters.
  Claims read ln ppl@kx - ln ppl@1x per seed against RoPE's.
- ``costs``: every point above (with its variant's layers, windows or
  pattern), 200 steps on one seed at the preset's rate: the step time and
  memory of each on the machine that runs it, no verdict.
- ``tiny``: MHA, MLA and a 1:1 hybrid with sinks, 20 steps, one seed (the
  smoke test).

Each point's learning rate is chosen over ``RATES`` on the validation split
of tuning seed 0; then ``CONFIRM`` fresh confirmation seeds per point at its
chosen rate, paired, and the claims read those (Holm over each variant's
claims). The report gives each point's step time and memory on the machine
that ran it beside its loss. Each variant fits one session of ``--parallel
2`` on a 2-core CPU; docs/results.md gives each one's measured time.
"""

import pathlib

from tfx_jax.run.config_base import load_config_module
from tfx_jax.sweep import Claim, Equivalent, Sweep

STEPS = 800
RATES = [1e-3, 3e-3, 1e-2]
CONFIRM = 4
# The tiny LM's heads (configs/lm.py): 4 of 32 at d_model 128.
HEAD_DIM = 32
# Every intermediate evaluation reads 8 batches of the fixed evaluation
# shuffle; the last one and the test pass read the whole split.
COMMON = {"train.num_steps": STEPS, "optim.warmup_steps": 40, "eval.every_steps": 200,
          "eval.num_batches": 8, "eval.final_batches": 0, "eval.num_samples": 0,
          "checkpoint.every_steps": 200, "train.log_every_steps": 50}
DEEP = {"model.num_layers": 4}
# Windows of the longest (8x) length each length reads (positions.py).
WINDOWS = 128


def _lm_configs():
  """configs/lm.py, loaded by path (configs/ is not a package)."""
  return load_config_module(pathlib.Path(__file__).resolve().parents[1] / "configs" / "lm.py")


def _matched(common=None, **variant) -> dict:
  return _lm_configs().matched("tiny", "params", common=common, **variant)


def mla_rank_at(kv_heads: int, rope_dim: int = HEAD_DIM // 2) -> int:
  """MLA's latent rank whose cache per token (d_c + d_R) equals grouped
  attention's with ``kv_heads`` KV heads of the tiny LM (2 x heads x 32)."""
  return 2 * kv_heads * HEAD_DIM - rope_dim


# ---------------------------------------------------------------- kv
def kv_points() -> list[dict]:
  return [{}, _matched(num_kv_heads=2), _matched(num_kv_heads=1),
          _matched(attention_type="mla"),
          _matched(attention_type="mla", mla_kv_rank=mla_rank_at(2))]


DEEPSEEK = "DeepSeek-V2 (appendix D)"


def _kv_claims(points) -> list[Claim]:
  mha, gqa, mqa, mla, mla_small = points
  return [
      Claim("mla_vs_mha", DEEPSEEK, "at matched parameters multi-head latent attention "
            "reaches a lower loss than multi-head attention, with a smaller cache (here 144 "
            "against 256 elements per token per layer)",
            compare=(mla, "base"), metric="eval/loss", expect="lower"),
      Claim("gqa_vs_mha", DEEPSEEK, "grouped keys (GQA) trail multi-head attention",
            compare=(gqa, "base"), metric="eval/loss", expect="higher"),
      Claim("mqa_vs_mha", DEEPSEEK, "one key head (MQA) trails multi-head attention",
            compare=(mqa, "base"), metric="eval/loss", expect="higher"),
      Claim("mla_vs_gqa_same_cache", DEEPSEEK, "at the same cache bytes and parameters, "
            "latent attention reaches a lower loss than grouped keys",
            compare=(mla_small, gqa), metric="eval/loss", expect="lower")]


# ---------------------------------------------------------------- sinks
WINDOW = {"model.attention_window": 16, "model.global_every": 2}
SINKS = {"model.attention_sinks": True}


def _sinks_claims() -> list[Claim]:
  return [Claim(
      "sinks_level", "Xiao et al. 2024 (StreamingLLM, section 3.3)", "a learned sink "
      "costs nothing at the training length: with sliding windows the model with sinks "
      "reaches the same loss as without (within 0.01 nats)",
      compare=(SINKS, "base"), metric="eval/loss", expect=Equivalent(0.01))]


# ---------------------------------------------------------------- value residual
RESFORMER = "Zhou et al. 2025 (ResFormer)"


def _value_residual_claims() -> list[Claim]:
  return [
      Claim(f"value_residual_{kind}", RESFORMER, f"the value residual ({kind}) reaches a "
            "lower loss than none at the same parameters (the paper: the same loss with "
            "about 16% fewer parameters)",
            compare=(kind, "none"), metric="eval/loss", expect="lower")
      for kind in ("fixed", "learned")]


# ---------------------------------------------------------------- hybrid
PATTERNS = ["DAAA", "DADA", "DDDA"]


def hybrid_points() -> list[dict]:
  return [{}, *(_matched(common=DEEP, mixer_pattern=p) for p in PATTERNS)]


GDN = "Yang et al. 2025 (Gated DeltaNet); Qwen3-Next; Kimi Linear"


def _hybrid_claims(points) -> list[Claim]:
  share = {"DAAA": "1/4", "DADA": "1/2", "DDDA": "3/4"}
  return [Claim(f"hybrid_{p.lower()}", GDN, f"a hybrid with {share[p]} of its layers Gated "
                "DeltaNet reaches a lower loss than full attention at matched parameters",
                compare=(point, "base"), metric="eval/loss", expect="lower")
          for p, point in zip(PATTERNS, points[1:])]


# ---------------------------------------------------------------- extrapolation
NOPE = {"model.nope_every": 4}
STREAM = {"data.packing": "stream", "model.max_len": 512}


def extrapolation_points() -> list[dict]:
  hybrid = _matched(common={**DEEP, **STREAM}, mixer_pattern="DDDA")
  return [{}, dict(NOPE), hybrid, dict(hybrid, **NOPE)]


def _lengths(max_batches: int) -> list:
  return [["--lengths", "1x,2x,4x,8x", "--max_batches", str(max_batches), "--split", "test"]]


def _label(point: dict) -> str:
  """The report's label of a point on an axis of several fields: a dict would
  name every point that holds it (the NoPE point's field is in the NoPE
  hybrid's too)."""
  return ",".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())


def _extrapolation_claims(points) -> list[Claim]:
  _, nope, hybrid, hybrid_nope = (_label(p) for p in points)
  out = []
  for name, point, source, words in (
      ("nope", nope, "Yang et al. 2025 (arXiv 2501.18795); Llama 4",
       "RoPE with every fourth layer NoPE"),
      ("hybrid", hybrid, "Yang et al. 2025 (Gated DeltaNet)", "the 3:1 DeltaNet hybrid"),
      ("hybrid_nope", hybrid_nope, "Kimi Linear", "the 3:1 hybrid with a NoPE attention "
       "layer")):
    out.append(Claim(
        f"{name}_8x", source, f"beyond the training length {words} degrades less than "
        "RoPE on every layer (8x, relative to 1x)",
        compare=(point, "base"), metric="ppl@8x/1x", expect="lower"))
  return out


# ---------------------------------------------------------------- costs
def cost_points() -> list[dict]:
  """Every point of the variants above with the overrides its variant holds in
  common (the 2-layer base first, the 4-layer one among them), for ``costs``."""
  window = [dict(WINDOW), dict(WINDOW, **SINKS)]
  deep = [dict(DEEP), *({**DEEP, "model.value_residual": k} for k in ("fixed", "learned")),
          *({**DEEP, **p} for p in hybrid_points()[1:]), dict(DEEP, **NOPE)]
  return [*kv_points(), *window, *deep]


# ---------------------------------------------------------------- sweeps
def _sweep(name: str, description: str, axes, claims, overrides=None, **fields) -> Sweep:
  return Sweep(name=f"attention_{name}", config="configs/lm.py:tiny",
               description=description, overrides={**COMMON, **(overrides or {})},
               axes=axes, tune={"optim.learning_rate": RATES}, seeds=[0], confirm=CONFIRM,
               claims=claims, **fields)


def get_sweep(variant: str = "default") -> Sweep:
  if variant == "default":
    variant = "kv"
  if variant == "kv":
    points = kv_points()
    return _sweep("kv", "Multi-head attention against GQA (2 KV heads), MQA and MLA at "
                  "matched parameters, and MLA with GQA's cache bytes (DeepSeek-V2).",
                  [points], _kv_claims(points))
  if variant == "sinks":
    return _sweep("sinks", "A 16-token sliding window on every other layer, without and "
                  "with a learned sink logit per head (gpt-oss).",
                  [[{}, SINKS]], _sinks_claims(), overrides=WINDOW)
  if variant == "value_residual":
    return _sweep("value_residual", "No value residual, ResFormer's fixed one and learned "
                  "lambdas, 4 layers.",
                  [{"model.value_residual": ["none", "fixed", "learned"]}],
                  _value_residual_claims(), overrides=DEEP)
  if variant == "hybrid":
    points = hybrid_points()
    return _sweep("hybrid", "0, 1/4, 1/2 and 3/4 of 4 layers Gated DeltaNet at matched "
                  "parameters.", [points], _hybrid_claims(points), overrides=DEEP)
  if variant == "extrapolation":
    points = extrapolation_points()
    return _sweep("extrapolation", "RoPE, interleaved NoPE, the 3:1 DeltaNet hybrid and "
                  "the hybrid with a NoPE attention layer, trained at 64 tokens of contiguous "
                  "text, test perplexity at 1x-8x the training length.",
                  [points], _extrapolation_claims(points), overrides={**DEEP, **STREAM},
                  evaluations=_lengths(WINDOWS))
  if variant == "costs":
    return Sweep(
        name="attention_costs", config="configs/lm.py:tiny",
        description="Every variant's points, 200 steps on one seed at the tiny LM's "
        "rate, for their step time and memory on this machine.",
        overrides={**COMMON, "train.num_steps": 200, "eval.every_steps": 200},
        axes=[cost_points()], seeds=[0])
  if variant == "tiny":
    tiny = {"train.num_steps": 20, "eval.every_steps": 20, "eval.num_batches": 2,
            "eval.at_start": False, "checkpoint.every_steps": 20, "eval.num_samples": 0,
            "optim.warmup_steps": 5}
    return Sweep(name="attention_tiny", config="configs/lm.py:tiny", overrides=tiny,
                 axes=[[{}, _matched(attention_type="mla"),
                        _matched(mixer_pattern="DA", attention_sinks=True)]], seeds=[0])
  raise ValueError(f"unknown variant {variant!r}; choose tiny, kv (default), sinks, "
                   "value_residual, hybrid, extrapolation or costs")
