"""Sweeps: enumeration, validation, local execution, resumption, kill -9.

Every sweep here runs the training command on helpers.TINY-sized runs
(1 layer, d_model 32, 20 steps), in subprocesses sharing one persistent
compilation cache. One 2x2 sweep with 2 seeds (``grid``) serves most tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfx_jax.run import metrics
from tfx_jax.records import run_spec
from tfx_jax.records import status as status_lib
from tfx_jax.report import collect
from tfx_jax.sweep import cli
from tfx_jax.sweep import local
from tfx_jax.sweep import spec as spec_lib
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import SweepRecord
import fakes
from helpers import ROOT, TINY, subprocess_env, sweep_in_process

# ml_collections loads config files with the deprecated importlib load_module().
# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes")]

BASE_FLAGS = [f"--config.{k}={v}" for k, v in TINY.items()]
TINY_VOCAB = 1024  # configs/lm.py:tiny's data.vocab_size
GRID_AXES = ["--axis", "model.activation=relu,swiglu",
             "--axis", "model.norm_type=layernorm,rmsnorm"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  # The corpus and tokenizer are prepared once here, before parallel runs
  # would each try to build them.
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, TINY_VOCAB)
  return subprocess_env(tmp_path_factory.getbasetemp() / "sweep_jax_cache")


def sweep(args, env, timeout=600) -> subprocess.CompletedProcess:
  """``python -m tfx_jax.sweep ARGS`` from the repository root."""
  return subprocess.run([sys.executable, "-m", "tfx_jax.sweep", *map(str, args)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


in_process = sweep_in_process  # validation and dry runs start nothing


def final_scalars(workdir: pathlib.Path, tag: str) -> list[tuple[int, float]]:
  return metrics.read_scalars(workdir / "tensorboard")[tag]


# ---------------------------------------------------------------- declaring
def test_enumeration_products_zips_seeds_and_names():
  sweep_def = spec_lib.Sweep(
      name="x", config="configs/lm.py:tiny",
      axes=[{"model.activation": ["relu", "swiglu"]},
            {"model.d_model": [32, 64], "model.num_heads": [2, 4]},  # zipped
            [{}, {"optim.learning_rate": 0.01, "optim.warmup_steps": 0}]],
      seeds=[0, 3])
  axes, runs = spec_lib.expand(sweep_def, {"train.num_steps": 5})
  assert [a.label for a in axes] == ["model.activation", "model.d_model+model.num_heads",
                                     "optim.learning_rate+optim.warmup_steps"]
  assert len(runs) == 2 * 2 * 2 * 2
  names = [r.name for r in runs]
  assert len(set(names)) == len(names)
  # Seed-major: a sweep stopped half-way has every point with its first seed.
  assert names[:3] == [
      "activation-relu_d_model-32_num_heads-2_s0",
      "activation-relu_d_model-32_num_heads-2_learning_rate-0.01_warmup_steps-0_s0",
      "activation-relu_d_model-64_num_heads-4_s0"]
  assert names[8] == "activation-relu_d_model-32_num_heads-2_s3"
  last = runs[-1]
  assert last.overrides == {"train.num_steps": 5, "model.activation": "swiglu",
                            "model.d_model": 64, "model.num_heads": 4,
                            "optim.learning_rate": 0.01, "optim.warmup_steps": 0,
                            "seed": 3}
  # Names are a function of the values alone: stable across declarations.
  _, again = spec_lib.expand(sweep_def, {"train.num_steps": 5})
  assert [r.name for r in again] == names
  assert spec_lib.safe("tfx_gcc_translate/de x") == "tfx_gcc_translate_de_x"


def test_dry_run_lists_every_run_and_writes_nothing(tmp_path, capsys):
  file = tmp_path / "exp.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Sweep
      def get_sweep(variant="default"):
        seeds = [0] if variant == "tiny" else [0, 1, 2]
        return Sweep(name="exp_" + variant, config="configs/lm.py:tiny",
                     axes=[{"model.position": ["rope", "alibi"]},
                           {"model.num_layers": [1, 2], "model.d_model": [32, 64]}],
                     seeds=seeds, overrides={"train.num_steps": 70})
  """))
  code, out, _ = in_process([f"{file}:tiny", "--workdir", tmp_path / "runs", "--dry-run"],
                            capsys)
  assert code == 0
  assert "exp_tiny: 4 runs" in out
  assert "position-alibi_num_layers-2_d_model-64_s0" in out
  assert "--config.model.position=alibi --config.model.num_layers=2 " \
         "--config.model.d_model=64 --config.seed=0" in out
  code, out, _ = in_process([file, "--workdir", tmp_path / "runs", "--dry-run",
                             "--seeds", "4-5", "--config.train.num_steps=300"], capsys)
  assert code == 0 and "exp_default: 8 runs" in out and "_s5" in out
  assert "--config.train.num_steps=300" in out
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--axis", "model.activaton=relu,swiglu"],
     "axis model.activaton: 'model.activaton' is not a config field. Did you mean "
     "'model.activation'?"),
    (["--axis", "model.activation=relu,swiglu2"],
     "model.activation='swiglu2' is not a valid choice; choose one of: relu, gelu"),
    (["--axis", "model.d_model=32,big"], "model.d_model='big' is not a valid int"),
    (["--axis", "model.activation="], "axis model.activation has no values"),
    (["--axis", "model.dropout=0.1,0.10"], "same name 'dropout-0.1_s0'"),
    (["--axis", "model.num_heads=2,3"], "model.num_heads"),
    (["--axis", "model.activation=relu", "--config.train.nm_steps=3"],
     "'train.nm_steps' is not a config field. Did you mean 'train.num_steps'?"),
    (["--axis", "seed=1,2"], "declare seeds with seeds=[...]"),
])
def test_bad_sweeps_exit_2_and_write_nothing(tmp_path, capsys, args, message):
  code, _, err = in_process(["--config", "configs/lm.py:tiny", "--name", "bad",
                             "--workdir", tmp_path / "runs", *args], capsys)
  assert code == 2
  assert message in err
  assert not (tmp_path / "runs").exists()


