"""A run started from another run's checkpoint: several WSD budgets from one run.

Under ``optim.schedule=wsd`` the budgets of one model, seed and recipe share
their stable phase (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations": cooldowns branched from one
constant-rate run). A trunk run trains with the schedule of its longest budget
and stops at its last decay start (``train.stop_step``), keeping a checkpoint
at every budget's branch point (``checkpoint.keep_steps``). Each budget is a
run of its own (its own workdir, status, curves and evaluations) that starts
from the trunk's whole state at its branch point (``train.branch_from``,
``train.branch_step``: parameters, optimizer state, step, RNG key and data
position) and runs its decay. Its updates up to the branch point are then the
trunk's, and it equals a from-scratch WSD run of its length bitwise, where the
two agree on:

- what decides shapes, the data order and what is learned: the fields a resume
  keeps (``run_config.RESUME_FIELDS``) and the objective's (``OBJECTIVE_FIELDS``,
  which a resume may change: a branch may not, its updates would then differ
  from the from-scratch run's);
- the optimizer: every ``optim`` field but the two that set the decay's length
  (``DECAY_LENGTH``);
- the learning rate of every update up to the branch point: the two resolved
  schedules are evaluated at those updates and compared bit for bit. A rule on
  the fields alone would miss what the resolution derives from the run's
  length (a warmup capped at a tenth of the run where ``optim.decay_steps`` is
  derived, ``optim.resolve``) and a trunk whose own decay began before the
  branch point; the values are what the train step applies.

All of it is checked from the trunk's saved config, before anything is
compiled. Once the branched run has checkpoints of its own it resumes from
them and reads the trunk no more.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Mapping

import jax
import numpy as np

from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import optim
from tfx_jax.run.config_base import base_config
from tfx_jax.run.schedules import make_schedule
from tfx_jax.core.errors import ConfigError

# The objective's train fields: a resume may change them, a branch may not.
OBJECTIVE_FIELDS = ("train.label_smoothing", "train.z_loss", "train.moe_aux_loss",
                    "train.moe_aux_scope", "train.router_z_loss")
# What a branch and its trunk must agree on, besides the optimizer and its schedule.
FIELDS = run_config.RESUME_FIELDS + OBJECTIVE_FIELDS
# The optim fields that set the decay's length: the budgets differ in them.
DECAY_LENGTH = ("optim.decay_steps", "optim.decay_fraction")


@dataclasses.dataclass(frozen=True)
class BranchPoint:
  """The checkpoint a branched run starts from."""

  workdir: pathlib.Path    # the trunk's workdir (status.json's branch_from)
  directory: pathlib.Path  # its checkpoints directory
  step: int
  config: dict[str, Any]   # the flattened config saved with the checkpoint

  def describe(self) -> str:
    return f"step {self.step} of {self.directory}"


def checkpoints_dir(path: str) -> pathlib.Path:
  """A run's workdir or its checkpoints directory -> the checkpoints directory
  (as ``finetune.init_checkpoint`` reads it)."""
  root = pathlib.Path(path).expanduser().absolute()
  return root / "checkpoints" if (root / "checkpoints").is_dir() else root


def find(train: run_config.TrainConfig) -> BranchPoint:
  """The checkpoint at ``train.branch_step`` of ``train.branch_from``, with its
  config; a ConfigError names the steps there are where it is missing."""
  directory = checkpoints_dir(train.branch_from)
  if not directory.is_dir():
    raise ConfigError(f"train.branch_from={train.branch_from!r} is neither a run "
                      "directory nor a checkpoints directory.")
  source = ckpt_lib.Checkpointer(directory, read_only=True)
  try:
    steps = source.all_steps()
    if train.branch_step not in steps:
      raise ConfigError(
          f"train.branch_from={train.branch_from!r} has no checkpoint at "
          f"train.branch_step={train.branch_step}; its checkpoints are at steps "
          f"{steps or 'none'} (a trunk keeps its branch points with "
          "checkpoint.keep_steps).")
    config = source.read_config(train.branch_step)
  finally:
    source.close()
  workdir = directory.parent if directory.name == "checkpoints" else directory
  return BranchPoint(workdir, directory, train.branch_step, config)


def check_optimizer(point: BranchPoint, run: run_config.RunConfig,
                    flat_config: Mapping[str, Any]) -> None:
  """The trunk's optimizer and learning rates up to the branch point are this
  run's (the module docstring); ConfigError otherwise, naming the fields or the
  first update whose rate differs."""
  saved = {**run_config.flatten_config(base_config()), **point.config}
  fields = sorted(k for k in saved.keys() | flat_config.keys()
                  if k.startswith("optim.") and k not in DECAY_LENGTH)
  ckpt_lib.check_compatible(
      saved, flat_config, fields,
      lead=(f"train.branch_from's checkpoint ({point.describe()}) was trained with "
            "another optimizer and cannot be branched from (only the decay's length, "
            f"{' and '.join(DECAY_LENGTH)}, may differ)"),
      hint="set them as the trunk has them")
  section = {k.split(".", 1)[1]: v for k, v in saved.items() if k.startswith("optim.")}
  trunk, _ = optim.resolve(section, num_train_steps=int(saved["train.num_steps"]))
  d_model = int(saved.get("model.d_model", run.model.d_model))
  ours = _rates(run.optim, run.model.d_model, point.step)
  theirs = _rates(trunk, d_model, point.step)
  differ = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
  if differ.size:
    update = int(differ[0]) + 1
    raise ConfigError(
        f"train.branch_from's checkpoint ({point.describe()}) followed another "
        f"learning-rate schedule: update {update} had rate {theirs[differ[0]]!r} there, "
        f"{ours[differ[0]]!r} here ({differ.size} of the first {point.step} updates "
        f"differ). Trunk: {_schedule_text(trunk)}; this run: {_schedule_text(run.optim)}. "
        "A branch continues the trunk's stable phase: the warmups must be the same "
        "and the trunk's decay must not start before train.branch_step.")


def _rates(cfg: optim.OptimConfig, d_model: int, steps: int) -> np.ndarray:
  """The rates of updates 1..``steps`` of a resolved section, as the train step
  computes them (its values traced: ``optim.Hyperparameters``)."""
  hp = optim.hyperparameters(cfg, d_model=d_model)
  rates = jax.jit(lambda hp, counts: make_schedule(cfg, hp)(counts))
  return np.asarray(rates(hp, np.arange(steps, dtype=np.int32)), np.float32)


def _schedule_text(cfg: optim.OptimConfig) -> str:
  text = f"{cfg.schedule}, warmup {cfg.warmup_steps} steps, decay to step {cfg.decay_steps}"
  if cfg.schedule == "wsd":
    text += f" from step {run_config.decay_start(cfg)}"
  return text


def restore(point: BranchPoint, abstract_state: Any) -> ckpt_lib.Restored:
  """The trunk's whole state at the branch point, shaped and sharded as
  ``abstract_state``: parameters, optimizer state, step, RNG key, data position."""
  source = ckpt_lib.Checkpointer(point.directory, read_only=True)
  try:
    return source.restore(point.step, abstract_state=abstract_state)
  finally:
    source.close()
