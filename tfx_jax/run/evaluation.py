"""The evaluation library: one evaluation of a trained run, as
``python -m tfx_jax.evaluate`` (``tfx_jax/evaluate.py``) asks for it.

A ``Request`` is what the command's flags other than ``--workdir`` ask for;
``evaluate`` runs it on a ``TrainedRun`` (loaded from a checkpoint, or the
training loop's live parameters) and writes ``workdir/eval/<split>-<step>.*``.
The training process runs a sweep's evaluations after its last step
(``--evaluate="--split test"``): it parses each argument list with
``parse_request`` (checked before training) and runs them with
``after_training``, which marks each done (``status.mark_evaluation_done``)
so that each runs once.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shlex
from typing import Sequence, get_args

from absl import flags

from tfx_jax.run import distributed
from tfx_jax.core import atomic as files
from tfx_jax.run import scoring
from tfx_jax.records import status
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import RopeScaling


def define_request_flags(fv: flags.FlagValues) -> None:
  """The flags of one evaluation (all but --workdir and the process flags)."""
  flags.DEFINE_string("split", "validation", "Dataset split.", flag_values=fv)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).", flag_values=fv)
  flags.DEFINE_string("lengths", None, "Length extrapolation, e.g. 1x,2x,4x,8x "
                      "(decoder_only).", flag_values=fv)
  flags.DEFINE_enum("rope_scaling", None, list(get_args(RopeScaling)),
                    "--lengths of a RoPE run: scale its rotary positions "
                    "(model.rope_scaling).", flag_values=fv)
  flags.DEFINE_float("rope_scaling_factor", None, "With --rope_scaling: the context "
                     "extension factor.", flag_values=fv)
  flags.DEFINE_integer("rope_original_max_len", None, "With --rope_scaling=yarn: the "
                       "pre-training context (default: the run's train.seq_len).",
                       flag_values=fv)
  flags.DEFINE_integer("max_batches", 0, "Evaluate at most this many batches / windows "
                       "(0: the whole split).", flag_values=fv)
  flags.DEFINE_integer("beam_size", 4, "Translation: beam size (1 = greedy).",
                       flag_values=fv)
  flags.DEFINE_float("alpha", 0.6, "Translation: GNMT length penalty alpha.",
                     flag_values=fv)


@dataclasses.dataclass(frozen=True)
class Request:
  """One evaluation: what the command's flags other than --workdir ask for."""
  split: str = "validation"
  step: int | None = None
  lengths: tuple[int, ...] | None = None  # --lengths' multiples of train.seq_len
  rope_scaling: str | None = None
  rope_scaling_factor: float | None = None
  rope_original_max_len: int | None = None
  max_batches: int = 0
  beam_size: int = 4
  alpha: float = 0.6


def request_of(fv: flags.FlagValues) -> Request:
  """The request of parsed flags; ConfigError for combinations that never apply."""
  # `is not None`: an empty --lengths= is a bad spec, not "no extrapolation".
  lengths = fv["lengths"].value
  multiples = tuple(scoring.parse_lengths(lengths)) if lengths is not None else None
  if fv["rope_scaling"].value is None:
    for name in ("rope_scaling_factor", "rope_original_max_len"):
      if fv[name].value is not None:
        raise ConfigError(f"--{name} applies with --rope_scaling (linear, ntk, yarn).")
  elif not multiples:
    raise ConfigError("--rope_scaling applies to length extrapolation: give --lengths "
                      "too (e.g. --lengths 1x,2x,4x).")
  return Request(**{f.name: fv[f.name].value for f in dataclasses.fields(Request)
                    if f.name != "lengths"}, lengths=multiples)


def parse_request(args: Sequence[str]) -> Request:
  """The request of an argument list of this command without --workdir
  (``["--split", "test"]``); ConfigError naming a bad argument."""
  fv = flags.FlagValues()
  define_request_flags(fv)
  what = f"evaluation {shlex.join(args) or '(no arguments)'}"
  try:
    rest = fv(["evaluate", *args])
  except flags.Error as e:
    raise ConfigError(f"{what}: {e}; its arguments are those of python -m "
                      f"tfx_jax.evaluate but --workdir: "
                      f"{', '.join('--' + n for n in sorted(fv) if n != 'undefok')}.") from None
  if rest[1:]:
    raise ConfigError(f"{what}: unexpected arguments {shlex.join(rest[1:])}.")
  try:
    return request_of(fv)
  except ConfigError as e:
    raise ConfigError(f"{what}: {e}") from None


# ------------------------------------------------------------------- checks
def scaled_model(request: Request, config):
  """The run's model config with ``--rope_scaling`` applied (None without the
  flag); ConfigError for a run it cannot apply to, before a checkpoint is read."""
  if request.rope_scaling is None:
    return None
  return scoring.with_rope_scaling(
      config.model, int(config.train.seq_len), request.rope_scaling,
      request.rope_scaling_factor, request.rope_original_max_len)


