"""Autoregressive decoding with the model's KV cache: sampling, greedy and beam search.

Every decoder runs as ONE jitted ``lax.while_loop`` that feeds one token per
step through the cached model (``build_model(cfg, use_cache=True)``; keys and
values live in the ``cache`` collection and ``CacheIndex`` holds the write
position), so a new token costs one single-token forward pass, not a forward
pass over the whole prefix. Encoder-decoder models encode the source once and
project every decoder layer's cross-attention keys and values of it once per
sequence (``prime_cross_cache``); the steps read them from the cache.

Token ids are the tokenizer's special ids (``data/tokenizer.py``): pad 0, bos 2, eos 3.

Prompts (decoder_only) are right-padded with 0 and may have different lengths
in one batch. All but the last token of the shortest prompt are written into
the cache in one forward pass (prefill); the rest is fed one token at a time
inside the loop, which *forces* a row's prompt token wherever the row still has
one and uses the model's choice after it (the scheme of the Flax lm1b
``temperature_sampler``). All rows share one cache index, so a row's tokens sit
at consecutive cache slots from 0 and no key-padding mask is needed.

Public functions:
  generate         decoder_only: sample / greedy continuation of prompts.
  translate_greedy encoder_decoder: greedy decoding from bos.
  beam_search      both families: beam search with the GNMT length penalty.
  uncached_greedy  reference argmax loop with a full forward pass per token.
  init_cache, prime_cross_cache, filter_logits, length_penalty: building blocks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tfx_jax.model.config import ModelConfig, position_capacity
from tfx_jax.model.families import build_model

# A cached step: tokens [N] and the cache -> (logits [N, V] of the next token, cache).
StepFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


# ------------------------------------------------------------------ the cache
def _check_capacity(cfg: ModelConfig, max_len: int) -> None:
  if max_len < 1:
    raise ConfigError(f"decode length must be >= 1, got {max_len}.")
  capacity = position_capacity(cfg)
  if capacity is not None and max_len > capacity:
    raise ConfigError(
        f"decoding needs {max_len} positions (prompt + new tokens), more than "
        f"model.max_len={cfg.max_len}, which learned absolute positions cannot "
        "represent; shorten the prompt or max_new_tokens / max_len, or use a model "
        "with a relative position scheme (rope, alibi, t5_bias).")


def _cache_shapes(cfg: ModelConfig, batch: int, max_len: int):
  model = build_model(cfg, use_cache=True)
  ids = jnp.ones((batch, max_len), jnp.int32)
  kwargs = {"inputs": ids}
  if cfg.family == "encoder_decoder":
    kwargs = {"inputs": jnp.ones((batch, 1), jnp.int32), "decoder_inputs": ids}
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), **kwargs)
  return shapes["cache"]


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
  """An empty KV cache for ``batch`` rows and ``max_len`` positions.

  Only shapes are traced (``jax.eval_shape``): no parameters are initialised.
  Raises ConfigError when learned positions cannot cover ``max_len``.
  """
  if cfg.family == "encoder_only":
    raise ConfigError("model.family='encoder_only' has no decoder to decode with; "
                      "use decoder_only or encoder_decoder.")
  _check_capacity(cfg, max_len)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                      _cache_shapes(cfg, batch, max_len))


def cache_batch_axes(cfg: ModelConfig, max_len: int):
  """Per cache leaf: the axis that indexes the batch, or None (index, capacity).

  Found by comparing the shapes for batch 1 and 2, so it holds for stacked
  (``scan_layers``) and per-layer caches alike.
  """
  one, two = _cache_shapes(cfg, 1, max_len), _cache_shapes(cfg, 2, max_len)

  def axis(a, b):
    diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    return diff[0] if diff else None

  return jax.tree.map(axis, one, two)


def _gather_cache(cache, axes, index_N):
  """Rows ``index_N`` of every batched cache leaf (beam reordering, tiling)."""
  return jax.tree.map(lambda x, a: x if a is None else jnp.take(x, index_N, axis=a),
                      cache, axes, is_leaf=lambda x: x is None)


# ----------------------------------------------------------------- step fns
def _decoder_only_step(cfg, params) -> StepFn:
  model = build_model(cfg, use_cache=True)

  def step(tokens_N, cache):
    out, mutated = model.apply({"params": params, "cache": cache}, tokens_N[:, None],
                               mutable=["cache"])
    return out["logits"][:, -1], mutated["cache"]

  return step


def _prefill(cfg, params, cache, ids_BL):
  """Writes ``ids_BL`` into the cache in one forward pass (logits unused)."""
  if ids_BL.shape[1] == 0:
    return cache
  model = build_model(cfg, use_cache=True)
  _, mutated = model.apply({"params": params, "cache": cache}, ids_BL,
                           mutable=["cache"])
  return mutated["cache"]


def _encoder_decoder_step(cfg, params, encoded_NSD, source_seg_NS) -> StepFn:
  model = build_model(cfg, use_cache=True)

  def step(tokens_N, cache):
    out, mutated = model.apply({"params": params, "cache": cache}, tokens_N[:, None],
                               encoded_NSD, source_seg_NS, method="decode",
                               mutable=["cache"])
    return out["logits"][:, -1], mutated["cache"]

  return step


def prime_cross_cache(cfg, params, cache, encoded_NSD, source_seg_NS):
  """``cache`` plus every decoder layer's cross-attention keys and values of
  ``encoded_NSD``, projected once per sequence; the decoding steps reuse them.

  One throwaway decoder step computes them; everything else in the cache
  (self-attention keys/values, the index) is kept as it was.
  """
  model = build_model(cfg, use_cache=True)
  N = encoded_NSD.shape[0]
  _, mutated = model.apply({"params": params, "cache": cache},
                           jnp.full((N, 1), BOS_ID, jnp.int32), encoded_NSD,
                           source_seg_NS, method="decode", mutable=["cache"])
  old = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  new = flax.traverse_util.flatten_dict(flax.core.unfreeze(mutated["cache"]))
  return flax.traverse_util.unflatten_dict({k: old.get(k, v) for k, v in new.items()})


def _cross_axes(axes, cache):
  """``axes`` extended to a primed cache: the cross keys/values are not reordered
  (the beams of one source share them)."""
  known = flax.traverse_util.flatten_dict(flax.core.unfreeze(axes), keep_empty_nodes=True)
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return flax.traverse_util.unflatten_dict({k: known.get(k) for k in flat})


def _encode(cfg, params, source_BS):
  model = build_model(cfg)
  seg = (source_BS > 0).astype(jnp.int32)
  encoded = model.apply({"params": params}, source_BS, seg, method="encode")
  return encoded, seg


# ----------------------------------------------------------------- sampling
def filter_logits(logits_BV, *, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0):
  """Logits divided by ``temperature``, with tokens outside top-k / nucleus at -inf.

  top_k > 0 keeps the k most likely tokens. top_p < 1 keeps the smallest set of
  most likely tokens whose probability sums to at least top_p (nucleus sampling,
  Holtzman et al. 2020); the most likely token is always kept. Ties at the
  threshold are kept.
  """
  logits = logits_BV.astype(jnp.float32) / temperature
  if top_k > 0:
    kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p < 1.0:
    sorted_desc = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = mass_before < top_p  # the first token always has mass_before 0
    threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


def _sample_loop(step: StepFn, cache, seq_BT, lengths_B, rng, *, start: int,
                 max_new: int, greedy: bool, temperature: float, top_k: int,
                 top_p: float, eos_id: int):
  """Feeds position ``i`` and writes position ``i + 1`` until every row is done.

  ``seq_BT`` holds the prompts (positions < lengths_B); the cache already holds
  positions < ``start``. Row b is done after its eos or its ``max_new``-th new
  token; later positions stay pad.
  """
  T = seq_BT.shape[1]

  def cond(state):
    i, _, _, done_B, _ = state
    return (i + 1 < T) & ~jnp.all(done_B)

  def body(state):
    i, cache, seq_BT, done_B, rng = state
    logits_BV, cache = step(seq_BT[:, i], cache)
    rng, sub = jax.random.split(rng)
    if greedy:
      chosen_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    else:
      filtered = filter_logits(logits_BV, temperature=temperature, top_k=top_k,
                               top_p=top_p)
      chosen_B = jax.random.categorical(sub, filtered, axis=-1).astype(jnp.int32)
    pos = i + 1
    forced_B = pos < lengths_B
    token_B = jnp.where(forced_B, seq_BT[:, pos], chosen_B)
    token_B = jnp.where(done_B, PAD_ID, token_B)
    seq_BT = jax.lax.dynamic_update_slice(seq_BT, token_B[:, None], (0, pos))
    done_B = done_B | (~forced_B & (token_B == eos_id)) | (pos >= lengths_B + max_new - 1)
    return i + 1, cache, seq_BT, done_B, rng

  done = jnp.zeros(seq_BT.shape[:1], bool)
  state = (jnp.asarray(start - 1, jnp.int32), cache, seq_BT, done, rng)
  return jax.lax.while_loop(cond, body, state)[2]


def _after_prompt(seq_BT, lengths_B, n: int):
  """The ``n`` positions after each row's prompt."""
  idx = lengths_B[:, None] + jnp.arange(n, dtype=jnp.int32)[None]
  return jnp.take_along_axis(seq_BT, idx, axis=-1)


