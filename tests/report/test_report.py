"""The sweep report on event files written by the test with known values.

A synthetic 2x2 sweep (norm_position pre/post x position rope/alibi, 3 seeds,
one post/alibi seed diverged) is laid out as the runner leaves it: sweep.json,
status.json, TensorBoard event files, an extrapolation result. The report's
aggregates, paired and Welch intervals are checked against hand-computed
values (Student t quantiles from printed tables).

The plots: every figure report.md references exists, and the report renders
with warnings as errors, for sweeps with one seed, with a failed run, with a
size axis and with a single point; the drawn figures have titles, labelled
axes, plain tick labels and one colour per axis value; the headline forest
plot's rows, intervals and verdict markers are checked on what it draws
(``forest.forest_panels``), not on pixels.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import statistics
import typing
import warnings

import matplotlib.colors
import matplotlib.pyplot
import pytest

from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as records
from tfx_jax.report import assemble, forest, schema, stats, stats_sequential, style
from tfx_jax.report.sections import comparisons as comparisons_section
from tfx_jax.report.sections import sequential as sequential_section
from tfx_jax.report.sections import speedup as speedup_section
from tfx_jax.report.sections import verdicts
from tfx_jax.records.sweep import SweepRecord

import fakes
from helpers import ROOT

# eval/loss per (norm_position, position) and seed; None: the run diverged.
LOSSES = {
    ("pre", "rope"): [1.0, 1.2, 1.1],
    ("post", "rope"): [1.5, 1.6, 1.7],
    ("pre", "alibi"): [1.0, 1.1, 1.2],
    ("post", "alibi"): [1.3, None, 1.5],
}
# Gradient norm per decoder layer at the first logged step (then 10x later).
LAYER_GRAD = {"pre": [1.0, 1.0], "post": [0.5, 2.0]}
T_975_DF4 = 2.776445  # Student t, 0.975 quantile, 4 degrees of freedom (tables)
T_975_DF2 = 4.302653


def write_run(root, name, seed, loss, *, state=None, layer_grad=(1.0, 1.0), lengths=None,
              num_params=None, scaled=None, layer_steps=(1, 10), loss_se=None, **status):
  """One run's workdir as the trainer leaves it: training-loss and
  layer-gradient event files, eval/loss at step 30 (``loss`` None: the run
  stopped at step 12, ``state`` "diverged" unless given) with its standard
  error ``loss_se`` (None: not logged), status.json (``status``: its other
  fields), an extrapolation result ``lengths`` ({multiple: perplexity})."""
  scalars = []
  for step, tps in ((10, 100.0), (20, 1000.0), (30, 3000.0)):
    if loss is None and step > 12:
      break
    scalars.append((step, {"train/loss": 3.0 - step / 100 + seed / 10,
                           "train/tokens_per_sec": tps}))
  for step, scale in zip(layer_steps, (1.0, 10.0)):
    scalars.append((step, {f"layer_stats/grad_norm/decoder_{i:02d}": g * scale
                           for i, g in enumerate(layer_grad)}))
  if loss is not None:
    scalars.append((15, {"eval/loss": 9.0}))  # an earlier evaluation
    scalars.append((30, {"eval/loss": loss, "eval/perplexity": math.exp(loss),
                         **({} if loss_se is None else {"eval/loss_se": loss_se})}))
  if num_params is not None:
    status["num_params"] = num_params
  if loss is None:
    workdir = fakes.write_run(root / name, scalars, state=state or "diverged", step=12,
                              reason="non-finite loss", **status)
  else:
    workdir = fakes.write_run(root / name, scalars, state=state or "finished", step=30,
                              **status)
  if lengths and loss is not None:
    fakes.write_lengths(workdir, 30, lengths)
  for tag, table in (scaled or {}).items():  # evaluate --lengths --rope_scaling
    for step, offset in ((20, 100.0), (30, 0.0)):  # the newest step is read
      fakes.write_lengths(workdir, step, {k: ppl + offset for k, ppl in table.items()},
                          scaling=tag)


def sweep_record(name, axes, runs, seeds, **fields):
  """sweep.json's record of a synthetic sweep."""
  return fakes.record(name, axes, runs, seeds, overrides={"train.num_steps": 30},
                      command=f"python -m tfx_jax.sweep experiments/{name}.py", **fields)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("report") / "synthetic"
  runs = []
  for (norm, pos), losses in LOSSES.items():
    for seed, loss in enumerate(losses):
      name = f"norm_position-{norm}_position-{pos}_s{seed}"
      write_run(root, name, seed, loss, layer_grad=LAYER_GRAD[norm],
                lengths={1: 10.0 + seed, 2: 20.0 if pos == "rope" else 10.0},
                scaled=({"yarn-x2-from64": {1: 11.0, 2: 12.0 + seed / 10}} if pos == "rope"
                        else None))
      runs.append(fakes.entry(name, seed,
                              [{"model.norm_position": norm}, {"model.position": pos}],
                              state="finished", wall_seconds=60.0 + seed))
  record = sweep_record("synthetic", [fakes.axis("model.norm_position", ["pre", "post"]),
                                      fakes.axis("model.position", ["rope", "alibi"])],
                        runs, seeds=[0, 1, 2])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  return root


def test_layer_statistics_logged_later_are_not_called_initialisation(tmp_path):
  """Runs made without the step-1 log (older runs): the section names the step
  it read instead of claiming the initial parameters."""
  root = tmp_path / "later"
  runs = []
  for norm in ("pre", "post"):
    for seed in (0, 1):
      name = f"norm_position-{norm}_s{seed}"
      write_run(root, name, seed, 1.0 + seed / 10, layer_grad=LAYER_GRAD[norm],
                layer_steps=(10, 20))
      runs.append(fakes.entry(name, seed, [{"model.norm_position": norm}], state="finished",
                              wall_seconds=60.0))
  record = sweep_record("later", [fakes.axis("model.norm_position", ["pre", "post"])], runs,
                        seeds=[0, 1])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  report = (root / "report.md").read_text()
  assert "## Gradient norm per layer at the first logged step" in report
  assert "at initialisation\n" not in report and "step 10, after that many updates" in report
  assert "| post | 0.5 ± 0 | 2 ± 0 |" in report  # the seeds agree: an interval of width 0


