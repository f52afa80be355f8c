"""Mixture of experts (``model.ffn_type='moe'``, tfx_jax/model/layers/moe.py).

The router and the balancing terms against NumPy; the two dispatches (dropless
grouped matmul, capacity) against each other and against a per-token NumPy
reference; KV-cache decoding, scan and loop; the expert bias's update and its
resumption; the config checks; the matched-parameter helper of configs/lm.py;
expert parallelism (model/layers/expert_parallel.py) on fake CPU devices against one
device, and its collectives.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tfx_jax.run import footprint

from tfx_jax.run import metrics

from tfx_jax.run import config as run_config

from tfx_jax.run import trained_run
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model.layers import moe
from tfx_jax.model.config import model_config_from_dict, moe_layers
from tfx_jax.model.families import build_model, stack_layer_params
from tfx_jax.scale import hlo
from helpers import ROOT, load_config, train, _config_module

pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")]

E, K = 4, 2
BASE = dict(family="decoder_only", num_layers=2, d_model=16, num_heads=2, vocab_size=23,
            max_len=12, position="rope", activation="swiglu", ffn_type="moe",
            num_experts=E, experts_per_token=K)
IDS = jnp.asarray([[3, 4, 5, 6, 7, 8, 9, 10, 0, 0], [5, 9, 7, 12, 15, 3, 11, 20, 21, 22]],
                  jnp.int32)
SEGMENTS = (IDS > 0).astype(jnp.int32)


def _model(**changes):
  cfg = model_config_from_dict(dict(BASE, **changes))
  return cfg, build_model(cfg)


@functools.lru_cache(maxsize=None)
def _params(**changes):
  cfg, model = _model(**changes)
  return model.init(jax.random.PRNGKey(0), IDS)["params"]


def _forward(params, **changes):
  _, model = _model(**changes)
  return model.apply({"params": params}, IDS, segment_ids=SEGMENTS)


# ------------------------------------------------------------------ router
def _np_route(logits, bias, k, router, norm_topk):
  scores = (np.exp(logits - logits.max(-1, keepdims=True)) if router == "softmax"
            else 1 / (1 + np.exp(-logits)))
  if router == "softmax":
    scores = scores / scores.sum(-1, keepdims=True)
  chosen = np.argsort(-(scores + bias), axis=-1, kind="stable")[:, :k]
  weights = np.take_along_axis(scores, chosen, -1)
  if norm_topk:
    weights = weights / weights.sum(-1, keepdims=True)
  return weights, chosen, scores


@pytest.mark.parametrize("norm_topk", [True, False])
@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_router_matches_numpy(router, norm_topk):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(50, 6)).astype(np.float32)
  # A bias large enough to change choices, but not the weights (scores only).
  bias = rng.normal(scale=0.3, size=6).astype(np.float32)
  got = moe.route(jnp.asarray(logits), jnp.asarray(bias), 3, moe._SCORES[router], norm_topk)
  want = _np_route(logits, bias, 3, router, norm_topk)
  assert (np.asarray(got[1]) == want[1]).all()
  np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got[2]), want[2], rtol=1e-6)
  # The bias chooses: unbiased, other experts win for some token.
  unbiased = moe.route(jnp.asarray(logits), None, 3, moe._SCORES[router], norm_topk)[1]
  assert (np.asarray(unbiased) != want[1]).any()


def _np_best_groups(choice, groups, kept):
  """``choice`` outside each row's ``kept`` best groups (a group's score: the
  sum of its two best) at -inf."""
  T, E = choice.shape
  grouped = choice.reshape(T, groups, E // groups)
  score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
  keep = np.zeros((T, groups), bool)
  np.put_along_axis(keep, np.argsort(-score, axis=-1, kind="stable")[:, :kept], True, -1)
  return np.where(keep[:, :, None], grouped, -np.inf).reshape(T, E)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_group_limited_routing_and_router_scale_match_numpy(norm_topk):
  """DeepSeek-V3's node-limited routing (model.router_groups 4, 2 kept): the k
  experts from each token's two best groups of two, chosen by scores + bias;
  the weights the scores (renormalised or not) x model.router_scale."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(50, 8)).astype(np.float32)
  bias = rng.normal(scale=0.3, size=8).astype(np.float32)
  route = functools.partial(moe.route, jnp.asarray(logits), jnp.asarray(bias), 3,
                            moe._SCORES["sigmoid"], norm_topk, scale=2.5)
  weights, experts, _ = route(groups=4, topk_groups=2)
  scores = 1 / (1 + np.exp(-logits))
  chosen = np.argsort(-_np_best_groups(scores + bias, 4, 2), axis=-1, kind="stable")[:, :3]
  want = np.take_along_axis(scores, chosen, -1)
  if norm_topk:
    want = want / want.sum(-1, keepdims=True)
  assert (np.asarray(experts) == chosen).all()
  np.testing.assert_allclose(np.asarray(weights), 2.5 * want, rtol=1e-6)
  # The limit binds: plain top-k takes an expert of a dropped group for some token.
  assert (np.asarray(route()[1]) != chosen).any()
  # Every group kept leaves every expert to choose.
  choice = jnp.asarray(scores + bias)
  np.testing.assert_array_equal(np.asarray(moe.keep_best_groups(choice, 4, 4)), choice)


