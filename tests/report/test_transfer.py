"""The transfer check: the optimum of a learning-rate curve (``report.optimum``)
recovered on synthetic curves with a known optimum and drift, its interval's
coverage over simulated sweeps, its refusals; the labels of planted sweeps
through the whole report (``sections.transfer``), its figure, and the claims
that read it (``report.claims_transfer``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fakes
from tfx_jax.core.errors import ConfigError
from tfx_jax.records.claims import Claim, Equivalent
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import assemble, claim_checks, optimum, schema
from tfx_jax.report import claims as claims_lib
from tfx_jax.report.sections import transfer as transfer_section
from tfx_jax.sweep import spec as spec_lib

RATES = [2.0 ** k for k in range(-14, -5)]  # 9 rates over 2.4 decades
CURVATURE = 0.05  # nats per (log2 rate)^2
UNIGRAM = 8.0


def _curve(u_star: float, seeds: int, noise: float, rng: np.random.Generator,
           rates=RATES) -> dict[int, list[float]]:
  """{seed: the loss at each rate}: a parabola in log2(rate) with its vertex
  at ``u_star``, a per-seed offset shared by the rates, iid noise per run."""
  u = np.log2(rates)
  return {s: list(3.0 + 0.05 * s + CURVATURE * (u - u_star) ** 2 + rng.normal(0, noise, len(u)))
          for s in range(seeds)}


# ------------------------------------------------------------- the optimum
def test_the_fit_recovers_a_known_optimum_between_grid_values():
  rng = np.random.default_rng(0)
  u_star = math.log2(5e-3)  # between 2^-8 and 2^-7
  fit = optimum.fit_optimum(RATES, _curve(u_star, 4, 0.002, rng))
  assert fit.fitted and fit.best == 2.0 ** -8
  assert fit.log2_lr == pytest.approx(u_star, abs=0.05)
  assert fit.low < u_star < fit.high and fit.df == 3
  assert fit.window == (2.0 ** -9, 2.0 ** -8, 2.0 ** -7)
  # Noise-free: the parabola through three points of a parabola is exact.
  exact = optimum.fit_optimum(RATES, _curve(u_star, 2, 0.0, rng))
  assert exact.log2_lr == pytest.approx(u_star, abs=1e-9)
  assert exact.se == pytest.approx(0.0, abs=1e-9)


def test_the_fit_recovers_a_known_drift():
  rng = np.random.default_rng(1)
  sizes = [32, 64, 128, 256]
  for drift in (-1.0, 0.0, 0.5):
    fits = [optimum.fit_optimum(RATES, _curve(-9.3 + drift * math.log2(s / 32), 4, 0.002, rng))
            for s in sizes]
    shift = optimum.fit_shift(sizes, fits, band=0.5)
    assert shift.slope == pytest.approx(drift, abs=0.05)
    assert shift.low < drift < shift.high and len(shift.seeds) == 4
    assert shift.label == ("transfers" if drift == 0.0 else "drifts")


@pytest.mark.parametrize("rates, u_star, reason", [
    (RATES[:2], -13.5, "2 learning rates: a fit needs at least 3"),
    (RATES, -15.0, "the grid's lowest rate"),
    (RATES, -5.0, "the grid's highest rate"),
])
def test_the_fit_refuses_the_grids_edge_and_fewer_than_3_values(rates, u_star, reason):
  fit = optimum.fit_optimum(rates, _curve(u_star, 2, 0.0, np.random.default_rng(2), rates))
  assert not fit.fitted and reason in fit.reason and fit.best is not None


def test_a_diverged_run_beside_the_best_is_no_value_to_fit():
  losses = _curve(-9.0, 2, 0.0, np.random.default_rng(3))
  losses[1][6] = math.inf  # 2^-8 diverged for seed 1
  losses[0][6] = math.inf
  fit = optimum.fit_optimum(RATES, losses)
  assert not fit.fitted and "no value at 0.00390625" in fit.reason
  # A run that did not finish drops its seed from the fit, not the fit.
  losses = _curve(-9.0, 3, 0.001, np.random.default_rng(3))
  losses[2][5] = None
  fit = optimum.fit_optimum(RATES, losses)
  assert fit.fitted and sorted(fit.influence) == [0, 1]


def test_a_fit_without_positive_curvature_is_refused():
  # Five rates, a window of two a side: a best inside the grid, on a concave fit.
  rates = RATES[:5]
  losses = {0: [3.0, 3.5, 2.9, 3.5, 3.0], 1: [3.0, 3.5, 2.9, 3.5, 3.0]}
  fit = optimum.fit_optimum(rates, losses, window=2)
  assert not fit.fitted and "curvature is not positive" in fit.reason


def test_fewer_than_2_fitted_sizes_give_no_shift():
  rng = np.random.default_rng(4)
  fits = [optimum.fit_optimum(RATES, _curve(-9.0, 2, 0.001, rng)),
          optimum.fit_optimum(RATES, _curve(-20.0, 2, 0.001, rng))]  # at the grid's edge
  shift = optimum.fit_shift([32, 64], fits, band=0.5)
  assert shift.slope is None and shift.label == "not fitted"
  assert "1 size with a fitted optimum" in shift.reason and shift.sizes == (32.0,)


@pytest.mark.parametrize("seeds", [2, 5])
def test_the_optimums_interval_covers_it_about_95_percent_of_the_time(seeds):
  """400 simulated curves (a true optimum at a random place between grid
  values, seed offsets, noise a fifth of the curve's rise over one grid
  step): the 95% interval holds the true optimum in 90-99% of them (a
  binomial 99.9% band around 0.95 is about 0.93-0.97; the delta method's
  linearisation may cost a little), with 2 seeds (t with 1 degree of
  freedom) as with 5."""
  rng = np.random.default_rng(20260 + seeds)
  hits = shift_hits = fitted = 0
  for _ in range(400):
    u_star = rng.uniform(-11.0, -7.0)
    fit = optimum.fit_optimum(RATES, _curve(u_star, seeds, 0.01, rng))
    if fit.fitted:
      fitted += 1
      hits += fit.low <= u_star <= fit.high
  assert fitted == 400
  assert 0.90 <= hits / fitted <= 0.99, hits / fitted
  # The shift's paired interval, over 200 simulated 3-size sweeps with a drift.
  for _ in range(200):
    base, drift = rng.uniform(-10.0, -8.0), rng.uniform(-0.6, 0.6)
    fits = [optimum.fit_optimum(RATES, _curve(base + drift * k, seeds, 0.01, rng))
            for k in range(3)]
    shift = optimum.fit_shift([32, 64, 128], fits, band=0.5)
    shift_hits += shift.low <= drift <= shift.high
  assert 0.90 <= shift_hits / 200 <= 0.99, shift_hits / 200


@pytest.mark.parametrize("low, high, label", [
    (-0.3, 0.2, "transfers"), (-1.2, -0.6, "drifts"), (0.1, 0.4, "transfers"),
    (-0.7, 0.2, "unresolved"), (None, None, "unresolved")])
def test_the_label_rule(low, high, label):
  assert optimum.label(low, high, 0.5)[0] == label


# ---------------------------------------------------------- planted sweeps
SIZES = ({"model.d_model": 32, "model.num_heads": 2}, {"model.d_model": 64, "model.num_heads": 4},
         {"model.d_model": 128, "model.num_heads": 4}, {"model.d_model": 256, "model.num_heads": 8})
# Per parametrization: the optimum's drift per doubling of d_model and the noise.
VARIANTS = {"sp": (-1.0, 0.003), "mup": (0.0, 0.003), "completep": (0.0, 0.6),
            "edge": (-2.5, 0.003)}


def _loss(variant: str, size: int, lr: float, seed: int, rng) -> float:
  drift, noise = VARIANTS[variant]
  doublings = math.log2(size / 32)
  u_star = -9.2 + drift * doublings
  return (3.0 - 0.2 * doublings + CURVATURE * (math.log2(lr) - u_star) ** 2 + 0.02 * seed
          + rng.normal(0, noise))


def _planted(variants=tuple(VARIANTS), sizes=SIZES, rates=RATES, seeds=(0, 1, 2, 3),
             claims=(), **fields):
  """(record, summaries) of a planted transfer sweep, in memory."""
  rng = np.random.default_rng(7)
  sweep = spec_lib.Sweep(name="transfer", config="configs/lm.py:tiny",
                         axes=[{"model.parametrization": list(variants)},
                               {k: [s[k] for s in sizes] for k in sizes[0]}],
                         tune={"optim.learning_rate": list(rates)}, seeds=list(seeds))
  _, runs = spec_lib.expand(sweep)
  entries, summaries = [], {}
  for run in runs:
    variant, size = run.values[0]["model.parametrization"], run.values[1]["model.d_model"]
    loss = _loss(variant, size, run.tuned["optim.learning_rate"], run.seed, rng)
    entries.append(fakes.entry(run.name, run.seed, run.values, run.overrides, run.tuned,
                               state="finished"))
    summaries[run.name] = fakes.summary({"eval/loss": loss}, step=30, num_params=size * 1000,
                                        initial={"eval/loss": UNIGRAM + 1})
  record = fakes.record("transfer", [fakes.axis("model.parametrization", list(variants)),
                                     fakes.axis("model.d_model+model.num_heads", sizes)],
                        entries, seeds, tune={"optim.learning_rate": list(rates)},
                        claims=tuple(claims), **fields)
  return record, summaries


def _analyze(record, summaries) -> schema.Report:
  baselines = {name: schema.Baseline(UNIGRAM, math.log(1024)) for name in summaries}
  return assemble.analyze(record, summaries, baselines)


@pytest.fixture(scope="module")
def planted():
  record, summaries = _planted()
  return record, summaries, _analyze(record, summaries)


def test_each_variant_gets_its_label_from_the_whole_report(planted):
  _, _, report = planted
  found = {t.variant["model.parametrization"]: t for t in report.transfer}
  assert set(found) == set(VARIANTS)
  sp, mup, noisy, edge = (found[v] for v in ("sp", "mup", "completep", "edge"))
  assert sp.label == "drifts" and sp.shift == pytest.approx(-1.0, abs=0.05) and sp.high < 0
  assert mup.label == "transfers" and abs(mup.shift) < 0.05 and -0.5 < mup.low < mup.high < 0.5
  assert noisy.label == "unresolved" and noisy.low < 0 < noisy.high
  assert edge.label == "drifts" and edge.shift == pytest.approx(-2.5, abs=0.1)
  # At 128 and 256 the edge variant's optimum lies below the grid: said, and left out.
  assert [o.learning_rate is None for o in edge.optima] == [False, False, True, True]
  assert "the grid's lowest rate" in edge.optima[2].reason
  assert sp.band == pytest.approx(0.5) and sp.size_field == "model.d_model"
  assert [o.size for o in sp.optima] == [32, 64, 128, 256] and sp.seeds == 4
  o = mup.optima[0]
  assert o.low < o.learning_rate < o.high and o.learning_rate == pytest.approx(2 ** -9.2, rel=0.05)


def test_the_band_is_the_sweeps_own(planted):
  record, summaries, _ = planted
  tight = SweepRecord.from_json({**record.to_json(), "transfer_band": 1.01})
  assert "transfer_band" in tight.to_json() and "transfer_band" not in record.to_json()
  report = _analyze(tight, summaries)
  mup = next(t for t in report.transfer if t.variant["model.parametrization"] == "mup")
  assert mup.band == pytest.approx(math.log2(1.01))
  assert mup.label == "unresolved"  # its interval reaches beyond +-0.014, holds 0


def test_report_json_keeps_the_transfer_and_reads_it_back(planted):
  record, summaries, report = planted
  data = json.loads(json.dumps(report.to_json()))
  assert len(data["transfer"]) == 4
  assert set(data["transfer"][0]) >= {"size_axis", "size_field", "variant", "optima", "shift",
                                      "low", "high", "band", "label"}
  assert schema.Report.from_json(data).transfer == report.transfer
  # A sweep with no size axis writes no transfer key at all.
  untuned = schema.Report.from_json({k: v for k, v in data.items() if k != "transfer"})
  assert untuned.transfer == () and "transfer" not in untuned.to_json()


def test_the_markdown_has_a_table_per_variant_and_the_shift_line(planted):
  record, summaries, report = planted
  from tfx_jax.report.context import Context
  ctx = Context(record, summaries, report.baselines, report.options)
  md = "\n".join(transfer_section.markdown(ctx, report, {"transfer:": "transfer.png"}))
  assert "## Learning-rate transfer" in md and "delta method" in md
  assert md.count("| d_model | optimum learning rate [95% interval] |") == 4
  assert "**drifts**" in md and "**transfers**" in md and "**unresolved**" in md
  assert "not fitted: the best is the grid's lowest rate" in md
  assert "![loss against learning rate per size](transfer.png)" in md


def test_the_report_on_disk_writes_the_figure(tmp_path):
  record, summaries = _planted(variants=("sp", "mup"), sizes=SIZES[:3], rates=RATES[2:8],
                               seeds=(0, 1))
  root = tmp_path / "transfer"
  for entry in record.runs:
    fakes.write_run(root / entry.name, {30: {"eval/loss": summaries[entry.name].final["eval/loss"]}},
                    num_params=summaries[entry.name].num_params)
  fakes.write_sweep(root, record)
  md = assemble.write_report(root).read_text()
  assert (root / "transfer.png").stat().st_size > 10_000
  assert "![loss against learning rate per size](transfer.png)" in md
  data = json.loads((root / "report.json").read_text())
  assert [t["label"] for t in data["transfer"]] == ["drifts", "transfers"]


def test_no_transfer_check_without_a_size_axis_or_a_tuned_learning_rate():
  record, summaries = _planted(variants=("sp", "mup"), sizes=SIZES[:1], seeds=(0, 1))
  assert _analyze(record, summaries).transfer == ()


# ------------------------------------------------------------------ claims
def _claim(cid, compare, metric, expect, context=None):
  return Claim(cid, "Yang et al. 2022", "the optimum", compare=compare, metric=metric,
               expect=expect, context=context)


TRANSFER_CLAIMS = (
    _claim("sp_drifts", ("sp", None), "transfer/shift", "lower"),
    _claim("mup_stays", ({"model.parametrization": "mup"}, None), "transfer/shift",
           Equivalent(0.5)),
    _claim("mup_wider_better", ({"model.d_model": 256}, {"model.d_model": 32}),
           "every_rate/eval/loss", "lower", {"model.parametrization": "mup"}),
    _claim("sp_wider_better", ({"model.d_model": 256}, {"model.d_model": 32}),
           "every_rate/eval/loss", "lower", {"model.parametrization": "sp"}),
    _claim("noisy_rises", ("completep", None), "transfer/shift", "higher"),
)


def test_the_transfer_claims_get_the_expected_labels():
  record, summaries = _planted(claims=TRANSFER_CLAIMS)
  claim_checks.check_sweep(record)
  report = _analyze(record, summaries)
  found = {r.id: r for r in claims_lib.evaluate(record.claims, report)}
  assert found["sp_drifts"].label == "reproduced"
  assert found["sp_drifts"].estimate == pytest.approx(-1.0, abs=0.05)
  assert found["sp_drifts"].point_a == "sp" and found["sp_drifts"].band == pytest.approx(0.5)
  assert found["mup_stays"].label == "reproduced" and found["mup_stays"].family == 5
  # muP: the widest is lower at every rate; SP: at the highest rates the
  # widest is worse (its optimum fell below them), resolved against.
  wider = found["mup_wider_better"]
  assert wider.label == "reproduced" and wider.estimate < -0.5
  assert "intersection-union over the rates" in wider.design
  assert found["sp_wider_better"].label == "not reproduced"
  assert found["sp_wider_better"].estimate > 0
  # The noisy variant's shift, +0.02 [-0.58, +0.62]: unresolved, on the claim's side.
  assert found["noisy_rises"].label == "in direction" and found["noisy_rises"].p > 0.5


def test_the_every_rate_test_rests_on_its_weakest_rate(planted):
  """The intersection-union p is the largest one-sided p over the rates,
  doubled as the family's two-sided p; that rate's difference is the estimate."""
  _, _, report = planted
  claim = _claim("w", ({"model.d_model": 256}, {"model.d_model": 32}), "every_rate/eval/loss",
                 "lower", {"model.parametrization": "mup"})
  values = [p.values for p in report.points]
  a = report.points[claims_lib.find_point(claim.compare[0], claim.context, values, "w")]
  b = report.points[claims_lib.find_point(claim.compare[1], claim.context, values, "w")]
  test = claims_lib.test_claim(claim, report, a, b)
  from tfx_jax.report import stats
  per_rate = []
  for ra in a.tuned:
    rb = next(r for r in b.tuned if r.tuned == ra.tuned)
    iv = stats.compare({s: r.validation["eval/loss"] for s, r in ra.seeds.items()},
                       {s: r.validation["eval/loss"] for s, r in rb.seeds.items()})
    per_rate.append((stats.t_sf(-iv.diff / iv.se, iv.df), iv))
  worst_p, worst = max(per_rate, key=lambda r: r[0])
  assert test.interval.diff == pytest.approx(worst.diff)
  assert test.p == pytest.approx(2 * worst_p)
  assert test.seeds == 4


@pytest.mark.parametrize("claim, message", [
    (_claim("x", ("sp", None), "transfer/shift/num_layers", "lower"), "names the size field"),
    (_claim("x", ({"model.d_model": 32}, None), "transfer/shift", "lower"),
     "no axis of the sweep sets 'model.d_model'"),
    (_claim("x", ("adam", None), "transfer/shift", "lower"), "names no point"),
    (_claim("x", ("sp", "mup"), "every_rate/eval/lost", "lower",
            {"model.d_model": 32}), "every_rate/eval/loss"),
])
def test_the_dry_run_checks_the_transfer_claims(claim, message):
  record, _ = _planted(variants=("sp", "mup"), sizes=SIZES[:2], seeds=(0,), claims=(claim,))
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    claim_checks.check_sweep(record)


def test_a_transfer_claim_needs_a_size_axis_and_a_tuned_learning_rate():
  claim = _claim("x", ("sp", None), "transfer/shift", "lower")
  record, _ = _planted(variants=("sp", "mup"), sizes=SIZES[:1], seeds=(0,), claims=(claim,))
  with pytest.raises(ConfigError, match="a size axis"):
    claim_checks.check_sweep(record)
  with pytest.raises(ConfigError, match="compare=\\(point, None\\)"):
    _claim("x", ("sp", "mup"), "transfer/shift", "lower")


TRANSFER_SWEEP = """
from tfx_jax.sweep import Claim, Equivalent, Sweep
def get_sweep(variant="default"):
  return Sweep(name="exp", config="configs/lm.py:tiny",
               axes=[{{"model.activation": ["gelu", "swiglu"]}},
                     {{"model.d_model": [32, 64], "model.num_heads": [2, 4]}}],
               tune={{"optim.learning_rate": [1e-3, 3e-3, 1e-2]}}, transfer_band={band},
               claims=[Claim("x", "P", "s", compare=({spec!r}, None), metric="transfer/shift",
                             expect=Equivalent(0.5))])
"""


@pytest.mark.parametrize("band, spec, code, message", [
    ("2 ** 0.5", "gelu", 0, ""),
    ("1.0", "gelu", 2, "transfer_band=1.0: the factor per doubling"),
    ("2 ** 0.5", "relu", 2, "'relu' names no point"),
])
def test_the_band_and_the_claims_are_checked_at_dry_run(tmp_path, capsys, band, spec, code,
                                                        message):
  from helpers import sweep_in_process  # pylint: disable=import-outside-toplevel
  file = tmp_path / "exp.py"
  file.write_text(TRANSFER_SWEEP.format(band=band, spec=spec))
  got, _, err = sweep_in_process([file, "--workdir", tmp_path / "runs", "--dry-run"], capsys)
  assert got == code and message in err, err
