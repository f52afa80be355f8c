"""Every combination of the ablation axes builds and trains: one optimizer step
lowers the loss.

The grid is family x norm_position x norm_type x activation x position, every
value of each ``Literal`` axis of ``tfx_jax.model_config`` (no sampling), at a
tiny size (1 layer, d_model 8, 2 heads, 4 tokens, vocabulary 11). Each model is
initialised, differentiated, updated once by Adam and evaluated again eagerly:
op-by-op dispatch of ops compiled once per shape is far cheaper here than one
XLA compile per model; the grid runs on two worker processes while the settings
outside it (scan + remat, bfloat16, classification heads, untied embeddings,
GQA/MQA, dropout) are tested here.
"""

import concurrent.futures
import importlib.util
import itertools
import math
import multiprocessing
import os
from typing import get_args

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfx_jax.model_config import (Activation, Family, NormPosition, NormType, Position,
                                  Remat, model_config_from_dict)
from tfx_jax.models import build_model, stack_layer_params
from conftest import _is_grid

FAMILIES = get_args(Family)
# The grid: every value of every ablation axis. One test per (family,
# norm_position) slice; each slice runs the product of the other axes.
SLICE_AXES = {"family": FAMILIES, "norm_position": get_args(NormPosition)}
WITHIN_SLICE_AXES = {"norm_type": get_args(NormType), "activation": get_args(Activation),
                     "position": get_args(Position)}
TINY = dict(num_layers=1, d_model=8, num_heads=2, vocab_size=11, max_len=4)
IDS = jnp.asarray([[5, 6, 7, 8], [9, 10, 2, 3]], jnp.int32)
TARGETS = jnp.asarray([[6, 7, 8, 3], [10, 2, 3, 0]], jnp.int32)


def _args(family, ids=IDS):
  return (ids,) if family != "encoder_decoder" else (ids, ids)


def _loss_fn(model, family, key="logits", labels=TARGETS, rngs=None):
  def loss(params):
    out = model.apply({"params": params}, *_args(family), rngs=rngs)
    return optax.softmax_cross_entropy_with_integer_labels(out[key], labels).mean()
  return loss


def _loss_and_grads(cfg, key="logits", labels=TARGETS):
  model = build_model(cfg)
  params = model.init(jax.random.PRNGKey(0), *_args(cfg.family))["params"]
  loss, grads = jax.value_and_grad(_loss_fn(model, cfg.family, key, labels))(params)
  return model, params, loss, grads


def _problems(loss, grads):
  """What is wrong with a (loss, gradient) pair, or an empty list."""
  problems = []
  if not np.isfinite(float(loss)):
    problems.append(f"loss {float(loss)}")
  leaves = jax.tree_util.tree_leaves_with_path(nn.unbox(grads))
  bad = [jax.tree_util.keystr(p) for p, g in leaves if not np.isfinite(np.asarray(g)).all()]
  if bad:
    problems.append(f"non-finite gradients in {bad}")
  if not any(np.abs(np.asarray(g)).max() > 0 for _, g in leaves):
    problems.append("all gradients are zero")
  return problems


def _within_slice():
  """[{norm_type, activation, position}] of one slice: the product of the axes."""
  return [dict(zip(WITHIN_SLICE_AXES, values))
          for values in itertools.product(*WITHIN_SLICE_AXES.values())]


def test_grid_covers_every_combination_of_the_axes():
  """The slices run below times the combinations within a slice are the product
  of every Literal axis of the model config, each once."""
  axes = {"family": Family, "norm_position": NormPosition, "norm_type": NormType,
          "activation": Activation, "position": Position}
  slices = list(itertools.product(*SLICE_AXES.values()))
  covered = [dict(zip(SLICE_AXES, key), **rest) for key in slices
             for rest in _within_slice()]
  want = [dict(zip(axes, values))
          for values in itertools.product(*(get_args(a) for a in axes.values()))]
  assert len(covered) == len(want) == math.prod(len(get_args(a)) for a in axes.values())
  assert sorted(map(str, covered)) == sorted(map(str, want))


# ------------------------------------------------------------ outside the grid
_stacked = stack_layer_params


