"""QK-clip (``train.qk_clip``, tfx_jax/run/qk_clip.py): each head's largest
logit against NumPy, the rescale against NumPy (heads over tau scaled, the
others untouched, the clipped head's largest logit tau afterwards), in the
train step under scan with grouped keys, biases and Muon (after the update,
outside the optimizer's state), the logged fraction, the 8-device mesh, and
the bad settings."""

import json
import os
import subprocess
import sys
import textwrap
import typing

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config_attention import AttentionType
from tfx_jax.model.families import build_model
from tfx_jax.model.layers.attention import (QK_CLIP_COLLECTION, QK_CLIP_KIND, Attention,
                                            AttentionSpec)
from tfx_jax.model.layers.mla import QK_CLIP_KIND as MLA_KIND
from tfx_jax.model.layers.mla import MlaSpec, MultiHeadLatentAttention
from tfx_jax.model.layers.positions import RotarySpec
from tfx_jax.run import config as run_config
from tfx_jax.run import config_base
from tfx_jax.run import qk_clip
from tfx_jax.run import setup as run_setup
from tfx_jax.run import sharding
from tfx_jax import tasks

from helpers import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H, K, D, B, L = 4, 4, 16, 2, 6
MLA_C, MLA_Q, MLA_N, MLA_R, MLA_V = 8, 6, 4, 4, 6  # d_c, d_c', d_n, d_R, d_v


