"""Fair comparisons on a planted tuned sweep: the selection reads validation
only, the comparison reads test, stalled runs are counted, seeds are paired,
and --until-resolved adds seeds to unresolved points only.

The sweep: norm_position post (the base) and pre, learning rate tuned over
1e-3 and 1e-2, seeds 0-2. Event files and ``eval/test-<step>.json`` files are
written as the runner leaves them, with validation and test disagreeing on
purpose: pre at 1e-3 is the best of all on test but not on validation.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest
from scipy import stats as scipy_stats

from tfx_jax.report import assemble, schema, stats, tuning
from tfx_jax.report.sections import scale as scale_section
from tfx_jax.report.sections import selection, verdicts
from tfx_jax.records import serial
from tfx_jax.sweep import adaptive
from tfx_jax.records.sweep import SweepRecord

import fakes

UNIGRAM = 5.7  # the planted dataset's unigram entropy (nats)
STALLED = 5.69  # not below UNIGRAM by the 0.05 margin
# (norm_position, learning rate) -> per seed (validation loss, test loss).
LOSSES = {
    ("post", 1e-3): [(2.50, 2.55), (2.60, 2.62), (2.70, 2.71)],
    ("post", 1e-2): [(STALLED, 5.7), (STALLED, 5.7), (STALLED, 5.7)],
    ("pre", 1e-3): [(2.40, 0.10), (2.45, 0.10), (2.50, 0.10)],
    ("pre", 1e-2): [(2.00, 2.10), (2.05, 2.12), (2.20, 2.28)],
}
LRS = [1e-3, 1e-2]


def _record(runs, seeds=(0, 1, 2)):
  return fakes.record(
      "tuned", [fakes.axis("model.norm_position", ["post", "pre"])], runs, seeds,
      evaluations=[["--split", "test"]], tune={"optim.learning_rate": LRS},
      select_by="eval/loss", report_split="test",
      command="python -m tfx_jax.sweep --config configs/lm.py:tiny ...")


def _entry(norm, lr, seed, state="finished", step=30):
  return fakes.entry(f"norm_position-{norm}_learning_rate-{lr!r}_s{seed}", seed,
                     [{"model.norm_position": norm}],
                     {"model.norm_position": norm, "optim.learning_rate": lr, "seed": seed},
                     {"optim.learning_rate": lr}, state=state, step=step, attempts=1,
                     wall_seconds=10.0, compile_seconds=1.0)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  return _write_sweep(tmp_path_factory.mktemp("fair") / "tuned", LOSSES)


def _write_sweep(root, losses, seeds=(0, 1, 2), test_metrics=None, initial=None):
  """The runs of ``losses`` as the runner leaves them; a validation loss of
  None is a run that diverged (no evaluation after step 0, no test file);
  ``initial``: each seed's evaluation at step 0 (None: runs of a version
  that did not evaluate at step 0)."""
  runs = []
  for (norm, lr), per_seed in losses.items():
    for seed, (val, test) in enumerate(per_seed):
      workdir = root / _entry(norm, lr, seed).name
      scalars = [] if initial is None else [
          (0, {"eval/loss": initial[seed], "eval/perplexity": math.exp(initial[seed])})]
      scalars.append((10, {"train/loss": 3.0, "train/tokens_per_sec": 100.0}))
      if val is None:
        fakes.write_run(workdir, scalars, state="diverged", step=12, num_params=1000)
        runs.append(_entry(norm, lr, seed, state="diverged", step=12))
        continue
      scalars.append((30, {"eval/loss": val, "eval/perplexity": math.exp(val)}))
      fakes.write_run(workdir, scalars, step=30, num_params=1000)
      fakes.write_evaluation(workdir, "test", 30, test_metrics(test) if test_metrics
                             else {"eval/loss": test, "eval/perplexity": math.exp(test)})
      runs.append(_entry(norm, lr, seed))
  return fakes.write_sweep(root, _record(runs, seeds))


def _analyze(sweep_dir, **options):
  from tfx_jax.report import collect
  record, summaries = collect.collect(sweep_dir)
  baselines = {name: schema.Baseline(UNIGRAM, math.log(1024)) for name in summaries}
  return record, assemble.analyze(record, summaries, baselines, schema.Options(**options))


def test_each_point_is_chosen_on_validation_and_compared_on_test(sweep_dir):
  _, report = _analyze(sweep_dir)
  points = {p.values["model.norm_position"]: p for p in report.points}
  # pre at 1e-3 has test loss 0.1, but the selection never reads test: 1e-2
  # has the better validation mean (2.083 against 2.45).
  assert points["pre"].chosen == {"optim.learning_rate": 1e-2}
  # post at 1e-2 stalled on every seed: 1e-3 is chosen.
  assert points["post"].chosen == {"optim.learning_rate": 1e-3}
  assert points["pre"].compared[0]["eval/loss"] == pytest.approx(2.10)  # test split
  assert report.report_split == "test" and report.reserved_seed is None


def test_a_rate_at_which_some_seeds_stall_is_not_chosen_for_the_others(tmp_path):
  """pre at 1e-2: the seeds that learned are the best of all (1.0), but one of
  three stalled; counted at its own loss (5.69) it makes 1e-2's mean 2.56,
  worse than 1e-3's 2.45, where every seed learned."""
  losses = {**LOSSES, ("pre", 1e-2): [(1.0, 1.1), (STALLED, 5.7), (1.0, 1.1)]}
  _, report = _analyze(_write_sweep(tmp_path / "tuned", losses))
  pre = next(p for p in report.points if p.values["model.norm_position"] == "pre")
  assert pre.chosen == {"optim.learning_rate": 1e-3}
  by_lr = {r.tuned["optim.learning_rate"]: r for r in pre.tuned}
  assert by_lr[1e-2].selection_mean == pytest.approx(1.0)  # the learned runs' mean
  assert by_lr[1e-2].selection_failed == 1
  assert by_lr[1e-2].selection_score[0] == pytest.approx((2.0 + STALLED) / 3)
  # Learned runs better by more than the failure costs still win.
  losses[("pre", 1e-2)] = [(1.0, 1.1), (STALLED, 5.7), (1.0, 1.1), (1.0, 1.1), (1.0, 1.1)]
  losses[("pre", 1e-3)] = LOSSES[("pre", 1e-3)] + [(2.4, 0.1), (2.4, 0.1)]
  for key in ("post", 1e-3), ("post", 1e-2):
    losses[key] = LOSSES[key] + LOSSES[key][:2]
  _, report = _analyze(_write_sweep(tmp_path / "five", losses, seeds=range(5)))
  pre = next(p for p in report.points if p.values["model.norm_position"] == "pre")
  assert pre.chosen == {"optim.learning_rate": 1e-2}  # (4 + 5.69) / 5 = 1.94 < 2.43
  assert sorted(pre.compared) == [0, 2, 3, 4]  # the stalled seed is counted, not compared


