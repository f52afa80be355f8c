"""What a run's model and state weigh, without allocating them: the parameter
table, active parameters, FLOPs per token, the optimizer's state and the
memory per device on a mesh (``python -m tfx_jax.summary`` prints them; the
scale planner and the sweep's compute table read them).

Shapes come from ``jax.eval_shape`` of the initialiser, so a 65B preset is
measured in seconds.
"""

from __future__ import annotations

import collections

from tfx_jax.core.errors import ConfigError
from tfx_jax.model.axes import MESH_AXES



def param_shapes(model_cfg):
  """{path: ShapeDtypeStruct} of the unboxed parameters, via jax.eval_shape."""
  import flax.linen as nn
  import jax
  from flax import traverse_util

  # Deferred: jax and the model load only when a table is built (fast --help).
  from tfx_jax.model.families import build_model, dummy_inputs
  model = build_model(model_cfg)
  abstract = jax.eval_shape(
      lambda rng: model.init({"params": rng}, **dummy_inputs(model_cfg)),
      jax.random.PRNGKey(0))
  params = nn.unbox(abstract["params"])
  return {"/".join(k): v for k, v in traverse_util.flatten_dict(params).items()}


def count_params(model_cfg) -> int:
  import math
  return sum(math.prod(v.shape) for v in param_shapes(model_cfg).values())


def _routed(path: str) -> bool:
  """Whether a parameter belongs to the routed experts of a MoE layer (their
  kernels and biases: ``.../ffn/w{i,v,o}/...`` of ``model/layers/moe.py``, [E, ...])."""
  parts = path.split("/")
  return len(parts) >= 3 and parts[-3] == "ffn" and parts[-2] in ("wi", "wv", "wo")


def active_params(model_cfg, shapes: dict | None = None) -> int:
  """The parameters one token computes with: all, but of each MoE layer's
  routed experts only the ``experts_per_token`` it is routed to (k / E of
  them; Fedus et al. 2022, OLMoE's "active parameters")."""
  import math
  shapes = param_shapes(model_cfg) if shapes is None else shapes
  total = 0
  for path, v in shapes.items():
    n = math.prod(v.shape)
    if model_cfg.ffn_type == "moe" and _routed(path) and len(v.shape) >= 2:
      n = n * model_cfg.experts_per_token // model_cfg.num_experts
    total += n
  return total


# The tables a token reads rather than multiplies (``flops_per_token``).
_TABLES = (["embedding"], ["positions"], ["encoder_positions"], ["decoder_positions"],
           ["token_types"])
# An untied output projection: the vocabulary's other table (Kaplan et al.
# 2020 count neither), so that tying the embeddings leaves N as it is.
_UNEMBEDDING = ("output/kernel", "output/bias")


def non_embedding_params(shapes: dict) -> int:
  """Kaplan et al. 2020's N: the parameters without the token, position and
  type tables and an untied output projection (the count a ladder's rungs
  and ``budgets`` use)."""
  import math
  return sum(math.prod(v.shape) for path, v in shapes.items()
             if not (path.split("/")[-2:-1] in _TABLES or path in _UNEMBEDDING))


def flops_per_token(model_cfg, seq_len: int, shapes: dict | None = None) -> dict[str, int]:
  """Matmul FLOPs per token at context ``seq_len``: {"forward", "train"}.

  Kaplan et al. 2020 (Table 1): C_forward = 2 N + 2 n_layer n_ctx d_attn, N
  the parameters a token multiplies by (here the active ones, without the
  embedding and position tables, which are read, not multiplied; plus the
  output projection, 2 d V, when it is tied to the embedding), and the
  attention scores and their weighted sum over n_ctx keys (d_attn = heads x
  head width; causal or not, as Kaplan counts it; MLA's d_attn is
  H (d_n + d_R + d_v) / 2, its scores' and its sum's widths), and for a Gated
  DeltaNet layer, which attends over no context, its state's three products
  per token, 6 H d_k d_v (``model.budgets.token_mixing``). Training is 3
  C_forward (forward and the two backward products).
  """
  import math
  shapes = param_shapes(model_cfg) if shapes is None else shapes
  read_only = sum(math.prod(v.shape) for path, v in shapes.items()
                  if path.split("/")[-2:-1] in _TABLES)
  n = active_params(model_cfg, shapes) - read_only
  if model_cfg.tie_embeddings:
    n += model_cfg.d_model * model_cfg.vocab_size
  from tfx_jax.model import budgets as budgets_lib  # pylint: disable=import-outside-toplevel
  mix = budgets_lib.token_mixing(model_cfg)  # a decoder layer's cross-attention attends too
  forward = (2 * n + round(2 * mix.attention_layers * seq_len * mix.attention_width)
             + 6 * mix.deltanet_layers * mix.deltanet_state)
  return {"forward": forward, "train": 3 * forward}