def _prompt_lengths(prompt_ids) -> tuple[np.ndarray, int]:
  """Checks right-padded prompts; returns (lengths, shortest length)."""
  ids = np.asarray(prompt_ids)
  if ids.ndim != 2:
    raise ConfigError(f"prompt ids must be [batch, length], got shape {ids.shape}.")
  lengths = (ids != PAD_ID).sum(axis=1)
  if np.any(lengths == 0):
    raise ConfigError("every prompt needs at least one token (e.g. bos id 2); "
                      f"rows {np.flatnonzero(lengths == 0).tolist()} are empty.")
  if np.any((ids != PAD_ID) != (np.arange(ids.shape[1])[None] < lengths[:, None])):
    raise ConfigError("prompts must be right-padded with 0 (pad inside a prompt).")
  return lengths.astype(np.int32), int(lengths.min())


def _check_sampling(greedy, temperature, top_k, top_p, vocab_size):
  if not greedy and not temperature > 0:
    raise ConfigError(f"temperature must be > 0, got {temperature}; use greedy=True "
                      "for argmax decoding.")
  if not 0 <= top_k <= vocab_size:
    raise ConfigError(f"top_k must be in [0, vocab_size={vocab_size}], got {top_k}.")
  if not 0.0 < top_p <= 1.0:
    raise ConfigError(f"top_p must be in (0, 1], got {top_p}.")


