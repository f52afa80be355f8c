"""Evaluate a trained run: ``python -m tfx_jax.evaluate --workdir runs/NAME``.

Loads the latest (or ``--step``) checkpoint with the config saved in the
workdir and reports what fits the family:

  lm         perplexity (teacher-forced next-token predictions as hypotheses)
  translate  BLEU and chrF (sacrebleu, detokenized text, signature printed)
  mlm        masked-token accuracy (and perplexity at the masked positions)
  classify   accuracy

Writes ``workdir/eval/<split>-<step>.hyp.txt`` / ``.ref.txt`` (one line per
example) and the metrics to ``workdir/eval/<split>-<step>.json``, each with
its standard error beside it (``loss_se``, ``accuracy_se``: across the
evaluated rows; ``bleu_se``, ``chrf_se``: sacreBLEU's bootstrap), the
sampling error of the evaluated examples, which the sweep report sets beside
the seed-to-seed spread.

``--lengths 1x,2x,4x,8x`` instead evaluates a language model trained at
length L on non-overlapping windows of L, 2L, 4L, 8L tokens (the ALiBi
paper's extrapolation experiment) and prints a table
(``workdir/eval/<split>-<step>.lengths.json``). With ``--rope_scaling``
(linear, ntk, yarn) and ``--rope_scaling_factor`` a RoPE model is evaluated
with its positions scaled, as trained otherwise; YaRN's original context
(``--rope_original_max_len``) defaults to the run's ``train.seq_len``. Those
results go to ``<split>-<step>.lengths.rope-<scaling>.json``, e.g.
``validation-1000.lengths.rope-yarn-x4-from128.json``.
"""

from __future__ import annotations

import dataclasses
from typing import get_args

from absl import flags

from tfx_jax import distributed
from tfx_jax import files
from tfx_jax import scoring
from tfx_jax.cli import new_flags, run_main
from tfx_jax.errors import ConfigError
from tfx_jax.model_config import RopeScaling

FLAGS = new_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", flag_values=FLAGS)
_SPLIT = flags.DEFINE_string("split", "validation", "Dataset split.", flag_values=FLAGS)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).",
                             flag_values=FLAGS)
_LENGTHS = flags.DEFINE_string(
    "lengths", None, "Length extrapolation, e.g. 1x,2x,4x,8x (decoder_only).",
    flag_values=FLAGS)
_ROPE_SCALING = flags.DEFINE_enum(
    "rope_scaling", None, list(get_args(RopeScaling)),
    "--lengths of a RoPE run: scale its rotary positions (model.rope_scaling).",
    flag_values=FLAGS)
_ROPE_FACTOR = flags.DEFINE_float(
    "rope_scaling_factor", None, "With --rope_scaling: the context extension factor.",
    flag_values=FLAGS)
_ROPE_ORIGINAL = flags.DEFINE_integer(
    "rope_original_max_len", None, "With --rope_scaling=yarn: the pre-training context "
    "(default: the run's train.seq_len).", flag_values=FLAGS)
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


def _rope_scaled(workdir, multiples):
  """The run's model config with ``--rope_scaling`` applied, or None without the
  flag; checked on the saved config, before a checkpoint is read."""
  from tfx_jax import run_config  # pylint: disable=import-outside-toplevel
  from tfx_jax.trained_run import load_config  # pylint: disable=import-outside-toplevel
  if _ROPE_SCALING.value is None:
    for flag in (_ROPE_FACTOR, _ROPE_ORIGINAL):
      if flag.value is not None:
        raise ConfigError(f"--{flag.name} applies with --rope_scaling (linear, ntk, "
                          "yarn).")
    return None
  if not multiples:
    raise ConfigError("--rope_scaling applies to length extrapolation: give --lengths "
                      "too (e.g. --lengths 1x,2x,4x).")
  config = load_config(workdir)
  return scoring.with_rope_scaling(
      run_config.resolve(config).model, int(config.train.seq_len),
      _ROPE_SCALING.value, _ROPE_FACTOR.value, _ROPE_ORIGINAL.value)


def main(argv):
  del argv
  # Deferred: jax, orbax and the model load only when the command runs, so
  # --help and flag errors answer at once.
  distributed.initialize_from_flags(FLAGS)
  from tfx_jax.trained_run import load_run
  # `is not None`: an empty --lengths= is a bad spec, not "no extrapolation".
  multiples = (scoring.parse_lengths(_LENGTHS.value)
               if _LENGTHS.value is not None else None)
  scaled = _rope_scaled(_WORKDIR.value, multiples)
  run = load_run(_WORKDIR.value, _STEP.value)
  if scaled is not None:  # the same parameters under the scaled positions
    run = dataclasses.replace(run, model_cfg=scaled)
  _check_processes(run, multiples)
  out_dir = run.workdir / "eval"
  out_dir.mkdir(exist_ok=True)
  stem = out_dir / f"{_SPLIT.value}-{run.step}"
  if multiples:
    rows = scoring.extrapolation(run, _SPLIT.value, multiples, _MAX_BATCHES.value)
    if not distributed.is_chief():
      return
    tag = None
    if scaled is not None:
      tag = scoring.rope_scaling_tag(scaled)
      for row in rows:
        row.update(rope_scaling=scaled.rope_scaling,
                   rope_scaling_factor=scaled.rope_scaling_factor,
                   rope_original_max_len=scaled.rope_original_max_len)
    print(scoring.format_extrapolation(rows, run.model_cfg.position, tag))
    # Scaled results have their own file: they never replace the run's own.
    suffix = f".lengths.rope-{tag}.json" if tag else ".lengths.json"
    path = out_dir / f"{_SPLIT.value}-{run.step}{suffix}"
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
