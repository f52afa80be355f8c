"""Cached decoding speed: tfx_jax ``search.generate`` against Hugging Face ``generate()``.

Both sides run the same GPT-2-like decoder with random weights (pre-norm
LayerNorm, learned positions, exact GELU, tied embeddings, biases), greedy,
with eos disabled so every run emits exactly ``--new_tokens`` tokens, in the
same process on the same CPU threads. For each batch size and prefix length we
time the full call (prefill + decode) for ``--new_tokens`` new tokens and for
one new token; ``decode tok/s`` = batch * (new_tokens - 1) / (t_N - t_1) is the
incremental rate, which stays flat in the prefix length when decoding is cached.
JAX compile time (first call minus a timed call) is reported separately and
excluded from every rate.

PyTorch's OpenMP threads busy-wait; on a small or shared CPU one thread can be
several times faster than all cores. ``--threads 1,0`` (the default) times
Hugging Face with each setting (0 = torch's default) and reports the faster one.

  pip install torch transformers   # CPU build of torch on a CPU machine
  python experiments/bench_decode.py
  python experiments/bench_decode.py --prefix 16,64 --batch 1 --reps 2   # quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from tfx_jax import search
from tfx_jax.model_config import model_config_from_dict
from tfx_jax.models import init_params


def _timed(fn, reps):
  """Median wall time of ``reps`` calls of ``fn`` (after the caller's warm-up)."""
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _tfx_runner(args):
  cfg = model_config_from_dict(dict(
      family="decoder_only", norm_position="pre", norm_type="layernorm",
      activation="gelu", position="learned", num_layers=args.layers,
      d_model=args.d_model, num_heads=args.heads, vocab_size=args.vocab,
      max_len=args.max_len, tie_embeddings=True, use_bias=True, norm_eps=1e-5))
  params = jax.tree.map(np.asarray, init_params(cfg, jax.random.PRNGKey(0)))
  params = jax.device_put(params)

  def run(prompt, new):
    # eos_id -1 never matches: every row emits exactly `new` tokens.
    out = search.generate(params, cfg, prompt, new, greedy=True, eos_id=-1)
    return jax.block_until_ready(out)

  return run


def _hf_runner(args):
  import torch
  import transformers

  torch.manual_seed(0)
  hf_cfg = transformers.GPT2Config(
      vocab_size=args.vocab, n_positions=args.max_len, n_embd=args.d_model,
      n_layer=args.layers, n_head=args.heads, activation_function="gelu",
      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
  model = transformers.GPT2LMHeadModel(hf_cfg).eval()

  def run(prompt, new):
    ids = torch.from_numpy(prompt.astype(np.int64))
    with torch.inference_mode():
      out = model.generate(
          input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
          min_new_tokens=new, do_sample=False, num_beams=1, eos_token_id=None,
          pad_token_id=0, use_cache=True)
    assert out.shape[1] == prompt.shape[1] + new
    return out

  return run, torch.__version__, transformers.__version__


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--d_model", type=int, default=512)
  p.add_argument("--layers", type=int, default=6)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--vocab", type=int, default=16384)
  p.add_argument("--max_len", type=int, default=1024)
  p.add_argument("--new_tokens", type=int, default=64)
  p.add_argument("--prefix", default="16,64,256,512")
  p.add_argument("--batch", default="1,8")
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--threads", default="1,0",
                 help="torch thread counts to try (0 = torch's default, all cores); "
                      "the fastest is reported")
  p.add_argument("--no_hf", action="store_true", help="time tfx_jax only")
  args = p.parse_args()

  tfx = _tfx_runner(args)
  hf = None
  if not args.no_hf:
    import torch
    default_threads = torch.get_num_threads()
    thread_counts = [int(t) or default_threads for t in args.threads.split(",")]
    hf, torch_version, hf_version = _hf_runner(args)
    print(f"torch {torch_version} (threads tried: {thread_counts}), "
          f"transformers {hf_version}")
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; model d_model "
        f"{args.d_model}, {args.layers} layers, {args.heads} heads, vocab {args.vocab}; "
        f"greedy, {args.new_tokens} new tokens, eos disabled; median of {args.reps}")

  rng = np.random.default_rng(0)
  N = args.new_tokens
  header = ("| batch | prefix | tfx compile s | tfx total s | HF total s (threads) |"
            " tfx decode tok/s | HF decode tok/s | decode ratio tfx/HF |"
            " end-to-end ratio HF/tfx time |")
  print()
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for batch in [int(b) for b in args.batch.split(",")]:
    for prefix in [int(x) for x in args.prefix.split(",")]:
      prompt = rng.integers(5, args.vocab, size=(batch, prefix), dtype=np.int32)
      t0 = time.perf_counter()
      tfx(prompt, N)
      first = time.perf_counter() - t0
      tfx(prompt, 1)
      t_n = _timed(lambda: tfx(prompt, N), args.reps)
      t_1 = _timed(lambda: tfx(prompt, 1), args.reps)
      tfx_rate = batch * (N - 1) / max(t_n - t_1, 1e-9)
      row = [batch, prefix, f"{first - t_n:.2f}", f"{t_n:.3f}"]
      if hf is not None:
        best = None
        for threads in thread_counts:
          torch.set_num_threads(threads)
          hf(prompt, 2)  # warm-up
          h_n = _timed(lambda: hf(prompt, N), args.reps)
          h_1 = _timed(lambda: hf(prompt, 1), args.reps)
          if best is None or h_n < best[0]:
            best = (h_n, h_1, threads)
        h_n, h_1, threads = best
        hf_rate = batch * (N - 1) / max(h_n - h_1, 1e-9)
        row += [f"{h_n:.3f} ({threads})", f"{tfx_rate:.0f}", f"{hf_rate:.0f}",
                f"{tfx_rate / hf_rate:.2f}", f"{h_n / t_n:.2f}"]
      else:
        row += ["-", f"{tfx_rate:.0f}", "-", "-", "-"]
      print("| " + " | ".join(str(c) for c in row) + " |", flush=True)


if __name__ == "__main__":
  main()
