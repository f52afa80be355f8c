"""The optimizer's parameter groups under model.parametrization (run/param_groups.py).

The Adam multipliers of each kind against model/parametrization.py's table at
two widths, for every family; sp is the optimizer as it was (no groups) and
muP at its base shape is sp bitwise, parameters and updates; combinations
without a rule fail when the run's config is resolved, before anything is
built; checkpoints record the parametrization; kill -9 resumes bitwise.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
from flax import traverse_util

from helpers import (ROOT, run_cli, run_command, subprocess_env, tiny_config, train,
                     train_command)
from tfx_jax import summary
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import metrics
from tfx_jax.run import optim
from tfx_jax.run import param_groups
from tfx_jax.run import setup as run_setup
from tfx_jax.run import sharding as sharding_lib

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

BASE = 32
FAMILIES = {
    "decoder_only": dict(num_kv_heads=1, activation="swiglu", ffn_type="moe", num_experts=4,
                         experts_per_token=2, tie_embeddings=False),
    "encoder_only": dict(position="learned", tie_embeddings=True),
    "encoder_decoder": dict(tie_embeddings=True),
}
MUP = {"model.parametrization": "mup", "model.mup_base_d_model": BASE}


def _model(family, width, **overrides):
  kw = dict(family=family, num_layers=1, d_model=width, num_heads=2, d_ff=2 * width,
            vocab_size=64, max_len=32, parametrization="mup", mup_base_d_model=BASE,
            **FAMILIES[family])
  if kw.get("ffn_type") == "moe":
    kw["expert_d_ff"] = width
  kw.update(overrides)
  return model_config_from_dict(kw)


def _optim(**fields):
  return optim.resolve({"optimizer": "adamw", **fields}, num_train_steps=10)[0]


def expected_kind(path: str) -> str:
  keys = path.split("/")
  if keys[-1] == "embedding":
    return "embedding"
  if path == "output/kernel":
    return "readout"
  if keys[-2:] == ["router", "kernel"]:
    return "router"
  if keys[-1] == "kernel":
    return "hidden"
  return "fixed" if path == "mlm_bias" else "vector"


def expected(kind: str, m: float) -> param_groups.Multipliers:
  """The Adam table (model/parametrization.py): rate, weight decay, epsilon."""
  if kind in ("hidden", "router"):
    return param_groups.Multipliers(lr=1 / m, weight_decay=m)
  return param_groups.Multipliers()


@pytest.mark.parametrize("family", FAMILIES)
def test_adam_multipliers_per_kind_follow_the_table_at_two_widths(family):
  for m in (2, 4):
    groups = param_groups.for_run(_model(family, m * BASE), _optim())
    assert groups.width_mult == m
    kinds = set()
    for path, leaf in groups.leaves.items():
      kinds.add(leaf.kind)
      assert leaf.kind == expected_kind(path), path
      got, want = groups.adam[path], expected(leaf.kind, m)
      assert (got.lr, got.weight_decay, got.eps) == pytest.approx(
          (want.lr, want.weight_decay, want.eps)), path
    assert {"hidden", "embedding", "vector"} <= kinds
    if family == "decoder_only":
      assert {"readout", "router"} <= kinds


def test_completep_multipliers_in_the_blocks():
  """Dey et al. 2025: hidden rate eta m^-1 m_L^(alpha-1), epsilon eps m^-1 m_L^-alpha
  for every array in the blocks, the blocks' vectors eta m_L^(alpha-1); outside the
  blocks muP's."""
  cfg = _model("encoder_decoder", 2 * BASE, parametrization="completep", num_layers=4,
               mup_base_layers=1, depth_alpha=0.5)
  groups = param_groups.for_run(cfg, _optim())
  m, m_l, alpha = 2, 4, 0.5
  q = groups.adam["decoder/layer_0/self_attention/query/kernel"]
  assert (q.lr, q.weight_decay, q.eps) == pytest.approx(
      (m_l ** (alpha - 1) / m, m, m_l ** -alpha / m))
  gain = groups.adam["decoder/layer_0/ffn_norm/scale"]
  assert (gain.lr, gain.eps) == pytest.approx((m_l ** (alpha - 1), m_l ** -alpha / m))
  assert groups.adam["decoder/final_norm/scale"] == param_groups.Multipliers()
  assert groups.adam["embedding/embedding"] == param_groups.Multipliers()


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "lion", "muon", "adafactor"])
def test_sp_has_no_groups(optimizer):
  cfg = _model("decoder_only", 2 * BASE, parametrization="sp", mup_base_d_model=0)
  assert param_groups.for_run(cfg, _optim(optimizer=optimizer)) is None


