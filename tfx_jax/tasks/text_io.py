"""Text in, text out with a trained model: translations and continuations.

Every function takes a loaded run (anything with ``config``, ``model_cfg``,
``tokenizer`` and ``params``, e.g. ``trained_run.TrainedRun``) and works on
detokenized text. The ``generate`` command calls these, and so does
``tasks/generation.py`` (the ``evaluate`` command's BLEU, the in-training
samples and BLEU), the one module of the tasks that decodes.
"""

from __future__ import annotations

from typing import Iterator

import jax
import numpy as np

from tfx_jax.model import decoding as search
from tfx_jax.data import sources
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import position_capacity


def read_texts(data_cfg, split: str, key_fields: tuple[str, ...], limit: int = 0
               ) -> Iterator[tuple[str, ...]]:
  """The texts of each example of ``split``, in dataset order.

  ``key_fields`` name resolved feature keys (``text_key``, ``source_key``,
  ``target_key``): one text per field and example. ``limit`` > 0 reads at
  most that many examples.
  """
  keys = sources.resolve_keys(data_cfg)
  src = sources.open_source(sources.dataset_name(data_cfg), split,
                            data_cfg.data_dir or None)
  n = len(src) if not limit else min(limit, len(src))
  for i in range(n):
    example = src[i]
    yield tuple(sources.text_of(example, getattr(keys, f)) for f in key_fields)


def translation_pairs(config, split: str, limit: int = 0) -> list[tuple[str, str]]:
  """(source, reference) texts of a translation split, in dataset order."""
  return list(read_texts(config.data, split, ("source_key", "target_key"), limit))


def encode_sources(tok, texts: list[str], seq_len: int, rows: int) -> np.ndarray:
  """Source ids [rows, seq_len] as in training: text[:seq_len - 1] + eos, 0-padded.

  Truncating before appending eos keeps the end-of-sequence token that the
  encoder saw on every training source (``tasks/translate.translate_rows``).
  """
  ids = np.zeros((rows, seq_len), np.int32)
  for i, text in enumerate(texts):
    row = tok.encode(text)[:seq_len - 1] + [tok.eos_id]
    ids[i, :len(row)] = row
  return ids


def translate_texts(run, sources_txt, *, beam_size=4, alpha=0.6, batch_size=32):
  """Detokenized translations of ``sources_txt`` (beam search or greedy)."""
  tok, cfg = run.tokenizer, run.model_cfg
  seq_len = int(run.config.train.seq_len)
  capacity = position_capacity(cfg)
  max_new = seq_len if capacity is None else min(seq_len, capacity - 1)
  out = []
  for start in range(0, len(sources_txt), batch_size):
    chunk = sources_txt[start:start + batch_size]
    # A fixed batch shape: one compilation for every chunk.
    ids = encode_sources(tok, chunk, seq_len, batch_size)
    if beam_size > 1:
      seqs, _ = search.beam_search(run.params, cfg, ids, beam_size=beam_size,
                                   alpha=alpha, max_len=max_new, eos_id=tok.eos_id,
                                   bos_id=tok.bos_id)
      best = np.asarray(seqs)[:, 0]
    else:
      best = np.asarray(search.translate_greedy(run.params, cfg, ids, max_len=max_new,
                                                eos_id=tok.eos_id, bos_id=tok.bos_id))
    for i in range(len(chunk)):
      out.append(tok.decode(_until_eos(best[i], tok.eos_id)))
  return out


def _until_eos(ids, eos_id):
  ids = [int(t) for t in np.asarray(ids)]
  return ids[:ids.index(eos_id)] if eos_id in ids else ids


def generate_texts(run, texts, *, max_new_tokens=64, greedy=False, temperature=1.0,
                   top_k=0, top_p=1.0, beam_size=0, alpha=0.6, seed=0,
                   include_prompt=False) -> list[str]:
  """Continuations (decoder_only) or translations (encoder_decoder) of ``texts``."""
  cfg, tok = run.model_cfg, run.tokenizer
  if cfg.family == "encoder_decoder":
    if beam_size <= 1 and not greedy:
      raise ConfigError("encoder_decoder generation is greedy (--greedy) or beam "
                        "search (--beam_size N).")
    return translate_texts(run, texts, beam_size=max(beam_size, 1), alpha=alpha,
                           batch_size=len(texts))
  if cfg.family != "decoder_only":
    raise ConfigError(f"generation needs a decoder; this run's model.family is "
                      f"{cfg.family!r}.")
  if not greedy and beam_size <= 0 and temperature <= 0:
    raise ConfigError(f"temperature must be > 0, got {temperature}; use greedy "
                      "decoding (--greedy) for argmax.")
  rows = [[tok.bos_id] + tok.encode(t) for t in texts]
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  if beam_size > 0:
    seqs, _ = search.beam_search(run.params, cfg, ids, beam_size=beam_size, alpha=alpha,
                                 max_len=max_new_tokens, eos_id=tok.eos_id)
    new = np.asarray(seqs)[:, 0]
  else:
    new = np.asarray(search.generate(
        run.params, cfg, ids, max_new_tokens, greedy=greedy, temperature=temperature,
        top_k=top_k, top_p=top_p, rng=jax.random.PRNGKey(seed), eos_id=tok.eos_id))
  out = []
  for prompt, row in zip(rows, new):
    # include_prompt: decode prompt and continuation together, so the tokenizer
    # decides the spacing where they meet (a continuation may start mid-word).
    prefix = prompt[1:] if include_prompt else []
    out.append(tok.decode(prefix + _until_eos(row, tok.eos_id)))
  return out
