"""Hugging Face interop: logits and greedy-decoding parity with transformers'
own implementations, export -> import bit-identity, unrepresentable exports.

Each architecture is a tiny random HF model (2 layers, 4 for Gemma 2, 3 for
Qwen3-MoE; the mixtures of experts 4 experts, 2 per token; d_model
32; vocab 100) with every parameter perturbed away from its initial value (norm
gains, biases, the output bias buffer), so that a wrong or missing mapping shows
in the logits.
Needs the optional 'hf' extra (torch CPU, transformers); skipped without it.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the HF parity tests need the 'hf' extra: pip install -e .[hf]")
transformers = pytest.importorskip(
    "transformers", reason="the HF parity tests need the 'hf' extra: pip install -e .[hf]")

from tfx_jax import convert  # noqa: E402
from tfx_jax.run import hf_interop  # noqa: E402

from tfx_jax.model import decoding as search
from tfx_jax.core.errors import ConfigError  # noqa: E402
from tfx_jax.model.families import build_model  # noqa: E402

VOCAB, D, LAYERS, HEADS = 100, 32, 2, 4
# float32 throughout: every architecture agrees to this (measured maxima are in
# docs/huggingface.md).
TOL = 1e-4


def _hf_models():
  t = transformers
  common = dict(vocab_size=VOCAB)
  llama = dict(common, hidden_size=D, intermediate_size=48, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, num_key_value_heads=2, rms_norm_eps=1e-6,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
  neox = dict(common, hidden_size=D, intermediate_size=64, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, max_position_embeddings=64, bos_token_id=1,
              eos_token_id=2)
  seq2seq = dict(common, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS,
                 encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                 forced_eos_token_id=None)
  return {
      "llama": (t.LlamaForCausalLM, t.LlamaConfig(**llama, max_position_embeddings=64)),
      "gpt2": (t.GPT2LMHeadModel, t.GPT2Config(
          **common, n_positions=64, n_embd=D, n_layer=LAYERS, n_head=HEADS,
          bos_token_id=98, eos_token_id=98)),
      "bert": (t.BertForMaskedLM, t.BertConfig(
          **common, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
          intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)),
      "t5": (t.T5ForConditionalGeneration, t.T5Config(
          **common, d_model=D, d_kv=D // HEADS, d_ff=48, num_layers=LAYERS,
          num_decoder_layers=LAYERS, num_heads=HEADS, feed_forward_proj="gated-gelu",
          tie_word_embeddings=False, relative_attention_num_buckets=8,
          relative_attention_max_distance=20, decoder_start_token_id=0,
          pad_token_id=0, eos_token_id=1)),
      "bart": (t.BartForConditionalGeneration, t.BartConfig(
          **seq2seq, bos_token_id=0, pad_token_id=1, eos_token_id=2,
          decoder_start_token_id=2)),
      "marian": (t.MarianMTModel, t.MarianConfig(
          **seq2seq, scale_embedding=True, pad_token_id=VOCAB - 1, eos_token_id=0,
          decoder_start_token_id=VOCAB - 1, bos_token_id=None)),
      # T5 1.0 (t5-small's layout): plain ReLU FFN; the decoder output x
      # d_model^-0.5, then the tied projection.
      "t5_v1_0": (t.T5ForConditionalGeneration, t.T5Config(
          **common, d_model=D, d_kv=D // HEADS, d_ff=64, num_layers=LAYERS,
          num_decoder_layers=LAYERS, num_heads=HEADS, feed_forward_proj="relu",
          tie_word_embeddings=True, relative_attention_num_buckets=8,
          relative_attention_max_distance=20, decoder_start_token_id=0,
          pad_token_id=0, eos_token_id=1)),
      # LLaMA with scaled RoPE (last: the models above keep their random draws).
      # Inputs of 10 tokens, decoded to 22, run past the original context of 8
      # that YaRN extends 4 times.
      "llama_linear": (t.LlamaForCausalLM, t.LlamaConfig(
          **llama, max_position_embeddings=64,
          rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})),
      "llama_yarn": (t.LlamaForCausalLM, t.LlamaConfig(
          **llama, max_position_embeddings=32,
          rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                           "original_max_position_embeddings": 8})),
      # GPT-NeoX (Pythia's layout): parallel block, half of each head rotated.
      "gpt_neox": (t.GPTNeoXForCausalLM, t.GPTNeoXConfig(
          **neox, rotary_pct=0.5, use_parallel_residual=True, tie_word_embeddings=False)),
      # use_parallel_residual=False: the sequential block; HF's default rotary_pct
      # (a quarter of each head: one pair), tied.
      "gpt_neox_sequential": (t.GPTNeoXForCausalLM, t.GPTNeoXConfig(
          **neox, use_parallel_residual=False, tie_word_embeddings=True)),
      # Qwen3: heads of 16 (> 32 / 4, as Qwen3-0.6B's 128 > 1024 / 16), tied.
      "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config(
          **common, hidden_size=D, intermediate_size=48, num_hidden_layers=LAYERS,
          num_attention_heads=HEADS, num_key_value_heads=2, head_dim=16,
          rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=True,
          bos_token_id=1, eos_token_id=2)),
      # Gemma 2: heads of 6 (< 32 / 4, as Gemma 2 2B's 256 < 2304 / 8); 4 layers
      # alternating a window of 4 (shorter than the inputs) and full attention;
      # soft-caps small enough to bind.
      "gemma2": (t.Gemma2ForCausalLM, t.Gemma2Config(
          **common, hidden_size=D, intermediate_size=48, num_hidden_layers=4,
          num_attention_heads=HEADS, num_key_value_heads=2, head_dim=6,
          query_pre_attn_scalar=6, sliding_window=4, attn_logit_softcapping=5.0,
          final_logit_softcapping=3.0, max_position_embeddings=64)),
      # Mixtures of experts (last, as above): 4 experts of which 2 per token,
      # every parameter perturbed (the routers too), so that a token routed
      # differently, or a weight of a wrong expert, shows in the logits.
      # Mixtral: LLaMA's block, every layer MoE, the top 2 renormalised.
      "mixtral": (t.MixtralForCausalLM, t.MixtralConfig(
          **common, hidden_size=D, intermediate_size=24, num_hidden_layers=LAYERS,
          num_attention_heads=HEADS, num_key_value_heads=2, num_local_experts=4,
          num_experts_per_tok=2, rms_norm_eps=1e-6, max_position_embeddings=64,
          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
      # Qwen3-MoE: 3 layers, the first dense (mlp_only_layers, an FFN of its own
      # width), experts narrower than it, the top 2 renormalised, tied.
      "qwen3_moe": (t.Qwen3MoeForCausalLM, t.Qwen3MoeConfig(
          **common, hidden_size=D, intermediate_size=48, moe_intermediate_size=16,
          num_hidden_layers=3, num_attention_heads=HEADS, num_key_value_heads=2,
          head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
          mlp_only_layers=[0], rms_norm_eps=1e-6, max_position_embeddings=64,
          tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
      # OLMoE: query and key norms over all heads at once; the top 2 scores as
      # they are (norm_topk_prob False).
      "olmoe": (t.OlmoeForCausalLM, t.OlmoeConfig(
          **common, hidden_size=D, intermediate_size=16, num_hidden_layers=LAYERS,
          num_attention_heads=HEADS, num_key_value_heads=2, num_experts=4,
          num_experts_per_tok=2, max_position_embeddings=64, bos_token_id=1,
          eos_token_id=2, pad_token_id=0)),
  }


ARCHS = ("llama", "llama_linear", "llama_yarn", "gpt2", "bert", "t5", "t5_v1_0", "bart",
         "marian", "gpt_neox", "gpt_neox_sequential", "qwen3", "gemma2", "mixtral",
         "qwen3_moe", "olmoe")


def _perturb(model, seed):
  """Moves every trainable parameter (and the output-bias buffer) off its init."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      if p.requires_grad:
        p.add_(0.1 * torch.randn(p.shape, generator=g))
    for name, b in model.named_buffers():
      if name.endswith("final_logits_bias"):
        b.add_(0.5 * torch.randn(b.shape, generator=g))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
  """{arch: (hf model in eval mode, save_pretrained directory)}."""
  out = {}
  torch.manual_seed(0)
  for i, (name, (cls, config)) in enumerate(_hf_models().items()):
    model = cls(config).eval()
    _perturb(model, i)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = (model, path)
  return out


