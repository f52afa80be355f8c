"""Claims as code: the label rule, the one family, preconditions, regimes,
the declaration's errors at --dry-run, and relabelling a committed report."""

from __future__ import annotations

import json
import math
import shutil
import textwrap

import pytest

import fakes
from helpers import ROOT, sweep_in_process
from tfx_jax.core.errors import ConfigError
from tfx_jax.records import serial
from tfx_jax.records import sweep as sweep_lib
from tfx_jax.records.claims import Claim, Equivalent, Regime, Requires
from tfx_jax.report import assemble
from tfx_jax.report import claims as claims_lib
from tfx_jax.report import schema

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

UNIGRAM = 6.0
FIGURE3 = "layer_profile/init_grad_norm/ffn_out/decoder"


# ------------------------------------------------------------- the rule
@pytest.mark.parametrize("expect, estimate, resolved, equivalent, label", [
    ("lower", -0.1, True, False, "reproduced"),
    ("lower", +0.1, True, False, "not reproduced"),     # resolved against
    ("lower", -0.001, False, True, "not reproduced"),   # equivalent within the band
    ("lower", -0.1, False, False, "in direction"),
    ("lower", +0.1, False, False, "inconclusive"),
    ("higher", +0.1, True, False, "reproduced"),
    ("higher", -0.1, True, False, "not reproduced"),
    ("higher", +0.1, False, False, "in direction"),
    ("higher", -0.1, False, False, "inconclusive"),
    (Equivalent(0.05), 0.01, False, True, "reproduced"),
    (Equivalent(0.05), 0.2, True, False, "not reproduced"),   # resolved, outside the band
    (Equivalent(0.05), 0.03, True, False, "in direction"),    # resolved but inside the band
    (Equivalent(0.05), 0.03, False, False, "in direction"),
    (Equivalent(0.05), 0.2, False, False, "inconclusive"),
])
def test_the_label_rule(expect, estimate, resolved, equivalent, label):
  assert claims_lib.label(expect, estimate, resolved, equivalent, 0.05)[0] == label


# ------------------------------------------------------ a planted sweep
# Test loss per seed of three points. b - a: -0.045 on average, sd 0.023 over
# 4 seeds: t = 3.9, p = 0.03, resolved alone and not after Holm over 3.
LOSSES = {"a": [3.00, 3.10, 3.20, 3.05],
          "b": [2.935, 3.075, 3.135, 3.025],
          "c": [2.96, 3.08, 3.15, 3.04]}


def _planted(claims, losses=LOSSES, seeds=(0, 1, 2, 3), training=None):
  runs, summaries = [], {}
  for value, per_seed in losses.items():
    for seed, loss in zip(seeds, per_seed):
      name = f"v-{value}_s{seed}"
      runs.append(fakes.entry(name, seed, [{"model.activation": value}], state="finished"))
      summaries[name] = fakes.summary(
          {"eval/loss": loss + 0.1}, test={"eval/loss": loss}, num_params=200_000,
          training=(training or {}).get((value, seed), {}), step=30,
          curves={"eval/loss": [(10, loss + 0.5), (30, loss + 0.1)]})
  record = fakes.record("planted", [fakes.axis("model.activation", list(losses))], runs,
                        seeds, report_split="test", claims=tuple(claims))
  baselines = {name: schema.Baseline(UNIGRAM, math.log(1024)) for name in summaries}
  report = assemble.analyze(record, summaries, baselines)
  return claims_lib.evaluate(record.claims, report), report


def _claim(cid, a, b, expect="lower", **kw):
  return Claim(cid, "Paper 2020", f"{a} beats {b}", compare=(a, b), metric="eval/loss",
               expect=expect, **kw)


def test_a_claim_family_turns_a_resolved_difference_unresolved():
  alone, _ = _planted([_claim("b_beats_a", "b", "a")])
  assert alone[0].label == "reproduced" and alone[0].family == 1
  assert alone[0].p_adjusted == pytest.approx(alone[0].p)
  # The same test in a family of three: Holm multiplies its p by up to 3.
  family, _ = _planted([_claim("b_beats_a", "b", "a"), _claim("c_beats_a", "c", "a"),
                        _claim("c_beats_b", "c", "b")])
  first = family[0]
  assert first.p == pytest.approx(alone[0].p) and first.family == 3
  assert first.p < 0.05 <= first.p_adjusted
  assert first.label == "in direction"
  assert "Holm over the 3 claims" in first.design


def test_an_unmet_precondition_is_not_tested_here_with_its_reason():
  needs = Requires("a", "some run of a had its output log Z above 20",
                   metric="training/output_log_z_max", above=20.0)
  rows, _ = _planted([_claim("b_beats_a", "b", "a", requires=needs)])
  assert rows[0].label == "not tested here"
  assert "output log Z above 20" in rows[0].reason and rows[0].p is None
  assert rows[0].descriptive.startswith("-0.045")  # shown, not labelled
  # Met by one run of a: tested.
  ran_away = {("a", 2): {"output_log_z_max": 31.0}}
  rows, _ = _planted([_claim("b_beats_a", "b", "a", requires=needs)], training=ran_away)
  assert rows[0].label == "reproduced"


