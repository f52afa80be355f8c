"""Tune small, transfer up (``Sweep(tune_at=...)``, ``--tune-at``): the tuning
runs run only at the proxy sizes, every other point runs its declared seeds
at the value chosen at the nearest proxy size below it (the transfer stage;
with confirmation seeds there is none: the confirmation stage runs those
points at their proxies' values), and the report says where each point's
value came from.

Most tests plant the runs a sweep leaves (as tests/sweep/test_confirm.py
does), so the stages and the report are checked in seconds; the last runs a
real tiny-LM sweep and kills it (``kill -9``) during its transfer stage.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import run_spec
from tfx_jax.records import sweep as sweep_record
from tfx_jax.report import schema
from tfx_jax.sweep import cli
from tfx_jax.sweep import spec as spec_lib
from tfx_jax.sweep import state as state_lib
import fakes
from helpers import ROOT, TINY, start_until, subprocess_env, sweep_in_process

pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes")]

SIZES = ("model.d_model=32,64,128;model.num_heads=2,2,4")
SWEEP = ["--config", "configs/lm.py:tiny", "--axis", SIZES,
         "--tune", "optim.learning_rate=1e-3,1e-2", "--seeds", "0,1"]
HEADS = {32: 2, 64: 2, 128: 4}
# The proxy (d_model 64) per learning rate, per seed: (validation, test).
PROXY = {1e-3: [(2.60, 2.61), (2.62, 2.60)], 1e-2: [(2.40, 2.41), (2.42, 2.40)]}
CHOSEN = 1e-2


def name(d_model: int, lr: float, seed: int) -> str:
  return f"d_model-{d_model}_num_heads-{HEADS[d_model]}_learning_rate-{lr!r}_s{seed}"


plant = fakes.write_tuned_run


def plant_sweep(sweep_dir, confirm_seeds=()) -> None:
  """The proxy's tuning runs, the other sizes' runs at the chosen rate, and
  every point's confirmation seeds at it: the whole sweep, finished."""
  for lr, per_seed in PROXY.items():
    for seed, (validation, test) in enumerate(per_seed):
      plant(sweep_dir / name(64, lr, seed), validation, test)
  for d_model, loss in ((32, 2.55), (128, 2.35)):
    for seed in (0, 1, *confirm_seeds):
      plant(sweep_dir / name(d_model, CHOSEN, seed), loss + 0.01 * seed, loss)
  for seed in confirm_seeds:
    plant(sweep_dir / name(64, CHOSEN, seed), 2.41, 2.40)


def declared(*flags: str):
  """(record, candidates) of the sweep as the command declares it."""
  args = cli._parser().parse_args([*SWEEP, *flags])
  sweep = cli.declared_sweep(args, {})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "python -m tfx_jax.sweep ...", None)
  candidates = cli.candidate_entries(sweep, [r for r in runs if r.stage == "transfer"])
  return record, candidates


def test_tuning_runs_only_at_the_proxy_size():
  record, candidates = declared("--tune-at", "model.d_model=64")
  assert sorted(e.name for e in record.runs) == sorted(
      name(64, lr, seed) for lr in PROXY for seed in (0, 1))
  assert {e.stage for e in record.runs} == {"tune"}
  # The other sizes are declared at every value (validated), run by the stage.
  assert sorted(e.name for e in candidates) == sorted(
      name(d, lr, s) for d in (32, 128) for lr in PROXY for s in (0, 1))
  assert record.tune_at == (("model.d_model", (64,)),)
  assert record.base_values["model.parametrization"] == "sp"
  # sweep.json keeps it, as {field: [values]}; a record without it reads as before.
  data = record.to_json()
  assert data["tune_at"] == {"model.d_model": [64]}
  assert sweep_record.SweepRecord.from_json(data).tune_at == record.tune_at
  del data["tune_at"]
  assert sweep_record.SweepRecord.from_json(data).tune_at == ()
  untuned, _ = declared()
  assert "tune_at" not in untuned.to_json()


