"""Decoding and scoring a trained run: the library behind evaluate / generate.

Everything here takes a loaded ``run_io.Run`` and returns numbers or text; the
command-line modules (``tfx_jax.evaluate``, ``tfx_jax.generate``) and the
trainer's in-training BLEU and samples call these functions.
"""

from __future__ import annotations

import math

import numpy as np


# ------------------------------------------------------------------ helpers
def text_of(example, key):
  value = example[key]
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  return str(value)


def translation_pairs(config, split: str, limit: int = 0):
  """(source, reference) texts of a translation split, in dataset order."""
  from tfx_jax.data import sources
  keys = sources.resolve_keys(config.data)
  src = sources.open_source(config.data.name, split, config.data.data_dir or None)
  n = len(src) if not limit else min(limit, len(src))
  pairs = []
  for i in range(n):
    ex = src[i]
    pairs.append((text_of(ex, keys.source_key), text_of(ex, keys.target_key)))
  return pairs


def translate_texts(run, sources_txt, *, beam_size=4, alpha=0.6, batch_size=32):
  """Detokenized translations of ``sources_txt`` (beam search or greedy)."""
  from tfx_jax import decode
  tok, cfg = run.tokenizer, run.model_cfg
  seq_len = int(run.config.train.seq_len)
  max_new = min(seq_len, cfg.max_len - 1) if cfg.position == "learned" else seq_len
  out = []
  for start in range(0, len(sources_txt), batch_size):
    chunk = sources_txt[start:start + batch_size]
    ids = np.zeros((batch_size, seq_len), np.int32)  # fixed shape: one compilation
    for i, text in enumerate(chunk):
      row = (tok.encode(text) + [tok.eos_id])[:seq_len]
      ids[i, :len(row)] = row
    if beam_size > 1:
      seqs, _ = decode.beam_search(run.params, cfg, ids, beam_size=beam_size,
                                   alpha=alpha, max_len=max_new)
      best = np.asarray(seqs)[:, 0]
    else:
      best = np.asarray(decode.translate_greedy(run.params, cfg, ids, max_len=max_new))
    for i in range(len(chunk)):
      out.append(tok.decode(_until_eos(best[i], tok.eos_id)))
  return out


def _until_eos(ids, eos_id):
  ids = list(np.asarray(ids))
  return ids[:ids.index(eos_id)] if eos_id in ids else ids


def _eval_batches(run, split, max_batches):
  from tfx_jax import trainer
  data = trainer.make_data(run.config, run.tokenizer, split, train=False)
  for i, batch in enumerate(data):
    if max_batches and i >= max_batches:
      break
    yield batch


def evaluate_run(run, split="validation", *, max_batches=0, beam_size=4, alpha=0.6):
  """(metrics, hypotheses, references) of a run on ``split``."""
  import jax
  import jax.numpy as jnp
  from tfx_jax import tasks
  from tfx_jax.models import build_model
  config, tok = run.config, run.tokenizer
  task = config.task
  if task == "translate":
    from tfx_jax import bleu
    pairs = translation_pairs(config, split, max_batches * config.eval.batch_size)
    hyps = translate_texts(run, [s for s, _ in pairs], beam_size=beam_size, alpha=alpha)
    refs = [r for _, r in pairs]
    b, b_sig = bleu.corpus_bleu(hyps, refs)
    c, c_sig = bleu.corpus_chrf(hyps, refs)
    metrics = {"bleu": b, "chrf": c, "bleu_signature": b_sig, "chrf_signature": c_sig,
               "num_examples": len(hyps), "beam_size": beam_size}
    return metrics, hyps, refs

  model = build_model(run.model_cfg)

  @jax.jit
  def forward(params, batch):
    out = model.apply({"params": params}, **tasks.model_inputs(task, batch))
    _, sums = tasks.loss_and_sums(task, out, batch, family=run.model_cfg.family,
                                  lambda_pt=float(config.finetune.lambda_pt))
    pred = (jnp.argmax(out["class_logits"], -1) if task == "classify"
            else jnp.argmax(out["logits"], -1))
    return sums, pred

  totals, hyps, refs = None, [], []
  for batch in _eval_batches(run, split, max_batches):
    sums, pred = forward(run.params, batch)
    sums, pred = jax.device_get(sums), np.asarray(pred)
    totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
    for i in range(batch["inputs"].shape[0]):
      if task == "classify":
        if batch["segment_ids"][i].max() > 0:
          hyps.append(str(int(pred[i])))
          refs.append(str(int(batch["label"][i])))
        continue
      w = batch["weights"][i] > 0
      if w.any():
        hyps.append(tok.decode([int(t) for t in pred[i][w]]))
        refs.append(tok.decode([int(t) for t in batch["targets"][i][w]]))
  if totals is None:
    from tfx_jax.errors import ConfigError
    raise ConfigError(f"split {split!r} of {config.data.name} yielded no batch.")
  from tfx_jax.trainer import eval_metrics
  metrics = {k.split("/", 1)[1]: v for k, v in eval_metrics(task, totals).items()}
  metrics["num_examples"] = len(hyps)
  return metrics, hyps, refs


# ----------------------------------------------------- length extrapolation
def parse_lengths(spec: str) -> list[int]:
  from tfx_jax.errors import ConfigError
  out = []
  for part in spec.split(","):
    part = part.strip().lower()
    try:
      k = int(part[:-1]) if part.endswith("x") else int(part)
    except ValueError:
      k = 0
    if k < 1:
      raise ConfigError(f"--lengths={spec!r}: each entry must be a positive multiple "
                        "of the training length such as 1x, 2x, 4x, 8x.")
    out.append(k)
  return out