def _np_max_logits(p, x, num_kv_heads):
  """[H]: max over batch, query and causal key of (x Wq + bq).(x Wk + bk) / sqrt(K)."""
  q = np.einsum("bld,dhk->blhk", x, p["query"]["kernel"]) + p["query"]["bias"]
  k = np.einsum("bld,dnk->blnk", x, p["key"]["kernel"]) + p["key"]["bias"]
  k = np.repeat(k, H // num_kv_heads, axis=2)  # head h reads key head h // G
  logits = np.einsum("blhk,bshk->bhls", q, k) / np.sqrt(K)
  logits = np.where(np.tril(np.ones((L, L), bool)), logits, -np.inf)
  return logits.max(axis=(0, 2, 3))


def _np_rescale(p, max_h, tau, num_kv_heads):
  """Megatron-LM's grouped rule in NumPy: eta_g = min(1, tau / group max);
  queries and the group's key by sqrt(eta_g)."""
  g = H // num_kv_heads
  group = max_h.reshape(num_kv_heads, g).max(axis=1)
  eta = np.where(group > tau, tau / group, 1.0)
  q_scale, k_scale = np.sqrt(np.repeat(eta, g)), np.sqrt(eta)
  out = {name: dict(v) for name, v in p.items()}
  out["query"]["kernel"] = p["query"]["kernel"] * q_scale[None, :, None]
  out["query"]["bias"] = p["query"]["bias"] * q_scale[:, None]
  out["key"]["kernel"] = p["key"]["kernel"] * k_scale[None, :, None]
  out["key"]["bias"] = p["key"]["bias"] * k_scale[:, None]
  return out, np.repeat(group > tau, g)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_the_rescale_against_numpy(num_kv_heads):
  spec = AttentionSpec(num_heads=H, num_kv_heads=num_kv_heads, head_dim=K, use_bias=True,
                       causal=True)
  attention = Attention(spec)
  rng = np.random.default_rng(num_kv_heads)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = jnp.tril(jnp.ones((1, 1, L, L), bool))
  params = nn.unbox(attention.init(jax.random.PRNGKey(0), x, mask=mask)["params"])
  # Spread the heads' logits apart: head h's queries x (1 + 3h), biases nonzero.
  params = jax.tree.map(np.asarray, params)
  params["query"]["kernel"] = (params["query"]["kernel"]
                              * (1 + 3 * np.arange(H, dtype=np.float32))[None, :, None])
  params["query"]["bias"] = rng.normal(size=(H, K)).astype(np.float32)
  params["key"]["bias"] = rng.normal(size=(num_kv_heads, K)).astype(np.float32)

  def sown_max(p):
    _, sown = attention.apply({"params": p}, x, mask=mask, mutable=[QK_CLIP_COLLECTION])
    (value,) = sown[QK_CLIP_COLLECTION][QK_CLIP_KIND]
    return np.asarray(value)

  max_h = sown_max(params)
  np.testing.assert_allclose(max_h, _np_max_logits(params, x, num_kv_heads), rtol=1e-5)
  tau = float(np.sort(max_h)[1] + np.sort(max_h)[2]) / 2  # some heads over, some under
  want, want_over = _np_rescale(params, max_h, tau, num_kv_heads)
  got, over = qk_clip.standard_rule(params, jnp.asarray(max_h), tau)
  np.testing.assert_array_equal(np.asarray(over), want_over)
  assert want_over.any() and (num_kv_heads == 1 or not want_over.all())
  for name in ("query", "key"):
    for leaf in ("kernel", "bias"):
      np.testing.assert_allclose(got[name][leaf], want[name][leaf], rtol=1e-6)
  np.testing.assert_array_equal(got["value"]["kernel"], params["value"]["kernel"])
  # Heads of a group under tau: bitwise untouched.
  kept = ~want_over
  np.testing.assert_array_equal(np.asarray(got["query"]["kernel"])[:, kept],
                                params["query"]["kernel"][:, kept])
  after = _np_max_logits(jax.tree.map(np.asarray, got), x, num_kv_heads)
  g = H // num_kv_heads
  for n in range(num_kv_heads):
    heads = slice(n * g, (n + 1) * g)
    if want_over[n * g]:  # the group's largest logit is now tau
      assert after[heads].max() == pytest.approx(tau, rel=1e-5)
    else:
      np.testing.assert_allclose(after[heads], max_h[heads], rtol=1e-6)
  # ``apply`` finds the rule by the sown name and reports the fraction clipped.
  tree, fraction = qk_clip.apply({"layer": params},
                                 {"layer": {QK_CLIP_KIND: (jnp.asarray(max_h),)}}, tau)
  np.testing.assert_allclose(tree["layer"]["query"]["kernel"], want["query"]["kernel"],
                             rtol=1e-6)
  assert float(fraction) == pytest.approx(want_over.mean())


def _config(**train):
  c = config_base.base_config()
  c.model.update(dict(family="decoder_only", num_layers=2, d_model=D, num_heads=H,
                      num_kv_heads=2, d_ff=32, vocab_size=32, max_len=8, position="rope",
                      activation="swiglu", use_bias=True, scan_layers=True))
  c.train.update(batch_size=2, seq_len=8, num_steps=3, **train)
  c.optim.update(optimizer="muon", warmup_steps=1, learning_rate=1e-2)
  return c


def _batch():
  ids = np.random.default_rng(0).integers(1, 32, size=(2, 9)).astype(np.int32)
  return {"inputs": ids[:, :-1], "targets": ids[:, 1:], "segment_ids": np.ones((2, 8), np.int32),
          "positions": np.tile(np.arange(8, dtype=np.int32), (2, 1)),
          "weights": np.ones((2, 8), np.float32)}


def _step(config):
  run = run_config.resolve(config)
  setup = run_setup.ShardedRun(run, run.model)
  state = setup.init_state()
  before = jax.device_get(state)  # the step donates the state
  new, metrics = setup.train_step()(state, sharding.global_batch(_batch(), setup.mesh),
                                    setup.step_hparams())
  return run, before, jax.device_get(new), jax.device_get(metrics)


def test_the_train_step_clips_after_a_muon_update_under_scan_with_grouped_keys():
  run, state, plain, _ = _step(_config())
  # Each head's largest logit of the step's forward, at the parameters before the update.
  model = build_model(run.model, deterministic=False)
  _, sown = model.apply({"params": state.params},
                        **tasks.get(run.task).model_inputs(_batch()),
                        rngs={"dropout": jax.random.PRNGKey(0)}, mutable=[QK_CLIP_COLLECTION])
  (max_lh,) = sown[QK_CLIP_COLLECTION]["decoder"]["layers"]["self_attention"][QK_CLIP_KIND]
  max_lh = np.asarray(max_lh)
  assert max_lh.shape == (2, H)  # stacked by the scan, one row a layer
  tau = float(np.median(max_lh))
  _, _, clipped, metrics = _step(_config(qk_clip=tau))
  attention = lambda p: p["decoder"]["layers"]["self_attention"]
  want_over = []
  for layer in range(2):
    layer_params = jax.tree.map(lambda a: np.asarray(a)[layer], attention(plain.params))
    want, over = _np_rescale(layer_params, max_lh[layer], tau, 2)
    want_over.append(over)
    for name in ("query", "key"):
      for leaf in ("kernel", "bias"):
        np.testing.assert_allclose(np.asarray(attention(clipped.params)[name][leaf])[layer],
                                   want[name][leaf], rtol=1e-5, atol=1e-7)
  want_over = np.stack(want_over)
  assert want_over.any() and not want_over.all()
  assert float(metrics["qk_clip_fraction"]) == pytest.approx(want_over.mean())
  # Everything else is the plain update's, the optimizer's state included.
  flat_plain = traverse_util.flatten_dict(plain.params)
  for path, value in traverse_util.flatten_dict(clipped.params).items():
    if path[-2] not in ("query", "key"):
      np.testing.assert_allclose(value, flat_plain[path], rtol=1e-6, atol=1e-7, err_msg=path)
  for a, b in zip(jax.tree.leaves(clipped.opt_state), jax.tree.leaves(plain.opt_state)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("train, model, message", [
    ({"qk_clip": -1.0}, {}, "train.qk_clip"),
    ({"qk_clip": float("nan")}, {}, "train.qk_clip"),
    ({"qk_clip": 100.0}, {"qk_norm": "rmsnorm"}, "model.qk_norm"),
])
def test_bad_settings_are_config_errors(train, model, message):
  config = _config(**train)
  config.model.update(model)
  with pytest.raises(ConfigError, match=message):
    run_config.resolve(config)


@pytest.mark.slow
def test_the_fraction_is_logged(tmp_path):
  workdir = tmp_path / "run"
  train("lm.py:tiny", workdir, {"train.qk_clip": 1e-3, "train.num_steps": 2,
                                "train.log_every_steps": 1})
  from tfx_jax.run import metrics  # pylint: disable=import-outside-toplevel
  scalars = metrics.read_scalars(workdir / "tensorboard")
  # tau this small clips every head at every step.
  assert [v for _, v in scalars["train/qk_clip_fraction"]] == [1.0, 1.0]
  # The run records its budgets beside its parameter count (the report's points table).
  from tfx_jax.records import status  # pylint: disable=import-outside-toplevel
  recorded = status.read_status(workdir)
  assert recorded.budgets["params"] == recorded.num_params
  # helpers.TINY: 1 layer, 2 heads of 16, float32.
  assert recorded.budgets["kv_bytes_per_token"] == 2 * 2 * 16 * 1 * 4


# argv[1]: JSON list of (mesh, devices, model overrides), each taking 2 clipped
# steps from the same init.
_MESHES = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from flax import traverse_util
    from tfx_jax.run import config as run_config, config_base, setup as run_setup, sharding
    out = []
    for mesh, devices, model in json.loads(sys.argv[1]):
      c = config_base.base_config()
      c.model.update(dict(family="decoder_only", num_layers=2, d_model=16, num_heads=4,
                          num_kv_heads=2, d_ff=32, vocab_size=32, max_len=8, position="rope",
                          activation="swiglu", use_bias=True, scan_layers=True))
      c.model.update(model)
      c.train.update(batch_size=8, seq_len=8, num_steps=2, qk_clip=0.05)
      c.optim.update(warmup_steps=1, learning_rate=1e-2)
      c.mesh.update(mesh)
      run = run_config.resolve(c)
      setup = run_setup.ShardedRun(run, run.model, devices=jax.devices()[:devices])
      state, step = setup.init_state(), setup.train_step()
      ids = np.random.default_rng(0).integers(1, 32, size=(8, 9)).astype(np.int32)
      batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:],
               "segment_ids": np.ones((8, 8), np.int32),
               "positions": np.tile(np.arange(8, dtype=np.int32), (8, 1)),
               "weights": np.ones((8, 8), np.float32)}
      fractions = []
      for _ in range(2):
        state, m = step(state, sharding.global_batch(batch, setup.mesh), setup.step_hparams())
        fractions.append(float(m["qk_clip_fraction"]))
      want = traverse_util.flatten_dict(setup.state_shardings.params, sep="/")
      flat = traverse_util.flatten_dict(state.params, sep="/")
      out.append({"fractions": fractions,
                  "same_shardings": all(v.sharding.is_equivalent_to(want[k], v.ndim)
                                        for k, v in flat.items()),
                  "params": {k: np.asarray(v).tolist() for k, v in flat.items()}})
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("model", [
    {},
    # MLA with query compression in the A layers of a scanned DA stack.
    {"mixer_pattern": "DA", "num_layers": 4, "attention_type": "mla", "num_kv_heads": 0,
     "mla_q_rank": MLA_Q, "mla_kv_rank": MLA_C, "mla_nope_dim": MLA_N, "mla_rope_dim": MLA_R,
     "mla_v_dim": MLA_V},
], ids=["gqa", "DA-mla"])
def test_an_8_device_mesh_clips_as_one_device(model):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  meshes = [({"data": -1, "fsdp": 1, "tensor": 1}, 1, model),
            ({"data": 2, "fsdp": 2, "tensor": 2}, 8, model)]
  proc = subprocess.run([sys.executable, "-c", _MESHES, json.dumps(meshes)], env=env,
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  one, mixed = json.loads(proc.stdout.strip().splitlines()[-1])
  assert one["fractions"] == mixed["fractions"] and one["fractions"][0] > 0
  assert one["same_shardings"] and mixed["same_shardings"]
  assert one["params"].keys() == mixed["params"].keys()
  # The clip rescales the attention layers' projections: those are compared. A
  # DeltaNet layer's kernels, which the clip never touches, come out of the 8-way
  # mesh's reductions summed in another order (1.3e-5 apart after two steps).
  attention = [p for p in one["params"] if "/self_attention/" in p]
  assert attention
  for path in attention:
    np.testing.assert_allclose(mixed["params"][path], one["params"][path], rtol=1e-5,
                               atol=1e-6, err_msg=path)


# ---- MLA (Kimi K2's rule for its parts) ------------------------------------


def _np_rms(x, scale):
  return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + 1e-6) * scale