@pytest.fixture(scope="module")
def imported(hf_dirs):
  """{arch: hf_interop.from_hf of its directory}, converted once."""
  return {name: hf_interop.from_hf(path) for name, (_, path) in hf_dirs.items()}


def _inputs(arch, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, VOCAB - 2, size=(2, 10)).astype(np.int32)
  tgt = rng.integers(3, VOCAB - 2, size=(2, 7)).astype(np.int32)
  types = rng.integers(0, 2, size=(2, 10)).astype(np.int32)
  return ids, tgt, types


def _logits(arch, hf, cfg, params):
  ids, tgt, types = _inputs(arch)
  model = build_model(cfg)
  t = lambda a: torch.from_numpy(a.astype(np.int64))
  with torch.no_grad():
    if cfg.family == "encoder_decoder":
      want = hf(input_ids=t(ids), decoder_input_ids=t(tgt)).logits
      got = model.apply({"params": params}, ids, tgt,
                        inputs_segment_ids=jnp.ones_like(ids))["logits"]
    elif cfg.family == "encoder_only":
      want = hf(input_ids=t(ids), token_type_ids=t(types)).logits
      got = model.apply({"params": params}, ids, token_types=types)["logits"]
    else:
      want = hf(input_ids=t(ids)).logits
      got = model.apply({"params": params}, ids)["logits"]
  return np.asarray(got), want.numpy()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_logits_match_transformers(arch, hf_dirs, imported):
  hf = hf_dirs[arch][0]
  cfg, params = imported[arch]
  got, want = _logits(arch, hf, cfg, params)
  diff = float(np.abs(got - want).max())
  print(f"{arch}: max |logit diff| = {diff:.2e}")
  assert got.shape == want.shape
  assert diff <= TOL, f"{arch}: max |logit diff| {diff:.3g} > {TOL}"


