"""The full run configuration with typed defaults, shared by ``configs/*.py``.

Every field a user may set exists here with a typed default, so configs can be
locked (a typo fails with a suggestion) and overridden from the command line
(``--config.model.activation=swiglu``). Optional fields are typed placeholders.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any, Mapping

import ml_collections
from ml_collections import config_dict

from tfx_jax.errors import ConfigError
from tfx_jax.model_config import ModelConfig


def model_defaults() -> ml_collections.ConfigDict:
  """``config.model``: one field per :class:`ModelConfig` field, same defaults.

  ``model.dtype`` is the deprecated name of the top-level ``compute_dtype``
  (the one computation-dtype field): still accepted, unset by default.
  """
  model = ml_collections.ConfigDict(
      {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name != "dtype"})
  model.dtype = config_dict.placeholder(str)
  return model


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section; config files change what they need, then lock."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = "lm"  # lm | translate | mlm | classify
  c.model = model_defaults()

  c.data = ml_collections.ConfigDict()
  c.data.name = "tfx_shakespeare"
  c.data.data_dir = config_dict.placeholder(str)
  c.data.tokenizer = "sentencepiece"  # sentencepiece | byte | hf
  # data.tokenizer=hf: an HF tokenizer file (SentencePiece model or tokenizer.json),
  # as python -m tfx_jax.convert from-hf copies it into the run's workdir.
  c.data.tokenizer_file = config_dict.placeholder(str)
  c.data.vocab_size = 4096
  c.data.mask_rate = 0.15
  # The split is read as this many grain pipelines (strided shards), divided
  # among the processes; each process reads only its own. The global batch is
  # one sub-batch per shard, so a fixed count gives the same batches on any
  # number of processes that divides it or is a multiple of it. 0: one shard
  # per process when the run starts (a resumed run keeps its checkpoint's).
  c.data.num_shards = 0
  c.data.text_key = config_dict.placeholder(str)
  c.data.source_key = config_dict.placeholder(str)
  c.data.target_key = config_dict.placeholder(str)
  c.data.label_key = config_dict.placeholder(str)
  # data.name=files: your own corpus (tfx_jax/data/files_corpus.py). Comma-
  # separated glob patterns of .txt/.text, .jsonl/.json or .parquet files; the
  # *_key fields above name their JSON fields / Parquet columns (text_key
  # default: "text"). A split without files is held out of train_files by
  # document: holdout_fraction of its documents each, ranked by a hash of
  # (holdout_seed, document), so a run's seed does not change the splits.
  c.data.train_files = config_dict.placeholder(str)
  c.data.validation_files = config_dict.placeholder(str)
  c.data.test_files = config_dict.placeholder(str)
  c.data.text_layout = "file"  # file | paragraphs: a .txt document per file or blank-line block
  c.data.holdout_fraction = 0.05
  c.data.holdout_seed = 0

  c.train = ml_collections.ConfigDict()
  c.train.num_steps = 1000
  c.train.batch_size = 32
  c.train.seq_len = 128
  c.train.log_every_steps = 50
  c.train.label_smoothing = 0.0
  # z-loss (PaLM: 1e-4): the objective + z_loss * log^2 Z of the output softmax,
  # averaged over tokens, logged as train/z_loss (train/output_log_z, the mean
  # log Z, is logged always).
  c.train.z_loss = 0.0
  c.train.on_nonfinite = "stop"  # stop | skip
  # Per-layer gradient, parameter and update norms as TensorBoard scalars
  # (layer_stats/<kind>_norm/<stack>_<NN>) and each layer's largest
  # self-attention logit (layer_stats/max_attention_logit/<stack>_<NN>),
  # computed inside the jitted step.
  c.train.log_layer_stats = False

  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 200
  c.eval.num_batches = 8
  c.eval.batch_size = 32
  c.eval.num_bleu_examples = 64  # translation: BLEU on a fixed validation subset
  c.eval.num_samples = 3  # decoded samples written to TensorBoard text

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 500
  c.checkpoint.max_to_keep = 3

  c.optim = ml_collections.ConfigDict()
  c.optim.optimizer = "adamw"  # adam | adamw | adafactor
  c.optim.learning_rate = 1e-3
  c.optim.schedule = "cosine"  # inverse_sqrt | cosine | linear | constant
  c.optim.warmup_steps = 100
  c.optim.scale_by_d_model = False  # the Transformer paper's d_model^-0.5 factor
  c.optim.b1 = 0.9
  c.optim.b2 = 0.98
  c.optim.eps = 1e-9
  c.optim.weight_decay = 0.0
  c.optim.grad_clip_norm = 1.0
  c.optim.decay_steps = 0  # cosine, linear: 0 = train.num_steps
  c.optim.min_lr_ratio = 0.1
  c.optim.accumulate_steps = 1

  c.finetune = ml_collections.ConfigDict()
  c.finetune.init_checkpoint = config_dict.placeholder(str)  # a workdir or checkpoints dir
  c.finetune.lambda_pt = 0.5  # L = L_FT + lambda * L_PT (decoder_only)

  # Mesh axis sizes (-1: all remaining devices) and logical -> mesh axis rules.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.mesh.fsdp = 1
  c.mesh.tensor = 1
  # The computation dtype, float32 | bfloat16; parameters, optimizer state and
  # the loss's softmax statistics stay float32.
  c.compute_dtype = "float32"
  return c


def apply_preset(config: ml_collections.ConfigDict, row: Mapping[str, Any]) -> None:
  """Sets the fields of one row of a preset table (``configs/*.py``).

  A row maps section names (``model``, ``data``, ``train``, ...) to
  ``{field: value}``, and top-level fields (``compute_dtype``) to values.
  ``vocab_size`` is given once per row and sets both ``model.vocab_size`` and
  ``data.vocab_size``: the embedding and the tokenizer must agree. A field that
  the config does not have raises ``KeyError``: a typo in a table never adds one.
  """
  for key, value in row.items():
    if key == "vocab_size":
      _set(config.model, "model", vocab_size=value)
      _set(config.data, "data", vocab_size=value)
    elif isinstance(value, Mapping):
      if key not in config:
        raise KeyError(f"{key} is not a config section")
      _set(config[key], key, **value)
    else:
      _set(config, "config", **{key: value})


def select_preset(table: Mapping[str, Any], preset: str, file: str) -> Any:
  """``table[preset]``, or a ValueError listing the presets of ``file``."""
  if preset not in table:
    raise ValueError(f"unknown preset {preset!r} for configs/{file}; choose one of: "
                     f"{', '.join(table)}")
  return table[preset]


def _set(section: ml_collections.ConfigDict, where: str, /, **values) -> None:
  for key, value in values.items():
    if key not in section:
      raise KeyError(f"{where}.{key} is not a config field")
    setattr(section, key, value)


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """``configs/lm.py:tiny`` -> that file's ``get_config("tiny")``.

  A missing file, or a config file that fails (an unknown preset, a bad
  table), is a ConfigError naming the spec.
  """
  path, _, preset = spec.partition(":")
  if not pathlib.Path(path).is_file():
    raise ConfigError(f"config file {path!r} does not exist.")
  module_spec = importlib.util.spec_from_file_location(
      f"_tfx_config_{pathlib.Path(path).stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
    return module.get_config(preset) if preset else module.get_config()
  except (ValueError, KeyError) as e:
    raise ConfigError(f"--config {spec}: {e}") from None