def test_a_point_that_never_learned_is_a_failed_verdict_not_a_missing_one(tmp_path):
  losses = {**LOSSES, ("post", 1e-3): [(STALLED, 5.7)] * 3}
  root = _write_sweep(tmp_path / "tuned", losses)
  record, report = _analyze(root)
  assert list(report.comparisons) == []
  (row,) = report.failed
  assert row.verdict == "base failed"  # post is the base of this sweep
  text = verdicts.failed_text(record, row, verdicts.failed_grids(record, row))
  assert text == ("pre vs post: base failed: post never learned (6 stalled of 6 "
                  "runs, at every learning rate); pre learned in 6 of 6")
  from tfx_jax.report import collect
  _, summaries = collect.collect(root)
  assert f"- {text}" in assemble.render(record, summaries, report, {})
  # Its runs all stalled near the unigram loss: no sensitivity, which would
  # read as "insensitive" (every rate 5.69, below l0).
  sens = next(s for s in report.sensitivity if s.point["model.norm_position"] == "post")
  assert sens.all_failed and sens.sensitivity is None
  assert "| post | all failed | 6 | 6.931 |" in assemble.render(record, summaries, report, {})
  # Both sides failing is said too.
  losses.update({("pre", 1e-3): [(STALLED, 5.7)] * 3, ("pre", 1e-2): [(STALLED, 5.7)] * 3})
  _, report = _analyze(_write_sweep(tmp_path / "both", losses))
  assert [r.verdict for r in report.failed] == ["both failed"]


