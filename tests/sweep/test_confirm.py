"""Confirmation seeds (``Sweep(confirm=N)``, ``--confirm N``): after the tuning
stage, each point runs N fresh seeds at its chosen tuned value, the same seeds
for every point, and a confirmed sweep's verdicts read those runs only.

Most tests plant the runs a sweep leaves (event files, ``eval/test-<step>.json``,
status.json, the test evaluation's marker): the sweep command then finds them
finished and runs nothing, so the stages, the report and the SLURM submissions
are checked in seconds. The last test runs a real tiny-LM tuned sweep with
``--confirm 2`` and kills it (``kill -9``) during its confirmation stage.

The planted sweep: norm_position post and pre (the base: configs/lm.py's own),
learning rate tuned over 1e-3 and 1e-2. Both points are equally good at their best rate (a test
loss of 2.50 on fresh seeds), but pre at 1e-2 has lucky tuning seeds, low on
validation and test alike.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from scipy import stats as scipy_stats

from tfx_jax.records import sweep as sweep_record
from tfx_jax.report import assemble, collect, schema
from tfx_jax.report.sections import comparisons, verdicts
from tfx_jax.sweep import adaptive, cli, confirm
from tfx_jax.sweep import spec as spec_lib
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
import fakes
from helpers import ROOT, TINY, start_until, subprocess_env, sweep_in_process

# ml_collections loads config files with the deprecated importlib load_module().
# The last test starts two busy runs at once: the "processes" group (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes")]

TUNED = ["--config", "configs/lm.py:tiny", "--axis", "model.norm_position=post,pre",
         "--tune", "optim.learning_rate=1e-3,1e-2"]
LRS = (1e-3, 1e-2)
# (norm_position, learning rate) -> per tuning seed 0, 1, 2: (validation, test).
# pre at 1e-2: the tuning seeds were lucky, on both splits.
TUNING = {
    ("post", 1e-3): [(2.50, 2.50), (2.52, 2.53), (2.48, 2.47)],
    ("post", 1e-2): [(2.70, 2.71), (2.72, 2.70), (2.69, 2.70)],
    ("pre", 1e-3): [(2.51, 2.50), (2.49, 2.51), (2.50, 2.49)],
    ("pre", 1e-2): [(2.38, 2.40), (2.40, 2.42), (2.39, 2.37)],
}
# Confirmation seeds 3, 4, 5 at the chosen values: no difference left.
CONFIRMATION = {"post": [(2.50, 2.50), (2.51, 2.52), (2.49, 2.48)],
                "pre": [(2.51, 2.52), (2.50, 2.49), (2.48, 2.50)]}
CHOSEN = {"post": 1e-3, "pre": 1e-2}





def kill_in_training_and_rerun(proc, logs, steps: int, command, env):
  """kill -9 the sweep ``proc`` once one of ``logs`` shows a training step of
  ``steps``, then the same ``command`` again; returns that run (exit 0 checked)."""
  deadline = time.time() + 300
  while not any(p.exists() and re.search(rf"step +\d+/{steps}", p.read_text()) for p in logs):
    assert proc.poll() is None and time.time() < deadline, "the sweep was not killed"
    time.sleep(0.005)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
  assert rerun.returncode == 0, rerun.stdout + rerun.stderr
  return rerun


def name(norm: str, lr: float, seed: int) -> str:
  return f"norm_position-{norm}_learning_rate-{lr!r}_s{seed}"


plant = fakes.write_tuned_run


def plant_tuning(sweep_dir, seeds=(0, 1, 2), skip=()) -> None:
  for (norm, lr), per_seed in TUNING.items():
    for seed in seeds:
      if name(norm, lr, seed) not in skip:
        plant(sweep_dir / name(norm, lr, seed), *per_seed[seed])


def declared(*flags: str) -> SweepRecord:
  """sweep.json's record of the planted sweep as the command declares it."""
  args = cli._parser().parse_args([*TUNED, *flags])
  sweep = cli.declared_sweep(args, {})
  axes, runs = spec_lib.expand(sweep)
  return cli.build_record(sweep, axes, runs, "python -m tfx_jax.sweep ...", None)


def summaries(sweep_dir, record: SweepRecord) -> RunSummaries:
  return {e.name: collect.read_run(sweep_dir / e.name, e) for e in record.runs}


def analyze(sweep_dir, record: SweepRecord) -> schema.Report:
  """The report of ``record``'s runs, as read from ``sweep_dir``."""
  baselines = {e.name: schema.Baseline(5.7, math.log(1024)) for e in record.runs}
  return assemble.analyze(record, summaries(sweep_dir, record), baselines)


def render(sweep_dir, record: SweepRecord, report: schema.Report) -> str:
  return assemble.render(record, summaries(sweep_dir, record), report, {})


def loss_row(report: schema.Report) -> schema.Comparison:
  (row,) = [c for c in report.comparisons if c.metric == "eval/loss"]
  return row


