"""A ladder in a sweep (``Sweep(ladder=Ladder(...))``, ``--ladder``): rungs x
budgets ahead of the declared axes, each budget's steps from its rung's
non-embedding count, the dry run's table, the trunk runs of branched wsd
budgets (``sweep.branching``), and the confirmation runs of budgets that share
their tuned value (``Ladder(share_tuning=True)``) branching from one trunk."""

from __future__ import annotations

import math

import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import ladder as ladder_lib
from tfx_jax.records import sweep as sweep_record
from tfx_jax.run import config as run_config
from tfx_jax.run import footprint
from tfx_jax.run.config_base import apply_overrides, load_config_file
from tfx_jax.sweep import Ladder, Sweep
from tfx_jax.sweep import branching
from tfx_jax.sweep import ladder as ladder_plan
from tfx_jax.sweep import spec as spec_lib
from helpers import sweep_in_process

pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")]

RUNGS = "model.d_model=32,64;model.num_heads=2,2"
WSD = ["--config.optim.schedule=wsd", "--config.optim.warmup_steps=5"]
LADDER = ["--config", "configs/lm.py:tiny", "--ladder", RUNGS, "--tokens-per-param", "2,4",
          "--axis", "model.activation=gelu,swiglu", *WSD]


def _sweep(**changes) -> Sweep:
  base = dict(name="lad", config="configs/lm.py:tiny",
              overrides={"optim.schedule": "wsd", "optim.warmup_steps": 5},
              axes=[{"model.activation": ["gelu", "swiglu"]}],
              ladder=Ladder(rungs=[{"model.d_model": 32, "model.num_heads": 2},
                                   {"model.d_model": 64, "model.num_heads": 2}],
                            tokens_per_param=[2, 4]))
  base.update(changes)
  return Sweep(**base)


def _plan(sweep: Sweep) -> ladder_lib.LadderPlan:
  return ladder_plan.plan(sweep.config, sweep.overrides, sweep.ladder,
                          spec_lib.declared_axes(sweep), count_corpus=False)


def test_each_budget_trains_tokens_per_param_times_the_rungs_non_embedding_count():
  sweep = _sweep()
  plan = _plan(sweep)
  axes, runs = spec_lib.expand(sweep, plan=plan)
  assert [a.label for a in axes] == ["model.d_model+model.num_heads",
                                     ladder_lib.BUDGET_FIELD, "model.activation"]
  assert len(runs) == 2 * 2 * 2
  for ri, d_model in enumerate((32, 64)):
    config = load_config_file("configs/lm.py:tiny")
    apply_overrides(config, {"model.d_model": d_model, "model.num_heads": 2,
                             "optim.schedule": "wsd", "optim.warmup_steps": 5})
    run = run_config.resolve(config)
    shapes = footprint.param_shapes(run.model)
    total = sum(math.prod(v.shape) for v in shapes.values())
    tables = math.prod(shapes["embedding/embedding"].shape)  # tied; RoPE: no position table
    assert plan.rung_params[ri] == total - tables
    for bi, tpp in enumerate((2, 4)):
      point = plan.point((ri, bi, 0))
      assert point.steps == round(tpp * plan.rung_params[ri] / (16 * 64))
      assert point.tokens == point.steps * 16 * 64
      assert point.flops_per_token == footprint.flops_per_token(run.model, 64)["train"]
      assert point.branch_step == int(point.steps * (1 - run.optim.decay_fraction))
  for run in runs:
    key = (run.values[0]["model.d_model"] == 64, [2.0, 4.0].index(
        run.values[1][ladder_lib.BUDGET_FIELD]))
    assert run.overrides["train.num_steps"] == plan.point((*key, 0)).steps
    assert ladder_lib.BUDGET_FIELD not in run.overrides
  # The swiglu variant has its own FLOPs per token, the same tokens.
  gelu, swiglu = plan.point((1, 1, 0)), plan.point((1, 1, 1))
  assert gelu.tokens == swiglu.tokens and gelu.flops_per_token != swiglu.flops_per_token


