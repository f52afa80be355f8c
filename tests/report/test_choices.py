"""How firm a point's choice is (``report.sections.choices``): a choice whose
lead over the next-best tuned value is below the point's seed spread is
flagged "chosen within the noise", in report.json and report.md.

The planted sweep (summaries in memory): one tuning seed (0), learning rate
over 1e-3 and 1e-2, three confirmation seeds (1-3) at each point's choice.
post (the base) leads by 0.20 against a seed spread of 0.05; pre by 0.02
against 0.05; sandwich by 0.03 with a single confirmation run, so its spread
is the base point's.
"""

from __future__ import annotations

import json
import math

import pytest

from tfx_jax.records import serial
from tfx_jax.report import assemble, schema, stats
from tfx_jax.report.sections import choices

import fakes

LRS = (1e-3, 1e-2)
# point -> ({learning rate: tuning seed 0's validation loss}, the chosen rate,
# the confirmation runs' validation losses, seeds 1, 2, ...).
PLANTED = {
    "post": ({1e-3: 2.50, 1e-2: 2.70}, 1e-3, [2.50, 2.55, 2.60]),
    "pre": ({1e-3: 2.51, 1e-2: 2.49}, 1e-2, [2.45, 2.50, 2.55]),
    "sandwich": ({1e-3: 2.60, 1e-2: 2.63}, 1e-3, [2.58]),
}


def _entry(norm, lr, seed, stage="tune"):
  return fakes.entry(f"norm_position-{norm}_learning_rate-{lr!r}_s{seed}", seed,
                     [{"model.norm_position": norm}],
                     {"model.norm_position": norm, "optim.learning_rate": lr, "seed": seed},
                     {"optim.learning_rate": lr}, stage=stage)


def _planted():
  runs, summaries = [], {}
  for norm, (tuning, chosen, confirmation) in PLANTED.items():
    for lr, loss in tuning.items():
      runs.append(_entry(norm, lr, 0))
      summaries[runs[-1].name] = fakes.summary({"eval/loss": loss}, test={"eval/loss": loss})
    for seed, loss in enumerate(confirmation, start=1):
      runs.append(_entry(norm, chosen, seed, "confirm"))
      summaries[runs[-1].name] = fakes.summary({"eval/loss": loss}, test={"eval/loss": loss})
  record = fakes.record("choices", [fakes.axis("model.norm_position", list(PLANTED))], runs,
                        (0,), tune={"optim.learning_rate": list(LRS)}, confirm=3,
                        report_split="test", evaluations=[["--split", "test"]])
  baselines = {n: schema.Baseline(5.7, math.log(1024)) for n in summaries}
  return record, summaries, assemble.analyze(record, summaries, baselines)


def test_a_lead_below_the_seed_spread_is_chosen_within_the_noise():
  record, summaries, report = _planted()
  post, pre, sandwich = (report.point((i,)) for i in range(3))
  assert post.chosen == {"optim.learning_rate": 1e-3} and pre.chosen == {
      "optim.learning_rate": 1e-2}
  spread = stats.mean_std(PLANTED["post"][2])[1]
  assert spread == pytest.approx(0.05)
  # Above the threshold: post leads by 0.20, more than its spread.
  assert post.choice == schema.ChoiceMargin(
      runner_up="learning_rate=0.01", margin=pytest.approx(0.20), spread=pytest.approx(spread),
      spread_from="point", within_noise=False)
  # Below it: pre leads by 0.02 against the same spread.
  assert (pre.choice.runner_up, pre.choice.margin, pre.choice.spread) == (
      "learning_rate=0.001", pytest.approx(0.02), pytest.approx(0.05))
  assert pre.choice.within_noise is True and pre.choice.spread_from == "point"
  # One confirmation run: the base point's spread, as Trend's seed noise falls back.
  assert (sandwich.choice.margin, sandwich.choice.spread, sandwich.choice.spread_from) == (
      pytest.approx(0.03), pytest.approx(spread), "base point")
  assert sandwich.choice.within_noise is True
  data = json.loads(json.dumps(report.to_json()))
  assert data["points"][1]["choice"] == {
      "runner_up": "learning_rate=0.001", "margin": pytest.approx(0.02),
      "spread": pytest.approx(0.05), "spread_from": "point", "within_noise": True}
  assert schema.Report.from_json(data) == report
  md = assemble.render(record, summaries, report, {})
  assert "| post | learning_rate=0.001 | 2.5000 | 1 | 0 | 0 | ✓ |" in md
  assert "| pre | learning_rate=0.01 | 2.4900 | 1 | 0 | 0 | ✓ within the noise |" in md
  assert ("is smaller than the point's seed spread (the standard deviation of that metric "
          "over the runs its verdicts read), so one tuning seed decided which value won, "
          "and another seed could have chosen the runner-up: pre (learning_rate=0.01 ahead "
          "of learning_rate=0.001 by 0.0200, seed spread 0.0500); sandwich "
          "(learning_rate=0.001 ahead of learning_rate=0.01 by 0.0300, seed spread 0.0500 "
          "of the base point).") in md


def test_no_margin_without_a_runner_up_or_where_fewer_failures_chose():
  def row(label, score):
    return schema.TunedValue(tuned={}, label=label, seeds={}, counts=schema.Counts(),
                             selection_mean=None, selection_failed=0, selection_score=score)
  assert choices.lead(row("a", (2.0,)), row("b", (2.5,))) == pytest.approx(0.5)
  assert choices.lead(row("a", (0.0, 2.0)), row("b", (0.0, 2.1))) == pytest.approx(0.1)
  # The runner-up failed more often: the metric did not decide.
  assert choices.lead(row("a", (0.0, 2.6)), row("b", (1.0, 2.1))) is None
  record, _, _ = _planted()
  untuned = schema.Point(key=(0,), values={}, chosen={}, chosen_label="",
                         chosen_at_edge={}, tuned=(row("", (2.0,)),), counts=schema.Counts(),
                         runs=1, compared={}, num_params=None)
  assert choices.choice_margins(record, [untuned]) == [untuned]
  # Nothing to say: no key in report.json (as in a report written before).
  assert "choice" not in serial.to_json(untuned) and "stale" not in serial.to_json(untuned)
