"""The architectures by name, and the one an HF ``config.json`` declares.

Each architecture module exports three functions per architecture,
``<name>_fields``, ``<name>_config`` and ``<name>_rules``, which
:class:`Architecture` collects: adding one is a module (or a section of one)
with those three, and a row of ``ARCHITECTURES``. One whose checkpoints lay
their weights out by an HF setting that no ``model.*`` field records
(DeepSeek-V3's ``rope_interleave``) adds ``<name>_checkpoint_rules`` (the
ModelConfig and the HF config -> the rules that read such a checkpoint).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tfx_jax.core.errors import ConfigError
from tfx_jax.hf.bart_marian import (bart_config, bart_fields, bart_rules, marian_config,
                                    marian_fields, marian_rules)
from tfx_jax.hf.bert import bert_config, bert_fields, bert_rules
from tfx_jax.hf.deepseek import (deepseek_v3_checkpoint_rules, deepseek_v3_config,
                                 deepseek_v3_fields, deepseek_v3_rules)
from tfx_jax.hf.gpt import (gpt2_config, gpt2_fields, gpt2_rules, gpt_neox_config,
                            gpt_neox_fields, gpt_neox_rules)
from tfx_jax.hf.gpt_oss import gpt_oss_config, gpt_oss_fields, gpt_oss_rules
from tfx_jax.hf.llama import (gemma2_config, gemma2_fields, gemma2_rules,
                              llama_config, llama_fields, llama_rules,
                              qwen3_config, qwen3_fields, qwen3_rules)
from tfx_jax.hf.moe import (mixtral_config, mixtral_fields, mixtral_rules, olmoe_config,
                            olmoe_fields, olmoe_rules, qwen3_moe_config, qwen3_moe_fields,
                            qwen3_moe_rules)
from tfx_jax.hf.qwen3_next import qwen3_next_config, qwen3_next_fields, qwen3_next_rules
from tfx_jax.hf.rules import Rule
from tfx_jax.hf.t5 import t5_config, t5_fields, t5_rules
from tfx_jax.model.config import ModelConfig


# --------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class Architecture:
  """One HF architecture, both directions: its config fields and its weights."""
  name: str
  model_type: str  # HF config.json "model_type"
  family: str
  task: str  # the tfx_jax task of a converted run
  # (HF config, names of the HF weights or None) -> model.* fields
  model_fields: Callable[..., dict]
  hf_config: Callable[[ModelConfig], dict]
  rules: Callable[[ModelConfig], list[Rule]]
  # (ModelConfig, HF config) -> the rules of an HF checkpoint whose weights'
  # layout depends on an HF setting that no model.* field records (DeepSeek-V3's
  # rope_interleave); None: ``rules`` (which is also the layout exports write).
  checkpoint_rules: Callable[[ModelConfig, dict], list[Rule]] | None = None

  def import_rules(self, cfg: ModelConfig, hf_config: dict) -> list[Rule]:
    """The weight rules that read a checkpoint of ``hf_config``."""
    if self.checkpoint_rules is None:
      return self.rules(cfg)
    return self.checkpoint_rules(cfg, hf_config)


ARCHITECTURES = {
    "llama": Architecture("llama", "llama", "decoder_only", "lm", llama_fields,
                          llama_config, llama_rules),
    "gpt2": Architecture("gpt2", "gpt2", "decoder_only", "lm", gpt2_fields,
                         gpt2_config, gpt2_rules),
    "gpt_neox": Architecture("gpt_neox", "gpt_neox", "decoder_only", "lm",
                             gpt_neox_fields, gpt_neox_config, gpt_neox_rules),
    "qwen3": Architecture("qwen3", "qwen3", "decoder_only", "lm", qwen3_fields,
                          qwen3_config, qwen3_rules),
    "gemma2": Architecture("gemma2", "gemma2", "decoder_only", "lm", gemma2_fields,
                           gemma2_config, gemma2_rules),
    "mixtral": Architecture("mixtral", "mixtral", "decoder_only", "lm", mixtral_fields,
                            mixtral_config, mixtral_rules),
    "qwen3_moe": Architecture("qwen3_moe", "qwen3_moe", "decoder_only", "lm",
                              qwen3_moe_fields, qwen3_moe_config, qwen3_moe_rules),
    "olmoe": Architecture("olmoe", "olmoe", "decoder_only", "lm", olmoe_fields,
                          olmoe_config, olmoe_rules),
    "deepseek_v3": Architecture("deepseek_v3", "deepseek_v3", "decoder_only", "lm",
                                deepseek_v3_fields, deepseek_v3_config, deepseek_v3_rules,
                                deepseek_v3_checkpoint_rules),
    "qwen3_next": Architecture("qwen3_next", "qwen3_next", "decoder_only", "lm",
                               qwen3_next_fields, qwen3_next_config, qwen3_next_rules),
    "gpt_oss": Architecture("gpt_oss", "gpt_oss", "decoder_only", "lm", gpt_oss_fields,
                            gpt_oss_config, gpt_oss_rules),
    "bert": Architecture("bert", "bert", "encoder_only", "mlm", bert_fields,
                         bert_config, bert_rules),
    "t5": Architecture("t5", "t5", "encoder_decoder", "translate", t5_fields,
                       t5_config, t5_rules),
    "bart": Architecture("bart", "bart", "encoder_decoder", "translate", bart_fields,
                         bart_config, bart_rules),
    "marian": Architecture("marian", "marian", "encoder_decoder", "translate",
                           marian_fields, marian_config, marian_rules),
}


def architecture_for(hf_config: dict) -> Architecture:
  """The architecture of an HF ``config.json`` (by ``model_type``)."""
  kind = hf_config.get("model_type")
  for arch in ARCHITECTURES.values():
    if arch.model_type == kind:
      return arch
  raise ConfigError(f"HF model_type={kind!r} is not supported; supported: "
                    f"{', '.join(a.model_type for a in ARCHITECTURES.values())}.")
