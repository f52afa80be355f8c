"""The Hugging Face architectures tfx_jax can import and export, declared once.

Each :class:`~tfx_jax.hf.registry.Architecture` says, in both directions,
  * how an HF ``config.json`` maps onto ``ModelConfig`` fields (``model_fields``)
    and back (``hf_config``), and
  * how each HF weight maps onto the tfx_jax parameter tree (``rules``): a rule
    names one HF tensor, the tfx_jax parameters it becomes, and a pair of
    exact array maps (transposes, reshapes, splits, row slices), so that
    export -> import is bit-identical.

Modules:

  rules.py        Rule and the array maps (same, linear, heads_in, heads_out, ...);
                  add_attention, add_norm, add_dense: the rules of a whole block
  fields.py       config fields several architectures share: activation names,
                  head widths, RoPE (rope_parameters or the older keys), sliding
                  windows (layer_types); model_* and *_fields read HF's, hf_* and
                  HF_* write them
  llama.py        LLaMA, Qwen3, Gemma 2 (gemma_norm: HF's 1 + w gains)
  moe.py          Mixtral, Qwen3-MoE, OLMoE (experts stacked: stacked_linear)
  deepseek.py     DeepSeek-V3 (multi-head latent attention, its interleaved RoPE
                  columns permuted; dense layers, then shared and routed experts)
  qwen3_next.py   Qwen3-Next (Gated DeltaNet layers, gated attention, a gated
                  shared expert; in_proj_qkvz / in_proj_ba split per key head)
  gpt_oss.py      gpt-oss (attention sinks, alternating windows, YaRN unrounded;
                  experts with biases, a clamped SwiGLU, interleaved gate/up)
  gpt.py          GPT-2, GPT-NeoX
  bert.py         BERT
  t5.py           T5 1.0 and v1.1
  bart_marian.py  BART, Marian
  registry.py     Architecture, ARCHITECTURES, architecture_for

Each architecture module exports <name>_fields (HF config -> model.* fields),
<name>_config (ModelConfig -> HF config) and <name>_rules (ModelConfig -> its
weight rules) for the registry; adding an architecture is those three and a
row of ARCHITECTURES (and <name>_checkpoint_rules where a checkpoint's weight
layout follows an HF setting no model.* field records: DeepSeek-V3's
rope_interleave). Names with a leading underscore are used by their own
module only.

The registry is exported here (``from tfx_jax.hf import ARCHITECTURES,
Architecture, architecture_for``); importing it loads jax and the model
config, no HF library (torch, transformers). The modules of this package import
each other by their own names, never a name of this file, which runs first.

Which canonical variant each architecture is, in ``model.*`` terms:

  LLaMA    decoder_only, pre, rmsnorm, swiglu, rope (half-split), no biases, GQA;
           RoPE scaling linear or yarn (rope_scaling)
  GPT-2    decoder_only, pre, layernorm, gelu_tanh, learned positions, tied
  GPT-NeoX decoder_only, parallel block (use_parallel_residual; sequential
           without), pre, layernorm with biases, gelu, rope over rotary_pct of
           each head (rope_fraction), fused query_key_value, untied embed_out
  Qwen3    as LLaMA plus per-head RMSNorm of queries and keys (qk_norm),
           head_dim of its own; sliding windows where layer_types fit
           attention_window and global_every
  Gemma 2  decoder_only, sandwich, rmsnorm (HF's gain w is 1 + w here),
           geglu_tanh, rope, no biases, GQA, head_dim of its own, embeddings
           x sqrt(d_model), attention and final logit soft-caps, sliding and
           global layers alternating (attention_window, global_every=2), tied
  Mixtral  LLaMA with a mixture of experts in every layer (softmax router, top
           k renormalised), a sliding window on every layer with one
  Qwen3-MoE Qwen3 with a mixture of experts in the layers from mlp_only_layers
           on that are multiples of decoder_sparse_step (first_dense_layers,
           moe_every), norm_topk_prob as router_norm_topk
  OLMoE    decoder_only, pre, rmsnorm, swiglu, rope, q/k RMSNorm over all heads
           (qk_norm_heads='joint'), a mixture of experts in every layer
  DeepSeek-V3 decoder_only, pre, rmsnorm, swiglu, attention_type='mla' (with or
           without query compression, RoPE over its d_R part, YaRN with
           mscale = mscale_all_dim = 1), the first_k_dense_replace layers
           dense (first_dense_layers), then a mixture of experts: sigmoid
           router with the expert bias (moe_balance='bias'), shared experts,
           norm_topk_prob, routed_scaling_factor (router_scale), n_group /
           topk_group (router_groups, router_topk_groups)
  Qwen3-Next decoder_only, pre, rmsnorm (HF's 1 + w gains), swiglu; layer_types
           as mixer_pattern (linear_attention D: Gated DeltaNet with grouped
           value heads, deltanet_v_heads / deltanet_v_head_dim; full_attention
           A: attention_gate='elementwise', per-head qk_norm, RoPE over
           partial_rotary_factor); a mixture of experts as Qwen3-MoE's plus one
           shared expert (shared_expert_d_ff) with its sigmoid gate
           (shared_expert_gate)
  gpt-oss  decoder_only, pre, rmsnorm, rope (YaRN with rope_yarn_truncate
           False), GQA with biases and attention_sinks, sliding and full
           layers alternating (global_every=2), a mixture of experts in every
           layer: router with router_use_bias, top k renormalised, experts
           with biases and activation='swiglu_oss' (swiglu_limit, swiglu_alpha)
  BERT     encoder_only, post, layernorm, gelu, learned positions, token types,
           embedding norm, MLM head
  T5 1.0   encoder_decoder, pre, rmsnorm, relu, t5_bias, no biases,
           unscaled attention logits, tied, decoder output x d_model^-0.5
           (scale_output)
  T5 v1.1  as T5 1.0 but geglu_tanh (or swiglu), decoder output unscaled,
           tied or untied output; HF states the FFN, the scaling and the
           tying separately, so every combination of the three maps
  BART     encoder_decoder, post, layernorm, gelu, learned positions (HF's
           offset of 2 rows dropped), embedding norms, output bias, tied
  Marian   encoder_decoder, post, layernorm, swish, sinusoidal [sin | cos]
           halves, embeddings x sqrt(d_model), output bias, tied
"""

from tfx_jax.hf.registry import ARCHITECTURES, Architecture, architecture_for

__all__ = ["ARCHITECTURES", "Architecture", "architecture_for"]
