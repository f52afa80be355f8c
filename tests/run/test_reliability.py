"""Runs survive signals, kill -9, non-finite losses and bad input.

Every run here is the tiny language model of helpers.TINY, 30 steps, and
is compared with one uninterrupted reference run of the same config: on CPU,
an interrupted and resumed run must give the same numbers bitwise.
"""

from __future__ import annotations

import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import metrics
from tfx_jax.records import status as status_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import setup as run_setup
from helpers import (ROOT, cli_flags, run_cli, subprocess_env, tiny_config, train, train_cli,
                     train_command)

# ml_collections loads config files with the deprecated importlib load_module().
# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes"),
              pytest.mark.usefixtures("shared_compilation_cache")]

STEPS = 30
RUN = {"train.num_steps": STEPS}
COMPARED = ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss",
            "eval/perplexity")


def scalars(workdir) -> dict:
  return metrics.read_scalars(pathlib.Path(workdir) / "tensorboard")


def checkpoint_steps(workdir) -> list[int]:
  directory = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_status(workdir) -> status_lib.Status:
  return status_lib.read_status(workdir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """Scalars and result of one uninterrupted 30-step run."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  result = train("lm.py:tiny", workdir, RUN)
  assert result.status == "finished"
  return scalars(workdir), result


def assert_same_run(got: dict, reference_scalars: dict, steps=STEPS):
  for tag in COMPARED:
    want = [(s, v) for s, v in reference_scalars[tag] if s <= steps]
    assert [(s, v) for s, v in got[tag] if s <= steps] == want, tag


class _Iterator:
  """A training-data iterator that calls ``hook(n)`` before the n-th batch."""

  def __init__(self, iterator, hook):
    self._iterator, self._hook, self._n = iterator, hook, 0

  def __next__(self):
    self._n += 1
    self._hook(self._n)
    return next(self._iterator)

  def get_state(self):
    return self._iterator.get_state()

  def set_state(self, state):
    self._iterator.set_state(state)


def hook_training_data(monkeypatch, hook):
  make_data = run_setup.make_data

  class Dataset:
    def __init__(self, dataset):
      self._dataset = dataset

    def __iter__(self):
      return _Iterator(iter(self._dataset), hook)

  def hooked(config, tokenizer, split, *, train, **kwargs):
    dataset = make_data(config, tokenizer, split, train=train, **kwargs)
    return Dataset(dataset) if train else dataset

  monkeypatch.setattr(run_setup, "make_data", hooked)


def poison_step(monkeypatch, bad_step: int):
  """Makes the loss and gradients of update number ``bad_step`` NaN."""
  make_train_step = run_setup.make_train_step

  def poisoned(*args, **kwargs):
    train_step = make_train_step(*args, **kwargs)

    def step_fn(state, batch, hparams):
      nan_if_bad = jnp.where(state.step == bad_step - 1, jnp.nan, 1.0)
      return train_step(state, dict(batch, weights=batch["weights"] * nan_if_bad), hparams)

    return step_fn

  monkeypatch.setattr(run_setup, "make_train_step", poisoned)


# -------------------------------------------------------------- determinism
def test_same_config_and_seed_give_identical_metrics(reference, tmp_path):
  reference_scalars, reference_result = reference
  result = train("lm.py:tiny", tmp_path / "run", RUN)
  assert_same_run(scalars(tmp_path / "run"), reference_scalars)
  assert result.metrics == reference_result.metrics


def test_seed_changes_initialisation_and_data_order():
  def init_and_first_batch(seed):
    config = tiny_config("lm.py:tiny", {"seed": seed})
    setup = run_setup.ShardedRun(r := run_config.resolve(config), r.model)
    params = jax.device_get(setup.init_state().params)
    tokenizer = run_setup.load_tokenizer(config)
    batch = next(iter(run_setup.make_data(config, tokenizer, "train", train=True)))
    return params, batch

  params0, batch0 = init_and_first_batch(0)
  params0_again, batch0_again = init_and_first_batch(0)
  params1, batch1 = init_and_first_batch(1)
  jax.tree.map(np.testing.assert_array_equal, params0, params0_again)
  for key in batch0:
    np.testing.assert_array_equal(batch0[key], batch0_again[key])
  leaves0, leaves1 = jax.tree.leaves(params0), jax.tree.leaves(params1)
  random_leaves = [(a, b) for a, b in zip(leaves0, leaves1) if np.std(a) > 0]
  assert random_leaves and all(not np.array_equal(a, b) for a, b in random_leaves)
  assert not np.array_equal(batch0["inputs"], batch1["inputs"])


# ------------------------------------------------------------------ signals
def test_sigint_checkpoints_the_current_step_and_resumes_exactly(reference, tmp_path,
                                                                monkeypatch):
  workdir = tmp_path / "run"

  def interrupt(n):
    if n == 6:  # during the input of step 6: step 6 completes, then it stops
      os.kill(os.getpid(), signal.SIGINT)

  hook_training_data(monkeypatch, interrupt)
  handler = signal.getsignal(signal.SIGINT)
  result = train("lm.py:tiny", workdir, RUN)
  assert signal.getsignal(signal.SIGINT) is handler  # restored
  assert (result.status, result.step) == ("preempted", 6)
  status = read_status(workdir)
  assert (status.state, status.step, status.reason) == (
      "preempted", 6, "received SIGINT")
  assert checkpoint_steps(workdir) == [6]
  monkeypatch.undo()
  assert train("lm.py:tiny", workdir, RUN).status == "finished"
  assert_same_run(scalars(workdir), reference[0])


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_same_command_resumes(reference, tmp_path, jax_cache_dir):
  workdir = tmp_path / "run"
  # Long enough that SIGTERM lands mid-run; steps past 30 are not compared.
  command = train_command("lm.py:tiny", workdir, {"train.num_steps": 100})
  env = subprocess_env(jax_cache_dir)
  with open(tmp_path / "stderr", "w") as stderr:
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=stderr, text=True)
    try:
      for line in child.stdout:
        if line.startswith("step      3/100"):
          break
      assert child.poll() is None, "the run ended before step 3"
      assert read_status(workdir).state == "running"
      sent = time.time()
      child.send_signal(signal.SIGTERM)
      out = child.stdout.read()
      returncode = child.wait(timeout=120)
      elapsed = time.time() - sent
    finally:
      if child.poll() is None:
        child.kill()
        child.wait()
  assert returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
  assert elapsed < 30
  status = read_status(workdir)
  step = status.step
  assert (status.state, status.reason) == ("preempted", "received SIGTERM")
  assert 3 <= step < 100 and checkpoint_steps(workdir)[-1] == step
  assert f"saved a checkpoint at step {step}" in out

  again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Resumed from step {step}" in again.stdout
  assert (read_status(workdir).state, read_status(workdir).step) == ("finished", 100)
  assert_same_run(scalars(workdir), reference[0])


@pytest.mark.slow
def test_kill_9_at_any_moment_resumes_exactly(reference, tmp_path, jax_cache_dir):
  """kill -9 during start-up, between steps and while a checkpoint is written.

  Where a kill lands depends on the machine's speed (on a fast one, the first
  kill can come after the first checkpoints). What must hold whatever the
  timing: every restart resumes from the newest complete checkpoint the kill
  left, or starts afresh where there is none, and the finished run's numbers
  are the uninterrupted run's.
  """
  workdir = tmp_path / "run"
  checkpoints = workdir / "checkpoints"
  stdout = tmp_path / "stdout"
  command = train_command("lm.py:tiny", workdir, {
      **RUN, "checkpoint.every_steps": 1, "checkpoint.max_to_keep": 2})
  env = subprocess_env(jax_cache_dir)
  rng = random.Random(0)

  def complete_checkpoints() -> list[int]:
    # Orbax renames a step's directory to its number once it is complete.
    return checkpoint_steps(workdir) if checkpoints.exists() else []

  def tmp_dirs():
    try:
      return {n for n in os.listdir(checkpoints) if ".orbax-checkpoint-tmp" in n}
    except FileNotFoundError:
      return set()

  def training():
    return f"/{STEPS}  loss" in stdout.read_text()

  def writing_checkpoint():
    # A killed run leaves its tmp directory until the next run cleans it up:
    # wait for a new one, once there is a complete checkpoint to resume from.
    stale = tmp_dirs()
    return lambda: bool(complete_checkpoints()) and bool(tmp_dirs() - stale)

  def wait_for(child, ready, timeout=120):
    deadline = time.time() + timeout
    while not ready():
      assert child.poll() is None, "the run ended before it could be killed"
      assert time.time() < deadline
      time.sleep(0.002)

  resumed_from = []  # per run: the step it resumed from, 0 if it started afresh

  def check_resumed(log: str, complete: list[int]):
    """The run whose output is ``log`` resumed from the newest of ``complete``
    (the checkpoints present when it started), or started afresh without one.
    Every kill below but the first comes after the resumption is printed."""
    if complete:
      assert f"Resumed from step {complete[-1]} " in log, (complete, log[-2000:])
    else:
      assert "Resumed from" not in log, log[-2000:]
    resumed_from.append(complete[-1] if complete else 0)

  def restart_and_kill(ready, delay=0.0):
    complete = complete_checkpoints()
    with open(stdout, "w") as log:
      child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.DEVNULL, text=True)
      try:
        wait_for(child, ready)
        time.sleep(delay)
      finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    check_resumed(stdout.read_text(), complete)

  # 1. During start-up (import, data, compilation), usually before any checkpoint.
  restart_and_kill(lambda: True, delay=rng.uniform(0.5, 2.0))
  # 2. At a random moment after the first steps.
  restart_and_kill(training, delay=rng.uniform(0.0, 0.3))
  # 3. Twice while a checkpoint is being written (its orbax tmp directory exists).
  restart_and_kill(writing_checkpoint())
  restart_and_kill(writing_checkpoint())

  complete = complete_checkpoints()
  final = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
  assert final.returncode == 0, final.stderr[-3000:]
  check_resumed(final.stdout, complete)
  assert read_status(workdir).state == "finished"
  # Kills 3 and 4 left a complete checkpoint: the runs after them resumed; no
  # run went back to an older checkpoint than the run before it.
  assert resumed_from[0] == 0 and all(resumed_from[3:]), resumed_from
  assert resumed_from == sorted(resumed_from), resumed_from
  assert_same_run(scalars(workdir), reference[0])
  final_eval = {k: v[-1] for k, v in scalars(workdir).items() if k.startswith("eval/")}
  assert final_eval == {k: v[-1] for k, v in reference[0].items() if k.startswith("eval/")}


# ------------------------------------------------------- non-finite values
@pytest.mark.parametrize("bad_step", [3, 4])
def test_nonfinite_stop_reports_the_step_and_exits_non_zero(bad_step, tmp_path,
                                                            monkeypatch):
  # Step 4 is checked at once (a checkpoint step); step 3 one step late.
  poison_step(monkeypatch, bad_step)
  workdir = tmp_path / "run"
  code, out, _ = train_cli("lm.py:tiny", workdir, RUN, {
      "train.log_every_steps": 5, "checkpoint.every_steps": 2, "train.on_nonfinite": "stop"})
  assert code == 1
  status = read_status(workdir)
  assert (status.state, status.step) == ("diverged", bad_step)
  assert status.reason == f"non-finite loss or gradient at step {bad_step}"
  assert f"Run diverged: non-finite loss or gradient at step {bad_step}" in out
  assert checkpoint_steps(workdir) == [2]  # nothing non-finite is saved


def test_nonfinite_skip_skips_the_update_and_continues(tmp_path, monkeypatch):
  poison_step(monkeypatch, 4)
  workdir = tmp_path / "run"
  result = train("lm.py:tiny", workdir, RUN, {
      "train.num_steps": 8, "train.on_nonfinite": "skip", "checkpoint.every_steps": 1,
      "checkpoint.max_to_keep": 10, "eval.every_steps": 8})
  assert (result.status, result.step) == ("finished", 8)
  assert all(math.isfinite(v) for v in result.metrics.values())
  status = read_status(workdir)
  assert (status.state, status.num_nonfinite_skipped) == ("finished", 1)
  got = scalars(workdir)
  assert got["train/nonfinite_skipped"] == [(4, 1.0)]
  losses = dict(got["train/loss"])
  assert math.isnan(losses[4])
  assert all(math.isfinite(losses[s]) for s in (1, 2, 3, 5, 6, 7, 8))
  # Step 4 left parameters and optimizer state exactly as step 3 did.
  with ckpt_lib.Checkpointer(workdir / "checkpoints", max_to_keep=10) as ckpt:
    states = {s: ckpt.restore(s).state for s in (3, 4, 5)}
  for part in ("params", "opt_state"):
    jax.tree.map(np.testing.assert_array_equal, states[3][part], states[4][part])
  assert not np.array_equal(jax.tree.leaves(states[4]["params"])[0],
                            jax.tree.leaves(states[5]["params"])[0])


# ------------------------------------------------------------------- status
def test_crash_writes_failed_status_with_the_reason(tmp_path, monkeypatch):
  def crash(n):
    if n == 4:
      raise OSError("input file vanished")

  hook_training_data(monkeypatch, crash)
  workdir = tmp_path / "run"
  with pytest.raises(OSError):
    train("lm.py:tiny", workdir, RUN, {"checkpoint.every_steps": 1})
  status = read_status(workdir)
  assert (status.state, status.step) == ("failed", 3)
  assert status.reason == "OSError: input file vanished"


def test_restart_after_a_crash_before_the_first_checkpoint_logs_each_step_once(
    reference, tmp_path, monkeypatch):
  """The second attempt starts afresh; TensorBoard drops the first attempt's points."""
  def crash(n):
    if n == 5:
      raise OSError("input file vanished")

  hook_training_data(monkeypatch, crash)
  workdir = tmp_path / "run"
  with pytest.raises(OSError):
    train("lm.py:tiny", workdir, RUN)
  assert not checkpoint_steps(workdir)
  assert [s for s, _ in scalars(workdir)["train/loss"]] == [1, 2, 3, 4]
  monkeypatch.undo()
  assert train("lm.py:tiny", workdir, RUN).status == "finished"
  assert_same_run(scalars(workdir), reference[0])


