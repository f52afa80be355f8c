"""Evaluate a trained run: ``python -m tfx_jax.evaluate --workdir runs/NAME``.

Loads the latest (or ``--step``) checkpoint with the config saved in the
workdir and reports what fits the family:

  lm         perplexity (teacher-forced next-token predictions as hypotheses)
  translate  BLEU and chrF (sacrebleu, detokenized text, signature printed)
  mlm        masked-token accuracy (and perplexity at the masked positions)
  classify   accuracy

Writes ``workdir/eval/<split>-<step>.hyp.txt`` / ``.ref.txt`` (one line per
example) and the metrics to ``workdir/eval/<split>-<step>.json``.

``--lengths 1x,2x,4x,8x`` instead evaluates a language model trained at
length L on non-overlapping windows of L, 2L, 4L, 8L tokens (the ALiBi
paper's extrapolation experiment) and prints a table.
"""

from __future__ import annotations

import json
import math
import sys

from absl import app, flags
import numpy as np

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_SPLIT = flags.DEFINE_string("split", "validation", "Dataset split.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_LENGTHS = flags.DEFINE_string("lengths", None,
                               "Length extrapolation, e.g. 1x,2x,4x,8x (decoder_only).")
_MAX_BATCHES = flags.DEFINE_integer("max_batches", 0, "Evaluate at most this many "
                                    "batches / windows (0: the whole split).")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Translation: beam size (1 = greedy).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Translation: GNMT length penalty alpha.")
flags.mark_flag_as_required("workdir")


# ------------------------------------------------------------------ helpers
def _texts(example, key):
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
    pairs.append((_texts(ex, keys.source_key), _texts(ex, keys.target_key)))
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
    from tfx_jax.model_config import ConfigError
    raise ConfigError(f"split {split!r} of {config.data.name} yielded no batch.")
  from tfx_jax.trainer import eval_metrics
  metrics = {k.split("/", 1)[1]: v for k, v in eval_metrics(task, totals).items()}
  metrics["num_examples"] = len(hyps)
  return metrics, hyps, refs


# ----------------------------------------------------- length extrapolation
def parse_lengths(spec: str) -> list[int]:
  from tfx_jax.model_config import ConfigError
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
    text = _texts(src[i], keys.text_key).strip()
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
  from tfx_jax.model_config import ConfigError
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


# ------------------------------------------------------------------- main
def main(argv):
  del argv
  from tfx_jax.model_config import ConfigError
  from tfx_jax.run_io import load_run
  try:
    multiples = parse_lengths(_LENGTHS.value) if _LENGTHS.value else None
    run = load_run(_WORKDIR.value, _STEP.value)
    out_dir = run.workdir / "eval"
    out_dir.mkdir(exist_ok=True)
    stem = out_dir / f"{_SPLIT.value}-{run.step}"
    if multiples:
      rows = extrapolation(run, _SPLIT.value, multiples, _MAX_BATCHES.value)
      print(format_extrapolation(rows, run.model_cfg.position))
      path = out_dir / f"{_SPLIT.value}-{run.step}.lengths.json"
      path.write_text(json.dumps(rows, indent=2))
      print(f"written: {path}")
      return
    metrics, hyps, refs = evaluate_run(run, _SPLIT.value, max_batches=_MAX_BATCHES.value,
                                       beam_size=_BEAM.value, alpha=_ALPHA.value)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  stem.with_suffix(".hyp.txt").write_text("".join(h.replace("\n", " ") + "\n" for h in hyps))
  stem.with_suffix(".ref.txt").write_text("".join(r.replace("\n", " ") + "\n" for r in refs))
  metrics.update(step=run.step, split=_SPLIT.value, task=run.config.task)
  (out_dir / f"{_SPLIT.value}-{run.step}.json").write_text(json.dumps(metrics, indent=2))
  print(f"{run.config.task} evaluation of {run.workdir} at step {run.step} "
        f"({_SPLIT.value}, {metrics['num_examples']} examples)")
  for key, value in metrics.items():
    if key not in ("step", "split", "task", "num_examples") and not key.endswith("signature"):
      print(f"  {key}: {value:.4f}" if isinstance(value, float) else f"  {key}: {value}")
  for key in ("bleu_signature", "chrf_signature"):
    if key in metrics:
      print(f"  sacrebleu {key.split('_')[0]} signature: {metrics[key]}")
  print(f"written: {stem}.hyp.txt, {stem}.ref.txt, {stem}.json")


if __name__ == "__main__":
  from tfx_jax.cli import run_main
  run_main(main)
