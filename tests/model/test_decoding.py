"""Cached decoding against slow references: argmax loops, exhaustive search, sacrebleu."""

import collections
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu

from tfx_jax.tasks import bleu

from tfx_jax.model import decoding as search
from tfx_jax.core.errors import ConfigError
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, init_params


@functools.cache
def _model(family, position="learned", vocab=24, scan=False, max_len=32, layers=1):
  cfg = model_config_from_dict(dict(
      family=family, position=position, d_model=16, num_heads=4, num_kv_heads=2,
      num_layers=layers, vocab_size=vocab, max_len=max_len, scan_layers=scan))
  return cfg, init_params(cfg, jax.random.PRNGKey(0))


# Right-padded prompts (decoder_only) or sources (encoder_decoder) of different lengths.
INPUTS = np.array([[5, 6, 7, 8, 9],
                   [10, 11, 0, 0, 0],
                   [12, 13, 14, 0, 0]], np.int32)
NO_EOS = -1  # an id the model never emits: every row runs to the length limit


def _greedy(cfg, params, inputs, n, eos_id):
  if cfg.family == "decoder_only":
    return np.asarray(search.generate(params, cfg, inputs, n, greedy=True, eos_id=eos_id))
  return np.asarray(search.translate_greedy(params, cfg, inputs, max_len=n, eos_id=eos_id))


@pytest.mark.parametrize("family,position,scan,layers", [
    ("decoder_only", "learned", False, 2),
    ("decoder_only", "t5_bias", False, 1),
    ("decoder_only", "alibi", True, 2),
    ("decoder_only", "rope", False, 1),
    ("encoder_decoder", "sinusoidal", True, 2),
    ("encoder_decoder", "t5_bias", False, 1),
    ("encoder_decoder", "alibi", False, 1),
])
@pytest.mark.slow
def test_cached_greedy_equals_uncached_argmax_loop(family, position, scan, layers):
  cfg, params = _model(family, position, scan=scan, layers=layers)
  cached = _greedy(cfg, params, INPUTS, 7, NO_EOS)
  reference = search.uncached_greedy(params, cfg, INPUTS, 7, eos_id=NO_EOS)
  np.testing.assert_array_equal(cached, reference)


@pytest.mark.parametrize("rope,scan", [
    (dict(rope_scaling="linear", rope_scaling_factor=2.0), False),
    (dict(rope_fraction=0.5, rope_scaling="yarn", rope_scaling_factor=4.0,
          rope_original_max_len=4), True),
], ids=["linear", "partial-yarn-scan"])
@pytest.mark.slow
def test_cached_greedy_with_partial_and_scaled_rope(rope, scan):
  cfg = model_config_from_dict(dict(
      family="decoder_only", position="rope", d_model=16, num_heads=4, num_kv_heads=2,
      num_layers=2, vocab_size=24, scan_layers=scan, **rope))
  params = init_params(cfg, jax.random.PRNGKey(0))
  cached = _greedy(cfg, params, INPUTS, 7, NO_EOS)
  reference = search.uncached_greedy(params, cfg, INPUTS, 7, eos_id=NO_EOS)
  np.testing.assert_array_equal(cached, reference)


@pytest.mark.slow
def test_variable_length_prompts_equal_each_prompt_alone():
  cfg, params = _model("decoder_only", "rope")
  batched = _greedy(cfg, params, INPUTS, 7, NO_EOS)
  for row, prompt in zip(batched, INPUTS):
    alone = _greedy(cfg, params, prompt[prompt > 0][None], 7, NO_EOS)
    np.testing.assert_array_equal(row, alone[0])


@pytest.mark.parametrize("family", ["decoder_only", "encoder_decoder"])
def test_eos_stops_each_sequence(family):
  cfg, params = _model(family, "t5_bias")
  free = _greedy(cfg, params, INPUTS, 7, NO_EOS)
  eos = int(free[0, 2])  # a token row 0 emits third: row 0 must stop there
  assert eos != 0
  stopped = _greedy(cfg, params, INPUTS, 7, eos)
  for got, run in zip(stopped, free):
    hits = np.flatnonzero(run == eos)
    end = hits[0] + 1 if hits.size else len(run)
    np.testing.assert_array_equal(got[:end], run[:end])
    assert np.all(got[end:] == 0)
  assert np.all(stopped[0, 3:] == 0)  # row 0 has stopped by its third token


