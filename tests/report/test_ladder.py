"""The ladder section on planted ladders with known curves: the multiplier
recovered and its trend labelled, the refusals said, the ladder's axes kept
out of the comparisons, the claims on the multiplier labelled by the rule,
the figure, the trunks' cost, a branched run's curve joined to its trunk's, and
a tuned value shared across budgets (``Ladder(share_tuning=True)``)."""

from __future__ import annotations

import dataclasses
import json
import math
import types

import numpy as np
import pytest

from tests import fakes
from tfx_jax.core.errors import ConfigError
from tfx_jax.records import ladder as ladder_lib
from tfx_jax.records.claims import Claim, Equivalent
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import assemble, claim_checks, claims, collect, scaling, schema
from tfx_jax.report import multiplier as mult
from tfx_jax.report.context import Context
from tfx_jax.report.sections import ladder as ladder_section
from tfx_jax.report.sections import selection
from tfx_jax.report.sections import tuned as tuned_section

E, A, ALPHA = 2.0, 3000.0, 0.3
K = 1.5                      # the constant multiplier planted
SHRINK = 22.3                # m(C) = SHRINK C^-0.1: 1.97x at the smallest rung, 0.83x at
                             # the largest
RUNGS = [{"model.d_model": d, "model.num_layers": 2} for d in (32, 64, 128, 256)]
# Five sizes: at each budget, the backtest's fit without the largest has 4
# rungs for 3 free parameters (with 3 it is not identifiable).
RUNGS5 = [*RUNGS, {"model.d_model": 512, "model.num_layers": 2}]
BUDGETS = [10.0, 20.0]
VARIANTS = {"model.activation": ["gelu", "swiglu"]}
UNIGRAM = 8.0
SD = 0.001


def base_curve(c):
  return E + A * c ** -ALPHA


def planted_loss(kind, seed=0):
  """loss(variant, compute, seed): the base curve, and swiglu a constant
  multiplier K over it or a shrinking one (its own exponent, 0.27); each seed
  a shared offset (the same draw in every variant) and its own noise."""
  rng = np.random.default_rng(seed)

  def loss(variant, c, s):
    if variant["model.activation"] == "gelu":
      value = base_curve(c)
    elif kind == "constant":
      value = base_curve(K * c)
    else:
      value = E + A * SHRINK ** -ALPHA * c ** -(0.9 * ALPHA)
    return value + 0.002 * (s - 1) + rng.normal(0.0, SD)
  return loss