# ------------------------------------------------------------ the stage itself
def test_confirmation_seeds_are_fresh_and_the_same_for_every_point(tmp_path):
  record = declared("--seeds", "0,1", "--confirm", "3")
  assert record.confirm == 3 and record.confirmation_seeds() == (2, 3, 4)
  left = name("pre", 1e-3, 1)
  plant_tuning(tmp_path, seeds=(0, 1), skip={left})
  state_lib.refresh(tmp_path, record)
  report = analyze(tmp_path, record)
  # A tuning run left: the stage waits (a value chosen on part of the seeds stays chosen).
  assert confirm.add_confirmation(record, report) == []
  assert "1 tuning run(s) left" in confirm.waiting(record)
  plant(tmp_path / left, *TUNING[("pre", 1e-3)][1])
  state_lib.refresh(tmp_path, record)
  report = analyze(tmp_path, record)
  assert report.chosen() == {(0,): {"optim.learning_rate": 1e-3},
                             (1,): {"optim.learning_rate": 1e-2}}
  added = confirm.add_confirmation(record, report)
  assert sorted(e.name for e in added) == sorted(
      name(norm, CHOSEN[norm], seed) for norm in ("post", "pre") for seed in (2, 3, 4))
  by_point = {}
  for entry in added:
    by_point.setdefault(entry.values[0]["model.norm_position"], []).append(entry.seed)
    assert entry.stage == "confirm" and entry.state == "pending"
    assert entry.overrides["seed"] == entry.seed and entry.evaluations == (("--split", "test"),)
    assert entry.tuned == report.point(record.point_key(entry)).chosen
  # Paired: the same seeds at every point; fresh: none of them a tuning seed.
  assert by_point == {"post": [2, 3, 4], "pre": [2, 3, 4]}
  assert not set(by_point["post"]) & {e.seed for e in record.runs if e.stage == "tune"}
  assert [a.stage for a in record.added] == ["confirm"] * 6
  assert confirm.add_confirmation(record, report) == []  # none missing

  # The same command again: the confirmation runs are rebuilt from sweep.json.
  sweep_record.write(tmp_path, record)
  again = declared("--seeds", "0,1", "--confirm", "3")
  adaptive.restore_added(again, sweep_record.read(tmp_path))
  assert [(e.name, e.stage, e.tuned) for e in again.runs] == [
      (e.name, e.stage, e.tuned) for e in record.runs]
  # A later analysis choosing otherwise (a widened grid, tuning runs added)
  # makes pre's confirmation stale: it moves to the new choice, on every
  # confirmation seed, and its runs at the old one are superseded (kept);
  # post, still chosen at 1e-3, gets its fourth seed there.
  moved = dataclasses.replace(report, points=tuple(
      dataclasses.replace(p, chosen={"optim.learning_rate": 1e-3}) for p in report.points))
  more = declared("--seeds", "0,1", "--confirm", "4")
  adaptive.restore_added(more, sweep_record.read(tmp_path))
  state_lib.refresh(tmp_path, more)
  assert [p.key for p, _ in confirm.stale_points(more, moved)] == [(1,)]
  assert sorted((e.values[0]["model.norm_position"], e.seed, e.tuned["optim.learning_rate"])
                for e in confirm.add_confirmation(more, moved)) == (
      [("post", 5, 1e-3)] + [("pre", s, 1e-3) for s in (2, 3, 4, 5)])
  superseded = sorted(e.name for e in more.runs if e.stage == "superseded")
  assert superseded == [name("pre", 1e-2, s) for s in (2, 3, 4)]
  assert sorted(a.name for a in more.added if a.stage == "superseded") == superseded
  assert confirm.stale_points(more, moved) == []
  # A point with no chosen value (no tuning run learned) gets none.
  none = declared("--seeds", "0,1", "--confirm", "3")
  state_lib.refresh(tmp_path, none)
  failed = dataclasses.replace(report, points=(
      report.points[0], dataclasses.replace(report.points[1], chosen=None)))
  assert {e.values[0]["model.norm_position"]
          for e in confirm.add_confirmation(none, failed)} == {"post"}
  # Declared without confirmation seeds, the sweep has none.
  plain = declared("--seeds", "0,1")
  adaptive.restore_added(plain, sweep_record.read(tmp_path))
  assert {e.stage for e in plain.runs} == {"tune"} and plain.added == []


@pytest.fixture(scope="module")
def lucky(tmp_path_factory):
  """The planted sweep with tuning seeds 0-2 and confirmation seeds 3-5:
  (sweep dir, confirmed record, the same sweep declared without confirmation)."""
  sweep_dir = tmp_path_factory.mktemp("lucky")
  record = declared("--seeds", "0-2", "--confirm", "3")
  plant_tuning(sweep_dir)
  state_lib.refresh(sweep_dir, record)
  added = confirm.add_confirmation(record, analyze(sweep_dir, record))
  assert sorted({e.seed for e in added}) == [3, 4, 5]
  for entry in added:
    norm = entry.values[0]["model.norm_position"]
    plant(sweep_dir / entry.name, *CONFIRMATION[norm][entry.seed - 3])
  state_lib.refresh(sweep_dir, record)
  sweep_record.write(sweep_dir, record)
  unconfirmed = declared("--seeds", "0-2")
  state_lib.refresh(sweep_dir, unconfirmed)
  return sweep_dir, record, unconfirmed