def test_layer_statistics_at_initialisation_are_read_at_step_0(tmp_path):
  """Runs with train.layer_stats_init_batches: the section and the plot read
  the step-0 means of layer_stats/init_grad_norm/<param>/..., not the
  statistics logged during training (here at steps 10 and 20); report.json
  has each point's profile and its last-over-first trend, tested by seed,
  a profile equal to an earlier one on every seed tested once."""
  root = tmp_path / "init"
  init = {"pre": [1.0, 0.5], "post": [0.5, 2.0], "sandwich": [0.5, 2.0]}  # falls, grows
  runs = []
  for norm in init:
    for seed in (0, 1, 2):
      name = f"norm_position-{norm}_s{seed}"
      write_run(root, name, seed, 1.0 + seed / 10, layer_grad=(7.0, 7.0),
                layer_steps=(10, 20))
      fakes.log(root / name, {0: {f"layer_stats/init_grad_norm/ffn_out/decoder_{i:02d}":
                                  g + seed / 10 for i, g in enumerate(init[norm])}})
      runs.append(fakes.entry(name, seed, [{"model.norm_position": norm}], state="finished",
                              wall_seconds=60.0))
  record = sweep_record("init", [fakes.axis("model.norm_position", list(init))], runs,
                        seeds=[0, 1, 2])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  report = (root / "report.md").read_text()
  assert "## Gradient norm per layer at initialisation\n" in report
  assert "`layer_stats/init_grad_norm/ffn_out/<stack>_<layer>`" in report
  assert "step 0, at the initial parameters" in report
  # Mean over the 3 seeds ± the 95% t-interval's half-width: for values g,
  # g + 0.1 and g + 0.2, t(0.975, 2) * 0.1 / sqrt(3) = 0.248.
  assert "| post | 0.6 ± 0.25 | 2.1 ± 0.25 |" in report
  assert "| pre | 1.1 ± 0.25 | 0.6 ± 0.25 |" in report
  assert (root / "layers.png").stat().st_size > 5000
  # The trend: ln(last / first) per seed, its paired t interval, Holm over
  # the two profiles, reported as the ratio.
  profiles = json.loads((root / "report.json").read_text())["layer_profiles"]
  assert [(p["point"], p["stack"], p["statistic"]) for p in profiles] == [
      (norm, "decoder", "init_grad_norm/ffn_out") for norm in init]
  raw = []
  for p, (first, last) in zip(profiles, init.values()):
    logs = [math.log((last + s / 10) / (first + s / 10)) for s in (0, 1, 2)]
    mean, sd = sum(logs) / 3, statistics.stdev(logs)
    half = T_975_DF2 * sd / math.sqrt(3)
    assert p["seeds"] == [0, 1, 2]
    assert p["means"] == pytest.approx([first + 0.1, last + 0.1])
    assert p["half_widths"] == pytest.approx([T_975_DF2 * 0.1 / math.sqrt(3)] * 2)
    assert (p["ratio"], p["ratio_low"], p["ratio_high"]) == pytest.approx(
        (math.exp(mean), math.exp(mean - half), math.exp(mean + half)), rel=1e-6)
    raw.append(p["log_ratio"]["p"])
  # sandwich's values are post's on every seed: one test, Holm over two.
  assert [p["p_adjusted"] for p in profiles] == stats.holm(raw[:2]) + [profiles[1]["p_adjusted"]]
  assert [p["trend"] for p in profiles] == ["falls", "grows", "grows"]
  assert [p["same_as"] for p in profiles] == [None, None, "post"]
  assert "**grows** (equal to post's: tested once)" in report
  assert "| post | decoder | 2 | 3 | 0.6 | 2.1 | 3.53 [" in report
  read = schema.Report.from_json(json.loads((root / "report.json").read_text()))
  assert read.layer_profiles[1].trend == "grows" and read.layer_profiles[1].means[1] == (
      pytest.approx(2.1))


def test_output_log_z_and_attention_logits_are_reported_per_run(tmp_path):
  """A sweep about stability (runs that log attention logits): report.json
  keeps each run's output log Z (first, last, min, max over the logged
  steps) and its largest attention logit (over the run, at the last step),
  non-finite values left out; report.md tables their means per point."""
  root = tmp_path / "stability"
  runs = []
  for qk in ("none", "layernorm"):
    for seed in (0, 1):
      name = f"qk_norm-{qk}_s{seed}"
      diverged = qk == "none" and seed == 1
      write_run(root, name, seed, None if diverged else 1.0 + seed / 10)
      growth = 10.0 if qk == "none" else 1.0
      fakes.log(root / name, {
          step: {"train/output_log_z": math.nan if diverged and step == 30 else log_z,
                 "layer_stats/max_attention_logit/decoder_00": growth * step,
                 "layer_stats/max_attention_logit/decoder_01": step}
          for step, log_z in ((10, 6.9), (20, 7.5 + seed), (30, 7.0 + seed))})
      runs.append(fakes.entry(name, seed, [{"model.qk_norm": qk}],
                              state="diverged" if diverged else "finished", wall_seconds=60.0))
  record = sweep_record("stability", [fakes.axis("model.qk_norm", ["none", "layernorm"])], runs,
                        seeds=[0, 1])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  data = json.loads((root / "report.json").read_text())
  seeds = {p["values"]["model.qk_norm"]: p["tuned"][0]["seeds"] for p in data["points"]}
  assert seeds["none"]["0"]["training"] == pytest.approx({  # float32 in event files
      "output_log_z_first": 6.9, "output_log_z_last": 7.0, "output_log_z_min": 6.9,
      "output_log_z_max": 7.5, "max_attention_logit": 300.0,
      "max_attention_logit_last": 300.0})
  # The diverged run: its log Z up to the divergence (step 30's NaN left out).
  diverged = seeds["none"]["1"]["training"]
  assert (diverged["output_log_z_last"], diverged["output_log_z_max"]) == (8.5, 8.5)
  assert seeds["layernorm"]["1"]["training"]["max_attention_logit"] == 30.0
  report = (root / "report.md").read_text()
  assert "## Output log Z and attention logits" in report
  # Means over the 2 runs: last log Z 7.0 and 8.5, largest logits 300 both.
  assert "| none | - | 2 | 6.9 | 7.75 | 6.9 | 8 | 300 | 300 |" in report
  assert "| layernorm | - | 2 | 6.9 | 7.5 | 6.9 | 8 | 30 | 30 |" in report


def test_welch_interval_matches_hand_computation():
  iv = stats.welch_interval([1.5, 1.6, 1.7], [1.0, 1.2, 1.1])
  half = T_975_DF4 * math.sqrt(0.01 / 3 + 0.01 / 3)
  assert iv.df == pytest.approx(4.0)
  assert (iv.diff, iv.low, iv.high) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
  assert iv.excludes_zero()
  # Unequal sizes and variances: Welch-Satterthwaite degrees of freedom.
  a, b = [2.0, 4.0, 6.0], [1.0, 1.5, 2.0]  # variances 4 and 0.25
  va, vb = 4 / 3, 0.25 / 3
  df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
  iv = stats.welch_interval(a, b)
  assert iv.df == pytest.approx(df)
  assert stats.t_quantile(0.975, 2) == pytest.approx(T_975_DF2, abs=1e-6)
  assert stats.t_quantile(0.975, 4) == pytest.approx(T_975_DF4, abs=1e-6)
  assert not stats.welch_interval([1.0], [1.0, 2.0]).known
  assert stats.mean_std([1.0, 1.2, 1.1]) == pytest.approx((1.1, 0.1))


def test_points_table_counts_outcomes_and_aggregates_over_seeds(sweep_dir):
  report = (sweep_dir / "report.md").read_text()
  assert "| pre | rope | 3 | 3 | 0 | 0 | 1.1000 ± 0.1000 |" in report
  assert "| post | rope | 3 | 3 | 0 | 0 | 1.6000 ± 0.1000 |" in report
  # The diverged seed is counted, not averaged: mean of 1.3 and 1.5.
  assert "| post | alibi | 3 | 2 | 0 | 1 | 1.4000 ± 0.1414 |" in report
  # tokens/s: median after the first interval (compilation) = 2000.
  assert "| 2,000 |" in report
  assert "python -m tfx_jax.sweep experiments/synthetic.py" in report


def test_comparisons_are_paired_where_the_seeds_match_and_welch_otherwise(sweep_dir):
  data = json.loads((sweep_dir / "report.json").read_text())
  rows = {(r["axis"], r["context"], r["value"], r["metric"]): r for r in data["comparisons"]}
  # post - pre with position=rope: the same three seeds, per-seed differences
  # 0.5, 0.4, 0.6: paired t with 2 degrees of freedom.
  r = r_rope = rows[("model.norm_position", "position=rope", "post", "eval/loss")]
  half = T_975_DF2 * 0.1 / math.sqrt(3)
  assert r["method"] == "paired" and r["n"] == 3 and r["df"] == pytest.approx(2)
  assert (r["diff"], r["low"], r["high"]) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
  # Significant alone (t = 8.66, p = 0.013), but not after Holm over the
  # report's family of comparisons: three seeds cannot decide it.
  assert r["p"] == pytest.approx(2 * stats.scipy_stats.t.sf(0.5 / (0.1 / math.sqrt(3)), 2))
  assert r["p"] < 0.05 < r["p_adjusted"] and r["verdict"] == "unresolved"
  # How many paired seeds would detect a difference this size (sd 0.1 of the
  # per-seed differences) at 80% power with the family's Bonferroni alpha: the
  # planning figure in the verdict; more than the 3 seeds that did not.
  family = len(data["comparisons"])
  assert r["seeds_needed"] == stats.seeds_needed(0.5, 0.1, True, 0.05 / family) > 3
  # post/alibi lost seed 1: Welch on 2 against 3 values.
  r = rows[("model.norm_position", "position=alibi", "post", "eval/loss")]
  assert r["method"] == "welch" and (r["n"], r["n_base"]) == (2, 3)
  iv = stats.welch_interval([1.3, 1.5], [1.0, 1.1, 1.2])
  assert (r["low"], r["high"]) == pytest.approx((iv.low, iv.high))
  # alibi - rope with norm_position=pre: per-seed differences 0, -0.1, +0.1:
  # no effect, but three seeds cannot show equivalence within 0.01 nats.
  r = rows[("model.position", "norm_position=pre", "alibi", "eval/loss")]
  assert r["method"] == "paired"
  assert (r["diff"], r["high"]) == pytest.approx((0.0, half), abs=1e-6)  # a 7-digit table t
  assert r["verdict"] == "unresolved"
  # ppl@1x: 10 + seed on both sides: an exact 0, equivalent.
  r = rows[("model.position", "norm_position=pre", "alibi", "ppl@1x")]
  assert r["diff"] == pytest.approx(0.0) and r["verdict"] == "equivalent"
  # ppl@2x: rope 20, alibi 10 in every seed: an exact difference, an effect.
  r = rows[("model.position", "norm_position=pre", "alibi", "ppl@2x")]
  assert r["diff"] == pytest.approx(-10.0) and r["verdict"] == "better"
  # Holm over the whole report: the adjusted p-values are those of the family.
  adjusted = stats.holm([row["p"] for row in data["comparisons"]])
  assert [row["p_adjusted"] for row in data["comparisons"]] == adjusted
  report = (sweep_dir / "report.md").read_text()
  assert report.index("## Verdicts") < report.index("## Points")
  assert "- post vs pre (position=rope): unresolved (difference +0.500 nats)" in report
  assert (f"about {r_rope['seeds_needed']} seeds paired would detect a difference of this "
          "size") in report
  assert "3 seeds paired" in report and "2 vs 3 seeds, unpaired (Welch)" in report