def test_a_design_outside_the_papers_regime_keeps_its_label_marked():
  regime = Regime(params=(1.3e8, 1.2e9), text="ran 130M-1.2B parameters")
  rows, _ = _planted([_claim("b_beats_a", "b", "a", regime=regime)])
  assert rows[0].label == "reproduced" and not rows[0].counts
  assert "outside the paper's regime" in rows[0].outside_regime
  assert "130M-1.2B" in rows[0].outside_regime and "200k parameters" in rows[0].outside_regime


def test_an_equivalence_claim_reads_tost():
  rows, _ = _planted([_claim("b_level_a", "b", "a", expect=Equivalent(0.2))])
  assert rows[0].label == "reproduced" and rows[0].p_equivalence_adjusted < 0.05
  rows, _ = _planted([_claim("b_level_a_tight", "b", "a", expect=Equivalent(0.001))])
  assert rows[0].label == "not reproduced"  # resolved, -0.045 outside +-0.001


def test_a_sensitivity_from_one_run_per_rate_is_not_tested_here():
  report = schema.Report.from_json(json.loads(
      (ROOT / "docs/results/stability/report.json").read_text()))
  claim = Claim("sens", "Wortsman et al. 2023", "qk-layernorm lowers the sensitivity",
                compare=({"model.qk_norm": "layernorm"}, {"model.qk_norm": "none"}),
                metric="sensitivity", expect="lower",
                context={"model.d_model": 64, "train.z_loss": 0})
  row, = claims_lib.evaluate([claim], report)
  assert row.label == "not tested here" and "one run per rate" in row.reason
  assert row.descriptive == "sensitivity 0.155 against 0.592"


def test_a_length_effect_is_read_relative_to_the_training_length():
  report = schema.Report.from_json(json.loads(
      (ROOT / "docs/results/positions/report.json").read_text()))
  absolute = Claim("abs", "Press et al. 2022", "sinusoidal behind RoPE at 8x",
                   compare=("sinusoidal", "rope"), metric="ppl@8x", expect="higher")
  relative = dataclasses_replace(absolute, id="rel", metric="ppl@8x/1x")
  rows = claims_lib.evaluate([absolute, relative], report)
  assert rows[0].estimate > 0  # 8x includes the gap already there at 1x
  assert rows[1].estimate == pytest.approx(-0.0349, abs=5e-4)  # relative: none beyond it
  assert rows[1].label == "inconclusive"


def dataclasses_replace(claim, **changes):
  import dataclasses  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(claim, **changes)


# --------------------------------------------------------- declaration
def test_claims_round_trip_through_sweep_json_and_are_absent_without_any(tmp_path):
  claim = _claim("b_level_a", "b", {"model.activation": "a"}, expect=Equivalent(0.01),
                 regime=Regime(converged=True, text="at convergence"),
                 requires=Requires("a", "the base stopped improving", converged=True))
  record = fakes.record("rt", [fakes.axis("model.activation", ["a", "b"])], [], [0],
                        claims=(claim,))
  assert sweep_lib.SweepRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
  assert "claims" not in fakes.record("none", [], [], [0]).to_json()


@pytest.mark.parametrize("claim, message", [
    ("Claim('x', 'P', 's', compare=('alibix', 'rope'), metric='eval/loss', expect='lower')",
     "'alibix' names no point"),
    ("Claim('x', 'P', 's', compare=({'model.norm': 'x'}, 'rope'), metric='eval/loss', "
     "expect='lower')", "no axis of the sweep sets 'model.norm'"),
    ("Claim('x', 'P', 's', compare=('alibi', 'rope'), metric='ppl@16x', expect='lower')",
     "do not log 'ppl@16x'"),
    ("Claim('x', 'P', 's', compare=('alibi', 'rope'), metric='eval/loss', "
     "expect=Equivalent(0))", "the band is a number > 0"),
    ("Claim('x', 'P', 's', compare=('alibi', 'rope'), metric='eval/loss', expect='better')",
     "expect is 'lower', 'higher' or Equivalent"),
])
def test_a_bad_claim_exits_2_at_dry_run(tmp_path, capsys, claim, message):
  file = tmp_path / "exp.py"
  file.write_text(textwrap.dedent(f"""
      from tfx_jax.sweep import Claim, Equivalent, Sweep
      def get_sweep(variant="default"):
        return Sweep(name="exp", config="configs/lm.py:tiny",
                     axes=[{{"model.position": ["rope", "alibi"]}}],
                     evaluations=[["--lengths", "1x,2x"]],
                     claims=[{claim}])
  """))
  code, _, err = sweep_in_process([file, "--workdir", tmp_path / "runs", "--dry-run"],
                                  capsys)
  assert code == 2 and message in err, err
  assert not (tmp_path / "runs").exists()