def test_a_metric_without_l0_chooses_the_fewest_failures_first():
  score = selection._selection_score
  assert score([("learned", 1.0), ("stalled", 5.0)], None, "eval/loss") == (1.0, 1.0)
  assert score([("learned", 30.0)], None, "eval/bleu") == (0.0, -30.0)
  assert score([("learned", 30.0), ("diverged", None)], 6.9, "eval/bleu") == (1.0, -30.0)
  assert score([("stalled", 5.0), ("diverged", None)], 6.9, "eval/loss") is None
  assert (score([("learned", 2.0), ("learned", 2.0)], None, "eval/loss")
          < score([("learned", 1.0), ("diverged", None)], None, "eval/loss"))


def test_a_choice_at_the_end_of_the_grid_is_flagged(sweep_dir):
  from tfx_jax.report import collect
  record, summaries = collect.collect(sweep_dir)
  _, report = _analyze(sweep_dir)
  edges = {p.values["model.norm_position"]: p.chosen_at_edge for p in report.points}
  assert edges == {"post": {"optim.learning_rate": "lowest"},
                   "pre": {"optim.learning_rate": "highest"}}
  text = assemble.render(record, summaries, report, {})
  assert "post (learning_rate = 0.001, the lowest tried); pre (learning_rate = 0.01" in text
  record = dataclasses.replace(record, tune={"optim.learning_rate": (1e-4, 1e-3, 1e-2)})
  assert tuning.grid_edges(record.point_grid(report.points[0].key),
                             {"optim.learning_rate": 1e-3}) == {}
  assert tuning.grid_edges({"model.norm_position": ["pre", "post"]},
                             {"model.norm_position": "pre"}) == {}


def test_verdicts_on_other_metrics_are_listed_when_the_selection_metric_is_not_compared(
    tmp_path):
  """A translation sweep selects by validation loss and compares BLEU on test."""
  from tfx_jax.report import collect
  root = _write_sweep(tmp_path / "bleu", LOSSES,
                      test_metrics=lambda loss: {"eval/bleu": 40.0 - 10.0 * loss})
  record, summaries = collect.collect(root)
  _, report = _analyze(root)
  (row,) = report.comparisons
  assert row.metric == "eval/bleu"
  text = verdicts.verdict_text(record, row)
  assert text.startswith("pre vs post eval/bleu: better by 4.600 [")
  assert f"- {text}" in assemble.render(record, summaries, report, {})


def test_stalled_runs_are_counted_and_never_averaged(sweep_dir):
  _, report = _analyze(sweep_dir)
  post = next(p for p in report.points if p.values["model.norm_position"] == "post")
  assert serial.to_json(post.counts) == {"learned": 3, "stalled": 3, "diverged": 0}
  by_lr = {r.tuned["optim.learning_rate"]: r for r in post.tuned}
  assert by_lr[1e-2].counts.stalled == 3 and by_lr[1e-2].selection_mean is None
  # A wider margin does not change a run far below the unigram entropy.
  _, wide = _analyze(sweep_dir, stall_margin=1.0)
  post = next(p for p in wide.points if p.values["model.norm_position"] == "post")
  assert post.counts.learned == 3


def test_the_comparison_is_paired_on_test_with_a_verdict(sweep_dir):
  record, report = _analyze(sweep_dir)
  row = next(r for r in report.comparisons if r.metric == "eval/loss")
  pre = [2.10, 2.12, 2.28]
  post = [2.55, 2.62, 2.71]
  res = scipy_stats.ttest_rel(pre, post)
  ci = res.confidence_interval(0.95)
  assert row.interval.method == "paired" and row.split == "test"
  assert (row.interval.low, row.interval.high) == pytest.approx((ci.low, ci.high))
  assert row.interval.p_value == pytest.approx(res.pvalue)
  assert row.verdict == "better"
  text = verdicts.verdict_text(record, row)
  assert text.startswith("pre vs post: better by 0.460 nats")
  assert "3 seeds paired, learning rate tuned per point" in text