@pytest.fixture(scope="module", autouse=True)
def few_resamples():
  """A test's bootstrap: 100 resamples from a subset of the paper's starts."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(ladder_section, "RESAMPLES", 100)
    patch.setattr(ladder_section, "STARTS", {"compute": scaling.grid("compute")[::10],
                                             "params_tokens": scaling.grid("params_tokens")[::150]})
    yield


def analyze(record, summaries) -> schema.Report:
  baselines = {name: schema.Baseline(UNIGRAM, math.log(256)) for name in summaries}
  return assemble.analyze(record, summaries, baselines)


def planted(kind, rungs=RUNGS, budgets=BUDGETS, claims_=(), branch=True):
  record, summaries = fakes.ladder_sweep("ladder", rungs, budgets, VARIANTS, planted_loss(kind),
                                         branch=branch, claims=tuple(claims_))
  return record, summaries, analyze(record, summaries)


@pytest.fixture(scope="module")
def constant():
  return planted("constant", rungs=RUNGS5, claims_=[
      Claim("worth_more", "planted", "swiglu is worth more than its compute of gelu",
            ("swiglu", None), "ladder/multiplier", "higher"),
      Claim("constant", "planted", "the multiplier is constant", ("swiglu", None),
            "ladder/trend", Equivalent(mult.BAND))])


@pytest.fixture(scope="module")
def shrinking():
  return planted("shrinking", rungs=RUNGS5, claims_=[
      Claim("shrinks", "planted", "the multiplier shrinks with scale", ("swiglu", None),
            "ladder/trend", "lower"),
      Claim("worth_more", "planted", "swiglu is worth more at every rung", ("swiglu", None),
            "ladder/multiplier", "higher")])


def test_a_constant_multiplier_is_recovered_and_labelled_constant(constant):
  _, _, report = constant
  ladder = report.ladder
  # Two budgets: L(C) along the rungs at each (pooled, one compute's runs
  # would split it differently between N and D).
  assert ladder.base == "gelu"
  assert [(v.variant, v.budget) for v in ladder.variants] == [
      ("gelu", 0), ("swiglu", 0), ("gelu", 1), ("swiglu", 1)]
  for budget, tokens_per_param in enumerate(BUDGETS):
    gelu, swiglu = ladder.variant("gelu", budget), ladder.variant("swiglu", budget)
    assert swiglu.tokens_per_param == tokens_per_param
    assert swiglu.series == f"swiglu @ {tokens_per_param:g} tokens/param"
    assert gelu.fit.usable and swiglu.fit.usable and gelu.multiplier is None
    assert gelu.fit.value("alpha") == pytest.approx(ALPHA, abs=0.02)
    e = next(p for p in gelu.fit.parameters if p.name == "E")
    assert e.low < E < e.high
    m = swiglu.multiplier
    read = [r for r in m.rungs if r.multiplier is not None]
    assert len(read) == 4
    for row in read:
      assert row.multiplier == pytest.approx(K, rel=0.03)
    # Each a 95% interval: all but one of a budget's four hold K.
    assert sum(r.interval.low <= K <= r.interval.high for r in read) >= len(read) - 1
    # The largest compute times 1.5 lies past the base's largest rung: a bound.
    assert m.rungs[-1].bound == "more than"
    assert m.trend.label in ("constant", "unresolved")
    assert m.trend.interval.low < 0.0 < m.trend.interval.high
    assert m.crossover is None
    # Two budgets at four sizes: the (N, D) form too, one fit over both.
    assert swiglu.params_tokens.form == "params_tokens" and swiglu.params_tokens.identifiable
    # The backtest holds out the largest size and covers it.
    held = swiglu.backtest.held_out
    assert len(held) == 1 and all(h.covered for h in held) and all(abs(h.error) < 0.02 for h in held)
  assert ladder.variant("swiglu", 0).params_tokens == ladder.variant("swiglu", 1).params_tokens


def test_a_shrinking_multiplier_is_labelled_and_its_crossover_found(shrinking):
  _, _, report = shrinking
  crossings = []
  for budget in range(len(BUDGETS)):
    m = report.ladder.variant("swiglu", budget).multiplier
    assert m.trend.label in ("shrinks with scale", "unresolved")
    assert m.trend.interval.low < -0.1 < m.trend.interval.high  # d ln m / d ln C = -0.1
    assert m.trend.slope < 0
    held = [r.interval.low < SHRINK * r.compute ** -0.1 < r.interval.high for r in m.rungs]
    assert len(held) == 5 and sum(held) >= len(held) - 1  # as for the constant one
    if m.crossover is not None:
      crossings.append(m.crossover)
  # The curves cross where the multiplier is 1: C = SHRINK^10, inside a budget's range.
  assert crossings and all(c.interval.low < SHRINK ** 10 < c.interval.high for c in crossings)


def test_the_rows_state_counts_tokens_flops_epochs_and_cost(constant):
  record, _, report = constant
  rows = report.ladder.rows
  assert len(rows) == 5 * 2 * 2
  row = next(r for r in rows if r.key == (1, 1, 1))
  count = record.ladder.point((1, 1, 1))
  assert (row.non_embedding_params, row.params, row.tokens) == (
      count.non_embedding_params, count.params, count.tokens)
  assert row.flops == count.flops and row.tokens_per_param == pytest.approx(20.0, rel=0.01)
  assert row.epochs == pytest.approx(count.tokens / 10_000_000)
  assert row.branch_step == count.branch_step and sorted(row.losses) == [0, 1, 2]
  # 3 runs of 10 s and, of each of their 3 trunks (10 s, 2 budgets), half.
  assert row.core_seconds == pytest.approx(3 * 10.0 + 3 * 5.0)


def test_the_ladders_axes_are_contexts_never_compared(constant):
  record, _, report = constant
  loss = [c for c in report.comparisons if c.metric == "eval/loss"]
  assert {c.axis_index for c in report.comparisons} == {2}
  assert {c.axis for c in report.comparisons} == {"model.activation"}
  # swiglu against gelu within each of the 5 rungs x 2 budgets.
  assert sorted(c.context_key[:2] for c in loss) == [(r, b) for r in range(5) for b in range(2)]
  assert all(c.verdict == "better" for c in loss)
  assert [n.axis for n in report.noise] == ["model.activation"]


def test_three_rungs_on_one_budget_are_refused_as_the_library_does():
  record, summaries, report = planted("constant", rungs=RUNGS[:3], budgets=BUDGETS[:1])
  ladder = report.ladder
  for v in ladder.variants:
    assert not v.fit.identifiable and v.fit.parameters == ()
    assert v.fit.reason.startswith("not identifiable: 3 distinct inputs for 3 free parameters")
    assert "2 budgets at >= 3 sizes" in v.params_tokens.reason
  m = ladder.variant("swiglu").multiplier
  assert m.rungs == () and "per-rung comparisons" in m.note
  md = "\n".join(ladder_section.markdown(Context(record, summaries, report.baselines),
                                         report, {}))
  assert "refused: not identifiable: 3 distinct inputs" in md
  assert "only the per-rung comparisons speak for them" in md
  # The per-rung comparisons are made all the same.
  assert len([c for c in report.comparisons if c.metric == "eval/loss"]) == 3


def test_the_markdown_has_the_tables_and_states_the_range(constant):
  record, summaries, report = constant
  md = "\n".join(ladder_section.markdown(Context(record, summaries, report.baselines), report,
                                         {"ladder:": "ladder.png"}))
  assert "## Ladder: loss against training compute" in md
  assert "| d_model | num_layers | variant | non-embedding params | params | tokens |" in md
  assert "### Fitted constants" in md and "L = E + A N^-α + B D^-β" in md
  assert "**constant**" in md and "more than 1x (outside the base's measured compute)" in md
  assert "### Backtest: the largest rung predicted without it" in md
  assert "Nothing past the largest rung is claimed" in md and "(256x)" in md
  assert "![loss against training compute per variant](ladder.png)" in md


def test_report_json_keeps_the_ladder_and_reads_it_back(constant):
  _, _, report = constant
  data = json.loads(json.dumps(report.to_json()))
  assert {"rows", "variants", "base", "compute_range"} <= set(data["ladder"])
  assert schema.Report.from_json(data).ladder == report.ladder
  assert "ladder" not in schema.Report.from_json(
      {k: v for k, v in data.items() if k != "ladder"}).to_json()


def _rule(row):
  """The label ``claims.label`` gives the row's numbers."""
  return claims.label(row.expect if row.expect in ("lower", "higher") else
                      Equivalent(row.band), row.estimate,
                      row.p_adjusted is not None and row.p_adjusted < 0.05,
                      row.p_equivalence_adjusted is not None
                      and row.p_equivalence_adjusted < 0.05, row.band)[0]


