"""Model FLOPs utilisation of a training step on one accelerator.

  python benchmarks/mfu.py --config configs/lm.py:gpt2_small
  python benchmarks/mfu.py --config configs/lm.py:gpt2_small --batch 16,32 \
      --variant preset --variant no-dropout:model.dropout=0,model.attention_dropout=0
  python benchmarks/mfu.py ... --peak-tflops 989.4 --json mfu.json

The step is the project's own (``run_setup.ShardedRun.train_step``: jitted,
donated, AdamW, gradient clipping, the config's ``compute_dtype``), on random
tokens at the config's sequence length, timed over ``--steps`` steps after
``--warmup`` (compilation excluded and reported).

Model FLOPs per token follow PaLM (Chowdhery et al. 2022, Appendix B):
6 N + 12 L H Q T (``tfx_jax/scale/flops.py``, shared with
``python -m tfx_jax.compile``). MFU is the model FLOPs per second over the
device's peak dense rate: ``--peak-tflops``, or a known device's from the chip
table ``tfx_jax/scale/chips.py`` (H100 SXM and H200: 989.4 TFLOP/s bf16, 494.7
tf32; A100: 312 / 156; the Cloud TPUs).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from tfx_jax.scale import chips  # noqa: E402
from tfx_jax.scale.flops import flops_per_token, matmul_params  # noqa: E402  (re-exported)


def peak_tflops(device_kind: str, dtype: str) -> float | None:
  """The dense peak of a known device (``scale/chips.py``) for ``dtype``, or None."""
  chip = chips.chip_of(device_kind)
  return None if chip is None else chip.peak_tflops(dtype)


def measure(spec: str, overrides: dict, batch: int, steps: int, warmup: int) -> dict:
  from systems import _random_batch  # pylint: disable=import-outside-toplevel
  from tfx_jax.run import sharding as sharding_lib
  from tfx_jax.run.config_base import apply_overrides, load_config_file
  from tfx_jax.run.config import resolve
  from tfx_jax.run.setup import ShardedRun

  config = load_config_file(spec)
  apply_overrides(config, {"train.batch_size": batch, **overrides})
  resolved = resolve(config)
  model_cfg = resolved.model
  seq = resolved.train.seq_len
  run = ShardedRun(resolved, model_cfg)
  state = run.init_state()
  n_params = matmul_params(state.params, model_cfg)
  data = sharding_lib.global_batch(
      _random_batch(model_cfg.family, batch, seq, model_cfg.vocab_size), run.mesh)
  t0 = time.perf_counter()
  hparams = run.step_hparams()
  step = run.train_step().lower(state, data, hparams).compile()
  compile_s = time.perf_counter() - t0
  for _ in range(warmup):
    state, metrics = step(state, data, hparams)
  float(metrics["loss"])
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, data, hparams)
  loss = float(metrics["loss"])  # waits for the last step
  seconds = (time.perf_counter() - t0) / steps
  tokens_per_s = batch * seq / seconds
  fpt = flops_per_token(n_params, model_cfg, seq)
  dtype = resolved.compute_dtype
  device = jax.devices()[0].device_kind
  return {"config": spec, "overrides": overrides, "batch": batch, "seq": seq,
          "compute_dtype": dtype, "device": device, "matmul_params": n_params,
          "flops_per_token": fpt, "step_ms": seconds * 1e3, "tokens_per_s": tokens_per_s,
          "model_tflops": tokens_per_s * fpt / 1e12, "compile_s": compile_s,
          "final_loss": loss}


def parse_variant(text: str) -> tuple[str, dict]:
  """``name:field=value,field=value`` (or ``name`` alone: no overrides)."""
  name, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    field, sep, value = item.partition("=")
    if not sep:
      raise SystemExit(f"--variant {text!r}: {item!r} is not field=value")
    overrides[field] = value
  return name, overrides


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/lm.py:gpt2_small")
  p.add_argument("--batch", default="16", help="comma-separated batch sizes")
  p.add_argument("--variant", action="append", default=None,
                 help="name[:field=value,...]; repeatable (default: the preset as it is)")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--peak-tflops", type=float, default=None)
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  variants = [parse_variant(v) for v in (args.variant or ["preset"])]
  records = []
  for name, overrides in variants:
    for batch in (int(b) for b in args.batch.split(",")):
      try:
        r = measure(args.config, overrides, batch, args.steps, args.warmup)
      except Exception as e:  # an out-of-memory batch must not lose the others
        print(f"{name} batch {batch}: failed: {type(e).__name__}: {str(e)[:300]}",
              flush=True)
        continue
      peak = args.peak_tflops or peak_tflops(r["device"], r["compute_dtype"])
      r.update(variant=name, peak_tflops=peak,
               mfu=None if peak is None else r["model_tflops"] / peak)
      records.append(r)
      print(json.dumps(r), flush=True)
  print(f"\n{'variant':<14} {'batch':>5} {'dtype':<9} {'step ms':>8} {'tokens/s':>10} "
        f"{'TFLOP/s':>8} {'MFU':>6}  compile s")
  for r in records:
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    print(f"{r['variant']:<14} {r['batch']:>5} {r['compute_dtype']:<9} {r['step_ms']:>8.1f} "
          f"{r['tokens_per_s']:>10,.0f} {r['model_tflops']:>8.1f} {mfu:>6}  "
          f"{r['compile_s']:.0f}")
  if records:
    print(f"device: {records[0]['device']}; model FLOPs/token "
          f"{records[0]['flops_per_token'] / 1e9:.3f} G ({records[0]['matmul_params']:,} "
          f"matmul parameters); peak {records[0]['peak_tflops']} TFLOP/s")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(records, indent=1))
  return records


if __name__ == "__main__":
  main()
