"""Evaluate a trained run: ``python -m tfx_jax.evaluate --workdir runs/NAME``.

Loads the latest (or ``--step``) checkpoint with the config saved in the
workdir and reports what fits the family:

  lm         perplexity and bits per byte (teacher-forced next-token
             predictions as hypotheses)
  translate  perplexity (teacher-forced), BLEU and chrF (sacrebleu, detokenized
             text, signature printed)
  mlm        masked-token accuracy (and perplexity and bits per byte at the
             masked positions)
  classify   accuracy

Writes ``workdir/eval/<split>-<step>.hyp.txt`` / ``.ref.txt`` (one line per
example) and the metrics to ``workdir/eval/<split>-<step>.json``, each with
its standard error beside it (``loss_se``, ``accuracy_se``, ``bpb_se``:
across the evaluated rows; ``bleu_se``, ``chrf_se``: sacreBLEU's bootstrap), the
sampling error of the evaluated examples, which the sweep report sets beside
the seed-to-seed spread.

``--lengths 1x,2x,4x,8x`` instead evaluates a language model trained at
length L on rows of L, 2L, 4L, 8L tokens (the ALiBi paper's extrapolation
experiment), read as the run was trained (``data.packing``): ``stream``,
non-overlapping windows of the split's token stream, through document ends
(as Press et al.); ``documents``, whole documents packed into rows of kL,
attention within each, so only documents longer than L see more context
(``scoring.extrapolation``). It prints a table
(``workdir/eval/<split>-<step>.lengths.json``). With ``--rope_scaling``
(linear, ntk, yarn) and ``--rope_scaling_factor`` a RoPE model is evaluated
with its positions scaled, as trained otherwise; YaRN's original context
(``--rope_original_max_len``) defaults to the run's ``train.seq_len``. Those
results go to ``<split>-<step>.lengths.rope-<scaling>.json``, e.g.
``validation-1000.lengths.rope-yarn-x4-from128.json``.

The same evaluations run in the training process, after its last step
(``python -m tfx_jax.train ... --evaluate="--split test"``): the library is
``run/evaluation.py``; this command parses flags and makes one call.
"""

from __future__ import annotations

from absl import flags

from tfx_jax.core.flags import new_flags, run_main
from tfx_jax.run import distributed
from tfx_jax.run import evaluation

FLAGS = new_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", flag_values=FLAGS)
evaluation.define_request_flags(FLAGS)
distributed.define_flags(FLAGS)
flags.adopt_module_key_flags(distributed, flag_values=FLAGS)  # listed in --help
flags.mark_flag_as_required("workdir", flag_values=FLAGS)


# ------------------------------------------------------------------- main
def main(argv):
  del argv
  # Deferred: jax, orbax and the model load only when the command runs, so
  # --help and flag errors answer at once.
  distributed.initialize_from_flags(FLAGS)
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  from tfx_jax.run.trained_run import load_config, load_run  # pylint: disable=import-outside-toplevel
  request = evaluation.request_of(FLAGS)
  if request.rope_scaling is not None or request.lengths:
    # Checked on the saved config, before a checkpoint is read.
    evaluation.check(request, run_config.resolve(load_config(_WORKDIR.value)))
  evaluation.evaluate(load_run(_WORKDIR.value, request.step), request)


if __name__ == "__main__":
  run_main(main, FLAGS)