def _until_eos(tokens, eos):
  tokens = list(tokens)
  return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "bert"])
@pytest.mark.slow
def test_cached_greedy_decoding_matches_generate(arch, hf_dirs, imported):
  hf = hf_dirs[arch][0]
  cfg, params = imported[arch]
  c = hf.config
  ids, _, _ = _inputs(arch, seed=1)
  n = 12
  t = torch.from_numpy(ids.astype(np.int64))
  with torch.no_grad():
    if cfg.family == "decoder_only":
      want = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                         do_sample=False, num_beams=1, eos_token_id=c.eos_token_id,
                         pad_token_id=c.eos_token_id)[:, ids.shape[1]:].numpy()
      got = np.asarray(search.generate(params, cfg, ids, n, greedy=True,
                                       eos_id=c.eos_token_id))
    else:
      want = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                         do_sample=False, num_beams=1, eos_token_id=c.eos_token_id,
                         decoder_start_token_id=c.decoder_start_token_id,
                         forced_bos_token_id=None, forced_eos_token_id=None)[:, 1:].numpy()
      got = np.asarray(search.translate_greedy(params, cfg, ids, max_len=n,
                                               eos_id=c.eos_token_id,
                                               bos_id=c.decoder_start_token_id))
  for g, w in zip(got, want):
    assert _until_eos(g, c.eos_token_id) == _until_eos(w, c.eos_token_id)