def test_a_lucky_tuning_seed_decides_an_unconfirmed_verdict_but_not_a_confirmed_one(lucky):
  """pre at 1e-2: its tuning seeds were lucky on validation, which chose the
  rate, and on test, which the unconfirmed verdict reads: post "worse" by 0.1.
  On fresh seeds at the same rates the difference is gone."""
  sweep_dir, record, unconfirmed = lucky
  biased = analyze(sweep_dir, unconfirmed)
  row = loss_row(biased)
  assert biased.point((1,)).chosen == {"optim.learning_rate": 1e-2}
  assert (row.value, row.base_value) == ("post", "pre")
  assert row.seeds == (0, 1, 2) and row.verdict == "worse"
  assert biased.verdict_runs == "tuning" and biased.selection_biased
  assert biased.to_json()["selection_biased"] is True
  text = render(sweep_dir, unconfirmed, biased)
  assert "**These verdicts are selection-biased:**" in text and "--confirm N" in text

  report = analyze(sweep_dir, record)
  row = loss_row(report)
  assert report.point((1,)).chosen == {"optim.learning_rate": 1e-2}  # the same choice
  assert report.verdict_runs == "confirmation" and not report.selection_biased
  assert (report.tuning_seeds, report.confirmation_seeds) == ((0, 1, 2), (3, 4, 5))
  assert row.seeds == row.base_seeds == (3, 4, 5) and row.split == "test"
  pre, post = ([t for _, t in CONFIRMATION[n]] for n in ("pre", "post"))
  res = scipy_stats.ttest_rel(post, pre)
  ci = res.confidence_interval(0.95)
  assert row.interval.method == "paired"
  assert (row.interval.low, row.interval.high) == pytest.approx((ci.low, ci.high))
  assert row.verdict == "unresolved"
  assert "3 confirmation seeds paired" in verdicts.verdict_text(record, row)
  # The tuning stage chooses and is reported apart: its rows, the sensitivity
  # and the grid-edge check read the tuning seeds only.
  point = report.point((1,))
  assert point.confirmed == {"optim.learning_rate": 1e-2} and sorted(point.confirmation) == [3, 4, 5]
  assert all(set(r.seeds) == {0, 1, 2} for p in report.points for r in p.tuned)
  assert all(set(c.seeds) == {0, 1, 2} for s in report.sensitivity for c in s.curve)
  assert point.chosen_at_edge == {"optim.learning_rate": "highest"}
  assert point.counts.finished == 6 and point.confirmation_counts.learned == 3
  text = render(sweep_dir, record, report)
  assert "selection-biased" not in text
  assert "## Tuning stage (for reference: selected on these seeds)" in text
  # pre: chosen 1e-2, its tuning seeds' test loss (2.397) beside the confirmation seeds' (2.503).
  assert ("| pre | learning_rate=0.01 | 3 of 3 | 2.3900 ± 0.0100 | 2.3967 ± 0.0252 | "
          "2.5033 ± 0.0153 |") in text
  assert "confirmation seeds (3-5, the same for every point)" in text
  data = json.loads(json.dumps(report.to_json()))
  assert data["verdict_runs"] == "confirmation" and data["selection_biased"] is False
  assert schema.Report.from_json(data) == report


def test_each_comparison_states_its_design_in_one_line(lucky):
  sweep_dir, record, unconfirmed = lucky
  report = analyze(sweep_dir, record)
  design = comparisons.design_line(record, loss_row(report))
  assert design == (
      "tuned on seeds 0-2 over learning_rate {0.001, 0.01}; confirmed on seeds 3-5 "
      "(paired, test split); fixed seeds: t test, Holm over the report")
  text = render(sweep_dir, record, report)
  assert f"| post vs pre | - | {design} |" in text
  written = verdicts.with_sentences(record, report).to_json()  # as report.json has it
  assert schema.Report.from_json(written).comparisons[0].design == design
  biased = comparisons.design_line(unconfirmed, loss_row(analyze(sweep_dir, unconfirmed)))
  assert biased.startswith("tuned on seeds 0-2 over learning_rate {0.001, 0.01}; compared on "
                           "seeds 0-2 (paired, test split); selection-biased")


def test_without_a_test_split_the_confirmation_seeds_are_compared_on_validation(lucky):
  """No seed is reserved: the selection never read the confirmation seeds."""
  sweep_dir, record, _ = lucky
  record = dataclasses.replace(record, report_split="validation")
  report = analyze(sweep_dir, record)
  row = loss_row(report)
  assert report.reserved_seed is None and row.split == "validation"
  assert row.seeds == (3, 4, 5)
  assert row.interval.diff == pytest.approx(
      sum(v for v, _ in CONFIRMATION["post"]) / 3 - sum(v for v, _ in CONFIRMATION["pre"]) / 3)
  assert ("on the validation split (the dataset has no test split; the selection never "
          "read these seeds)") in render(sweep_dir, record, report)


def test_until_resolved_adds_confirmation_seeds_up_to_max_seeds(lucky):
  """MAX_SEEDS counts a point's confirmation seeds; the new seed is the same
  for both points, above every seed of the sweep, at the confirmed value."""
  sweep_dir, record, _ = lucky
  record = SweepRecord.from_json(json.loads(json.dumps(record.to_json())))
  report = analyze(sweep_dir, record)
  assert loss_row(report).verdict == "unresolved"
  assert adaptive.add_seeds(record, report, max_seeds=3) == []  # 3 confirmation seeds
  added = adaptive.add_seeds(record, report, max_seeds=4)
  assert sorted((e.name, e.stage) for e in added) == [
      (name("post", 1e-3, 6), "confirm"), (name("pre", 1e-2, 6), "confirm")]
  assert [(a.seed, a.stage) for a in record.added[-2:]] == [(6, "confirm")] * 2


# ---------------------------------------------------------------- the command
@pytest.mark.parametrize("args,message", [
    (["--config", "configs/lm.py:tiny", "--axis", "model.norm_position=post,pre",
      "--confirm", "2"], "there is no selection to confirm"),
    ([*TUNED, "--confirm", "0"], "--confirm=0: the number of confirmation seeds"),
    ([*TUNED, "--until-resolved", "3"], "Add --confirm N"),
])
def test_bad_confirmation_settings_exit_2_and_write_nothing(tmp_path, capsys, args, message):
  code, _, err = sweep_in_process([*args, "--workdir", tmp_path / "runs"], capsys)
  assert code == 2 and message in err, err
  assert not (tmp_path / "runs").exists()