def test_extrapolation_layer_stats_csv_and_plots(sweep_dir):
  report = (sweep_dir / "report.md").read_text()
  assert "## Length extrapolation" in report
  assert "## Noise floor and power" in report
  assert "## Gradient norm per layer at initialisation" in report
  assert "## Output log Z" not in report  # neither attention logits nor z-loss
  assert "| post | rope | 0.5 ± 0 | 2 ± 0 |" in report
  # RoPE evaluated with YaRN: a row of its own under the plain one.
  assert "| pre | rope | as trained | 11.00 ± 1.00 | 20.00 ± 0.00 |" in report
  assert "| pre | rope | yarn-x2-from64 | 11.00 ± 0.00 | 12.10 ± 0.10 |" in report
  assert "| pre | alibi | as trained |" in report and "| pre | alibi | yarn" not in report
  # ... and tested against as trained, the same runs paired by seed, Holm over
  # those rows alone: at 2x 12 + seed/10 against 20, at 1x 11 against 10 + seed.
  effects = json.loads((sweep_dir / "report.json").read_text())["evaluation_effects"]
  assert [(e["point"], e["metric"]) for e in effects] == [
      ("pre, rope", "ppl@1x"), ("pre, rope", "ppl@2x"),
      ("post, rope", "ppl@1x"), ("post, rope", "ppl@2x")]
  at1, at2 = effects[0], effects[1]
  assert at1["evaluation"] == "yarn-x2-from64" and at1["seeds"] == [0, 1, 2]
  assert at1["diff"] == pytest.approx(0.0) and at1["verdict"] == "unresolved"
  half = 4.302653 * 0.1 / 3 ** 0.5  # t(0.975, 2 df) x sd / sqrt(n)
  assert at2["diff"] == pytest.approx(-7.9)
  assert (at2["low"], at2["high"]) == pytest.approx((-7.9 - half, -7.9 + half))
  assert at2["verdict"] == "better"
  assert [e["p_adjusted"] for e in effects] == stats.holm([e["p"] for e in effects])
  assert ("| pre, rope | yarn-x2-from64 | ppl@2x | 3 | -7.90 [-8.15, -7.65] |"
          in report)
  assert "| pre | alibi | 1 ± 0 | 1 ± 0 |" in report
  rows = list(csv.DictReader(open(sweep_dir / "report.csv")))
  assert len(rows) == 12
  diverged = [r for r in rows if r["state"] == "diverged"]
  assert [r["run"] for r in diverged] == ["norm_position-post_position-alibi_s1"]
  first = rows[0]
  assert first["model.norm_position"] == "pre" and first["model.position"] == "rope"
  assert float(first["eval/loss"]) == pytest.approx(1.0)
  assert float(first["ppl@2x"]) == pytest.approx(20.0)
  for png in ("curves_model.norm_position.png", "curves_model.position.png",
              "lengths.png", "layers.png"):
    assert (sweep_dir / png).stat().st_size > 5000, png
    assert f"]({png})" in report


def test_report_command(sweep_dir, capsys):
  from tfx_jax.report.__main__ import main
  assert main([str(sweep_dir)]) == 0
  assert "# Sweep `synthetic`" in capsys.readouterr().out
  assert main([str(sweep_dir / "missing")]) == 2


# ------------------------------------------------------------ plots and figure
def _one_seed_sweep(root):
  """post vs pre (base), learning rate tuned over two values, one seed."""
  runs = []
  for norm, losses in (("post", (2.6, 2.4)), ("pre", (2.5, 2.3))):
    for lr, loss in zip((1e-3, 1e-2), losses):
      name = f"norm_position-{norm}_learning_rate-{lr!r}_s0"
      write_run(root, name, 0, loss)
      runs.append(fakes.entry(name, 0, [{"model.norm_position": norm}],
                              tuned={"optim.learning_rate": lr}, state="finished"))
  return sweep_record("one_seed", [fakes.axis("model.norm_position", ["post", "pre"], 1)], runs,
                      seeds=[0], tune={"optim.learning_rate": [1e-3, 1e-2]},
                      select_by="eval/loss", report_split="validation")


def _failed_run_sweep(root):
  """relu vs swiglu, two seeds; one swiglu run failed (a crash, not a
  divergence) after 12 steps, one relu run diverged."""
  runs = []
  for act, losses in (("relu", (2.0, None)), ("swiglu", (1.9, None))):
    for seed, loss in enumerate(losses):
      name = f"activation-{act}_s{seed}"
      write_run(root, name, seed, loss, state="failed" if act == "swiglu" and loss is None
                else None)
      runs.append(fakes.entry(name, seed, [{"model.activation": act}], state="finished"))
  runs.append(fakes.entry("activation-relu_s2", 2, [{"model.activation": "relu"}],
                          state="pending"))
  return sweep_record("failed_run", [fakes.axis("model.activation", ["relu", "swiglu"])], runs,
                      seeds=[0, 1, 2])


def _size_axis_sweep(root):
  """A zipped d_model/num_heads axis (two sizes) times gelu vs swiglu, three
  seeds, extrapolation results: the effects against the parameter count."""
  sizes = [{"model.d_model": 32, "model.num_heads": 2},
           {"model.d_model": 64, "model.num_heads": 4}]
  runs = []
  for si, size in enumerate(sizes):
    for act in ("gelu", "swiglu"):
      for seed in range(3):
        name = f"d_model-{size['model.d_model']}_activation-{act}_s{seed}"
        loss = 3.0 - 0.5 * si - (0.05 + 0.05 * si) * (act == "swiglu") + 0.01 * seed
        write_run(root, name, seed, loss, num_params=200_000 * 4 ** si,
                  lengths={1: 20.0 - si, 2: 30.0 + seed, 4: 300.0}, layer_grad=[1.0] * (2 + si))
        runs.append(fakes.entry(name, seed, [size, {"model.activation": act}],
                                state="finished"))
  size_axis = fakes.axis("model.d_model+model.num_heads", sizes)
  return sweep_record("size_axis", [size_axis, fakes.axis("model.activation", ["gelu", "swiglu"])],
                      runs, seeds=[0, 1, 2])


def _single_point_sweep(root):
  """No axis: the base config, two seeds. Nothing to compare."""
  runs = []
  for seed, loss in enumerate((2.0, 2.1)):
    write_run(root, f"base_s{seed}", seed, loss)
    runs.append(fakes.entry(f"base_s{seed}", seed, state="finished"))
  return sweep_record("single_point", [], runs, seeds=[0, 1])