def format_counts(model_cfg, shapes: dict, seq_len: int) -> str:
  """The lines after the table: active parameters and FLOPs per token."""
  import math
  total = sum(math.prod(v.shape) for v in shapes.values())
  active = active_params(model_cfg, shapes)
  flops = flops_per_token(model_cfg, seq_len, shapes)
  return (f"active params: {active} ({100 * active / total:.1f}% of {total})\n"
          f"FLOPs per token (seq_len {seq_len}): forward {flops['forward']:,}  "
          f"train {flops['train']:,}")


# The budgets a comparison can hold equal (configs/lm.py's ``matched``), by the
# name ``match`` gives them, and their keys in ``budgets``.
BUDGET_KEYS = {"params": "params", "flops": "train_flops_per_token",
               "kv": "kv_bytes_per_token"}


def budgets(model_cfg, seq_len: int, shapes: dict | None = None) -> dict[str, int]:
  """What a comparison holds equal (docs/fair-comparisons.md, "Matched
  budgets"): ``params`` and ``non_embedding_params`` (``non_embedding_params``),
  ``train_flops_per_token`` at ``seq_len`` (``flops_per_token``),
  ``kv_bytes_per_token`` (the decoding cache in the compute dtype) and
  ``state_bytes_per_sequence`` (recurrent layers; ``model/budgets.py``)."""
  import math
  from tfx_jax.model import budgets as budgets_lib  # pylint: disable=import-outside-toplevel
  shapes = param_shapes(model_cfg) if shapes is None else shapes
  return {"params": sum(math.prod(v.shape) for v in shapes.values()),
          "non_embedding_params": non_embedding_params(shapes),
          "train_flops_per_token": int(flops_per_token(model_cfg, seq_len, shapes)["train"]),
          "kv_bytes_per_token": budgets_lib.kv_cache_bytes_per_token(model_cfg),
          "state_bytes_per_sequence": budgets_lib.recurrent_state_bytes_per_sequence(model_cfg)}


def format_budgets(model_cfg, seq_len: int, shapes: dict) -> str:
  """``budgets`` as the lines ``summary`` prints."""
  b = budgets(model_cfg, seq_len, shapes)
  lines = [f"budgets: params {b['params']:,}  non-embedding params "
           f"{b['non_embedding_params']:,}  train FLOPs per token (seq_len {seq_len}) "
           f"{b['train_flops_per_token']:,}",
           f"KV cache per token ({model_cfg.dtype}): {b['kv_bytes_per_token']:,} bytes"
           + ("  (encoder_only: no decoding cache)" if model_cfg.family == "encoder_only"
              else "")]
  if b["state_bytes_per_sequence"]:
    lines.append(f"recurrent state per sequence ({model_cfg.dtype}): "
                 f"{b['state_bytes_per_sequence']:,} bytes")
  return "\n".join(lines)


def format_table(shapes: dict, depth: int = 3) -> str:
  import math
  groups: dict[str, int] = collections.OrderedDict()
  for path, v in shapes.items():
    key = "/".join(path.split("/")[:depth])
    groups[key] = groups.get(key, 0) + math.prod(v.shape)
  width = max(len(k) for k in groups) if groups else 10
  total = sum(groups.values())
  lines = [f"{'module':<{width}}  {'params':>15}  {'share':>6}"]
  for key, n in groups.items():
    lines.append(f"{key:<{width}}  {n:>15,}  {100 * n / total:>5.1f}%")
  lines.append(f"params: {total}")
  return "\n".join(lines)