def test_sensitivity_counts_stalled_runs_at_their_own_loss(sweep_dir):
  _, report = _analyze(sweep_dir)
  sens = {s.point["model.norm_position"]: s for s in report.sensitivity}
  post_means = [2.6, STALLED]  # 1e-2 stalled on every seed, at 5.69 < l0 = ln 1024
  assert sens["post"].sensitivity == pytest.approx((STALLED - 2.6) / 2)
  assert [c.value for c in sens["post"].curve] == pytest.approx(post_means)
  pre_means = [2.45, (2.0 + 2.05 + 2.2) / 3]
  want = sum(m - min(pre_means) for m in pre_means) / 2
  assert sens["pre"].sensitivity == pytest.approx(want)


def test_the_sensitivity_plot_marks_each_stalled_run_at_its_own_loss(sweep_dir):
  from tfx_jax.report import plots
  _, report = _analyze(sweep_dir)
  keys = {p.values["model.norm_position"]: p.key for p in report.points}
  # post stalled on every seed at 1e-2, nowhere else; pre never stalled.
  post = plots.stalled_runs(report, keys["post"])
  assert list(post) == ["learning_rate=0.01"]
  assert post["learning_rate=0.01"] == pytest.approx([STALLED] * 3)
  assert plots.stalled_runs(report, keys["pre"]) == {}


def test_report_files_open_with_verdicts_and_show_the_choice(sweep_dir):
  assemble.write_report(sweep_dir)
  report = (sweep_dir / "report.md").read_text()
  data = json.loads((sweep_dir / "report.json").read_text())
  assert report.startswith("# Sweep `tuned`\n\n## Verdicts")
  assert "- pre vs post: better by 0.460 nats" in report
  assert "## Tuned values" in report and "### Learning-rate sensitivity" in report
  png = "sensitivity_optim.learning_rate_model.norm_position.png"
  assert (sweep_dir / png).stat().st_size > 5000 and f"]({png})" in report
  assert {p["chosen_label"] for p in data["points"]} == {"learning_rate=0.001",
                                                         "learning_rate=0.01"}
  assert data["comparisons"][0]["verdict"] in typing.get_args(stats.Verdict)


def test_without_a_test_split_the_first_seed_is_reserved_for_the_choice(sweep_dir):
  from tfx_jax.report import collect
  record, summaries = collect.collect(sweep_dir)
  record = dataclasses.replace(record, report_split="validation")
  baselines = {name: schema.Baseline(UNIGRAM, math.log(1024)) for name in summaries}
  report = assemble.analyze(record, summaries, baselines)
  assert report.reserved_seed == 0
  pre = next(p for p in report.points if p.values["model.norm_position"] == "pre")
  assert sorted(pre.compared) == [1, 2]  # seed 0 only chose
  by_lr = {r.tuned["optim.learning_rate"]: r for r in pre.tuned}
  assert by_lr[1e-3].selection_mean == pytest.approx(2.40)
  assert by_lr[1e-2].selection_mean == pytest.approx(2.00)