@pytest.mark.parametrize("remat", get_args(Remat))
@pytest.mark.parametrize("scan_layers", [False, True], ids=["loop", "scan"])
def test_scan_and_remat_give_the_same_gradients(scan_layers, remat):
  """Rematerialisation only trades memory for compute: same loss, same gradients."""
  base = dict(TINY, num_layers=2, family="decoder_only", position="rope",
              activation="swiglu")
  ref_cfg = model_config_from_dict(base)
  _, ref_params, ref_loss, ref_grads = _loss_and_grads(ref_cfg)
  cfg = model_config_from_dict(dict(base, scan_layers=scan_layers, remat=remat))
  model = build_model(cfg)
  params = _stacked(ref_params) if scan_layers else nn.unbox(ref_params)
  # Eagerly, lax.scan would compile its body per configuration; under
  # disable_jit it runs as a Python loop over the layers with the same semantics.
  with jax.disable_jit():
    loss, grads = jax.value_and_grad(_loss_fn(model, cfg.family))(params)
  assert not _problems(loss, grads)
  want = _stacked(ref_grads) if scan_layers else nn.unbox(ref_grads)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
               nn.unbox(grads), want)


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_compute(family):
  cfg = model_config_from_dict(dict(TINY, family=family, dtype="bfloat16",
                                    activation="swiglu", position="rope"))
  model, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(params)))
  out = model.apply({"params": params}, *_args(family))
  assert out["logits"].dtype == jnp.float32  # the loss is taken in float32
  # Close to the float32 model with the same parameters.
  f32 = build_model(model_config_from_dict(dict(TINY, family=family, activation="swiglu",
                                                position="rope")))
  ref = f32.apply({"params": params}, *_args(family))["logits"]
  np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(ref), atol=0.1)


@pytest.mark.parametrize("family", ["decoder_only", "encoder_only"])
def test_classification_head(family):
  cfg = model_config_from_dict(dict(TINY, family=family, num_classes=3))
  labels = jnp.asarray([2, 0])
  model, params, loss, grads = _loss_and_grads(cfg, key="class_logits", labels=labels)
  assert not _problems(loss, grads)
  assert np.abs(np.asarray(nn.unbox(grads["classifier"]["kernel"]))).max() > 0
  out = model.apply({"params": params}, *_args(family))
  assert out["class_logits"].shape == (2, 3)
  assert out["logits"].shape == (2, 4, 11)


@pytest.mark.parametrize("family", FAMILIES)
def test_untied_embeddings(family):
  tied = model_config_from_dict(dict(TINY, family=family))
  untied = model_config_from_dict(dict(TINY, family=family, tie_embeddings=False))
  _, tied_params, _, _ = _loss_and_grads(tied)
  model, params, loss, grads = _loss_and_grads(untied)
  assert not _problems(loss, grads)
  assert "output" in params and "output" not in tied_params
  assert nn.unbox(params["output"]["kernel"]).shape == (8, 11)
  assert np.abs(np.asarray(nn.unbox(grads["output"]["kernel"]))).max() > 0