@pytest.mark.slow
def test_a_moe_layer_is_the_weighted_sum_of_its_experts_ffns():
  """The whole layer against a per-token NumPy loop: route, run the k chosen
  experts' gated FFNs, weigh, add; padding tokens get nothing."""
  cfg, model = _model(num_layers=1, router_norm_topk=False)
  params = nn.unbox(_params(num_layers=1, router_norm_topk=False))
  captured = {}

  # The FFN sublayer's input and output, read with Flax's intercepted calls.
  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, moe.MixtureOfExperts) and context.method_name == "__call__":
      captured["x"], captured["real"], captured["y"] = args[0], args[1], out[0]
    return out

  with nn.intercept_methods(interceptor):
    model.apply({"params": params}, IDS, segment_ids=SEGMENTS)
  p = jax.tree.map(np.asarray, params["decoder"]["layer_0"]["ffn"])
  x = np.asarray(captured["x"]).reshape(-1, 16)
  real = np.asarray(captured["real"]).reshape(-1)
  weights, chosen, _ = _np_route(x @ p["router"]["kernel"], 0.0, K, "softmax", False)
  silu = lambda a: a / (1 + np.exp(-a))
  want = np.zeros_like(x)
  for t in range(x.shape[0]):
    if not real[t]:
      continue
    for w, e in zip(weights[t], chosen[t]):
      h = silu(x[t] @ p["wi"]["kernel"][e]) * (x[t] @ p["wv"]["kernel"][e])
      want[t] += w * (h @ p["wo"]["kernel"][e])
  assert (~real).sum() == 2  # the two padding tokens
  np.testing.assert_allclose(np.asarray(captured["y"]).reshape(-1, 16), want, atol=1e-5)


# ---------------------------------------------------------------- dispatch
@pytest.mark.parametrize("changes", [
    dict(), dict(activation="gelu", use_bias=True), dict(shared_experts=1),
    dict(router="sigmoid", router_norm_topk=False)], ids=["swiglu", "gelu_bias", "shared",
                                                          "sigmoid"])
@pytest.mark.slow
def test_dropless_and_capacity_agree_when_nothing_overflows(changes):
  params = _params(**changes)
  dropless = _forward(params, **changes)
  # Capacity E: every expert has a row for every token's every choice.
  roomy = _forward(params, capacity_factor=float(E), **changes)
  np.testing.assert_allclose(np.asarray(roomy["logits"]), np.asarray(dropless["logits"]),
                             atol=2e-5)
  for stats in (dropless["moe"]["decoder"], roomy["moe"]["decoder"]):
    assert float(stats.dropped.sum()) == 0.0
  np.testing.assert_array_equal(np.asarray(roomy["moe"]["decoder"].counts),
                                np.asarray(dropless["moe"]["decoder"].counts))
  # A tight capacity drops, and says how many.
  tight = _forward(params, capacity_factor=0.5, **changes)
  dropped = np.asarray(tight["moe"]["decoder"].dropped).sum(-1)  # per layer
  counts = np.asarray(tight["moe"]["decoder"].counts).sum((1, 2))
  rows = E * moe.capacity(IDS.size, K, E, 0.5)
  assert (dropped >= counts - rows).all() and (dropped > 0).all()
  assert not np.allclose(np.asarray(tight["logits"]), np.asarray(dropless["logits"]))


def test_capacity_rows_keep_first_choices_first():
  """Priority: every token's first choice before any second choice (GShard);
  within a rank, token order. Expert 0 has room for 2 of its 3 requests."""
  experts = jnp.asarray([[1, 0], [0, 1], [0, 1], [2, 3]], jnp.int32)  # [T=4, k=2]
  row, rows, sizes = moe.capacity_rows(experts, 4, 1.0)  # C = ceil(4 * 2 / 4) = 2
  assert rows == 8 and list(np.asarray(sizes)) == [2, 2, 2, 2]
  row = np.asarray(row).reshape(4, 2)
  # Expert 0: tokens 1 and 2 ask first, token 0 second: token 0's is dropped.
  assert row[1, 0] == 0 and row[2, 0] == 1 and row[0, 1] == rows
  # Expert 1: token 0 first (row 2), then tokens 1 and 2 second: token 2 dropped.
  assert row[0, 0] == 2 and row[1, 1] == 3 and row[2, 1] == rows
  assert row[3, 0] == 4 and row[3, 1] == 6