def test_a_sweep_for_an_8_device_node_is_declared_on_one_cpu(tmp_path, capsys):
  """Run semantics are checked without devices: the mesh meets them at the run."""
  code, out, err = in_process(["--config", "configs/lm.py:tiny", "--axis",
                               "model.activation=relu,swiglu", "--config.mesh.fsdp=8",
                               "--dry-run", "--name", "meshcheck",
                               "--workdir", tmp_path / "runs"], capsys)
  assert code == 0, err
  assert "meshcheck: 2 runs" in out and "activation-swiglu_s0" in out


@pytest.mark.parametrize("args, message, axis", [
    (["--config.train.batch_size=0"], "the base config configs/lm.py:tiny with the "
     "sweep's overrides (every run has it): train.batch_size=0 is not valid", False),
    (["--config.mesh.data=2", "--axis", "train.batch_size=8,7"],
     "axis train.batch_size (run batch_size-7_s0): train.batch_size=7 is not valid", True),
])
def test_a_sweep_error_names_the_field_and_the_axis_only_when_it_is_the_cause(
    tmp_path, capsys, args, message, axis):
  code, _, err = in_process(["--config", "configs/lm.py:tiny", "--name", "bad",
                             "--workdir", tmp_path / "runs",
                             *(args if axis else [*args, "--axis", "model.activation=relu,gelu"])],
                            capsys)
  assert code == 2 and message in err
  assert ("axis" in err) == axis
  assert not (tmp_path / "runs").exists()


def test_bad_zip_and_sweep_file(tmp_path, capsys):
  file = tmp_path / "zip.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Sweep
      def get_sweep(variant="default"):
        return Sweep(name="z", config="configs/lm.py:tiny",
                     axes=[{"model.d_model": [32, 64], "model.num_heads": [2]}])
  """))
  code, _, err = in_process([file, "--workdir", tmp_path / "runs"], capsys)
  assert code == 2 and "zipped fields need lists of one length" in err
  code, _, err = in_process([tmp_path / "missing.py", "--workdir", tmp_path / "runs"],
                            capsys)
  assert code == 2 and "does not exist" in err
  assert not (tmp_path / "runs").exists()


def test_an_evaluation_runs_only_where_its_condition_holds(tmp_path, capsys):
  """``Evaluation(args, when=...)``: the RoPE run gets the scaled evaluation,
  the others only the plain one; locally, in SLURM scripts and in sweep.json."""
  from tfx_jax.sweep import slurm  # pylint: disable=import-outside-toplevel
  file = tmp_path / "pos.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Evaluation, Sweep
      def get_sweep(variant="default"):
        when = {"model.position": "rope"} if variant == "default" else {"model.norm_type": "rmsnorm"}
        return Sweep(name="pos", config="configs/lm.py:tiny",
                     axes=[{"model.position": ["rope", "alibi"]}],
                     evaluations=[["--lengths", "1x,2x"],
                                  Evaluation(["--lengths", "1x,2x", "--rope_scaling", "yarn",
                                              "--rope_scaling_factor", "2"], when=when)])
  """))
  code, out, _ = in_process([file, "--workdir", tmp_path / "runs", "--dry-run"], capsys)
  assert code == 0
  rope, alibi = out.split("\n  position-alibi_s0")
  assert rope.count("then: python -m tfx_jax.evaluate") == 2 and "--rope_scaling yarn" in rope
  assert alibi.count("then: python -m tfx_jax.evaluate") == 1 and "rope_scaling" not in alibi
  sweep = cli.declared_sweep(cli._parser().parse_args([str(file)]), {})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "cmd", None)
  assert [len(r.evaluations) for r in record.runs] == [2, 1]
  assert record.evaluations[1].when == {"model.position": "rope"}
  # A sweep.json entry without its own list (older sweeps) falls back to the record's.
  older = record.to_json()
  del older["runs"][1]["evaluations"]
  assert [list(e) for e in SweepRecord.from_json(older).runs[1].evaluations] == [
      ["--lengths", "1x,2x"]]
  # The training command runs the evaluations its spec names, or, with
  # --separate-evaluations, an evaluation command each follows it.
  rope_spec, alibi_spec = (run_spec.of_entry(record, e) for e in record.runs)
  assert len(rope_spec.evaluations) == 2 and len(alibi_spec.evaluations) == 1
  assert "yarn" in rope_spec.evaluations[1]
  script = slurm.render_script(tmp_path / "runs" / "pos", record, record.runs, "python",
                               tmp_path)
  rope_task, alibi_task = script.split("# position-alibi_s0")
  assert f"--spec {tmp_path / 'runs' / 'pos' / 'position-rope_s0' / 'run_spec.json'}" in rope_task
  assert "tfx_jax.evaluate" not in script and "--config" not in script
  assert not any(run_spec.of_entry(record, e, in_process=False).evaluations
                 for e in record.runs)
  script = slurm.render_script(tmp_path / "runs" / "pos", record, record.runs, "python",
                               tmp_path, separate_evaluations=True)
  rope_task, alibi_task = script.split("# position-alibi_s0")
  assert "sweep-1.done" in rope_task and "sweep-1.done" not in alibi_task
  assert "--rope_scaling yarn" in rope_task and "--rope_scaling" not in alibi_task
  # A condition on a field no axis, tuned field or override sets is refused.
  code, _, err = in_process([f"{file}:other", "--workdir", tmp_path / "runs"], capsys)
  assert code == 2 and "when model.norm_type: no axis, tuned field or override" in err
  assert "'model.position'" in err and not (tmp_path / "runs").exists()