def _per_point_sweep(root):
  """The optimizer sweep below (per-point grids, AdamW at three lengths), two
  seeds, on disk: seed 0 chooses, seed 1 is compared (no test split)."""
  record, summaries = _optimizer_sweep(seeds=(0, 1))
  for entry in record.runs:
    write_run(root, entry.name, entry.seed, summaries[entry.name].final["eval/loss"])
  return dataclasses.replace(record, report_split="validation", evaluations=())


SWEEPS = {"one_seed": _one_seed_sweep, "failed_run": _failed_run_sweep,
          "size_axis": _size_axis_sweep, "single_point": _single_point_sweep,
          "per_point": _per_point_sweep}


def _write(root, make):
  fakes.write_sweep(root, make(root))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # matplotlib's, numpy's, anyone's
    assemble.write_report(root)
  return (root / "report.md").read_text()


@pytest.mark.parametrize("kind", sorted(SWEEPS))
def test_every_plot_the_report_references_exists_and_renders_without_warnings(
    tmp_path, kind):
  root = tmp_path / kind
  report = _write(root, SWEEPS[kind])
  images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
  for name in images:
    assert (root / name).stat().st_size > 5000, name
  data = json.loads((root / "report.json").read_text())
  verdicts = report.index("## Verdicts")
  if data["comparisons"]:
    # The headline figure comes first, before the verdicts in words.
    assert images[0] == "forest.png"
    assert report.index("](forest.png)") < report.index("\n- ", verdicts)
  else:
    assert "forest.png" not in images and not (root / "forest.png").exists()
    assert "the sweep has a single point" in report[verdicts:report.index("Reproduce")]
  expected = {"one_seed": {"forest.png", "curves_model.norm_position.png",
                           "sensitivity_optim.learning_rate_model.norm_position.png"},
              "failed_run": {"forest.png", "curves_model.activation.png"},
              "size_axis": {"forest.png", "scale.png", "lengths.png", "layers.png",
                            "curves_model.d_model+model.num_heads.png",
                            "curves_model.activation.png"},
              "single_point": {"layers.png"},
              "per_point": {"forest.png", "curves_optimizer.png",
                            "sensitivity_optim.learning_rate_optimizer.png",
                            "sensitivity_optim.adam_learning_rate_ratio_optimizer.png"},
              }[kind]
  assert expected <= set(images), set(images)
  if kind == "per_point":
    assert "| - | muon | 100 |" in report and "3.00x (one seed: no interval)" in report
    assert "`optim.learning_rate` in [0.0001, 0.0003] where optimizer=lion" in report


def _drawn_figures(monkeypatch, root, make):
  """Every figure the report draws, rendered (tick labels are set at draw time)."""
  figures = []
  def keep(plt, fig, path, drawn):
    if drawn:
      fig.canvas.draw()
      figures.append((path.name, fig))
    else:
      plt.close(fig)
    return drawn
  monkeypatch.setattr(style, "save", keep)
  _write(root, make)
  return figures


@pytest.mark.slow
def test_plots_read_without_decoding(tmp_path, monkeypatch):
  """Titles name the plot (never "-"), every axis is labelled, tick labels
  are plain numbers (no offsets, no powers of ten), and an axis value has
  one colour in every plot of a report (its base near-black)."""
  colours: dict[str, set] = {}
  plots: dict[str, set] = {}
  for kind, make in SWEEPS.items():
    for name, fig in _drawn_figures(monkeypatch, tmp_path / kind, make):
      for ax in fig.axes:
        if not ax.get_visible() or not ax.get_yticklabels():
          continue
        title = ax.get_title() or ax.get_title(loc="left")
        if ax.get_xlabel():  # a twin axis (the forest's numbers) has neither
          assert title and title.strip() != "-", name
          assert ax.get_ylabel() or name == "forest.png", name
        for axis in (ax.xaxis, ax.yaxis):
          assert axis.get_offset_text().get_text() == "", name
          for label in axis.get_ticklabels():
            text = label.get_text()
            assert "$" not in text and "e+" not in text and "e-" not in text, (name, text)
        legend = ax.get_legend()
        for handle, text in zip(legend.legend_handles if legend else [],
                                [t.get_text() for t in legend.get_texts()] if legend else []):
          value = text.split(" ")[0].rstrip(",")
          if value in ("post", "pre", "relu", "swiglu", "gelu") and hasattr(handle,
                                                                           "get_color"):
            colours.setdefault(f"{kind}:{value}", set()).add(
                matplotlib.colors.to_hex(handle.get_color()))
            plots.setdefault(f"{kind}:{value}", set()).add(name)
      matplotlib.pyplot.close(fig)
  assert colours, "no legend names an axis value"
  for value, seen in colours.items():
    assert len(seen) == 1, (value, seen)
  assert plots["one_seed:post"] == {"curves_model.norm_position.png", "layers.png",
                                    "sensitivity_optim.learning_rate_model.norm_position.png"}
  assert colours["one_seed:pre"] == {style.BASE_COLOUR}  # the base
  assert colours["one_seed:post"] != colours["one_seed:pre"]


def test_curves_read_the_unsmoothed_nll_where_every_run_logs_it():
  """Label smoothing (in its KL form) and z-loss put train/loss on other
  scales, so the training row reads train/nll; logs without it fall back."""
  from tfx_jax.report import plots  # pylint: disable=import-outside-toplevel
  curve = [(0, 7.0), (10, 3.0), (20, 2.5)]
  both = fakes.summary(curves={"train/loss": curve, "train/nll": curve, "eval/loss": curve})
  loss_only = fakes.summary(curves={"train/loss": curve, "eval/loss": curve})
  pending = fakes.summary(curves={})  # a run not started yet does not decide
  assert plots.curve_tags([both, both, pending]) == [
      ("train/nll", "training NLL"), ("eval/loss", "validation loss")]
  assert plots.curve_tags([both, loss_only]) == [
      ("train/loss", "training loss"), ("eval/loss", "validation loss")]
  assert plots.curve_tags([pending]) == []


def test_plain_tick_labels():
  assert [style.plain(x) for x in (0.0003, 3e-5, 290.0, 4.25, 0.1 + 0.2, -0.276)] == [
      "0.0003", "0.00003", "290", "4.25", "0.3", "-0.276"]
  assert [style.plain(x) for x in (525_568, 1.5e6, 12_000, 2.5e9)] == [
      "526k", "1.5M", "12k", "2.5B"]


def test_forest_panels_hold_every_comparison_with_its_interval_and_verdict(sweep_dir):
  record = records.read(sweep_dir)
  report = schema.read(sweep_dir)
  panels = forest.forest_panels(record, report)
  # One panel per compared metric, the selection metric first.
  assert [p.metric for p in panels] == ["eval/loss", "ppl@1x", "ppl@2x"]
  assert sum(len(p.rows) for p in panels) == len(report.comparisons)
  loss = panels[0]
  assert loss.margin == 0.01 and loss.lower_is_better
  assert (loss.level, loss.tost_level) == pytest.approx((0.95, 0.90))
  assert "(nats)" in loss.xlabel and "test" not in loss.title  # untuned: validation
  rows = {r.label: r for r in loss.rows}
  assert list(rows) == [
      "model.norm_position: post vs pre, position=rope (3 paired seeds)",
      "model.norm_position: post vs pre, position=alibi (2 vs 3 seeds, unpaired)",
      "model.position: alibi vs rope, norm_position=pre (3 paired seeds)",
      "model.position: alibi vs rope, norm_position=post (2 vs 3 seeds, unpaired)"]
  # post - pre at rope: per-seed differences 0.5, 0.4, 0.6; the 95% interval
  # of the comparison, inside it the 90% interval of the equivalence test.
  paired = rows["model.norm_position: post vs pre, position=rope (3 paired seeds)"]
  half_90 = stats.t_quantile(0.95, 2) * 0.1 / math.sqrt(3)
  half_95 = T_975_DF2 * 0.1 / math.sqrt(3)
  assert paired.seed_diffs == pytest.approx((0.5, 0.4, 0.6))
  assert (paired.low, paired.diff, paired.high) == pytest.approx(
      (0.5 - half_95, 0.5, 0.5 + half_95))
  assert (paired.tost_low, paired.tost_high) == pytest.approx((0.5 - half_90, 0.5 + half_90))
  assert paired.verdict == "unresolved" and (paired.marker, paired.filled) == ("o", False)
  welch = rows["model.norm_position: post vs pre, position=alibi (2 vs 3 seeds, unpaired)"]
  assert welch.seed_diffs == () and welch.low < welch.diff < welch.high
  # ppl@2x: alibi 10 against rope 20 in every seed: better, a filled green dot;
  # ppl@1x: the same on both sides: equivalent, a blue diamond.
  better = next(r for r in panels[2].rows if r.label.startswith("model.position: alibi"))
  assert better.verdict == "better" and better.diff == pytest.approx(-10.0)
  assert (better.marker, better.colour, better.filled) == ("o", "#1a9850", True)
  same = next(r for r in panels[1].rows if r.label.startswith("model.position: alibi"))
  assert same.verdict == "equivalent" and same.marker == "D"
  # Every verdict has its own marker and colour.
  verdicts = typing.get_args(stats.Verdict)
  assert set(forest.VERDICT_STYLE) == set(verdicts)
  assert len({(m, f) for m, _, f in forest.VERDICT_STYLE.values()}) == len(verdicts)
  assert len({c for _, c, _ in forest.VERDICT_STYLE.values()}) == len(verdicts)


