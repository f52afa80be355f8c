"""Speed of tfx_jax against Hugging Face PyTorch on the same machine, in one process.

  pip install torch==2.13.0 && pip install -e .[bench]   # CPU build of torch first
  python benchmarks/bench.py                   # everything (~5 minutes on 2 quiet cores)
  python benchmarks/bench.py --quick           # smaller sizes, fewer rounds (~2 minutes)
  python benchmarks/bench.py --only train,position --json bench.json
  ./launch.sh bench --quick                    # the same inside the project's .venv

A script, not part of the package: it imports the installed ``tfx_jax``, the
systems it times from ``systems.py`` beside it, and finds ``configs/`` in the
repository above it, so it runs from any directory. This file holds the
measurements, the report and the command line.

Measurements (``--only``, comma-separated):
  train      training tokens/s of the reference decoder (LLaMA-style: RMSNorm
             pre-norm, SwiGLU, RoPE, tied embeddings) against HF Llama, PyTorch
             eager and ``torch.compile``; float32, AdamW (same betas, eps, no
             weight decay, gradient clipping at 1.0, constant learning rate) on
             both sides, random weights and random tokens.
  seq2seq    the same for a small encoder-decoder (pre-norm RMSNorm, ReLU, T5
             relative bias, tied) against HF T5 of the same shape.
  position   tfx_jax training tokens/s with ``position`` = t5_bias and alibi
             against rope on the reference decoder (the cost of a biased attention).
  compile    compile time of the train step against depth (``--depths``), with
             ``scan_layers`` on and off.
  fixed      the fixed cost of a tiny run: wall time of ``python -m tfx_jax.train
             --config configs/lm.py:tiny`` for one step in a fresh process
             (imports, data, compilation, first step, final checkpoint/eval),
             with an empty compilation cache and again with it filled.
  decode     cached greedy decoding tokens/s (prefix then ``--new_tokens`` new
             tokens, eos disabled) against ``generate()``: the reference decoder
             against HF Llama, the encoder-decoder against HF T5.
  memory     peak resident memory of a process that runs only one system's
             training step (each in its own subprocess, so figures do not mix).
  kernels    what limits the training rows, one piece at a time against PyTorch:
             GFLOP/s of each dense product of the reference decoder's step
             (forward and both gradient products of the vocabulary projection,
             the SwiGLU FFN and the attention projections, [batch * seq] tokens)
             and one layer's causal self-attention forward and backward
             (tfx_jax's path for this backend and shape against
             ``scaled_dot_product_attention``), in tokens/s.

Precision (``--precision``, default ``float32,bfloat16``): the training rows
(train, seq2seq, position) are timed in each; the bf16 rows (measurement
names ending in ``_bf16``) set tfx_jax's ``compute_dtype=bfloat16`` (float32
parameters and optimizer state) and run PyTorch under
``torch.autocast("cpu", torch.bfloat16)``, eager and compiled. Where bf16
pays depends on the CPU: the JSON's environment records the CPU model and
whether it has ``amx_bf16`` and ``avx512_bf16``.

Timing: every system is built and warmed up (compilation excluded and reported
separately), then the systems of one measurement alternate round by round
(``--rounds``), so a load change on a shared machine hits all of them; each
timed call follows an untimed call of the same system (two for ``kernels``),
so none starts on cores the previous system left idle; the table shows medians
with min-max. ``--json PATH`` writes one record per system
and measurement: ``system``, ``measurement``, ``value`` (the median), ``unit``,
``min``, ``max``, ``rounds`` and ``config``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

# A sibling module: ``python benchmarks/bench.py`` puts this directory on sys.path.
from systems import (HfDecode, Shape, TfxDecode, TfxTrain, TorchTrain, lm_model,
                     s2s_model, torch_modules)

SCRIPT = pathlib.Path(__file__).resolve()
ROOT = SCRIPT.parents[1]  # the repository: configs/ is here

MEASUREMENTS = ("train", "seq2seq", "position", "compile", "fixed", "decode", "memory",
                "kernels")
QUICK = dict(layers=2, seq=128, batch=4, s2s_seq=64)


@dataclasses.dataclass
class Record:
  system: str
  measurement: str
  value: float
  unit: str
  config: dict
  min: float | None = None
  max: float | None = None
  rounds: int = 1


# ---------------------------------------------------------------- the runs
def _alternate(systems: dict[str, Any], rounds: int, warmup: int,
               lead_in: int = 0) -> dict[str, list[float]]:
  """Seconds per call of each system, alternating systems round by round.

  ``lead_in`` untimed calls precede each timed one, so no system is timed on
  cores the previous one left idle (a one-thread peer leaves one idle): here
  the first call of a few milliseconds after 50 ms of idle cores measured
  1.6-2x slower on either side.
  """
  for fn in systems.values():
    for _ in range(warmup):
      fn()
  times = {name: [] for name in systems}
  for _ in range(rounds):
    for name, fn in systems.items():
      for _ in range(lead_in):
        fn()
      t0 = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t0)
  return times


def _rate_records(measurement, systems, times, config) -> list[Record]:
  out = []
  for name, ts in times.items():
    rates = [systems[name].tokens / t for t in ts]
    out.append(Record(name, measurement, statistics.median(rates), "tokens/s", config,
                      min(rates), max(rates), len(rates)))
    if getattr(systems[name], "compile_s", 0.0):
      out.append(Record(name, f"{measurement}_compile", systems[name].compile_s, "s",
                        config))
  return out


class _Threads:
  """Runs a torch system with ``threads`` intra-op threads (0: torch's default)."""

  def __init__(self, fn, threads: int):
    self.fn, self.threads = fn, threads
    self.tokens, self.compile_s = fn.tokens, fn.compile_s

  def __call__(self):
    torch, _ = torch_modules()
    default = torch.get_num_threads()
    torch.set_num_threads(self.threads or os.cpu_count())
    try:
      self.fn()
    finally:
      torch.set_num_threads(default)


def _with_threads(name: str, fn, args) -> dict[str, Any]:
  """One system per ``--torch_threads`` setting; the ratios use the fastest."""
  # PyTorch's OpenMP threads busy-wait: on a small or shared CPU one thread can
  # beat all cores, so both are timed and the peer gets its better figure.
  return {f"{name}[threads={t or os.cpu_count()}]": _Threads(fn, t)
          for t in args.torch_threads}


def _torch_systems(family, shape, batch, seq, args, dtype="float32"):
  if args.no_torch or torch_modules() is None:
    return {}
  systems = _with_threads(
      "torch_eager", TorchTrain(family, shape, batch, seq, compiled=False, dtype=dtype),
      args)
  if not args.no_compile:
    systems.update(_with_threads(
        "torch_compile", TorchTrain(family, shape, batch, seq, compiled=True, dtype=dtype),
        args))
  return systems


def _suffix(dtype: str) -> str:
  """Measurement-name suffix of a precision: "" for float32, "_bf16"."""
  return "" if dtype == "float32" else "_bf16"


# The reference decoder's train steps of this invocation, by shape, dtype and
# position: the train measurement and the position measurement's rope row time
# one program, built and compiled once.
_LM_TRAINS: dict[tuple, TfxTrain] = {}


def _lm_train(shape: Shape, dtype: str, position: str = "rope") -> TfxTrain:
  key = (shape, dtype, position)
  if key not in _LM_TRAINS:
    _LM_TRAINS[key] = TfxTrain(lm_model(shape, position=position), shape.batch, shape.seq,
                               dtype)
  return _LM_TRAINS[key]


def bench_train(shape: Shape, args) -> list[Record]:
  records = []
  for dtype in args.precision:
    config = dict(model=lm_model(shape), batch=shape.batch, seq=shape.seq, dtype=dtype)
    systems = {"tfx_jax": _lm_train(shape, dtype)}
    systems.update(_torch_systems("decoder_only", shape, shape.batch, shape.seq, args,
                                  dtype))
    times = _alternate(systems, args.rounds, args.warmup, lead_in=1)
    records += _rate_records(f"train_lm{_suffix(dtype)}", systems, times, config)
    records.append(Record("tfx_jax", f"train_lm{_suffix(dtype)}_first_loss",
                          systems["tfx_jax"].losses[0], "nats", config))
  return records


def bench_seq2seq(shape: Shape, args) -> list[Record]:
  model = s2s_model(shape)
  records = []
  for dtype in args.precision:
    config = dict(model=model, batch=shape.batch, seq=shape.s2s_seq, dtype=dtype)
    systems = {"tfx_jax": TfxTrain(model, shape.batch, shape.s2s_seq, dtype)}
    systems.update(_torch_systems("encoder_decoder", shape, shape.batch, shape.s2s_seq,
                                  args, dtype))
    times = _alternate(systems, args.rounds, args.warmup, lead_in=1)
    # Target tokens per second (the source is as long as the target).
    records += _rate_records(f"train_seq2seq{_suffix(dtype)}", systems, times, config)
  return records


def bench_position(shape: Shape, args) -> list[Record]:
  records = []
  for dtype in args.precision:
    systems = {f"tfx_jax[{p}]": _lm_train(shape, dtype, p) for p in ("rope", "t5_bias", "alibi")}
    times = _alternate(systems, args.rounds, args.warmup, lead_in=1)
    config = dict(model=lm_model(shape, position="*"), batch=shape.batch, seq=shape.seq,
                  dtype=dtype)
    records += _rate_records(f"train_position{_suffix(dtype)}", systems, times, config)
  return records


def bench_compile(shape: Shape, args) -> list[Record]:
  out = []
  for scan in (True, False):
    for depth in args.depths:
      model = lm_model(dataclasses.replace(shape, layers=depth), scan_layers=scan)
      run = TfxTrain(model, shape.batch, shape.seq)
      out.append(Record(f"tfx_jax[scan_layers={scan}]", f"compile_{depth}_layers",
                        run.compile_s, "s", dict(model=model, batch=shape.batch,
                                                 seq=shape.seq)))
      print(f"  compile: scan_layers={scan} layers={depth}: {run.compile_s:.1f} s",
            flush=True)
  return out


def bench_fixed(shape: Shape, args) -> list[Record]:
  """A tiny run in a fresh process, twice with one new compilation cache: cold
  (everything compiled) and warm (a repeated shape, as in a sweep)."""
  out = []
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, TFX_JAX_COMPILATION_CACHE=os.path.join(tmp, "xla"))
    for label in ("cold", "warm"):
      workdir = os.path.join(tmp, label)
      cmd = [sys.executable, "-m", "tfx_jax.train", "--config", "configs/lm.py:tiny",
             "--workdir", workdir, "--config.train.num_steps=1",
             "--config.optim.warmup_steps=0"]
      t0 = time.perf_counter()
      # In the repository, whatever the caller's directory: configs/ is there.
      proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
      wall = time.perf_counter() - t0
      if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
        raise RuntimeError("the tiny run failed")
      out.append(Record(f"tfx_jax[{label} compilation cache]", "tiny_run_fixed_cost",
                        wall, "s", dict(command=" ".join(cmd[1:]))))
  return out


