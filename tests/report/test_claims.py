"""Claims: the checks a declaration passes at --dry-run, and the quantity a
claim reads from a committed report."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from tfx_jax.records.claims import Claim
from tfx_jax.report import claims
from tfx_jax.report.schema import Report
from helpers import ROOT, sweep_in_process

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

FIGURE3 = "layer_profile/init_grad_norm/ffn_out/decoder"


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
  report = Report.from_json(data)
  profile = next(p for p in data["layer_profiles"]
                 if p["point"] == "post, 120" and p["stack"] == "decoder")
  claim = Claim("grows", "Xiong et al. 2020", "post-LN's W2 gradient grows",
                compare=({"model.norm_position": "post"}, None), metric=FIGURE3,
                expect="higher", context={"optim.warmup_steps": 120})
  (result,) = claims.evaluate([claim], report)
  assert result.label != "not tested here", result.reason
  assert result.estimate == pytest.approx(profile["log_ratio"]["diff"])
  assert math.exp(result.estimate) == pytest.approx(profile["ratio"])