def test_the_claims_on_the_multiplier_are_labelled_by_the_rule(constant, shrinking):
  for record, _, report in (constant, shrinking):
    found = {r.id: r for r in claims.evaluate(record.claims, report)}
    for row in found.values():
      assert row.label == _rule(row) and row.family == 2 and row.point_a == "swiglu"
    # Relabelled from report.json alone, the same.
    again = claims.evaluate(record.claims, schema.Report.from_json(
        json.loads(json.dumps(report.to_json()))))
    assert {r.id: r for r in again} == found
  got = {r.id: r for r in claims.evaluate(constant[0].claims, constant[2])}
  assert got["worth_more"].label == "reproduced"
  assert math.exp(got["worth_more"].estimate) == pytest.approx(K, rel=0.05)
  assert "intersection-union over the rungs" in got["worth_more"].design
  assert "left out: a bound" in got["worth_more"].design
  assert got["constant"].label == "reproduced" and got["constant"].band == mult.BAND
  got = {r.id: r for r in claims.evaluate(shrinking[0].claims, shrinking[2])}
  assert got["shrinks"].label == "reproduced"
  assert got["shrinks"].estimate == pytest.approx(-0.1, abs=0.03)
  # At the largest rungs swiglu is worth less than its compute of gelu: the
  # intersection-union rests there, against the paper.
  assert got["worth_more"].label in ("inconclusive", "not reproduced")
  assert got["worth_more"].estimate < 0


def test_a_ladder_without_curves_yet_leaves_its_claims_untested(constant):
  """The tuning stage's report (the confirmation runs, which the curves read,
  not yet run) labels the ladder's claims instead of failing: the sweep reads
  that report to start its confirmation stage."""
  record, _, report = constant
  pending = dataclasses.replace(report, ladder=dataclasses.replace(
      report.ladder, variants=(), note="no rung has a learned run yet"))
  for row in claims.evaluate(record.claims, pending):
    assert row.label == "not tested here" and row.point_a == "swiglu"
    assert row.reason == "the ladder has no curves yet: no rung has a learned run yet"