@pytest.mark.parametrize("arch", ARCHS)
def test_export_then_import_is_bit_identical(arch, hf_dirs, imported, tmp_path):
  hf = hf_dirs[arch][0]
  cfg, params = imported[arch]
  hf_interop.to_hf(cfg, params, tmp_path)
  cfg2, params2 = hf_interop.from_hf(tmp_path)
  assert cfg2 == cfg
  flat = jax.tree_util.tree_leaves_with_path(params)
  flat2 = dict(jax.tree_util.tree_leaves_with_path(params2))
  assert len(flat) == len(flat2)
  for key, value in flat:
    np.testing.assert_array_equal(flat2[key], value, err_msg=str(key))
  # ... and HF itself loads the export to the same model.
  cls = type(hf)
  reloaded = cls.from_pretrained(tmp_path).eval()
  got, want = _logits(arch, reloaded, cfg, params)
  assert float(np.abs(got - want).max()) <= TOL


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("scaled", [True, False])
def test_t5_exports_every_output_scaling_and_tying(tied, scaled, imported, tmp_path):
  """HF's T5 states the decoder-output scaling (scale_decoder_outputs) apart from
  the tying (an lm_head.weight of its own): each combination, on a ReLU T5,
  loads into HF as the same model and imports back unchanged."""
  cfg, params = imported["t5_v1_0"]
  cfg = dataclasses.replace(cfg, tie_embeddings=tied, scale_output=scaled)
  if not tied:
    kernel = np.random.default_rng(0).normal(size=(D, VOCAB)).astype(np.float32)
    params = {**params, "output": {"kernel": kernel}}
  hf_interop.to_hf(cfg, params, tmp_path)
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  assert reloaded.config.scale_decoder_outputs == scaled
  got, want = _logits("t5_v1_0", reloaded, cfg, params)
  assert float(np.abs(got - want).max()) <= TOL
  cfg2, params2 = hf_interop.from_hf(tmp_path)
  assert cfg2 == cfg
  flat2 = dict(jax.tree_util.tree_leaves_with_path(params2))
  for key, value in jax.tree_util.tree_leaves_with_path(params):
    np.testing.assert_array_equal(flat2[key], value, err_msg=str(key))