def test_until_resolved_adds_the_same_seed_to_both_sides_of_an_unresolved_comparison(
    sweep_dir):
  record = _record([_entry(n, lr, s) for n in ("post", "pre") for lr in LRS for s in (0, 1)],
                   seeds=(0, 1))
  # The planted sweep's report: post chose 1e-3, pre 1e-2; its one loss
  # comparison made unresolved.
  _, planted = _analyze(sweep_dir)
  loss = next(c for c in planted.comparisons if c.metric == "eval/loss")
  report = dataclasses.replace(planted, comparisons=(
      dataclasses.replace(loss, verdict="unresolved"),))
  assert report.chosen() == {(0,): {"optim.learning_rate": 1e-3},
                             (1,): {"optim.learning_rate": 1e-2}}
  added = adaptive.add_seeds(record, report, max_seeds=3)
  assert sorted((e.name, e.seed) for e in added) == [
      ("norm_position-post_learning_rate-0.001_s2", 2),
      ("norm_position-pre_learning_rate-0.01_s2", 2)]
  assert all(e.overrides["seed"] == 2 and e.state == "pending" for e in added)
  assert adaptive.add_seeds(record, report, max_seeds=3) == []  # at the budget
  # A resumed invocation rebuilds the added runs from sweep.json.
  rebuilt = _record([_entry(n, lr, s) for n in ("post", "pre") for lr in LRS for s in (0, 1)],
                    seeds=(0, 1))
  adaptive.restore_added(rebuilt, SweepRecord.from_json(json.loads(json.dumps(
      record.to_json()))))
  assert [e.name for e in rebuilt.runs[-2:]] == [e.name for e in added]
  report = dataclasses.replace(report, comparisons=(
      dataclasses.replace(loss, verdict="better"),))
  assert adaptive.add_seeds(rebuilt, report, max_seeds=10) == []  # resolved


def test_effects_are_set_against_model_size_where_an_axis_changes_it():
  """A zipped size axis (d_model/num_heads) with two sizes and an activation
  axis: the activation's difference at each size, with its interval."""
  size_values = [{"model.d_model": 32, "model.num_heads": 2},
                 {"model.d_model": 64, "model.num_heads": 4}]
  act_values = [{"model.activation": "gelu"}, {"model.activation": "swiglu"}]
  runs, summaries = [], {}
  for si, size in enumerate(size_values):
    for ai, act in enumerate(act_values):
      for seed in range(3):
        name = f"{si}{ai}_s{seed}"
        # swiglu helps by 0.05 at the small size and 0.10 at the large one.
        loss = 3.0 - 0.5 * si - (0.05 + 0.05 * si) * ai + 0.01 * seed
        runs.append(fakes.entry(name, seed, [size, act]))
        summaries[name] = fakes.summary({"eval/loss": loss}, lengths={},
                                        num_params=1000 * (si + 1) + ai)
  baselines = {name: schema.Baseline(None, None) for name in summaries}
  record = fakes.record("scale", [fakes.axis("model.d_model+model.num_heads", size_values),
                                  fakes.axis("model.activation", act_values)], runs, [0, 1, 2],
                        select_by="eval/loss", report_split="validation", tune={})
  report = assemble.analyze(record, summaries, baselines)
  assert scale_section.size_axes(record, report.points) == [0]
  scale = sorted(report.scale, key=lambda r: r.num_params)
  assert [r.axis for r in scale] == ["model.activation"] * 2
  assert [r.diff for r in scale] == pytest.approx([-0.05, -0.10])
  assert [r.num_params for r in scale] == [1001, 2001]


def test_a_tuned_sweep_without_axes_gets_its_sensitivity_plot(tmp_path):
  """Tuning alone (one config, three rates): the point's curve, one panel."""
  root = tmp_path / "lr_only"
  runs = []
  for lr, losses in ((1e-3, [3.0, 3.1]), (1e-2, [2.5, 2.6]), (1e-1, [None, None])):
    for seed, loss in enumerate(losses):
      entry = fakes.entry(f"learning_rate-{lr!r}_s{seed}", seed, [],
                          tuned={"optim.learning_rate": lr}, state="finished")
      fakes.write_run(root / entry.name,
                      {10: {"train/loss": 3.0} if loss is None else {"eval/loss": loss}},
                      state="diverged" if loss is None else "finished", step=10)
      runs.append(entry)
  fakes.write_sweep(root, dataclasses.replace(
      _record(runs, seeds=(0, 1)), name="lr_only", axes=(),
      tune={"optim.learning_rate": [1e-3, 1e-2, 1e-1]}, report_split="validation"))
  assemble.write_report(root)
  report = (root / "report.md").read_text()
  data = json.loads((root / "report.json").read_text())
  assert data["points"][0]["chosen"] == {"optim.learning_rate": 1e-2}
  assert data["points"][0]["counts"] == {"learned": 4, "stalled": 0, "diverged": 2}
  png = "sensitivity_optim.learning_rate_base.png"
  assert (root / png).stat().st_size > 5000 and f"]({png})" in report