def bench_decode(shape: Shape, args) -> list[Record]:
  out = []
  pairs = [("decode_lm", "decoder_only", lm_model(shape)),
           ("decode_seq2seq", "encoder_decoder", s2s_model(shape))]
  for measurement, family, model in pairs:
    systems = {"tfx_jax": TfxDecode(model, args.decode_batch, args.prefix,
                                    args.new_tokens)}
    if not args.no_torch and torch_modules() is not None:
      systems.update(_with_threads("hf_generate", HfDecode(
          family, shape, args.decode_batch, args.prefix, args.new_tokens), args))
    times = _alternate(systems, args.rounds, 1)
    config = dict(model=model, batch=args.decode_batch, prefix=args.prefix,
                  new_tokens=args.new_tokens, greedy=True)
    out += _rate_records(measurement, systems, times, config)
  return out


class _Timed:
  """A callable with the work it does per call (``tokens``: tokens or GFLOP)."""

  def __init__(self, fn, work: float):
    self.fn, self.tokens, self.compile_s = fn, work, 0.0

  def __call__(self):
    self.fn()


def _matmul_shapes(shape: Shape) -> dict[str, tuple[int, int, int, bool, bool]]:
  """(M, K, N, lhs stored transposed, rhs stored transposed) of the reference
  decoder's dense products, as the step holds its operands (T = batch * seq
  tokens; the tied embedding is [V, D])."""
  T, D, F, V = shape.batch * shape.seq, shape.d_model, shape.d_ff, shape.vocab
  return {"logits [T,D]x[V,D]^T": (T, D, V, False, True),
          "logits dX [T,V]x[V,D]": (T, V, D, False, False),
          "logits dW [T,V]^Tx[T,D]": (V, T, D, True, False),
          "ffn in [T,D]x[D,F]": (T, D, F, False, False),
          "ffn dX [T,F]x[D,F]^T": (T, F, D, False, True),
          "ffn dW [T,D]^Tx[T,F]": (D, T, F, True, False),
          "projection [T,D]x[D,D]": (T, D, D, False, False)}