# ------------------------------------------------------ balancing and loss
def _np_balance(counts, scores, tokens):
  f = counts / counts.sum(-1, keepdims=True)
  p = scores / tokens[..., None]
  return counts.shape[-1] * (f * p).sum(-1)


@pytest.mark.slow
def test_balance_and_z_losses_match_numpy_per_batch_and_per_sequence():
  rng = np.random.default_rng(1)
  counts = rng.integers(0, 9, size=(3, 4, E)).astype(np.float32)  # [layers, B, E]
  tokens = counts.sum(-1) / K
  scores = rng.uniform(size=(3, 4, E)).astype(np.float32) * tokens[..., None]
  z = rng.uniform(size=(3, 4)).astype(np.float32)
  stats = moe.RouterStats(counts=jnp.asarray(counts), scores=jnp.asarray(scores),
                          tokens=jnp.asarray(tokens), log_z_sq=jnp.asarray(z),
                          dropped=jnp.zeros((3, 4)))
  per_batch = _np_balance(counts.sum(1), scores.sum(1), tokens.sum(1)).mean()
  per_seq = _np_balance(counts, scores, tokens).mean()
  np.testing.assert_allclose(float(moe.balance_loss(stats, "batch")), per_batch, rtol=1e-5)
  np.testing.assert_allclose(float(moe.balance_loss(stats, "sequence")), per_seq, rtol=1e-5)
  np.testing.assert_allclose(float(moe.router_z_loss(stats)),
                             (z.sum(1) / tokens.sum(1)).mean(), rtol=1e-5)
  # A uniform load with uniform scores is the loss's floor, 1 (Switch eq. 4).
  uniform = moe.RouterStats(counts=jnp.full((1, 2, E), 6.0), scores=jnp.full((1, 2, E), 3 / E * K),
                            tokens=jnp.full((1, 2), 3.0 * K), log_z_sq=jnp.zeros((1, 2)),
                            dropped=jnp.zeros((1, 2)))
  np.testing.assert_allclose(float(moe.balance_loss(uniform, "batch")), 1.0, rtol=1e-6)


@pytest.mark.slow
def test_the_expert_bias_moves_by_the_sign_rule_and_has_no_gradient():
  params = nn.unbox(_params(moe_balance="bias"))
  assert params["decoder"]["layer_0"]["ffn"]["expert_bias"].shape == (E,)
  counts = {"decoder": jnp.asarray([[5.0, 1.0, 3.0, 3.0], [0.0, 0.0, 4.0, 8.0]])}
  moved = moe.update_expert_bias(params, params, counts, 0.01)
  np.testing.assert_allclose(moved["decoder"]["layer_0"]["ffn"]["expert_bias"],
                             [-0.01, 0.01, 0.0, 0.0])
  np.testing.assert_allclose(moved["decoder"]["layer_1"]["ffn"]["expert_bias"],
                             [0.01, 0.01, -0.01, -0.01])
  # The scanned layout: one [layers, E] array, the same rule.
  scanned = stack_layer_params(params)
  moved_scan = moe.update_expert_bias(scanned, scanned, counts, 0.01)
  np.testing.assert_allclose(moved_scan["decoder"]["layers"]["ffn"]["expert_bias"],
                             np.stack([moved["decoder"][f"layer_{i}"]["ffn"]["expert_bias"]
                                       for i in range(2)]))
  _, model = _model(moe_balance="bias")

  def loss(p):
    return model.apply({"params": p}, IDS, segment_ids=SEGMENTS)["logits"].sum()
  grads = jax.grad(loss)(moved)
  assert not np.asarray(grads["decoder"]["layer_0"]["ffn"]["expert_bias"]).any()
  assert np.asarray(grads["decoder"]["layer_0"]["ffn"]["router"]["kernel"]).any()