def test_t5_feed_forward_without_a_model_activation_is_refused(hf_dirs, tmp_path):
  src = hf_dirs["t5_v1_0"][1]
  config = json.loads((src / "config.json").read_text())
  config["feed_forward_proj"] = "gated-relu"
  (tmp_path / "config.json").write_text(json.dumps(config))
  (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
  with pytest.raises(ConfigError, match="feed_forward_proj='gated-relu'"):
    hf_interop.from_hf(tmp_path)


@pytest.mark.parametrize("arch,change,named", [
    ("gpt2", dict(position="alibi"), "model.position='alibi'"),
    ("gpt2", dict(norm_position="sandwich"), "model.norm_position='sandwich'"),
    ("gpt2", dict(scale_output=True), "model.scale_output=True"),
    ("llama", dict(norm_type="layernorm"), "model.norm_type='layernorm'"),
    ("llama", dict(rope_scaling="ntk", rope_scaling_factor=2.0), "model.rope_scaling='ntk'"),
    ("llama_yarn", dict(rope_fraction=0.5), "model.rope_fraction=0.5"),
    ("bart", dict(activation="swiglu"), "model.activation='swiglu'"),
    ("bart", dict(scale_output=True), "model.scale_output=True"),
    ("t5_v1_0", dict(activation="gelu"), "model.activation='gelu'"),
    ("llama", dict(attention_logit_softcap=5.0), "model.attention_logit_softcap=5.0"),
    ("gpt2", dict(head_dim=16), "model.head_dim=16"),
    ("gpt_neox", dict(use_bias=False), "model.use_bias=False"),
    ("gpt_neox", dict(norm_position="sandwich"), "model.norm_position='sandwich'"),
    ("gpt_neox", dict(attention_window=4), "model.attention_window=4"),
    ("qwen3", dict(qk_norm="layernorm"), "model.qk_norm='layernorm'"),
    ("qwen3", dict(attention_gate="headwise"), "model.attention_gate='headwise'"),
    ("gemma2", dict(norm_position="pre"), "model.norm_position='pre'"),
    ("gemma2", dict(block="parallel"), "model.block='parallel'"),
    ("gemma2", dict(scale_embeddings=False), "model.scale_embeddings=False"),
    ("gemma2", dict(qk_norm="rmsnorm"), "model.qk_norm='rmsnorm'"),
    ("mixtral", dict(router="sigmoid"), "model.router='sigmoid'"),
    ("mixtral", dict(router_norm_topk=False), "model.router_norm_topk=False"),
    ("mixtral", dict(shared_experts=1), "model.shared_experts=1"),
    ("mixtral", dict(moe_balance="bias"), "model.moe_balance=True"),
    ("qwen3_moe", dict(capacity_factor=1.25), "model.capacity_factor=1.25"),
    ("olmoe", dict(router="sigmoid"), "model.router='sigmoid'"),
])
def test_unrepresentable_export_names_the_setting(arch, change, named, imported, tmp_path):
  cfg, params = imported[arch]
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.to_hf(dataclasses.replace(cfg, **change), params, tmp_path)
  assert not (tmp_path / "config.json").exists()


def test_new_architectures_are_imported_as_their_fields(imported):
  neox, sequential = imported["gpt_neox"][0], imported["gpt_neox_sequential"][0]
  assert (neox.block, neox.rope_fraction, neox.rope_dims, neox.tie_embeddings) == (
      "parallel", 0.5, 4, False)
  assert (sequential.block, sequential.rope_fraction, sequential.rope_dims,
          sequential.tie_embeddings) == ("sequential", 0.25, 2, True)
  qwen3 = imported["qwen3"][0]
  assert (qwen3.qk_norm, qwen3.head_dim, qwen3.kv_heads, qwen3.tie_embeddings) == (
      "rmsnorm", 16, 2, True)
  gemma2 = imported["gemma2"][0]
  assert (gemma2.norm_position, gemma2.activation, gemma2.head_dim,
          gemma2.scale_embeddings) == ("sandwich", "geglu_tanh", 6, True)
  assert (gemma2.attention_window, gemma2.global_every, gemma2.attention_logit_softcap,
          gemma2.final_logit_softcap) == (4, 2, 5.0, 3.0)
  mixtral, qwen3_moe, olmoe = (imported[a][0] for a in ("mixtral", "qwen3_moe", "olmoe"))
  assert (mixtral.ffn_type, mixtral.num_experts, mixtral.experts_per_token,
          mixtral.expert_dim, mixtral.router, mixtral.router_norm_topk) == (
              "moe", 4, 2, 24, "softmax", True)
  assert (qwen3_moe.first_dense_layers, qwen3_moe.moe_every, qwen3_moe.ffn_dim,
          qwen3_moe.expert_dim, qwen3_moe.router_norm_topk) == (1, 1, 48, 16, True)
  assert (olmoe.qk_norm, olmoe.qk_norm_heads, olmoe.router_norm_topk) == (
      "rmsnorm", "joint", False)


@pytest.mark.parametrize("change", [
    dict(attention_window=0, global_every=0),  # every layer attends fully
    dict(global_every=0),  # every layer windowed
    dict(attention_logit_softcap=0.0),
    dict(final_logit_softcap=0.0),
], ids=lambda change: ",".join(change))
def test_gemma2_windows_and_soft_caps_matter(change, hf_dirs, imported):
  """On these inputs (10 tokens, a window of 4) each of Gemma 2's windows and
  soft-caps changes the logits far beyond the tolerance: the parity above
  checks them. HF computes soft-capped attention with the eager implementation
  only (sdpa has no soft-cap)."""
  hf = hf_dirs["gemma2"][0]
  assert hf.config._attn_implementation == "eager"
  cfg, params = imported["gemma2"]
  got, want = _logits("gemma2", hf, dataclasses.replace(cfg, **change), params)
  assert float(np.abs(got - want).max()) > 100 * TOL


def _copy_with_config(src, dst, **changes):
  config = json.loads((src / "config.json").read_text())
  config.update(changes)
  (dst / "config.json").write_text(json.dumps(config))
  (dst / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())


@pytest.mark.parametrize("window,fields", [
    # use_sliding_window with max_window_layers=0: every layer windowed.
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=0,
          layer_types=None), (4, 0)),
    # layer_types naming the layers: layer 0 windowed, layer 1 full.
    (dict(use_sliding_window=True, sliding_window=3,
          layer_types=["sliding_attention", "full_attention"]), (3, 2)),
], ids=["all", "alternating"])
def test_qwen3_sliding_windows_match_transformers(window, fields, hf_dirs, imported,
                                                  tmp_path):
  """Qwen3's sliding windows (a Qwen3 with the qwen3 model's weights), where
  layer_types fit attention_window and global_every, convert both ways."""
  _copy_with_config(hf_dirs["qwen3"][1], tmp_path, **window)
  hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path).eval()
  cfg, params = hf_interop.from_hf(tmp_path)
  assert (cfg.attention_window, cfg.global_every) == fields
  got, want = _logits("qwen3", hf, cfg, params)
  assert float(np.abs(got - want).max()) <= TOL
  unwindowed, _ = _logits("qwen3", hf, imported["qwen3"][0], params)
  assert float(np.abs(unwindowed - want).max()) > 100 * TOL
  hf_interop.to_hf(cfg, params, tmp_path / "export")
  assert hf_interop.from_hf(tmp_path / "export")[0] == cfg
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "export").eval()
  got, want = _logits("qwen3", reloaded, cfg, params)
  assert float(np.abs(got - want).max()) <= TOL