def test_a_tuned_report_reads_back_from_its_json(sweep_dir):
  """The tuned sections (each tuned value's seeds and score, the sensitivity
  curves with stalled seeds at their loss, the test split) survive report.json."""
  _, report = _analyze(sweep_dir)
  data = json.loads(json.dumps(report.to_json()))
  assert schema.Report.from_json(data) == report
  post = data["points"][0]
  assert post["tuned"][1]["seeds"]["0"]["test"] == {"eval/loss": 5.7,
                                                     "eval/perplexity": math.exp(5.7)}
  assert data["sensitivity"][0]["curve"][1]["seeds"] == pytest.approx(
      {"0": STALLED, "1": STALLED, "2": STALLED})
  assert data["sensitivity"][0]["initial_loss_source"] == "uniform"


# ------------------------------------------ the sensitivity as published (l0 per run)
# post at 1e-2: one seed learned, one stalled, one diverged; at 1e-3 every seed
# learned, worse than the learned seed at 1e-2. Each seed's step-0 evaluation
# (the loss at initialisation) is planted: their mean, l0, is 6.9 (not ln 1024).
MIXED = {
    ("post", 1e-3): [(4.9, 5.0), (5.0, 5.1), (5.1, 5.2)],
    ("post", 1e-2): [(2.0, 2.1), (STALLED, 5.7), (None, None)],
    ("pre", 1e-3): LOSSES[("pre", 1e-3)],
    ("pre", 1e-2): LOSSES[("pre", 1e-2)],
}
INITIAL = [6.8, 6.9, 7.0]


def _post(report):
  sens = next(s for s in report.sensitivity if s.point["model.norm_position"] == "post")
  point = next(p for p in report.points if p.values["model.norm_position"] == "post")
  return sens, point


def test_sensitivity_hand_computed_with_one_stalled_and_one_diverged_run(tmp_path):
  """Wortsman et al.'s E_eta[min(l(eta), l0) - min_eta l(eta)], each run at its
  own final loss capped at l0: the stalled seed at 5.69, the diverged one at
  l0 = 6.9, the mean of the step-0 evaluations."""
  _, report = _analyze(_write_sweep(tmp_path / "mixed", MIXED, initial=INITIAL))
  sens, _ = _post(report)
  l0 = sum(INITIAL) / 3
  assert (sens.initial_loss, sens.initial_loss_source, sens.initial_loss_runs) == (
      pytest.approx(l0), "step 0", 6)
  at_1e3 = (4.9 + 5.0 + 5.1) / 3                 # 5.0
  at_1e2 = (2.0 + STALLED + l0) / 3              # 4.863
  assert [c.value for c in sens.curve] == pytest.approx([at_1e3, at_1e2])
  assert sens.sensitivity == pytest.approx(((at_1e3 - at_1e2) + 0.0) / 2)  # 0.068
  # The rule before: failed runs dropped from a rate's mean (1e-2 at 2.0), which
  # made post look sensitive: (5.0 - 2.0) / 2 = 1.5.
  assert abs(sens.sensitivity - 1.5) > 1.0
  by_lr = {c.tuned["optim.learning_rate"]: c for c in sens.curve}
  assert by_lr[1e-2].seeds[2] is None and by_lr[1e-2].failed == 2
  assert [by_lr[1e-2].seeds[0], by_lr[1e-2].seeds[1]] == pytest.approx([2.0, STALLED])
  assert by_lr[1e-2].mean == pytest.approx(2.0)  # the learned seeds alone