def test_a_sweep_file_declares_confirmation_seeds(tmp_path, capsys):
  file = tmp_path / "confirmed.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Sweep
      def get_sweep(variant="default"):
        tune = {} if variant == "untuned" else {"optim.learning_rate": [1e-3, 1e-2]}
        return Sweep(name="confirmed", config="configs/lm.py:tiny",
                     axes=[{"model.norm_position": ["post", "pre"]}], tune=tune,
                     seeds=[0], confirm=2)
  """))
  code, out, _ = sweep_in_process([file, "--dry-run", "--until-resolved", "4",
                                   "--workdir", tmp_path / "runs"], capsys)
  assert code == 0
  assert ("then the confirmation stage: 2 points x 2 seeds (1, 2), each point at the tuned "
          "values its tuning stage chose") in out
  code, _, err = sweep_in_process([f"{file}:untuned", "--workdir", tmp_path / "runs"],
                                  capsys)
  assert code == 2 and "there is no selection to confirm" in err
  assert not (tmp_path / "runs").exists()
  # Untuned, --until-resolved works as before.
  code, _, _ = sweep_in_process(["--config", "configs/lm.py:tiny", "--axis",
                                 "model.norm_position=post,pre", "--until-resolved", "3",
                                 "--dry-run"], capsys)
  assert code == 0


def test_local_stages_run_in_order_and_until_resolved_adds_confirmation_seeds(
    tmp_path, capsys):
  """Tuning seed 0, --confirm 1, --until-resolved 2, every run planted finished
  beforehand (so nothing trains): the command writes the tuning stage's report,
  adds the confirmation seed 1 at each chosen value, reports again (one seed: no
  interval, unresolved) and adds confirmation seed 2 to both points."""
  for (norm, lr), per_seed in TUNING.items():
    plant(tmp_path / "runs" / "stages" / name(norm, lr, 0), *per_seed[0])
  for norm, lr in CHOSEN.items():
    for seed in (1, 2):
      plant(tmp_path / "runs" / "stages" / name(norm, lr, seed),
            *CONFIRMATION[norm][seed - 1])
  args = [*TUNED, "--seeds", "0", "--confirm", "1", "--until-resolved", "2",
          "--name", "stages", "--workdir", tmp_path / "runs"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  lines = out.splitlines()
  first = next(i for i, l in enumerate(lines) if "confirmation stage: 2 run(s), seeds 1" in l)
  more = next(i for i, l in enumerate(lines) if "--until-resolved: one more seed for 2" in l)
  assert first < more
  sweep_dir = tmp_path / "runs" / "stages"
  record = sweep_record.read(sweep_dir)
  assert [(a.seed, a.stage) for a in record.added] == [(1, "confirm")] * 2 + [(2, "confirm")] * 2
  assert {e.state for e in record.runs} == {"finished"}
  report = schema.read(sweep_dir)
  assert loss_row(report).seeds == (1, 2) and report.verdict_runs == "confirmation"
  # --status: each run's stage, each stage's counts, the chosen values.
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert code == 0
  assert re.search(rf"{name('pre', 1e-2, 2)} +confirm +finished", out), out
  assert "tuning stage (seeds 0): 4 finished" in out
  assert "confirmation stage (seeds 1, each point at its chosen value): 4 finished" in out
  assert ("point model.norm_position=pre: chosen learning_rate=0.01; confirmed at "
          "learning_rate=0.01 on seeds 1, 2") in out


# ------------------------------------------------------ a stale confirmation
# The experiment file of the widened grid: the default variant tunes the
# learning rate over 1e-3 and 1e-2, "widened" adds 3e-2, at which pre is
# better still (its confirmation at 1e-2 is then stale).
WIDENING = """
from tfx_jax.sweep import Sweep
def get_sweep(variant="default"):
  rates = {{"default": [1e-3, 1e-2], "widened": [1e-3, 1e-2, 3e-2]}}[variant]
  return Sweep(name="widening", config="configs/lm.py:tiny",
               axes=[{{"model.norm_position": ["post", "pre"]}}],
               tune={{"optim.learning_rate": rates}}, seeds=[0], confirm=2,
               overrides={overrides!r})
"""
WIDER = {("post", 3e-2): (2.90, 2.91), ("pre", 3e-2): (2.30, 2.31)}
RECONFIRMATION = [(2.31, 2.30), (2.29, 2.32)]  # pre at 3e-2, seeds 1 and 2


def widening_file(tmp_path, overrides=None):
  """The experiment file (``WIDENING``) in ``tmp_path``; ``overrides``: every run's."""
  file = tmp_path / "widening.py"
  file.write_text(WIDENING.format(overrides=dict(overrides or {})))
  return file


def plant_confirmed(sweep_dir) -> None:
  """Tuning seed 0 at 1e-3 and 1e-2, confirmation seeds 1 and 2 at each
  point's choice (post 1e-3, pre 1e-2): the sweep before its grid widens."""
  plant_tuning(sweep_dir, seeds=(0,))
  for norm, lr in CHOSEN.items():
    for seed in (1, 2):
      plant(sweep_dir / name(norm, lr, seed), *CONFIRMATION[norm][seed - 1])


def files_of(workdirs) -> dict:
  """{path: (bytes, mtime)} of every file under ``workdirs``."""
  return {f: (f.read_bytes(), f.stat().st_mtime_ns) for w in workdirs
          for f in sorted(w.rglob("*")) if f.is_file() and f.name != state_lib.LOCK_FILE}


