"""``--until-resolved`` keeps its promise: at most alpha false verdicts over
many simulated sweeps, through the real adaptive loop and the real report.

Each simulated sweep has two points (``x=a``, the base, and ``x=b``) and the
declared seeds; per seed, each point's loss is planted as a run summary (as
``collect`` would read it) with Gaussian seed noise. The loop is the one
``python -m tfx_jax.sweep --until-resolved MAX_SEEDS`` runs: ``analysis.
analyze`` on the summaries, then ``adaptive.add_seeds`` on the ``SweepRecord``,
then the added seeds' summaries, until nothing is added. The last report's
verdict is the sweep's.

Two procedures on the same draws: the sequential test (the record keeps
MAX_SEEDS, as the sweep command records it: ``SweepRecord.until_resolved``),
and the procedure it replaced, fixed-alpha re-testing: the fixed-seed
analysis read after every seed added, which is what a record without
``until_resolved`` gets (the sweep command never writes one for
``--until-resolved``; only this test builds it).

A rate is "at most alpha" when its one-sided 95% Clopper-Pearson upper
bound is, and "above alpha" when its lower bound is. The numbers of sweeps
come from the rates (the same procedures re-computed with NumPy over 40,000
to 200,000 draws): under the null, first look 4 seeds, MAX_SEEDS 8, the
sequential test's rate is 0.031 (the union bound is conservative) and the
old procedure's 0.12; at the margin, first look 2, MAX_SEEDS 8, 0.025 and
0.11. The sweeps below put each bound about two standard errors clear of
alpha in expectation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

import fakes
from helpers import sweep_in_process
from tfx_jax.report import assemble, collect, context, schema, stats, stats_sequential
from tfx_jax.report.sections import verdicts as verdicts_section
from tfx_jax.report.schema import Baseline, Options
from tfx_jax.sweep import adaptive
from tfx_jax.records.sweep import SweepRecord

ALPHA = Options().alpha
MARGIN = 0.01  # the equivalence margin of a loss (context.DEFAULT_MARGINS)
POINTS = ("a", "b")  # a is the base


def _record(declared: int, until_resolved: int | None) -> SweepRecord:
  runs = [fakes.entry(f"x-{p}_s{seed}", seed, [{"x": p}], {"x": p, "seed": seed})
          for p in POINTS for seed in range(declared)]
  return fakes.record("sim", [fakes.axis("x", POINTS)], runs, range(declared),
                      until_resolved=until_resolved)


def _sweep(losses: np.ndarray, declared: int, max_seeds: int, sequential: bool):
  """One sweep's final comparison; ``losses[i, seed]`` is point i's loss at a seed."""
  record = _record(declared, max_seeds if sequential else None)
  while True:
    summaries = {e.name: fakes.summary({"eval/loss": float(losses[POINTS.index(
                     e.values[0]["x"]), e.seed])}, lengths={}, num_params=1000)
                 for e in record.runs}
    report = assemble.analyze(record, summaries,
                              {name: Baseline(None, None) for name in summaries})
    if not adaptive.add_seeds(record, report, max_seeds):
      (row,) = report.comparisons
      return row, report


def _rates(draws: np.ndarray, declared: int, max_seeds: int, wrong: set[str],
           old_sweeps: int):
  """{procedure: (false verdicts, sweeps, looks of the sequential rows)}: the
  sequential test on every draw, the old procedure on the first ``old_sweeps``
  (its rate is far from alpha: fewer sweeps show it)."""
  out = {}
  for sequential in (False, True):
    verdicts, looks = [], []
    for losses in draws if sequential else draws[:old_sweeps]:
      row, report = _sweep(losses, declared, max_seeds, sequential)
      verdicts.append(row.verdict)
      if sequential:
        assert report.sequential is not None and row.look is not None
        assert (row.look.looks, report.sequential.max_seeds) == (
            max_seeds - declared + 1, max_seeds)
        looks.append(row.look.look)
      else:
        assert report.sequential is None and row.look is None
    out["sequential" if sequential else "fixed"] = (
        sum(v in wrong for v in verdicts), len(verdicts), looks)
  return out


def _upper(k: int, n: int) -> float:
  """The one-sided 95% Clopper-Pearson upper bound of a rate k / n."""
  return 1.0 if k == n else float(scipy_stats.beta.ppf(0.95, k + 1, n - k))


def _lower(k: int, n: int) -> float:
  return 0.0 if k == 0 else float(scipy_stats.beta.ppf(0.05, k, n - k + 1))


def _draws(seed: int, sweeps: int, seeds: int, diff: float, sd: float) -> np.ndarray:
  """[sweep, point, seed] losses: a seed effect shared by both points (the
  pairing cancels it), plus each run's own noise of sd / sqrt(2), so that
  the per-seed differences b - a are N(diff, sd^2)."""
  rng = np.random.default_rng(seed)
  shared = rng.normal(0.0, 0.05, (sweeps, 1, seeds))
  own = rng.normal(0.0, sd / np.sqrt(2.0), (sweeps, 2, seeds))
  return 3.0 + shared + own + np.array([0.0, diff])[None, :, None]


@pytest.mark.slow
def test_false_better_or_worse_verdicts_stay_below_alpha_under_the_null():
  """Two points with the same distribution, 4 declared seeds, --until-resolved
  8 (5 looks). The noise (sd 0.05 of the per-seed differences) is wide against
  the 0.01 margin, so equivalence never ends a sweep: each stops at a
  difference verdict or at the budget."""
  draws = _draws(seed=0, sweeps=1200, seeds=8, diff=0.0, sd=0.05)
  rates = _rates(draws, declared=4, max_seeds=8, wrong={"better", "worse"},
                 old_sweeps=400)
  k_new, n, looks = rates["sequential"]
  k_old, n_old, _ = rates["fixed"]
  print(f"false better/worse: fixed-alpha re-testing {k_old}/{n_old} = "
        f"{k_old / n_old:.3f} (lower bound {_lower(k_old, n_old):.3f}); sequential "
        f"{k_new}/{n} = {k_new / n:.3f} (upper bound {_upper(k_new, n):.3f})")
  assert _lower(k_old, n_old) > ALPHA  # the old procedure breaks its promise
  assert _upper(k_new, n) <= ALPHA  # the sequential test keeps it
  # The loop ran: most sweeps went on to the last look, some stopped early.
  assert looks.count(5) > n / 2 and min(looks) < 5


@pytest.mark.slow
def test_false_equivalent_verdicts_stay_below_alpha_at_a_difference_of_the_margin():
  """The points differ by exactly the margin (b worse by 0.01 nats), per-seed
  differences with sd 0.01: equivalence is just false, and a worse verdict
  (true) ends many sweeps. 2 declared seeds, --until-resolved 8 (7 looks)."""
  draws = _draws(seed=1, sweeps=550, seeds=8, diff=MARGIN, sd=MARGIN)
  rates = _rates(draws, declared=2, max_seeds=8, wrong={"equivalent"}, old_sweeps=550)
  k_new, n, _ = rates["sequential"]
  k_old, n_old, _ = rates["fixed"]
  print(f"false equivalent: fixed-alpha re-testing {k_old}/{n_old} = "
        f"{k_old / n_old:.3f} (lower bound {_lower(k_old, n_old):.3f}); sequential "
        f"{k_new}/{n} = {k_new / n:.3f} (upper bound {_upper(k_new, n):.3f})")
  assert _lower(k_old, n_old) > ALPHA
  assert _upper(k_new, n) <= ALPHA


@pytest.mark.parametrize("declared,max_seeds", [(1, 2), (3, 3)])
def test_the_design_counts_its_looks_from_the_seeds_of_the_first(declared, max_seeds):
  """One declared seed: the first look has no test, the second spends all of
  alpha; a budget no larger than the declared seeds: one look, the fixed test."""
  record = _record(declared, max_seeds)
  design = context.sequential_design(record)
  assert (design.first, design.last, design.looks) == (declared, max_seeds,
                                                      max_seeds - declared + 1)
  assert sum(design.share(k) for k in range(1, design.looks + 1)) == pytest.approx(1.0)
  assert design.share(design.looks) == (1.0 if declared < 2 or design.looks == 1 else
                                        pytest.approx(1 - ((max_seeds - 1) / max_seeds) ** 3))


def test_a_confirmed_sweep_counts_its_looks_in_confirmation_seeds():
  """--seeds 0 --confirm 3 --until-resolved 5: the first look reads
  confirmation seeds 1-3, and seeds 4 and 5 make looks 2 and 3."""
  record = fakes.record("c", [fakes.axis("x", POINTS)], [], [0], confirm=3,
                        tune={"optim.learning_rate": [1e-3, 1e-2]}, until_resolved=5)
  assert context.first_look_seeds(record) == {1, 2, 3}
  design = context.sequential_design(record)
  assert (design.first, design.last, design.looks) == (3, 5, 3)


# ------------------------------------------------------------- the report's account
NORMS = ("post", "pre")  # post is the base


def _plant(root, losses: dict[str, list[float]], running: set[str] = frozenset(),
           written_before=(), **record):
  """A finished untuned sweep on disk: declared seeds 0-2, seed 3 added by
  --until-resolved 4 (runs named in ``running`` not finished yet);
  ``written_before``: sweep.json as a version before those keys wrote it."""
  runs, added = [], []
  for norm in NORMS:
    for seed, loss in enumerate(losses[norm]):
      name = f"norm_position-{norm}_s{seed}"
      runs.append(fakes.entry(name, seed, [{"model.norm_position": norm}],
                              {"model.norm_position": norm, "seed": seed}))
      if seed == 3:
        added.append({"name": name, "seed": 3, "like": f"norm_position-{norm}_s0"})
      fakes.write_run(root / name, {30: {"eval/loss": loss,
                                         "eval/perplexity": float(np.exp(loss))}},
                      state="running" if name in running else "finished", step=30,
                      num_params=1000)
  record = {"added": added, **record}
  return fakes.write_sweep(root, fakes.record(
      root.name, [fakes.axis("model.norm_position", NORMS)], runs, [0, 1, 2], **record),
      written_before)


LOSSES = {"post": [3.00, 3.10, 3.20, 3.05], "pre": [3.05, 3.16, 3.24, 3.11]}


def test_the_report_names_the_sequential_test_and_each_comparisons_look(tmp_path):
  """pre is worse than post by 0.04-0.06 on every seed; with seed 3 the
  comparison is at look 2 of 2 (3 declared seeds, --until-resolved 4), whose
  tests spend 1 - (3/4)^3 of alpha."""
  root = _plant(tmp_path / "seq", LOSSES, until_resolved=4)
  assemble.write_report(root)
  data = json.loads((root / "report.json").read_text())
  text = (root / "report.md").read_text()
  assert data["sequential"] == {
      "method": stats_sequential.SEQUENTIAL_METHOD,
      "reference": stats_sequential.SEQUENTIAL_REFERENCE,
      "max_seeds": 4, "first": 3, "last": 4, "looks": 2, "rho": 3.0}
  (row,) = [c for c in data["comparisons"] if c["metric"] == "eval/loss"]
  share = 1 - (3 / 4) ** 3
  assert row["look"]["look"] == 2 and row["look"]["looks"] == 2
  assert row["look"]["share"] == pytest.approx(share)
  assert row["level"] == pytest.approx(1 - ALPHA * share) and row["n"] == 4
  # TensorBoard's event files keep float32 scalars.
  d = np.float32(LOSSES["pre"]).astype(float) - np.float32(LOSSES["post"]).astype(float)
  p = scipy_stats.ttest_1samp(d, 0.0).pvalue
  assert row["p_adjusted"] == pytest.approx(p / share) and row["verdict"] == "worse"
  assert "4 seeds paired; sequential, look 2 of 2; adjusted p" in row["text"]
  assert row["design"].endswith(f"(paired, {row['split']} split); sequential: "
                                f"{stats_sequential.SEQUENTIAL_METHOD}, look 2 of 2")
  assert f"- {row['text']}" in text
  assert stats_sequential.SEQUENTIAL_METHOD in text
  assert stats_sequential.SEQUENTIAL_REFERENCE in text
  assert "`--until-resolved 4`: 2 looks, from 3 to 4 seeds" in text
  assert "| paired, look 2 of 2 | 4 |" in text
  assert json.loads(json.dumps(schema.Report.from_json(data).to_json())) == data
  # The noise table's detectable difference is the look's test's too.
  (noise,) = data["noise"]
  assert noise["min_detectable_difference"] == pytest.approx(
      stats.min_detectable_difference(float(np.std(d, ddof=1)), 4, True, ALPHA * share))
  # Seed 3 of pre still running: both sides have not finished it, look 1.
  root = _plant(tmp_path / "half", LOSSES, running={"norm_position-pre_s3"},
                until_resolved=4)
  assemble.write_report(root)
  (row,) = [c for c in json.loads((root / "report.json").read_text())["comparisons"]
            if c["metric"] == "eval/loss"]
  assert (row["look"]["look"], row["n"]) == (1, 3)
  assert row["level"] == pytest.approx(1 - ALPHA * (3 / 4) ** 3)


def test_a_sweep_json_from_before_reads_its_budget_from_its_command(tmp_path):
  """sweep.json written before the budget was kept: the command's
  --until-resolved, else the most seeds a point reached, else none."""
  root = _plant(tmp_path / "old", LOSSES, written_before=["until_resolved"],
                command="python -m tfx_jax.sweep --config c --until-resolved 6")
  record, _ = collect.collect(root)
  assert record.until_resolved == 6
  assert context.sequential_design(record).looks == 4
  root = _plant(tmp_path / "old2", LOSSES, written_before=["until_resolved"],
                command="python -m tfx_jax.sweep --config c")
  assert collect.collect(root)[0].until_resolved == 4  # seeds were added all the same
  # No seed added, no flag: a fixed-seed sweep, tested once by the ordinary paired t.
  root = _plant(tmp_path / "fixed", {n: v[:3] for n, v in LOSSES.items()},
                written_before=["until_resolved"], command="python -m tfx_jax.sweep --config c",
                added=[])
  record, summaries = collect.collect(root)
  assert record.until_resolved is None and context.sequential_design(record) is None
  report = assemble.analyze(record, summaries,
                            {name: Baseline(None, None) for name in summaries})
  assert report.sequential is None and report.comparisons[0].look is None
  assert report.comparisons[0].interval.level == 0.95


def test_a_different_budget_on_a_sweep_that_kept_one_is_refused(tmp_path, capsys):
  """sweep.json kept --until-resolved 4: 6 is exit 2; 4, or no flag, runs."""
  sweep_dir = tmp_path / "runs" / "budget"
  sweep_dir.mkdir(parents=True)
  (sweep_dir / "sweep.json").write_text(json.dumps({
      "name": "budget", "config": "configs/lm.py:tiny", "seeds": [0], "axes": [],
      "runs": [], "until_resolved": 4}))
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.norm_position=post,pre",
          "--name", "budget", "--workdir", tmp_path / "runs", "--dry-run"]
  code, _, err = sweep_in_process([*args, "--until-resolved", "6"], capsys)
  assert code == 2
  assert "this sweep's seeds are added up to 4 (--until-resolved 4, in sweep.json)" in err
  for same in (["--until-resolved", "4"], []):
    assert sweep_in_process([*args, *same], capsys)[0] == 0


def test_an_unresolved_comparison_says_the_seeds_a_sequential_design_would_need():
  """4 declared seeds, --until-resolved 5, differences 0.03, -0.01, 0.04, 0,
  0.02: unresolved at look 2 of 2; the seeds needed are those of a design
  from 4 seeds whose last look alone has 80% power at its share of alpha."""
  a = np.array([3.00, 3.10, 3.20, 3.05, 3.15])
  d = np.array([0.03, -0.01, 0.04, 0.00, 0.02])
  row, _ = _sweep(np.stack([a, a + d]), declared=4, max_seeds=5, sequential=True)
  assert row.verdict == "unresolved" and (row.look.look, row.look.looks) == (2, 2)
  sd = float(np.std(d, ddof=1))
  want = stats_sequential.sequential_seeds_needed(float(np.mean(d)), sd, 4, ALPHA)
  assert row.seeds_needed == want and want > 5
  assert (f"about {want} seeds paired would detect a difference of this size, as the "
          "last look of a sequential design from 4 (this sweep's last look has 5)"
          ) in verdicts_section.verdict_text(_record(4, 5), row)


def test_until_resolved_declared_after_a_fixed_report_warns(tmp_path, capsys):
  """The sweep's report already tested it at the full alpha: adding seeds now
  is a look the design did not plan, and the command says so."""
  root = _plant(tmp_path / "runs" / "late", {n: v[:3] for n, v in LOSSES.items()})
  assemble.write_report(root)
  args = ["--config", "configs/lm.py:tiny", "--axis", "model.norm_position=post,pre",
          "--seeds", "0-2", "--name", "late", "--workdir", tmp_path / "runs", "--dry-run"]
  code, _, err = sweep_in_process([*args, "--until-resolved", "4"], capsys)
  assert code == 0 and "already tested this sweep's comparisons at the full alpha" in err
  assert "warning" not in sweep_in_process(args, capsys)[2]