def test_the_results_page_may_quote_the_ladders_numbers(constant, tmp_path):
  """docs/results.md's check (``results_check``) knows a ladder's numbers: a
  rung's multiplier and its trend as report.md prints them, the fitted
  constants; a multiplier the report does not hold is a mismatch."""
  from tfx_jax.report import results_check, results_doc  # pylint: disable=import-outside-toplevel
  _, _, report = constant
  found = results_doc.Committed("ladder", tmp_path / "report.json", report, ())
  quoted = {t.what: t for t in results_check.triples(found)}
  v = next(v for v in report.ladder.variants if v.multiplier is not None
           and any(r.multiplier is not None and r.interval is not None
                   for r in v.multiplier.rungs))
  row = next(r for r in v.multiplier.rungs if r.multiplier is not None and r.interval)
  name = f"{v.variant} @ {v.tokens_per_param:g} tokens/param"
  t = quoted[f"ladder: ladder {name} multiplier at C = {row.compute:.3g}"]
  assert (t.estimate, t.low, t.high, t.ratio) == (row.multiplier, row.interval.low,
                                                   row.interval.high, True)
  alpha = next(c for c in v.fit.parameters if c.name == "alpha")
  assert quoted[f"ladder: ladder {name} compute alpha"].estimate == alpha.value
  text = (f"## `ladder`: planted\n\nIts multiplier {row.multiplier:.3f}x "
          f"[{row.interval.low:.3f}, {row.interval.high:.3f}]; off "
          f"{row.multiplier + 0.002:.3f}x [{row.interval.low:.3f}, {row.interval.high:.3f}].\n")
  mismatches = results_check.check(text, [found])
  assert [m.quoted.split("x")[0] for m in mismatches] == [f"{row.multiplier + 0.002:.3f}"]


def test_the_ladder_claims_are_checked_before_a_run(constant):
  record, _, _ = constant
  claim_checks.check_sweep(record)
  on_base = Claim("base", "planted", "-", ("gelu", None), "ladder/multiplier", "higher")
  with pytest.raises(ConfigError, match="names the base itself"):
    claim_checks.check_sweep(dataclasses.replace(record, claims=(on_base,)))
  unladdered = SweepRecord.from_json({k: v for k, v in record.to_json().items()
                                      if k not in ("ladder", "trunks")})
  with pytest.raises(ConfigError, match="the sweep has no ladder"):
    claim_checks.check_sweep(unladdered)
  with pytest.raises(ConfigError, match="ladder/multiplier"):
    bad = Claim("typo", "planted", "-", ("swiglu", None), "ladder/multiplyer", "higher")
    claim_checks.check_sweep(dataclasses.replace(record, claims=(bad,)))


def test_the_trunks_cost_is_in_the_compute_total(constant):
  _, _, report = constant
  compute = report.compute
  assert compute.trunks.runs == 5 * 2 * 3 and compute.trunks.core_seconds == pytest.approx(300.0)
  assert compute.total.runs == 5 * 2 * 2 * 3 + 30
  assert compute.total.core_seconds == pytest.approx(600.0 + 300.0)
  assert sum(r.core_seconds for r in compute.points) == pytest.approx(600.0)