def check(request: Request, config) -> None:
  """ConfigError where ``request`` cannot evaluate a run of the resolved
  ``config`` (a RunConfig): what the command checks before it reads a
  checkpoint, so that the trainer refuses it before training."""
  import jax  # pylint: disable=import-outside-toplevel
  from tfx_jax import tasks  # pylint: disable=import-outside-toplevel
  scaled_model(request, config)
  if request.lengths and config.model.family != "decoder_only":
    raise ConfigError("--lengths evaluates language models (model.family="
                      f"'decoder_only'); this run is {config.model.family!r}.")
  # Several processes evaluate teacher-forced splits; decoding runs on one.
  if jax.process_count() > 1 and (
      request.lengths or tasks.get(config.task).score_by_generation is not None):
    what = "--lengths" if request.lengths else f"task={config.task!r} (decoding)"
    raise ConfigError(f"{what} is evaluated by one process; run it without "
                      "--distributed.")


# --------------------------------------------------------------- evaluation
def evaluate(run, request: Request) -> list[pathlib.Path]:
  """Evaluates ``run`` (a ``trained_run.TrainedRun``: loaded from a checkpoint,
  or the training loop's live state) as ``request`` asks; process 0 writes
  the files under ``<workdir>/eval`` and prints the results. Returns the
  files written (none on the other processes)."""
  check(request, run.config)
  scaled = scaled_model(request, run.config)
  if scaled is not None:  # the same parameters under the scaled positions
    run = dataclasses.replace(run, model_cfg=scaled)
  out_dir = run.workdir / "eval"
  if distributed.is_chief():
    out_dir.mkdir(exist_ok=True)
  stem = out_dir / f"{request.split}-{run.step}"
  if request.lengths:
    rows = scoring.extrapolation(run, request.split, list(request.lengths),
                                 request.max_batches)
    if not distributed.is_chief():
      return []
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
    path = out_dir / f"{request.split}-{run.step}{suffix}"
    files.write_json(path, rows)
    print(f"written: {path}", flush=True)
    return [path]
  metrics, hyps, refs = scoring.score_split(run, request.split,
                                            max_batches=request.max_batches,
                                            beam_size=request.beam_size,
                                            alpha=request.alpha)
  if not distributed.is_chief():
    return []  # process 0 writes and prints what all of them computed
  stem.with_suffix(".hyp.txt").write_text("".join(h.replace("\n", " ") + "\n" for h in hyps))
  stem.with_suffix(".ref.txt").write_text("".join(r.replace("\n", " ") + "\n" for r in refs))
  metrics.update(step=run.step, split=request.split, task=run.config.task)
  files.write_json(stem.with_suffix(".json"), metrics)
  print(f"{run.config.task} evaluation of {run.workdir} at step {run.step} "
        f"({request.split}, {metrics['num_examples']} examples)")
  for key, value in metrics.items():
    if key not in ("step", "split", "task", "num_examples") and not key.endswith("signature"):
      print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
  for key in ("bleu_signature", "chrf_signature"):
    if key in metrics:
      print(f"  sacrebleu {key.split('_')[0]} signature: {metrics[key]}")
  print(f"written: {stem}.hyp.txt, {stem}.ref.txt, {stem}.json", flush=True)
  return [stem.with_suffix(s) for s in (".hyp.txt", ".ref.txt", ".json")]


# ------------------------------------------------------- after training
def pending(workdir: str | pathlib.Path, requests: Sequence[tuple[Sequence[str], Request]]
            ) -> list[tuple[int, Sequence[str], Request]]:
  """(index, arguments, request) of the evaluations after training not done
  yet: those without their ``status.evaluation_marker``."""
  return [(i, args, request) for i, (args, request) in enumerate(requests)
          if not status.evaluation_marker(workdir, i).exists()]


def after_training(workdir: str | pathlib.Path,
                   requests: Sequence[tuple[Sequence[str], Request]], step: int,
                   final=None, log=print) -> None:
  """Runs the ``pending`` evaluations of a run whose training finished at
  ``step``, each as ``python -m tfx_jax.evaluate --workdir RUN ARGS`` would,
  and marks it done: on ``final`` (the trainer's live ``TrainedRun``; None:
  restored from the checkpoint of ``step``), or on the checkpoint of another
  ``--step`` it asks for."""
  from tfx_jax.run.trained_run import load_run  # pylint: disable=import-outside-toplevel
  for i, args, request in pending(workdir, requests):
    log(f"Evaluating: python -m tfx_jax.evaluate --workdir {workdir} {shlex.join(args)}")
    if request.step not in (None, step):
      run = load_run(workdir, request.step)
    else:
      final = final or load_run(workdir, step)
      run = final
    evaluate(run, request)
    if distributed.is_chief():
      status.mark_evaluation_done(workdir, i, args)