# ---------------------------------------------------------------- bad input
BAD_INPUT = [
    # (config, overrides, text the message must contain)
    ("lm", {"model.nrom": "rmsnorm"}, "model.nrom"),
    ("lm", {"trian.num_steps": 5}, "'trian' is not a config field"),
    ("lm", {"model.num_heads": "x"}, "model.num_heads"),
    ("lm", {"train.batch_size": 1.5}, "train.batch_size"),
    ("lm", {"seed": "x"}, "seed"),
    ("lm", {"model.use_bias": "maybe"}, "model.use_bias"),
    ("lm", {"model.dropout": -0.1}, "model.dropout"),
    ("lm", {"model.num_heads": 0}, "model.num_heads"),
    ("lm", {"model.vocab_size": 0}, "model.vocab_size"),
    ("lm", {"model.norm_eps": 0.0}, "model.norm_eps"),
    ("lm", {"train.num_steps": 0}, "train.num_steps"),
    ("lm", {"train.batch_size": 0}, "train.batch_size"),
    ("lm", {"train.seq_len": 1}, "train.seq_len"),
    ("lm", {"eval.every_steps": 0}, "eval.every_steps"),
    ("lm", {"checkpoint.max_to_keep": 0}, "checkpoint.max_to_keep"),
    ("lm", {"optim.learning_rate": 0.0}, "optim.learning_rate"),
    ("lm", {"optim.warmup_steps": -1}, "optim.warmup_steps"),
    ("lm", {"optim.b2": 1.5}, "optim.b2"),
    ("lm", {"optim.accumulate_steps": 0}, "optim.accumulate_steps"),
    ("lm", {"train.label_smoothing": 1.5}, "train.label_smoothing"),
    ("mlm", {"data.mask_rate": 0.0}, "data.mask_rate"),
    ("mlm", {"data.mask_rate": 1.5}, "data.mask_rate"),
    ("finetune", {"finetune.lambda_pt": 2.0}, "finetune.lambda_pt"),
    ("finetune", {"model.num_classes": 1}, "model.num_classes"),
    ("lm", {"model.family": "decoder"}, "model.family"),
    ("lm", {"model.norm_position": "middle"}, "model.norm_position"),
    ("lm", {"model.norm_type": "batchnorm"}, "model.norm_type"),
    ("lm", {"model.activation": "tanh"}, "model.activation"),
    ("lm", {"model.position": "xpos"}, "model.position"),
    ("lm", {"model.remat": "some"}, "model.remat"),
    ("lm", {"model.dtype": "float16"}, "model.dtype"),
    ("lm", {"compute_dtype": "float16"}, "compute_dtype"),
    ("lm", {"optim.optimizer": "sgd"}, "optim.optimizer"),
    ("lm", {"optim.schedule": "exponential"}, "optim.schedule"),
    ("lm", {"train.on_nonfinite": "ignore"}, "train.on_nonfinite"),
    ("lm", {"task": "summarize"}, "task"),
    ("lm", {"data.tokenizer": "wordpiece"}, "data.tokenizer"),
    ("lm", {"model.d_model": 100, "model.num_heads": 3}, "model.num_heads"),
    ("lm", {"model.d_model": 30, "model.num_heads": 2}, "model.position='rope'"),
    ("lm", {"model.num_heads": 4, "model.num_kv_heads": 3}, "model.num_kv_heads"),
    ("lm", {"model.position": "learned", "train.seq_len": 512}, "model.max_len"),
    ("lm", {"task": "translate"}, "model.family"),
    ("lm", {"model.num_encoder_layers": 2}, "model.num_encoder_layers"),
    ("lm", {"mesh.data": 3}, "mesh"),
    ("lm", {"mesh.fsdp": 0}, "mesh"),
]
# Through a real subprocess too: one of each kind (parse, type, range,
# choice, combination, mesh).
IN_SUBPROCESS = ("model.nrom", "model.num_heads=x", "optim.learning_rate",
                 "model.activation", "model.num_kv_heads", "mesh.data")


