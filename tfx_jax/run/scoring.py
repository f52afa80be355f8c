"""Scoring a trained run on a split: the library behind ``tfx_jax.evaluate``.

``score_split`` runs the run's own evaluation forward
(``run_setup.make_eval_step``, the one the training loop uses) over a split,
and, for a task that is scored by decoding (translation: BLEU and chrF), the
task's ``score_by_generation`` besides. ``extrapolation`` is the ALiBi paper's length
extrapolation experiment; ``with_rope_scaling`` runs it on a RoPE model with its
positions scaled (position interpolation, NTK-aware, YaRN) without retraining.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from tfx_jax.run import setup as run_setup
from tfx_jax.data import pipeline
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import sources
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.families import build_model
from tfx_jax.model.config import ModelConfig, position_capacity, validate
from tfx_jax.tasks import losses
from tfx_jax import tasks


def score_split(run, split="validation", *, max_batches=0, beam_size=4, alpha=0.6):
  """(metrics, hypotheses, references) of a loaded run on ``split``.

  Every task gets its teacher-forced metrics (loss and, as the task has them,
  perplexity, accuracy and bits per byte, each mean with its standard error:
  the training loop's evaluation). A task scored by decoding (translation) adds its
  decoded metrics (BLEU, chrF), and its hypotheses and references are the
  decoded texts: Vaswani et al.'s Table 3 reports dev perplexity beside BLEU.
  ``max_batches`` > 0 scores at most that many evaluation batches (for a
  decoded task: that many batches' worth of examples).
  """
  config = run.config
  task = tasks.get(config.task)
  decoded = task.score_by_generation is not None
  sharded = run.sharded or run_setup.ShardedRun(
      config, run.model_cfg, byte_lengths=run.tokenizer.byte_lengths())
  hyps, refs = [], []

  def collect(batch, pred):
    h, r = task.prediction_texts(batch, np.asarray(pred), run.tokenizer)
    hyps.extend(h)
    refs.extend(r)

  data = run_setup.make_data(config, run.tokenizer, split, train=False)
  sums = run_setup.evaluate_batches(sharded.eval_step(), run.params, data, sharded.mesh,
                                    max_batches=max_batches,
                                    on_batch=None if decoded else collect)
  if sums is None:
    raise ConfigError(f"split {split!r} of {config.data.name} yielded no batch.")
  metrics = {k.split("/", 1)[1]: v for k, v in tasks.metrics_from_sums(task, sums).items()}
  if decoded:
    scores, hyps, refs = task.score_by_generation(
        run, split, max_examples=max_batches * config.eval.batch_size,
        beam_size=beam_size, alpha=alpha)
    metrics.update(scores)
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


# How ``extrapolation`` reads a split under each ``data.packing`` (in the table).
LENGTH_FORMATS = {
    "stream": "windows of the split's token stream, through document ends, as trained",
    "documents": "whole documents packed into rows, attention within each, as trained",
}


def _leading_documents(run, split: str, tokens: int) -> tuple[list, int]:
  """(the first documents of ``split`` whose token stream, ``data.stream``,
  holds ``tokens``, or all of them; that stream's length). The train split's
  are those of the run's ``data.train_fraction``."""
  data = run.config.data
  keys = sources.resolve_keys(data)
  src = sources.open_source(sources.dataset_name(data), split, data.data_dir or None)
  out, count = [], 1  # the stream's bos
  for i in range(sources.leading_examples(len(src), data, split)):
    example = src[i]
    out.append(example)
    text = rows_lib.example_text(example, keys.text_key)
    if text.strip():
      count += len(run.tokenizer.encode(text)) + 1
    if count >= tokens:
      break
  return out, count


def extrapolation(run, split: str, multiples: list[int], max_windows: int = 0):
  """Perplexity at k x the training length L for each k, read as the run was
  trained (``data.packing``, ``LENGTH_FORMATS``), every length scoring the
  same tokens: those of the first documents of the split that hold ``n``
  tokens, n = ``max_windows`` (default 8) windows of the longest length.

  stream: the first n tokens of the stream in windows of k L; the context runs
  through document ends at every k. documents: those documents packed into
  rows of k L instead of L (attention within a document, positions from 0),
  so that only documents longer than L see a context longer than in training.
  Either way the 1x row is the run's own evaluation format. Rows whose windows
  are longer than learned absolute positions can represent are unavailable.
  """
  if run.model_cfg.family != "decoder_only":
    raise ConfigError("--lengths evaluates language models (model.family="
                      f"'decoder_only'); this run is {run.model_cfg.family!r}.")
  L = int(run.config.train.seq_len)
  longest = max(multiples) * L
  wanted = (max_windows or 8) * longest
  documents, count = _leading_documents(run, split, wanted + 1)
  usable = min(wanted, ((count - 1) // longest) * longest)
  if usable == 0:
    raise ConfigError(f"split {split!r} has fewer than {longest + 1} tokens.")
  packing = run.config.data.packing
  # The documents read are the whole source: no training fraction on top.
  data = dataclasses.replace(run.config.data, train_fraction=1.0)
  task = tasks.get(run.config.task)
  model = build_model(run.model_cfg)
  capacity = position_capacity(run.model_cfg)

  @jax.jit
  def nll(params, batch):
    out = model.apply({"params": params}, **task.model_inputs(batch))
    _, sums = losses.token_loss(out, batch)
    return sums["nll"], sums["weight"]

  rows = []
  for k in multiples:
    length = k * L
    if capacity is not None and length > capacity:
      rows.append({"multiple": k, "length": length, "perplexity": None,
                   "packing": packing,
                   "note": f"learned positions end at max_len={capacity}"})
      continue
    batches = pipeline.make_dataset(
        data, task.rows, split, batch_size=1, seq_len=length, seed=run_setup.EVAL_SEED,
        tokenizer=run.tokenizer, shuffle=False, num_epochs=1, drop_remainder=False,
        source=documents)
    total, weight = 0.0, 0.0
    for i, batch in enumerate(batches):
      if packing == "stream" and i == usable // length:
        break  # the first ``usable`` tokens: the same at every length
      a, b = nll(run.params, batch)
      total, weight = total + float(a), weight + float(b)
    rows.append({"multiple": k, "length": length, "tokens": int(weight),
                 "packing": packing, "perplexity": math.exp(min(total / weight, 50.0))})
  return rows


def format_extrapolation(rows, position: str, rope_scaling: str | None = None) -> str:
  """The extrapolation rows as a console table (``rope_scaling``: a scaling
  applied at evaluation, as ``rope_scaling_tag`` names it)."""
  scaled = f", rope_scaling={rope_scaling}" if rope_scaling else ""
  lines = [f"length extrapolation (model.position={position}{scaled})"]
  packing = rows[0].get("packing") if rows else None
  if packing:
    lines.append(f"data.packing={packing}: {LENGTH_FORMATS[packing]}")
  lines.append(f"{'window':>8} {'tokens':>10} {'perplexity':>12}")
  for r in rows:
    ppl = f"{r['perplexity']:.2f}" if r["perplexity"] is not None else "n/a"
    note = f"  ({r['note']})" if r.get("note") else ""
    lines.append(f"{str(r['multiple']) + 'x=' + str(r['length']):>8} "
                 f"{r.get('tokens', 0):>10} {ppl:>12}{note}")
  return "\n".join(lines)