def test_sampling_with_top_k_1_equals_greedy():
  cfg, params = _model("decoder_only", "t5_bias")
  sampled = search.generate(params, cfg, INPUTS, 7, top_k=1, temperature=0.7,
                            rng=jax.random.PRNGKey(3), eos_id=NO_EOS)
  np.testing.assert_array_equal(sampled, _greedy(cfg, params, INPUTS, 7, NO_EOS))


def test_sampling_follows_the_filtered_distribution():
  cfg, params = _model("decoder_only", "t5_bias")
  prompt = np.array([[5, 6]], np.int32)
  draws = [int(search.generate(params, cfg, prompt, 1, rng=jax.random.PRNGKey(s),
                               top_k=3, eos_id=NO_EOS)[0, 0]) for s in range(40)]
  logits = jax.jit(build_model(cfg).apply)({"params": params}, prompt)["logits"][0, -1]
  top3 = set(np.argsort(-np.asarray(logits))[:3].tolist())
  assert set(draws) <= top3 and len(set(draws)) > 1


def test_filter_logits_top_p_and_top_k_by_hand():
  probs = np.array([[0.5, 0.05, 0.3, 0.15]])
  logits = jnp.log(probs)
  kept = lambda **kw: np.isfinite(np.asarray(search.filter_logits(logits, **kw)))[0]
  # Nucleus: the fewest most-likely tokens whose mass reaches p (0.5, then 0.3, ...).
  np.testing.assert_array_equal(kept(top_p=0.5), [True, False, False, False])
  np.testing.assert_array_equal(kept(top_p=0.75), [True, False, True, False])
  np.testing.assert_array_equal(kept(top_p=0.85), [True, False, True, True])
  np.testing.assert_array_equal(kept(top_p=0.01), [True, False, False, False])
  np.testing.assert_array_equal(kept(top_p=1.0), [True, True, True, True])
  np.testing.assert_array_equal(kept(top_k=2), [True, False, True, False])
  np.testing.assert_array_equal(kept(top_k=3, top_p=0.6), [True, False, True, False])
  # Temperature divides the logits; renormalised nucleus probabilities.
  # At temperature 2 the probabilities are ~ sqrt(p): 0.38, 0.12, 0.29, 0.21.
  f = search.filter_logits(logits, temperature=2.0, top_p=0.6)
  np.testing.assert_allclose(jax.nn.softmax(f)[0],
                             np.sqrt([0.5, 0, 0.3, 0]) / np.sqrt([0.5, 0.3]).sum(), rtol=1e-6)


# ---------------------------------------------------------------- beam search
def _logprobs_of(cfg, params, inputs_1P, hyps):
  """Model log P of each hypothesis (a list of token tuples) after the input."""
  apply = jax.jit(build_model(cfg).apply)
  n = max(len(h) for h in hyps)
  if cfg.family == "encoder_decoder":
    dec = np.array([[search.BOS_ID] + list(h) + [0] * (n - len(h)) for h in hyps])
    src = np.repeat(inputs_1P, len(hyps), 0)
    logits = apply({"params": params}, src, dec[:, :-1])["logits"]
    offset = 0
  else:
    P = inputs_1P.shape[1]
    dec = np.array([list(inputs_1P[0]) + list(h) + [0] * (n - len(h)) for h in hyps])
    logits = apply({"params": params}, dec[:, :-1])["logits"]
    offset = P - 1
  logp = np.asarray(jax.nn.log_softmax(logits))
  return np.array([sum(logp[i, offset + t, tok] for t, tok in enumerate(h))
                   for i, h in enumerate(hyps)])


def _all_hypotheses(vocab, max_len, eos):
  """Every complete hypothesis: ends at its first eos, or has max_len tokens."""
  hyps = []
  for n in range(1, max_len + 1):
    for body in itertools.product([t for t in range(vocab) if t != eos], repeat=n - 1):
      hyps.append(body + (eos,))
      if n == max_len:
        hyps.extend(body + (t,) for t in range(vocab) if t != eos)
  return hyps


def _padded(h, n):
  return tuple(h) + (0,) * (n - len(h))


BEAM_INPUTS = np.array([[4, 1, 2]], np.int32)