def token_stream(run, split: str, max_tokens: int) -> np.ndarray:
  """The split's documents tokenized and concatenated (eos between them)."""
  from tfx_jax.data import sources
  keys = sources.resolve_keys(run.config.data)
  src = sources.open_source(run.config.data.name, split, run.config.data.data_dir or None)
  ids: list[int] = []
  for i in range(len(src)):
    text = text_of(src[i], keys.text_key).strip()
    if text:
      ids.extend(run.tokenizer.encode(text) + [run.tokenizer.eos_id])
    if len(ids) >= max_tokens:
      break
  return np.asarray(ids[:max_tokens], np.int32)


def extrapolation(run, split: str, multiples: list[int], max_windows: int = 0):
  """Perplexity on non-overlapping windows of k * L tokens for each k.

  Every length scores the same tokens: the first ``n`` tokens of the split,
  with n a multiple of the longest window. Rows whose windows are longer than
  learned absolute positions can represent are reported as unavailable.
  """
  import jax
  from tfx_jax import tasks
  from tfx_jax.models import build_model
  from tfx_jax.errors import ConfigError
  if run.model_cfg.family != "decoder_only":
    raise ConfigError("--lengths evaluates language models (model.family="
                      f"'decoder_only'); this run is {run.model_cfg.family!r}.")
  L = int(run.config.train.seq_len)
  longest = max(multiples) * L
  n_windows = max_windows or 8
  stream = token_stream(run, split, n_windows * longest + 1)
  usable = ((len(stream) - 1) // longest) * longest
  if usable == 0:
    raise ConfigError(f"split {split!r} has fewer than {longest + 1} tokens.")
  model = build_model(run.model_cfg)
  rows = []
  for k in multiples:
    length = k * L
    if run.model_cfg.position == "learned" and length > run.model_cfg.max_len:
      rows.append({"multiple": k, "length": length, "perplexity": None,
                   "note": f"learned positions end at max_len={run.model_cfg.max_len}"})
      continue

    @jax.jit
    def nll(params, inputs, targets):
      out = model.apply({"params": params}, inputs)
      batch = {"targets": targets, "weights": np.ones(targets.shape, np.float32)}
      _, sums = tasks.loss_and_sums("lm", out, batch)
      return sums["nll"], sums["weight"]

    total, count = 0.0, 0.0
    for start in range(0, usable, length):
      window = stream[start:start + length + 1]
      a, b = nll(run.params, window[None, :-1], window[None, 1:])
      total, count = total + float(a), count + float(b)
    rows.append({"multiple": k, "length": length, "tokens": int(count),
                 "perplexity": math.exp(min(total / count, 50.0))})
  return rows


def format_extrapolation(rows, position: str) -> str:
  lines = [f"length extrapolation (model.position={position})",
           f"{'window':>8} {'tokens':>10} {'perplexity':>12}"]
  for r in rows:
    ppl = f"{r['perplexity']:.2f}" if r["perplexity"] is not None else "n/a"
    note = f"  ({r['note']})" if r.get("note") else ""
    lines.append(f"{str(r['multiple']) + 'x=' + str(r['length']):>8} "
                 f"{r.get('tokens', 0):>10} {ppl:>12}{note}")
  return "\n".join(lines)



def generate_texts(run, texts, *, max_new_tokens=64, greedy=False, temperature=1.0,
                   top_k=0, top_p=1.0, beam_size=0, alpha=0.6, seed=0,
                   include_prompt=False) -> list[str]:
  """Continuations (decoder_only) or translations (encoder_decoder) of ``texts``."""
  import jax
  from tfx_jax import decode
  from tfx_jax.errors import ConfigError
  cfg, tok = run.model_cfg, run.tokenizer
  if cfg.family == "encoder_decoder":
    if beam_size <= 1 and not greedy:
      raise ConfigError("encoder_decoder generation is greedy (--greedy) or beam "
                        "search (--beam_size N).")
    return translate_texts(run, texts, beam_size=max(beam_size, 1), alpha=alpha,
                           batch_size=len(texts))
  if cfg.family != "decoder_only":
    raise ConfigError(f"generation needs a decoder; this run's model.family is "
                      f"{cfg.family!r}.")
  if cfg.family == "decoder_only" and not greedy and beam_size <= 0 and (
      temperature <= 0):
    raise ConfigError(f"temperature must be > 0, got {temperature}; use greedy "
                      "decoding (--greedy) for argmax.")
  rows = [[tok.bos_id] + tok.encode(t) for t in texts]
  width = max(len(r) for r in rows)
  ids = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  if beam_size > 0:
    seqs, _ = decode.beam_search(run.params, cfg, ids, beam_size=beam_size, alpha=alpha,
                                 max_len=max_new_tokens)
    new = np.asarray(seqs)[:, 0]
  else:
    new = np.asarray(decode.generate(
        run.params, cfg, ids, max_new_tokens, greedy=greedy, temperature=temperature,
        top_k=top_k, top_p=top_p, rng=jax.random.PRNGKey(seed)))
  out = []
  for row in new:
    row = list(row)
    row = row[:row.index(tok.eos_id)] if tok.eos_id in row else row
    # include_prompt: decode prompt and continuation together, so the tokenizer
    # decides the spacing where they meet (a continuation may start mid-word).
    prefix = rows[len(out)][1:] if include_prompt else []
    out.append(tok.decode(prefix + [int(t) for t in row]))
  return out