def test_the_tuned_value_is_chosen_by_the_same_rule(tmp_path):
  """The same runs: 1e-2 scores (2.0 + 5.69 + 6.9) / 3 = 4.86 < 5.0 and is
  chosen; counting the stalled seed as l0 (the rule before) gave 5.29 and
  chose 1e-3."""
  _, report = _analyze(_write_sweep(tmp_path / "mixed", MIXED, initial=INITIAL))
  _, post = _post(report)
  by_lr = {r.tuned["optim.learning_rate"]: r for r in post.tuned}
  l0 = sum(INITIAL) / 3
  assert by_lr[1e-2].selection_score == pytest.approx(((2.0 + STALLED + l0) / 3,))
  assert by_lr[1e-3].selection_score == pytest.approx((5.0,))
  assert post.chosen == {"optim.learning_rate": 1e-2}
  assert sorted(post.compared) == [0]  # the seed that learned there
  # A tuned value at which no seed learned is never chosen, however low.
  assert selection._selection_score([("stalled", 2.0)], l0, "eval/loss") is None


def test_l0_is_the_step_0_evaluation_else_the_uniform_loss(tmp_path):
  """Runs that did not evaluate at step 0 (older runs) fall back to ln |V|,
  and report.md and report.json say which l0 each point used."""
  from tfx_jax.report import collect
  root = _write_sweep(tmp_path / "old", MIXED)  # no step-0 evaluations
  record, summaries = collect.collect(root)
  _, report = _analyze(root)
  sens, _ = _post(report)
  l0 = math.log(1024)
  assert (sens.initial_loss, sens.initial_loss_source, sens.initial_loss_runs) == (
      pytest.approx(l0), "uniform", 0)
  at_1e2 = (2.0 + STALLED + l0) / 3
  assert [c.value for c in sens.curve] == pytest.approx([5.0, at_1e2])
  text = assemble.render(record, summaries, report, {})
  assert "| post | 0.0631 | 2 | 6.931 | uniform prediction (no run evaluated at step 0) |" in text
  data = json.loads(json.dumps(report.to_json()))
  assert data["sensitivity"][0]["initial_loss_source"] == "uniform"
  assert schema.Report.from_json(data) == report
  root = _write_sweep(tmp_path / "new", MIXED, initial=INITIAL)
  record, summaries = collect.collect(root)
  _, report = _analyze(root)
  text = assemble.render(record, summaries, report, {})
  assert "| post | 0.0683 | 2 | 6.900 | step 0 (mean of 6 runs) |" in text
  # Where only some runs evaluated at step 0, l0 is their mean.
  some = [fakes.summary(initial={"eval/loss": 6.0}), fakes.summary(initial={}),
          fakes.summary(initial={"eval/loss": 7.0})]
  assert selection.initial_loss(some, "eval/loss", 9.0) == selection.InitialLoss(
      6.5, "step 0", 2)
  assert selection.initial_loss([fakes.summary()], "eval/loss", 9.0) == selection.InitialLoss(
      9.0, "uniform", 0)
  # ln |V| is a value of eval/loss only; a higher-is-better metric has no l0.
  assert selection.initial_loss([fakes.summary()], "eval/perplexity", 9.0) is None
  assert selection.initial_loss([fakes.summary(initial={"eval/bleu": 0.0})], "eval/bleu",
                                9.0) is None


# ------------------------------------------------------------- still improving?
def _curves_report(curves, subset=None):
  """A planted untuned sweep: {norm_position: [each seed's eval/loss curve]};
  ``subset``: {norm_position: [each seed's eval_subset/loss at its last step]}."""
  runs, summaries = [], {}
  for norm, per_seed in curves.items():
    for seed, curve in enumerate(per_seed):
      name = f"{norm}_s{seed}"
      runs.append(fakes.entry(name, seed, [{"model.norm_position": norm}]))
      logged = {"eval/loss": curve}
      if subset and norm in subset:
        logged["eval_subset/loss"] = [(curve[-1][0], subset[norm][seed])]
      summaries[name] = fakes.summary(
          {"eval/loss": curve[-1][1]}, step=300,
          initial={"eval/loss": curve[0][1]} if curve[0][0] == 0 else {},
          curves=logged, num_params=1000)
  record = fakes.record("curves", [fakes.axis("model.norm_position", list(curves))], runs,
                        [0, 1, 2], select_by="eval/loss", report_split="validation", tune={})
  baselines = {name: schema.Baseline(None, None) for name in summaries}
  return record, summaries, assemble.analyze(record, summaries, baselines)


