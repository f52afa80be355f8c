"""The systems the bench times: tfx_jax and its Hugging Face PyTorch peers.

Both sides are built from one ``Shape``: the same architecture at the same
sizes, float32, random weights and tokens, and the same optimizer (AdamW with
the betas, eps and clipping below, no weight decay, a constant learning rate).
Each system is a callable that runs one step and says how much work that step
is (``tokens``) and what its compilation cost (``compile_s``). torch and
transformers (the ``bench`` extra) are imported only when a peer is built.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
  """One benchmark shape, the same on every side."""
  vocab: int = 8192
  d_model: int = 256
  layers: int = 4
  heads: int = 8
  d_ff: int = 688  # SwiGLU hidden width (HF ``intermediate_size``)
  seq: int = 256
  batch: int = 8
  s2s_layers: int = 2  # encoder and decoder layers of the seq2seq model
  s2s_d_ff: int = 1024  # its ReLU FFN width
  s2s_seq: int = 128  # source and target length


# AdamW on both sides: learning rate (constant), betas, eps, gradient-norm clip.
LR, B1, B2, EPS, CLIP = 1e-3, 0.9, 0.95, 1e-8, 1.0


# ------------------------------------------------------------------ tfx_jax
def lm_model(shape: Shape, **overrides) -> dict:
  model = dict(family="decoder_only", norm_position="pre", norm_type="rmsnorm",
               activation="swiglu", gated_d_ff=shape.d_ff, position="rope",
               num_layers=shape.layers, d_model=shape.d_model, num_heads=shape.heads,
               vocab_size=shape.vocab, max_len=max(shape.seq, 512), use_bias=False,
               tie_embeddings=True, norm_eps=1e-6, dropout=0.0)
  model.update(overrides)
  return model


def s2s_model(shape: Shape, **overrides) -> dict:
  model = dict(family="encoder_decoder", norm_position="pre", norm_type="rmsnorm",
               activation="relu", d_ff=shape.s2s_d_ff, position="t5_bias",
               num_layers=shape.s2s_layers, d_model=shape.d_model, num_heads=shape.heads,
               vocab_size=shape.vocab, max_len=max(shape.s2s_seq, 512), use_bias=False,
               tie_embeddings=True, norm_eps=1e-6, dropout=0.0)
  model.update(overrides)
  return model


def _run_config(model: dict, batch: int, seq: int, dtype: str = "float32"):
  from tfx_jax.run.config_base import base_config
  c = base_config()
  c.compute_dtype = dtype
  c.task = "lm" if model["family"] == "decoder_only" else "translate"
  for k, v in model.items():
    c.model[k] = v
  c.data.vocab_size = model["vocab_size"]
  c.train.batch_size = batch
  c.train.seq_len = seq
  c.optim.update(dict(optimizer="adamw", learning_rate=LR, schedule="constant",
                      warmup_steps=0, b1=B1, b2=B2, eps=EPS, weight_decay=0.0,
                      grad_clip_norm=CLIP))
  c.lock()
  return c


def _random_batch(family: str, batch: int, seq: int, vocab: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  ids = rng.integers(4, vocab, size=(batch, seq + 1), dtype=np.int32)
  ones = np.ones((batch, seq), np.int32)
  if family == "decoder_only":
    return {"inputs": ids[:, :-1], "targets": ids[:, 1:], "weights": ones.astype(np.float32),
            "segment_ids": ones, "positions": np.broadcast_to(np.arange(seq, dtype=np.int32),
                                                               (batch, seq)).copy()}
  src = rng.integers(4, vocab, size=(batch, seq), dtype=np.int32)
  return {"inputs": src, "decoder_inputs": ids[:, :-1], "targets": ids[:, 1:],
          "weights": ones.astype(np.float32)}


class TfxTrain:
  """The jitted, donated train step of ``run_setup.ShardedRun`` on a fixed batch."""

  def __init__(self, model: dict, batch: int, seq: int, dtype: str = "float32"):
    from tfx_jax.run.config import resolve
    from tfx_jax.run.setup import ShardedRun
    from tfx_jax.run import sharding as sharding_lib
    resolved = resolve(_run_config(model, batch, seq, dtype))
    run = ShardedRun(resolved, resolved.model)
    self.state = run.init_state()
    self.batch = sharding_lib.global_batch(
        _random_batch(model["family"], batch, seq, model["vocab_size"]), run.mesh)
    t0 = time.perf_counter()
    self.hparams = run.step_hparams()
    self.step_fn = run.train_step().lower(self.state, self.batch, self.hparams).compile()
    self.compile_s = time.perf_counter() - t0
    self.tokens = batch * seq
    self.losses = []

  def __call__(self):
    self.state, metrics = self.step_fn(self.state, self.batch, self.hparams)
    self.losses.append(float(metrics["loss"]))  # blocks: the step is finished


# -------------------------------------------------------------------- torch
def torch_modules():
  try:
    import torch
    import transformers
  except ImportError:
    return None
  return torch, transformers


def _hf_llama(shape: Shape):
  torch, transformers = torch_modules()
  cfg = transformers.LlamaConfig(
      vocab_size=shape.vocab, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
      num_key_value_heads=shape.heads, max_position_embeddings=max(shape.seq, 512),
      rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
      mlp_bias=False, rope_theta=10000.0)
  cfg._attn_implementation = "sdpa"
  return transformers.LlamaForCausalLM(cfg)


def _hf_t5(shape: Shape):
  torch, transformers = torch_modules()
  cfg = transformers.T5Config(
      vocab_size=shape.vocab, d_model=shape.d_model, d_kv=shape.d_model // shape.heads,
      d_ff=shape.s2s_d_ff, num_layers=shape.s2s_layers,
      num_decoder_layers=shape.s2s_layers, num_heads=shape.heads, dropout_rate=0.0,
      feed_forward_proj="relu", tie_word_embeddings=True, layer_norm_epsilon=1e-6,
      decoder_start_token_id=2, pad_token_id=0, eos_token_id=3)
  return transformers.T5ForConditionalGeneration(cfg)


class TorchTrain:
  """One HF training step (forward, loss, backward, clip, AdamW), eager or compiled.

  ``dtype`` "bfloat16": the forward and the loss under
  ``torch.autocast("cpu", torch.bfloat16)`` (float32 parameters and optimizer,
  as PyTorch's mixed precision has it); the backward follows the autocast
  forward's dtypes.
  """

  def __init__(self, family: str, shape: Shape, batch: int, seq: int, compiled: bool,
               dtype: str = "float32"):
    torch, _ = torch_modules()
    torch.manual_seed(0)
    self.torch = torch
    self.autocast = dtype == "bfloat16"
    self.model = (_hf_llama(shape) if family == "decoder_only" else _hf_t5(shape)).train()
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=(B1, B2), eps=EPS,
                                 weight_decay=0.0)
    b = _random_batch(family, batch, seq, shape.vocab)
    self.kwargs = {"input_ids": torch.from_numpy(b["inputs"].astype(np.int64))}
    if family == "decoder_only":
      self.targets = torch.from_numpy(b["targets"].astype(np.int64))
    else:
      self.kwargs["decoder_input_ids"] = torch.from_numpy(
          b["decoder_inputs"].astype(np.int64))
      self.targets = torch.from_numpy(b["targets"].astype(np.int64))
    forward = self.model
    if compiled:
      forward = torch.compile(self.model)
    self.forward = forward
    self.tokens = batch * seq
    self.losses = []
    t0 = time.perf_counter()
    if compiled:
      self()  # compilation happens on the first call
    self.compile_s = time.perf_counter() - t0 if compiled else 0.0

  def __call__(self):
    torch = self.torch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
      logits = self.forward(**self.kwargs).logits
      loss = torch.nn.functional.cross_entropy(
          logits.reshape(-1, logits.shape[-1]).float(), self.targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.losses.append(float(loss.detach()))


# ------------------------------------------------------------------- decode
class TfxDecode:
  """Cached greedy decoding (``search.generate`` / ``translate_greedy``), eos off."""

  def __init__(self, model: dict, batch: int, prefix: int, new: int):
    from tfx_jax.model import decoding as search
    from tfx_jax.model.config import model_config_from_dict
    from tfx_jax.model.families import init_params
    import flax.linen as nn
    cfg = model_config_from_dict(model)
    params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(0)
    prompt = rng.integers(4, cfg.vocab_size, size=(batch, prefix), dtype=np.int32)
    if cfg.family == "decoder_only":
      self.fn = lambda: search.generate(params, cfg, prompt, new, greedy=True, eos_id=-1)
    else:
      self.fn = lambda: search.translate_greedy(params, cfg, prompt, max_len=new,
                                                eos_id=-1)
    t0 = time.perf_counter()
    self()
    self.compile_s = time.perf_counter() - t0
    self.tokens = batch * new

  def __call__(self):
    jax.block_until_ready(self.fn())


class HfDecode:
  """HF ``generate()`` with the KV cache, greedy, exactly ``new`` tokens."""

  def __init__(self, family: str, shape: Shape, batch: int, prefix: int, new: int):
    torch, _ = torch_modules()
    torch.manual_seed(0)
    self.torch = torch
    self.model = (_hf_llama(shape) if family == "decoder_only" else _hf_t5(shape)).eval()
    rng = np.random.default_rng(0)
    self.ids = torch.from_numpy(
        rng.integers(4, shape.vocab, size=(batch, prefix)).astype(np.int64))
    self.new = new
    self.tokens = batch * new
    self.compile_s = 0.0

  def __call__(self):
    with self.torch.inference_mode():
      out = self.model.generate(
          input_ids=self.ids, attention_mask=self.torch.ones_like(self.ids),
          max_new_tokens=self.new, min_new_tokens=self.new, do_sample=False,
          num_beams=1, eos_token_id=None, pad_token_id=0, use_cache=True)
    assert out.shape[1] >= self.new