def _train_params(overrides: dict, steps: int = 3):
  """The parameters after ``steps`` updates of the tiny LM by the run's own
  jitted train step (run_setup.ShardedRun), and at initialisation."""
  run = run_config.resolve(tiny_config("lm.py:tiny", {"model.d_model": BASE, **overrides}))
  sharded = run_setup.ShardedRun(run, run.model)
  state, hparams = sharded.init_state(), sharded.step_hparams()
  init = jax.device_get(state.params)
  data = iter(run_setup.make_data(run, run_setup.load_tokenizer(run), "train", train=True))
  step = sharded.train_step()
  for _ in range(steps):
    state, _ = step(state, sharding_lib.global_batch(next(data), sharded.mesh), hparams)
  return init, jax.device_get(state.params)


def _flat(tree):
  return traverse_util.flatten_dict(tree, sep="/")


def test_mup_at_its_base_shape_is_sp_bitwise():
  """At the base width every multiplier is 1: the grouped optimizer and the
  model give sp's parameters and updates bit for bit (sp's optimizer is built
  without groups, ``for_run`` None)."""
  sp_init, sp = _train_params({})
  mup_init, mup = _train_params(MUP)
  for want, got in ((sp_init, mup_init), (sp, mup)):
    want, got = _flat(want), _flat(got)
    assert want.keys() == got.keys()
    for path in want:
      np.testing.assert_array_equal(want[path], got[path], err_msg=path)
  assert any(not np.array_equal(_flat(sp_init)[p], _flat(sp)[p]) for p in _flat(sp))


def test_sp_updates_are_the_ungrouped_optimizer_bitwise():
  """Under sp the train step's optimizer is ``optim.build(cfg, hp)`` as before
  the groups: the same updates from the same gradients, bit for bit."""
  run = run_config.resolve(tiny_config("lm.py:tiny"))
  hp = optim.hyperparameters(run.optim, d_model=run.model.d_model)
  groups = param_groups.for_run(run.model, run.optim)
  assert groups is None
  params = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
  grads = {"w": np.cos(np.arange(12, dtype=np.float32)).reshape(3, 4)}
  outs = []
  for tx in (optim.build(run.optim, hp).tx, optim.build(run.optim, hp, groups).tx):
    state, p = tx.init(params), params
    for _ in range(3):
      updates, state = tx.update(grads, state, p)
      p = jax.tree.map(lambda a, u: a + u, p, updates)
    outs.append(np.asarray(p["w"]))
  np.testing.assert_array_equal(outs[0], outs[1])


BAD = [
    ({**MUP, "optim.optimizer": "adafactor"}, ConfigError, "adafactor"),
    ({"model.parametrization": "mup"}, ConfigError, "mup_base_d_model"),
    ({"model.parametrization": "completep", "model.mup_base_d_model": BASE},
     ConfigError, "mup_base_layers"),
    ({"model.parametrization": "completep", "model.mup_base_d_model": BASE,
      "model.mup_base_layers": 1, "model.norm_position": "post"}, ConfigError, "norm_position"),
    ({"model.mup_base_layers": 1}, InactiveSetting, "mup_base_layers"),
    ({**MUP, "model.attention_gate": "headwise"}, ConfigError, "attention_gate"),
    ({**MUP, "model.scale_embeddings": True}, ConfigError, "scale_embeddings"),
    ({**MUP, "optim.schedule": "inverse_sqrt", "optim.scale_by_d_model": True},
     ConfigError, "scale_by_d_model"),
]


@pytest.mark.parametrize("overrides, error, names", BAD, ids=[b[2] for b in BAD])
def test_combinations_without_a_rule_fail_when_the_run_config_is_resolved(
    overrides, error, names):
  with pytest.raises(error, match=names):
    run_config.resolve(tiny_config("lm.py:tiny", overrides))