def _attention_systems(shape: Shape, args) -> dict[str, Any]:
  """One causal self-attention's forward and backward at the reference shape."""
  from tfx_jax.model.layers import attention
  B, L, H = shape.batch, shape.seq, shape.heads
  K = shape.d_model // H
  keys = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, g = (jax.random.normal(key, (B, L, H, K)) for key in keys)
  mask = jnp.tril(jnp.ones((L, L), bool))[None, None]
  layer = attention.Attention(attention.AttentionSpec(num_heads=H, num_kv_heads=H, head_dim=K,
                                                      causal=True))
  loss = lambda q, k, v: jnp.sum(layer._attend(q, k, v, mask, None) * g)
  grad = jax.jit(jax.grad(loss, (0, 1, 2)))
  systems = {"tfx_jax": _Timed(lambda: jax.block_until_ready(grad(q, k, v)), B * L)}
  if not args.no_torch and torch_modules() is not None:
    torch, _ = torch_modules()
    tq, tk, tv = (torch.from_numpy(np.asarray(x).transpose(0, 2, 1, 3).copy())
                  .requires_grad_() for x in (q, k, v))
    tg = torch.from_numpy(np.asarray(g).transpose(0, 2, 1, 3).copy())

    def torch_step():
      out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
      torch.autograd.grad((out * tg).sum(), (tq, tk, tv))
    systems.update(_with_threads("torch_sdpa", _Timed(torch_step, B * L), args))
  return systems