# ---------------------------------------------------- decode, scan, layers
@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
@pytest.mark.slow
def test_kv_cache_decoding_equals_the_full_forward(scan):
  params = nn.unbox(_params())
  if scan:
    params = stack_layer_params(params)
  cfg = model_config_from_dict(dict(BASE, scan_layers=scan))
  ids = IDS[1:]
  full = build_model(cfg).apply({"params": params}, ids)["logits"]
  decoder = build_model(cfg, use_cache=True)
  cache = decoder.init(jax.random.PRNGKey(0), jnp.zeros_like(ids))["cache"]
  # One compiled step for every position (the same shapes each time).
  step = jax.jit(lambda cache, tok: decoder.apply({"params": params, "cache": cache}, tok,
                                                  mutable=["cache"]))
  steps = []
  for t in range(ids.shape[1]):
    out, mutated = step(cache, ids[:, t:t + 1])
    cache = mutated["cache"]
    steps.append(out["logits"])
  np.testing.assert_allclose(np.concatenate(steps, axis=1), np.asarray(full), atol=1e-5)


@pytest.mark.slow
def test_scan_and_loop_compute_the_same_model_and_router_statistics():
  params = nn.unbox(_params())
  loop = _forward(params)
  cfg = model_config_from_dict(dict(BASE, scan_layers=True, remat="full"))
  scan = build_model(cfg).apply({"params": stack_layer_params(params)}, IDS,
                                segment_ids=SEGMENTS)
  np.testing.assert_allclose(np.asarray(scan["logits"]), np.asarray(loop["logits"]), atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
               scan["moe"]["decoder"], loop["moe"]["decoder"])


def test_moe_every_and_first_dense_layers_choose_the_moe_layers():
  cfg = model_config_from_dict(dict(BASE, num_layers=6, moe_every=2, first_dense_layers=2))
  # Layers 4 and 6 (1-based multiples of 2, from the third layer on): Qwen3-MoE's rule.
  assert moe_layers(cfg, 6) == (3, 5)
  params = build_model(cfg).init(jax.random.PRNGKey(0), IDS)["params"]["decoder"]
  for i in range(6):
    assert ("router" in params[f"layer_{i}"]["ffn"]) == (i in (3, 5)), i
  with pytest.raises(ConfigError, match="scan_layers=True .* mix dense and MoE"):
    model_config_from_dict(dict(BASE, num_layers=6, moe_every=2, scan_layers=True))
  with pytest.raises(ConfigError, match="leaves no MoE layer"):
    model_config_from_dict(dict(BASE, num_layers=2, first_dense_layers=2))


# ------------------------------------------------------------- the config
@pytest.mark.parametrize("changes,error,named", [
    (dict(ffn_type="dense", num_experts=4), InactiveSetting, "model.num_experts=4"),
    (dict(ffn_type="dense", router="sigmoid"), InactiveSetting, "model.router='sigmoid'"),
    (dict(experts_per_token=5), ConfigError, "experts_per_token=5 is more than"),
    (dict(router_bias_rate=0.01), InactiveSetting, "moe_balance='bias' only"),
    (dict(capacity_factor=-1.0), ConfigError, "capacity_factor must be >= 0"),
    (dict(router="topk"), ConfigError, "softmax, sigmoid"),
    (dict(ffn_type="dense", router_scale=2.5), InactiveSetting, "model.router_scale=2.5"),
    (dict(router_scale=0.0), ConfigError, "router_scale must be > 0"),
    (dict(router_groups=3), ConfigError, "router_groups=3 must divide"),
    (dict(router_groups=2, router_topk_groups=3), ConfigError,
     "router_topk_groups=3 is more than"),
    (dict(router_groups=4, router_topk_groups=2), ConfigError, "groups of 1 expert"),
    (dict(experts_per_token=3, router_groups=2, router_topk_groups=1), ConfigError,
     "experts_per_token=3 is more than the 2 experts"),
])
def test_bad_moe_settings_are_named(changes, error, named):
  base = dict(BASE)
  if changes.get("ffn_type") == "dense":  # the MoE fields at their defaults
    base = {k: v for k, v in BASE.items() if k not in ("num_experts", "experts_per_token")}
  with pytest.raises(error, match=named.replace("(", r"\(")):
    model_config_from_dict(dict(base, **changes))


@pytest.mark.parametrize("overrides,named", [
    ({"train.moe_aux_loss": 0.1}, "train.moe_aux_loss=0.1 is read by a mixture of experts"),
    ({"train.router_z_loss": 0.001}, "train.router_z_loss=0.001"),
    ({"model.ffn_type": "moe", "model.moe_balance": "bias", "train.moe_aux_scope": "sequence"},
     "train.moe_aux_scope='sequence'"),
])
def test_router_losses_are_set_only_where_read(overrides, named):
  config = load_config("lm.py:tiny")
  with config.unlocked():
    for key, value in overrides.items():
      section, field = key.split(".")
      config[section][field] = value
  with pytest.raises(InactiveSetting, match=named):
    run_config.resolve(config)


