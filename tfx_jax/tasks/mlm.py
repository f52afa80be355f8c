"""mlm: masked language modelling, BERT's objective (encoder_only).

Rows: inputs (bos + text + eos, masked), targets (the original ids), weights
1 at the masked positions; cut into rows of seq_len and packed. Masking
(``bert_mask``, Devlin et al. 2019, section 3.1) is a function of
(``seed``, the example's index), so it is the same on every resume.
With ``data.packing=stream``: windows of seq_len tokens of the split's token
stream (``data.stream``; RoBERTa's FULL-SENTENCES, Liu et al. 2019, section
4.2: contiguous text across document ends, each end marked by eos), masked
the same way (bos and eos never).
Loss: cross entropy at the masked positions (``losses.token_loss``).
Baseline: the unigram entropy of the text's tokens (the maskable positions:
not bos or eos). l0 = ln |V|. Metrics: perplexity, accuracy and bits per
byte at the masked positions.
"""

from __future__ import annotations

import numpy as np

from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import stream
from tfx_jax.data.config import DataConfig
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax.tasks import losses
from tfx_jax.tasks.task import Task, token_inputs, token_predictions, token_texts

# BERT's rate (Devlin et al. 2019, section 3.1): ``data.mask_rate``'s default.
DEFAULT_MASK_RATE = DataConfig.mask_rate


def check_mask_rate(mask_rate) -> None:
  """BERT's masking rate must be a probability that leaves something to predict."""
  if not 0.0 < float(mask_rate) <= 1.0:
    raise ConfigError(f"data.mask_rate={mask_rate!r} is not valid: must be in (0, 1].")


def bert_mask(ids: np.ndarray, rng: np.random.Generator, *, mask_rate: float,
              vocab_size: int, maskable: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
  """BERT masking (Devlin et al. 2019, sec. 3.1): (masked inputs, weights).

  Each maskable token is chosen with probability `mask_rate`; a chosen token is
  replaced by <mask> 80% of the time, by a random non-special token 10% and
  kept 10%. weights is 1 at the chosen positions (where the loss is taken).
  """
  chosen = (rng.random(ids.shape) < mask_rate) & maskable
  action = rng.random(ids.shape)
  random_ids = rng.integers(tokenizer_lib.NUM_SPECIAL, vocab_size, ids.shape)
  inputs = np.where(chosen & (action < 0.8), tokenizer_lib.MASK_ID, ids)
  inputs = np.where(chosen & (action >= 0.8) & (action < 0.9), random_ids,
                    inputs)
  return inputs.astype(np.int32), chosen.astype(np.float32)


def mlm_rows(example, index, *, tok, keys, seq_len, counts, seed, mask_rate):
  """The masked rows of one document (module docstring); ``mask_rate`` None:
  ``DEFAULT_MASK_RATE``."""
  text = rows_lib.nonempty_text(example, keys.text_key, counts)
  if text is None:
    return []
  rate = DEFAULT_MASK_RATE if mask_rate is None else float(mask_rate)
  ids = np.asarray([tok.bos_id] + tok.encode(text) + [tok.eos_id], np.int32)
  rng = np.random.default_rng([seed, index])
  maskable = (ids != tok.bos_id) & (ids != tok.eos_id)
  inputs, weights = bert_mask(ids, rng, mask_rate=rate,
                              vocab_size=tok.vocab_size, maskable=maskable)
  return rows_lib.cut_into_rows({"inputs": inputs, "targets": ids, "weights": weights},
                                seq_len, counts)


def mlm_window(tokens, index, *, tok, seq_len, seed, mask_rate):
  """The masked row of one window of the token stream (``data.stream``): its
  first seq_len tokens (the one after them is the next window's first)."""
  ids = np.asarray(tokens[:seq_len], np.int32)
  rate = DEFAULT_MASK_RATE if mask_rate is None else float(mask_rate)
  rng = np.random.default_rng([seed, index])
  maskable = (ids != tok.bos_id) & (ids != tok.eos_id)
  inputs, weights = bert_mask(ids, rng, mask_rate=rate,
                              vocab_size=tok.vocab_size, maskable=maskable)
  return stream.window_row({"inputs": inputs, "targets": ids, "weights": weights}, seq_len)


def mlm_targets(example, tok, keys) -> list[int] | None:
  """The text's tokens: the positions ``mlm_rows`` may mask (not bos or eos)."""
  text = rows_lib.example_text(example, keys.text_key)
  if not text.strip():
    return None
  return [i for i in tok.encode(text) if i not in (tok.bos_id, tok.eos_id)]


TASK = Task(
    "mlm", ("encoder_only",),
    rows=rows_lib.RowFormat(
        "mlm", mlm_rows, packed=True, window=mlm_window,
        check_data=lambda data: check_mask_rate(getattr(data, "mask_rate", DEFAULT_MASK_RATE))),
    model_inputs=token_inputs,
    objective=losses.token_objective,
    targets=baselines.Targets("mlm", mlm_targets, ("text_key",)),
    initial_loss=losses.uniform_token_loss,
    metrics=("perplexity", "accuracy", "bpb"),
    predictions=token_predictions,
    prediction_texts=token_texts,
)
