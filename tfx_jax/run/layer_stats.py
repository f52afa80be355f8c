"""Per-layer statistics (``train.log_layer_stats``, ``train.layer_stats_param``,
``train.layer_stats_init_batches``): which arrays, their norms, their tags.

Xiong et al. 2020 (Figure 3) read the gradient norm of one matrix per layer,
the FFN's output matrix W2, at initialisation, averaged over batches: post-LN's
grows towards the last layers, pre-LN's stays flat. ``train.layer_stats_param``
names the arrays a layer's norm is taken over (``PARAMS``; ``all``: every
array of the layer), the same in every family, since every stack is made of
the same ``blocks.TransformerLayer``; scanned stacks hold them under
``<stack>/layers/...`` with a leading layer axis, looped ones under
``<stack>/layer_<i>/...``. ``train.layer_stats_init_batches`` N > 0 takes the
per-layer gradient norms at the initial parameters on the first N training
batches, before the first update, and logs their mean at step 0.

Tags: ``layer_stats/<kind>/<stack>_<NN>`` for every array of the layer (kind:
grad_norm, param_norm, update_norm, max_attention_logit), with the parameter
between kind and layer otherwise (``layer_stats/grad_norm/ffn_out/decoder_03``);
the statistics at initialisation always name it:
``layer_stats/init_grad_norm/<param>/<stack>_<NN>``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Literal

import jax
import jax.numpy as jnp
import numpy as np

# The stacks whose layers are reported, in this order.
LAYER_STACKS = ("encoder", "decoder")
Param = Literal["all", "self_attention", "attention_qkv", "attention_out",
                "cross_attention", "ffn", "ffn_in", "ffn_out"]
ALL: Param = "all"
INIT_KIND = "init_grad_norm"

_QKV = ("query", "key", "value")
# The one dispatch point of ``train.layer_stats_param``: which arrays of a
# layer, by their path inside it (``blocks.TransformerLayer``'s names). The
# matrices are kernels only (no bias, no norm gain): W_Q, W_K, W_V, W_O; W1 (and
# a gated FFN's second input matrix V, Shazeer 2020) and W2.
PARAMS: dict[str, Callable[[tuple[str, ...]], bool]] = {
    "all": lambda p: True,
    "self_attention": lambda p: p[0] == "self_attention",
    "attention_qkv": lambda p: p[0] == "self_attention" and p[1] in _QKV and p[-1] == "kernel",
    "attention_out": lambda p: p == ("self_attention", "out", "kernel"),
    "cross_attention": lambda p: p[0] == "cross_attention",
    "ffn": lambda p: p[0] == "ffn",
    "ffn_in": lambda p: p in (("ffn", "wi", "kernel"), ("ffn", "wv", "kernel")),
    "ffn_out": lambda p: p == ("ffn", "wo", "kernel"),
}


def _arrays(layer, param: str) -> list:
  """The arrays of one layer's subtree that ``param`` selects."""
  chosen = PARAMS[param]
  leaves = jax.tree_util.tree_flatten_with_path(layer)[0]
  return [x for path, x in leaves
          if chosen(tuple(str(getattr(k, "key", k)) for k in path))]


def _stacks(tree) -> Iterator[tuple[str, Any]]:
  for stack in LAYER_STACKS:
    sub = tree.get(stack) if hasattr(tree, "get") else None
    if sub is not None:
      yield stack, sub


def per_layer_norms(tree, param: str = ALL) -> dict[str, jax.Array]:
  """{stack: [num_layers] L2 norms}: each layer's norm over the arrays that
  ``param`` selects (``PARAMS``). Stacks a model lacks, or in which ``param``
  selects nothing (cross_attention in an encoder), are left out."""
  out = {}
  for stack, sub in _stacks(tree):
    if "layers" in sub:
      arrays = _arrays(sub["layers"], param)
      if not arrays:
        continue
      num = arrays[0].shape[0]
      sq = sum(jnp.sum(jnp.square(x.astype(jnp.float32)).reshape(num, -1), axis=1)
               for x in arrays)
    else:
      names = sorted((k for k in sub if k.startswith("layer_")),
                     key=lambda k: int(k.split("_")[1]))
      per_layer = [_arrays(sub[k], param) for k in names]
      if not any(per_layer):
        continue
      sq = jnp.stack([sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in arrays)
                      for arrays in per_layer])
    out[stack] = jnp.sqrt(sq)
  return out


def metric_key(kind: str, param: str) -> str:
  """The train step's metric name of a statistic (``tags`` turns it into tags)."""
  return f"layer_stats/{kind}" if param == ALL else f"layer_stats/{kind}/{param}"


def tags(metrics: dict[str, Any]) -> dict[str, float]:
  """``layer_stats/...`` metrics ({stack: [num_layers]}) as scalars, one tag a
  layer: ``<metric>/<stack>_<NN>``."""
  out = {}
  for key, stacks in metrics.items():
    if key.startswith("layer_stats/"):
      for stack, values in stacks.items():
        for i, value in enumerate(np.asarray(values)):
          out[f"{key}/{stack}_{i:02d}"] = float(value)
  return out


def make_grad_norms(model, task, loss, param: str):
  """``grad_norms(params, batch, rng) -> {stack: [num_layers]}``: the norms of
  the training objective's gradient (``loss``, dropout on, as ``rng`` draws
  it) per layer, over the arrays ``param`` selects."""

  def grad_norms(params, batch, rng):
    def objective(p):
      out = model.apply({"params": p}, **task.model_inputs(batch), rngs={"dropout": rng})
      return loss(out, batch)[0]

    return per_layer_norms(jax.grad(objective)(params), param)

  return grad_norms


def mean_init_grad_norms(grad_norms, params, batches, rng, num_batches: int
                         ) -> dict[str, np.ndarray]:
  """The mean over the first ``num_batches`` of ``batches`` of
  ``grad_norms(params, batch, rng_i)``, rng_i = fold_in(rng, i): the key the
  train step draws its dropout from at step i, so batch i's norms are those
  of the i-th update's gradient had the parameters stayed at ``params``."""
  total, n = None, 0
  for i, batch in zip(range(num_batches), batches):
    norms = jax.device_get(grad_norms(params, batch, jax.random.fold_in(rng, i)))
    total = norms if total is None else jax.tree.map(np.add, total, norms)
    n += 1
  return jax.tree.map(lambda x: np.asarray(x, np.float64) / n, total)
