"""The architectures by name, and the one an HF ``config.json`` declares."""

from __future__ import annotations

import dataclasses
from typing import Callable

from tfx_jax.errors import ConfigError
from tfx_jax.hf.bart_marian import (_bart_config, _bart_fields, _marian_config,
                                    _marian_fields, _seq2seq_rules)
from tfx_jax.hf.bert import _bert_config, _bert_fields, _bert_rules
from tfx_jax.hf.gpt import (_gpt2_config, _gpt2_fields, _gpt2_rules, _gpt_neox_config,
                            _gpt_neox_fields, _gpt_neox_rules)
from tfx_jax.hf.llama import (_gemma2_config, _gemma2_fields, _gemma2_rules,
                              _llama_config, _llama_fields, _llama_rules,
                              _qwen3_config, _qwen3_fields)
from tfx_jax.hf.rules import Rule
from tfx_jax.hf.t5 import _t5_config, _t5_fields, _t5_rules
from tfx_jax.model_config import ModelConfig


# --------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class Architecture:
  name: str
  model_type: str  # HF config.json "model_type"
  family: str
  task: str  # the tfx_jax task of a converted run
  # (HF config, names of the HF weights or None) -> model.* fields
  model_fields: Callable[..., dict]
  hf_config: Callable[[ModelConfig], dict]
  rules: Callable[[ModelConfig], list[Rule]]


ARCHITECTURES = {
    "llama": Architecture("llama", "llama", "decoder_only", "lm", _llama_fields,
                          _llama_config, _llama_rules),
    "gpt2": Architecture("gpt2", "gpt2", "decoder_only", "lm", _gpt2_fields,
                         _gpt2_config, _gpt2_rules),
    "gpt_neox": Architecture("gpt_neox", "gpt_neox", "decoder_only", "lm",
                             _gpt_neox_fields, _gpt_neox_config, _gpt_neox_rules),
    "qwen3": Architecture("qwen3", "qwen3", "decoder_only", "lm", _qwen3_fields,
                          _qwen3_config, lambda m: _llama_rules(m, qk_norm=True)),
    "gemma2": Architecture("gemma2", "gemma2", "decoder_only", "lm", _gemma2_fields,
                           _gemma2_config, _gemma2_rules),
    "bert": Architecture("bert", "bert", "encoder_only", "mlm", _bert_fields,
                         _bert_config, _bert_rules),
    "t5": Architecture("t5", "t5", "encoder_decoder", "translate", _t5_fields,
                       _t5_config, _t5_rules),
    "bart": Architecture(
        "bart", "bart", "encoder_decoder", "translate", _bart_fields, _bart_config,
        lambda m: _seq2seq_rules(m, learned=True, embed_norm=True)),
    "marian": Architecture(
        "marian", "marian", "encoder_decoder", "translate", _marian_fields,
        _marian_config, lambda m: _seq2seq_rules(m, learned=False, embed_norm=False)),
}


def architecture_for(hf_config: dict) -> Architecture:
  """The architecture of an HF ``config.json`` (by ``model_type``)."""
  kind = hf_config.get("model_type")
  for arch in ARCHITECTURES.values():
    if arch.model_type == kind:
      return arch
  raise ConfigError(f"HF model_type={kind!r} is not supported; supported: "
                    f"{', '.join(a.model_type for a in ARCHITECTURES.values())}.")