def _require_family(cfg, family, fn):
  if cfg.family != family:
    raise ConfigError(f"{fn} needs model.family={family!r}, got {cfg.family!r}.")


@functools.partial(jax.jit, static_argnames=(
    "cfg", "start", "max_new", "greedy", "temperature", "top_k", "top_p", "eos_id"))
def _generate_jit(params, prompt_BP, lengths_B, rng, *, cfg, start, max_new, greedy,
                  temperature, top_k, top_p, eos_id):
  B, P = prompt_BP.shape
  T = P + max_new
  cache = init_cache(cfg, B, T)
  cache = _prefill(cfg, params, cache, prompt_BP[:, :start - 1])
  seq = jnp.pad(prompt_BP, ((0, 0), (0, max_new)))
  seq = _sample_loop(_decoder_only_step(cfg, params), cache, seq, lengths_B, rng,
                     start=start, max_new=max_new, greedy=greedy,
                     temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id)
  return _after_prompt(seq, lengths_B, max_new)


def generate(params, cfg: ModelConfig, prompt_ids, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             rng=None, greedy: bool = False, eos_id: int = EOS_ID) -> jax.Array:
  """Continues right-padded prompts [B, P] (decoder_only) by sampling or argmax.

  Returns the new tokens [B, max_new_tokens], for each row the positions right
  after its own prompt; a row stops at its first eos (kept) and is pad after it.
  ``greedy=True`` takes the argmax; otherwise tokens are sampled from
  ``filter_logits(logits, temperature, top_k, top_p)`` with ``rng``.
  The cache holds P + max_new_tokens positions (ConfigError beyond
  ``model.max_len`` with learned positions). One compilation per
  (batch, P, shortest prompt, max_new_tokens, sampling settings).
  """
  _require_family(cfg, "decoder_only", "generate")
  _check_sampling(greedy, temperature, top_k, top_p, cfg.vocab_size)
  lengths, shortest = _prompt_lengths(prompt_ids)
  if max_new_tokens < 1:
    raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
  _check_capacity(cfg, np.shape(prompt_ids)[1] + max_new_tokens)
  if rng is None:
    if not greedy:
      raise ConfigError("sampling needs an rng (jax.random.PRNGKey); "
                        "pass greedy=True for argmax decoding.")
    rng = jax.random.PRNGKey(0)
  return _generate_jit(params, jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(lengths),
                       rng, cfg=cfg, start=shortest, max_new=int(max_new_tokens),
                       greedy=bool(greedy), temperature=float(temperature),
                       top_k=int(top_k), top_p=float(top_p), eos_id=int(eos_id))


