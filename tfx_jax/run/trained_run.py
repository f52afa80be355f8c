"""A run's model at one training step: what generation and scoring work on.

``TrainedRun`` holds a run's config, validated model config, tokenizer,
parameters at one step and its ``ShardedRun`` (mesh and steps). The training
loop makes one of its live state at every evaluation (for the samples it
logs); ``load_run(workdir)`` makes one from a workdir's config.json and a
checkpoint, for the evaluation and generation commands.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import ml_collections

from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import setup as run_setup
from tfx_jax.run.config_base import base_config
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import ModelConfig


@dataclasses.dataclass
class TrainedRun:
  """A run's model at training step ``step`` (live or loaded from a checkpoint)."""
  workdir: pathlib.Path
  config: run_config.RunConfig
  model_cfg: ModelConfig
  tokenizer: Any
  params: Any
  step: int
  sharded: run_setup.ShardedRun | None = None


def load_config(workdir) -> ml_collections.ConfigDict:
  """The full config a run saved (defaults for fields added since)."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists():
    raise ConfigError(f"--workdir={workdir}: no config.json there; is it a tfx_jax run "
                      "directory (python -m tfx_jax.train --workdir ...)?")
  config = base_config()
  config.update(json.loads(path.read_text()))
  return config


def load_run(workdir, step: int | None = None) -> TrainedRun:
  """Config, tokenizer and parameters of ``step`` (default: latest) of a run."""
  config = run_config.resolve(load_config(workdir))
  model_cfg = config.model
  directory = pathlib.Path(workdir) / "checkpoints"
  if not directory.is_dir():
    raise ConfigError(f"--workdir={workdir} has no checkpoints directory.")
  ckpt = ckpt_lib.Checkpointer(directory, max_to_keep=10**6)
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise ConfigError(f"--workdir={workdir} holds no checkpoint yet.")
    if step is not None and step not in steps:
      raise ConfigError(f"--step={step} is not a checkpoint of {workdir}; "
                        f"available steps: {', '.join(map(str, steps))}.")
    tokenizer = run_setup.load_tokenizer(config)
    sharded = run_setup.ShardedRun(config, model_cfg, byte_lengths=tokenizer.byte_lengths())
    restored = ckpt.restore(step, abstract_state=sharded.abstract_state)
  finally:
    ckpt.close()
  return TrainedRun(pathlib.Path(workdir), config, model_cfg, tokenizer,
                  restored.state.params, int(restored.state.step), sharded)