ACTIVATIONS = {"model.activation": ["relu", "gelu", "swiglu"]}
RELU, GELU, SWIGLU = ({"model.activation": a} for a in ACTIVATIONS["model.activation"])


def test_declared_comparisons_are_recorded_as_index_pairs_of_their_axis(tmp_path, capsys):
  """``Sweep.comparisons``: each pair becomes (value, base) indices of its axis
  in sweep.json, typed as the axis values are (a string from a file matches
  an int axis value); a pair against the axis's base value, known once the
  base config is read, exits 2 with nothing written."""
  file = tmp_path / "pairs.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Sweep
      def get_sweep(variant="default"):
        pair = ({"model.num_layers": "3"}, {"model.num_layers": 1})
        if variant == "base":  # configs/lm.py:tiny has 2 layers: the base value
          pair = ({"model.num_layers": 3}, {"model.num_layers": 2})
        return Sweep(name="pairs", config="configs/lm.py:tiny",
                     axes=[{"model.activation": ["relu", "swiglu"]},
                           {"model.num_layers": [2, 1, 3]}], comparisons=[pair])
  """))
  sweep = cli.declared_sweep(cli._parser().parse_args([str(file)]), {})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "cmd", None)
  assert [a.comparisons for a in record.axes] == [(), ((2, 1),)]
  assert SweepRecord.from_json(record.to_json()) == record
  data = record.to_json()
  assert data["axes"][1]["comparisons"] == [[2, 1]]
  del data["axes"][1]["comparisons"]  # a sweep.json from before declared pairs
  assert SweepRecord.from_json(data).axes[1].comparisons == ()
  code, _, err = in_process([f"{file}:base", "--workdir", tmp_path / "runs", "--dry-run"],
                            capsys)
  assert code == 2 and not (tmp_path / "runs").exists()
  assert ("comparison {model.num_layers=3} vs {model.num_layers=2}: the report compares "
          "every value of axis model.num_layers with its base value "
          "{model.num_layers=2} already") in err


@pytest.mark.parametrize("comparisons, message", [
    ([(SWIGLU, {"model.activation": "silu"})],
     "{model.activation=silu} is not a value of any axis; each side is written as its "
     "axis lists it (axis model.activation: {model.activation=relu}, "
     "{model.activation=gelu}, {model.activation=swiglu}; axis model.position: "),
    ([(SWIGLU, {"model.position": "alibi"})],
     "{model.activation=swiglu} is a value of axis model.activation, "
     "{model.position=alibi} of axis model.position; a pair compares two values of one "
     "axis"),
    ([(SWIGLU, SWIGLU)], "compares a value with itself"),
    ([(SWIGLU, GELU), (GELU, SWIGLU)],
     "comparison {model.activation=gelu} vs {model.activation=swiglu}: repeats the "
     "comparison {model.activation=swiglu} vs {model.activation=gelu} declared before"),
    ([(SWIGLU, GELU), (SWIGLU, GELU)], "repeats the comparison"),
    ([SWIGLU], "each is a pair (a, b) of values of one axis"),
])
def test_a_bad_declared_comparison_is_refused_naming_the_problem(comparisons, message):
  sweep = spec_lib.Sweep(name="pairs", config="configs/lm.py:tiny",
                         axes=[ACTIVATIONS, {"model.position": ["rope", "alibi"]}],
                         comparisons=comparisons)
  with pytest.raises(spec_lib.ConfigError, match=re.escape(message)):
    spec_lib.expand(sweep)
  axes = [spec_lib.normalize_axis(a) for a in sweep.axes]
  assert spec_lib.comparison_pairs([(SWIGLU, GELU)], axes, [0, 0]) == [(0, 2, 1)]
  with pytest.raises(spec_lib.ConfigError, match="with its base value"):
    spec_lib.comparison_pairs([(RELU, SWIGLU)], axes, [0, 0])  # either way round


def test_sweep_json_is_the_record_serialised_and_reads_back(tmp_path):
  """A record with every part (tuned runs, conditional evaluations, added
  seeds, SLURM jobs, margins) reads back from its JSON as it was, override
  values in their own types."""
  from tfx_jax.records import sweep as sweep_record  # pylint: disable=import-outside-toplevel
  sweep = cli.declared_sweep(cli._parser().parse_args(
      ["--config", "configs/lm.py:tiny", "--axis", "model.activation=relu,swiglu",
       "--tune", "optim.learning_rate=1e-3,3e-3", "--seeds", "0,1"]),
      {"train.num_steps": "30", "model.use_bias": "false"})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "cmd", None,
                            sweep_record.ReportOptions(stall_margin=0.1))
  record.added.append(sweep_record.AddedRun("x_s2", 2, record.runs[0].name))
  record.slurm_jobs.append(sweep_record.SlurmJob("17", "now", "--time=1:00:00",
                                                 ("a_s0", "b_s0")))
  record.runs[0].observe(sweep_record.RunProgress("finished", 30, "", 1.5))
  sweep_record.write(tmp_path, record)
  again = sweep_record.read(tmp_path)
  assert dataclasses.replace(again, updated="") == record
  overrides = again.runs[-1].overrides
  assert overrides["optim.learning_rate"] == 3e-3 and isinstance(
      overrides["optim.learning_rate"], float)
  assert overrides["train.num_steps"] == 30 and overrides["model.use_bias"] is False
  # The keys a reader of sweep.json (docs/sweeps.md, a script) knows.
  data = json.loads((tmp_path / "sweep.json").read_text())
  assert {"name", "config", "overrides", "seeds", "axes", "runs", "command", "tune",
          "select_by", "report_split", "report_options", "slurm_jobs", "added"} <= set(data)
  assert {"name", "seed", "values", "tuned", "overrides", "state", "step", "reason",
          "attempts", "wall_seconds", "compile_seconds"} <= set(data["runs"][0])


def test_a_run_s_spec_holds_its_typed_values_and_the_report_reads_them(tmp_path):
  """Each run's spec (run_spec.json) is its validated entry: the config file,
  the overrides in their own types, the seed, the evaluations, the compared
  fields; it reads back as it was. The report reads the values a run trained
  with from its spec, and from sweep.json where a run has none (started
  before specs were written, or not started)."""
  sweep = cli.declared_sweep(cli._parser().parse_args(
      ["--config", "configs/lm.py:tiny", "--axis", "model.activation=relu,swiglu",
       "--tune", "optim.learning_rate=1e-3,3e-3"]), {"train.num_steps": "30"})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "cmd", None)
  entry = record.runs[-1]
  spec = state_lib.write_spec(tmp_path, record, entry)
  assert spec == run_spec.RunSpec(
      config="configs/lm.py:tiny", seed=0, sweep=record.name, name=entry.name,
      overrides={"train.num_steps": 30, "model.activation": "swiglu",
                 "optim.learning_rate": 3e-3},
      axis_fields=("model.activation",), tuned_fields=("optim.learning_rate",),
      evaluations=entry.evaluations)  # a tuned sweep's test split: ("--split", "test")
  assert spec.evaluations == (("--split", "test"),)
  assert spec.config_overrides == entry.overrides and spec.tuned == entry.tuned
  assert isinstance(spec.tuned["optim.learning_rate"], float)
  assert spec.compared_fields == ("model.activation", "optim.learning_rate", "seed")
  again = run_spec.read(tmp_path / entry.name)
  assert again == spec and isinstance(again.axis_fields, tuple)
  assert run_spec.read(tmp_path / record.runs[0].name) is None
  with pytest.raises(ValueError, match="version"):
    run_spec.RunSpec.from_json({**spec.to_json(), "version": 2})
  with pytest.raises(ValueError, match="seed is its own field"):
    run_spec.RunSpec(config="c", overrides={"seed": 1}, seed=1)
  # sweep.json holds the latest invocation's overrides (60 steps); the run
  # that trained from its spec (30) reports its own, the others sweep.json's.
  later = dataclasses.replace(record, runs=[dataclasses.replace(
      e, overrides={**e.overrides, "train.num_steps": 60}) for e in record.runs])
  trained = collect.as_trained(tmp_path, later)
  steps = {e.name: e.overrides["train.num_steps"] for e in trained.runs}
  assert steps == {**{e.name: 60 for e in record.runs}, entry.name: 30}
  assert trained.runs[-1].tuned == {"optim.learning_rate": 3e-3}


OPTIMIZER_AXIS = {"optim.optimizer": ["adamw", "adam", "adafactor"]}
# Per-point grids: each optimizer its own learning rates, adamw alone a weight decay.
PER_POINT_TUNE = {
    "optim.learning_rate": [{"values": [1e-3, 3e-3], "when": {"optim.optimizer": "adam"}},
                            {"values": [1e-2], "when": {"optim.optimizer": "adafactor"}}],
    "optim.weight_decay": {"values": [0.0, 0.1], "when": {"optim.optimizer": "adamw"}}}


def test_a_tuned_grid_may_be_each_points_own():
  """Each point runs the product of the grids its axis values match; a point
  no grid of a field matches is not tuned on it; names carry what is tuned."""
  sweep = spec_lib.Sweep(name="opt", config="configs/lm.py:tiny", axes=[OPTIMIZER_AXIS],
                         tune=PER_POINT_TUNE, seeds=[0, 1])
  _, runs = spec_lib.expand(sweep)
  by_point = {}
  for run in runs:
    if run.seed == 0:
      by_point.setdefault(run.values[0]["optim.optimizer"], []).append(run.tuned)
  assert by_point == {
      "adamw": [{"optim.weight_decay": 0.0}, {"optim.weight_decay": 0.1}],
      "adam": [{"optim.learning_rate": 1e-3}, {"optim.learning_rate": 3e-3}],
      "adafactor": [{"optim.learning_rate": 1e-2}]}
  assert len(runs) == 2 * 5
  assert runs[0].name == "optimizer-adamw_weight_decay-0.0_s0"
  assert "optim.learning_rate" not in runs[0].overrides  # adamw keeps the base rate
  # A plain list is one grid for every point, as before.
  plain = dataclasses.replace(sweep, tune={"optim.learning_rate": [1e-3, 3e-3]})
  assert len(spec_lib.expand(plain)[1]) == 3 * 2 * 2


@pytest.mark.parametrize("tune, message", [
    ({"optim.learning_rate": {"values": [1e-3], "when": {"optim.optimizer": "lion"}}},
     "when optim.optimizer=lion: not a value of its axis; choose from ['adamw', 'adam', "
     "'adafactor']"),
    ({"optim.learning_rate": {"values": [1e-3], "when": {"model.d_model": 64}}},
     "when model.d_model: no axis sets model.d_model; a grid's condition names an axis "
     "field: ['optim.optimizer']"),
    ({"optim.learning_rate": [[1e-3], {"values": [1e-2], "when": {}}]},
     "give either a list of values or a list of conditional grids"),
    ({"optim.learning_rate": [{"values": [1e-3]},
                              {"values": [1e-2], "when": {"optim.optimizer": "adam"}}]},
     "2 grids apply to the point {'optim.optimizer': 'adam'}"),
    ({"optim.learning_rate": {"value": [1e-3]}}, "got keys ['value']"),
    ({"optim.learning_rate": {"values": [], "when": {"optim.optimizer": "adam"}}},
     "values must be a non-empty list"),
])
def test_a_bad_per_point_grid_is_refused_naming_the_choices(tune, message):
  sweep = spec_lib.Sweep(name="opt", config="configs/lm.py:tiny", axes=[OPTIMIZER_AXIS],
                         tune=tune)
  with pytest.raises(spec_lib.ConfigError, match=re.escape(message)):
    spec_lib.expand(sweep)


def test_tune_flags_with_conditions(tmp_path, capsys):
  """``--tune PATH=V1,V2@AXIS_FIELD=VALUE``: a grid per flag; the record keeps
  the grids (typed values) and reads them back; bad forms exit 2."""
  from tfx_jax.records import sweep as sweep_record  # pylint: disable=import-outside-toplevel
  assert spec_lib.parse_tune_flags(
      ["optim.learning_rate=1e-3,3e-3@optim.optimizer=adamw",
       "optim.learning_rate=1e-2@optim.optimizer=adafactor@model.d_model=64",
       "optim.weight_decay=0.0,0.1"]) == {
      "optim.learning_rate": [
          {"values": ["1e-3", "3e-3"], "when": {"optim.optimizer": "adamw"}},
          {"values": ["1e-2"], "when": {"optim.optimizer": "adafactor",
                                        "model.d_model": "64"}}],
      "optim.weight_decay": ["0.0", "0.1"]}
  flags = ["--config", "configs/lm.py:tiny", "--axis", "optim.optimizer=adamw,adam,adafactor",
           "--tune", "optim.learning_rate=1e-3,3e-3@optim.optimizer=adam",
           "--tune", "optim.learning_rate=1e-2@optim.optimizer=adafactor",
           "--tune", "optim.weight_decay=0.0,0.1@optim.optimizer=adamw",
           "--name", "opt", "--workdir", tmp_path / "runs"]
  code, out, err = in_process([*flags, "--dry-run"], capsys)
  assert code == 0, err
  assert "opt: 5 runs (3 points, 5 with their own tuned values, x 1 seeds)" in out
  assert "optimizer-adafactor_learning_rate-0.01_s0" in out
  sweep = cli.declared_sweep(cli._parser().parse_args([str(f) for f in flags]), {})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "cmd", None)
  assert record.grid(record.runs[0]) == {"optim.weight_decay": (0.0, 0.1)}
  assert record.point_grid((1,)) == {"optim.learning_rate": (1e-3, 3e-3)}
  sweep_record.write(tmp_path, record)
  assert sweep_record.read(tmp_path).tune == record.tune
  assert json.loads((tmp_path / "sweep.json").read_text())["tune"]["optim.weight_decay"] == [
      {"values": [0.0, 0.1], "when": {"optim.optimizer": "adamw"}}]
  for bad, message in (("optim.learning_rate=1e-3@optim.optimizer", "is AXIS_FIELD=VALUE"),
                       ("optim.learning_rate=1e-3@optim.optimizer=adam,adamw", "one value"),
                       ("optim.learning_rate=1e-3@optim.optimizer=sgd",
                        "not a value of its axis")):
    code, _, err = in_process([*flags[:4], "--tune", bad, "--workdir", tmp_path / "bad"],
                              capsys)
    assert code == 2 and message in err, err
  assert not (tmp_path / "bad").exists()


def test_a_sweep_written_by_an_earlier_version_resumes_and_reports(tmp_path, capsys):
  """sweep.json as the first sweeps wrote it (no tuning, no per-run
  evaluations, no added seeds or margins): the same command reads it, keeps
  its runs' attempts and times, finds them finished and writes the report."""
  names = ["activation-relu_s0", "activation-swiglu_s0"]
  sweep_dir = tmp_path / "runs" / "old"
  for name, loss in zip(names, (5.0, 4.5)):
    fakes.write_run(sweep_dir / name, {20: {"eval/loss": loss, "train/loss": loss}}, step=20)
  old = {
      "name": "old", "description": "", "config": "configs/lm.py:tiny", "overrides": {},
      "seeds": [0], "evaluations": [],
      "axes": [{"label": "model.activation", "fields": ["model.activation"],
                "values": [{"model.activation": "relu"}, {"model.activation": "swiglu"}],
                "reference": 0}],
      "base_values": {"model.activation": "relu"}, "command": "python -m tfx_jax.sweep ...",
      "cwd": str(ROOT), "created": "2025-01-31T12:00:00+00:00", "slurm_jobs": [],
      "runs": [{"name": name, "seed": 0, "values": [{"model.activation": act}],
                "overrides": {"model.activation": act, "seed": 0}, "state": "running",
                "step": 10, "reason": "", "attempts": 1, "wall_seconds": 12.5,
                "compile_seconds": 2.0}
               for name, act in zip(names, ("relu", "swiglu"))],
      "updated": "2025-01-31T12:05:00+00:00"}
  (sweep_dir / "sweep.json").write_text(json.dumps(old))
  code, out, err = in_process(["--config", "configs/lm.py:tiny", "--axis",
                               "model.activation=relu,swiglu", "--name", "old",
                               "--workdir", tmp_path / "runs"], capsys)
  assert code == 0, out + err
  assert "nothing to run" in out and "2 finished" in out
  record = json.loads((sweep_dir / "sweep.json").read_text())
  assert record["created"] == old["created"]
  assert [(r["state"], r["attempts"], r["wall_seconds"]) for r in record["runs"]] == [
      ("finished", 1, 12.5)] * 2
  assert record["report_split"] == "validation" and record["tune"] == {}
  report = json.loads((sweep_dir / "report.json").read_text())
  assert [p["values"] for p in report["points"]] == [{"model.activation": "relu"},
                                                     {"model.activation": "swiglu"}]
  assert "| swiglu | 1 | 1 | 0 | 0 | 4.5000 |" in (sweep_dir / "report.md").read_text()


