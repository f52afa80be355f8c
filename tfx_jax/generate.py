"""Generate text from a trained run.

  python -m tfx_jax.generate --workdir runs/NAME --prompt "ROMEO:"        # decoder_only
  python -m tfx_jax.generate --workdir runs/NAME --source "file not found"  # encoder_decoder

Greedy (``--greedy``), sampling with ``--temperature`` / ``--top_k`` /
``--top_p``, or beam search (``--beam_size N``, GNMT length penalty ``--alpha``).
All use the model's KV cache inside one jitted loop.
"""

from __future__ import annotations

import sys

from absl import app, flags
import numpy as np

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_PROMPT = flags.DEFINE_multi_string("prompt", None, "decoder_only: prompt text (repeatable).")
_SOURCE = flags.DEFINE_multi_string("source", None,
                                    "encoder_decoder: source text (repeatable).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate.")
_GREEDY = flags.DEFINE_bool("greedy", False, "Argmax decoding.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass.")
_BEAM = flags.DEFINE_integer("beam_size", 0, "Beam search with this many beams (0: off).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Beam search: GNMT length penalty alpha.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
flags.mark_flag_as_required("workdir")


def generate_texts(run, texts, *, max_new_tokens=64, greedy=False, temperature=1.0,
                   top_k=0, top_p=1.0, beam_size=0, alpha=0.6, seed=0) -> list[str]:
  """Continuations (decoder_only) or translations (encoder_decoder) of ``texts``."""
  import jax
  from tfx_jax import decode
  from tfx_jax.model_config import ConfigError
  cfg, tok = run.model_cfg, run.tokenizer
  if cfg.family == "encoder_decoder":
    from tfx_jax.evaluate import translate_texts
    if beam_size <= 1 and not greedy:
      raise ConfigError("encoder_decoder generation is greedy (--greedy) or beam "
                        "search (--beam_size N).")
    return translate_texts(run, texts, beam_size=max(beam_size, 1), alpha=alpha,
                           batch_size=len(texts))
  if cfg.family != "decoder_only":
    raise ConfigError(f"generation needs a decoder; this run's model.family is "
                      f"{cfg.family!r}.")
  rows = [[tok.bos_id] + tok.encode(t) for t in texts]
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  if beam_size > 0:
    seqs, _ = decode.beam_search(run.params, cfg, ids, beam_size=beam_size, alpha=alpha,
                                 max_len=max_new_tokens)
    new = np.asarray(seqs)[:, 0]
  else:
    new = np.asarray(decode.generate(
        run.params, cfg, ids, max_new_tokens, greedy=greedy, temperature=temperature,
        top_k=top_k, top_p=top_p, rng=jax.random.PRNGKey(seed)))
  out = []
  for row in new:
    row = list(row)
    row = row[:row.index(tok.eos_id)] if tok.eos_id in row else row
    out.append(tok.decode([int(t) for t in row]))
  return out


def main(argv):
  del argv
  from tfx_jax.model_config import ConfigError
  from tfx_jax.run_io import load_run
  try:
    if bool(_PROMPT.value) == bool(_SOURCE.value):
      raise ConfigError("give --prompt (decoder_only) or --source (encoder_decoder).")
    run = load_run(_WORKDIR.value, _STEP.value)
    texts = _PROMPT.value or _SOURCE.value
    want = "encoder_decoder" if _SOURCE.value else "decoder_only"
    if run.model_cfg.family != want:
      flag = "--source" if want == "encoder_decoder" else "--prompt"
      raise ConfigError(f"{flag} is for model.family={want!r}; this run is "
                        f"{run.model_cfg.family!r}.")
    outs = generate_texts(
        run, texts, max_new_tokens=_MAX_NEW.value,
        greedy=_GREEDY.value or (want == "encoder_decoder" and _BEAM.value == 0),
        temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
        beam_size=_BEAM.value, alpha=_ALPHA.value, seed=_SEED.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  for text, out in zip(texts, outs):
    if want == "decoder_only":
      print(f"{text}{'' if text.endswith(' ') else ' '}{out}")
    else:
      print(f"{text}\n  -> {out}")


if __name__ == "__main__":
  from tfx_jax.cli import run_main
  run_main(main)