@pytest.mark.parametrize("arch,changes,named", [
    ("gpt_neox", dict(attention_bias=False), "attention_bias=False"),
    ("gpt_neox", dict(hidden_act="gelu_fast"), "activation 'gelu_fast'"),
    ("qwen3", dict(attention_bias=True), "attention_bias=True"),
    # max_window_layers=1 of 2: layer 0 full, layer 1 windowed.
    ("qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1,
                   layer_types=None), "layer_types FS"),
    ("qwen3", dict(use_sliding_window=False, sliding_window=None,
                   layer_types=["sliding_attention", "full_attention"]),
     "sliding_window is None"),
    ("qwen3", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                    "partial_rotary_factor": 0.5}),
     "partial_rotary_factor=0.5"),
    ("gemma2", dict(query_pre_attn_scalar=16), "query_pre_attn_scalar=16"),
    ("gemma2", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    # Full layers 2 and 3 (1-based): not every k-th.
    ("gemma2", dict(layer_types=["sliding_attention", "full_attention",
                                 "full_attention", "sliding_attention"]),
     "layer_types SFFS"),
    ("gemma2", dict(layer_types=["full_attention", "chunked_attention"] * 2),
     "chunked_attention"),
    ("gemma2", dict(hidden_activation="quick_gelu"), "activation 'quick_gelu'"),
    ("qwen3_moe", dict(mlp_only_layers=[1]), "mlp_only_layers=\\[1\\] is not a prefix"),
    ("olmoe", dict(clip_qkv=8.0), "clip_qkv=8.0"),
])
def test_unrepresented_hf_settings_are_refused(arch, changes, named, hf_dirs, tmp_path):
  _copy_with_config(hf_dirs[arch][1], tmp_path, **changes)
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.from_hf(tmp_path)