# ------------------------------------------------------------- running it
def test_each_run_gets_its_share_of_cores_gpus_and_the_shared_cache():
  assert local.core_slots(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
  assert local.core_slots(3, [0, 1]) == [[0], [1], [0]]
  env = local.child_env(pathlib.Path("runs/x"), [2, 3], "1", {"XLA_FLAGS": "--foo=1"},
                        sharing=2)
  assert env["XLA_FLAGS"].startswith("--foo=1 --xla_cpu_multi_thread_eigen=false")
  assert "intra_op_parallelism_threads=2" in env["XLA_FLAGS"]
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(pathlib.Path("runs/x/.jax_cache").resolve())
  assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
  assert env["CUDA_VISIBLE_DEVICES"] == "1"
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.45"
  # A cache the user chose is kept.
  assert local.child_env(pathlib.Path("x"), [0], None, {"JAX_COMPILATION_CACHE_DIR": "/c"})[
      "JAX_COMPILATION_CACHE_DIR"] == "/c"


@pytest.fixture(scope="module")
def grid(tmp_path_factory, env):
  """A 2x2 sweep with 2 seeds, run once: (sweep dir, completed process, args)."""
  root = tmp_path_factory.mktemp("sweeps")
  args = ["--config", "configs/lm.py:tiny", *GRID_AXES, "--seeds", "0,1",
          "--name", "grid", "--workdir", root, "--parallel", "2", *BASE_FLAGS]
  proc = sweep(args, env)
  return root / "grid", proc, args


@pytest.mark.slow
def test_grid_runs_every_point_and_writes_the_report(grid):
  sweep_dir, proc, _ = grid
  assert proc.returncode == 0, proc.stdout + proc.stderr
  record = json.loads((sweep_dir / "sweep.json").read_text())
  assert len(record["runs"]) == 8
  assert {r["state"] for r in record["runs"]} == {"finished"}
  assert "8 finished" in proc.stdout
  for entry in record["runs"]:
    workdir = sweep_dir / entry["name"]
    assert status_lib.read_status(workdir).state == "finished"
    config = json.loads((workdir / "config.json").read_text())
    values = {k: v for value in entry["values"] for k, v in value.items()}
    assert config["model"]["activation"] == values["model.activation"]
    assert config["model"]["norm_type"] == values["model.norm_type"]
    assert config["seed"] == entry["seed"]
    assert config["train"]["num_steps"] == TINY["train.num_steps"]
    assert [s for s, _ in final_scalars(workdir, "eval/loss")] == [0, 10, 20]
    assert f"start  {entry['name']}" in proc.stdout
    seconds = status_lib.read_status(workdir).seconds
    assert seconds["train_steps"] > 0 and seconds["startup"] > 0
  if len(os.sched_getaffinity(0)) >= 2:  # one core each
    assert "(core 0;" in proc.stdout and "(core 1;" in proc.stdout
  # Where the time went, summed over the runs (their status.json), beside
  # their wall time as the sweep measured it.
  assert "time in the runs, summed over 8 run(s): startup " in proc.stdout
  assert re.search(r"wall [\d.]+s, of which train steps \d+%", proc.stdout)
  report = (sweep_dir / "report.md").read_text()
  data = json.loads((sweep_dir / "report.json").read_text())
  assert data["compute"]["total"]["runs"] == 8 and "## Compute" in report
  # report.json keeps core seconds to the millisecond; the float sum of the
  # runs' wall seconds can carry a rounding tail (58.400000000000006).
  assert data["compute"]["total"]["core_seconds"] >= round(
      sum(r["wall_seconds"] for r in record["runs"]), 3)
  relu = next(p for p in data["points"]
              if p["values"] == {"model.activation": "relu", "model.norm_type": "layernorm"})
  assert relu["runs"] == 2 and relu["counts"]["diverged"] == 0
  # 20 steps of a 32-wide model: learned or stalled near the unigram entropy,
  # judged against the prepared data's baseline.
  assert relu["counts"]["learned"] + relu["counts"]["stalled"] == 2
  assert data["baselines"][entry["name"]]["unigram_entropy"] > 4.0
  assert "| relu | layernorm | 2 |" in report and "## Verdicts" in report
  assert record["command"] in report
  rows = (sweep_dir / "report.csv").read_text().splitlines()
  assert len(rows) == 1 + 8
  assert (sweep_dir / "curves_model.activation.png").stat().st_size > 1000


@pytest.mark.slow
def test_grid_runs_show_their_hyperparameters_in_tensorboard(grid):
  sweep_dir, _, _ = grid
  hparams, metric_names = metrics.read_hparams(
      sweep_dir / "activation-swiglu_norm_type-rmsnorm_s1" / "tensorboard")
  assert hparams["model.activation"] == "swiglu"
  assert hparams["model.norm_type"] == "rmsnorm"
  assert hparams["seed"] == 1.0
  assert "eval/loss" in metric_names
  # The sweep's axes and the seed are the first of the ~100 columns.
  columns = metrics.read_hparam_columns(
      sweep_dir / "activation-swiglu_norm_type-rmsnorm_s1" / "tensorboard")
  assert columns[:3] == [("model.activation", True), ("model.norm_type", True),
                         ("seed", True)]
  assert len(columns) > 50 and not any(differs for _, differs in columns[3:])


@pytest.mark.slow
def test_rerun_is_a_no_op_and_status_reads_the_workdirs(grid, env):
  sweep_dir, _, args = grid
  before = {p: p.stat().st_mtime_ns for p in sweep_dir.rglob("*")
            if p.is_file() and ".sweep." not in p.name and p.suffix not in (".md", ".csv",
                                                                            ".png", ".json")}
  proc = sweep(args, env)
  assert proc.returncode == 0, proc.stderr
  assert "nothing to run" in proc.stdout
  after = {p: p.stat().st_mtime_ns for p in before}
  assert after == before
  status = sweep([*args, "--status"], env)
  assert status.returncode == 0
  assert status.stdout.count(" finished ") == 8
  assert "8 finished" in status.stdout


@pytest.mark.slow
def test_kill_9_of_the_sweep_then_rerun_runs_each_point_once(grid, env, tmp_path):
  """The killed sweep's children checkpoint (SIGTERM from the kernel) and the
  rerun resumes them: the metrics are those of the uninterrupted grid."""
  grid_dir, _, _ = grid
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.activation=relu,swiglu",
          "--seeds", "0", "--name", "killed", "--workdir", tmp_path, "--parallel", "2",
          *BASE_FLAGS]
  sweep_dir = tmp_path / "killed"
  names = ["activation-relu_s0", "activation-swiglu_s0"]
  proc = subprocess.Popen([sys.executable, "-m", "tfx_jax.sweep", *map(str, args)],
                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  # Kill once a run is inside its training loop (it has logged step 1).
  deadline = time.time() + 300
  while time.time() < deadline:
    logs = [sweep_dir / n / "sweep.log" for n in names]
    if any(p.exists() and re.search(r"step +\d+/20", p.read_text()) for p in logs):
      break
    assert proc.poll() is None, "the sweep ended before it could be killed"
    time.sleep(0.005)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  # Rerun at once: runs whose children are still saving are locked; it waits.
  rerun = sweep(args, env)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  record = json.loads((sweep_dir / "sweep.json").read_text())
  assert [r["state"] for r in record["runs"]] == ["finished", "finished"]
  interrupted = 0
  for name, activation in zip(names, ["relu", "swiglu"]):
    log = (sweep_dir / name / "sweep.log").read_text()
    assert log.count("Finished at step 20") == 1, log
    interrupted += "received SIGTERM" in log
    reference = grid_dir / f"activation-{activation}_norm_type-layernorm_s0"
    for tag in ("train/loss", "eval/loss"):
      assert final_scalars(sweep_dir / name, tag) == final_scalars(reference, tag)
  assert interrupted >= 1, "the kill landed after every run had finished"


@pytest.mark.slow
def test_a_run_started_before_specs_resumes_from_its_spec_bitwise(tmp_path, env):
  """A sweep directory whose run was started as sweeps started runs before
  run_spec.json (the training command with override flags) and stopped at
  step 10: the same sweep command writes the run's spec and resumes it from
  its checkpoint, and the steps after 10 are those the flags trained, bitwise."""
  sweep_dir = tmp_path / "runs" / "old"
  workdir = sweep_dir / "activation-swiglu_s0"
  overrides = {**TINY, "model.activation": "swiglu", "seed": 0}
  flags = [sys.executable, "-m", "tfx_jax.train", "--config", "configs/lm.py:tiny",
           "--workdir", str(workdir),
           *[f"--config.{k}={spec_lib.format_value(v)}" for k, v in overrides.items()]]
  # Trained as the sweep trains its runs, with its XLA thread flags: Eigen's
  # threading changes a matmul's summation order on some CPUs.
  run_env = local.child_env(sweep_dir, local.core_slots(1)[0], None, env)
  proc = subprocess.run(flags, cwd=ROOT, env=run_env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  straight = {tag: final_scalars(workdir, tag) for tag in ("train/loss", "eval/loss")}
  shutil.rmtree(workdir / "checkpoints" / "20")
  status_lib.write_status(workdir, "preempted", 10, reason="received SIGTERM")
  (sweep_dir / "sweep.json").write_text(json.dumps({
      "name": "old", "config": "configs/lm.py:tiny", "seeds": [0],
      "axes": [{"label": "model.activation", "values": [{"model.activation": "swiglu"}]}],
      "runs": [{"name": workdir.name, "seed": 0, "values": [{"model.activation": "swiglu"}],
                "overrides": overrides, "state": "running", "step": 10}]}))
  assert not (workdir / run_spec.FILENAME).exists()
  proc = sweep(["--config", "configs/lm.py:tiny", "--axis", "model.activation=swiglu",
                "--name", "old", "--workdir", tmp_path / "runs", *BASE_FLAGS], env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "Resumed from step 10" in (workdir / "sweep.log").read_text()
  assert run_spec.read(workdir).config_overrides == overrides
  assert {tag: final_scalars(workdir, tag) for tag in straight} == straight
  assert (sweep_dir / "report.md").exists()


@pytest.mark.slow
def test_diverged_and_failed_points_while_the_others_finish(tmp_path, env):
  """lr 1e30 diverges (a result: exit 0 unless a run failed); a
  run that cannot start fails with its reason; the rest finish and get their
  extra evaluation. (ReLU: the base point's program is the grid's, cached.)"""
  file = tmp_path / "unstable.py"
  file.write_text(textwrap.dedent(f"""
      from tfx_jax.sweep import Sweep
      def get_sweep(variant="default"):
        return Sweep(
            name="unstable", config="configs/lm.py:tiny",
            overrides={{**{dict(TINY)!r}, "model.activation": "relu",
                       "train.on_nonfinite": "stop"}},
            axes=[[{{}}, {{"optim.learning_rate": 1e30}},
                   {{"data.name": "no_such_dataset"}}]],
            evaluations=[["--max_batches", "1"]])
  """))
  args = [file, "--workdir", tmp_path / "runs", "--parallel", "2"]
  proc = sweep(args, env)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  sweep_dir = tmp_path / "runs" / "unstable"
  record = json.loads((sweep_dir / "sweep.json").read_text())
  states = {r["name"]: (r["state"], r["reason"]) for r in record["runs"]}
  assert states["base_s0"] == ("finished", "")
  assert states["learning_rate-1e+30_s0"][0] == "diverged"
  assert "non-finite" in states["learning_rate-1e+30_s0"][1]
  assert states["name-no_such_dataset_s0"][0] == "failed"
  assert "is neither an embedded dataset" in states["name-no_such_dataset_s0"][1]
  assert (sweep_dir / "base_s0" / "eval" / "sweep-0.done").exists()
  assert list((sweep_dir / "base_s0" / "eval").glob("validation-20.json"))
  assert not (sweep_dir / "learning_rate-1e+30_s0" / "eval").exists()
  report = (sweep_dir / "report.md").read_text()
  # The axis sets two fields: each value names its own. Runs, learned, stalled, diverged:
  assert "| learning_rate=1e+30 | 1 | 0 | 0 | 1 |" in report
  # Failures are verdicts (the base, 20 steps, is still at the unigram loss);
  # a point whose run never started is not one.
  assert ("- learning_rate=1e+30 vs base: both failed: learning_rate=1e+30 never learned "
          "(1 diverged of 1 runs); base never learned (1 stalled of 1 runs)") in report
  assert "no_such_dataset vs" not in report
  # Failed runs are left alone unless --retry-failed.
  again = sweep(args, env)
  assert again.returncode == 1 and "leaving 1 failed run(s) alone" in again.stdout
  assert "  start  " not in again.stdout  # no run started (the summary names "startup")
  retried = sweep([*args, "--retry-failed"], env)
  assert retried.returncode == 1
  assert "start  name-no_such_dataset_s0" in retried.stdout
  assert "start  base_s0" not in retried.stdout


def test_a_run_s_evaluations_run_in_its_training_command_unless_separate(tmp_path):
  """By default one command a run: training, then its evaluations in the same
  process (``--evaluate``); ``--separate-evaluations``: the training command,
  then one ``python -m tfx_jax.evaluate`` each."""
  record = SweepRecord.from_json({
      "name": "s", "config": "configs/lm.py:tiny", "seeds": [0], "axes": [],
      "runs": [{"name": "r", "seed": 0, "values": [], "overrides": {"seed": 0},
                "evaluations": [["--split", "test"], ["--lengths", "1x,2x"]]}]})
  entry = record.runs[0]
  [command] = local.LocalExecutor(tmp_path, record, 1, {})._commands(entry)
  assert command[1:] == ["-m", "tfx_jax.train", "--spec", str(tmp_path / "r" / "run_spec.json"),
                         "--workdir", str(tmp_path / "r")]
  spec = state_lib.write_spec(tmp_path, record, entry)
  assert run_spec.read(tmp_path / "r") == spec
  assert spec.evaluations == (("--split", "test"), ("--lengths", "1x,2x"))
  train, *evals = local.LocalExecutor(tmp_path, record, 1, {},
                                      separate_evaluations=True)._commands(entry)
  assert train == command
  assert state_lib.write_spec(tmp_path, record, entry, in_process=False).evaluations == ()
  assert [e[1:5] for e in evals] == [["-m", "tfx_jax.evaluate", "--workdir",
                                      str(tmp_path / "r")]] * 2
  assert [e[5:] for e in evals] == [["--split", "test"], ["--lengths", "1x,2x"]]


def test_a_slurm_submission_writes_each_task_s_spec(tmp_path, monkeypatch):
  """The sbatch script's tasks run the same training command as the local
  executor; each run's spec is written when the array is submitted."""
  from tfx_jax.sweep import slurm  # pylint: disable=import-outside-toplevel
  record = SweepRecord.from_json({
      "name": "s", "config": "configs/lm.py:tiny", "seeds": [0, 1], "axes": [],
      "runs": [{"name": f"r_s{seed}", "seed": seed, "values": [],
                "overrides": {"optim.learning_rate": 3e-3, "seed": seed},
                "evaluations": [["--split", "test"]]} for seed in (0, 1)]})
  monkeypatch.setattr(slurm, "submit", lambda script, args, env: "17")
  job, script = slurm.submit_sweep(tmp_path, record, record.runs[1:], "python", "", tmp_path,
                                   separate_evaluations=True)
  assert job == "17" and record.slurm_jobs[-1].runs == ("r_s1",)
  assert shlex.join(state_lib.train_command(tmp_path / "r_s1", "python")) in script.read_text()
  spec = run_spec.read(tmp_path / "r_s1")
  assert spec.config_overrides == {"optim.learning_rate": 3e-3, "seed": 1}
  assert spec.evaluations == ()  # its evaluation command follows it in the script
  assert run_spec.read(tmp_path / "r_s0") is None  # not submitted


def test_the_first_run_of_every_point_starts_before_the_second_of_any():
  """Runs of one point share their compiled programs (seeds and tuned values
  are traced), so parallel runs start on different points first."""
  axis = {"label": "model.activation", "fields": ["model.activation"],
          "values": [{"model.activation": "relu"}, {"model.activation": "swiglu"}]}
  runs = [{"name": f"{act}_{lr}_s{seed}", "seed": seed,
           "values": [{"model.activation": act}], "tuned": {"optim.learning_rate": lr}}
          for act in ("relu", "swiglu") for lr in (1e-3, 3e-3) for seed in (0, 1)]
  record = SweepRecord.from_json({"name": "s", "config": "configs/lm.py:tiny",
                                  "seeds": [0, 1], "axes": [axis], "runs": runs})
  order = [e.name for e in local.points_first(record, record.runs)]
  assert order[:2] == ["relu_0.001_s0", "swiglu_0.001_s0"]
  assert order[2:4] == ["relu_0.001_s1", "swiglu_0.001_s1"]
  assert sorted(order) == sorted(r["name"] for r in runs)
