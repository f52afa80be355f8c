"""Evaluate a trained run: ``python -m tfx_jax.evaluate --workdir runs/NAME``.

Loads the latest (or ``--step``) checkpoint with the config saved in the
workdir and reports what fits the family:

  lm         perplexity (teacher-forced next-token predictions as hypotheses)
  translate  BLEU and chrF (sacrebleu, detokenized text, signature printed)
  mlm        masked-token accuracy (and perplexity at the masked positions)
  classify   accuracy

Writes ``workdir/eval/<split>-<step>.hyp.txt`` / ``.ref.txt`` (one line per
example) and the metrics to ``workdir/eval/<split>-<step>.json``.

``--lengths 1x,2x,4x,8x`` instead evaluates a language model trained at
length L on non-overlapping windows of L, 2L, 4L, 8L tokens (the ALiBi
paper's extrapolation experiment) and prints a table.
"""

from __future__ import annotations


from absl import flags

from tfx_jax import distributed
from tfx_jax import files
from tfx_jax import scoring
from tfx_jax.cli import new_flags, run_main
from tfx_jax.errors import ConfigError

FLAGS = new_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", "validation", "Dataset split.", flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).",
                             flag_values=FLAGS)
_LENGTHS = flags.DEFINE_string(
    "lengths", None, "Length extrapolation, e.g. 1x,2x,4x,8x (decoder_only).",
    flag_values=FLAGS)
_MAX_BATCHES = flags.DEFINE_integer(
    "max_batches", 0, "Evaluate at most this many batches / windows (0: the whole "
    "split).", flag_values=FLAGS)
_BEAM = flags.DEFINE_integer("beam_size", 4, "Translation: beam size (1 = greedy).",
                             flag_values=FLAGS)
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Translation: GNMT length penalty alpha.",
                            flag_values=FLAGS)
distributed.define_flags(FLAGS)
flags.adopt_module_key_flags(distributed, flag_values=FLAGS)  # listed in --help
flags.mark_flag_as_required("workdir", flag_values=FLAGS)


# ------------------------------------------------------------------- main
def _check_processes(run, multiples) -> None:
  """Several processes evaluate teacher-forced splits; decoding runs on one."""
  import jax  # pylint: disable=import-outside-toplevel
  from tfx_jax import tasks  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return
  if multiples or tasks.get(run.config.task).score_by_generation is not None:
    what = "--lengths" if multiples else f"task={run.config.task!r} (decoding)"
    raise ConfigError(f"{what} is evaluated by one process; run it without "
                      "--distributed.")


def main(argv):
  del argv
  # Deferred: jax, orbax and the model load only when the command runs, so
  # --help and flag errors answer at once.
  distributed.initialize_from_flags(FLAGS)
  from tfx_jax.trained_run import load_run
  # `is not None`: an empty --lengths= is a bad spec, not "no extrapolation".
  multiples = (scoring.parse_lengths(_LENGTHS.value)
               if _LENGTHS.value is not None else None)
  run = load_run(_WORKDIR.value, _STEP.value)
  _check_processes(run, multiples)
  out_dir = run.workdir / "eval"
  out_dir.mkdir(exist_ok=True)
  stem = out_dir / f"{_SPLIT.value}-{run.step}"
  if multiples:
    rows = scoring.extrapolation(run, _SPLIT.value, multiples, _MAX_BATCHES.value)
    if not distributed.is_chief():
      return
    print(scoring.format_extrapolation(rows, run.model_cfg.position))
    path = out_dir / f"{_SPLIT.value}-{run.step}.lengths.json"
    files.write_json(path, rows)
    print(f"written: {path}")
    return
  metrics, hyps, refs = scoring.score_split(run, _SPLIT.value, max_batches=_MAX_BATCHES.value,
                                            beam_size=_BEAM.value, alpha=_ALPHA.value)
  if not distributed.is_chief():
    return  # process 0 writes and prints what all of them computed
  stem.with_suffix(".hyp.txt").write_text("".join(h.replace("\n", " ") + "\n" for h in hyps))
  stem.with_suffix(".ref.txt").write_text("".join(r.replace("\n", " ") + "\n" for r in refs))
  metrics.update(step=run.step, split=_SPLIT.value, task=run.config.task)
  files.write_json(out_dir / f"{_SPLIT.value}-{run.step}.json", metrics)
  print(f"{run.config.task} evaluation of {run.workdir} at step {run.step} "
        f"({_SPLIT.value}, {metrics['num_examples']} examples)")
  for key, value in metrics.items():
    if key not in ("step", "split", "task", "num_examples") and not key.endswith("signature"):
      print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
  for key in ("bleu_signature", "chrf_signature"):
    if key in metrics:
      print(f"  sacrebleu {key.split('_')[0]} signature: {metrics[key]}")
  print(f"written: {stem}.hyp.txt, {stem}.ref.txt, {stem}.json")


if __name__ == "__main__":
  run_main(main, FLAGS)
