"""lm: language modelling, next-token cross entropy (decoder_only).

Rows: inputs (bos + text), targets (text + eos), weights 1 at every real
token; each document is cut into rows of seq_len and rows are packed, so a
batch also has segment_ids and positions (restarting in every document).
With ``data.packing=stream``: windows of the split's token stream
(``data.stream``), inputs its seq_len tokens and targets the next token of
each, across document ends; the same tokens are predicted (every text token
and each document's eos), so the baseline and l0 below hold for both.
Loss: cross entropy over the real tokens (``losses.token_loss``; label
smoothing and z-loss while training). Baseline: the unigram entropy of the
text's tokens and eos. l0 = ln |V|. Metrics: perplexity and bits per byte
(eos counts 0 bytes, its NLL still counts). At every
evaluation: greedy continuations of a few validation prompts.
"""

from __future__ import annotations

import numpy as np

from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import stream
from tfx_jax.tasks import generation
from tfx_jax.tasks import losses
from tfx_jax.tasks.task import Task, token_inputs, token_predictions, token_texts


def lm_rows(example, index, *, tok, keys, seq_len, counts):
  """The rows of one document (module docstring); none for a blank text."""
  del index
  text = rows_lib.nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  ids = tok.encode(text)
  doc = {
      "inputs": np.asarray([tok.bos_id] + ids, np.int32),
      "targets": np.asarray(ids + [tok.eos_id], np.int32),
      "weights": np.ones(len(ids) + 1, np.float32),
  }
  return rows_lib.cut_into_rows(doc, seq_len, counts)


def lm_window(tokens, index, *, seq_len):
  """The row of one window of the token stream (``data.stream``): ``tokens``
  holds its seq_len inputs and the next token; the targets are shifted by one."""
  del index
  return stream.window_row({"inputs": tokens[:-1], "targets": tokens[1:],
                            "weights": np.ones(len(tokens) - 1, np.float32)}, seq_len)


def lm_targets(example, tok, keys) -> list[int] | None:
  """The text's tokens and eos, as ``lm_rows`` predicts them (bos never is)."""
  text = rows_lib.example_text(example, keys.text_key)
  if not text.strip():
    return None
  return tok.encode(text) + [tok.eos_id]


TASK = Task(
    "lm", ("decoder_only",),
    rows=rows_lib.RowFormat("lm", lm_rows, packed=True, window=lm_window),
    model_inputs=token_inputs,
    objective=losses.token_objective,
    targets=baselines.Targets("lm", lm_targets, ("text_key",)),
    initial_loss=losses.uniform_token_loss,
    metrics=("perplexity", "bpb"),
    predictions=token_predictions,
    prediction_texts=token_texts,
    sample_inputs=generation.prompt_examples,
    sample_report=generation.continuation_report,
)
