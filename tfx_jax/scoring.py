"""Scoring a trained run on a split: the library behind ``tfx_jax.evaluate``.

``score_split`` runs the run's own evaluation forward
(``run_setup.make_eval_step``, the one the training loop uses) over a split,
or, for a task that is scored by decoding (translation: BLEU and chrF), the
task's ``score_by_generation``. ``extrapolation`` is the ALiBi paper's length
extrapolation experiment; ``with_rope_scaling`` runs it on a RoPE model with its
positions scaled (position interpolation, NTK-aware, YaRN) without retraining.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from tfx_jax import run_setup
from tfx_jax import texts
from tfx_jax.errors import ConfigError
from tfx_jax.models import build_model
from tfx_jax.model_config import ModelConfig, position_capacity, validate
from tfx_jax.tasks import losses
from tfx_jax import tasks


def score_split(run, split="validation", *, max_batches=0, beam_size=4, alpha=0.6):
  """(metrics, hypotheses, references) of a loaded run on ``split``.

  ``max_batches`` > 0 scores at most that many evaluation batches (for a
  decoded task: that many batches' worth of examples).
  """
  config = run.config
  task = tasks.get(config.task)
  if task.score_by_generation is not None:
    return task.score_by_generation(run, split, max_examples=max_batches * config.eval.batch_size,
                             beam_size=beam_size, alpha=alpha)
  sharded = run.sharded or run_setup.ShardedRun(config, run.model_cfg)
  hyps, refs = [], []

  def collect(batch, pred):
    h, r = task.prediction_texts(batch, np.asarray(pred), run.tokenizer)
    hyps.extend(h)
    refs.extend(r)

  data = run_setup.make_data(config, run.tokenizer, split, train=False)
  sums = run_setup.evaluate_batches(sharded.eval_step(), run.params, data, sharded.mesh,
                                    max_batches=max_batches, on_batch=collect)
  if sums is None:
    raise ConfigError(f"split {split!r} of {config.data.name} yielded no batch.")
  metrics = {k.split("/", 1)[1]: v for k, v in tasks.metrics_from_sums(task, sums).items()}
  metrics["num_examples"] = len(hyps)
  return metrics, hyps, refs


# ----------------------------------------------------- length extrapolation
def parse_lengths(spec: str) -> list[int]:
  """``"1x,2x,4x"`` -> [1, 2, 4]; ConfigError for anything else."""
  out = []
  for part in spec.split(","):
    part = part.strip().lower()
    try:
      k = int(part[:-1]) if part.endswith("x") else int(part)
    except ValueError:
      k = 0
    if k < 1:
      raise ConfigError(f"--lengths={spec!r}: each entry must be a positive multiple "
                        "of the training length such as 1x, 2x, 4x, 8x.")
    out.append(k)
  return out


def with_rope_scaling(model_cfg: ModelConfig, seq_len: int, scaling: str,
                      factor: float | None = None,
                      original_max_len: int | None = None) -> ModelConfig:
  """``model_cfg`` with its rotary positions scaled, for evaluation at lengths
  beyond the training length ``seq_len`` (the parameters are unchanged).

  ``scaling`` is a ``model.rope_scaling`` value; ``factor`` is required unless
  it is "none"; YaRN's pre-training context ``original_max_len`` defaults to
  ``seq_len``. ConfigError for a run without RoPE or an invalid combination,
  before anything is traced.
  """
  flag = f"--rope_scaling={scaling}"
  if model_cfg.position != "rope":
    raise ConfigError(f"{flag} scales rotary positions: it needs a run with "
                      f"model.position='rope'; this one has {model_cfg.position!r}.")
  if factor is None and scaling != "none":
    raise ConfigError(f"{flag} needs --rope_scaling_factor, the context extension "
                      "(e.g. 4 to evaluate at 4x the training length).")
  if original_max_len is None and scaling == "yarn":
    original_max_len = seq_len
  cfg = dataclasses.replace(model_cfg, rope_scaling=scaling,
                            rope_scaling_factor=1.0 if factor is None else float(factor),
                            rope_original_max_len=original_max_len or 0)
  try:
    return validate(cfg)
  except ConfigError as e:
    raise ConfigError(f"{flag}: {e}") from None


def rope_scaling_tag(cfg: ModelConfig) -> str:
  """The RoPE scaling of ``cfg`` in a file name: none, linear-x2, yarn-x4-from512."""
  tag = cfg.rope_scaling
  if cfg.rope_scaling != "none":
    tag += f"-x{cfg.rope_scaling_factor:g}"
  if cfg.rope_scaling == "yarn":
    tag += f"-from{cfg.rope_original_max_len}"
  return tag


def extrapolation(run, split: str, multiples: list[int], max_windows: int = 0):
  """Perplexity on non-overlapping windows of k * L tokens for each k.

  Every length scores the same tokens: the first ``n`` tokens of the split,
  with n a multiple of the longest window. Rows whose windows are longer than
  learned absolute positions can represent are reported as unavailable.
  """
  if run.model_cfg.family != "decoder_only":
    raise ConfigError("--lengths evaluates language models (model.family="
                      f"'decoder_only'); this run is {run.model_cfg.family!r}.")
  L = int(run.config.train.seq_len)
  longest = max(multiples) * L
  n_windows = max_windows or 8
  stream = texts.token_stream(run, split, n_windows * longest + 1)
  usable = ((len(stream) - 1) // longest) * longest
  if usable == 0:
    raise ConfigError(f"split {split!r} has fewer than {longest + 1} tokens.")
  model = build_model(run.model_cfg)
  capacity = position_capacity(run.model_cfg)

  @jax.jit
  def nll(params, inputs, targets):
    out = model.apply({"params": params}, inputs)
    batch = {"targets": targets, "weights": np.ones(targets.shape, np.float32)}
    _, sums = losses.token_loss(out, batch)
    return sums["nll"], sums["weight"]

  rows = []
  for k in multiples:
    length = k * L
    if capacity is not None and length > capacity:
      rows.append({"multiple": k, "length": length, "perplexity": None,
                   "note": f"learned positions end at max_len={capacity}"})
      continue
    total, count = 0.0, 0.0
    for start in range(0, usable, length):
      window = stream[start:start + length + 1]
      a, b = nll(run.params, window[None, :-1], window[None, 1:])
      total, count = total + float(a), count + float(b)
    rows.append({"multiple": k, "length": length, "tokens": int(count),
                 "perplexity": math.exp(min(total / count, 50.0))})
  return rows


def format_extrapolation(rows, position: str, rope_scaling: str | None = None) -> str:
  """The extrapolation rows as a console table (``rope_scaling``: a scaling
  applied at evaluation, as ``rope_scaling_tag`` names it)."""
  scaled = f", rope_scaling={rope_scaling}" if rope_scaling else ""
  lines = [f"length extrapolation (model.position={position}{scaled})",
           f"{'window':>8} {'tokens':>10} {'perplexity':>12}"]
  for r in rows:
    ppl = f"{r['perplexity']:.2f}" if r["perplexity"] is not None else "n/a"
    note = f"  ({r['note']})" if r.get("note") else ""
    lines.append(f"{str(r['multiple']) + 'x=' + str(r['length']):>8} "
                 f"{r.get('tokens', 0):>10} {ppl:>12}{note}")
  return "\n".join(lines)