def test_forest_rows_name_the_tuning_and_single_seeds(tmp_path):
  root = tmp_path / "one_seed"
  _write(root, _one_seed_sweep)
  record = records.read(root)
  report = schema.read(root)
  (panel,) = forest.forest_panels(record, report)
  (row,) = panel.rows
  assert row.label == ("model.norm_position: post vs pre "
                       "(learning rate tuned, 1 seed a side, no interval)")
  assert row.diff == pytest.approx(0.1, abs=1e-6) and row.low is None and row.tost_low is None
  assert row.verdict == "unresolved"


# eval/loss per activation and seed: gelu and swiglu far below relu (the base),
# swiglu - gelu per seed -0.05, +0.02, -0.03: a small difference three seeds
# cannot resolve.
PAIR_LOSSES = {"relu": [2.0, 2.1, 2.05], "gelu": [1.5, 1.62, 1.55],
               "swiglu": [1.45, 1.64, 1.52]}


def _declared_pair_sweep(root, **fields):
  """relu (base), gelu, swiglu, three seeds; the sweep declares swiglu vs gelu."""
  runs = []
  for act, losses in PAIR_LOSSES.items():
    for seed, loss in enumerate(losses):
      write_run(root, f"activation-{act}_s{seed}", seed, loss)
      runs.append(fakes.entry(f"activation-{act}_s{seed}", seed, [{"model.activation": act}],
                              state="finished"))
  axis = fakes.axis("model.activation", list(PAIR_LOSSES), comparisons=[[2, 1]])
  return sweep_record("declared_pair", [axis], runs, seeds=[0, 1, 2], **fields)


def test_a_declared_pair_is_compared_in_the_reports_family(tmp_path):
  """``Sweep.comparisons``: swiglu vs gelu beside each value vs relu: its
  difference is swiglu - gelu, gelu its base, one Holm family over every row
  (with adaptive seeds, over every row's sequential p); it is in the verdicts,
  the comparisons table and the forest plot, and its points are the ones that
  take more seeds once the rows against the base are resolved."""
  from tfx_jax.report import collect  # pylint: disable=import-outside-toplevel
  root = tmp_path / "declared_pair"
  text = _write(root, _declared_pair_sweep)
  record, report = records.read(root), schema.read(root)
  assert record.axes[0].comparisons == ((2, 1),)
  rows = {(r.value, r.base_value): r for r in report.comparisons}
  assert list(rows) == [("gelu", "relu"), ("swiglu", "relu"), ("swiglu", "gelu")]
  pair = rows[("swiglu", "gelu")]
  differences = [s - g for s, g in zip(PAIR_LOSSES["swiglu"], PAIR_LOSSES["gelu"])]
  assert (pair.value_index, pair.base_index) == (2, 1) and pair.base_key == (1,)
  assert pair.interval.method == "paired"
  assert pair.interval.diff == pytest.approx(sum(differences) / 3)  # -0.02: swiglu lower
  assert pair.interval.p_value == pytest.approx(stats.paired_interval(
      PAIR_LOSSES["swiglu"], PAIR_LOSSES["gelu"]).p_value)
  assert [r.p_adjusted for r in report.comparisons] == stats.holm(
      [r.interval.p_value for r in report.comparisons])
  assert [r.verdict for r in rows.values()] == ["better", "better", "unresolved"]
  assert "- swiglu vs gelu: unresolved (difference -0.020 nats)" in text
  assert "(base value: relu; declared pairs: swiglu vs gelu)" in text
  assert "| - | swiglu vs gelu | eval/loss |" in text and "| - | gelu | eval/loss |" in text
  (panel,) = forest.forest_panels(record, report)
  drawn = next(r for r in panel.rows if r.label.startswith("model.activation: swiglu vs gelu"))
  assert drawn.seed_diffs == pytest.approx(differences)
  # The points that get more seeds: the pair's, the others being resolved.
  assert sequential_section.unresolved_points(report) == [(2,), (1,)]
  # Adaptive seeds: the pair joins the sequential test's families.
  adaptive = dataclasses.replace(record, until_resolved=5)
  _, summaries = collect.collect(root)
  sequential = assemble.analyze(adaptive, summaries,
                                {name: schema.Baseline(None, None) for name in summaries})
  assert len(sequential.comparisons) == 3
  assert all(r.look is not None for r in sequential.comparisons)
  assert [r.p_adjusted for r in sequential.comparisons] == stats.holm(
      [stats_sequential.sequential_p(r.interval.p_value, r.look.share)
       for r in sequential.comparisons])
  assert sequential.comparisons[2].base_value == "gelu"


def test_per_point_tables_of_a_tuned_sweep_read_the_chosen_runs_only():
  """Lengths and layer tables show each point at its chosen tuned value: the
  runs at the other values (and a point that learned nothing keeps all)."""
  from tfx_jax.report.points import at_chosen
  runs = lambda *lrs: [(fakes.entry(f"r{lr}", 0, tuned={"optim.learning_rate": lr}),
                        {"lr": lr}) for lr in lrs]
  points = {(0,): runs(1e-3, 1e-2, 1e-3), (1,): runs(1e-3, 1e-2)}
  chosen = {(0,): {"optim.learning_rate": 1e-3}, (1,): None}  # Report.chosen()
  picked = at_chosen(points, chosen)
  assert [s["lr"] for _, s in picked[(0,)]] == [1e-3, 1e-3]
  assert picked[(1,)] == points[(1,)]
  assert at_chosen(points, {}) == points  # nothing tuned
  # A confirmed point: its confirmation seeds alone, not the tuning seed at
  # the chosen value, which chose it.
  confirmed = {(0,): runs(1e-3, 1e-2) + [
      (fakes.entry(f"c{seed}", seed, tuned={"optim.learning_rate": 1e-3}, stage="confirm"),
       {"lr": 1e-3, "seed": seed}) for seed in (1, 2)]}
  picked = at_chosen(confirmed, {(0,): {"optim.learning_rate": 1e-3}})
  assert [s["seed"] for _, s in picked[(0,)]] == [1, 2]