def test_branched_budgets_share_one_trunk_per_rung_variant_and_seed():
  sweep = _sweep(seeds=[0, 1])
  plan = _plan(sweep)
  axes, runs = spec_lib.expand(sweep, plan=plan)
  record = sweep_record.SweepRecord(
      name="lad", config=sweep.config, seeds=(0, 1),
      axes=tuple(sweep_record.AxisRecord(a.label, tuple(a.fields), a.values) for a in axes),
      runs=[sweep_record.RunEntry(r.name, r.seed, r.values, dict(r.overrides)) for r in runs],
      ladder=plan)
  added = branching.attach(record)
  assert len(added) == 2 * 2 * 2  # rungs x variants x seeds
  for trunk in record.trunks:
    budgets = [e for e in record.runs if e.trunk == trunk.name]
    assert len(budgets) == 2
    steps = sorted(e.overrides["train.branch_step"] for e in budgets)
    assert list(trunk.overrides["checkpoint.keep_steps"]) == steps
    assert trunk.overrides["train.stop_step"] == steps[-1]
    assert trunk.overrides["train.num_steps"] == max(e.overrides["train.num_steps"]
                                                     for e in budgets)
    assert "_trunk_" in trunk.name and "tokens_per_param" not in trunk.name
    for e in budgets:
      assert {k: v for k, v in e.overrides.items()
              if k not in ("train.num_steps", "train.branch_step")} == {
                  k: v for k, v in trunk.overrides.items()
                  if k not in ("train.num_steps", "train.stop_step", "checkpoint.keep_steps")}
  # Attaching again (the next invocation) adds nothing; a fresh record with
  # the trunks kept links its budgets to them.
  assert branching.attach(record) == []
  fresh = sweep_record.SweepRecord.from_json(record.to_json())
  for e in fresh.runs:
    e.trunk = ""
    e.overrides.pop("train.branch_step")
  assert branching.attach(fresh) == []
  assert all(e.trunk for e in fresh.runs)
  text = branching.steps_text(record)
  assert "8 trunk run(s) for 16 branched budget(s)" in text


