"""Several WSD budgets from one run (run/branch.py): a trunk trained with the
schedule of the longest budget stops at its decay start (train.stop_step),
keeping its branch points (checkpoint.keep_steps); a budget branched from one
(train.branch_from, train.branch_step) equals a from-scratch WSD run of its
length bitwise, also after kill -9; bad branches are refused before anything
is compiled.

The runs are the tiny language model of helpers.TINY with dropout on (so the
RNG key is continued too): a from-scratch run of 24 steps decaying over its
last quarter (from step 18), a trunk of 36 steps stopped at 27 = 36 x 0.75,
and a budget of 24 steps branched from the trunk at step 18.
"""

from __future__ import annotations

import signal

import jax
import numpy as np
import pytest

from tfx_jax.run import branch
from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import metrics
from tfx_jax.run import setup as run_setup
from tfx_jax.records import status as status_lib
from tfx_jax.core.errors import ConfigError, InactiveSetting
from helpers import (start_until, subprocess_env, tiny_config, train, train_cli,
                     train_command)

pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.usefixtures("shared_compilation_cache")]

T, T_MAX, BRANCH = 24, 36, 18
STOP = int(T_MAX * 0.75)  # 27: the trunk's decay start
WSD = {"optim.schedule": "wsd", "optim.decay_steps": 0, "optim.decay_fraction": 0.25,
       "model.dropout": 0.1}
TRUNK = {**WSD, "train.num_steps": T_MAX, "train.stop_step": STOP,
         "checkpoint.keep_steps": (BRANCH, STOP), "checkpoint.max_to_keep": 1}
BUDGET = {**WSD, "train.num_steps": T}
COMPARED = ("train/loss", "train/grad_norm", "train/learning_rate", "eval/loss")


def branched(trunk, **more) -> dict:
  return {**BUDGET, "train.branch_from": str(trunk), "train.branch_step": BRANCH, **more}


def must_not_run(*args, **kwargs):
  raise AssertionError("a bad branch must be refused before anything is built")


def final_state(workdir, step=T):
  with ckpt_lib.Checkpointer(workdir / "checkpoints", read_only=True) as ckpt:
    return ckpt.restore(step).state


def assert_bitwise(got, want):
  """Parameters, optimizer state, step and RNG key: the same bits."""
  got_leaves, want_leaves = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (got, want))
  assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
  for (path, a), (_, b) in zip(got_leaves, want_leaves):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path


