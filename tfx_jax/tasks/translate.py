"""translate: sequence-to-sequence translation (encoder_decoder).

Rows: one padded row per pair: inputs (source + eos), decoder_inputs
(bos + target), targets (target + eos), weights 1 at the target's tokens;
a side longer than its row is truncated (counted), a pair with an empty side
skipped. Loss: label-smoothed cross entropy over the target tokens
(``losses.token_loss``; ``train.label_smoothing`` while training).
Baseline: the unigram entropy of the target's tokens and eos. l0 = ln |V|.
Metrics: perplexity (teacher-forced), and BLEU / chrF of decoded
translations (``generation.py``: greedy at every evaluation, beam search in
the evaluate command).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.tasks import generation
from tfx_jax.tasks import losses
from tfx_jax.tasks.task import Task, token_predictions, token_texts


def translate_rows(example, index, *, tok, keys, seq_len, target_seq_len, counts):
  """The row of one (source, target) pair (module docstring)."""
  del index
  source = tok.encode(rows_lib.example_text(example, keys.source_key, counts))
  target = tok.encode(rows_lib.example_text(example, keys.target_key, counts))
  if not source or not target:
    counts.add("skipped (empty source or target)")
    return []
  if len(source) >= seq_len or len(target) >= target_seq_len:
    counts.add("truncated (longer than seq_len)")
  source = source[:seq_len - 1] + [tok.eos_id]
  target = target[:target_seq_len - 1]
  return [{
      "inputs": rows_lib.pad(source, seq_len),
      "decoder_inputs": rows_lib.pad([tok.bos_id] + target, target_seq_len),
      "targets": rows_lib.pad(target + [tok.eos_id], target_seq_len),
      "weights": rows_lib.pad(np.ones(len(target) + 1), target_seq_len, np.float32),
  }]


def translate_targets(example, tok, keys) -> list[int] | None:
  """The target's tokens and eos, as ``translate_rows`` predicts them."""
  source = tok.encode(rows_lib.example_text(example, keys.source_key))
  target = tok.encode(rows_lib.example_text(example, keys.target_key))
  if not source or not target:
    return None
  return target + [tok.eos_id]


def translation_inputs(batch: dict) -> dict:
  """Source, decoder inputs and the source's padding mask."""
  return {"inputs": batch["inputs"], "decoder_inputs": batch["decoder_inputs"],
          "inputs_segment_ids": (batch["inputs"] > 0).astype(jnp.int32)}


TASK = Task(
    "translate", ("encoder_decoder",),
    rows=rows_lib.RowFormat("translate", translate_rows, packed=False,
                            keys=("source_key", "target_key")),
    model_inputs=translation_inputs,
    objective=losses.token_objective,
    targets=baselines.Targets("translate", translate_targets, ("source_key", "target_key")),
    initial_loss=losses.uniform_token_loss,
    metrics=("perplexity", "bleu", "chrf"),
    predictions=token_predictions,
    prediction_texts=token_texts,
    sample_inputs=generation.translation_examples,
    sample_report=generation.translation_report,
    score_by_generation=generation.translation_scores,
)