@functools.cache
def _enumerated(family, vocab=5, max_len=3, alpha=0.6):
  """A vocab-5 model and the penalised score of every complete hypothesis."""
  cfg, params = _model(family, "t5_bias", vocab=vocab, layers=1)
  hyps = _all_hypotheses(vocab, max_len, search.EOS_ID)
  scores = _logprobs_of(cfg, params, BEAM_INPUTS, hyps) / np.array(
      [((5 + len(h)) / 6) ** alpha for h in hyps])
  return cfg, params, {_padded(h, max_len): s for h, s in zip(hyps, scores)}


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
@pytest.mark.slow
def test_beam_search_finds_the_best_of_all_sequences(family):
  cfg, params, by_seq = _enumerated(family)
  expected = sorted(by_seq, key=by_seq.get, reverse=True)[:25]
  # K >= vocab^(max_len - 1) never prunes a prefix: exact search.
  seqs, got = search.beam_search(params, cfg, BEAM_INPUTS, beam_size=25, alpha=0.6,
                                 max_len=3)
  assert [tuple(s) for s in np.asarray(seqs[0]).tolist()] == expected
  np.testing.assert_allclose(got[0], [by_seq[s] for s in expected], rtol=1e-5)


@pytest.mark.slow
def test_narrow_beams_score_what_they_return():
  cfg, params, by_seq = _enumerated("encoder_decoder")
  seqs, got = search.beam_search(params, cfg, BEAM_INPUTS, beam_size=2, alpha=0.6,
                                 max_len=3)
  returned = [tuple(s) for s in np.asarray(seqs[0]).tolist()]
  np.testing.assert_allclose(got[0], [by_seq[s] for s in returned], rtol=1e-5)
  assert got[0, 0] >= got[0, 1]
  # Beam 1 with a length penalty may run past greedy's eos to a longer
  # hypothesis with a better penalised score, never a worse one.
  _, got = search.beam_search(params, cfg, BEAM_INPUTS, beam_size=1, alpha=0.6,
                              max_len=3)
  greedy = _greedy(cfg, params, BEAM_INPUTS, 3, search.EOS_ID)[0]
  assert got[0, 0] >= by_seq[tuple(greedy)] - 1e-5


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("eos_id", [1, 4])
@pytest.mark.slow
def test_beam_size_1_equals_greedy_with_eos_reachable(family, eos_id):
  """Without a length penalty, beam size 1 is greedy decoding, eos included."""
  cfg = model_config_from_dict(dict(
      family=family, position="t5_bias", d_model=16, num_heads=4, num_kv_heads=2,
      num_layers=1, vocab_size=6, max_len=32))
  # A seed per family whose greedy rows emit ids 1 and 4 mid-sequence (tiny
  # random models mostly repeat one token), so eos ends some rows early and is a
  # runner-up candidate in others.
  seed = {"encoder_decoder": 5, "decoder_only": 2}[family]
  params = init_params(cfg, jax.random.PRNGKey(seed))
  inputs = np.array([[4, 1, 2, 4], [1, 1, 4, 0], [2, 4, 0, 0]], np.int32)
  greedy = _greedy(cfg, params, inputs, 6, eos_id)
  seqs, _ = search.beam_search(params, cfg, inputs, beam_size=1, alpha=0.0, max_len=6,
                               eos_id=eos_id)
  np.testing.assert_array_equal(np.asarray(seqs)[:, 0], greedy)
  assert any(eos_id in row[:-1] for row in greedy.tolist()), greedy


@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only"])
def test_beam_size_1_follows_greedy(family):
  cfg, params = _model(family, "t5_bias")
  greedy = _greedy(cfg, params, INPUTS, 7, NO_EOS)
  seqs, _ = search.beam_search(params, cfg, INPUTS, beam_size=1, max_len=7,
                               eos_id=NO_EOS)
  np.testing.assert_array_equal(seqs[:, 0], greedy)


def test_learned_positions_beyond_max_len_is_a_config_error():
  cfg, params = _model("decoder_only", "learned")  # max_len 32
  with pytest.raises(ConfigError, match="max_len=32"):
    search.generate(params, cfg, INPUTS, 28, greedy=True)
  with pytest.raises(ConfigError, match="max_len=32"):
    search.init_cache(cfg, 1, 33)
  cfg, params = _model("encoder_decoder", "learned")
  with pytest.raises(ConfigError, match="learned absolute positions"):
    search.beam_search(params, cfg, INPUTS, max_len=32)


def test_bad_prompts_are_config_errors():
  cfg, params = _model("decoder_only", "learned")
  with pytest.raises(ConfigError, match="right-padded"):
    search.generate(params, cfg, np.array([[0, 5, 6]]), 2, greedy=True)
  with pytest.raises(ConfigError, match="at least one token"):
    search.generate(params, cfg, np.array([[5, 6], [0, 0]]), 2, greedy=True)
  with pytest.raises(ConfigError, match="top_p"):
    search.generate(params, cfg, INPUTS, 2, top_p=0.0, rng=jax.random.PRNGKey(0))