def test_moe_variant_matches_active_or_total_parameters():
  lm = _config_module("lm.py", "lm")
  dense = model_config_from_dict(load_config("lm.py:tiny").model)
  shapes = footprint.param_shapes(dense)
  ffn = lambda s: sum(int(np.prod(v.shape)) for p, v in s.items() if "/ffn/" in p)
  for match, shared in (("active", 0), ("active", 1), ("total", 0)):
    over = lm.moe_variant("tiny", shared_experts=shared, match=match)
    cfg = model_config_from_dict(dict(dense.__dict__, **{
        k.removeprefix("model."): v for k, v in over.items()}))
    moe_shapes = footprint.param_shapes(cfg)
    active = footprint.active_params(cfg, moe_shapes) - (
        footprint.active_params(dense, shapes) - ffn(shapes))
    total = ffn(moe_shapes)
    got = active if match == "active" else total
    # Rounded down to a whole width: within one unit of width per matrix.
    per_unit = (2 if not dense.gated else 3) * dense.d_model * dense.num_layers * (
        (over["model.experts_per_token"] if match == "active" else over["model.num_experts"])
        + shared)
    assert 0 <= ffn(shapes) - got < per_unit, (match, shared)


# ------------------------------------------------------- training, resuming
MOE_RUN = {"model.ffn_type": "moe", "model.num_experts": 4, "model.experts_per_token": 2,
           "model.num_layers": 2, "model.moe_balance": "bias", "model.router_bias_rate": 0.01,
           "train.router_z_loss": 0.001}


@pytest.mark.usefixtures("shared_compilation_cache")
def test_a_moe_run_logs_its_router_and_resumes_bitwise(tmp_path, capsys):
  straight = train("lm.py:tiny", tmp_path / "straight", MOE_RUN)
  expected = metrics.read_scalars(tmp_path / "straight" / "tensorboard")
  for tag in ("train/moe_aux_loss", "train/router_z_loss",
              *(f"layer_stats/{k}/decoder_{i:02d}" for i in (0, 1)
                for k in ("expert_load_max", "expert_load_min", "dropped_tokens"))):
    assert len(expected[tag]) == 20, tag
  assert all(v == 0.0 for _, v in expected["layer_stats/dropped_tokens/decoder_00"])
  assert all(v >= 1.0 for _, v in expected["layer_stats/expert_load_max/decoder_00"])
  workdir = tmp_path / "run"
  train("lm.py:tiny", workdir, MOE_RUN, {"train.num_steps": 10})
  resumed = train("lm.py:tiny", workdir, MOE_RUN)
  assert "Resumed from step 10" in capsys.readouterr().out
  got = metrics.read_scalars(workdir / "tensorboard")
  for tag in ("train/loss", "train/moe_aux_loss", "layer_stats/expert_load_max/decoder_01",
              "eval/loss"):
    assert got[tag] == expected[tag], tag
  assert resumed.metrics == straight.metrics
  # The expert bias is state: it moved, and the resumed run ends where the
  # straight one does, bit for bit.
  a = trained_run.load_run(tmp_path / "straight").params
  b = trained_run.load_run(workdir).params
  bias = np.asarray(a["decoder"]["layer_0"]["ffn"]["expert_bias"])
  assert np.abs(bias).max() > 0
  jax.tree.map(np.testing.assert_array_equal, a, b)