@pytest.mark.parametrize("overrides, error, names", BAD[:1] + BAD[-1:],
                         ids=["adafactor", "scale_by_d_model"])
def test_the_train_command_exits_2_before_building_anything(overrides, error, names,
                                                            tmp_path, monkeypatch):
  def must_not_run(*args, **kwargs):
    raise AssertionError("bad input must fail before data is read or anything built")

  for name in ("load_tokenizer", "make_data", "ShardedRun"):
    monkeypatch.setattr(run_setup, name, must_not_run)
  flags = [f"--config.{k}={v}" for k, v in overrides.items()]
  code, _, err = run_cli(["--config", f"{ROOT / 'configs' / 'lm.py'}:tiny",
                          "--workdir", str(tmp_path / "run"), *flags])
  assert code == 2 and err.startswith("error: ") and names in err, err
  assert not (tmp_path / "run").exists()


def test_summary_prints_the_groups_with_their_multipliers():
  args = ["--config", f"{ROOT / 'configs' / 'lm.py'}:tiny"]
  code, out, err = run_command(summary, [*args, "--config.model.parametrization=mup",
                                         "--config.model.mup_base_d_model=64"])
  assert code == 0, err
  # configs/lm.py:tiny is d_model 128: m = 2, hidden matrices at rate / 2, decay x 2.
  assert "parameter groups (model.parametrization=mup: width multiplier m 2" in out
  assert "adam  hidden     lr x0.5, wd x2, eps x1" in out
  assert "adam  embedding  lr x1, wd x1, eps x1" in out
  code, out, err = run_command(summary, args)
  assert code == 0 and "parameter groups" not in out, err


# ------------------------------------------------ checkpoints and resumption
# Twice the base width (m = 2): the groups' multipliers are not 1.
RUN = {**MUP, "model.d_model": 2 * BASE, "model.d_ff": 4 * BASE, "train.num_steps": 12, "checkpoint.every_steps": 1, "eval.every_steps": 12}
COMPARED = ("train/loss", "train/grad_norm", "eval/loss")


def test_checkpoints_record_the_parametrization(tmp_path):
  workdir = tmp_path / "run"
  assert train("lm.py:tiny", workdir, {**RUN, "train.num_steps": 2}).status == "finished"
  with ckpt_lib.Checkpointer(workdir / "checkpoints") as ckpt:
    saved = ckpt.read_config()
  assert (saved["model.parametrization"], saved["model.mup_base_d_model"]) == ("mup", BASE)
  # Resuming it as another parametrization is refused, naming the field.
  with pytest.raises(ConfigError, match="model.parametrization"):
    train("lm.py:tiny", workdir, {"train.num_steps": 4, "checkpoint.every_steps": 1})


@pytest.mark.slow
def test_kill_9_resumes_bitwise_under_mup(tmp_path, jax_cache_dir):
  """kill -9 once a checkpoint is complete, then the same command: the
  finished run's numbers are an uninterrupted run's, bit for bit (the grouped
  optimizer's state is restored whole)."""
  reference = tmp_path / "reference"
  assert train("lm.py:tiny", reference, RUN).status == "finished"
  workdir = tmp_path / "run"
  command = train_command("lm.py:tiny", workdir, RUN)
  env = subprocess_env(jax_cache_dir)
  checkpoints = workdir / "checkpoints"
  with open(tmp_path / "stdout", "w") as log:
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    try:
      while not (checkpoints.exists() and any(p.name.isdigit() and int(p.name) >= 3
                                              for p in checkpoints.iterdir())):
        assert child.poll() is None and time.time() < deadline, "ended before the kill"
        time.sleep(0.01)
    finally:
      child.send_signal(signal.SIGKILL)
      child.wait()
  final = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
  assert final.returncode == 0, final.stderr[-3000:]
  assert "Resumed from step" in final.stdout
  got = metrics.read_scalars(workdir / "tensorboard")
  want = metrics.read_scalars(reference / "tensorboard")
  for tag in COMPARED:
    assert got[tag] == want[tag], tag
  assert os.path.exists(workdir / "config.json")
  assert not math.isnan(got["train/loss"][-1][1])