def test_the_report_on_disk_joins_branched_curves_and_draws_the_figure(tmp_path):
  record, summaries = fakes.ladder_sweep("ladder", RUNGS, BUDGETS, VARIANTS,
                                         planted_loss("constant"), seeds=(0, 1, 2), branch=True)
  root = tmp_path / "ladder"
  for trunk in record.trunks:
    fakes.write_run(root / trunk.name, {0: {"eval/loss": 5.5}, 5: {"eval/loss": 5.0},
                                        trunk.step: {"eval/loss": 4.0}},
                    step=trunk.step, num_params=1000, cores=1, seconds={"train_steps": 10.0})
  for entry in record.runs:
    branch = record.ladder.point(record.point_key(entry)).branch_step
    final = summaries[entry.name].final["eval/loss"]
    fakes.write_run(root / entry.name, {branch: {"eval/loss": 4.5},
                                        entry.step: {"eval/loss": final}},
                    step=entry.step, num_params=1000, cores=1, seconds={"train_steps": 10.0})
  fakes.write_sweep(root, record)
  got, read = collect.collect(root)
  assert {t.name for t in got.trunks} <= set(read)
  run = record.runs[-1]
  branch = record.ladder.point(record.point_key(run)).branch_step
  steps = [s for s, _ in read[run.name].curves["eval/loss"]]
  # The trunk's evaluations up to the branch step, then the run's own after it.
  assert steps[0] == 0 and steps[-1] == run.step and branch in steps
  assert [v for s, v in read[run.name].curves["eval/loss"] if s == branch] == [4.0]
  assert read[run.name].initial == {"eval/loss": 5.5}
  md = assemble.write_report(root).read_text()
  assert (root / "ladder.png").stat().st_size > 10_000
  assert "![loss against training compute per variant](ladder.png)" in md
  data = json.loads((root / "report.json").read_text())
  assert data["compute"]["trunks"]["runs"] == 24
  assert data["compute"]["total"]["runs"] == 48 + 24
  assert data["ladder"]["variants"][1]["multiplier"]["trend"]["label"] == "constant"
  assert "24 of the runs are trunks" in md


def test_a_tuned_ladder_reads_the_chosen_values_and_checks_the_transfer_along_its_rungs():
  rates = [2.0 ** u for u in (-11, -10, -9, -8, -7)]
  constant = planted_loss("constant")

  def loss(variant, c, seed):  # the optimum at 2^-9 at every size
    return constant(variant, c, seed) + 0.05 * (math.log2(variant["optim.learning_rate"]) + 9) ** 2

  record, summaries = fakes.ladder_sweep("tuned", RUNGS, BUDGETS, VARIANTS, loss,
                                         seeds=(0, 1, 2, 3),
                                         tune={"optim.learning_rate": rates})
  report = analyze(record, summaries)
  assert report.verdict_runs == "reserved"  # seed 0 chooses, seeds 1-3 are compared
  assert all(p.chosen == {"optim.learning_rate": 2.0 ** -9} for p in report.points)
  rows = report.ladder.rows
  assert all(sorted(r.losses) == [1, 2, 3] for r in rows)
  chosen = {e.name: e for e in record.runs if e.tuned == {"optim.learning_rate": 2.0 ** -9}}
  row = rows[0]
  assert row.losses == {e.seed: summaries[e.name].final["eval/loss"] for e in chosen.values()
                        if record.point_key(e) == row.key and e.seed != 0}
  # The transfer check (issue 52) runs along the rung axis, per budget and variant.
  assert len(report.transfer) == 2 * 2
  for t in report.transfer:
    assert t.size_field == "model.d_model" and [o.size for o in t.optima] == [32, 64, 128, 256]
    assert t.label == "transfers"
  assert report.ladder.variant("swiglu").multiplier.trend is not None


def test_one_seed_fits_without_intervals_and_leaves_the_trend_unresolved():
  record, summaries = fakes.ladder_sweep("one", RUNGS, BUDGETS, VARIANTS,
                                         planted_loss("constant"), seeds=(0,))
  ladder = analyze(record, summaries).ladder
  swiglu = ladder.variant("swiglu")
  assert swiglu.fit.identifiable and all(p.low is None for p in swiglu.fit.parameters)
  assert "one run per rung" in swiglu.fit.lack_of_fit.reason
  trend = swiglu.multiplier.trend
  assert trend.label == "unresolved" and trend.interval is None and "no interval" in trend.reason


def test_a_branched_run_finds_its_trunk_from_its_status_or_the_record(tmp_path):
  record, _ = fakes.ladder_sweep("b", RUNGS[:2], BUDGETS, VARIANTS, planted_loss("constant"),
                                 seeds=(0,), branch=True)
  run = record.runs[0]
  workdir, moved = tmp_path / run.name, tmp_path / "elsewhere"
  moved.mkdir()
  step = record.ladder.point(record.point_key(run)).branch_step
  # status.json's branch_from and branch_step (the trainer writes them) first ...
  written = types.SimpleNamespace(branch_from=str(moved), branch_step=7)
  assert collect.branch_of(workdir, run, written, record) == (moved, 7)
  # ... the record's trunk beside the run where that path is gone (a moved sweep) ...
  gone = types.SimpleNamespace(branch_from=str(tmp_path / "gone"), branch_step=7)
  assert collect.branch_of(workdir, run, gone, record) == (tmp_path / run.trunk, 7)
  # ... and the plan's branch step where status.json names none.
  assert collect.branch_of(workdir, run, None, record) == (tmp_path / run.trunk, step)
  scratch = dataclasses.replace(run, trunk="")
  assert collect.branch_of(workdir, scratch, None, record) is None