def test_gemma_norm_gain_is_one_plus_the_stored_weight():
  """Gemma's RMSNorm multiplies by (1 + w): imported as s = 1 + w, the float32 sum
  HF computes; exported as w = s - 1, which gives every gain s >= 0.5 back."""
  from tfx_jax.hf.llama import gemma_norm
  rule = gemma_norm("w", "s")
  rng = np.random.default_rng(0)
  w = np.concatenate([rng.normal(0, 0.5, 1000), rng.normal(0, 1e-8, 100),
                      [0.0, -0.5, 1e-30]]).astype(np.float32)
  (s,) = rule.to_tfx(w)
  np.testing.assert_array_equal(s, (1.0 + torch.from_numpy(w)).numpy())
  gains = np.concatenate([rng.uniform(0.5, 4.0, 1000), [0.5, 1.0, 2.0, 1 + 2**-23]])
  gains = gains.astype(np.float32)
  np.testing.assert_array_equal(rule.to_tfx(rule.to_hf(gains))[0], gains)


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_heads_of_their_own_width(arch, tmp_path):
  """LLaMA's head_dim and T5's d_kv other than d_model / num_heads (Mistral
  NeMo's heads, T5 3B's and 11B's) import as model.head_dim and convert back."""
  t = transformers
  if arch == "llama":
    hf = t.LlamaForCausalLM(t.LlamaConfig(
        vocab_size=VOCAB, hidden_size=D, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=2, head_dim=12,
        max_position_embeddings=64))
  else:
    hf = t.T5ForConditionalGeneration(t.T5Config(
        vocab_size=VOCAB, d_model=D, d_kv=12, d_ff=48, num_layers=1, num_heads=HEADS,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
        eos_token_id=1))
  hf = hf.eval()
  _perturb(hf, 0)
  hf.save_pretrained(tmp_path / "hf")
  cfg, params = hf_interop.from_hf(tmp_path / "hf")
  assert (cfg.head_dim, cfg.attention_head_dim) == (12, 12)
  got, want = _logits(arch, hf, cfg, params)
  assert float(np.abs(got - want).max()) <= TOL
  hf_interop.to_hf(cfg, params, tmp_path / "export")
  cfg2, params2 = hf_interop.from_hf(tmp_path / "export")
  assert cfg2 == cfg
  flat2 = dict(jax.tree_util.tree_leaves_with_path(params2))
  for key, value in jax.tree_util.tree_leaves_with_path(params):
    np.testing.assert_array_equal(flat2[key], value, err_msg=str(key))


@pytest.mark.parametrize("arch,fields", [
    ("llama_linear", ("linear", 2.0, 0)), ("llama_yarn", ("yarn", 4.0, 8))])
def test_scaled_rope_is_imported_as_its_fields(arch, fields, hf_dirs, imported):
  cfg, params = imported[arch]
  assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_original_max_len) == fields
  # The scaling matters on these inputs: without it the logits are far apart.
  unscaled = dataclasses.replace(cfg, rope_scaling="none", rope_scaling_factor=1.0,
                                 rope_original_max_len=0)
  got, want = _logits(arch, hf_dirs[arch][0], unscaled, params)
  assert float(np.abs(got - want).max()) > 100 * TOL


_LLAMA_CONFIG = dict(model_type="llama", num_attention_heads=4, hidden_size=32,
                     num_hidden_layers=1, intermediate_size=48, vocab_size=VOCAB,
                     rms_norm_eps=1e-6, max_position_embeddings=64, attention_bias=False)


@pytest.mark.parametrize("rope,want", [
    # transformers < 5: rope_theta at the top, the scaling in rope_scaling.
    (dict(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0}),
     dict(rope_base=500000.0, rope_scaling="linear", rope_scaling_factor=4.0)),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 8.0,
                        "original_max_position_embeddings": 16}),
     dict(rope_base=10000.0, rope_scaling="yarn", rope_scaling_factor=8.0,
          rope_original_max_len=16)),
    # transformers' defaults written out are the same model.
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                           "original_max_position_embeddings": 16, "beta_fast": 32,
                           "beta_slow": 1, "truncate": True}),
     dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=16)),
    # truncate=False (gpt-oss's): the ramp's ends unrounded.
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "truncate": False,
                           "original_max_position_embeddings": 16}),
     dict(rope_scaling="yarn", rope_yarn_truncate=False)),
    # yarn without a factor: the ratio of the lengths, as transformers does.
    (dict(rope_parameters={"rope_type": "yarn", "original_max_position_embeddings": 16}),
     dict(rope_scaling="yarn", rope_scaling_factor=4.0, rope_original_max_len=16)),
    (dict(rope_scaling=None, rope_theta=10000.0), dict(rope_scaling="none")),
])
def test_llama_rope_configs_are_read(rope, want):
  c = dict(_LLAMA_CONFIG, **rope)
  fields = hf_interop.architecture_for(c).model_fields(c)
  assert {k: fields[k] for k in want} == want