def bench_kernels(shape: Shape, args) -> list[Record]:
  records = []
  rng = np.random.default_rng(0)
  for name, (m, k, n, lhs_t, rhs_t) in _matmul_shapes(shape).items():
    a = rng.standard_normal((k, m) if lhs_t else (m, k), np.float32)
    b = rng.standard_normal((n, k) if rhs_t else (k, n), np.float32)
    orient = lambda x, t: x.T if t else x
    product = jax.jit(lambda x, y, lt=lhs_t, rt=rhs_t: orient(x, lt) @ orient(y, rt))
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    gflop = 2 * m * k * n / 1e9
    systems = {"tfx_jax": _Timed(lambda: product(ja, jb).block_until_ready(), gflop)}
    if not args.no_torch and torch_modules() is not None:
      torch, _ = torch_modules()
      ta, tb = orient(torch.from_numpy(a), lhs_t), orient(torch.from_numpy(b), rhs_t)
      systems.update(_with_threads("torch", _Timed(lambda: torch.matmul(ta, tb), gflop),
                                   args))
    times = _alternate(systems, args.rounds, args.warmup, lead_in=2)
    config = dict(m=m, k=k, n=n, lhs_transposed=lhs_t, rhs_transposed=rhs_t)
    for r in _rate_records(f"matmul {name}", systems, times, config):
      records.append(dataclasses.replace(r, unit="GFLOP/s"))
  systems = _attention_systems(shape, args)
  times = _alternate(systems, args.rounds, args.warmup, lead_in=2)
  config = dict(batch=shape.batch, seq=shape.seq, heads=shape.heads,
                head_dim=shape.d_model // shape.heads, causal=True, backward=True)
  return records + _rate_records("attention", systems, times, config)


def _peak_rss_mb() -> float:
  """This process's peak resident memory since it started (MiB).

  Linux: VmHWM, the high-water mark of this program's own memory. Not
  ``ru_maxrss``, which keeps across ``exec`` the peak of the forked parent
  (here the benchmark process itself, larger than the children it measures).
  """
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0  # kB
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def bench_memory(shape: Shape, args) -> list[Record]:
  systems = ["tfx_jax"]
  if not args.no_torch and torch_modules() is not None:
    systems += ["torch_eager"] + ([] if args.no_compile else ["torch_compile"])
  out = []
  for system in systems:
    cmd = [sys.executable, str(SCRIPT), "--_memory_child", system, *_shape_flags(shape)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      print(proc.stderr[-2000:], file=sys.stderr)
      raise RuntimeError(f"memory child {system} failed")
    peak = float(proc.stdout.strip().splitlines()[-1])
    out.append(Record(system, "train_lm_peak_rss", peak, "MiB",
                      dict(model=lm_model(shape), batch=shape.batch, seq=shape.seq)))
  return out


def _memory_child(system: str, shape: Shape) -> None:
  if system == "tfx_jax":
    fn = TfxTrain(lm_model(shape), shape.batch, shape.seq)
  else:
    fn = TorchTrain("decoder_only", shape, shape.batch, shape.seq,
                    compiled=system == "torch_compile")
  for _ in range(3):
    fn()
  print(f"{_peak_rss_mb():.1f}")


# ------------------------------------------------------------------ report
RATIOS = [  # (measurement, numerator, denominator, label)
    ("train_lm", "tfx_jax", "torch_eager", "train: tfx_jax / PyTorch eager"),
    ("train_lm", "tfx_jax", "torch_compile", "train: tfx_jax / torch.compile"),
    ("train_seq2seq", "tfx_jax", "torch_eager", "seq2seq train: tfx_jax / PyTorch eager"),
    ("train_seq2seq", "tfx_jax", "torch_compile", "seq2seq train: tfx_jax / torch.compile"),
    ("train_position", "tfx_jax[t5_bias]", "tfx_jax[rope]", "t5_bias / rope"),
    ("train_position", "tfx_jax[alibi]", "tfx_jax[rope]", "alibi / rope"),
    ("train_lm_bf16", "tfx_jax", "torch_eager", "train bf16: tfx_jax / PyTorch eager"),
    ("train_lm_bf16", "tfx_jax", "torch_compile", "train bf16: tfx_jax / torch.compile"),
    ("train_seq2seq_bf16", "tfx_jax", "torch_eager",
     "seq2seq train bf16: tfx_jax / PyTorch eager"),
    ("train_seq2seq_bf16", "tfx_jax", "torch_compile",
     "seq2seq train bf16: tfx_jax / torch.compile"),
    ("train_position_bf16", "tfx_jax[t5_bias]", "tfx_jax[rope]", "bf16 t5_bias / rope"),
    ("train_position_bf16", "tfx_jax[alibi]", "tfx_jax[rope]", "bf16 alibi / rope"),
    ("attention", "tfx_jax", "torch_sdpa", "attention fwd+bwd: tfx_jax / torch SDPA"),
    ("decode_lm", "tfx_jax", "hf_generate", "decode: tfx_jax / HF generate"),
    ("decode_seq2seq", "tfx_jax", "hf_generate", "seq2seq decode: tfx_jax / HF generate"),
]


def ratio_table(records: list[Record]) -> list[tuple[str, float]]:
  """Median ratios; a peer timed at several thread counts counts at its fastest."""
  def best(measurement, system):
    values = [r.value for r in records if r.measurement == measurement and (
        r.system == system or r.system.startswith(system + "[threads="))]
    return max(values) if values else None

  out = []
  for m, a, b, label in RATIOS:
    num, den = best(m, a), best(m, b)
    if num is not None and den is not None:
      out.append((label, num / den))
  # The same system in both precisions: what bf16 buys each side.
  for m in ("train_lm", "train_seq2seq"):
    for system, name in (("tfx_jax", "tfx_jax"), ("torch_eager", "PyTorch eager"),
                         ("torch_compile", "torch.compile")):
      num, den = best(m + "_bf16", system), best(m, system)
      if num is not None and den is not None:
        what = "train" if m == "train_lm" else "seq2seq train"
        out.append((f"{what}: {name} bf16 / float32", num / den))
  return out


def print_tables(records: list[Record]) -> None:
  print("\n| measurement | system | median | min-max | unit | rounds |")
  print("|---|---|---|---|---|---|")
  for r in records:
    spread = f"{r.min:.4g}-{r.max:.4g}" if r.min is not None else ""
    print(f"| {r.measurement} | {r.system} | {r.value:.4g} | {spread} | {r.unit} | "
          f"{r.rounds} |")
  ratios = ratio_table(records)
  if ratios:
    print("\n| ratio (medians) | value |")
    print("|---|---|")
    for label, value in ratios:
      print(f"| {label} | {value:.2f}x |")


def _shape_flags(shape: Shape) -> list[str]:
  return [f"--{f.name}={getattr(shape, f.name)}" for f in dataclasses.fields(Shape)]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--only", default=",".join(MEASUREMENTS),
                 help=f"comma-separated subset of {','.join(MEASUREMENTS)}")
  p.add_argument("--quick", action="store_true",
                 help=f"smaller shapes ({QUICK}), 3 rounds, depths 2,8, no torch.compile")
  for f in dataclasses.fields(Shape):
    p.add_argument(f"--{f.name}", type=int, default=None)
  p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7)")
  p.add_argument("--warmup", type=int, default=2, help="untimed calls per system")
  p.add_argument("--depths", default=None, help="compile: layer counts (default 2,8,24)")
  p.add_argument("--decode_batch", type=int, default=4)
  p.add_argument("--prefix", type=int, default=32)
  p.add_argument("--new_tokens", type=int, default=None, help="decode (default 64)")
  p.add_argument("--no_torch", action="store_true", help="time tfx_jax only")
  p.add_argument("--no_compile", action="store_true", help="skip torch.compile")
  p.add_argument("--torch_threads", default="0,1",
                 help="torch intra-op thread counts to time (0 = all cores)")
  p.add_argument("--precision", default="float32,bfloat16",
                 help="training rows in these compute dtypes (float32, bfloat16)")
  p.add_argument("--json", default=None, help="write the records here")
  p.add_argument("--_memory_child", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  base = dict(QUICK) if args.quick else {}
  for f in dataclasses.fields(Shape):
    if getattr(args, f.name) is not None:
      base[f.name] = getattr(args, f.name)
  shape = Shape(**base)
  args.rounds = args.rounds or (3 if args.quick else 7)
  args.depths = [int(d) for d in (args.depths or ("2,8" if args.quick else "2,8,24"))
                 .split(",")]
  args.new_tokens = args.new_tokens or (16 if args.quick else 64)
  args.no_compile = args.no_compile or args.quick
  args.torch_threads = [int(t) for t in args.torch_threads.split(",")]
  args.precision = [d for d in args.precision.split(",") if d]
  bad = set(args.precision) - {"float32", "bfloat16"}
  if bad or not args.precision:
    p.error(f"--precision: unknown {sorted(bad)}; choose from float32,bfloat16")
  args.only = [m for m in args.only.split(",") if m]
  unknown = set(args.only) - set(MEASUREMENTS)
  if unknown:
    p.error(f"--only: unknown {sorted(unknown)}; choose from {','.join(MEASUREMENTS)}")
  return args, shape


def cpu_bf16_units(cpuinfo: str | None = None) -> dict:
  """The CPU model and its bf16 instructions, from /proc/cpuinfo (Linux):
  ``amx_bf16`` (AMX tiles: bf16 matrix units) and ``avx512_bf16`` (bf16 dot
  products in AVX-512); None where unknown."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      return {"amx_bf16": None, "avx512_bf16": None}
  out: dict[str, Any] = {"amx_bf16": None, "avx512_bf16": None}
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    if key.strip() == "model name" and "machine" not in out:
      out["machine"] = value.strip()
    if key.strip() == "flags" and out["amx_bf16"] is None:
      flags = set(value.split())
      out["amx_bf16"] = "amx_bf16" in flags
      out["avx512_bf16"] = "avx512_bf16" in flags
  return out


def environment() -> dict:
  env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "machine": platform.processor() or platform.machine(),
         "cpus": os.cpu_count(), "jax": jax.__version__,
         "device": jax.devices()[0].device_kind,
         "load_average": os.getloadavg()[0]}
  env.update(cpu_bf16_units())
  t = torch_modules()
  if t is not None:
    env.update(torch=t[0].__version__, transformers=t[1].__version__,
               torch_threads=t[0].get_num_threads())
  return env


def main(argv=None) -> list[Record]:
  args, shape = parse_args(argv)
  if args._memory_child:
    _memory_child(args._memory_child, shape)
    return []
  env = environment()
  print(" ".join(f"{k}={v}" for k, v in env.items()))
  if not args.no_torch and torch_modules() is None:
    print("torch/transformers not installed: timing tfx_jax only "
          "(pip install torch==2.13.0 && pip install -e .[bench])")
  print(f"shape: {shape}; rounds {args.rounds}", flush=True)
  benches: dict[str, Callable[[Shape, Any], list[Record]]] = {
      "train": bench_train, "seq2seq": bench_seq2seq, "position": bench_position,
      "compile": bench_compile, "fixed": bench_fixed, "decode": bench_decode,
      "memory": bench_memory, "kernels": bench_kernels}
  records: list[Record] = []
  _LM_TRAINS.clear()  # main() may run again in one process (the tests)
  for name in args.only:
    t0 = time.perf_counter()
    new = benches[name](shape, args)
    records += new
    print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    for r in new:
      print(f"  {r.measurement} {r.system}: {r.value:.4g} {r.unit}", flush=True)
    if args.json:  # after every measurement: a later failure keeps these
      with open(args.json, "w") as f:
        json.dump({"environment": env,
                   "records": [dataclasses.asdict(r) for r in records],
                   "ratios": dict(ratio_table(records))}, f, indent=1)
  print_tables(records)
  _LM_TRAINS.clear()
  return records


if __name__ == "__main__":
  main()