def test_values_of_an_axis_over_several_fields_name_their_field():
  """Table 3's rows: dropout 0 and label smoothing 0 must not both read "0"."""
  from tfx_jax.report.points import context_label, value_label
  rows = [{}, {"model.dropout": 0.0}, {"train.label_smoothing": 0.0},
          {"model.num_heads": 1, "model.d_ff": 256}]
  axis = fakes.axis("model.dropout+train.label_smoothing", rows)
  assert [value_label(v, axis) for v in rows] == [
      "base", "dropout=0", "label_smoothing=0", "num_heads=1,d_ff=256"]
  single = fakes.axis("model.activation", ["gelu", "swiglu"])
  assert value_label(single.values[1], single) == "swiglu"
  axes = [single, axis]
  assert context_label(axes, (None, 1), 0) == "dropout=0"
  assert context_label(axes, (1, None), 1) == "activation=swiglu"
  # A plot's legend: the colouring axis's value alone, the other axes' named
  # once (not "label_smoothing=dropout=0").
  from tfx_jax.report.style import Palette
  palette = Palette(fakes.record("rows", axes, [], [0]))
  assert palette.point_label((1, 1)) == "swiglu, dropout=0"
  depth = fakes.axis("model.num_layers", [6, 24])
  palette = Palette(fakes.record("depth", [single, depth], [], [0]))
  assert palette.point_label((0, 1)) == "gelu, num_layers=24"
  # The compute table's header names every field of such an axis.
  from tfx_jax.records.compute import Compute, ComputeRow
  from tfx_jax.report.sections import compute as compute_section
  rows = SweepRecord("rows", "configs/lm.py:tiny", (0,), tuple(axes), [])
  phases = dict.fromkeys(status_lib.PHASES, 0.0)
  nothing = ComputeRow(None, 0, 0.0, phases)
  assert compute_section.compute_table(rows, Compute((), nothing))[0][:2] == [
      "activation", "dropout+label_smoothing"]


def test_the_headline_lists_the_equivalence_margins_in_one_order(sweep_dir):
  """The selection metric's margin first, then the others by name, whatever
  order the comparisons come in (the text must not follow the hash seed)."""
  metrics_ = ["eval/ppl@8x", "eval/loss", "eval/ppl@2x", "eval/ppl@4x", "eval/ppl@1x"]
  margins = {"eval/loss": 0.02, "eval/ppl@1x": 1.0, "eval/ppl@2x": 2.0,
             "eval/ppl@4x": 4.0, "eval/ppl@8x": 8.0}
  record, synthetic = records.read(sweep_dir), schema.read(sweep_dir)
  comparison = synthetic.comparisons[0]  # a comparison to vary
  texts = set()
  for shift in range(len(metrics_)):
    order = metrics_[shift:] + metrics_[:shift]
    report = dataclasses.replace(
        synthetic, comparisons=tuple(dataclasses.replace(comparison, metric=m,
                                                         margin=margins[m])
                                     for m in order),
        select_by="eval/loss", options=schema.Options(alpha=0.05), report_split="test")
    texts.add("\n".join(verdicts.headline(record, report, {"forest": "forest.png"})))
  (text,) = texts
  assert ("(±0.02 for eval/loss, ±1 for eval/ppl@1x, ±2 for eval/ppl@2x, "
          "±4 for eval/ppl@4x, ±8 for eval/ppl@8x)") in text


def test_report_json_is_the_report_serialised_and_reads_back(sweep_dir):
  """report.json is ``Report.to_json``; ``Report.from_json`` gives the same
  report back (seeds, which JSON keys as strings, as ints again), and reads a
  report.json of an earlier version, which lacked the newer keys."""
  data = json.loads((sweep_dir / "report.json").read_text())
  report = schema.Report.from_json(data)
  assert json.loads(json.dumps(report.to_json())) == data
  assert schema.Report.from_json(json.loads(json.dumps(report.to_json()))) == report
  post_alibi = report.point((1, 1))
  assert sorted(post_alibi.compared) == [0, 2]  # seed 1 diverged
  assert post_alibi.counts == schema.Counts(learned=2, stalled=0, diverged=1)
  row = next(c for c in report.comparisons if c.context == "position=rope")
  assert (row.axis, row.value, row.interval.method) == ("model.norm_position", "post", "paired")
  # Every outcome is counted: the counts hold exactly the outcomes stats knows.
  assert [f.name for f in dataclasses.fields(schema.Counts)] == list(stats.OUTCOMES)
  older = json.loads(json.dumps(data))
  del older["failed"]
  for point in older["points"]:
    del point["chosen_at_edge"]
    for row in point["tuned"]:
      del row["selection_failed"], row["selection_score"]
  for row in older["comparisons"]:
    del row["counts"], row["base_counts"], row["seeds_needed"], row["base_index"]
  old = schema.Report.from_json(older)
  assert old.failed == () and old.comparisons[0].seeds_needed is None
  # Before declared pairs every base was the axis's base value: found by its label.
  assert [c.base_key for c in old.comparisons] == [c.base_key for c in report.comparisons]
  assert [c.text for c in old.comparisons] == [c.text for c in report.comparisons]


def test_points_show_the_evaluation_standard_error_beside_the_seed_spread(tmp_path):
  """Each point's evaluation standard error (the root mean square of its runs'
  eval/loss_se) beside its seed-to-seed standard deviation, in report.json's
  points and report.md's points table; the standard error is never compared
  itself, and a point whose evaluation noise is more than a quarter of its
  seed spread is named."""
  root = tmp_path / "noise"
  # rope: seed std 0.1, eval SE 0.01 (quiet); alibi: seed std 0.05, eval SE ~0.03.
  planted = {"rope": ([1.0, 1.1, 1.2], [0.01, 0.01, 0.01]),
             "alibi": ([1.0, 1.05, 1.1], [0.02, 0.03, 0.04])}
  runs = []
  for pos, (losses, ses) in planted.items():
    for seed, (loss, se) in enumerate(zip(losses, ses)):
      name = f"position-{pos}_s{seed}"
      write_run(root, name, seed, loss, loss_se=se)
      runs.append(fakes.entry(name, seed, [{"model.position": pos}], state="finished",
                              wall_seconds=1.0))
  fakes.write_sweep(root, sweep_record(
      "noise", [fakes.axis("model.position", ["rope", "alibi"])], runs, seeds=[0, 1, 2]))
  assemble.write_report(root)
  data = json.loads((root / "report.json").read_text())
  for point, (pos, (losses, ses)) in zip(data["points"], planted.items()):
    assert point["values"] == {"model.position": pos}
    assert point["eval_se"] == {"eval/loss": pytest.approx(math.sqrt(sum(x * x for x in ses) / 3))}
    mean = sum(losses) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in losses) / 2)
    assert point["seed_sd"]["eval/loss"] == pytest.approx(sd)
  assert {c["metric"] for c in data["comparisons"]} == {"eval/loss"}
  text = (root / "report.md").read_text()
  table = text.split("## Points", 1)[1].split("\n## ", 1)[0]
  head = next(line for line in table.splitlines() if line.startswith("| model.position"))
  cells = [c.strip() for c in head.strip("|").split("|")]
  assert cells[cells.index("eval/loss (validation)") + 1] == "eval/loss eval SE"
  rows = {line.split("|")[1].strip(): line for line in table.splitlines()
          if line.startswith(("| rope", "| alibi"))}
  assert "| 0.0100 |" in rows["rope"] and "| **0.0311** |" in rows["alibi"]
  assert ("Evaluation noise above a quarter of the seed spread (in bold above): alibi "
          "eval/loss (eval SE 0.0311, seed std 0.0500)") in text


# ------------------------------------------- per-point grids, effective speedup
# An optimizer sweep: AdamW at 1x (the base), 1/2x and 2x the length, Muon and
# Lion at 1x, each tuned on its own grid. The planted loss of a run is the
# AdamW curve at the run's effective steps (``EFFECTIVE``: Muon's 100 steps
# worth 300 of AdamW's), plus a penalty away from the point's best tuned
# values, plus a per-seed offset every point shares (paired seeds).
OPT_ROWS = [{"optim.optimizer": "adamw", "train.num_steps": 200},
            {"optim.optimizer": "adamw", "train.num_steps": 100},
            {"optim.optimizer": "adamw", "train.num_steps": 400},
            {"optim.optimizer": "muon", "train.num_steps": 100},
            {"optim.optimizer": "lion", "train.num_steps": 100}]
OPT_TUNE = {"optim.learning_rate": [
                {"values": [1e-3, 3e-3, 1e-2], "when": {"optim.optimizer": "adamw"}},
                {"values": [1e-3, 3e-3, 1e-2], "when": {"optim.optimizer": "muon"}},
                {"values": [1e-4, 3e-4], "when": {"optim.optimizer": "lion"}}],
            "optim.adam_learning_rate_ratio": {"values": [0.3, 1.0],
                                               "when": {"optim.optimizer": "muon"}}}