def test_a_sweep_declared_in_python_names_its_proxy_size_as_a_value():
  sweep = spec_lib.Sweep(name="t", config="configs/lm.py:tiny",
                         axes=[{"model.d_model": [32, 64, 128]}],
                         tune={"optim.learning_rate": [1e-3, 1e-2]}, seeds=[0],
                         tune_at={"model.d_model": 64})
  _, runs = spec_lib.expand(sweep)
  stages = {(r.values[0]["model.d_model"], r.stage) for r in runs}
  assert stages == {(32, "transfer"), (64, "tune"), (128, "transfer")}
  assert len(runs) == 3 * 2  # every point at every value: the transfer stage picks
  conditional = dataclasses.replace(sweep, tune={"optim.learning_rate": [
      {"values": [1e-3], "when": {"model.d_model": 64}},
      {"values": [1e-2], "when": {"model.d_model": 128}}]})
  with pytest.raises(ConfigError, match="a condition on a field of a tune_at axis"):
    spec_lib.expand(conditional)


@pytest.mark.parametrize("flags, message", [
    (["--tune-at", "model.d_model=48"],
     "tune_at model.d_model=48: not a value of axis model.d_model+model.num_heads; "
     "choose from 32, 64, 128"),
    (["--tune-at", "model.dropout=0.1"], "tune_at model.dropout: no axis sets model.dropout"),
    (["--tune-at", "model.d_model"], "--tune-at 'model.d_model': expected AXIS_FIELD="),
])
def test_bad_tune_at_exits_2_at_dry_run_and_writes_nothing(tmp_path, capsys, flags, message):
  code, out, err = sweep_in_process([*SWEEP, *flags, "--workdir", tmp_path, "--dry-run"],
                                    capsys)
  assert code == 2 and message in err, out + err
  assert not list(tmp_path.iterdir())


def test_tune_at_without_tune_exits_2(tmp_path, capsys):
  code, _, err = sweep_in_process(["--config", "configs/lm.py:tiny", "--axis", SIZES,
                                   "--tune-at", "model.d_model=64", "--workdir", tmp_path,
                                   "--dry-run"], capsys)
  assert code == 2 and "the sweep tunes no field, so there is no value to transfer" in err
  assert not list(tmp_path.iterdir())