@functools.partial(jax.jit, static_argnames=("cfg", "max_len", "eos_id", "bos_id"))
def _translate_greedy_jit(params, source_BS, *, cfg, max_len, eos_id, bos_id):
  B = source_BS.shape[0]
  encoded, seg = _encode(cfg, params, source_BS)
  cache = prime_cross_cache(cfg, params, init_cache(cfg, B, max_len + 1), encoded, seg)
  seq = jnp.zeros((B, max_len + 1), jnp.int32).at[:, 0].set(bos_id)
  lengths = jnp.ones((B,), jnp.int32)
  seq = _sample_loop(_encoder_decoder_step(cfg, params, encoded, seg), cache, seq,
                     lengths, jax.random.PRNGKey(0), start=1, max_new=max_len,
                     greedy=True, temperature=1.0, top_k=0, top_p=1.0, eos_id=eos_id)
  return seq[:, 1:]


def translate_greedy(params, cfg: ModelConfig, source_ids, *, max_len: int,
                     eos_id: int = EOS_ID, bos_id: int = BOS_ID) -> jax.Array:
  """Greedy decoding (encoder_decoder) of 0-padded sources [B, S].

  The source is encoded once; the decoder starts from ``bos_id`` and emits up
  to ``max_len`` tokens [B, max_len], stopping per row at eos (kept, pad after).
  """
  _require_family(cfg, "encoder_decoder", "translate_greedy")
  _check_capacity(cfg, max_len + 1)
  return _translate_greedy_jit(params, jnp.asarray(source_ids, jnp.int32), cfg=cfg,
                               max_len=int(max_len), eos_id=int(eos_id),
                               bos_id=int(bos_id))