EFFECTIVE = {"adamw": 1.0, "muon": 3.0, "lion": 1.5}  # AdamW steps per step
OPT_L0 = 6.9


def adamw_curve(steps: float) -> float:
  """The planted AdamW endpoint loss after ``steps``: linear in log steps."""
  return 4.0 - 0.5 * math.log2(steps / 100)


def _penalty(optimizer: str, tuned: dict) -> float:
  """Away from each point's best: AdamW's 3e-3 (inside its grid), Muon's 1e-2
  and ratio 1.0, Lion's 3e-4 (the ends of their own grids)."""
  lr, ratio = tuned["optim.learning_rate"], tuned.get("optim.adam_learning_rate_ratio")
  best = {"adamw": 3e-3, "muon": 1e-2, "lion": 3e-4}[optimizer]
  return (0.0 if lr == best else 0.2 if abs(math.log10(lr / best)) < 0.6 else 0.6) + (
      0.05 if ratio == 0.3 else 0.0)


def _optimizer_sweep(effective=EFFECTIVE, seeds=(0, 1, 2)):
  """(record, summaries) of the planted optimizer sweep, in memory."""
  from tfx_jax.sweep import spec as spec_lib  # pylint: disable=import-outside-toplevel
  _, runs = spec_lib.expand(spec_lib.Sweep(
      name="optimizers", config="configs/lm.py:tiny", axes=[OPT_ROWS], tune=OPT_TUNE,
      seeds=list(seeds)))
  summaries, entries = {}, []
  for run in runs:
    row = run.values[0]
    loss = (adamw_curve(row["train.num_steps"] * effective[row["optim.optimizer"]])
            + _penalty(row["optim.optimizer"], run.tuned) + 0.01 * run.seed)
    entries.append(fakes.entry(run.name, run.seed, [row], run.overrides, run.tuned,
                               state="finished"))
    summaries[run.name] = fakes.summary({"eval/loss": loss}, step=row["train.num_steps"],
                                        test={"eval/loss": loss},
                                        initial={"eval/loss": OPT_L0}, curves={}, lengths={})
  axis = fakes.axis("optimizer", OPT_ROWS, fields=["optim.optimizer", "train.num_steps"])
  record = sweep_record("optimizers", [axis], entries, seeds=list(seeds), tune=OPT_TUNE,
                        report_split="test", evaluations=[["--split", "test"]])
  return record, summaries


def _analyze_optimizers(**kwargs):
  record, summaries = _optimizer_sweep(**kwargs)
  baselines = {name: schema.Baseline(5.7, math.log(1024)) for name in summaries}
  return record, assemble.analyze(record, summaries, baselines)


def test_each_point_is_chosen_and_checked_on_its_own_grid():
  """Lion's best rate, 3e-4, is inside the union of the grids but the top of
  Lion's own: flagged; AdamW's 3e-3 is inside its own: not. Muon's
  sensitivity reads its learning rates at its chosen Adam ratio only."""
  record, report = _analyze_optimizers()
  points = {p.values["optimizer"]: p for p in report.points}
  muon, lion, adamw = (points["optimizer=muon,num_steps=100"],
                       points["optimizer=lion,num_steps=100"],
                       points["optimizer=adamw,num_steps=200"])
  assert muon.chosen == {"optim.learning_rate": 1e-2, "optim.adam_learning_rate_ratio": 1.0}
  assert muon.chosen_at_edge == {"optim.learning_rate": "highest",
                                 "optim.adam_learning_rate_ratio": "highest"}
  assert lion.chosen == {"optim.learning_rate": 3e-4}
  assert lion.chosen_at_edge == {"optim.learning_rate": "highest"}
  assert adamw.chosen_at_edge == {}
  assert len(muon.tuned) == 6 and len(lion.tuned) == 2 and len(adamw.tuned) == 3
  sens = {s.point["optimizer"]: s for s in report.sensitivity}
  at_ratio = {lr: [adamw_curve(300) + _penalty("muon", {"optim.learning_rate": lr})
                   + 0.01 * seed for seed in range(3)] for lr in (1e-3, 3e-3, 1e-2)}
  assert sens["optimizer=muon,num_steps=100"].sensitivity == pytest.approx(
      stats.lr_sensitivity(at_ratio, OPT_L0))
  assert len(sens["optimizer=muon,num_steps=100"].curve) == 6  # the curve: every value
  (row,) = [r for r in report.comparisons if r.value == "optimizer=lion,num_steps=100"]
  assert ("tuned on seeds 0-2: optimizer=lion,num_steps=100 over learning_rate {0.0001, "
          "0.0003}, optimizer=adamw,num_steps=200 over learning_rate {0.001, 0.003, 0.01}"
          ) in comparisons_section.design_line(record, row)
  # report.json keeps the grids as declared and reads back as it was.
  data = json.loads(json.dumps(report.to_json()))
  assert data["tune"]["optim.adam_learning_rate_ratio"] == [
      {"values": [0.3, 1.0], "when": {"optim.optimizer": "muon"}}]
  assert schema.Report.from_json(data) == report


def test_effective_speedup_on_synthetic_curves_with_a_known_answer():
  """Muon's 100 steps reach AdamW's loss at 300 steps (between its 200 and 400
  step endpoints): 3x; Lion's, 150 steps: 1.5x. The seeds' offsets are shared
  by every point, so the paired interval has no width."""
  _, report = _analyze_optimizers()
  rows = {r.optimizer: r for r in report.speedups}
  assert set(rows) == {"muon", "lion"}
  muon = rows["muon"]
  assert muon.reference_steps == (100, 200, 400) and muon.seeds == (0, 1, 2)
  assert muon.reference_steps_to_reach == pytest.approx(300.0)
  assert muon.speedup == pytest.approx(3.0) and rows["lion"].speedup == pytest.approx(1.5)
  assert (muon.interval.low, muon.interval.high) == (pytest.approx(3.0), pytest.approx(3.0))
  assert speedup_section.speedup_text(muon) == "3.00x [3.00, 3.00]" and not muon.not_decayed
  # Outside AdamW's lengths: a bound, never an extrapolation.
  _, report = _analyze_optimizers(effective={"adamw": 1.0, "muon": 8.0, "lion": 0.6})
  rows = {r.optimizer: r for r in report.speedups}
  assert (rows["muon"].speedup, rows["muon"].bound, rows["muon"].bound_value) == (
      None, "more than", 4.0)
  assert speedup_section.speedup_text(rows["lion"]) == "at most 1.00x"
  assert rows["lion"].interval is None