def test_a_widened_grid_makes_a_confirmation_stale_and_the_sweep_reconfirms_it(
    tmp_path, capsys):
  """Every run planted, so nothing trains. The grid widens; while a new tuning
  run has failed, the report flags pre's confirmation stale and leaves its
  comparison out, and --status names it; once the tuning stage is done the
  same command re-confirms pre at its new choice, the old runs kept untouched."""
  file = widening_file(tmp_path)
  runs = tmp_path / "runs"
  sweep_dir = runs / "widening"
  plant_confirmed(sweep_dir)
  code, out, err = sweep_in_process([file, "--workdir", runs], capsys)
  assert code == 0, out + err
  report = schema.read(sweep_dir)
  assert [(p.confirmed, p.stale) for p in report.points] == [
      ({"optim.learning_rate": lr}, False) for lr in (1e-3, 1e-2)]
  old = [sweep_dir / name("pre", 1e-2, seed) for seed in (1, 2)]
  before = files_of(old)

  # Widened: pre at 3e-2 beats its choice; post's run there failed (the
  # confirmation stage waits for --retry-failed).
  plant(sweep_dir / name("pre", 3e-2, 0), *WIDER[("pre", 3e-2)])
  fakes.write_run(sweep_dir / name("post", 3e-2, 0), state="failed", step=3,
                  reason="planted crash")
  widened = [f"{file}:widened", "--workdir", runs]
  code, out, err = sweep_in_process(widened, capsys)
  assert code == 1, out + err
  assert "confirmation stage: waits for 1 failed tuning run(s)" in out
  report = schema.read(sweep_dir)
  pre = report.point((1,))
  assert (pre.chosen, pre.confirmed) == ({"optim.learning_rate": 3e-2},
                                         {"optim.learning_rate": 1e-2})
  assert pre.stale and pre.compared == {} and sorted(pre.confirmation) == [1, 2]
  assert not report.point((0,)).stale
  assert report.comparisons == () and report.failed == ()
  (left,) = report.stale_comparisons
  assert (left.axis, left.value, left.base_value, left.stale) == (
      "model.norm_position", "post", "pre", ("pre",))
  assert left.text == (
      "post vs pre: left out: pre's confirmation is stale: its confirmation runs ran at "
      "learning_rate=0.01, learning_rate=0.03 is chosen now. Running the sweep again "
      "re-confirms it at the new choice (the runs at the old value are kept, superseded).")
  data = json.loads((sweep_dir / "report.json").read_text())
  assert [p.get("stale") for p in data["points"]] == [None, True]  # written where true
  md = (sweep_dir / "report.md").read_text()
  assert f"- {left.text}" in md and "No comparison: each has a side whose" in md
  assert "| pre | learning_rate=0.03 (confirmation stale: ran at learning_rate=0.01; " in md
  code, out, _ = sweep_in_process([*widened, "--status"], capsys)
  assert code == 0
  assert ("point model.norm_position=pre: chosen learning_rate=0.03; its confirmation is "
          "STALE: it ran at learning_rate=0.01 on seeds 1, 2, learning_rate=0.03 is chosen "
          "now; it is re-confirmed once the tuning stage is done (the confirmation stage "
          "waits for 1 failed tuning run(s)") in out
  assert ("point model.norm_position=post: chosen learning_rate=0.001; confirmed at "
          "learning_rate=0.001 on seeds 1, 2\n") in out

  # The failed run done: the same command re-confirms pre at 3e-2 (its
  # confirmation runs planted, so nothing trains).
  plant(sweep_dir / name("post", 3e-2, 0), *WIDER[("post", 3e-2)])
  for seed in (1, 2):
    plant(sweep_dir / name("pre", 3e-2, seed), *RECONFIRMATION[seed - 1])
  code, out, err = sweep_in_process(widened, capsys)
  assert code == 0, out + err
  assert ("confirmation stage: point model.norm_position=pre is stale: confirmed at "
          "learning_rate=0.01, learning_rate=0.03 is chosen now; its runs at "
          "learning_rate=0.01 are superseded (kept), re-confirming at learning_rate=0.03") in out
  assert (f"confirmation stage: 2 run(s), seeds 1, 2 at each point's chosen value: "
          f"{name('pre', 3e-2, 1)}, {name('pre', 3e-2, 2)}") in out
  record = sweep_record.read(sweep_dir)
  stages = {e.name: e.stage for e in record.runs}
  assert {n: stages[n] for n in (*(w.name for w in old), name("pre", 3e-2, 1),
                                 name("pre", 3e-2, 2))} == {
      old[0].name: "superseded", old[1].name: "superseded",
      name("pre", 3e-2, 1): "confirm", name("pre", 3e-2, 2): "confirm"}
  assert {a.name: a.stage for a in record.added} == {
      n: s for n, s in stages.items() if n.endswith(("_s1", "_s2"))}
  assert files_of(old) == before  # nothing of the old confirmation lost or rewritten
  report = schema.read(sweep_dir)
  pre = report.point((1,))
  assert pre.confirmed == pre.chosen == {"optim.learning_rate": 3e-2} and not pre.stale
  assert report.stale_comparisons == () and loss_row(report).seeds == (1, 2)
  assert loss_row(report).interval.diff == pytest.approx(
      sum(t for _, t in CONFIRMATION["post"][:2]) / 2 - sum(t for _, t in RECONFIRMATION) / 2)
  assert "stale_comparisons" not in json.loads((sweep_dir / "report.json").read_text())
  code, out, _ = sweep_in_process([*widened, "--status"], capsys)
  assert ("point model.norm_position=pre: chosen learning_rate=0.03; confirmed at "
          "learning_rate=0.03 on seeds 1, 2; superseded confirmation runs at "
          "learning_rate=0.01 (seeds 1, 2) kept, not compared") in out
  assert re.search(rf"{old[0].name} +superseded +finished", out), out

  # The grid narrowed back: pre chooses 1e-2 again, whose runs are its
  # confirmation again; nothing runs.
  code, out, err = sweep_in_process([file, "--workdir", runs], capsys)
  assert code == 0 and "confirmation stage: 2 run(s)" not in out, out + err
  record = sweep_record.read(sweep_dir)
  assert {e.name: e.stage for e in record.runs if e.name in {w.name for w in old}} == {
      w.name: "confirm" for w in old}
  assert not any("0.03" in e.name for e in record.runs)
  report = schema.read(sweep_dir)
  assert report.point((1,)).confirmed == {"optim.learning_rate": 1e-2}
  assert not report.point((1,)).stale and loss_row(report).seeds == (1, 2)
  assert files_of(old) == before