def test_a_curve_still_falling_by_more_than_the_seed_noise_is_flagged():
  """post (the base) still falls 0.5 nats between its last two evaluations,
  against a seed-to-seed standard deviation of 0.02 of its final loss; pre
  is flat (0.01 against 0.05). sandwich has one seed: its noise is the base
  point's. deepnorm evaluated once after step 0: the evaluation at
  initialisation is no second evaluation, so nothing is said."""
  falling = [[(0, 6.9), (100, 4.0), (200, 3.5 + d), (300, 3.0 + d)] for d in (0, .02, -.02)]
  flat = [[(0, 6.9), (100, 3.2), (200, 3.01 + d), (300, 3.0 + d)] for d in (0, .05, -.05)]
  record, summaries, report = _curves_report({
      "post": falling, "pre": flat,
      "sandwich": [[(100, 3.5), (200, 3.2), (300, 3.1)]],
      "deepnorm": [[(0, 6.9), (300, 3.0)]] * 3})
  trend = {p.values["model.norm_position"]: p.trend for p in report.points}
  assert trend["post"].still_improving is True and trend["post"].noise_from == "point"
  assert trend["post"].drop == pytest.approx(0.5)
  assert trend["post"].seed_noise == pytest.approx(0.02)
  assert trend["post"].steps == (200, 300) and trend["post"].runs == 3
  assert trend["pre"].still_improving is False
  assert (trend["pre"].drop, trend["pre"].seed_noise) == pytest.approx((0.01, 0.05))
  assert trend["sandwich"].still_improving is True
  assert (trend["sandwich"].noise_from, trend["sandwich"].seed_noise) == (
      "base point", pytest.approx(0.02))
  assert trend["deepnorm"] is None
  text = assemble.render(record, summaries, report, {})
  note = "(still improving: a longer run may change this verdict; "
  verdicts = [line for line in text.splitlines() if line.startswith("- ")]
  assert len(verdicts) == 3 and all(note in line for line in verdicts)
  assert all("post still falling by more than the seed noise)" in v for v in verdicts)
  assert "verdict; sandwich and post still falling" in verdicts[1]
  assert "| post | 3 | 3 | 0 | 0 | 3.0000 ± 0.0200 | **yes** (fell 0.500, seed noise " \
         "0.020) |" in text
  assert "| pre | 3 | 3 | 0 | 0 | 3.0000 ± 0.0500 | no (fell 0.010, seed noise 0.050) |" \
         in text
  assert "**yes** (fell 0.100, seed noise 0.020 of the base point)" in text
  data = json.loads(json.dumps(report.to_json()))
  assert data["points"][0]["trend"]["still_improving"] is True
  assert schema.Report.from_json(data) == report
  # The base point flat too: no verdict carries the note.
  record, summaries, report = _curves_report({"post": flat, "pre": flat})
  assert "still improving: a longer run" not in assemble.render(record, summaries, report, {})


def test_a_last_evaluation_of_the_whole_split_is_compared_on_the_subset():
  """eval.final_batches: the last evaluation read the whole split (eval/loss
  3.0, the run's final value), the ones before a subset whose loss is 0.19
  higher; its eval_subset/loss (3.19 + d) is what the drop and the seed
  noise read: the curve is flat (0.01 against 0.05), not a 0.2 drop."""
  flat = [[(0, 6.9), (100, 3.4), (200, 3.2 + d), (300, 3.0 + d)] for d in (0, .05, -.05)]
  _, _, report = _curves_report({"post": flat},
                                subset={"post": [3.19 + d for d in (0, .05, -.05)]})
  (point,) = report.points
  assert point.trend.still_improving is False
  assert (point.trend.drop, point.trend.seed_noise) == pytest.approx((0.01, 0.05))
  assert point.trend.steps == (200, 300)
  # Without it, the two samples' difference reads as a drop.
  _, _, report = _curves_report({"post": flat})
  assert report.points[0].trend.drop == pytest.approx(0.2)