def test_speedup_interval_is_the_delta_method_over_paired_seeds():
  """The interval of log speedup by the delta method with a t quantile
  covers the true speedup at about its level over simulated sweeps (seed
  effects shared by every point, plus each run's own noise); an end beyond
  the AdamW lengths is a bound there; the curve is read at its first crossing."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tfx_jax.report.sections import speedup  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  lengths, n, trials, covered = (100, 200, 400), 4, 2000, 0
  for _ in range(trials):
    shared = rng.normal(0.0, 0.05, n)
    x = adamw_curve(300) + shared + rng.normal(0.0, 0.02, n)
    curves = [adamw_curve(s) + shared + rng.normal(0.0, 0.02, n) for s in lengths]
    reach = speedup.steps_to_reach(float(x.mean()), lengths, [float(c.mean()) for c in curves])
    i = reach.segment
    iv = speedup.delta_interval(list(x), list(curves[i]), list(curves[i + 1]), lengths[i],
                                lengths[i + 1], 100, (100, 400))
    covered += iv.low <= 3.0 <= iv.high
  assert 0.93 <= covered / trials <= 0.97, covered / trials
  wide = speedup.delta_interval([3.3, 3.1], [3.5, 3.5], [3.0, 3.0], 200, 400, 100,
                                (100, 400))
  assert wide.high == 4.0 and wide.high_beyond and wide.n == 2
  assert speedup.delta_interval([3.3], [3.5], [3.0], 200, 400, 100, (100, 400)) is None
  # Not monotone (a noisy longer run): the smallest step count that reaches it.
  reach = speedup.steps_to_reach(2.5, (100, 200, 400), (3.0, 2.4, 2.6))
  assert reach.segment == 0 and reach.steps == pytest.approx(100 * 2 ** (0.5 / 0.6))


def test_compute_table_sums_core_time_and_the_train_steps_share(tmp_path):
  """report.json's ``compute``: per point and in total, wall time x cores
  summed over the runs (the sweep's wall time, else the phases' sum), each
  phase's core time and the share in train steps; report.md's table."""
  root = tmp_path / "cost"
  runs = []
  # (activation, seed, cores, the sweep's wall seconds (0: not measured), train steps)
  for act, seed, cores, wall, train_s in (("relu", 0, 1, 100.0, 60.0),
                                          ("relu", 1, 2, 50.0, 30.0),
                                          ("gelu", 0, 1, 80.0, 20.0),
                                          ("gelu", 1, 1, 0.0, 10.0)):
    name = f"activation-{act}_s{seed}"
    write_run(root, name, seed, 3.0 + seed / 10, cores=cores, seconds={
        "startup": 10.0, "compile": 5.0, "train_steps": train_s, "evaluations": 4.0,
        "checkpointing": 1.0})
    runs.append(fakes.entry(name, seed, [{"model.activation": act}], state="finished",
                            wall_seconds=wall))
  record = sweep_record("cost", [fakes.axis("model.activation", ["relu", "gelu"])], runs,
                        seeds=[0, 1])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  data = json.loads((root / "report.json").read_text())
  relu, gelu = data["compute"]["points"]
  assert (relu["key"], relu["runs"], relu["core_seconds"]) == ([0], 2, 200.0)
  assert relu["phases"]["train_steps"] == 120.0 and relu["train_fraction"] == 0.6
  assert relu["phases"]["startup"] == 30.0  # 10 s on 1 core + 10 s on 2
  assert gelu["core_seconds"] == 80.0 + 30.0  # the unmeasured run: its phases' sum
  total = data["compute"]["total"]
  assert (total["runs"], total["core_seconds"]) == (4, 310.0)
  assert total["train_fraction"] == round(150.0 / 310.0, 4)
  report = schema.Report.from_json(data)
  assert report.compute.total.train_fraction == pytest.approx(150.0 / 310.0)
  assert report.to_json()["compute"] == data["compute"]
  older = dict(data)
  del older["compute"]
  assert schema.Report.from_json(older).compute is None
  text = (root / "report.md").read_text()
  assert "## Compute" in text and "4 runs took 5.17 core-min, 48% of it in train steps" in text
  assert "| relu | 2 | 3.33 core-min | 60% | 0.50 core-min |" in text
  assert "| **total** | 4 | 5.17 core-min | 48% |" in text


def test_compute_table_gives_the_evaluations_time_over_the_train_steps(tmp_path):
  """"eval / train steps": each point's and the total's evaluation core-seconds
  over their train-step core-seconds (issue 53's at most 15% for a shipped
  ladder), in report.json (``eval_per_train_step``) and report.md; "-" where no
  train-step time was recorded."""
  root = tmp_path / "evalshare"
  runs = []
  # (activation, seed, cores, train steps, evaluations)
  for act, seed, cores, train_s, eval_s in (("relu", 0, 1, 60.0, 6.0),
                                            ("relu", 1, 2, 30.0, 9.0),
                                            ("gelu", 0, 1, 0.0, 5.0),
                                            ("gelu", 1, 1, 0.0, 5.0)):
    name = f"activation-{act}_s{seed}"
    write_run(root, name, seed, 3.0 + seed / 10, cores=cores, seconds={
        "startup": 10.0, "compile": 5.0, "train_steps": train_s, "evaluations": eval_s,
        "checkpointing": 1.0})
    runs.append(fakes.entry(name, seed, [{"model.activation": act}], state="finished"))
  record = sweep_record("evalshare", [fakes.axis("model.activation", ["relu", "gelu"])], runs,
                        seeds=[0, 1])
  fakes.write_sweep(root, record)
  assemble.write_report(root)
  data = json.loads((root / "report.json").read_text())
  relu, gelu = data["compute"]["points"]
  # relu: (6 x 1 + 9 x 2) / (60 x 1 + 30 x 2) = 24 / 120.
  assert relu["eval_per_train_step"] == 0.2 and gelu["eval_per_train_step"] is None
  total = data["compute"]["total"]
  assert total["eval_per_train_step"] == round(34.0 / 120.0, 4)
  assert list(total) == ["key", "runs", "core_seconds", "train_fraction",
                         "eval_per_train_step", "phases"]
  report = schema.Report.from_json(data)
  assert report.compute.total.eval_per_train_step == pytest.approx(34.0 / 120.0)
  assert report.to_json()["compute"] == data["compute"]
  text = (root / "report.md").read_text()
  assert "| checkpointing | eval / train steps |" in text
  assert "; evaluations took 28% of the train steps' time." in text
  section = text.split("## Compute")[1].splitlines()
  rows = {line.split(" | ")[0]: line for line in section if line.startswith("| ")}
  assert rows["| relu"].endswith("| 20% |") and rows["| gelu"].endswith("| - |")
  assert rows["| **total**"].endswith("| 28% |")


def _vocabulary_sweep(label: str, values):
  """(record, report) of two values of ``label``, three seeds, in memory:
  the second value worse in nats per token and better in bits per byte, as
  a larger vocabulary is (more text in each token)."""
  spread = (0.0, 0.02, 0.01)
  entries, summaries = [], {}
  for vi, value in enumerate(values):
    for seed in range(3):
      name = f"{label}-{value}_s{seed}"
      final = {"eval/loss": 3.0 + 0.5 * vi + spread[seed] * (1 + vi),
               "eval/bpb": 1.5 - 0.1 * vi + spread[seed] / 2 * (1 + vi)}
      entries.append(fakes.entry(name, seed, [{label: value}], state="finished"))
      summaries[name] = fakes.summary(final, step=30, curves={}, lengths={})
  record = sweep_record("vocabulary", [fakes.axis(label, values)], entries, seeds=[0, 1, 2])
  baselines = {name: schema.Baseline(5.7, math.log(1024)) for name in summaries}
  return record, assemble.analyze(record, summaries, baselines), summaries


def test_points_that_differ_in_tokenizer_are_compared_in_bits_per_byte():
  """A vocabulary axis compares eval/bpb and no metric per token, and says so;
  an axis of one tokenizer compares eval/loss, of which eval/bpb is a
  constant multiple there."""
  record, report, summaries = _vocabulary_sweep("data.vocab_size", [1024, 4096])
  assert {r.metric for r in report.comparisons} == {"eval/bpb"}
  (row,) = report.comparisons
  assert row.verdict == "better" and row.interval.diff == pytest.approx(-0.1 + 0.01 / 2)
  md = assemble.render(record, summaries, report, {})
  design = md[md.index("## Verdicts"):]
  assert ("differ in tokenizer or vocabulary (data.vocab_size), so they are compared in "
          "bits per byte (`eval/bpb`)") in design
  assert "eval/loss" not in design[:design.index("\n## ", 3)]
  _, report, _ = _vocabulary_sweep("model.activation", ["gelu", "swiglu"])
  assert {r.metric for r in report.comparisons} == {"eval/loss"}
  assert report.comparisons[0].verdict == "worse"


def test_a_sensitivity_panel_where_no_point_tunes_the_field_is_left_empty(tmp_path):
  """AdamW's points tune no Adam ratio: their panels of Muon's ratio plot by
  size have no curve, and the figure is still drawn (it raised on the empty
  log-scaled axis)."""
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import cli, spec  # pylint: disable=import-outside-toplevel
  sweep = spec.load_experiment(str(ROOT / "experiments/optimizers.py:small"))
  axes, runs = spec.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "", None)
  report = schema.Report.from_json(json.loads(
      (ROOT / "docs/results/optimizers/small/report.json").read_text()))
  path = tmp_path / "ratio.png"
  assert plots_lib.sensitivity_plot(path, record, report, "optim.adam_learning_rate_ratio", 0,
                                    style.Palette(record))
  assert path.stat().st_size > 5000