def test_claim_ids_repeat_is_an_error():
  with pytest.raises(ConfigError, match="claim ids repeat"):
    from tfx_jax.records.claims import check_all  # pylint: disable=import-outside-toplevel
    check_all([_claim("x", "b", "a"), _claim("x", "c", "a")])


# ------------------------------------------------------------ relabel
def test_relabel_labels_a_committed_report_from_its_report_json(tmp_path, capsys):
  report_dir = tmp_path / "positions"
  shutil.copytree(ROOT / "docs/results/positions", report_dir)
  before = json.loads((report_dir / "report.json").read_text())
  before.pop("claims", None)
  code, out, _ = sweep_in_process([ROOT / "experiments/positions.py", "--relabel", report_dir],
                                  capsys)
  assert code == 0, out
  data = json.loads((report_dir / "report.json").read_text())
  rows = {c["id"]: c for c in data.pop("claims")}
  assert data == before  # every other key as it was
  assert rows["alibi_8x"]["label"] == "reproduced"
  assert rows["sinusoidal_8x"]["label"] == "inconclusive"
  assert {c["family"] for c in rows.values()} == {len(rows)}
  text = (report_dir / "report.md").read_text()
  assert text.count("<!-- claims -->") == 1 and "`alibi_8x`" in text
  # Relabelling again replaces the block: the same files.
  code, _, _ = sweep_in_process([ROOT / "experiments/positions.py", "--relabel", report_dir],
                                capsys)
  assert code == 0 and (report_dir / "report.md").read_text() == text
  assert [serial.to_json(r) for r in claims_lib.evaluate(
      [], schema.Report.from_json(data))] == []


def test_a_stale_confirmation_is_not_tested_here():
  report = schema.Report.from_json(json.loads(
      (ROOT / "docs/results/optimizers/report.json").read_text()))
  muon = {"optim.optimizer": "muon"}
  claim = Claim("muon_ahead_64", "Wen et al. 2025", "Muon ahead of AdamW",
                compare=(muon, {"optim.optimizer": "adamw", "train.num_steps": 400}),
                metric="eval/loss", expect="lower", context={"model.d_model": 64})
  row, = claims_lib.evaluate([claim], report)
  assert row.label == "not tested here"
  assert "stale: it ran at learning_rate=0.01, adam_learning_rate_ratio=3" in row.reason
  assert "now chooses learning_rate=0.01, adam_learning_rate_ratio=10" in row.reason
  fresh, = claims_lib.evaluate([dataclasses_replace(
      claim, context={"model.d_model": 128})], report)
  assert fresh.label == "reproduced"


# ------------------------------------------------------- layer profiles


def _experiment(tmp_path, overrides: dict) -> str:
  file = tmp_path / "exp.py"
  file.write_text(textwrap.dedent(f"""
      from tfx_jax.sweep import Claim, Sweep
      def get_sweep(variant="default"):
        return Sweep(name="exp", config="configs/lm.py:tiny",
                     overrides={{"train.num_steps": 20, **{overrides!r}}},
                     axes=[{{"model.norm_position": ["post", "pre"]}}], seeds=[0, 1],
                     claims=[Claim("grows", "Xiong et al. 2020", "post-LN's W2 gradient grows",
                                   compare=("post", None), metric={FIGURE3!r},
                                   expect="higher")])
  """))
  return str(file)


def test_a_layer_profile_of_the_initial_gradients_is_a_quantity_the_sweep_logs(tmp_path, capsys):
  # The statistic holds a slash (init_grad_norm/ffn_out), and the gradients
  # at initialisation are logged without train.log_layer_stats.
  at_init = {"train.layer_stats_param": "ffn_out", "train.layer_stats_init_batches": 2}
  code, out, err = sweep_in_process(
      [_experiment(tmp_path, at_init), "--workdir", tmp_path / "runs", "--dry-run"], capsys)
  assert code == 0, out + err
  code, out, err = sweep_in_process(
      [_experiment(tmp_path, {}), "--workdir", tmp_path / "runs", "--dry-run"], capsys)
  assert code == 2
  assert "do not log" in out + err and FIGURE3 in out + err


def test_a_layer_profile_claim_reads_the_profile_its_statistic_names():
  data = json.loads((ROOT / "docs/results/norm_placement/report.json").read_text())
  report = schema.Report.from_json(data)
  profile = next(p for p in data["layer_profiles"]
                 if p["point"] == "post, 120" and p["stack"] == "decoder")
  claim = Claim("grows", "Xiong et al. 2020", "post-LN's W2 gradient grows",
                compare=({"model.norm_position": "post"}, None), metric=FIGURE3,
                expect="higher", context={"optim.warmup_steps": 120})
  (result,) = claims_lib.evaluate([claim], report)
  assert result.label != "not tested here", result.reason
  assert result.estimate == pytest.approx(profile["log_ratio"]["diff"])
  assert math.exp(result.estimate) == pytest.approx(profile["ratio"])
