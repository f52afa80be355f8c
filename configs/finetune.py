"""Classification fine-tuning: which genre of play a passage comes from.

Decoder-only (GPT-1 style, textbook chapter 003): the class head reads the last real
token, and the objective is L = L_FT + lambda * L_PT with lambda =
``finetune.lambda_pt`` in [0, 1]. Encoder-only (BERT style): the pooled first
token, L = L_FT. Start from a pretrained run's checkpoint, or from scratch:

  python -m tfx_jax.train --config configs/lm.py:tiny --workdir runs/lm_tiny
  python -m tfx_jax.train --config configs/finetune.py:tiny --workdir runs/ft_tiny \
      --config.finetune.init_checkpoint=runs/lm_tiny
  python -m tfx_jax.train --config configs/finetune.py:mlm_tiny --workdir runs/ft_mlm

The model fields of the preset match the corresponding pretraining preset
(configs/lm.py:tiny, configs/mlm.py:tiny), so its checkpoint loads; the class
head is new. Data: the embedded tfx_shakespeare_genre (4 classes: comedy,
history, tragedy, poetry; whole works held out for validation), tokenized with
tfx_shakespeare's SentencePiece model.
"""

import importlib.util
import os

from tfx_jax.run.config_base import apply_preset, base_config, select_preset

# Preset -> the pretraining preset whose model and data fields it takes over
# (the vocabulary included), so that preset's checkpoint loads.
_PRETRAINING = {"tiny": ("lm.py", "tiny"), "mlm_tiny": ("mlm.py", "tiny")}
PRESETS = tuple(_PRETRAINING)
NUM_GENRES = 4

# What every fine-tuning preset sets over its pretraining preset.
_FINETUNE = {
    "model": dict(num_classes=NUM_GENRES),
    "data": dict(name="tfx_shakespeare_genre"),
    "train": dict(num_steps=300, batch_size=16, log_every_steps=20),
    # The whole validation split (num_batches=0: 643 passages), as configs/lm.py:tiny.
    "eval": dict(every_steps=100, num_batches=0, batch_size=16),
    "checkpoint": dict(every_steps=100),
    "optim": dict(learning_rate=3e-3, warmup_steps=20, schedule="cosine"),
    "finetune": dict(lambda_pt=0.5),
}


def _pretraining_config(file: str, preset: str):
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), file)
  spec = importlib.util.spec_from_file_location(f"_tfx_{file[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


def get_config(preset: str = "tiny"):
  pre = _pretraining_config(*select_preset(_PRETRAINING, preset, "finetune.py"))
  c = base_config()
  c.task = "classify"
  apply_preset(c, {"model": pre.model.to_dict(), "data": pre.data.to_dict(),
                   "train": dict(seq_len=pre.train.seq_len)})
  apply_preset(c, _FINETUNE)
  c.lock()
  return c