# ------------------------------------------------------ expert parallelism
# One process of 4 fake CPU devices (the device count is fixed before JAX is
# imported): a tiny MoE LM's objective (loss + balance and z losses) and its
# gradients, on one device and with the experts split over mesh.expert, from
# the same parameters and batch; each compiled program's HLO text. Then the
# layer alone with the ragged exchange of TPU and GPU, whose primitive
# XLA:CPU lacks, stood in for by one built of all-to-alls as its docstring
# defines it (jax.lax.ragged_all_to_all).
_EXPERT_PARALLEL = textwrap.dedent("""
    import dataclasses, json, re
    import flax.linen as nn
    import jax, jax.numpy as jnp, numpy as np
    from tfx_jax import tasks
    from tfx_jax.run import config_base
    from tfx_jax.run import config as run_config
    from tfx_jax.run import setup as run_setup
    from tfx_jax.run import sharding
    from tfx_jax.model.layers import moe
    from tfx_jax.model.families import build_model

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 32, size=(8, 9)).astype(np.int32)
    seg = np.ones((8, 8), np.int32)
    seg[1, 5:] = seg[6, 2:] = 0  # padding, not routed
    BATCH = {"inputs": ids[:, :-1], "targets": ids[:, 1:], "segment_ids": seg,
             "positions": np.tile(np.arange(8, dtype=np.int32), (8, 1)),
             "weights": seg.astype(np.float32)}

    def objective_and_grads(mesh, capacity_factor, params=None):
      c = config_base.base_config()
      c.model.update(dict(family="decoder_only", num_layers=2, d_model=16, num_heads=2,
                          d_ff=24, vocab_size=32, max_len=8, position="rope",
                          activation="swiglu", use_bias=True, scan_layers=True,
                          ffn_type="moe", num_experts=8, experts_per_token=2,
                          shared_experts=1, capacity_factor=capacity_factor))
      c.train.update(batch_size=8, seq_len=8, moe_aux_loss=0.01, router_z_loss=0.001)
      c.mesh.update(mesh)
      run = run_config.resolve(c)
      devices = jax.devices()[:int(np.prod(list(mesh.values())))]
      setup = run_setup.ShardedRun(run, run.model, devices=devices)
      task = tasks.get(run.task)
      model = build_model(run.model, platform="cpu")
      objective = task.objective(run, "decoder_only", train=True)
      if params is None:
        params = jax.jit(model.init)(jax.random.PRNGKey(0), BATCH["inputs"])["params"]
        params = jax.device_get(nn.unbox(params))

      def f(p, batch):
        with jax.sharding.use_abstract_mesh(setup.mesh.abstract_mesh):
          out = model.apply({"params": p}, **task.model_inputs(batch))
          loss, sums = objective(out, batch)
        return loss, (sums["router/aux_loss"], sums["router/z_loss"],
                      out["moe"]["decoder"].counts, out["moe"]["decoder"].dropped)

      step = jax.jit(jax.value_and_grad(f, has_aux=True),
                     in_shardings=(setup.state_shardings.params, setup.batch_sharding))
      args = (jax.device_put(params, setup.state_shardings.params),
              sharding.global_batch(BATCH, setup.mesh))
      compiled = step.lower(*args).compile()
      (loss, (aux, z, counts, dropped)), grads = jax.device_get(compiled(*args))
      return params, {"loss": float(loss), "aux": float(aux), "z": float(z),
                      "counts": counts.tolist(), "dropped": float(dropped.sum()),
                      "grads": {jax.tree_util.keystr(k): np.asarray(v).tolist()
                                for k, v in jax.tree_util.tree_leaves_with_path(grads)},
                      "hlo": compiled.as_text()}

    out = {}
    params, out["one"] = objective_and_grads({"data": 1}, 0.0)
    # Capacity 4.0 = E / k: every expert has a row for each of a device's tokens.
    for name, mesh, factor in (("dropless", {"data": 2, "expert": 2}, 0.0),
                               ("capacity", {"data": 1, "expert": 4}, 4.0)):
      out[name] = objective_and_grads(mesh, factor, params)[1]

    # The ragged exchange (platform "gpu"), its primitive stood in for.
    calls = []
    def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                          recv_sizes, *, axis_name, axis_index_groups=None):
      calls.append(axis_name)
      n, N = input_offsets.shape[0], operand.shape[0]
      i = jnp.arange(N)
      send = jnp.where(i < send_sizes[:, None], input_offsets[:, None] + i, N)
      got = jax.lax.all_to_all(operand.at[send].get(mode="fill", fill_value=0),
                               axis_name, 0, 0)
      at = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
      to = jnp.where(i < recv_sizes[:, None], at[:, None] + i, output.shape[0])
      return output.at[to.reshape(-1)].set(got.reshape(n * N, *operand.shape[1:]),
                                           mode="drop")
    jax.lax.ragged_all_to_all = ragged_all_to_all

    spec = moe.MoeSpec(num_experts=8, experts_per_token=3, expert_dim=12, shared_dim=0,
                       score=jax.nn.sigmoid, norm_topk=True, expert_bias=False,
                       capacity_factor=0.0)
    x = jnp.asarray(rng.normal(size=(8, 5, 16)), jnp.float32)
    real = jnp.asarray(rng.uniform(size=(8, 5)) > 0.2)
    probe = jnp.asarray(rng.normal(size=(8, 5, 16)), jnp.float32)
    layer = lambda platform: moe.MixtureOfExperts(spec, act=jax.nn.gelu, gated=False,
                                                  use_bias=True, platform=platform)
    shapes = nn.unbox(jax.eval_shape(layer("cpu").init, jax.random.PRNGKey(1), x, real))
    p = jax.tree.map(lambda v: jnp.asarray(0.3 * rng.normal(size=v.shape), jnp.float32),
                     shapes)  # biases too: not zero
    mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1, "expert": 4})

    def layer_loss(platform, p, x):
      y, stats = layer(platform).apply(p, x, real)
      return jnp.sum(y * probe), stats.counts

    ref = jax.jit(jax.value_and_grad(lambda p, x: layer_loss("cpu", p, x), (0, 1),
                                     has_aux=True))(p, x)
    def ep_loss(p, x):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return layer_loss("gpu", p, x)
    put = lambda v, spec: jax.device_put(v, jax.sharding.NamedSharding(mesh, spec))
    P = jax.sharding.PartitionSpec
    ragged = jax.jit(jax.value_and_grad(ep_loss, (0, 1), has_aux=True))(
        jax.tree.map(lambda v: put(v, P()), p), put(x, P(sharding.BATCH_AXES)))
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(u) - np.asarray(v))))
                            for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    out["ragged"] = {"calls": len(calls), "loss": [float(ref[0][0]), float(ragged[0][0])],
                     "counts_equal": bool((ref[0][1] == ragged[0][1]).all()),
                     "grad_diff": diff(ref[1], ragged[1]),
                     "grad_max": max(float(np.max(np.abs(v))) for v in jax.tree.leaves(ref[1]))}

    # A capacity that overflows: each device's own (GShard's per-group C_l),
    # so the layer over 4 devices is the one-device layer on each device's 2
    # sequences alone, drops included.
    tight = lambda: moe.MixtureOfExperts(dataclasses.replace(spec, capacity_factor=1.0),
                                         act=jax.nn.gelu, gated=False, use_bias=True)
    def tight_apply(p, x, real):
      y, stats = tight().apply(p, x, real)
      return y, stats.dropped
    def tight_ep(p, x, real):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return tight_apply(p, x, real)
    alone = jax.jit(tight_apply)
    ys, drops = zip(*(alone(p, x[i:i + 2], real[i:i + 2]) for i in range(0, 8, 2)))
    y, dropped = jax.jit(tight_ep)(jax.tree.map(lambda v: put(v, P()), p),
                                   put(x, P(sharding.BATCH_AXES)), real)
    out["overflow"] = {"y_diff": float(np.max(np.abs(np.concatenate(ys) - y))),
                       "dropped": [np.concatenate(drops).tolist(), np.asarray(dropped).tolist()]}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def expert_parallel_runs():
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, "-c", _EXPERT_PARALLEL], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_expert_parallel_runs_match_one_device(expert_parallel_runs):
  """8 experts split over mesh.expert (4 a device with data=2; 2 a device
  over 4 devices), dropless and with a capacity nothing overflows: the objective, the router's
  statistics and every gradient are the one-device ones, up to the order of
  the sums (float32 rounding)."""
  one = expert_parallel_runs["one"]
  for name in ("dropless", "capacity"):
    run = expert_parallel_runs[name]
    for key in ("loss", "aux", "z"):
      assert run[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (name, key)
    assert run["counts"] == one["counts"] and run["dropped"] == one["dropped"] == 0.0, name
    scale = max(np.abs(np.asarray(g)).max() for g in one["grads"].values())
    assert sorted(run["grads"]) == sorted(one["grads"])
    for path, g in one["grads"].items():
      np.testing.assert_allclose(run["grads"][path], g, rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=f"{name} {path}")


@pytest.mark.slow
def test_expert_parallel_sends_rows_by_all_to_all_not_kernels(expert_parallel_runs):
  """The compiled programs move tokens, never expert kernels: per MoE layer
  (2 here) 2 all-to-alls of rows forward and 2 backward, and in the dropless
  exchange 1 more of the rows per (source, local expert); no all-gather of an
  expert kernel ([E, 16, 24] / [E, 24, 16]: wi, wv, wo), which the one-device
  program has no reason for either. ``scale.hlo`` counts them."""
  expected = {"dropless": 2 * (4 + 1), "capacity": 2 * 4}
  for name, all_to_alls in expected.items():
    text = expert_parallel_runs[name]["hlo"]
    totals = hlo.count_program(text, 4).collective_totals()
    assert totals["all-to-all"]["count"] == all_to_alls, (name, totals)
    gathered = [tuple(int(d) for d in dims.split(",") if d) for dims in re.findall(
        r"= \w+\[([\d,]*)\]\S* all-gather(?:-start)?\(", text)]
    assert not [s for s in gathered if s[-2:] in ((16, 24), (24, 16))], (name, gathered)
  assert "all-to-all" not in expert_parallel_runs["one"]["hlo"]


@pytest.mark.slow
def test_the_ragged_exchange_lays_out_rows_as_the_dense_one(expert_parallel_runs):
  """The layer as compiled for GPU/TPU (rows packed by
  ``jax.lax.ragged_all_to_all``, here a stand-in of all-to-alls), 8 experts
  over 4 devices, k = 3, sigmoid router, biases, padding: the same output and
  gradients as one device."""
  ragged = expert_parallel_runs["ragged"]
  assert ragged["calls"] == 2  # traced once: there and back (the backward transposes)
  assert ragged["loss"][1] == pytest.approx(ragged["loss"][0], rel=1e-5, abs=1e-6)
  assert ragged["counts_equal"]
  assert ragged["grad_diff"] <= 1e-5 * ragged["grad_max"]


# A dropless exchange's rows there and back as a TPU program has them (v5e-4,
# mesh.expert=4: the operand, the output buffer, offsets and sizes).
_RAGGED = """HloModule m, is_scheduled=true

ENTRY %main (x: bf16[512,256], buf: bf16[2048,256], o: s32[4], n: s32[4]) -> bf16[512,256] {
  %x = bf16[512,256]{1,0} parameter(0)
  %buf = bf16[2048,256]{1,0} parameter(1)
  %o = s32[4]{0} parameter(2)
  %n = s32[4]{0} parameter(3)
  %there = bf16[2048,256]{1,0} ragged-all-to-all(%x, %buf, %o, %n, %o, /*index=5*/%n), channel_id=1, replica_groups={{0,1,2,3}}
  ROOT %back = bf16[512,256]{1,0} ragged-all-to-all(%there, %x, %o, %n, %o, /*index=5*/%n), channel_id=2, replica_groups={{0,1,2,3}}
}
"""


@pytest.mark.slow
def test_an_overflowing_capacity_is_each_devices_own(expert_parallel_runs):
  """Capacity factor 1 (C_l = ceil(10 x 3 / 8) = 4 rows per expert on each
  device's 10 tokens): the experts split over 4 devices give the layer run on
  each device's sequences alone, the same assignments dropped."""
  overflow = expert_parallel_runs["overflow"]
  alone, split = overflow["dropped"]
  assert split == alone and sum(split) > 0  # per sequence
  assert overflow["y_diff"] <= 1e-5


def test_hlo_counts_a_ragged_all_to_all_by_what_it_can_send():
  counts = hlo.count_program(_RAGGED, num_devices=4)
  assert counts.collective_totals()["ragged-all-to-all"] == {
      "count": 2, "bytes": (512 + 2048) * 256 * 2}
  assert {c.group for c in counts.collectives} == {4}


def test_a_mesh_expert_axis_must_divide_the_experts():
  config = load_config("lm.py:tiny")
  with config.unlocked():
    config.model.update(ffn_type="moe", num_experts=8, experts_per_token=2)
    config.mesh.update(data=1, expert=3)
    config.train.batch_size = config.eval.batch_size = 12
  with pytest.raises(ConfigError, match=r"mesh.expert=3 does not divide "
                     r"model.num_experts=8.*\[1, 2, 4, 8\]"):
    run_config.resolve(config)
  with config.unlocked():  # a dense model: the expert axis shards the batch alone
    config.model.ffn_type = "dense"  # num_experts, experts_per_token: the defaults
  run_config.resolve(config)


@pytest.mark.slow
def test_the_expert_bias_moves_once_per_update_under_accumulation():
  """optim.accumulate_steps=2: the first micro-batch leaves the bias where it
  was, the second (the optimizer's update) moves every entry by +-u or 0."""
  from tfx_jax.run import setup as run_setup
  from tfx_jax.run import sharding
  from helpers import tiny_config
  config = tiny_config("lm.py:tiny", {**MOE_RUN, "optim.accumulate_steps": 2})
  run = run_setup.ShardedRun(r := run_config.resolve(config), r.model)
  state, step = run.init_state(), run.train_step()
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 200, size=(4, 33)).astype(np.int32)
  batch = sharding.global_batch(
      {"inputs": ids[:, :-1], "targets": ids[:, 1:], "segment_ids": np.ones((4, 32), np.int32),
       "positions": np.tile(np.arange(32, dtype=np.int32), (4, 1)),
       "weights": np.ones((4, 32), np.float32)}, run.mesh)
  bias = lambda s: np.asarray(jax.device_get(s.params)["decoder"]["layer_0"]["ffn"]["expert_bias"])
  initial = bias(state)  # the step donates its state
  first, _ = step(state, batch, run.step_hparams())
  after_first = bias(first)
  np.testing.assert_array_equal(after_first, initial)
  second, _ = step(first, batch, run.step_hparams())
  moved = bias(second) - after_first
  u = MOE_RUN["model.router_bias_rate"]
  assert np.abs(moved).max() == pytest.approx(u)
  assert set(np.round(np.abs(moved) / u, 6)) <= {0.0, 1.0}