def _bad_input_id(case):
  return ",".join(f"{k}={v}" for k, v in case[1].items())


def _args(config, overrides, workdir):
  return ["--config", f"{ROOT / 'configs' / config}.py:tiny", "--workdir", str(workdir),
          *cli_flags(overrides)]


@pytest.mark.parametrize("case", BAD_INPUT, ids=_bad_input_id)
def test_bad_input_exits_2_naming_the_field_before_any_work(case, tmp_path, monkeypatch):
  config, overrides, expected = case

  def must_not_run(*args, **kwargs):
    raise AssertionError("bad input must fail before data is read or anything built")

  for name in ("load_tokenizer", "make_data", "ShardedRun"):
    monkeypatch.setattr(run_setup, name, must_not_run)
  workdir = tmp_path / "run"
  code, _, err = run_cli(_args(config, overrides, workdir))
  assert code == 2, err
  assert err.startswith("error: ") and expected in err, err
  assert "Traceback" not in err
  assert not workdir.exists()


def test_bad_input_exits_2_in_a_subprocess(tmp_path):
  """The same cases through ``python -m tfx_jax.train``, a few at a time."""
  cases = [c for c in BAD_INPUT if any(k in _bad_input_id(c) for k in IN_SUBPROCESS)]
  assert len(cases) == len(IN_SUBPROCESS)
  children = []
  for i, (config, overrides, expected) in enumerate(cases):
    command = [sys.executable, "-m", "tfx_jax.train",
               *_args(config, overrides, tmp_path / f"run{i}")]
    children.append((expected, subprocess.Popen(
        command, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    if len(children) % 3 == 0 or i == len(cases) - 1:  # 3 at a time on 2 cores
      for want, child in children[-3:]:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 2, (want, err)
        assert err.startswith("error: ") and want in err and "Traceback" not in err, err
        assert not out
