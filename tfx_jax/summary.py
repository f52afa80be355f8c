"""Per-module parameter table of a config, without allocating the parameters.

  python -m tfx_jax.summary --config configs/lm.py:llama_7b

Shapes come from ``jax.eval_shape`` of the initialiser, so a 65B preset prints
in seconds. The last line is ``params: <total>``.
"""

from __future__ import annotations

import collections
import sys

from absl import flags
from ml_collections import config_flags

from tfx_jax.cli import new_flags, run_main
from tfx_jax.errors import ConfigError
from tfx_jax.model_config import model_config_from_dict

FLAGS = new_flags()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file[:preset].", lock_config=True, flag_values=FLAGS)
_DEPTH = flags.DEFINE_integer(
    "depth", 3, "How many levels of module names to group by.", flag_values=FLAGS)


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


def main(argv):
  del argv
  try:
    cfg = model_config_from_dict(_CONFIG.value.model)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  print(format_table(param_shapes(cfg), _DEPTH.value))


if __name__ == "__main__":
  run_main(main, FLAGS)