@pytest.mark.slow
def test_kill_9_during_the_reconfirmation_then_the_same_command_loses_nothing(
    tmp_path, capsys):
  """The widened sweep planted up to its re-confirmation, which trains for
  real (tiny LM runs): a kill -9 once one of pre's two new confirmation runs
  is training, then the same command: both finish once, the superseded runs
  at 1e-2 are untouched, and pre is confirmed at its new choice."""
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, 1024)  # once, before two runs need it
  # The test split in 45 batches, not 720 of TINY's 4 rows.
  file = widening_file(tmp_path, {**TINY, "eval.batch_size": 64})
  sweep_dir = tmp_path / "widening"
  plant_confirmed(sweep_dir)
  code, out, err = sweep_in_process([file, "--workdir", tmp_path], capsys)
  assert code == 0 and "nothing to run" in out, out + err  # confirmed, before it widens
  for (norm, lr), (validation, test) in WIDER.items():
    plant(sweep_dir / name(norm, lr, 0), validation, test)
  old = [sweep_dir / name("pre", 1e-2, seed) for seed in (1, 2)]
  before = files_of(old)
  env = subprocess_env(tmp_path / "jax_cache")
  command = [sys.executable, "-m", "tfx_jax.sweep", f"{file}:widened", "--workdir",
             str(tmp_path), "--parallel", "2"]
  proc, seen = start_until(command, env, "confirmation stage: 2 run(s)")
  new = [sweep_dir / name("pre", 3e-2, seed) for seed in (1, 2)]
  assert all(w.name in seen[-1] for w in new), "".join(seen)
  assert any("point model.norm_position=pre is stale" in l for l in seen), "".join(seen)
  # Kill once a re-confirmation run is inside its training loop; at once, the
  # same command again (a run whose child is still saving is locked: it waits).
  rerun = kill_in_training_and_rerun(proc, [w / state_lib.LOG_FILE for w in new], 20,
                                     command, env)
  assert "run(s), seeds" not in rerun.stdout  # added once, resumed from sweep.json
  assert "is stale" not in rerun.stdout
  record = sweep_record.read(sweep_dir)
  assert {e.state for e in record.runs} == {"finished"}
  assert sorted((e.name, e.stage) for e in record.runs if e.stage != "tune") == sorted(
      [(w.name, "superseded") for w in old] + [(w.name, "confirm") for w in new]
      + [(name("post", 1e-3, seed), "confirm") for seed in (1, 2)])
  interrupted = 0
  for workdir in new:
    log = (workdir / state_lib.LOG_FILE).read_text()
    assert log.count("Finished at step 20") == 1, log
    interrupted += "received SIGTERM" in log
    assert (workdir / "eval" / "test-20.json").exists()
  assert interrupted >= 1, "the kill landed after both runs had finished"
  assert files_of(old) == before
  report = schema.read(sweep_dir)
  pre = report.point((1,))
  assert pre.chosen == pre.confirmed == {"optim.learning_rate": 3e-2} and not pre.stale
  assert sorted(pre.confirmation) == [1, 2] and report.stale_comparisons == ()
  assert all(s.run in {w.name for w in new} for s in pre.confirmation.values())


