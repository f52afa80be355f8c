"""Per-module parameter table of a config, without allocating the parameters.

  python -m tfx_jax.summary --config configs/lm.py:llama_7b
  python -m tfx_jax.summary --config configs/lm.py:llama_7b --mesh data=2,fsdp=2,tensor=2

Shapes come from ``jax.eval_shape`` of the initialiser, so a 65B preset prints
in seconds. The last line is ``params: <total>``. With ``--mesh`` (no devices
needed) it adds each parameter's sharding under ``sharding.LOGICAL_RULES`` and
the block each device holds, then the memory per device of the parameters and
of the optimizer state (``optim.*`` of the config), the last two lines.
"""

from __future__ import annotations

import collections

from absl import flags
from ml_collections import config_flags

from tfx_jax.cli import new_flags, run_main
from tfx_jax.errors import ConfigError
from tfx_jax import run_config


def _explain(argv: list[str]) -> str | None:
  """Names a ``--config.*`` override that is not a field (loaded only on an error)."""
  from tfx_jax.config_base import unknown_override  # pylint: disable=import-outside-toplevel
  return unknown_override(argv)


FLAGS = new_flags(explain=_explain)
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file[:preset].", lock_config=True, flag_values=FLAGS)
_DEPTH = flags.DEFINE_integer(
    "depth", 3, "How many levels of module names to group by.", flag_values=FLAGS)
_MESH = flags.DEFINE_string(
    "mesh", None, "A mesh to show the sharding and per-device memory on, e.g. "
    "data=2,fsdp=2,tensor=2 (axes left out have size 1).", flag_values=FLAGS)

MESH_AXES = ("data", "fsdp", "tensor")  # as tfx_jax.sharding (not imported: fast --help)


def param_shapes(model_cfg):
  """{path: ShapeDtypeStruct} of the unboxed parameters, via jax.eval_shape."""
  import flax.linen as nn
  import jax
  from flax import traverse_util

  # Deferred: jax and the model load only when a table is built (fast --help).
  from tfx_jax.models import build_model, dummy_inputs
  model = build_model(model_cfg)
  abstract = jax.eval_shape(
      lambda rng: model.init({"params": rng}, **dummy_inputs(model_cfg)),
      jax.random.PRNGKey(0))
  params = nn.unbox(abstract["params"])
  return {"/".join(k): v for k, v in traverse_util.flatten_dict(params).items()}


def count_params(model_cfg) -> int:
  import math
  return sum(math.prod(v.shape) for v in param_shapes(model_cfg).values())


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


def sharding_report(config, model_cfg, mesh_shape: dict[str, int]) -> str:
  """Each parameter's mesh axes and per-device block, then per-device memory."""
  import math
  import flax.linen as nn
  import jax
  from flax import traverse_util
  from tfx_jax import run_setup, sharding
  from tfx_jax.optim import make_optimizer

  tx = make_optimizer(config.optim, d_model=model_cfg.d_model)
  boxed = jax.eval_shape(run_setup.state_initializer(config, model_cfg, tx),
                         jax.random.PRNGKey(0))
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)

  def per_device_bytes(tree) -> int:
    total = 0
    for x in jax.tree.leaves(tree, is_leaf=is_box):
      value = x.value if is_box(x) else x
      block = sharding.shard_shape(value.shape, sharding.leaf_spec(x), mesh_shape)
      total += math.prod(block) * value.dtype.itemsize
    return total

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


def main(argv):
  del argv
  run = run_config.resolve(_CONFIG.value)
  mesh = parse_mesh(_MESH.value) if _MESH.value is not None else None
  print(format_table(param_shapes(run.model), _DEPTH.value))
  if mesh is not None:
    report = sharding_report(run, run.model, mesh)
    print()
    print(report)


if __name__ == "__main__":
  run_main(main, FLAGS)