# ----------------------------------------------------------------------- BLEU
def _reference_bleu(hyps, refs):
  """BLEU-4 of Papineni et al. 2002 on whitespace tokens, no smoothing."""
  matches, totals = [0] * 4, [0] * 4
  hyp_len = ref_len = 0
  for h, r in zip(hyps, refs):
    h, r = h.split(), r.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      hc = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      rc = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum(min(c, rc[g]) for g, c in hc.items())
      totals[n - 1] += max(len(h) - n + 1, 0)
  log_p = sum(math.log(m / t) for m, t in zip(matches, totals)) / 4
  bp = min(1.0, math.exp(1 - ref_len / hyp_len))
  return 100 * bp * math.exp(log_p)


def test_bleu_and_chrf_match_sacrebleu_and_the_formula():
  hyps = ["the cat sat on the mat", "there is a dog in the garden today",
          "a quick brown fox jumps over the lazy dog"]
  refs = ["the cat sat on a mat", "there is a dog in the garden",
          "the quick brown fox jumps over the lazy dog"]
  score, signature, _ = bleu.corpus_bleu(hyps, refs)
  assert score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert score == pytest.approx(_reference_bleu(hyps, refs), rel=1e-9)
  assert "tok:13a" in signature and "nrefs:1" in signature
  assert bleu.corpus_bleu(refs, refs)[0] == pytest.approx(100.0)
  assert bleu.corpus_bleu(hyps, [refs, refs])[1].startswith("nrefs:2")
  chrf, chrf_sig, _ = bleu.corpus_chrf(hyps, refs)
  assert chrf == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
  assert chrf_sig.startswith("nrefs:1") and "nw:0" in chrf_sig


@pytest.mark.slow
def test_bleu_and_chrf_standard_errors_are_the_bootstrap_spread_over_sentences():
  """The standard error is the spread of the corpus score over resamples of the
  sentences: checked against a bootstrap of our own (another generator,
  sacrebleu's plain corpus score of each resample), within Monte-Carlo error."""
  rng = np.random.default_rng(0)
  words = "the a cat dog sat ran on in mat garden fox lazy quick brown over today".split()
  refs = [" ".join(rng.choice(words, rng.integers(4, 12))) for _ in range(40)]
  # Hypotheses from exact to unrelated: the sentences' scores spread.
  hyps = [r if i % 3 == 0 else " ".join(rng.choice(words, len(r.split())))
          for i, r in enumerate(refs)]
  for ours, plain in ((bleu.corpus_bleu, sacrebleu.corpus_bleu),
                      (bleu.corpus_chrf, sacrebleu.corpus_chrf)):
    score, signature, se = ours(hyps, refs)
    assert "bs:1000" in signature and score == pytest.approx(plain(hyps, [refs]).score)
    resampled = []
    for _ in range(400):
      idx = rng.integers(0, len(hyps), len(hyps))
      resampled.append(plain([hyps[i] for i in idx], [[refs[i] for i in idx]]).score)
    assert se == pytest.approx(np.std(resampled, ddof=1), rel=0.15)
    assert ours(refs, refs).se == pytest.approx(0.0, abs=1e-9)  # every resample scores 100
    assert ours(hyps[:1], refs[:1]).se is None  # one sentence: nothing to resample


@pytest.mark.slow
def test_cross_attention_keys_and_values_are_projected_once_per_sequence():
  cfg, params = _model("encoder_decoder", "t5_bias", scan=True, layers=2)
  encoded, seg = jax.jit(functools.partial(search._encode, cfg))(params, jnp.asarray(INPUTS))
  empty = search.init_cache(cfg, 3, 8)
  cache = jax.jit(functools.partial(search.prime_cross_cache, cfg))(params, empty, encoded,
                                                                     seg)
  # Priming adds the cross keys/values to the cache.
  assert jax.tree.structure(cache) != jax.tree.structure(empty)
  tokens = jnp.asarray([2, 5, 7], jnp.int32)

  @jax.jit
  def step(encoded, cache):
    return search._encoder_decoder_step(cfg, params, encoded, seg)(tokens, cache)[0]

  # A step reads the primed keys/values: the encoder output it is handed is not
  # projected again (zeros there change nothing) ...
  np.testing.assert_array_equal(np.asarray(step(encoded, cache)),
                                np.asarray(step(jnp.zeros_like(encoded), cache)))
  # ... and its jaxpr has 2 fewer projections (key, value; one scanned layer body).
  dots = lambda c: str(jax.make_jaxpr(step)(encoded, c)).count("dot_general")
  assert dots(empty) - dots(cache) == 2