def _budget_preferences(share_tuning):
  """A tuned ladder of 2 rungs whose two budgets prefer different rates: budget 0
  the first, budget 1 the last, and the middle one the lowest on the mean of
  both; ``share_tuning``: as ``Ladder(share_tuning=...)`` records it."""
  rates = [2.0 ** -10, 2.0 ** -9, 2.0 ** -8]
  penalty = {0: (0.0, 0.02, 0.1), 1: (0.1, 0.03, 0.0)}
  rungs = RUNGS[:2]
  budget_of = {}
  for rung in rungs:
    n = fakes.ladder_counts(rung)[0]
    for b, tpp in enumerate(BUDGETS):
      budget_of[float(ladder_lib.steps_for(tpp, n, 256) * 256 * 6 * n)] = b
  constant = planted_loss("constant")

  def loss(variant, c, seed):
    rate = rates.index(variant["optim.learning_rate"])
    return constant(variant, c, seed) + penalty[budget_of[c]][rate]

  record, summaries = fakes.ladder_sweep("shared", rungs, BUDGETS, VARIANTS, loss,
                                         tune={"optim.learning_rate": rates})
  record = dataclasses.replace(record, ladder=dataclasses.replace(
      record.ladder, share_tuning=share_tuning))
  return record, summaries, rates


def _points(record, summaries):
  baselines = {name: schema.Baseline(UNIGRAM, math.log(256)) for name in summaries}
  return selection.analyze_points(record, summaries, baselines, schema.Options())


def test_shared_tuning_gives_every_budget_the_value_of_lowest_mean_score():
  record, summaries, rates = _budget_preferences(False)
  own = {p.key: p for p in _points(record, summaries)}
  # Each budget alone chooses its own rate.
  assert {p.chosen["optim.learning_rate"] for k, p in own.items() if k[1] == 0} == {rates[0]}
  assert {p.chosen["optim.learning_rate"] for k, p in own.items() if k[1] == 1} == {rates[2]}
  shared = {p.key: p for p in _points(dataclasses.replace(
      record, ladder=dataclasses.replace(record.ladder, share_tuning=True)), summaries)}
  assert set(shared) == set(own)
  for (rung, _, variant), point in shared.items():
    budgets = [own[rung, b, variant] for b in range(len(BUDGETS))]
    means = {}
    for row in budgets[0].tuned:
      scores = [next(r.selection_score for r in p.tuned if r.label == row.label)
                for p in budgets]
      means[row.label] = sum(s[0] for s in scores) / len(scores)
    assert point.chosen_label == min(means, key=means.get)
    assert point.chosen == {"optim.learning_rate": rates[1]}
    # Its rows and scores are its own; only the choice is the group's.
    assert point.tuned == own[point.key].tuned
    assert point.choice is None  # not its own best: no lead of its own


def test_shared_tuning_chooses_nothing_where_no_value_is_scored_at_every_budget():
  record, summaries, rates = _budget_preferences(True)
  # Rung 0, gelu: budget 0 learned at the first rate only, budget 1 at the last only.
  keep = {0: rates[0], 1: rates[2]}
  for e in record.runs:
    key = record.point_key(e)
    if key[0] == 0 and key[2] == 0 and e.tuned["optim.learning_rate"] != keep[key[1]]:
      summaries[e.name] = dataclasses.replace(summaries[e.name], state="diverged")
  points = {p.key: p for p in _points(record, summaries)}
  assert points[0, 0, 0].chosen is None and points[0, 1, 0].chosen is None
  assert all(p.chosen == {"optim.learning_rate": rates[1]} for k, p in points.items()
             if k[::2] != (0, 0))
  report = types.SimpleNamespace(points=list(points.values()))
  text = "\n".join(tuned_section.shared_lines(record, report))
  assert ("the budgets of each rung and variant share one tuned value, chosen by the "
          "lowest mean validation score over the budgets") in text
  assert ("No tuned value is scored at every budget of d_model=32,num_layers=2, gelu: "
          "nothing is chosen there.") in text
  assert tuned_section.shared_lines(dataclasses.replace(
      record, ladder=dataclasses.replace(record.ladder, share_tuning=False)), report) == []