def test_a_sweep_json_written_before_stages_existed_resumes(tmp_path, capsys):
  """A tuned sweep.json as the version before stages wrote it (no ``stage``,
  no ``confirm``, a seed added by --until-resolved): the same command finds
  everything finished and reports it, selection-biased; with --confirm 1 its
  confirmation seed is 2, above the added seed 1."""
  sweep_dir = tmp_path / "runs" / "old"
  plant_tuning(sweep_dir, seeds=(0,))
  for norm, lr in CHOSEN.items():
    plant(sweep_dir / name(norm, lr, 1), *TUNING[(norm, lr)][1])
  runs = [{"name": name(norm, lr, seed), "seed": seed,
           "values": [{"model.norm_position": norm}], "tuned": {"optim.learning_rate": lr},
           "overrides": {"model.norm_position": norm, "optim.learning_rate": lr,
                         "seed": seed},
           "evaluations": [["--split", "test"]], "notes": [], "state": "finished",
           "step": 30, "reason": "", "attempts": 1, "wall_seconds": 9.0,
           "compile_seconds": 1.0}
          for norm, lr, seed in [(n, lr, 0) for n in ("post", "pre") for lr in LRS]
          + [(n, lr, 1) for n, lr in CHOSEN.items()]]
  old = {"name": "old", "description": "", "config": "configs/lm.py:tiny", "overrides": {},
         "seeds": [0], "evaluations": [["--split", "test"]],
         "tune": {"optim.learning_rate": list(LRS)}, "select_by": "eval/loss",
         "report_split": "test",
         "axes": [{"label": "model.norm_position", "fields": ["model.norm_position"],
                   "values": [{"model.norm_position": "post"},
                              {"model.norm_position": "pre"}], "reference": 0}],
         "base_values": {"model.norm_position": "post"}, "command": "python -m ...",
         "cwd": str(ROOT), "created": "2025-06-01T12:00:00+00:00", "slurm_jobs": [],
         "runs": runs, "added": [{"name": r["name"], "seed": 1, "like": r["name"][:-1] + "0"}
                                 for r in runs[4:]],
         "report_options": {"stall_margin": None, "equivalence_margin": None},
         "updated": "2025-06-01T13:00:00+00:00"}
  (sweep_dir / "sweep.json").write_text(json.dumps(old))
  args = [*TUNED, "--seeds", "0", "--name", "old", "--workdir", tmp_path / "runs"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0, out + err
  assert "nothing to run" in out and "6 finished" in out
  record = sweep_record.read(sweep_dir)
  assert record.created == old["created"] and record.confirm == 0
  assert [(a.name, a.stage) for a in record.added] == [(r["name"], "tune") for r in runs[4:]]
  assert {e.stage for e in record.runs} == {"tune"}
  assert [e.wall_seconds for e in record.runs] == [9.0] * 6
  report = schema.read(sweep_dir)
  assert report.selection_biased and loss_row(report).seeds == (0, 1)
  assert "These verdicts are selection-biased" in (sweep_dir / "report.md").read_text()
  # Confirmed now: the seed above every tuning seed, the added one included.
  for norm, lr in CHOSEN.items():
    plant(sweep_dir / name(norm, lr, 2), *CONFIRMATION[norm][0])
  code, out, err = sweep_in_process([*args, "--confirm", "1"], capsys)
  assert code == 0, out + err
  record = sweep_record.read(sweep_dir)
  assert sorted(e.name for e in record.runs if e.stage == "confirm") == [
      name("post", 1e-3, 2), name("pre", 1e-2, 2)]


FAKE_SBATCH = """#!/bin/sh
n=$(ls "$FAKE_SLURM" | grep -c '^submitted-')
cp "$2" "$FAKE_SLURM/submitted-$n.sbatch"
echo $((100 + n))
"""
FAKE_SQUEUE = """#!/bin/sh
cat "$FAKE_SLURM/queue" 2>/dev/null
exit 0
"""


def test_slurm_submits_the_confirmation_stage_once_the_tuning_stage_is_done(
    tmp_path, capsys, monkeypatch):
  """sbatch and squeue stand-ins record what is submitted: the first
  invocation submits the tuning run left; once it is done, the next submits
  the confirmation stage; while that is queued, the next submits nothing."""
  fake = tmp_path / "slurm"
  fake.mkdir()
  for command, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
    (fake / command).write_text(text)
    (fake / command).chmod(stat.S_IRWXU)
  monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_SLURM", str(fake))
  sweep_dir = tmp_path / "runs" / "queued"
  left = name("pre", 1e-3, 0)
  plant_tuning(sweep_dir, seeds=(0,), skip={left})
  args = [*TUNED, "--seeds", "0", "--confirm", "2", "--name", "queued", "--workdir",
          tmp_path / "runs", "--executor", "slurm"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0 and out.strip().endswith("100"), out + err
  script = (fake / "submitted-0.sbatch").read_text()
  assert "#SBATCH --array=0-0" in script and f"# {left}" in script
  assert not any(e.stage == "confirm" for e in sweep_record.read(sweep_dir).runs)
  plant(sweep_dir / left, *TUNING[("pre", 1e-3)][0])
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0 and out.strip().endswith("101"), out + err
  assert "confirmation stage: 4 run(s), seeds 1, 2 at each point's chosen value" in out
  script = (fake / "submitted-1.sbatch").read_text()
  confirmation = sorted(name(norm, lr, s) for norm, lr in CHOSEN.items() for s in (1, 2))
  assert "#SBATCH --array=0-3" in script
  assert sorted(re.findall(r"# (norm_position\S+)", script)) == confirmation
  assert schema.read(sweep_dir).chosen() == {(0,): {"optim.learning_rate": 1e-3},
                                             (1,): {"optim.learning_rate": 1e-2}}
  (fake / "queue").write_text("".join(f"101_{i}|PENDING\n" for i in range(4)))
  code, out, _ = sweep_in_process(args, capsys)
  assert code == 0 and "4 run(s) already queued" in out and "nothing to submit" in out
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert "confirmation stage (seeds 1, 2, each point at its chosen value): 4 pending" in out
  assert "slurm 101_0 PENDING" in out


def test_slurm_submits_the_reconfirmation_once_the_widened_tuning_stage_is_done(
    tmp_path, capsys, monkeypatch):
  """With sbatch and squeue stand-ins: after the grid widens, the first
  invocation submits the new tuning run; once it is done, the next moves pre's
  stale confirmation (sweep.json) and submits its runs at the new choice."""
  fake = tmp_path / "slurm"
  fake.mkdir()
  for command, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
    (fake / command).write_text(text)
    (fake / command).chmod(stat.S_IRWXU)
  monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_SLURM", str(fake))
  file = widening_file(tmp_path)
  runs = tmp_path / "runs"
  sweep_dir = runs / "widening"
  plant_confirmed(sweep_dir)
  code, out, err = sweep_in_process([file, "--workdir", runs], capsys)
  assert code == 0, out + err
  plant(sweep_dir / name("pre", 3e-2, 0), *WIDER[("pre", 3e-2)])
  args = [f"{file}:widened", "--workdir", runs, "--executor", "slurm"]
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0 and out.strip().endswith("100"), out + err
  script = (fake / "submitted-0.sbatch").read_text()
  assert "#SBATCH --array=0-0" in script and f"# {name('post', 3e-2, 0)}" in script
  assert not any(e.stage == "superseded" for e in sweep_record.read(sweep_dir).runs)
  plant(sweep_dir / name("post", 3e-2, 0), *WIDER[("post", 3e-2)])
  code, out, err = sweep_in_process(args, capsys)
  assert code == 0 and out.strip().endswith("101"), out + err
  assert "point model.norm_position=pre is stale" in out
  script = (fake / "submitted-1.sbatch").read_text()
  assert "#SBATCH --array=0-1" in script
  assert sorted(re.findall(r"# (norm_position\S+)", script)) == [
      name("pre", 3e-2, 1), name("pre", 3e-2, 2)]
  stages = {e.name: e.stage for e in sweep_record.read(sweep_dir).runs}
  assert [stages[name("pre", lr, s)] for lr in (1e-2, 3e-2) for s in (1, 2)] == [
      "superseded", "superseded", "confirm", "confirm"]
  code, out, _ = sweep_in_process([*args, "--status"], capsys)
  assert ("point model.norm_position=pre: chosen learning_rate=0.03; confirmed at "
          "learning_rate=0.03 on seeds 1, 2; superseded confirmation runs at "
          "learning_rate=0.01 (seeds 1, 2) kept, not compared") in out
  assert "confirmation stage (seeds 1, 2, each point at its chosen value): 2 finished, " \
      "2 pending" in out


# --------------------------------------------------------- a real tiny sweep
@pytest.mark.slow
def test_a_tiny_lm_sweep_confirms_on_fresh_seeds_and_resumes_after_kill_9(tmp_path):
  """The tiny LM, two activations, learning rate tuned over two rates, tuning
  seed 0, --confirm 2: a kill -9 once a confirmation run is training, then the
  same command: every run finishes once, and the verdict reads seeds 1 and 2
  on test, at the rates the tuning stage chose."""
  from tfx_jax.data import prepare  # pylint: disable=import-outside-toplevel
  prepare.prepare("tfx_shakespeare", None, 1024)  # once, before two runs need it
  env = subprocess_env(tmp_path / "jax_cache")
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.activation=relu,gelu",
          "--tune", "optim.learning_rate=1e-2,3e-2", "--seeds", "0", "--confirm", "2",
          "--name", "confirmed", "--workdir", tmp_path, "--parallel", "2",
          *[f"--config.{k}={v}" for k, v in TINY.items()],
          # Enough tokens to learn past the unigram entropy (5.68 nats): ~5.4.
          "--config.train.num_steps=60", "--config.optim.decay_steps=60",
          "--config.train.batch_size=16", "--config.train.seq_len=64",
          # The test split in 45 batches, not 720 of TINY's 4 rows.
          "--config.eval.batch_size=64"]
  command = [sys.executable, "-m", "tfx_jax.sweep", *map(str, args)]
  sweep_dir = tmp_path / "confirmed"
  proc, seen = start_until(command, env, "confirmation stage: 4 run(s)")
  confirming = re.findall(r"(activation-\S+_s[12])", seen[-1])
  assert len(confirming) == 4, "".join(seen)
  logs = [sweep_dir / n / state_lib.LOG_FILE for n in confirming]
  # Kill once a confirmation run is inside its training loop, then run again.
  rerun = kill_in_training_and_rerun(proc, logs, 60, command, env)
  assert "run(s), seeds" not in rerun.stdout  # added once, resumed from sweep.json
  record = json.loads((sweep_dir / "sweep.json").read_text())
  report = json.loads((sweep_dir / "report.json").read_text())
  assert {r["state"] for r in record["runs"]} == {"finished"}
  assert [(r["seed"], r["stage"]) for r in record["runs"]] == (
      [(0, "tune")] * 4 + [(1, "confirm")] * 2 + [(2, "confirm")] * 2)
  interrupted = 0
  for run in record["runs"]:
    log = (sweep_dir / run["name"] / state_lib.LOG_FILE).read_text()
    assert log.count("Finished at step 60") == 1, log
    interrupted += "received SIGTERM" in log
    assert (sweep_dir / run["name"] / "eval" / "test-60.json").exists()
  assert interrupted >= 1, "the kill landed after every run had finished"
  for point in report["points"]:
    assert point["chosen"] is not None and sorted(map(int, point["compared"])) == [1, 2]
    runs = [r for r in record["runs"] if r["stage"] == "confirm" and r["values"] == [
        {"model.activation": point["values"]["model.activation"]}]]
    assert [r["tuned"] for r in runs] == [point["chosen"]] * 2
  (row,) = [r for r in report["comparisons"] if r["metric"] == "eval/loss"]
  assert (row["method"], row["seeds"], row["split"]) == ("paired", [1, 2], "test")
  assert report["verdict_runs"] == "confirmation" and report["selection_biased"] is False
  assert "## Tuning stage (for reference" in (sweep_dir / "report.md").read_text()
