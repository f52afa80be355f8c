"""Generate text from a trained run.

  python -m tfx_jax.generate --workdir runs/NAME --prompt "ROMEO:"        # decoder_only
  python -m tfx_jax.generate --workdir runs/NAME --source "file not found"  # encoder_decoder

Greedy (``--greedy``), sampling with ``--temperature`` / ``--top_k`` /
``--top_p``, or beam search (``--beam_size N``, GNMT length penalty ``--alpha``).
All use the model's KV cache inside one jitted loop.
"""

from __future__ import annotations


from absl import flags

from tfx_jax.tasks import text_io as texts_lib
from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.core.errors import ConfigError

FLAGS = new_flags()
_F = {"flag_values": FLAGS}
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", **_F)
_PROMPT = flags.DEFINE_multi_string("prompt", None,
                                    "decoder_only: prompt text (repeatable).", **_F)
_SOURCE = flags.DEFINE_multi_string("source", None,
                                    "encoder_decoder: source text (repeatable).", **_F)
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate.", **_F)
_GREEDY = flags.DEFINE_bool("greedy", False, "Argmax decoding.", **_F)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.", **_F)
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens "
                              "(0: all).", **_F)
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass.", **_F)
_BEAM = flags.DEFINE_integer("beam_size", 0, "Beam search with this many beams "
                             "(0: off).", **_F)
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Beam search: GNMT length penalty alpha.", **_F)
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.", **_F)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).", **_F)
flags.mark_flag_as_required("workdir", flag_values=FLAGS)


def main(argv):
  del argv
  # Deferred: jax, orbax and the model load only when the command runs, so
  # --help and flag errors answer at once.
  from tfx_jax.run.trained_run import load_run
  if bool(_PROMPT.value) == bool(_SOURCE.value):
    raise ConfigError("give --prompt (decoder_only) or --source (encoder_decoder).")
  run = load_run(_WORKDIR.value, _STEP.value)
  texts = _PROMPT.value or _SOURCE.value
  want = "encoder_decoder" if _SOURCE.value else "decoder_only"
  sampling = (_TEMPERATURE.value != 1.0 or _TOP_K.value or _TOP_P.value != 1.0)
  if want == "encoder_decoder" and sampling:
    raise ConfigError("--temperature / --top_k / --top_p sample from a decoder_only "
                      "model; translate with --greedy or --beam_size N.")
  if run.model_cfg.family != want:
    flag = "--source" if want == "encoder_decoder" else "--prompt"
    raise ConfigError(f"{flag} is for model.family={want!r}; this run is "
                      f"{run.model_cfg.family!r}.")
  outs = texts_lib.generate_texts(
      run, texts, max_new_tokens=_MAX_NEW.value,
      greedy=_GREEDY.value or (want == "encoder_decoder" and _BEAM.value == 0),
      temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
      beam_size=_BEAM.value, alpha=_ALPHA.value, seed=_SEED.value,
      include_prompt=True)
  for text, out in zip(texts, outs):
    if want == "decoder_only":
      print(out)
    else:
      print(f"{text}\n  -> {out}")


if __name__ == "__main__":
  run_main(main, FLAGS)