@pytest.mark.parametrize("rope,named", [
    (dict(rope_type="dynamic", factor=2.0), "rope_type='dynamic'"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
          original_max_position_embeddings=16), "rope_type='llama3'"),
    (dict(rope_type="longrope", short_factor=[1.0], long_factor=[2.0]),
     "rope_type='longrope'"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
          beta_fast=16), "beta_fast=16"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
          beta_slow=2), "beta_slow=2"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
          attention_factor=1.0), "attention_factor=1.0"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
          mscale=1.0, mscale_all_dim=0.5), "mscale=1.0 with mscale_all_dim=0.5"),
    (dict(rope_type="default", partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (dict(rope_type="linear"), "without a factor"),
])
def test_unrepresented_llama_rope_is_refused(rope, named):
  c = dict(_LLAMA_CONFIG, rope_parameters=dict(rope, rope_theta=10000.0))
  with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
    hf_interop.architecture_for(c).model_fields(c)


def _word_tokenizer(path):
  """A tokenizer.json whose words are w0 .. w99 (ids 0 .. 99)."""
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
      {f"w{i}": i for i in range(VOCAB)}, unk_token="w1"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def gpt2_run(hf_dirs, tmp_path_factory):
  hf_dir = tmp_path_factory.mktemp("gpt2_with_tokenizer")
  hf_dirs["gpt2"][0].save_pretrained(hf_dir)
  _word_tokenizer(hf_dir)
  workdir = tmp_path_factory.mktemp("gpt2_run")
  assert convert.main(["from-hf", "--hf-dir", str(hf_dir), "--workdir", str(workdir)]) == 0
  return workdir


@pytest.mark.slow
def test_imported_workdir_is_an_ordinary_run(gpt2_run, hf_dirs, tmp_path):
  from tfx_jax.run import pretrained
  from tfx_jax.run import config as run_config
  from tfx_jax.run import setup as run_setup
  from tfx_jax.run import trained_run
  from tfx_jax.tasks import text_io as texts
  from tfx_jax.data.tokenizer import HFTokenizer
  hf = hf_dirs["gpt2"][0]
  run = trained_run.load_run(gpt2_run)
  assert run.step == 0
  got, want = _logits("gpt2", hf, run.model_cfg, run.params)
  assert float(np.abs(got - want).max()) <= TOL
  # generate --prompt: the HF tokenizer file with the model's own eos / bos.
  assert isinstance(run.tokenizer, HFTokenizer)
  assert (run.tokenizer.bos_id, run.tokenizer.eos_id) == (98, 98)
  prompt = "w10 w11 w12"
  [text] = texts.generate_texts(run, [prompt], max_new_tokens=6, greedy=True,
                                include_prompt=True)
  ids = torch.tensor([[98, 10, 11, 12]])
  with torch.no_grad():
    new = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6,
                      do_sample=False, eos_token_id=98, pad_token_id=98)[0, 4:].tolist()
  new = _until_eos(new, 98)
  assert text == " ".join([prompt] + [f"w{i}" for i in new if i != 98])
  # Fine-tuning (finetune.init_checkpoint=W) starts from these parameters.
  sharded = run_setup.ShardedRun(run.config, run.model_cfg)
  state = pretrained.load_pretrained(
      sharded.init_state(), str(gpt2_run), run_config.flatten_config(run.config),
      sharded.state_shardings.params, log=lambda *_: None)
  for (k, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(state.params),
                            jax.tree_util.tree_leaves_with_path(run.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(k))
  # to-hf on the run, then from-hf of that: the same parameters.
  assert convert.main(["to-hf", "--workdir", str(gpt2_run), "--out",
                       str(tmp_path / "hf")]) == 0
  _, params = hf_interop.from_hf(tmp_path / "hf")
  for (k, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(params),
                            jax.tree_util.tree_leaves_with_path(run.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(k))


def test_unrepresentable_run_exits_2(gpt2_run, tmp_path, capsys):
  config = json.loads((gpt2_run / "config.json").read_text())
  config["model"]["norm_position"] = "sandwich"
  bad = tmp_path / "run"
  bad.mkdir()
  (bad / "config.json").write_text(json.dumps(config))
  assert convert.main(["to-hf", "--workdir", str(bad), "--out",
                       str(tmp_path / "out")]) == 2
  assert "model.norm_position='sandwich'" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()