def parse_mesh(text: str) -> dict[str, int]:
  """``"data=2,fsdp=2,tensor=2"`` -> {"data": 2, "fsdp": 2, "tensor": 2}."""
  sizes = dict.fromkeys(MESH_AXES, 1)
  for part in filter(None, (p.strip() for p in text.split(","))):
    name, _, value = part.partition("=")
    if name not in sizes or not value.isdigit() or int(value) < 1:
      raise ConfigError(
          f"--mesh={text!r}: each part must be AXIS=SIZE with AXIS one of "
          f"{', '.join(MESH_AXES)} and SIZE a positive integer, e.g. "
          "--mesh data=2,fsdp=2,tensor=2.")
    sizes[name] = int(value)
  return sizes


def _mib(n_bytes: float) -> str:
  return f"{n_bytes / 2**20:,.1f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:,.2f} GiB"


def boxed_state(config, model_cfg):
  """The run's abstract train state, boxed with logical axis names (no devices)."""
  import jax
  from tfx_jax.run import optim, param_groups
  from tfx_jax.run import setup as run_setup

  optimizer = optim.build(config.optim,
                          optim.hyperparameters(config.optim, d_model=model_cfg.d_model),
                          param_groups.for_run(model_cfg, config.optim))
  return jax.eval_shape(run_setup.state_initializer(config, model_cfg, optimizer.tx),
                        jax.random.PRNGKey(0))


def optimizer_state(config, model_cfg) -> str:
  """``optimizer state (optim.optimizer=...): <values> values, <size>``: every
  array of the optimizer's state (moments, Muon's and the schedules' counters)."""
  import math
  import flax.linen as nn
  import jax

  leaves = jax.tree.leaves(nn.unbox(boxed_state(config, model_cfg).opt_state))
  values = sum(math.prod(x.shape) for x in leaves)
  size = sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves)
  return (f"optimizer state (optim.optimizer={config.optim.optimizer}): {values:,} values, "
          f"{_mib(size)}")


def bytes_per_device(tree, mesh_shape: dict[str, int]) -> int:
  """The bytes each device holds of a boxed tree (``boxed_state``) sharded by
  ``sharding.LOGICAL_RULES`` over a mesh of ``mesh_shape`` (blocks rounded up)."""
  import math
  import flax.linen as nn
  import jax
  from tfx_jax.run import sharding

  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  total = 0
  for x in jax.tree.leaves(tree, is_leaf=is_box):
    value = x.value if is_box(x) else x
    block = sharding.shard_shape(value.shape, sharding.leaf_spec(x), mesh_shape)
    total += math.prod(block) * value.dtype.itemsize
  return total


def sharding_report(config, model_cfg, mesh_shape: dict[str, int]) -> str:
  """Each parameter's mesh axes and per-device block, then per-device memory."""
  import math
  import flax.linen as nn
  import jax
  from flax import traverse_util
  from tfx_jax.run import sharding

  boxed = boxed_state(config, model_cfg)
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  per_device_bytes = lambda tree: bytes_per_device(tree, mesh_shape)

  def all_bytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(nn.unbox(tree)))

  rows = []
  for path, x in traverse_util.flatten_dict(boxed.params, is_leaf=lambda _, v: is_box(v)
                                            ).items():
    spec = sharding.leaf_spec(x)
    axes = tuple(spec) + (None,) * (x.value.ndim - len(spec))
    rows.append(("/".join(path), str(tuple(x.value.shape)),
                 "(" + ", ".join(str(a) for a in axes) + ")",
                 str(sharding.shard_shape(x.value.shape, spec, mesh_shape))))
  header = ("parameter", "shape", "mesh axes", "per device")
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
  n_devices = math.prod(mesh_shape.values())
  params, opt = per_device_bytes(boxed.params), per_device_bytes(boxed.opt_state)
  lines.append(f"mesh {' x '.join(f'{k}={v}' for k, v in mesh_shape.items())} "
               f"({n_devices} devices); optimizer {config.optim.optimizer}; whole state "
               f"{_mib(all_bytes(boxed.params) + all_bytes(boxed.opt_state))}")
  lines.append(f"per device: params {_mib(params)}  optimizer {_mib(opt)}")
  lines.append(f"per device total: {_mib(params + opt)} (without activations)")
  return "\n".join(lines)