@pytest.mark.parametrize("num_kv_heads", [1, 2], ids=["mqa", "gqa"])  # mha: the grid
@pytest.mark.parametrize("family", FAMILIES)
def test_grouped_query_attention(family, num_kv_heads):
  cfg = model_config_from_dict(dict(TINY, family=family, num_heads=4,
                                    num_kv_heads=num_kv_heads, position="rope"))
  _, params, loss, grads = _loss_and_grads(cfg)
  assert not _problems(loss, grads)
  stack = "decoder" if family != "encoder_only" else "encoder"
  attn = nn.unbox(params[stack]["layer_0"]["self_attention"])
  assert attn["query"]["kernel"].shape == (8, 4, 2)
  assert attn["key"]["kernel"].shape == (8, num_kv_heads, 2)
  assert attn["value"]["kernel"].shape == (8, num_kv_heads, 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_dropout_in_training_mode(family):
  cfg = model_config_from_dict(dict(TINY, family=family, dropout=0.3,
                                    attention_dropout=0.2))
  eval_model = build_model(cfg)
  params = eval_model.init(jax.random.PRNGKey(0), *_args(family))["params"]
  train = build_model(cfg, deterministic=False)
  losses = []
  for seed in (1, 2):
    loss, grads = jax.value_and_grad(_loss_fn(
        train, family, rngs={"dropout": jax.random.PRNGKey(seed)}))(params)
    assert not _problems(loss, grads)
    losses.append(float(loss))
  eval_loss = float(_loss_fn(eval_model, family)(params))
  assert losses[0] != losses[1] and eval_loss not in losses
  # Evaluation is deterministic.
  assert float(_loss_fn(eval_model, family)(params)) == eval_loss


# ------------------------------------------------------------------ the grid
def _step_problems(cfg, model, params, loss, grads):
  """One Adam update (lr 1e-3: a step of about lr per parameter, whatever the
  gradient scale) must lower the loss: the gradients reach the parameters with
  the right sign."""
  opt = optax.adam(1e-3)
  updates, _ = opt.update(grads, opt.init(params), params)
  new_loss = float(_loss_fn(model, cfg.family)(optax.apply_updates(params, updates)))
  if not new_loss < float(loss):
    return [f"loss {float(loss)} -> {new_loss} after one optimizer step"]
  return []


def _grid_slice(family, norm_position):
  """Every combination of the other axes for one slice; each is initialised,
  takes one optimizer step and must lower its loss. Returns a description of
  each combination that failed."""
  failures = []
  for combo in _within_slice():
    name = "/".join([family, norm_position, *combo.values()])
    try:
      cfg = model_config_from_dict(dict(
          TINY, family=family, norm_position=norm_position, **combo), seq_len=4)
      model, params, loss, grads = _loss_and_grads(cfg)
      problems = _problems(loss, grads) or _step_problems(cfg, model, params, loss,
                                                         grads)
    except Exception as e:  # reported with the combination's name
      problems = [f"{type(e).__name__}: {e}"]
    if problems:
      failures.append(f"{name}: {'; '.join(problems)}")
  return failures


def start_grid(items) -> dict:
  """{(family, norm_position): future} for the grid tests among ``items``.

  Called once the session is collected (``tests/conftest.py``), which also
  puts these tests last: the slices train in two spawned worker processes at
  a lower priority while the rest of the suite runs, on the core it leaves
  idle, and the tests below collect the results. The per-combination cost is
  Python dispatch (about 0.1-0.3 s), which would otherwise add minutes of one
  busy core to the suite's wall time. Worker processes are spawned, not
  forked: forking a process that has initialised JAX is unsafe.
  """
  keys = [(item.callspec.params["family"], item.callspec.params["norm_position"])
          for item in items if _is_grid(item)]
  # The encoder-decoder slices are the slowest: first.
  keys.sort(key=lambda key: key[0] != "encoder_decoder")
  workers = min(2, os.cpu_count() or 1, len(keys))
  # Workers import this file by module name (pytest's default import mode).
  if workers < 2 or importlib.util.find_spec(_grid_slice.__module__) is None:
    return {key: _InProcess(_grid_slice, *key) for key in keys}
  global _POOL
  _POOL = concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=multiprocessing.get_context("spawn"),
      initializer=os.nice, initargs=(19,))
  return {key: _POOL.submit(_grid_slice, *key) for key in keys}


_POOL = None


def stop_grid() -> None:
  """At the end of the session: slices not started are dropped (an interrupted
  session does not wait for them), the workers exit after their current one."""
  if _POOL is not None:
    _POOL.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(scope="module")
def grid_slices(request):
  """The futures started at collection, or started here when that hook of
  ``tests/conftest.py`` did not run."""
  futures = getattr(request.config, "ablation_grid", None)
  return futures if futures is not None else start_grid(request.session.items)


class _InProcess:
  """A future-like that runs its call in this process on ``result()``."""

  def __init__(self, fn, *args):
    self._call = lambda: fn(*args)

  def result(self):
    return self._call()


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", SLICE_AXES["norm_position"])
@pytest.mark.parametrize("family", SLICE_AXES["family"])
def test_every_ablation_combination_trains(grid_slices, family, norm_position):
  """Every combination of the other axes, for this family and placement: a
  finite loss and gradients, and one optimizer step lowers the loss."""
  failures = grid_slices[(family, norm_position)].result()
  assert not failures, "\n".join(failures)