def test_the_dry_run_lists_rungs_budgets_branch_points_flops_and_the_saved_steps(
    tmp_path, capsys):
  code, out, err = sweep_in_process([*LADDER, "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  assert "ladder: 2 rungs x 2 budgets (tokens per non-embedding parameter: 2.0, 4.0)" in out
  for head in ("non-emb params", "FLOPs/token", "tokens/param", "epochs", "FLOPs",
               "branch at"):
    assert head in out
  assert "branched budgets: per (variant, tuned value, seed)" in out and "saved" in out
  assert "trunk: trains to step" in out and "branches from" in out
  assert "--config.train.num_steps=" in out
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags, message", [
    (["--ladder", "model.d_model=32,32;model.num_heads=2,4", "--tokens-per-param", "2"],
     "a rung must change the model's size"),
    (["--ladder", RUNGS, "--tokens-per-param", "0,2"], "each must be a number > 0"),
    (["--ladder", RUNGS, "--tokens-per-param", "-1"], "each must be a number > 0"),
    (["--ladder", "train.batch_size=8,16", "--tokens-per-param", "2"],
     "train.batch_size is not a model field"),
    (["--ladder", "model.width=32,64", "--tokens-per-param", "2"], "model.width"),
    (["--ladder", RUNGS], "--ladder needs --tokens-per-param"),
])
def test_a_bad_ladder_exits_2_at_dry_run_and_writes_nothing(tmp_path, capsys, flags,
                                                            message):
  code, out, err = sweep_in_process(["--config", "configs/lm.py:tiny", *flags, *WSD,
                                     "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 2 and message in err, out + err
  assert not list(tmp_path.iterdir())


def test_declaration_errors_name_the_problem():
  with pytest.raises(ConfigError, match="a ladder needs >= 2 sizes"):
    ladder_lib.check_declaration(Ladder(rungs=[{"model.d_model": 32}], tokens_per_param=[2]))
  with pytest.raises(ConfigError, match="every rung sets the same fields"):
    ladder_lib.check_declaration(Ladder(rungs=[{"model.d_model": 32}, {"model.num_layers": 3}],
                                        tokens_per_param=[2]))
  with pytest.raises(ConfigError, match="repeats a value"):
    ladder_lib.check_declaration(Ladder(rungs=[{"model.d_model": 32}, {"model.d_model": 64}],
                                        tokens_per_param=[2, 2]))
  with pytest.raises(ConfigError, match="which the ladder's rungs or budgets set"):
    spec_lib.declared_axes(_sweep(axes=[{"model.d_model": [32, 64]}]))
  with pytest.raises(ConfigError, match="the warmup must end before the first branch point"):
    _plan(_sweep(overrides={"optim.schedule": "wsd", "optim.warmup_steps": 400}))


def test_epochs_over_four_warn(tmp_path, capsys):
  code, out, err = sweep_in_process(
      ["--config", "configs/lm.py:tiny", "--ladder", RUNGS, "--tokens-per-param", "80,160",
       *WSD, "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  plan_line = next(line for line in out.splitlines() if "training split" in line)
  corpus = int(plan_line.rsplit("training split ", 1)[1].split()[0].replace(",", ""))
  assert corpus > 0
  assert "epochs of the training split" in out and "more than 4" in out


# ---------------------------------------------------------- kill -9, resume


@pytest.mark.xdist_group("processes")
def test_a_tiny_ladder_runs_end_to_end_and_a_branch_killed_with_kill_9_resumes_bitwise(
    tmp_path):
  """``experiments/ladders.py:tiny`` (2 rungs x 2 budgets x 2 variants): a
  kill -9 while a branched budget is training, then the same command: every
  trunk and budget finishes once, and the killed budget ends as its
  from-scratch twin (the same config without the branch, in the executor's
  one-core environment) bitwise."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  import signal  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  from tfx_jax.records import status as status_lib  # pylint: disable=import-outside-toplevel
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import local  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import state as state_lib  # pylint: disable=import-outside-toplevel
  from helpers import ROOT, start_until, subprocess_env  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, 1024)
  env = subprocess_env(tmp_path / "jax_cache")
  command = [sys.executable, "-m", "tfx_jax.sweep", "experiments/ladders.py:tiny",
             "--workdir", str(tmp_path), "--parallel", "2",
             # Evaluations on 2 batches: this test is about the runs, not the loss.
             "--config.eval.num_batches=2", "--config.eval.final_batches=-1"]
  sweep_dir = tmp_path / "ladder_tiny"
  marker = "start  d_model-48_tokens_per_param-2.0"
  proc, seen = start_until(command, env, marker)
  assert marker in seen[-1], "".join(seen)
  killed = re.search(r"start  (\S+)", seen[-1]).group(1)
  log = sweep_dir / killed / state_lib.LOG_FILE
  deadline = time.time() + 300
  # Killed in its decay: past the branch point (87 of 109 steps), before the end.
  while not (log.exists() and re.search(r"step +(9\d|10\d)/109", log.read_text())):
    assert proc.poll() is None and time.time() < deadline, "".join(seen)
    time.sleep(0.005)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert "trunk" not in "".join(l for l in rerun.stdout.splitlines(True) if "start " in l)
  record = sweep_record.read(sweep_dir)
  assert len(record.trunks) == 4 and len(record.runs) == 8
  assert {e.state for e in [*record.runs, *record.trunks]} == {"finished"}
  for trunk in record.trunks:
    assert trunk.step == trunk.overrides["train.stop_step"]
  for entry in record.runs:
    status = status_lib.read_status(sweep_dir / entry.name)
    assert entry.step == entry.overrides["train.num_steps"]
    assert status.branch_step == entry.overrides["train.branch_step"]
  # The killed budget's twin from scratch, as the executor runs a run.
  twin = tmp_path / "twin"
  spec = json.loads((sweep_dir / killed / "run_spec.json").read_text())
  for field in ("train.branch_from", "train.branch_step"):
    spec["overrides"].pop(field)
  twin.mkdir()
  (twin / "run_spec.json").write_text(json.dumps(spec))
  twin_env = local.child_env(sweep_dir, [0], None, env)
  subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "tfx_jax.train", "--spec",
                  str(twin / "run_spec.json"), "--workdir", str(twin)], cwd=ROOT,
                 env=twin_env, check=True, capture_output=True, timeout=600)
  entry = next(e for e in record.runs if e.name == killed)
  branched = collect.read_run(sweep_dir / killed, entry)
  scratch = collect.read_run(twin, entry)
  assert branched.final["eval/loss"] == scratch.final["eval/loss"]
  assert branched.final["train/nll"] == scratch.final["train/nll"]


def test_a_seeded_copy_of_a_branched_budget_gets_a_trunk_of_its_own():
  """Confirmation and --until-resolved seeds copy a tuning run: the copy drops
  the template's branch point and trunk, and attach gives its seed a trunk."""
  from tfx_jax.sweep import adaptive  # pylint: disable=import-outside-toplevel
  sweep = _sweep()
  plan = _plan(sweep)
  axes, runs = spec_lib.expand(sweep, plan=plan)
  record = sweep_record.SweepRecord(
      name="lad", config=sweep.config, seeds=(0,),
      axes=tuple(sweep_record.AxisRecord(a.label, tuple(a.fields), a.values) for a in axes),
      runs=[sweep_record.RunEntry(r.name, r.seed, r.values, dict(r.overrides)) for r in runs],
      ladder=plan)
  branching.attach(record)
  copies = [adaptive.seeded_entry(e, 7, "confirm") for e in list(record.runs)]
  assert all(not c.trunk and "train.branch_step" not in c.overrides for c in copies)
  record.runs.extend(copies)
  added = branching.attach(record, copies)
  assert len(added) == 4 and all(t.name.endswith("_s7") for t in added)
  assert all("train.branch_step" not in t.overrides for t in record.trunks)
  assert all(c.trunk.endswith("_trunk_activation-" + c.values[2]["model.activation"] + "_s7")
             for c in copies)


# ------------------------------------------------------------ shared tuning


def _tuned_record(*flags: str) -> sweep_record.SweepRecord:
  """The record a tuned, confirmed ladder's first invocation writes (2 rungs x
  2 budgets x 2 variants x 2 rates, seed 0, 1 confirmation seed), every
  tuning run finished."""
  from tfx_jax.sweep import cli  # pylint: disable=import-outside-toplevel
  args = cli._parser().parse_args([  # pylint: disable=protected-access
      "--config", "configs/lm.py:tiny", "--ladder", RUNGS, "--tokens-per-param", "2,4",
      "--axis", "model.activation=gelu,swiglu", "--tune", "optim.learning_rate=1e-3,3e-3",
      "--confirm", "1", *flags])
  sweep = cli.declared_sweep(args, {"optim.schedule": "wsd", "optim.warmup_steps": "5"})
  plan = _plan(sweep)
  axes, runs = spec_lib.expand(sweep, plan=plan)
  record = cli.build_record(sweep, axes, runs, "python -m tfx_jax.sweep ...", None,
                            ladder=plan)
  for entry in record.runs:
    entry.state = "finished"
  return record


def _confirmed(record: sweep_record.SweepRecord) -> list[sweep_record.RunEntry]:
  """The confirmation runs added at the values the finished tuning runs choose:
  budget 0 prefers 1e-3 (by 0.05), budget 1 prefers 3e-3 (by 0.1), so 3e-3 has
  the lower mean over the two."""
  import types  # pylint: disable=import-outside-toplevel
  from tests import fakes  # pylint: disable=import-outside-toplevel
  from tfx_jax.report import schema  # pylint: disable=import-outside-toplevel
  from tfx_jax.report.sections import selection  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
  penalty = {0: {1e-3: 0.0, 3e-3: 0.05}, 1: {1e-3: 0.1, 3e-3: 0.0}}
  summaries = {e.name: fakes.summary({"eval/loss": 3.0 + penalty[record.point_key(e)[1]][
      e.tuned["optim.learning_rate"]]}) for e in record.runs}
  baselines = {name: schema.Baseline(8.0, math.log(256)) for name in summaries}
  points = selection.analyze_points(record, summaries, baselines, schema.Options())
  return confirm.add_confirmation(record, types.SimpleNamespace(points=points))


def test_with_shared_tuning_the_confirmation_runs_of_the_budgets_share_one_trunk():
  record = _tuned_record("--share-tuning")
  assert record.ladder.share_tuning and record.ladder.branch
  tuning_trunks = len(record.trunks)
  assert tuning_trunks == 2 * 2 * 2  # rungs x variants x rates
  new = _confirmed(record)
  assert len(new) == 2 * 2 * 2  # rungs x budgets x variants, one confirmation seed
  assert {e.tuned["optim.learning_rate"] for e in new} == {3e-3}
  added = branching.attach(record, new)
  assert len(added) == 2 * 2  # one trunk per rung and variant
  for trunk in added:
    budgets = [e for e in new if e.trunk == trunk.name]
    assert len(budgets) == 2 and {record.point_key(e)[1] for e in budgets} == {0, 1}
    assert sorted(trunk.overrides["checkpoint.keep_steps"]) == sorted(
        e.overrides["train.branch_step"] for e in budgets)
  assert all(e.trunk for e in new)


def test_without_shared_tuning_budgets_confirmed_at_different_rates_get_no_trunk():
  record = _tuned_record()
  assert not record.ladder.share_tuning
  new = _confirmed(record)
  assert {(record.point_key(e)[1], e.tuned["optim.learning_rate"]) for e in new} == {
      (0, 1e-3), (1, 3e-3)}
  assert branching.attach(record, new) == []
  assert not any(e.trunk for e in new)


def test_share_tuning_is_written_only_where_true_and_an_older_plan_reads_false():
  from tfx_jax.records import serial  # pylint: disable=import-outside-toplevel
  plan = _plan(_sweep())
  data = serial.to_json(plan)
  assert "share_tuning" not in data and not plan.share_tuning
  assert serial.from_json(ladder_lib.LadderPlan, data) == plan
  shared = _plan(_sweep(tune={"optim.learning_rate": [1e-3, 3e-3]}, ladder=Ladder(
      rungs=[{"model.d_model": 32, "model.num_heads": 2},
             {"model.d_model": 64, "model.num_heads": 2}],
      tokens_per_param=[2, 4], share_tuning=True)))
  assert serial.to_json(shared)["share_tuning"] is True
  assert serial.from_json(ladder_lib.LadderPlan, serial.to_json(shared)) == shared
  assert "  shared tuning (Ladder(share_tuning=True) or --share-tuning)" in "\n".join(
      ladder_plan.table(shared))
  assert "shared tuning" not in "\n".join(ladder_plan.table(plan))
  with pytest.raises(ConfigError, match="ladder share_tuning 'yes': expected True"):
    ladder_lib.check_declaration(Ladder(rungs=[{"model.d_model": 32}, {"model.d_model": 64}],
                                        tokens_per_param=[2, 4], share_tuning="yes"))


def test_share_tuning_on_the_command_line_shows_in_the_dry_run_and_needs_tune(
    tmp_path, capsys):
  code, out, err = sweep_in_process(
      [*LADDER, "--tune", "optim.learning_rate=1e-3,3e-3", "--share-tuning",
       "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  assert ("the budgets of each rung and variant share one tuned value, the one with the "
          "lowest mean validation score over the budgets") in out
  code, out, err = sweep_in_process([*LADDER, "--share-tuning", "--workdir", tmp_path,
                                     "--dry-run"], capsys)
  assert code == 2 and "the sweep tunes nothing" in err, out + err
  code, out, err = sweep_in_process(
      ["--config", "configs/lm.py:tiny", "--tune", "optim.learning_rate=1e-3,3e-3",
       "--share-tuning", "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 2 and "--share-tuning: the sweep has no ladder" in err, out + err
  assert not list(tmp_path.iterdir())