def _np_mla(p, x):
  """(logits [B, H, L, S] with the causal mask's -inf, values [B, S, H, V],
  rotary key [B, S, R]) of an MLA layer without rotation, in float64:
  (q_C . k_C + q_R . k_R) / sqrt(d_n + d_R), as model/layers/mla.py's docstring."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  if "q_b_proj" in p:
    c_q = _np_rms(x @ p["q_a_proj"]["kernel"] + p["q_a_proj"]["bias"],
                  p["q_a_layernorm"]["scale"])
    q = np.einsum("blq,qhf->blhf", c_q, p["q_b_proj"]["kernel"])
  else:
    q = np.einsum("bld,dhf->blhf", x, p["q_proj"]["kernel"])
  ckr = x @ p["kv_a_proj_with_mqa"]["kernel"] + p["kv_a_proj_with_mqa"]["bias"]
  c = _np_rms(ckr[..., :MLA_C], p["kv_a_layernorm"]["scale"])
  k_rope = ckr[..., MLA_C:]
  w = p["kv_b_proj"]["kernel"]
  k_nope = np.einsum("bsc,chn->bshn", c, w[..., :MLA_N])
  v = np.einsum("bsc,chv->bshv", c, w[..., MLA_N:])
  logits = (np.einsum("blhn,bshn->bhls", q[..., :MLA_N], k_nope)
            + np.einsum("blhr,bsr->bhls", q[..., MLA_N:], k_rope)) / np.sqrt(MLA_N + MLA_R)
  logits = np.where(np.tril(np.ones((L, L), bool)), logits, -np.inf)
  return logits, v, k_rope


def _np_mla_rescale(p, max_h, tau):
  """K2's MLA rule in NumPy (float32): eta_h = min(1, tau / S_max^h); head h's
  q_C and k_C columns by sqrt(eta_h), its q_R columns by eta_h."""
  max_h = np.asarray(max_h, np.float32)
  over = max_h > tau
  eta = np.where(over, np.float32(tau) / max_h, np.float32(1)).astype(np.float32)
  out = {name: dict(v) for name, v in p.items()}
  query = "q_b_proj" if "q_b_proj" in p else "q_proj"
  kernel = np.array(p[query]["kernel"])
  kernel[..., :MLA_N] *= np.sqrt(eta)[:, None]
  kernel[..., MLA_N:] *= eta[:, None]
  out[query]["kernel"] = kernel
  kv = np.array(p["kv_b_proj"]["kernel"])
  kv[..., :MLA_N] *= np.sqrt(eta)[:, None]
  out["kv_b_proj"]["kernel"] = kv
  return out, over


def _mla_layer(q_rank, rotary):
  spec = MlaSpec(num_heads=H, kv_rank=MLA_C, q_rank=q_rank, rope_dim=MLA_R, nope_dim=MLA_N,
                 v_dim=MLA_V, use_bias=True, causal=True,
                 rotary=RotarySpec(dims=MLA_R, inv_freq=(1.0, 0.01)) if rotary else None)
  return MultiHeadLatentAttention(spec)


@pytest.mark.parametrize("q_rank", [0, MLA_Q], ids=["q_proj", "q_lora"])
def test_the_mla_rescale_against_numpy(q_rank):
  rng = np.random.default_rng(q_rank)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = jnp.tril(jnp.ones((1, 1, L, L), bool))
  positions = jnp.tile(jnp.arange(L), (B, 1))
  plain, rotated = _mla_layer(q_rank, False), _mla_layer(q_rank, True)
  params = jax.tree.map(np.asarray, nn.unbox(plain.init(
      jax.random.PRNGKey(0), x, mask=mask, positions_BL=positions)["params"]))
  query = "q_b_proj" if q_rank else "q_proj"
  assert ("q_a_proj" in params) == bool(q_rank)
  # Spread the heads apart: head h's queries x (1 + 3h); biases and gains not 0 and 1.
  params[query]["kernel"] = (params[query]["kernel"]
                             * (1 + 3 * np.arange(H, dtype=np.float32))[None, :, None])
  params["kv_a_proj_with_mqa"]["bias"] = rng.normal(size=MLA_C + MLA_R).astype(np.float32)
  params["kv_a_layernorm"]["scale"] = rng.uniform(0.5, 1.5, MLA_C).astype(np.float32)

  def sown_max(layer, p):
    _, sown = layer.apply({"params": p}, x, mask=mask, positions_BL=positions,
                          mutable=[QK_CLIP_COLLECTION])
    assert list(sown[QK_CLIP_COLLECTION]) == [MLA_KIND]
    (value,) = sown[QK_CLIP_COLLECTION][MLA_KIND]
    return np.asarray(value)

  logits, v, k_rope = _np_mla(params, x)
  max_h = sown_max(plain, params)
  np.testing.assert_allclose(max_h, logits.max(axis=(0, 2, 3)), rtol=1e-5)
  tau = float(np.sort(max_h)[1] + np.sort(max_h)[2]) / 2  # heads 2, 3 over; 0, 1 under
  want, want_over = _np_mla_rescale(params, max_h, tau)
  got, over = qk_clip.mla_rule(params, jnp.asarray(max_h), tau)
  np.testing.assert_array_equal(np.asarray(over), want_over)
  assert want_over.any() and not want_over.all()
  for name in (query, "kv_b_proj"):
    np.testing.assert_allclose(got[name]["kernel"], want[name]["kernel"], rtol=1e-6)
    # Heads under tau: bitwise untouched.
    np.testing.assert_array_equal(np.asarray(got[name]["kernel"])[:, ~want_over],
                                  params[name]["kernel"][:, ~want_over])
  # The values' columns of kv_b_proj, the latent and rotary key's projection, the
  # query's down projection, the norms and the output: bitwise untouched.
  np.testing.assert_array_equal(np.asarray(got["kv_b_proj"]["kernel"])[..., MLA_N:],
                                params["kv_b_proj"]["kernel"][..., MLA_N:])
  flat_got = traverse_util.flatten_dict(got)
  for path, value in traverse_util.flatten_dict(params).items():
    if path[0] not in (query, "kv_b_proj"):
      np.testing.assert_array_equal(flat_got[path], value, err_msg=str(path))
  # Recomputed: the clipped heads' largest logit is tau, the others' unchanged;
  # the values and the rotary key unchanged.
  logits_after, v_after, k_rope_after = _np_mla(got, x)
  after = logits_after.max(axis=(0, 2, 3))
  np.testing.assert_allclose(after[want_over], tau, rtol=1e-5)
  np.testing.assert_allclose(after[~want_over], max_h[~want_over], rtol=1e-5)
  np.testing.assert_array_equal(logits_after[:, ~want_over], logits[:, ~want_over])
  np.testing.assert_array_equal(v_after, v)
  np.testing.assert_array_equal(k_rope_after, k_rope)
  # With RoPE on the d_R part: the logits the layer's softmax sees, rescaled alike.
  max_rotated = sown_max(rotated, params)
  got_rotated, _ = qk_clip.mla_rule(params, jnp.asarray(max_rotated), tau)
  after_rotated = sown_max(rotated, got_rotated)
  over_rotated = max_rotated > tau
  assert over_rotated.any()
  np.testing.assert_allclose(after_rotated[over_rotated], tau, rtol=1e-5)
  np.testing.assert_array_equal(after_rotated[~over_rotated], max_rotated[~over_rotated])
  # ``apply`` finds the MLA rule by the name the layer sowed under.
  tree, fraction = qk_clip.apply({"layer": params}, {"layer": {MLA_KIND: (jnp.asarray(max_h),)}},
                                 tau)
  np.testing.assert_allclose(tree["layer"][query]["kernel"], want[query]["kernel"], rtol=1e-6)
  assert float(fraction) == pytest.approx(want_over.mean())


# ---- MLA and hybrid stacks in the train step --------------------------------
def _stack_config(model, **train):
  """``_config`` (Muon, biases) with ``model`` over it: MLA's widths, a mixer pattern."""
  c = _config(**train)
  if model.get("attention_type") == "mla":
    model = dict(num_kv_heads=0, mla_kv_rank=MLA_C, mla_nope_dim=MLA_N, mla_rope_dim=MLA_R,
                 mla_v_dim=MLA_V, **model)
  c.model.update(model)
  return c