def scalars(workdir) -> dict:
  return metrics.read_scalars(workdir / "tensorboard")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Workdirs and results of the from-scratch run, the trunk and one budget."""
  root = tmp_path_factory.mktemp("branch")
  scratch = train("lm.py:tiny", root / "scratch", BUDGET)
  trunk = train("lm.py:tiny", root / "trunk", TRUNK)
  budget = train("lm.py:tiny", root / "budget", branched(root / "trunk"))
  return root, {"scratch": scratch, "trunk": trunk, "budget": budget}


def test_a_trunk_stops_at_stop_step_and_keeps_its_branch_points(runs, monkeypatch, capsys):
  root, results = runs
  trunk = root / "trunk"
  assert (results["trunk"].status, results["trunk"].step) == ("finished", STOP)
  status = status_lib.read_status(trunk)
  assert (status.state, status.step) == ("finished", STOP)
  assert "stopped at train.stop_step=27" in status.reason
  # max_to_keep=1 deleted step 10 and 20; the branch points stay.
  assert ckpt_lib.Checkpointer(trunk / "checkpoints", read_only=True).all_steps() == [
      BRANCH, STOP]
  got = scalars(trunk)
  assert [s for s, _ in got["train/loss"]][-1] == STOP
  assert [s for s, _ in got["eval/loss"]] == [0, 10, 20]  # no final evaluation at the stop
  # Its rates are those of the 36-step schedule: the stable phase to step 27.
  rates = [v for _, v in got["train/learning_rate"]]
  assert rates[4:] == [rates[4]] * (STOP - 4)
  # Started again, it says it is done and builds nothing.
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  again = train("lm.py:tiny", trunk, TRUNK)
  assert (again.status, again.step) == ("finished", STOP)
  assert "already finished at step 27 (train.stop_step=27 of train.num_steps=36)" in (
      capsys.readouterr().out)


def test_a_branched_budget_is_the_from_scratch_run_bitwise(runs):
  root, results = runs
  assert (results["budget"].status, results["budget"].step) == ("finished", T)
  assert_bitwise(final_state(root / "budget"), final_state(root / "scratch"))
  assert results["budget"].metrics == results["scratch"].metrics  # the final evaluation
  got, want = scalars(root / "budget"), scalars(root / "scratch")
  for tag in COMPARED:
    assert got[tag] == [(s, v) for s, v in want[tag] if s > BRANCH], tag
  # Its status says where it joins the trunk's curves.
  status = status_lib.read_status(root / "budget")
  assert (status.branch_from, status.branch_step) == (str(root / "trunk"), BRANCH)
  assert status_lib.read_status(root / "scratch").branch_from is None
  hparams, _ = metrics.read_hparams(root / "budget" / "tensorboard")
  assert hparams["train.branch_step"] == BRANCH


def test_kill_9_of_a_branch_mid_decay_then_the_same_command(runs, tmp_path, jax_cache_dir,
                                                             capsys):
  """Killed before its first checkpoint, the budget branches again; killed
  while its decay runs (a checkpoint a step), it resumes from its own latest
  checkpoint, not the trunk's; either way it ends bitwise as the from-scratch
  run, with one curve."""
  root, _ = runs
  workdir = tmp_path / "budget"
  overrides = branched(root / "trunk", **{"checkpoint.every_steps": 1})
  command = train_command("lm.py:tiny", workdir, overrides)
  env = subprocess_env(jax_cache_dir)

  def own_steps():
    with ckpt_lib.Checkpointer(workdir / "checkpoints", read_only=True) as ckpt:
      return ckpt.all_steps()

  for marker in (f"Branched from step {BRANCH} of", f"step     21/{T}"):
    child, seen = start_until(command, env, marker)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert marker in seen[-1], seen[-20:]
    if marker.startswith("Branched"):
      assert own_steps() == []  # killed before its first step
  assert any(f"Branched from step {BRANCH} of" in line for line in seen), seen[-20:]
  own = own_steps()
  assert own and own[-1] < T, own  # killed before the end
  result = train("lm.py:tiny", workdir, overrides)
  assert f"Resumed from step {own[-1]} " in capsys.readouterr().out
  assert (result.status, result.step) == ("finished", T)
  assert_bitwise(final_state(workdir), final_state(root / "scratch"))
  got, want = scalars(workdir), scalars(root / "scratch")
  for tag in COMPARED:
    assert got[tag] == [(s, v) for s, v in want[tag] if s > BRANCH], tag
  assert len(metrics.read_texts(workdir / "tensorboard")["config"]) == 1
  status = status_lib.read_status(workdir)
  assert (status.branch_from, status.branch_step) == (str(root / "trunk"), BRANCH)


@pytest.mark.parametrize("more, message", [
    ({"train.branch_step": 12}, "has no checkpoint at train.branch_step=12; its "
     "checkpoints are at steps [18, 27]"),
    ({"model.d_model": 64}, "model.d_model: saved 32 -> new 64"),
    ({"seed": 1}, "seed: saved 0 -> new 1"),
    ({"optim.b2": 0.95}, "optim.b2: saved 0.98 -> new 0.95"),
    ({"optim.warmup_steps": 6}, "optim.warmup_steps: saved 5 -> new 6"),
    ({"train.label_smoothing": 0.1}, "train.label_smoothing: saved 0.0 -> new 0.1"),
    ({"train.branch_step": 20}, "train.branch_step=20 is not valid: must be at or before "
     "this run's decay start, step 18"),
])
def test_a_branch_that_disagrees_with_its_trunk_is_refused_before_compiling(
    runs, monkeypatch, tmp_path, more, message):
  root, _ = runs
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  code, _, err = train_cli("lm.py:tiny", tmp_path / "run", branched(root / "trunk", **more))
  assert code == 2 and "Traceback" not in err, err
  assert message in err, err
  assert not (tmp_path / "run" / "checkpoints").exists() or not any(
      (tmp_path / "run" / "checkpoints").iterdir())


def test_a_missing_trunk_is_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(run_setup, "ShardedRun", must_not_run)
  code, _, err = train_cli("lm.py:tiny", tmp_path / "run", branched(tmp_path / "none"))
  assert code == 2 and "is neither a run directory nor a checkpoints directory" in err, err


# ------------------------------------------------- the checks on the config
def resolve(overrides):
  return run_config.resolve(tiny_config("lm.py:tiny", overrides))


@pytest.mark.parametrize("overrides, error, message", [
    ({**BUDGET, "train.stop_step": 30}, ConfigError,
     "train.stop_step=30 is not valid: must be in [0, train.num_steps=24]"),
    ({**BUDGET, "train.stop_step": -1}, ConfigError, "train.stop_step=-1 is not valid"),
    ({**TRUNK, "checkpoint.keep_steps": (18, 30)}, ConfigError,
     "steps [30] are not in 1..27"),
    ({**BUDGET, "checkpoint.keep_steps": (0,)}, ConfigError, "steps [0] are not in 1..24"),
    ({**BUDGET, "train.branch_step": 18}, InactiveSetting, "train.branch_from is not set"),
    ({**BUDGET, "train.branch_from": "runs/trunk"}, ConfigError,
     "needs train.branch_step"),
    ({**BUDGET, "train.branch_from": "t", "train.branch_step": 20}, ConfigError,
     "train.branch_step=20 is not valid: must be at or before this run's decay start, "
     "step 18"),
    ({**BUDGET, "train.branch_from": "t", "train.branch_step": 24}, ConfigError,
     "train.branch_step=24 is not valid: must be < train.num_steps=24"),
    ({**BUDGET, "optim.schedule": "cosine", "optim.decay_fraction": 0.2,
      "train.branch_from": "t", "train.branch_step": 18}, ConfigError,
     "this run's schedule is 'cosine'"),
    ({**BUDGET, "train.branch_from": "t", "train.branch_step": 18,
      "finetune.init_checkpoint": "t"}, ConfigError, "set one of them"),
])
def test_bad_stop_keep_and_branch_settings_name_the_field(overrides, error, message):
  with pytest.raises(error) as raised:
    resolve(overrides)
  assert message in str(raised.value)


def test_keep_steps_from_the_command_line_and_a_sweep(tmp_path):
  from tfx_jax.run import config_base  # pylint: disable=import-outside-toplevel
  config = tiny_config("lm.py:tiny")
  for text, want in (("18,27", (18, 27)), ("(18, 27)", (18, 27)), ("[]", ())):
    assert config_base.coerce(config, "checkpoint.keep_steps", text) == want
  config_base.apply_overrides(config, {"checkpoint.keep_steps": [3, 5]})
  assert config.checkpoint.keep_steps == (3, 5)
  assert resolve({"checkpoint.keep_steps": [3, 5]}).checkpoint.keep_steps == (3, 5)
  with pytest.raises(ConfigError, match=r"checkpoint.keep_steps\[1\] must be an integer"):
    resolve({"checkpoint.keep_steps": (3, 5.5)})


def planted(tmp_path, overrides, step=BRANCH) -> branch.BranchPoint:
  """A trunk's checkpoint as its saved config (no arrays: the schedule checks
  read the config only)."""
  flat = run_config.flatten_config(tiny_config("lm.py:tiny", overrides))
  return branch.BranchPoint(tmp_path, tmp_path / "checkpoints", step, flat)


def test_schedules_that_differ_before_the_branch_point_are_refused(tmp_path):
  """The same fields but other rates: a warmup the resolution caps on the
  shorter run, and a trunk whose decay began before the branch point."""
  def check(trunk_overrides, run_overrides):
    config = tiny_config("lm.py:tiny", run_overrides)
    branch.check_optimizer(planted(tmp_path, trunk_overrides), run_config.resolve(config),
                           run_config.flatten_config(config))

  check(TRUNK, branched(tmp_path))  # the trunk of the tests above: accepted
  warm = {"optim.warmup_steps": 20}
  with pytest.raises(ConfigError) as raised:  # capped at 2 = 24 / 10 here, not there
    check({**TRUNK, **warm}, branched(tmp_path, **warm))
  assert "update 1 had rate" in str(raised.value)
  assert "Trunk: wsd, warmup 20 steps" in str(raised.value)
  assert "this run: wsd, warmup 2 steps" in str(raised.value)
  early = {**TRUNK, "train.num_steps": 20, "train.stop_step": 0, "checkpoint.keep_steps": (),
           "optim.decay_fraction": 0.5}  # decays from step 10
  with pytest.raises(ConfigError, match="update 11 had rate"):
    check(early, branched(tmp_path, **{"train.num_steps": 40}))