# -------------------------------------------------------------- beam search
def length_penalty(length, alpha: float):
  """GNMT length penalty lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016).

  |Y| counts the generated tokens including the final eos; hypotheses are
  ranked by log P(Y) / lp(Y).
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _beam_loop(step: StepFn, cache, cache_axes, seq_BT, lengths_B, *, start: int,
               max_new: int, beam_size: int, alpha: float, eos_id: int):
  """Beam search over positions >= lengths_B, with alive and finished sets.

  As in the Flax / T5X beam search: each step extends the K alive beams by
  every token and keeps the 2K best candidates, so that K of them remain alive
  even if K of them end in eos. Candidates among the K best that end in eos
  (or reach the row's last position) enter the finished set, ranked by the
  length-penalised score (endings ranked below K are pruned, as a K-wide beam
  would, so beam size 1 with alpha 0 is greedy decoding); the others compete
  for the K alive slots, and the cache rows follow
  their parent beam. While a row still has prompt tokens (decoder_only), only
  its prompt token is allowed, with log-probability 0. A row stops when even
  its best alive beam, at the largest length penalty, cannot beat the worst of
  its K finished hypotheses (log-probs only fall as a beam grows; alpha >= 0).

  ``cache`` has B * K rows (row b * K + k is beam k of example b) and holds
  positions < ``start``. Returns (finished sequences [B, K, T], scores [B, K]),
  best first.
  """
  B, T = seq_BT.shape
  K = beam_size
  N = B * K
  neg_inf = jnp.float32(-jnp.inf)
  best_lp = length_penalty(max_new, alpha)

  def terminated(alive_logp_BK, fin_score_BK):
    return alive_logp_BK[:, 0] / best_lp <= fin_score_BK[:, -1]

  def cond(state):
    i, alive_logp, fin_score = state[0], state[2], state[4]
    return (i + 1 < T) & ~jnp.all(terminated(alive_logp, fin_score))

  def body(state):
    i, alive_seq, alive_logp, fin_seq, fin_score, cache = state
    tokens_N = alive_seq[:, :, i].reshape(N)
    logits_NV, cache = step(tokens_N, cache)
    V = logits_NV.shape[-1]
    logp_BKV = jax.nn.log_softmax(logits_NV.astype(jnp.float32)).reshape(B, K, V)
    pos = i + 1
    forced_B = pos < lengths_B
    prompt_B = seq_BT[:, pos]
    forced_V = jnp.where(jnp.arange(V)[None] == prompt_B[:, None], 0.0, neg_inf)
    logp_BKV = jnp.where(forced_B[:, None, None], forced_V[:, None, :], logp_BKV)

    cand_logp = (alive_logp[:, :, None] + logp_BKV).reshape(B, K * V)
    top_logp, top_idx = jax.lax.top_k(cand_logp, 2 * K)
    parent = top_idx // V
    token = (top_idx % V).astype(jnp.int32)
    top_seq = jnp.take_along_axis(alive_seq, parent[:, :, None], axis=1)
    top_seq = jax.lax.dynamic_update_slice(top_seq, token[:, :, None], (0, 0, pos))

    last_B = pos >= lengths_B + max_new - 1
    ends = (~forced_B[:, None] & (token == eos_id)) | last_B[:, None]
    valid = top_logp > neg_inf
    new_len_B = pos - lengths_B + 1
    # Only an ending among the K best candidates is finished (as in fairseq):
    # a hypothesis that the classic K-wide beam would have pruned stays pruned,
    # so beam size 1 is exactly greedy decoding when alpha = 0.
    in_beam = jnp.arange(2 * K)[None, :] < K
    new_score = jnp.where(ends & valid & in_beam,
                          top_logp / length_penalty(new_len_B, alpha)[:, None], neg_inf)

    # Alive: the K best candidates that did not end.
    alive_logp, keep = jax.lax.top_k(jnp.where(ends, neg_inf, top_logp), K)
    alive_seq = jnp.take_along_axis(top_seq, keep[:, :, None], axis=1)
    parent_BK = jnp.take_along_axis(parent, keep, axis=1)
    rows_N = (jnp.arange(B)[:, None] * K + parent_BK).reshape(N)
    cache = _gather_cache(cache, cache_axes, rows_N)

    # Finished: the K best of the old finished set and the new endings.
    fin_score, pick = jax.lax.top_k(jnp.concatenate([fin_score, new_score], 1), K)
    fin_seq = jnp.take_along_axis(jnp.concatenate([fin_seq, top_seq], 1),
                                  pick[:, :, None], axis=1)
    return i + 1, alive_seq, alive_logp, fin_seq, fin_score, cache

  alive_seq = jnp.broadcast_to(seq_BT[:, None], (B, K, T))
  # Only beam 0 is alive at first, so the K beams do not start as copies.
  alive_logp = jnp.tile(jnp.where(jnp.arange(K) == 0, 0.0, neg_inf), (B, 1))
  fin_seq = jnp.zeros((B, K, T), jnp.int32)
  fin_score = jnp.full((B, K), neg_inf)
  state = (jnp.asarray(start - 1, jnp.int32), alive_seq, alive_logp.astype(jnp.float32),
           fin_seq, fin_score, cache)
  _, _, _, fin_seq, fin_score, _ = jax.lax.while_loop(cond, body, state)
  return fin_seq, fin_score


@functools.partial(jax.jit, static_argnames=(
    "cfg", "start", "max_new", "beam_size", "alpha", "eos_id", "bos_id"))
def _beam_search_jit(params, inputs_BP, lengths_B, *, cfg, start, max_new, beam_size,
                     alpha, eos_id, bos_id):
  B, P = inputs_BP.shape
  K = beam_size
  tile_N = jnp.repeat(jnp.arange(B), K)
  if cfg.family == "encoder_decoder":
    T = 1 + max_new
    encoded, seg = _encode(cfg, params, inputs_BP)
    step = _encoder_decoder_step(cfg, params, encoded[tile_N], seg[tile_N])
    cache = prime_cross_cache(cfg, params, init_cache(cfg, B * K, T), encoded[tile_N],
                              seg[tile_N])
    seq = jnp.zeros((B, T), jnp.int32).at[:, 0].set(bos_id)
  else:
    T = P + max_new
    cache = _prefill(cfg, params, init_cache(cfg, B, T), inputs_BP[:, :start - 1])
    cache = _gather_cache(cache, cache_batch_axes(cfg, T), tile_N)
    step = _decoder_only_step(cfg, params)
    seq = jnp.pad(inputs_BP, ((0, 0), (0, max_new)))
  fin_seq, fin_score = _beam_loop(
      step, cache, _cross_axes(cache_batch_axes(cfg, T), cache), seq, lengths_B, start=start,
      max_new=max_new, beam_size=K, alpha=alpha, eos_id=eos_id)
  idx = jnp.broadcast_to(lengths_B[:, None, None] + jnp.arange(max_new)[None, None],
                         (B, K, max_new))
  return jnp.take_along_axis(fin_seq, idx, axis=-1), fin_score


def beam_search(params, cfg: ModelConfig, inputs, *, beam_size: int = 4,
                alpha: float = 0.6, max_len: int, eos_id: int = EOS_ID,
                bos_id: int = BOS_ID) -> tuple[jax.Array, jax.Array]:
  """Beam search; returns (sequences [B, beam_size, max_len], scores [B, beam_size]).

  encoder_decoder: ``inputs`` are 0-padded sources [B, S]; decoding starts
  from ``bos_id``. decoder_only: ``inputs`` are right-padded prompts [B, P]
  (variable lengths allowed) and the result holds the tokens after each
  prompt. ``max_len`` is the number of new tokens. Hypotheses are ranked by
  log P / ((5 + length) / 6)^alpha (GNMT; alpha 0.6 in Vaswani et al. 2017),
  length counting the eos; sequences stop at eos (kept, pad after) or at
  ``max_len`` tokens. Beams are sorted best first.
  """
  if cfg.family not in ("encoder_decoder", "decoder_only"):
    raise ConfigError(f"beam_search needs a decoder; model.family={cfg.family!r}.")
  if beam_size < 1:
    raise ConfigError(f"beam_size must be >= 1, got {beam_size}.")
  if alpha < 0:
    raise ConfigError(f"alpha must be >= 0 (got {alpha}).")
  if max_len < 1:
    raise ConfigError(f"max_len must be >= 1, got {max_len}.")
  if cfg.family == "encoder_decoder":
    inputs = jnp.asarray(inputs, jnp.int32)
    lengths, start = np.ones((inputs.shape[0],), np.int32), 1
    _check_capacity(cfg, max_len + 1)
  else:
    lengths, start = _prompt_lengths(inputs)
    _check_capacity(cfg, np.shape(inputs)[1] + max_len)
  return _beam_search_jit(params, jnp.asarray(inputs, jnp.int32), jnp.asarray(lengths),
                          cfg=cfg, start=start, max_new=int(max_len),
                          beam_size=int(beam_size), alpha=float(alpha),
                          eos_id=int(eos_id), bos_id=int(bos_id))


# ------------------------------------------------------------ the reference
def uncached_greedy(params, cfg: ModelConfig, inputs, max_len: int, *,
                    eos_id: int = EOS_ID, bos_id: int = BOS_ID) -> np.ndarray:
  """Reference argmax loop: a full forward pass over the whole buffer per token.

  Same inputs and outputs as ``generate(..., greedy=True)`` (decoder_only,
  ``max_len`` new tokens) and ``translate_greedy`` (encoder_decoder). Slow,
  O(length) per token; for tests.
  """
  model = build_model(cfg)
  inputs = np.asarray(inputs, np.int32)
  B = inputs.shape[0]
  if cfg.family == "encoder_decoder":
    lengths = np.ones((B,), np.int32)
    seq = np.zeros((B, max_len + 1), np.int32)
    seq[:, 0] = bos_id
    forward = jax.jit(lambda p, s: model.apply({"params": p}, inputs, s)["logits"])
  else:
    lengths = (inputs != PAD_ID).sum(1).astype(np.int32)
    seq = np.pad(inputs, ((0, 0), (0, max_len)))
    forward = jax.jit(lambda p, s: model.apply({"params": p}, s)["logits"])
  done = np.zeros((B,), bool)
  out = np.zeros((B, max_len), np.int32)
  for t in range(max_len):
    logits = np.asarray(forward(params, jnp.asarray(seq)))
    for b in range(B):
      if done[b]:
        continue
      token = int(np.argmax(logits[b, lengths[b] + t - 1]))
      seq[b, lengths[b] + t] = token
      out[b, t] = token
      done[b] = token == eos_id
    if done.all():
      break
  return out
