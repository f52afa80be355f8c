"""What a run config means, checked once and without devices.

A locked ConfigDict (``configs/*.py`` plus ``--config.*`` overrides) becomes,
here and nowhere else, a validated ``ModelConfig``; every other field is
checked on the way. Nothing here looks at devices or processes, builds a
mesh, an optimizer or a model, or compiles anything, so a run meant for an
8-GPU node is checked on a laptop. ``train``, ``sweep``, ``evaluate`` and
``summary`` call ``validate_run_config``; what depends on the machine (the
mesh against the devices, the batch against the processes) is checked when a
run starts (``run_setup.check_devices``).
"""

from __future__ import annotations

import math
from typing import Any, get_args

from absl import logging
import flax

from tfx_jax import optim
from tfx_jax import sharding
from tfx_jax import tasks
from tfx_jax.data import files_corpus
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.errors import ConfigError
from tfx_jax.model_config import DType, ModelConfig, model_config_from_dict

# Config fields a checkpoint must agree on to be resumed: they decide shapes,
# data order or what is learned. Others (num_steps, eval, logging) may change.
RESUME_FIELDS = ("model.", "compute_dtype", "task", "seed", "data.name", "data.version",
                 "data.tokenizer",
                 "data.vocab_size", "data.mask_rate", "train.batch_size",
                 "train.seq_len", "optim.optimizer", "optim.accumulate_steps")
NONFINITE_CHOICES = ("stop", "skip")
DEFAULT_DTYPE = "float32"


def flatten_config(config) -> dict[str, Any]:
  """{"model.d_model": 128, ...} with JSON-able values."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  flat = flax.traverse_util.flatten_dict(d, sep=".")
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat.items()}


def compute_dtype(flat_or_config) -> str:
  """The computation dtype: ``compute_dtype``, or its deprecated alias
  ``model.dtype`` where only that is set. Parameters stay float32 either way.

  Accepts a ConfigDict or a flattened config (a checkpoint's). Both set to
  different values is a ConfigError naming both.
  """
  flat = isinstance(flat_or_config, dict)
  chosen = flat_or_config.get("compute_dtype")
  legacy = flat_or_config.get("model.dtype") if flat else flat_or_config.model.get("dtype")
  choices = get_args(DType)
  for field, value in (("compute_dtype", chosen), ("model.dtype", legacy)):
    if value is not None and value not in choices:
      raise ConfigError(f"{field}={value!r} is not a valid choice; choose one of: "
                        f"{', '.join(choices)}.")
  if legacy is None or legacy == chosen:
    return chosen or DEFAULT_DTYPE
  if chosen not in (None, DEFAULT_DTYPE):
    raise ConfigError(f"compute_dtype={chosen!r} and model.dtype={legacy!r} disagree; "
                      "model.dtype is the deprecated name of compute_dtype: set "
                      "compute_dtype only.")
  if not flat:
    logging.warning("model.dtype is deprecated: set compute_dtype=%s instead.", legacy)
  return legacy


def resume_view(flat: dict[str, Any]) -> dict[str, Any]:
  """A flattened config as a resume compares it: the computation dtype under
  its one name (a checkpoint written with ``model.dtype`` resumes under
  ``compute_dtype``), and the dataset's version (``data.version``, recorded
  by the trainer) apart from its name (``tfx_shakespeare:1.0.0`` is
  ``tfx_shakespeare`` at version 1.0.0)."""
  out = {k: v for k, v in flat.items() if k != "model.dtype"}
  out["compute_dtype"] = compute_dtype(flat)
  name, _, version = str(flat.get("data.name", "")).partition(":")
  out["data.name"] = name
  if version and not out.get("data.version"):
    out["data.version"] = version
  return out


def resolve_model_config(config) -> ModelConfig:
  """``config.model`` + ``compute_dtype`` (+ task checks) -> validated ModelConfig."""
  model = config.model.to_dict()
  model["dtype"] = compute_dtype(config)
  cfg = model_config_from_dict(model, seq_len=config.train.seq_len)
  task = tasks.check_task(config.task, cfg.family)
  if task.rows.labelled and cfg.num_classes < 2:
    raise ConfigError(
        f"task={config.task!r} needs model.num_classes >= 2 (the number of labels of "
        f"data.name={config.data.name!r}), got {cfg.num_classes}.")
  return cfg


def _need(ok: bool, field: str, value: Any, what: str) -> None:
  if not ok:
    raise ConfigError(f"{field}={value!r} is not valid: {what}.")


def validate_run_config(config) -> ModelConfig:
  """Every check that can be made before devices, data or compilation.

  Returns the validated model config; raises ConfigError naming the field.
  """
  cfg = resolve_model_config(config)
  t = config.train
  for name in ("num_steps", "batch_size", "seq_len", "log_every_steps"):
    _need(t[name] > 0, f"train.{name}", t[name], "must be > 0")
  _need(t.seq_len >= 2, "train.seq_len", t.seq_len, "must be >= 2")
  _need(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing", t.label_smoothing,
        "must be in [0, 1)")
  _need(isinstance(t.z_loss, (int, float)) and math.isfinite(t.z_loss) and t.z_loss >= 0,
        "train.z_loss", t.z_loss, "must be a number >= 0 (0 = off; PaLM: 1e-4)")
  _need(t.on_nonfinite in NONFINITE_CHOICES, "train.on_nonfinite", t.on_nonfinite,
        f"choose one of: {', '.join(NONFINITE_CHOICES)}")
  for name in ("every_steps", "num_batches", "batch_size"):
    _need(config.eval[name] > 0, f"eval.{name}", config.eval[name], "must be > 0")
  for name in ("num_bleu_examples", "num_samples"):
    _need(config.eval[name] >= 0, f"eval.{name}", config.eval[name], "must be >= 0")
  for name in ("every_steps", "max_to_keep"):
    _need(config.checkpoint[name] > 0, f"checkpoint.{name}", config.checkpoint[name],
          "must be > 0")
  _need(0.0 <= config.finetune.lambda_pt <= 1.0, "finetune.lambda_pt",
        config.finetune.lambda_pt, "must be in [0, 1]")
  optim.check_config(config.optim, num_train_steps=t.num_steps)
  d = config.data
  _need(d.tokenizer in tokenizer_lib.TOKENIZER_KINDS, "data.tokenizer", d.tokenizer,
        f"choose one of: {', '.join(tokenizer_lib.TOKENIZER_KINDS)}")
  _need(d.vocab_size > 0, "data.vocab_size", d.vocab_size, "must be > 0")
  _need(d.num_shards >= 0, "data.num_shards", d.num_shards,
        "must be >= 0 (0: one data shard per process)")
  rows = tasks.get(config.task).rows
  if rows.check_data is not None:
    rows.check_data(d)
  # data.name=files: the fields, the task's needs and the patterns (no file read).
  files_corpus.check_config(d, rows)
  data, fsdp, _ = sharding.mesh_sizes(config.mesh)
  for section in ("train", "eval"):
    size = config[section].batch_size
    if d.num_shards:
      _need(size % d.num_shards == 0, f"{section}.batch_size", size,
            f"must be divisible by the number of data shards "
            f"(data.num_shards={d.num_shards})")
    if data != -1 and fsdp != -1:  # else known once the devices are
      _need(size % (data * fsdp) == 0, f"{section}.batch_size", size,
            f"must be divisible by the batch axes of the mesh (mesh.data x mesh.fsdp "
            f"= {data * fsdp})")
  return cfg

