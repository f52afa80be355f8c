"""What the Hugging Face parity tests of one architecture share: its tiny
random HF models, one per variant, moved off their initialisation and saved
with ``save_pretrained``; their import; the token ids every check reads.

Needs torch and transformers (the 'hf' extra): the test modules import them
with ``pytest.importorskip`` before they call these."""

from __future__ import annotations

import numpy as np


def perturb(model, seed: int):
  """Moves every parameter off its initialisation (N(0, 0.1^2) added), so that
  a weight mapped to the wrong place shows, biases, sinks and routers too;
  returns the generator, for a caller that moves buffers as well."""
  import torch  # pylint: disable=import-outside-toplevel
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.1 * torch.randn(p.shape, generator=g))
  return g


def saved_variants(tmp_path_factory, config_class, model_class, base: dict,
                   variants: dict, move=perturb) -> dict:
  """{variant: (HF model in eval mode, its save_pretrained directory)}, each
  variant's config ``base`` with its changes, moved by ``move(model, i)``."""
  import torch  # pylint: disable=import-outside-toplevel
  out = {}
  torch.manual_seed(0)
  for i, (name, changes) in enumerate(variants.items()):
    model = model_class(config_class(**dict(base, **changes))).eval()
    move(model, i)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = (model, path)
  return out


def imported(hf_dirs: dict) -> dict:
  """{variant: (ModelConfig, params)} of each saved variant, as
  ``python -m tfx_jax.convert`` reads it."""
  from tfx_jax.run import hf_interop  # pylint: disable=import-outside-toplevel
  return {name: hf_interop.from_hf(path) for name, (_, path) in hf_dirs.items()}


def token_ids(vocab: int, seed: int = 0) -> np.ndarray:
  """[2, 10] token ids clear of the special ids at both ends of the vocabulary."""
  return np.random.default_rng(seed).integers(3, vocab - 2, size=(2, 10)).astype(np.int32)


def until_eos(tokens, eos) -> list:
  """The tokens up to and including the first ``eos`` (all of them without one)."""
  tokens = list(tokens)
  return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def assert_greedy_matches_generate(hf, cfg, params, ids: np.ndarray, n: int) -> None:
  """Cached greedy decoding (``tfx_jax.model.decoding``) of ``n`` tokens after
  ``ids`` equals HF ``generate``'s, each row up to its end of sequence."""
  import torch  # pylint: disable=import-outside-toplevel
  from tfx_jax.model import decoding  # pylint: disable=import-outside-toplevel
  eos = hf.config.eos_token_id
  t = torch.from_numpy(ids.astype(np.int64))
  with torch.no_grad():
    want = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                       do_sample=False, num_beams=1, eos_token_id=eos,
                       pad_token_id=eos)[:, ids.shape[1]:].numpy()
  got = np.asarray(decoding.generate(params, cfg, ids, n, greedy=True, eos_id=eos))
  for g, w in zip(got, want):
    assert until_eos(g, eos) == until_eos(w, eos)


def assert_round_trip(cfg, params, directory, architecture: str) -> None:
  """Export to ``directory`` (as ``architecture``) then import: the same
  ModelConfig and every parameter bit-identical."""
  import jax  # pylint: disable=import-outside-toplevel
  from tfx_jax.run import hf_interop  # pylint: disable=import-outside-toplevel
  assert hf_interop.to_hf(cfg, params, directory).name == architecture
  cfg2, params2 = hf_interop.from_hf(directory)
  assert cfg2 == cfg
  flat = jax.tree_util.tree_leaves_with_path(params)
  flat2 = dict(jax.tree_util.tree_leaves_with_path(params2))
  assert len(flat) == len(flat2)
  for key, value in flat:
    np.testing.assert_array_equal(flat2[key], value, err_msg=str(key))
