"""Hugging Face checkpoints in and out of tfx_jax runs (the library behind
``python -m tfx_jax.convert``): ``from_hf`` / ``to_hf`` between a local
``save_pretrained`` directory and a model config with its parameters,
``import_run`` / ``export_run`` between such a directory and a run's workdir.

Importing needs only ``safetensors`` (numpy); torch is not used. The weight and
config maps are declared in :mod:`tfx_jax.hf`.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import flax
import jax
import numpy as np

from tfx_jax.run import checkpoint as ckpt_lib
from tfx_jax.run import config as run_config
from tfx_jax.run import setup as run_setup
from tfx_jax.run.config_base import base_config
from tfx_jax.core.errors import ConfigError
from tfx_jax.hf import ARCHITECTURES, Architecture, architecture_for
from tfx_jax.model.config import ModelConfig, is_windowed, model_config_from_dict, moe_layers
from tfx_jax.model import mixers
from tfx_jax.model.config_attention import mla_dims
from tfx_jax.model.config_moe import grouped_routing, shared_dim

# HF tokenizer files, in order of preference: SentencePiece models, then tokenizer.json.
_TOKENIZER_FILES = ("tokenizer.model", "spiece.model", "source.spm",
                    "sentencepiece.bpe.model", "tokenizer.json")
# Special-token ids an HF config may carry; stored next to the copied tokenizer.
_SPECIAL_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id",
                 "decoder_start_token_id")


def _safetensors():
  try:
    from safetensors import numpy as st
  except ImportError as e:  # the optional extra
    raise ConfigError("converting Hugging Face checkpoints needs the 'hf' extra: "
                      "pip install -e .[hf] (or: pip install safetensors)") from e
  return st


def _read_weights(hf_dir: pathlib.Path) -> dict[str, np.ndarray]:
  st = _safetensors()
  files = sorted(hf_dir.glob("*.safetensors"))
  if not files:
    raise ConfigError(f"--hf-dir={hf_dir}: no *.safetensors weights (save with "
                      "save_pretrained(..., safe_serialization=True)).")
  weights = {}
  for f in files:
    weights.update(st.load_file(str(f)))
  return weights


def _read_hf_config(hf_dir) -> dict:
  path = pathlib.Path(hf_dir) / "config.json"
  if not path.exists():
    raise ConfigError(f"--hf-dir={hf_dir}: no config.json; is it a save_pretrained "
                      "directory?")
  return json.loads(path.read_text())


def _model_config(arch: Architecture, hf_cfg: dict, names=None) -> ModelConfig:
  fields = arch.model_fields(hf_cfg, names)
  if fields["family"] == "encoder_decoder":
    fields["num_layers"] = fields["num_encoder_layers"]
  return model_config_from_dict(fields)


def from_hf(hf_dir) -> tuple[ModelConfig, dict]:
  """A ``save_pretrained`` directory -> (validated ModelConfig, parameter tree).

  ``build_model(model_config).apply({"params": params}, ...)["logits"]`` gives
  the HF model's logits (float32). Raises ConfigError naming what does not map
  (an unsupported architecture or setting, a missing or misshapen weight).
  """
  hf_dir = pathlib.Path(hf_dir)
  hf_cfg = _read_hf_config(hf_dir)
  arch = architecture_for(hf_cfg)
  weights = _read_weights(hf_dir)
  cfg = _model_config(arch, hf_cfg, set(weights))
  flat = {}
  for rule in arch.import_rules(cfg, hf_cfg):
    missing = [name for name in rule.hf_names if name not in weights]
    if missing:
      raise ConfigError(f"{hf_dir}: weight {missing[0]!r} of {arch.name} is missing.")
    arrays = [np.asarray(weights[name], np.float32) for name in rule.hf_names]
    for path, value in zip(rule.tfx, rule.to_tfx(*arrays)):
      flat[path] = np.ascontiguousarray(value)
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  _check_tree(cfg, params)
  return cfg, params


def _abstract_params(cfg: ModelConfig):
  from tfx_jax.model.families import build_model, dummy_inputs
  model = build_model(cfg)
  shapes = jax.eval_shape(lambda r: model.init({"params": r}, **dummy_inputs(cfg))["params"],
                          jax.random.PRNGKey(0))
  return flax.traverse_util.flatten_dict(flax.linen.unbox(shapes), sep="/")


def _check_tree(cfg: ModelConfig, params) -> None:
  want = {k: tuple(v.shape) for k, v in _abstract_params(cfg).items()}
  got = {k: tuple(v.shape)
         for k, v in flax.traverse_util.flatten_dict(params, sep="/").items()}
  bad = [f"{k}: expected {want.get(k)}, got {got.get(k)}"
         for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]
  if bad:
    raise ConfigError("converted parameters do not fit the model: " + "; ".join(bad))


# ------------------------------------------------------------------ export
def _effective(cfg: ModelConfig) -> dict:
  """What a config computes (fields that only name the same model merged)."""
  d = dataclasses.asdict(cfg)
  for k in ("dropout", "attention_dropout", "scan_layers", "remat", "dtype",
            "num_classes", "ff_multiple_of", "d_ff", "gated_d_ff", "num_kv_heads",
            "num_layers", "num_encoder_layers", "num_decoder_layers", "embedding_norm",
            "deltanet_chunk"):
    d.pop(k)
  # A mixture of experts: the width its experts have; the dense width only
  # where a layer is dense; the balancing only as far as the forward reads it
  # (the expert bias chooses experts; the auxiliary loss and its rate train).
  for k in ("expert_d_ff", "router_bias_rate"):
    d.pop(k)
  d.update(shared_expert_d_ff=shared_dim(cfg))  # the width the shared experts have
  if cfg.ffn_type == "moe":
    d.update(expert_dim=cfg.expert_dim, moe_balance=cfg.moe_balance == "bias")
    if not grouped_routing(cfg):  # every group kept: plain top-k
      d.update(router_groups=1, router_topk_groups=1)
  n_layers = max(cfg.encoder_layers, cfg.decoder_layers)
  dense = cfg.ffn_type == "dense" or len(moe_layers(cfg, n_layers)) < n_layers
  d.update(ffn_dim=cfg.ffn_dim if dense else 0, kv_heads=cfg.kv_heads,
           embedding_norm=cfg.has_embedding_norm,
           encoder_layers=cfg.encoder_layers if cfg.family != "decoder_only" else 0,
           decoder_layers=cfg.decoder_layers if cfg.family != "encoder_only" else 0,
           head_dim=cfg.attention_head_dim)
  # Windows by the layers they restrict: a window no layer uses is none, and a
  # global_every that makes every layer (1) or none (> the layers) global is 0.
  n = max(cfg.encoder_layers, cfg.decoder_layers)
  windowed = [is_windowed(i, cfg.attention_window, cfg.global_every) for i in range(n)]
  d.update(attention_window=cfg.attention_window if any(windowed) else 0,
           global_every=cfg.global_every if any(windowed) and not all(windowed) else 0)
  # Multi-head latent attention: its widths as resolved (0 derives them). The
  # head width then derives mla_nope_dim only, unless cross-attention or
  # DeltaNet heads read it too.
  if cfg.attention_type == "mla":
    d.update({f"mla_{k}": v for k, v in dataclasses.asdict(mla_dims(cfg)).items()})
    if cfg.family == "decoder_only" and "D" not in cfg.mixer_pattern:
      d.pop("head_dim")
  # Each layer's mixer; Gated DeltaNet layers' widths as resolved (0 derives them).
  d.update(mixer_pattern=mixers.layer_mixers(cfg.mixer_pattern, cfg.decoder_layers))
  if mixers.has_deltanet(cfg):
    d.update(deltanet_heads=mixers.deltanet_heads(cfg),
             deltanet_head_dim=mixers.deltanet_head_dim(cfg),
             deltanet_v_heads=mixers.deltanet_v_heads(cfg),
             deltanet_v_head_dim=mixers.deltanet_v_head_dim(cfg))
  # Settings that a scheme does not read.
  if cfg.position != "rope":
    d.pop("rope_base")
  if cfg.position != "t5_bias":
    d.pop("t5_num_buckets"), d.pop("t5_max_distance")
  if cfg.position != "sinusoidal":
    d.pop("sinusoidal_layout")
  if cfg.position not in ("learned", "sinusoidal"):
    d.pop("max_len")
  return d


def _mismatch(arch: Architecture, cfg: ModelConfig) -> tuple[bool, list[str]]:
  """(whether ``arch``'s HF config of ``cfg`` imports, the ``model.*`` settings
  of ``cfg`` that ``arch`` cannot represent; where it does not import, its error)."""
  try:
    back = _model_config(arch, arch.hf_config(cfg))
  except ConfigError as e:
    return False, [str(e)]
  ours, theirs = _effective(cfg), _effective(back)
  return True, [f"model.{k}={ours.get(k)!r} ({arch.name} has {theirs.get(k)!r})"
                for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)]


def export_architecture(cfg: ModelConfig) -> Architecture:
  """The HF architecture that represents ``cfg`` exactly, or ConfigError naming
  the settings that have no HF equivalent (for the closest architecture: the
  fewest differences, before any whose own config of ``cfg`` does not import)."""
  checked = {a.name: _mismatch(a, cfg) for a in ARCHITECTURES.values()
             if a.family == cfg.family}
  found = {name: differences for name, (_, differences) in checked.items()}
  best = min(found, key=lambda n: (not checked[n][0], len(found[n])))
  if found[best]:
    raise ConfigError(
        f"this {cfg.family} model has no Hugging Face equivalent; closest is {best}, "
        f"which cannot represent: {'; '.join(found[best])}.")
  return ARCHITECTURES[best]


def to_hf(cfg: ModelConfig, params, out_dir, special_ids: dict | None = None) -> Architecture:
  """Writes ``params`` as an HF ``save_pretrained`` directory (config.json +
  model.safetensors) that ``AutoModel*.from_pretrained`` loads."""
  st = _safetensors()
  arch = export_architecture(cfg)
  cfg_out = dict(arch.hf_config(cfg), torch_dtype="float32", dtype="float32")
  cfg_out.update({k: v for k, v in (special_ids or {}).items() if v is not None})
  flat = {k: np.asarray(v, np.float32) for k, v in
          flax.traverse_util.flatten_dict(jax.device_get(flax.linen.unbox(params)),
                                          sep="/").items()}
  tensors = {}
  for rule in arch.rules(cfg):
    for name, value in rule.hf_tensors(*(flat[p] for p in rule.tfx)).items():
      tensors[name] = np.ascontiguousarray(value)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(cfg_out, indent=2))
  st.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  return arch


# ----------------------------------------------------------- run workdir
def _copy_tokenizer(hf_dir: pathlib.Path, workdir: pathlib.Path, hf_cfg: dict):
  """Copies the HF tokenizer file (if any) into ``workdir/tokenizer``."""
  for name in _TOKENIZER_FILES:
    src = hf_dir / name
    if src.exists():
      dst_dir = workdir / "tokenizer"
      dst_dir.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(src, dst_dir / name)
      ids = {k: hf_cfg.get(k) for k in _SPECIAL_KEYS}
      (dst_dir / "special_ids.json").write_text(json.dumps(ids, indent=2))
      return dst_dir / name
  return None


def imported_run_config(arch: Architecture, cfg: ModelConfig, tokenizer_file=None):
  """A full run config for an imported model (task from the family)."""
  config = base_config()
  for k, v in dataclasses.asdict(cfg).items():
    config.model[k] = v
  config.task = arch.task
  # A converted run is a finished step-0 run; fine-tuning brings its own config.
  config.train.num_steps = 1
  config.optim.schedule = "constant"
  config.optim.warmup_steps = 0
  config.train.seq_len = min(config.train.seq_len, cfg.max_len)
  if arch.task == "translate":
    config.data.name = "tfx_gcc_translate/de"
  config.data.vocab_size = cfg.vocab_size
  if tokenizer_file is not None:
    config.data.tokenizer = "hf"
    config.data.tokenizer_file = str(pathlib.Path(tokenizer_file).absolute())
  return config


def import_run(hf_dir, workdir) -> pathlib.Path:
  """``from-hf``: writes an ordinary run (config.json + step-0 checkpoint)."""
  hf_dir, workdir = pathlib.Path(hf_dir), ckpt_lib.ensure_writable(workdir)
  hf_cfg = _read_hf_config(hf_dir)
  arch = architecture_for(hf_cfg)
  cfg, params = from_hf(hf_dir)
  config = imported_run_config(arch, cfg, _copy_tokenizer(hf_dir, workdir, hf_cfg))
  (workdir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
  run = run_config.resolve(config)
  sharded = run_setup.ShardedRun(run, run.model)
  state = sharded.init_state()
  state = state.replace(params=jax.device_put(params, sharded.state_shardings.params))
  with ckpt_lib.Checkpointer(workdir / "checkpoints") as ckpt:
    ckpt.save(0, state, None, run_config.flatten_config(config), force=True)
    ckpt.wait()
  return workdir


def export_run(workdir, out_dir, step: int | None = None) -> Architecture:
  """``to-hf``: a run's parameters as an HF directory (tokenizer copied too)."""
  from tfx_jax.run import trained_run
  # Checked on the config first: nothing is restored or written for a variant
  # HF cannot represent.
  export_architecture(run_config.resolve(trained_run.load_config(workdir)).model)
  run = trained_run.load_run(workdir, step)
  special = None
  tok_dir = pathlib.Path(workdir) / "tokenizer"
  if (tok_dir / "special_ids.json").exists():
    special = json.loads((tok_dir / "special_ids.json").read_text())
  arch = to_hf(run.model_cfg, run.params, out_dir, special)
  if tok_dir.is_dir():
    for f in tok_dir.iterdir():
      if f.name in _TOKENIZER_FILES:
        shutil.copyfile(f, pathlib.Path(out_dir) / f.name)
  return arch
