"""The evaluate and generate commands on tiny checkpoints of every family.

Tiny runs (helpers.TINY: 1 layer, d_model 32, 20 steps, checkpoints at
steps 10 and 20) are trained in this process with ``trainer.train_and_evaluate``;
the real command-line entry points (absl flags, error handling, files written)
then run in this process too. What ``evaluate`` reports must agree with what
training logged for the same checkpoint and batches, and greedy ``generate``
with a slow argmax reference; length extrapolation runs once per position scheme.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
from typing import get_args

import numpy as np
import pytest
import sacrebleu

from tfx_jax import evaluate, generate

from tfx_jax.run import metrics

from tfx_jax.run import trained_run

from tfx_jax.model import decoding as search

from tfx_jax.tasks import text_io as texts
from tfx_jax.run import config as run_config
from tfx_jax.run import setup as run_setup
from tfx_jax.run import trainer
from tfx_jax.records import status as status_lib
from tfx_jax import train as train_command
from tfx_jax.data import eval_cache
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import Position
from helpers import ROOT, run_command, tiny_config, train

# ml_collections loads config files with the deprecated importlib load_module().
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.usefixtures("shared_compilation_cache")]

MAX_BATCHES = 2  # evaluate --max_batches: the same batches as eval.num_batches
NUM_SAMPLES = 2  # decoded samples written to TensorBoard during training


def ok(module, *args) -> str:
  code, out, err = run_command(module, args)
  assert code == 0, err
  return out


def fails(module, *args) -> str:
  """Runs a command that must exit 2 with a one-paragraph message; returns stderr."""
  code, out, err = run_command(module, args)
  assert code == 2, (out, err)
  assert err.startswith("error: ") and "Traceback" not in err, err
  return err


def finished_run(spec: str, workdir: pathlib.Path, *overrides: dict):
  """(workdir, TensorBoard scalars) of a finished tiny run."""
  assert train(spec, workdir, *overrides).status == "finished"
  return workdir, metrics.read_scalars(workdir / "tensorboard")


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
  return finished_run("lm.py:tiny", tmp_path_factory.mktemp("lm") / "run",
                      {"eval.num_samples": NUM_SAMPLES})


@pytest.fixture(scope="module")
def translate_run(tmp_path_factory):
  return finished_run("translate.py:tiny", tmp_path_factory.mktemp("translate") / "run",
                      {"eval.num_bleu_examples": 4, "eval.num_samples": NUM_SAMPLES})


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
  return finished_run("mlm.py:tiny", tmp_path_factory.mktemp("mlm") / "run")


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory):
  return finished_run("finetune.py:tiny", tmp_path_factory.mktemp("classify") / "run")


def evaluated(workdir: pathlib.Path, *args) -> tuple[dict, list[str], list[str], str]:
  """Runs evaluate; returns (json metrics, hypothesis lines, reference lines, stdout)."""
  out = ok(evaluate, "--workdir", workdir, "--max_batches", MAX_BATCHES, *args)
  step = int(out.split(" at step ", 1)[1].split()[0])
  stem = workdir / "eval" / f"validation-{step}"
  assert f"written: {stem}.hyp.txt, {stem}.ref.txt, {stem}.json" in out
  result = json.loads(stem.with_suffix(".json").read_text())
  assert result["step"] == step
  hyps = stem.with_suffix(".hyp.txt").read_text().splitlines()
  refs = stem.with_suffix(".ref.txt").read_text().splitlines()
  assert len(hyps) == len(refs) == result["num_examples"] > 0
  assert result["split"] == "validation"
  return result, hyps, refs, out


def logged(scalars: dict, tag: str, step: int) -> float:
  return dict(scalars[tag])[step]


def assert_as_logged(value: float, scalars: dict, tag: str, step: int) -> None:
  """``value`` (evaluate's json) is what training logged for ``step`` (float32).

  Same checkpoint and batches, but two compiled programs (evaluate's unsharded
  forward pass, the trainer's sharded eval step) whose float32 sums may be
  ordered differently: a few ulps apart at most, far less than a training step
  changes (checked in test_evaluate_step_picks_that_checkpoint).
  """
  assert np.float32(value) == pytest.approx(logged(scalars, tag, step), rel=1e-5), tag


# ------------------------------------------------------------ evaluate
def test_evaluate_language_model_reports_the_logged_perplexity(lm_run):
  workdir, scalars = lm_run
  result, _, _, out = evaluated(workdir)
  assert result["task"] == "lm" and result["step"] == 20
  assert {"loss", "perplexity", "bpb"} <= set(result) and "accuracy" not in result
  assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
  # The same checkpoint on the same validation batches as the in-training eval.
  assert_as_logged(result["perplexity"], scalars, "eval/perplexity", 20)
  assert_as_logged(result["bpb"], scalars, "eval/bpb", 20)
  assert f"lm evaluation of {workdir} at step 20" in out
  assert f"perplexity: {result['perplexity']:.4f}" in out


def test_evaluate_step_picks_that_checkpoint(lm_run):
  workdir, scalars = lm_run
  result, _, _, out = evaluated(workdir, "--step", 10)
  assert result["step"] == 10 and "at step 10" in out
  assert (workdir / "eval" / "validation-10.json").exists()
  assert_as_logged(result["perplexity"], scalars, "eval/perplexity", 10)
  at_10, at_20 = (logged(scalars, "eval/perplexity", s) for s in (10, 20))
  assert abs(at_10 - at_20) > 1e-3 * at_20


def test_evaluate_translation_reports_perplexity_bleu_chrf_and_signatures(translate_run):
  workdir, scalars = translate_run
  result, hyps, refs, out = evaluated(workdir)
  assert result["task"] == "translate" and result["step"] == 20
  assert "bpb" not in result  # no bytes a translation's comparisons read
  # Teacher-forced, as training logged it for the same checkpoint and batches.
  assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
  assert_as_logged(result["loss"], scalars, "eval/loss", 20)
  assert f"loss: {result['loss']:.4f}" in out
  config = trained_run.load_config(workdir)
  n = MAX_BATCHES * config.eval.batch_size
  pairs = texts.translation_pairs(config, "validation", n)
  assert refs == [r.replace("\n", " ") for _, r in pairs] and len(hyps) == n
  # The files hold exactly what was scored (sacrebleu defaults: 13a, mixed case).
  assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  for metric in ("bleu", "chrf"):
    signature = result[f"{metric}_signature"]
    assert signature.startswith("nrefs:1|") and f"version:{sacrebleu.__version__}" in signature
    assert f"sacrebleu {metric} signature: {signature}" in out
  assert result["beam_size"] == 4


def test_evaluate_masked_language_model_reports_masked_token_accuracy(mlm_run):
  workdir, scalars = mlm_run
  result, _, _, _ = evaluated(workdir)
  assert result["task"] == "mlm"
  assert {"loss", "perplexity", "accuracy"} <= set(result)
  assert 0.0 <= result["accuracy"] <= 1.0
  for tag in ("accuracy", "perplexity"):
    assert_as_logged(result[tag], scalars, f"eval/{tag}", 20)


def test_evaluate_classifier_reports_accuracy_over_the_written_labels(classify_run):
  workdir, scalars = classify_run
  result, hyps, refs, _ = evaluated(workdir)
  assert result["task"] == "classify"
  assert "accuracy" in result and "perplexity" not in result
  labels = {str(i) for i in range(trained_run.load_config(workdir).model.num_classes)}
  assert set(hyps) <= labels and set(refs) <= labels
  assert result["accuracy"] == pytest.approx(np.mean([h == r for h, r in zip(hyps, refs)]))
  assert_as_logged(result["accuracy"], scalars, "eval/accuracy", 20)


@pytest.mark.parametrize("run", ["lm_run", "mlm_run", "classify_run", "translate_run"])
def test_evaluate_writes_each_metrics_standard_error_as_training_logged_it(run, request):
  """Every mean in evaluate's json has its standard error beside it, and the
  teacher-forced ones are what training logged for the same checkpoint and
  batches (eval/loss_se, eval/accuracy_se); BLEU's and chrF's are sacreBLEU's
  bootstrap of the written hypotheses, which training logs for greedy BLEU."""
  workdir, scalars = request.getfixturevalue(run)
  result, hyps, refs, out = evaluated(workdir)
  if result["task"] == "translate":
    for metric, kind in (("bleu", sacrebleu.BLEU), ("chrf", sacrebleu.CHRF)):
      boot = kind().corpus_score(hyps, [refs], n_bootstrap=1000)  # the same seeded resamples
      assert result[f"{metric}_se"] == pytest.approx(boot._ci / 1.959964)  # pylint: disable=protected-access
      assert "bs:1000" in result[f"{metric}_signature"]
    assert [s for s, _ in scalars["eval/bleu_se"]] == [s for s, _ in scalars["eval/bleu"]]
  means = [m for m in ("loss", "accuracy", "bpb") if m in result]
  assert means == {"lm": ["loss", "bpb"], "mlm": ["loss", "accuracy", "bpb"],
                   "classify": ["loss", "accuracy"], "translate": ["loss"]}[result["task"]]
  for metric in means:
    se = result[f"{metric}_se"]
    assert 0.0 < se < 1.0 and f"{metric}_se: {se:.4f}" in out
    assert_as_logged(se, scalars, f"eval/{metric}_se", 20)


def test_eval_num_batches_0_evaluates_the_whole_split(tmp_path):
  """eval.num_batches=0: every evaluation during training reads the whole
  validation split, as evaluate does by default (--max_batches 0)."""
  workdir, scalars = finished_run(
      "finetune.py:tiny", tmp_path / "run",
      {"eval.num_batches": 0, "train.num_steps": 10, "optim.decay_steps": 10})
  out = ok(evaluate, "--workdir", workdir)
  result = json.loads((workdir / "eval" / "validation-10.json").read_text())
  config = trained_run.load_config(workdir)
  whole = len(list(texts.read_texts(config.data, "validation", ("text_key",))))
  # Every passage of the split (the tiny rows truncate, none is skipped).
  assert result["num_examples"] == whole > 2 * config.eval.batch_size, out
  for tag in ("loss", "accuracy", "loss_se"):
    assert_as_logged(result[tag], scalars, f"eval/{tag}", 10)


def _weighted_rows(config, tokenizer, split: str) -> tuple[int, int]:
  """(batches, rows with a weighted target) of the whole of ``split`` as
  evaluations read it (the fixed evaluation shuffle)."""
  batches = list(run_setup.make_data(config, tokenizer, split, train=False))
  return len(batches), sum(int(np.any(row > 0)) for b in batches for row in b["weights"])


def test_eval_final_batches_0_reads_the_whole_split_at_the_last_evaluation(
    tmp_path, monkeypatch):
  """eval.num_batches=1, eval.final_batches=0: the evaluations during training
  (steps 0 and 10) read the first batch of the fixed evaluation shuffle, the
  last one (step 20, whose eval/* are the run's final values) the whole split,
  with its standard error, as evaluate reads it by default; eval_subset/* at
  step 20 is its first batch's, as evaluate --max_batches 1 gives it. The
  evaluations after training read the whole split too (--split validation live,
  --split test from the checkpoint of the finished run), and the evaluation
  step is compiled once for all of them."""
  calls, made, read = [0], [], []
  jitted = run_setup.ShardedRun.eval_step

  def counted_eval_step(self):
    step = jitted(self)
    made.append(step)

    def run(*args):
      calls[0] += 1
      return step(*args)
    return run

  in_training = trainer._TrainingLoop._eval_and_report  # pylint: disable=protected-access

  def recorded(loop, step, **kwargs):
    before = calls[0]
    in_training(loop, step, **kwargs)
    read.append((step, calls[0] - before))

  monkeypatch.setattr(run_setup.ShardedRun, "eval_step", counted_eval_step)
  monkeypatch.setattr(trainer._TrainingLoop, "_eval_and_report", recorded)  # pylint: disable=protected-access
  workdir = tmp_path / "run"
  config = tiny_config("lm.py:tiny", {"eval.num_batches": 1, "eval.final_batches": 0})
  result = trainer.train_and_evaluate(config, str(workdir),
                                      evaluations=[["--split", "validation"]])
  assert result.status == "finished"
  run = trained_run.load_run(workdir)
  whole, rows = _weighted_rows(run.config, run.tokenizer, "validation")
  assert whole > 1
  assert read == [(0, 1), (10, 1), (20, whole)]
  assert {s._cache_size() for s in made} == {1}  # pylint: disable=protected-access
  scalars = metrics.read_scalars(workdir / "tensorboard")
  assert [s for s, _ in scalars["eval_subset/loss"]] == [20]
  assert logged(scalars, "eval/loss", 20) != logged(scalars, "eval_subset/loss", 20)
  # The report's final values are the whole split's; its still-improving check
  # also reads the subset's loss at the last step.
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  summary = collect.read_run(workdir, collect.RunEntry(name="run", seed=0, values=(),
                                                       overrides={}))
  assert summary.final["eval/loss"] == logged(scalars, "eval/loss", 20)
  assert not any(tag.startswith("eval_subset/") for tag in summary.final)
  assert summary.curves["eval_subset/loss"] == scalars["eval_subset/loss"]
  # The evaluation after training, on the live parameters with the same
  # compiled step and the same batches in the same order: bitwise.
  after = json.loads((workdir / "eval" / "validation-20.json").read_text())
  assert after["num_examples"] == rows
  for tag in ("loss", "loss_se", "bpb", "bpb_se"):
    assert np.float32(after[tag]) == logged(scalars, f"eval/{tag}", 20), tag
  # The evaluate command, from the checkpoints: the whole split by default,
  # the first batch with --max_batches 1.
  ok(evaluate, "--workdir", workdir)
  whole_split = json.loads((workdir / "eval" / "validation-20.json").read_text())
  for tag in ("loss", "loss_se"):
    assert_as_logged(whole_split[tag], scalars, f"eval/{tag}", 20)
  for step, tag in ((10, "eval/loss"), (20, "eval_subset/loss"), (20, "eval_subset/loss_se")):
    ok(evaluate, "--workdir", workdir, "--step", step, "--max_batches", 1)
    first = json.loads((workdir / "eval" / f"validation-{step}.json").read_text())
    assert_as_logged(first[tag.split("/")[1]], scalars, tag, step)
  # The finished run started again runs its missing evaluation from its
  # checkpoint: the test pass, the whole split.
  made.clear()
  trainer.train_and_evaluate(config, str(workdir), evaluations=[
      ["--split", "validation"], ["--split", "test"]])
  test = json.loads((workdir / "eval" / "test-20.json").read_text())
  test_batches, test_rows = _weighted_rows(run.config, run.tokenizer, "test")
  assert test_batches > 1 and test["num_examples"] == test_rows
  assert {s._cache_size() for s in made} == {1}  # pylint: disable=protected-access


def test_evaluate_bad_step_or_workdir_exits_2(lm_run, tmp_path):
  workdir, _ = lm_run
  err = fails(evaluate, "--workdir", workdir, "--step", 15)
  assert "--step=15" in err and "available steps: 10, 20" in err
  err = fails(evaluate, "--workdir", tmp_path)
  assert str(tmp_path) in err and "no config.json" in err
  fails(evaluate, "--workdir", tmp_path / "missing")
  shutil.copy(workdir / "config.json", tmp_path / "config.json")
  assert "no checkpoints" in fails(evaluate, "--workdir", tmp_path)
  assert not (tmp_path / "eval").exists()


# ------------------------------------------------------------ generate
def test_generate_greedy_continues_the_prompt_as_the_argmax_loop(lm_run):
  workdir, _ = lm_run
  prompt, n = "ROMEO:", 8
  out = ok(generate, "--workdir", workdir, "--prompt", prompt, "--greedy",
           "--max_new_tokens", n)
  run = trained_run.load_run(workdir)
  tok = run.tokenizer
  ids = np.asarray([[tok.bos_id] + tok.encode(prompt)], np.int32)
  new = list(search.uncached_greedy(run.params, run.model_cfg, ids, n)[0])
  new = new[:new.index(tok.eos_id)] if tok.eos_id in new else new
  assert new, "the tiny model's first greedy token is eos: nothing to compare"
  assert out.splitlines() == [tok.decode(tok.encode(prompt) + new)]
  assert out.startswith(prompt)


def test_generate_sampling_and_beam_search_continue_each_prompt(lm_run):
  workdir, _ = lm_run
  prompts = ["ROMEO:", "JULIET: O Romeo, Romeo"]
  args = ["--workdir", workdir, *[a for p in prompts for a in ("--prompt", p)],
          "--max_new_tokens", 8]
  for extra in (["--top_k", 20, "--top_p", 0.9, "--temperature", 0.8],
                ["--beam_size", 2]):
    lines = ok(generate, *args, *extra).splitlines()
    assert len(lines) == len(prompts), (extra, lines)
    for line, prompt in zip(lines, prompts):
      # The continuation may be empty (eos first): a weak model's best beam often is.
      assert line.startswith(prompt), (extra, line)


def test_generate_same_seed_same_sample(lm_run):
  workdir, _ = lm_run
  args = ["--workdir", workdir, "--prompt", "ROMEO:", "--temperature", 1.5,
          "--max_new_tokens", 16]
  first = ok(generate, *args, "--seed", 7)
  assert ok(generate, *args, "--seed", 7) == first
  others = {ok(generate, *args, "--seed", s) for s in (8, 9)}
  assert others != {first}  # the seed is used


def test_generate_translation_of_a_source(translate_run):
  workdir, _ = translate_run
  source = "File not found"
  lines = ok(generate, "--workdir", workdir, "--source", source).splitlines()
  assert len(lines) == 2 and lines[0] == source and lines[1].startswith("  -> ")
  # Greedy by default (no beam): the argmax loop's translation.
  run = trained_run.load_run(workdir)
  tok, seq_len = run.tokenizer, int(run.config.train.seq_len)
  ids = np.zeros((1, seq_len), np.int32)
  row = tok.encode(source) + [tok.eos_id]
  ids[0, :len(row)] = row
  new = list(search.uncached_greedy(run.params, run.model_cfg, ids, seq_len)[0])
  new = new[:new.index(tok.eos_id)] if tok.eos_id in new else new
  assert lines[1] == f"  -> {tok.decode(new)}"
  lines = ok(generate, "--workdir", workdir, "--source", source, "--source", "Save as",
             "--beam_size", 2).splitlines()
  assert lines[0] == source and lines[2] == "Save as"
  assert lines[1].startswith("  -> ") and lines[3].startswith("  -> ")


def test_generate_wrong_input_for_the_family_exits_2(lm_run, translate_run, mlm_run):
  err = fails(generate, "--workdir", lm_run[0], "--source", "hello")
  assert "--source is for model.family='encoder_decoder'" in err and "'decoder_only'" in err
  err = fails(generate, "--workdir", translate_run[0], "--prompt", "hello")
  assert "--prompt is for model.family='decoder_only'" in err
  assert "'encoder_decoder'" in err
  err = fails(generate, "--workdir", mlm_run[0], "--prompt", "hello")
  assert "'encoder_only'" in err
  err = fails(generate, "--workdir", lm_run[0])
  assert "--prompt" in err and "--source" in err
  err = fails(generate, "--workdir", translate_run[0], "--source", "hello", "--top_k", 5)
  assert "--top_k" in err and "--beam_size" in err


# -------------------------------------------------- length extrapolation
SEQ_LEN = 16
LEARNED_MAX_LEN = 32  # 1x and 2x fit the learned table, 4x does not


@pytest.mark.parametrize("position", get_args(Position))
def test_length_extrapolation_for_every_position_scheme(position, tmp_path):
  overrides = {"model.position": position, "train.seq_len": SEQ_LEN,
               "train.num_steps": 2, "eval.every_steps": 2, "eval.num_batches": 1,
               "checkpoint.every_steps": 2}
  if position == "learned":
    overrides["model.max_len"] = LEARNED_MAX_LEN
  workdir, _ = finished_run("lm.py:tiny", tmp_path / "run", overrides)
  if position != "rope":
    err = fails(evaluate, "--workdir", workdir, "--lengths", "1x,2x", "--rope_scaling",
                "linear", "--rope_scaling_factor", 2)
    assert "--rope_scaling=linear" in err and "model.position='rope'" in err, err
    assert not (workdir / "eval").exists()
  out = ok(evaluate, "--workdir", workdir, "--lengths", "1x,2x,4x",
           "--max_batches", MAX_BATCHES)
  assert f"length extrapolation (model.position={position})" in out
  table = {line.split()[0]: line.split()[1:] for line in out.splitlines()
           if line.split() and line.split()[0][0].isdigit()}
  assert list(table) == [f"{k}x={k * SEQ_LEN}" for k in (1, 2, 4)], out
  rows = json.loads((workdir / "eval" / "validation-2.lengths.json").read_text())
  assert [r["multiple"] for r in rows] == [1, 2, 4]
  for row, cells in zip(rows, table.values()):
    if position == "learned" and row["length"] > LEARNED_MAX_LEN:
      assert row["perplexity"] is None
      assert cells[1] == "n/a" and "learned positions end at max_len=32" in " ".join(cells)
      continue
    assert math.isfinite(row["perplexity"]) and row["perplexity"] > 1.0, row
    assert float(cells[1]) == pytest.approx(row["perplexity"], abs=0.01)
    # Every length scores the same tokens: the whole documents that hold the
    # 4x windows' tokens (data.packing=documents, the default).
    assert row["tokens"] == rows[0]["tokens"] >= 4 * SEQ_LEN * MAX_BATCHES
    assert row["packing"] == "documents"


def test_length_extrapolation_in_stream_packing(tmp_path):
  """A run trained on the token stream is evaluated on it: windows of k x L of
  the first n tokens, the same n at every length."""
  overrides = {"model.position": "alibi", "train.seq_len": SEQ_LEN, "train.num_steps": 2,
               "eval.every_steps": 2, "eval.num_batches": 1, "checkpoint.every_steps": 2,
               "data.packing": "stream"}
  workdir, _ = finished_run("lm.py:tiny", tmp_path / "run", overrides)
  out = ok(evaluate, "--workdir", workdir, "--lengths", "1x,2x", "--max_batches",
           MAX_BATCHES)
  assert "data.packing=stream: windows of the split's token stream" in out
  rows = json.loads((workdir / "eval" / "validation-2.lengths.json").read_text())
  assert [r["tokens"] for r in rows] == [2 * SEQ_LEN * MAX_BATCHES] * 2
  assert all(r["packing"] == "stream" and math.isfinite(r["perplexity"]) for r in rows)


def _lengths(workdir, *flags) -> tuple[list[dict], str]:
  """evaluate --lengths 1x,2x with ``flags``: (rows of the json written, stdout)."""
  out = ok(evaluate, "--workdir", workdir, "--lengths", "1x,2x", "--max_batches",
           MAX_BATCHES, *flags)
  path = out.split("written: ")[1].strip()
  return json.loads(pathlib.Path(path).read_text()), out


def test_length_extrapolation_with_scaled_rope(lm_run):
  """A RoPE run (trained at 32 tokens) evaluated with its positions scaled: each
  scaling has its own file, and the run's own result is left as it was."""
  workdir = lm_run[0]
  plain, _ = _lengths(workdir)
  plain_file = workdir / "eval" / "validation-20.lengths.json"
  written = plain_file.read_text()
  # A factor of 1 is the identity, in its own file.
  same, out = _lengths(workdir, "--rope_scaling", "linear", "--rope_scaling_factor", 1)
  assert "(model.position=rope, rope_scaling=linear-x1)" in out
  assert "validation-20.lengths.rope-linear-x1.json" in out
  assert [r["perplexity"] for r in same] == [r["perplexity"] for r in plain]
  assert same[0]["rope_scaling"] == "linear" and same[0]["rope_scaling_factor"] == 1.0
  # YaRN by 4 from the training length (the default), then given explicitly.
  yarn, out = _lengths(workdir, "--rope_scaling", "yarn", "--rope_scaling_factor", 4)
  assert "rope_scaling=yarn-x4-from32" in out
  assert "validation-20.lengths.rope-yarn-x4-from32.json" in out
  assert yarn[0]["rope_original_max_len"] == 32
  assert all(math.isfinite(r["perplexity"]) for r in yarn)
  assert [r["perplexity"] for r in yarn] != [r["perplexity"] for r in plain]
  again, _ = _lengths(workdir, "--rope_scaling", "yarn", "--rope_scaling_factor", 4,
                      "--rope_original_max_len", 32)
  assert again == yarn
  assert plain_file.read_text() == written


@pytest.mark.parametrize("flags,needles", [
    (["--rope_scaling", "dynamic"], ["--rope_scaling", "dynamic"]),
    (["--rope_scaling", "yarn"], ["--rope_scaling=yarn", "--rope_scaling_factor"]),
    (["--rope_scaling_factor", 2], ["--rope_scaling_factor", "with --rope_scaling"]),
    (["--rope_scaling", "linear", "--rope_scaling_factor", 0.5],
     ["--rope_scaling=linear", "model.rope_scaling_factor", ">= 1"]),
    (["--rope_scaling", "ntk", "--rope_scaling_factor", 2, "--rope_original_max_len", 8],
     ["--rope_scaling=ntk", "model.rope_original_max_len=8", "'yarn' only"]),
])
def test_bad_rope_scaling_exits_2(lm_run, flags, needles):
  err = fails(evaluate, "--workdir", lm_run[0], "--lengths", "1x,2x", *flags)
  for needle in needles:
    assert needle in err, err
  # Without --lengths there is nothing to scale.
  err = fails(evaluate, "--workdir", lm_run[0], "--rope_scaling", "linear",
              "--rope_scaling_factor", 2)
  assert "--rope_scaling applies to length extrapolation" in err


def test_bad_lengths_exit_2(lm_run, translate_run):
  for spec in ("abc", "0x", "2x,y", ""):
    assert "--lengths" in fails(evaluate, "--workdir", lm_run[0], f"--lengths={spec}")
  err = fails(evaluate, "--workdir", translate_run[0], "--lengths", "1x,2x")
  assert "--lengths evaluates language models" in err and "'encoder_decoder'" in err


# ------------------------------------------- decoding during training
def test_translation_run_logs_bleu_and_samples(translate_run):
  workdir, scalars = translate_run
  logdir = workdir / "tensorboard"
  tags = metrics.read_tags(logdir)
  assert "eval/bleu" in tags["scalars"] and "samples" in tags["texts"]
  assert [s for s, _ in scalars["eval/bleu"]] == [10, 20]
  assert all(0.0 <= v <= 100.0 for _, v in scalars["eval/bleu"])
  samples = metrics.read_texts(logdir)["samples"]
  assert [s for s, _ in samples] == [10, 20]
  pairs = texts.translation_pairs(trained_run.load_config(workdir), "validation",
                                      NUM_SAMPLES)
  shown = samples[-1][1].split("\n\n")
  assert len(shown) == NUM_SAMPLES
  for text, (source, reference) in zip(shown, pairs):
    assert f"source: {source}" in text and "hypothesis: " in text
    assert f"reference: {reference}" in text


def test_language_model_run_logs_samples(lm_run):
  workdir, scalars = lm_run
  logdir = workdir / "tensorboard"
  assert "eval/bleu" not in scalars
  samples = metrics.read_texts(logdir)["samples"]
  assert [s for s, _ in samples] == [10, 20]
  shown = samples[-1][1].split("\n\n")
  assert len(shown) == NUM_SAMPLES
  for text in shown:
    prompt, _, continuation = text.partition(" **")
    assert len(prompt.split()) == 4 and continuation.endswith("**"), text


# ------------------------------------------- evaluations in the training process
AFTER_TRAINING = [["--max_batches", "2"], ["--lengths", "1x,2x", "--max_batches", "1"],
                  ["--split", "test", "--max_batches", "1", "--step", "10"]]


def _eval_files(workdir: pathlib.Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in (workdir / "eval").iterdir() if p.suffix != ".done"}


def test_evaluations_in_the_training_process_write_what_the_command_writes(tmp_path):
  """``train_and_evaluate(..., evaluations)`` (a sweep's ``--evaluate``) runs
  each evaluation after the last step, in the training process, and writes
  what ``python -m tfx_jax.evaluate`` writes for the same checkpoint, byte for
  byte (an evaluation of another --step restores it); started again, a
  finished run runs only the evaluations it has not done, from its checkpoint."""
  workdir = tmp_path / "run"
  result = trainer.train_and_evaluate(tiny_config("lm.py:tiny"), str(workdir), AFTER_TRAINING)
  assert result.status == "finished"
  written = _eval_files(workdir)
  assert set(written) == {"validation-20.hyp.txt", "validation-20.ref.txt",
                          "validation-20.json", "validation-20.lengths.json",
                          "test-10.hyp.txt", "test-10.ref.txt", "test-10.json"}
  assert [status_lib.evaluation_marker(workdir, i).read_text().split()
          for i in range(3)] == AFTER_TRAINING
  status = status_lib.read_status(workdir)
  assert status.state == "finished" and status.cores >= 1
  assert all(status.seconds[p] > 0 for p in status_lib.PHASES), status.seconds
  for args in AFTER_TRAINING:
    ok(evaluate, "--workdir", workdir, *args)
  assert _eval_files(workdir) == written
  # One evaluation lost (a crash between two of them): only it runs again.
  status_lib.evaluation_marker(workdir, 1).unlink()
  (workdir / "eval" / "validation-20.lengths.json").unlink()
  kept = {p: p.stat().st_mtime_ns for p in (workdir / "eval").iterdir()}
  again = trainer.train_and_evaluate(tiny_config("lm.py:tiny"), str(workdir), AFTER_TRAINING)
  assert again.status == "finished"
  assert _eval_files(workdir) == written
  assert {p: p.stat().st_mtime_ns for p in kept} == kept
  resumed = status_lib.read_status(workdir)
  assert resumed.state == "finished" and resumed.num_params == status.num_params
  # Its time adds to the first attempt's: more evaluating, no more training.
  assert resumed.seconds["evaluations"] > status.seconds["evaluations"]
  assert resumed.seconds["train_steps"] == status.seconds["train_steps"]


def test_a_bad_evaluation_is_refused_before_training(tmp_path):
  code, _, err = run_command(train_command, [
      "--config", ROOT / "configs" / "lm.py:tiny", "--workdir", tmp_path / "run",
      "--evaluate=--split test --max_batchez 2"])
  assert code == 2 and "Traceback" not in err
  assert "evaluation --split test --max_batchez 2: Unknown command line flag" in err
  assert "--max_batches" in err and not (tmp_path / "run").exists()
  with pytest.raises(ConfigError, match="give --lengths too"):
    trainer.train_and_evaluate(tiny_config("lm.py:tiny"), str(tmp_path / "run"),
                               [["--rope_scaling", "linear"]])
  with pytest.raises(ConfigError, match="evaluates language models"):
    trainer.train_and_evaluate(tiny_config("mlm.py:tiny"), str(tmp_path / "run"),
                               [["--lengths", "1x,2x"]])
  assert not (tmp_path / "run").exists()


# ------------------------------------------------- evaluation data, prepared once
class _NotRead:
  """A pipeline that must not be read: the cache has what is asked for."""

  def __iter__(self):
    raise AssertionError("the evaluation pipeline was read again")


def test_evaluation_batches_are_prepared_once_and_read_back_equal(tmp_path, monkeypatch):
  config = run_config.resolve(tiny_config("lm.py:tiny"))
  tokenizer = run_setup.load_tokenizer(config)

  def batches(n, cfg=config, split="validation"):
    data = run_setup.make_data(cfg, tokenizer, split, train=False)
    return [b for _, b in zip(range(n), data)]

  monkeypatch.setenv(eval_cache.ENV, "")  # off: the pipeline itself
  live = batches(5)
  monkeypatch.setenv(eval_cache.ENV, str(tmp_path / "cache"))
  first = batches(3)  # stores 3 batches; the next pass reads them, prepares 2 more
  assert len(list((tmp_path / "cache").glob("*/*.npz"))) == 3
  more = batches(5)
  [key] = list((tmp_path / "cache").iterdir())
  assert len(list(key.glob("*.npz"))) == 5 and not (key / "end.json").exists()
  read_back = eval_cache.CachedPass(_NotRead(), key, {})
  for got in (first, more, [b for _, b in zip(range(5), read_back)]):
    for a, b in zip(live, got):
      assert a.keys() == b.keys()
      for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
  # The key: every field of the data config, the split, the tokenizer's model.
  made = eval_cache.make_key(config.data, tokenizer, "validation")
  assert set(made["data"]) == {f.name for f in dataclasses.fields(config.data)}
  assert made["tokenizer"]["model_sha256"] == eval_cache.file_digest(tokenizer.model_path)
  batches(1, split="test")
  changed = dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                 holdout_seed=1))
  batches(1, cfg=changed)
  assert len(list((tmp_path / "cache").iterdir())) == 3
