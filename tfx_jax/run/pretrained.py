"""Fine-tuning from another run: its parameters into a fresh train state.

Used when ``finetune.init_checkpoint`` names a run (GPT-1's recipe, textbook chapter 003:
L = L_FT + lambda * L_PT, and BERT's fine-tuning). Only parameters are taken;
the optimizer starts afresh.
"""

from __future__ import annotations

import pathlib

import flax
import jax
import numpy as np

from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.core.errors import ConfigError

# Model fields that may differ between a pretraining run and its fine-tuning.
_FINETUNE_FREE = ("model.num_classes", "model.dropout", "model.attention_dropout",
                  "model.remat", "model.dtype")


def load_pretrained(state, path: str, flat_config: dict,
                    param_shardings, log=print):
  """Starts fine-tuning from another run's latest parameters.

  ``path`` is a run's workdir or its ``checkpoints`` directory. Every
  parameter of the new model that the checkpoint has (same path and shape) is
  loaded; the rest (the classification head) keeps its fresh initialisation.
  The optimizer starts afresh.
  """
  root = pathlib.Path(path)
  directory = root / "checkpoints" if (root / "checkpoints").is_dir() else root
  if not directory.is_dir():
    raise ConfigError(f"finetune.init_checkpoint={path!r} is neither a run directory "
                      "nor a checkpoints directory.")
  source = ckpt_lib.Checkpointer(directory, read_only=True)  # never cleaned up from here
  try:
    if source.latest_step() is None:
      raise ConfigError(f"finetune.init_checkpoint={path!r} holds no checkpoint.")
    saved = source.read_config()
    fields = [k for k in flat_config if k.startswith("model.") and k not in _FINETUNE_FREE]
    ckpt_lib.check_compatible(saved, flat_config, fields)
    restored = source.restore()
  finally:
    source.close()
  pretrained = flax.traverse_util.flatten_dict(restored.state["params"], sep="/")
  fresh = flax.traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  merged, loaded = {}, 0
  for key, value in fresh.items():
    old = pretrained.get(key)
    if old is not None and tuple(old.shape) == tuple(value.shape):
      merged[key], loaded = np.asarray(old, value.dtype), loaded + 1
    else:
      merged[key] = value
  new_keys = sorted(set(fresh) - set(pretrained))
  log(f"Loaded {loaded}/{len(fresh)} parameter arrays from {directory}"
           + (f"; new: {', '.join(new_keys)}" if new_keys else "") + ".")
  params = flax.traverse_util.unflatten_dict(merged, sep="/")
  return state.replace(params=jax.device_put(params, param_shardings))