def test_a_zipped_axis_is_named_by_any_of_its_fields_and_dry_run_lists_the_plan(
    tmp_path, capsys):
  code, out, err = sweep_in_process([*SWEEP, "--tune-at", "model.num_heads=4",
                                     "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  assert "tuned here: model.d_model=128,model.num_heads=4" in out
  # No proxy below 32 or 64: both take the smallest proxy size's value.
  for d_model in (32, 64):
    assert (f"point model.d_model={d_model},model.num_heads=2: takes the value chosen at "
            "num_heads=4 (model.d_model=128,model.num_heads=4), a plain copy (not expected "
            "to hold under sp)") in out
  assert "then the transfer stage: 2 points x 2 seeds (0, 1)" in out
  assert not list(tmp_path.iterdir())


def test_the_transferred_value_reaches_every_other_run_and_the_report_flags_sp(
    tmp_path, capsys):
  sweep_dir = tmp_path / "runs" / "transfer"
  plant_sweep(sweep_dir)
  args = [*SWEEP, "--tune-at", "model.d_model=64", "--name", "transfer",
          "--workdir", tmp_path / "runs"]
  # Before the tuning stage has run: the transfer stage waits for it.
  sweep_dir.mkdir(parents=True, exist_ok=True)
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert code == 0 and "transfer stage (seeds 0, 1, each transferred point at its proxy's " \
      "chosen value): not added yet" in out, out
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  assert re.search(r"transfer stage: 4 run\(s\) at the values chosen at the proxy sizes", out)
  record = sweep_record.read(sweep_dir)
  transferred = [e for e in record.runs if e.stage == "transfer"]
  assert sorted(e.name for e in transferred) == sorted(
      name(d, CHOSEN, s) for d in (32, 128) for s in (0, 1))
  for entry in transferred:
    assert entry.tuned == {"optim.learning_rate": CHOSEN}
    assert entry.overrides["optim.learning_rate"] == CHOSEN
    spec = run_spec.of_entry(record, entry, True)
    assert spec.overrides["optim.learning_rate"] == CHOSEN
    assert spec.overrides["model.d_model"] in (32, 128)
  assert [(a.name, a.like, a.stage) for a in record.added] == [
      (e.name, e.name, "transfer") for e in transferred]
  assert {e.state for e in record.runs} == {"finished"}
  # The report: every point compared at its value, the provenance per point.
  report = json.loads((sweep_dir / "report.json").read_text())
  by_size = {p["point"]["model.d_model+model.num_heads"]: p for p in report["provenance"]}
  assert by_size["d_model=64,num_heads=2"]["source"] == "tuned"
  for size in ("d_model=32,num_heads=2", "d_model=128,num_heads=4"):
    assert by_size[size]["source"] == "transferred"
    assert by_size[size]["source_size"] == "d_model=64"
    assert by_size[size]["value"] == {"optim.learning_rate": CHOSEN}
    assert by_size[size]["parametrization"] == "sp"
    assert by_size[size]["expected_to_hold"] is False
  assert {p["chosen_label"] for p in report["points"]} == {"learning_rate=0.01"}
  assert not [s for s in report["sensitivity"] if s["key"] != [1]]
  text = (sweep_dir / "report.md").read_text()
  assert "## Where the tuned values came from" in text
  assert "transferred from d_model=64 (transferred under sp: not expected to hold)" in text
  assert "Transferred under sp: not expected to hold: d_model=32,num_heads=2; " \
      "d_model=128,num_heads=4." in text
  assert "| tuned here |" in text
  # Each comparison's design line: where both sides' values came from.
  assert ("tuned values: d_model=64,num_heads=2 tuned here, d_model=128,num_heads=4 "
          "transferred from d_model=64 (transferred under sp: not expected to hold)") in text
  # --status: the stage is done.
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert code == 0
  assert "each transferred point at its proxy's chosen value): done (4 finished)" in out
  assert ("point model.d_model=128,model.num_heads=4: from d_model=64 (chosen there: "
          "learning_rate=0.01); runs at learning_rate=0.01") in out
  # The same command again: nothing added twice.
  code, out, _ = sweep_in_process(args, capsys)
  assert code == 0 and "run(s) at the values chosen" not in out
  assert len(sweep_record.read(sweep_dir).runs) == len(record.runs)


def test_a_choice_that_moves_supersedes_the_transferred_runs_and_moves_back(
    tmp_path, capsys):
  """The proxy's grid widened to 3e-2, which it chooses: the transferred runs
  at 1e-2 are kept as ``superseded_transfer`` and the points run at 3e-2;
  back to the first grid, the runs at 1e-2 are the points' again."""
  sweep_dir = tmp_path / "runs" / "moving"
  plant_sweep(sweep_dir)
  args = [*SWEEP, "--tune-at", "model.d_model=64", "--name", "moving",
          "--workdir", tmp_path / "runs"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  for seed in (0, 1):
    plant(sweep_dir / name(64, 3e-2, seed), 2.30, 2.30)
    for d_model in (32, 128):
      plant(sweep_dir / name(d_model, 3e-2, seed), 2.50, 2.50)
  widened = [str(a).replace("1e-3,1e-2", "1e-3,1e-2,3e-2") for a in args]
  code, out, err = sweep_in_process(widened, capsys)
  assert code == 0, out + err
  record = sweep_record.read(sweep_dir)
  stages = {e.name: e.stage for e in record.runs if e.values[0]["model.d_model"] != 64}
  assert stages == {**{name(d, CHOSEN, s): "superseded_transfer" for d in (32, 128)
                       for s in (0, 1)},
                    **{name(d, 3e-2, s): "transfer" for d in (32, 128) for s in (0, 1)}}
  report = json.loads((sweep_dir / "report.json").read_text())
  assert {json.dumps(p["value"]) for p in report["provenance"]} == {
      json.dumps({"optim.learning_rate": 3e-2})}
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  record = sweep_record.read(sweep_dir)
  assert sorted((e.name, e.stage) for e in record.runs if e.stage != "tune") == sorted(
      (name(d, CHOSEN, s), "transfer") for d in (32, 128) for s in (0, 1))


# With confirmation seeds: no transfer stage, the confirmation stage runs the
# transferred points at their proxies' values.
CONFIRMED = [*SWEEP, "--tune-at", "model.d_model=64", "--confirm", "2"]
LOSS = {32: 2.55, 64: 2.41, 128: 2.35}


def plant_tuning(sweep_dir) -> None:
  """The proxy's tuning runs (d_model 64, every rate and seed), finished."""
  for lr, per_seed in PROXY.items():
    for seed, (validation, test) in enumerate(per_seed):
      plant(sweep_dir / name(64, lr, seed), validation, test)


def plant_confirmation(sweep_dir, lr=CHOSEN, seeds=(2, 3)) -> None:
  """Every point's confirmation seeds at ``lr``, finished."""
  for d_model, loss in LOSS.items():
    for seed in seeds:
      plant(sweep_dir / name(d_model, lr, seed), loss + 0.01 * seed, loss + 0.005 * seed)


def confirmed_sweep(tmp_path, capsys, name_: str = "confirmed"):
  """The sweep with --confirm 2 run once on its planted runs: (args, its dir)."""
  sweep_dir = tmp_path / "runs" / name_
  plant_tuning(sweep_dir)
  plant_confirmation(sweep_dir)
  args = [*CONFIRMED, "--name", name_, "--workdir", tmp_path / "runs"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  return args, sweep_dir, out


def test_with_confirmation_seeds_no_transfer_stage_runs_and_the_transferred_points_confirm(
    tmp_path, capsys):
  """--confirm 2: no ``transfer`` run is ever added; every transferred point
  runs its 2 confirmation seeds at the value its proxy chose, copies of its
  declaration at that value, and the report reads them as before."""
  code, out, err = sweep_in_process([*CONFIRMED, "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  assert ("no transfer-stage runs (confirm > 0): the confirmation stage runs the 2 "
          "transferred points at their proxies' values") in out
  assert "then the transfer stage" not in out
  assert ("then the confirmation stage: 3 points x 2 seeds (2, 3), each point at the tuned "
          "values its tuning stage chose, the transferred points at their proxies' values") in out
  args, sweep_dir, out = confirmed_sweep(tmp_path, capsys)
  assert "transfer stage:" not in out
  assert "confirmation stage: 6 run(s), seeds 2, 3 at each point's chosen value" in out
  record = sweep_record.read(sweep_dir)
  assert not [e for e in record.runs if e.stage in ("transfer", "superseded_transfer")]
  assert sorted((e.name, e.stage) for e in record.runs if e.stage != "tune") == sorted(
      (name(d, CHOSEN, s), "confirm") for d in (32, 64, 128) for s in (2, 3))
  # Each a copy of its point's declaration at the chosen value (a transferred
  # point's candidate, the proxy's tuning run).
  assert {(a.name, a.like, a.stage) for a in record.added} == {
      (name(d, CHOSEN, s), name(d, CHOSEN, 0), "confirm") for d in (32, 64, 128)
      for s in (2, 3)}
  for entry in record.runs:
    if entry.stage == "confirm":
      spec = run_spec.of_entry(record, entry, True)
      assert spec.overrides["optim.learning_rate"] == CHOSEN
      assert spec.seed == entry.seed
      assert spec.overrides["model.d_model"] == entry.values[0]["model.d_model"]
  assert {e.state for e in record.runs} == {"finished"}
  # The report: each transferred point at its proxy's value, compared on its
  # confirmation seeds; its provenance says where the value came from.
  report = schema.read(sweep_dir)
  assert report.verdict_runs == "confirmation"
  points = {p.key: p for p in report.points}
  assert sorted(points) == [(0,), (1,), (2,)]
  for key, point in points.items():
    assert point.chosen == {"optim.learning_rate": CHOSEN} and not point.stale
    assert point.confirmed == point.chosen and sorted(point.compared) == [2, 3]
    assert point.tuned == () if key != (1,) else len(point.tuned) == 2
  prov = {tuple(p["key"]): p for p in
          json.loads((sweep_dir / "report.json").read_text())["provenance"]}
  assert prov[(1,)]["source"] == "tuned"
  for key in ((0,), (2,)):
    assert prov[key]["source"] == "transferred" and prov[key]["source_size"] == "d_model=64"
    assert prov[key]["value"] == prov[key]["source_value"] == {"optim.learning_rate": CHOSEN}
    assert prov[key]["expected_to_hold"] is False
  rows = [c for c in report.comparisons if c.metric == report.select_by]
  assert rows and all(c.seeds == (2, 3) and c.base_seeds == (2, 3) for c in rows)
  assert not report.stale_comparisons
  text = (sweep_dir / "report.md").read_text()
  assert "every other point ran its confirmation seeds (no transfer stage" in text
  # The tuning-stage table: a transferred point ran no tuning run of its own.
  assert "| d_model=128,num_heads=4 | learning_rate=0.01 | none (transferred) |" in text
  assert ("tuned values: d_model=64,num_heads=2 tuned here, d_model=128,num_heads=4 "
          "transferred from d_model=64 (transferred under sp: not expected to hold)") in text
  # --status: no transfer stage; each transferred point's confirmation.
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert code == 0
  assert "transfer stage: no runs (confirm > 0)" in out
  assert ("point model.d_model=128,model.num_heads=4: from d_model=64 (chosen there: "
          "learning_rate=0.01); confirmation runs at learning_rate=0.01") in out
  assert "confirmation stage (seeds 2, 3, each point at its chosen value): 6 finished" in out
  # The same command again: the added runs rebuilt from sweep.json, none twice.
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  assert "run(s), seeds" not in out
  again = sweep_record.read(sweep_dir)
  assert [(e.name, e.stage) for e in again.runs] == [(e.name, e.stage) for e in record.runs]


def test_a_sweep_dir_whose_transferred_points_ran_a_transfer_stage_reports_the_same(
    tmp_path, capsys):
  """A sweep directory of the earlier version (the transferred points' declared
  seeds run, then every point's confirmation): its report's choices,
  provenance, comparisons and transfer check are those of the same sweep
  without the transfer stage, and running it again adds nothing."""
  _, new_dir, _ = confirmed_sweep(tmp_path, capsys)
  old_dir = tmp_path / "old" / "confirmed"
  plant_tuning(old_dir)
  plant_confirmation(old_dir)
  record = sweep_record.read(new_dir)
  _, candidates = declared("--tune-at", "model.d_model=64", "--confirm", "2")
  ran = [dataclasses.replace(e, stage="transfer") for e in candidates
         if e.tuned == {"optim.learning_rate": CHOSEN}]
  for entry in ran:
    plant(old_dir / entry.name, LOSS[entry.values[0]["model.d_model"]] + 0.01 * entry.seed,
          LOSS[entry.values[0]["model.d_model"]])
  tuning = [e for e in record.runs if e.stage == "tune"]
  record.runs[:] = [*tuning, *ran, *(e for e in record.runs if e.stage != "tune")]
  record.added[:] = [*(sweep_record.AddedRun(e.name, e.seed, e.name, "transfer") for e in ran),
                     *record.added]
  state_lib.refresh(old_dir, record)
  sweep_record.write(old_dir, record)
  from tfx_jax.report import assemble  # pylint: disable=import-outside-toplevel
  assemble.write_report(old_dir)
  old, new = schema.read(old_dir), schema.read(new_dir)

  def read(sweep_dir):
    report = schema.read(sweep_dir)
    return ([(p.key, p.chosen, p.confirmed, p.compared, p.stale) for p in report.points],
            json.loads((sweep_dir / "report.json").read_text())["provenance"],
            [(c.metric, c.value_index, c.base_index, c.context_key, c.verdict, c.seeds,
              c.base_seeds, c.interval, c.chosen, c.base_chosen, c.counts, c.base_counts,
              c.text, c.design) for c in report.comparisons],
            [(t.variant, t.label, t.shift, [(o.key, o.learning_rate) for o in t.optima])
             for t in report.transfer])
  assert read(old_dir) == read(new_dir)
  # The old one's transferred points ran one value each, the new one's none.
  assert [len(p.tuned) for p in old.points] == [2, 1, 1]
  assert [len(p.tuned) for p in new.points] == [2, 0, 0]
  code, out, err = sweep_in_process([*CONFIRMED, "--name", "confirmed", "--workdir",
                                     tmp_path / "old"], capsys)
  assert code == 0, out + err
  assert "run(s)," not in out and "transfer stage:" not in out
  after = sweep_record.read(old_dir)
  assert [(e.name, e.stage) for e in after.runs] == [(e.name, e.stage) for e in record.runs]
  assert read(old_dir) == read(new_dir)


def test_with_confirmation_seeds_a_choice_that_moves_reconfirms_the_transferred_points(
    tmp_path, capsys):
  """The proxy's grid widened to 3e-2, which it chooses: every point's
  confirmation runs at 1e-2, the transferred points' too, become
  ``superseded`` and each re-confirms at 3e-2, still with no transfer-stage
  run; back to the first grid, the runs at 1e-2 are the confirmation again."""
  args, sweep_dir, _ = confirmed_sweep(tmp_path, capsys, "moving")
  for seed in (0, 1):
    plant(sweep_dir / name(64, 3e-2, seed), 2.30, 2.30)
  plant_confirmation(sweep_dir, lr=3e-2)
  widened = [str(a).replace("1e-3,1e-2", "1e-3,1e-2,3e-2") for a in args]
  code, out, err = sweep_in_process(widened, capsys)
  assert code == 0, out + err
  assert out.count("is stale: confirmed at learning_rate=0.01, learning_rate=0.03 is chosen "
                   "now") == 3, out
  record = sweep_record.read(sweep_dir)
  assert sorted((e.name, e.stage) for e in record.runs if e.stage != "tune") == sorted(
      [*((name(d, CHOSEN, s), "superseded") for d in (32, 64, 128) for s in (2, 3)),
       *((name(d, 3e-2, s), "confirm") for d in (32, 64, 128) for s in (2, 3))])
  report = schema.read(sweep_dir)
  assert {p.key: p.chosen_label for p in report.points} == {
      k: "learning_rate=0.03" for k in ((0,), (1,), (2,))}
  assert not any(p.stale for p in report.points) and not report.stale_comparisons
  assert {json.dumps(p["value"]) for p in
          json.loads((sweep_dir / "report.json").read_text())["provenance"]} == {
      json.dumps({"optim.learning_rate": 3e-2})}
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  record = sweep_record.read(sweep_dir)
  assert sorted((e.name, e.stage) for e in record.runs if e.stage != "tune") == sorted(
      (name(d, CHOSEN, s), "confirm") for d in (32, 64, 128) for s in (2, 3))
  assert {p.chosen_label for p in schema.read(sweep_dir).points} == {"learning_rate=0.01"}


FAKE_SBATCH = """#!/bin/sh
n=$(ls "$FAKE_SLURM" | grep -c '^submitted-')
cp "$2" "$FAKE_SLURM/submitted-$n.sbatch"
echo $((100 + n))
"""


def test_slurm_submits_the_transferred_points_confirmation_without_a_transfer_stage(
    tmp_path, capsys, monkeypatch):
  """With an sbatch stand-in: once the tuning stage is done, the next
  invocation submits every point's confirmation seeds, the transferred
  points' at the proxy's value, and no transfer-stage run."""
  fake = tmp_path / "slurm"
  fake.mkdir()
  for command, text in (("sbatch", FAKE_SBATCH), ("squeue", "#!/bin/sh\nexit 0\n")):
    (fake / command).write_text(text)
    (fake / command).chmod(0o700)
  monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_SLURM", str(fake))
  sweep_dir = tmp_path / "runs" / "queued"
  plant_tuning(sweep_dir)
  args = [*CONFIRMED, "--name", "queued", "--workdir", tmp_path / "runs", "--executor", "slurm"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0 and out.strip().endswith("100"), out + err
  assert "transfer stage" not in out
  assert "confirmation stage: 6 run(s), seeds 2, 3 at each point's chosen value" in out
  script = (fake / "submitted-0.sbatch").read_text()
  assert sorted(re.findall(r"# (d_model\S+)", script)) == sorted(
      name(d, CHOSEN, s) for d in (32, 64, 128) for s in (2, 3))
  assert {e.stage for e in sweep_record.read(sweep_dir).runs} == {"tune", "confirm"}


def test_two_proxy_sizes_each_point_from_the_nearest_below(tmp_path, capsys):
  axis = "model.d_model=32,64,128,256;model.num_heads=2,2,4,4"
  code, out, err = sweep_in_process(
      ["--config", "configs/lm.py:tiny", "--axis", axis, "--tune",
       "optim.learning_rate=1e-3,1e-2", "--tune-at", "model.d_model=64,128",
       "--config.model.parametrization=mup", "--config.model.mup_base_d_model=64",
       "--workdir", tmp_path, "--dry-run"], capsys)
  assert code == 0, out + err
  assert "tuned here: model.d_model=64,model.num_heads=2; model.d_model=128," in out
  assert ("point model.d_model=32,model.num_heads=2: takes the value chosen at d_model=64 "
          "(model.d_model=64,model.num_heads=2), identity in base units (muP)") in out
  assert ("point model.d_model=256,model.num_heads=4: takes the value chosen at "
          "d_model=128 (model.d_model=128,model.num_heads=4), identity in base units") in out


# ---------------------------------------------------------- kill -9, resume


def test_a_tiny_lm_sweep_transfers_and_resumes_after_kill_9(tmp_path):
  """Widths 32 and 48, the learning rate tuned at 32 only: a kill -9 once the
  width-48 run at the chosen rate is training, then the same command: every
  run finishes once, and the width-48 run trained at the rate chosen at 32."""
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, 1024)
  env = subprocess_env(tmp_path / "jax_cache")
  steps = 60
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.d_model=32,48",
          "--tune", "optim.learning_rate=1e-2,3e-2", "--tune-at", "model.d_model=32",
          "--seeds", "0", "--name", "transfer", "--workdir", tmp_path, "--parallel", "2",
          *[f"--config.{k}={v}" for k, v in TINY.items() if k != "model.d_model"],
          # Enough tokens to learn past the unigram entropy (5.68 nats), as
          # tests/sweep/test_confirm.py's tiny sweep.
          f"--config.train.num_steps={steps}", f"--config.optim.decay_steps={steps}",
          "--config.train.batch_size=16", "--config.train.seq_len=64",
          "--config.eval.batch_size=64"]
  command = [sys.executable, "-m", "tfx_jax.sweep", *map(str, args)]
  sweep_dir = tmp_path / "transfer"
  proc, seen = start_until(command, env, "transfer stage: 1 run(s)")
  assert "transfer stage: 1 run(s)" in seen[-1], "".join(seen)
  (running,) = re.findall(r"(d_model-48_learning_rate-\S+_s0)", seen[-1])
  log = sweep_dir / running / state_lib.LOG_FILE
  deadline = time.time() + 300
  while not (log.exists() and re.search(rf"step +\d+/{steps}", log.read_text())):
    assert proc.poll() is None and time.time() < deadline, "".join(seen)
    time.sleep(0.005)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  assert "transfer stage: 1 run(s)" not in rerun.stdout  # added once, from sweep.json
  record = json.loads((sweep_dir / "sweep.json").read_text())
  report = json.loads((sweep_dir / "report.json").read_text())
  assert [(r["stage"], r["state"]) for r in record["runs"]] == (
      [("tune", "finished")] * 2 + [("transfer", "finished")])
  chosen = next(p["chosen"] for p in report["points"] if p["key"] == [0])
  (moved,) = [r for r in record["runs"] if r["stage"] == "transfer"]
  assert moved["name"] == running and moved["tuned"] == chosen
  assert moved["overrides"]["optim.learning_rate"] == chosen["optim.learning_rate"]
  spec = json.loads(run_spec.path(sweep_dir / running).read_text())
  assert spec["overrides"]["optim.learning_rate"] == chosen["optim.learning_rate"]
  text = (sweep_dir / running / state_lib.LOG_FILE).read_text()
  assert text.count(f"Finished at step {steps}") == 1, text
  assert "received SIGTERM" in text
  (prov,) = [p for p in report["provenance"] if p["source"] == "transferred"]
  assert prov["source_size"] == "d_model=32" and prov["value"] == chosen


def test_the_report_says_whether_a_transferred_value_held_at_a_larger_tuned_size():
  """With proxies at d_model 32 and 256, the rate chosen at 32 read against 256's
  fitted optimum interval: inside, the transfer held; outside, it did not; no
  interval, said so."""
  from types import SimpleNamespace

  from tfx_jax.report.sections import provenance
  from tfx_jax.report.transfer_schema import Optimum, Transfer

  def optimum(key, size, low, high, reason=""):
    return Optimum(point={"size": str(size)}, key=key, size=size, best=0.01,
                   learning_rate=None if low is None else (low * high) ** 0.5, low=low,
                   high=high, se_log2=0.1, seeds=2, window=(), reason=reason)

  def tuned(key, rate):
    return provenance.Provenance(point={"size": str(key)}, key=key, source="tuned",
                                 value={"optim.learning_rate": rate}, parametrization="mup")

  def lines(low, high, reason=""):
    check = Transfer(size_axis="size", size_field="model.d_model", variant={"p": "mup"},
                     optima=(optimum((0,), 32, 0.005, 0.02), optimum((1,), 256, low, high,
                                                                     reason)),
                     shift=0.0, low=-0.1, high=0.1, se=0.05, df=1.0, p=1.0, seeds=2,
                     band=0.5, label="transfers")
    found = [tuned((0,), 0.01), tuned((1,), 0.003)]
    return provenance.held_lines(found, SimpleNamespace(transfer=(check,)))

  assert lines(0.004, 0.03) == [
      "- mup, d_model 256: the rate chosen at 32, 0.01, lies inside its optimum's "
      "interval [0.004, 0.03]: the transfer held."]
  assert "lies outside its optimum's interval [0.001, 0.005]: the transfer did not hold" in (
      lines(0.001, 0.005)[0])
  assert "has no interval to be read against (the best rate is at the grid's edge)" in (
      lines(None, None, "the best rate is at the grid's edge")[0])