def _np_rule(kind, p, max_h, tau, num_kv_heads):
  """The NumPy rule of one layer: (its parameters rescaled, its heads over tau)."""
  if kind == MLA_KIND:
    return _np_mla_rescale(p, max_h, tau)
  return _np_rescale(p, max_h, tau, num_kv_heads)


@pytest.mark.parametrize("model, sown_at", [
    (dict(attention_type="mla", mla_q_rank=0), {("decoder", "layers", "self_attention"): (2, H)}),
    # Multi-head keys: a tau between the heads' maxima clips some heads, not all.
    (dict(mixer_pattern="DA", num_layers=4, num_kv_heads=H),
     {("decoder", "layers", "layer_1", "self_attention"): (2, H)}),
    (dict(mixer_pattern="DA", attention_type="mla", mla_q_rank=MLA_Q, scan_layers=False),
     {("decoder", "layer_1", "self_attention"): (H,)}),
], ids=["mla-scanned", "DA-scanned", "DA-mla-looped"])
def test_the_train_step_clips_mla_and_the_attention_of_hybrid_stacks(model, sown_at):
  """After a Muon update, every attention layer is its rule's NumPy rescale
  of the plain update at the step's maxima, and nothing else moves: the Gated
  DeltaNet layers sow nothing and are not touched, and the fraction counts the
  attention heads only."""
  run, state, plain, _ = _step(_stack_config(model))
  net = build_model(run.model, deterministic=False)
  _, sown = jax.jit(lambda p: net.apply(
      {"params": p}, **tasks.get(run.task).model_inputs(_batch()),
      rngs={"dropout": jax.random.PRNGKey(0)}, mutable=[QK_CLIP_COLLECTION]))(state.params)
  sown = traverse_util.flatten_dict(sown[QK_CLIP_COLLECTION])
  kind = MLA_KIND if model.get("attention_type") == "mla" else QK_CLIP_KIND
  assert {path[:-1]: v[0].shape for path, v in sown.items()} == sown_at
  assert {path[-1] for path in sown} == {kind}
  (module,) = sown_at
  max_xh = np.asarray(sown[(*module, kind)][0])
  tau = float(np.median(max_xh))
  _, _, clipped, metrics = _step(_stack_config(model, qk_clip=tau))
  at = lambda tree: qk_clip._get(tree, module)
  rows = [()] if max_xh.ndim == 1 else [(r,) for r in range(max_xh.shape[0])]
  want_over, flat_clipped = [], traverse_util.flatten_dict(at(clipped.params))
  for row in rows:
    layer = jax.tree.map(lambda a: np.asarray(a)[row], at(plain.params))
    want, over = _np_rule(kind, layer, max_xh[row], tau, run.model.num_kv_heads)
    want_over.append(over)
    for path, value in traverse_util.flatten_dict(want).items():
      np.testing.assert_allclose(np.asarray(flat_clipped[path])[row], value, rtol=1e-5,
                                 atol=1e-7, err_msg=str(path))
  want_over = np.stack(want_over)
  assert want_over.any() and not want_over.all()
  assert float(metrics["qk_clip_fraction"]) == pytest.approx(want_over.mean())
  # Outside the attention layers (the DeltaNet layers too) the plain update's,
  # as is the optimizer's state.
  flat_plain = traverse_util.flatten_dict(plain.params)
  for path, value in traverse_util.flatten_dict(clipped.params).items():
    if path[:len(module)] != module:
      np.testing.assert_allclose(value, flat_plain[path], rtol=1e-6, atol=1e-7, err_msg=path)
  for a, b in zip(jax.tree.leaves(clipped.opt_state), jax.tree.leaves(plain.opt_state)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_every_attention_type_has_a_rule_and_a_stack_without_attention_is_refused():
  """A new ``model.attention_type`` without a rule fails here; a pattern of D
  layers only has no softmax logits to clip."""
  assert set(qk_clip.KINDS) == set(typing.get_args(AttentionType))
  assert set(qk_clip.KINDS.values()) <= set(qk_clip.RULES)
  config = _stack_config(dict(mixer_pattern="D"), qk_clip=100.0)
  with pytest.raises(ConfigError, match="model.mixer_pattern='D'"):
    run_config.resolve(config)


@pytest.mark.slow
@pytest.mark.parametrize("model", [{"model.attention_type": "mla"},
                                   {"model.mixer_pattern": "DA", "model.num_layers": 2}],
                         ids=["mla", "DA"])
def test_the_fraction_is_logged_under_mla_and_a_hybrid_with_muon(tmp_path, model):
  workdir = tmp_path / "run"
  train("lm.py:tiny", workdir, {"train.qk_clip": 1e-3, "train.num_steps": 2,
                                "train.log_every_steps": 1, "optim.optimizer": "muon",
                                **model})
  from tfx_jax.run import metrics  # pylint: disable=import-outside-toplevel
  scalars = metrics.read_scalars(workdir / "tensorboard")
  # tau this small clips every attention head at the first step (after a clip a
  # head's largest logit may end the next step under tau, so the second step's
  # fraction is any share of the heads); a DeltaNet layer's heads counted
  # (never clipped) would halve the DA stack's first fraction.
  fractions = [v for _, v in scalars["train/qk_clip_fraction"]]
  assert len(fractions) == 2 and fractions[0] == 1.0, fractions
  assert 0.0 <= fractions[1] <= 1.0, fractions
