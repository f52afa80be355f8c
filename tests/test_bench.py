"""``python benchmarks/bench.py`` end to end on a tiny shape: it runs, from any
directory, and its JSON holds one record per system and measurement."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench.py"


def _load_script(path: pathlib.Path):
  """The script at ``path`` as a module (it is no part of the package), with its
  directory on sys.path for its sibling modules, as ``python path`` has it."""
  sys.path.insert(0, str(path.parent))
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


bench = _load_script(SCRIPT)

TINY = ["--vocab=64", "--d_model=32", "--layers=1", "--heads=2", "--d_ff=32", "--seq=16",
        "--batch=2", "--s2s_layers=1", "--s2s_d_ff=32", "--s2s_seq=8", "--rounds=1",
        "--warmup=1", "--decode_batch=1", "--prefix=4", "--new_tokens=4",
        "--torch_threads=0", "--no_compile"]
HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


@pytest.mark.slow
def test_bench_tiny_end_to_end(tmp_path, capsys, monkeypatch):
  built = []

  class CountedTfxTrain(bench.TfxTrain):
    def __init__(self, model, *args, **kwargs):
      built.append((model["family"], model["position"]))
      super().__init__(model, *args, **kwargs)

  monkeypatch.setattr(bench, "TfxTrain", CountedTfxTrain)
  path = tmp_path / "bench.json"
  bench.main(["--only=train,seq2seq,position,decode", "--precision=float32",
              f"--json={path}", *TINY])
  # The train measurement and the position measurement's rope row time one
  # program, built and compiled once.
  assert sorted(built) == [("decoder_only", "alibi"), ("decoder_only", "rope"),
                           ("decoder_only", "t5_bias"), ("encoder_decoder", "t5_bias")]
  out = json.loads(path.read_text())
  records = out["records"]
  for r in records:
    assert set(r) >= {"system", "measurement", "value", "unit", "config"}
    assert r["value"] > 0, r
  pairs = {(r["measurement"], r["system"]) for r in records}
  expected = {("train_lm", "tfx_jax"), ("train_seq2seq", "tfx_jax"),
              ("train_position", "tfx_jax[rope]"), ("train_position", "tfx_jax[t5_bias]"),
              ("train_position", "tfx_jax[alibi]"), ("decode_lm", "tfx_jax"),
              ("decode_seq2seq", "tfx_jax")}
  assert expected <= pairs
  assert len(pairs) == len(records)  # one record per system and measurement
  rate = next(r for r in records if r["measurement"] == "train_lm")
  assert rate["unit"] == "tokens/s" and rate["config"]["batch"] == 2
  labels = dict(out["ratios"])
  assert "t5_bias / rope" in labels and "alibi / rope" in labels
  if HAS_TORCH:
    assert ("train_lm", "torch_eager[threads=%d]" % bench.os.cpu_count()) in pairs
    assert "train: tfx_jax / PyTorch eager" in labels
  else:
    print("torch/transformers not installed: the PyTorch side was skipped")
  assert "| ratio (medians) | value |" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_runs_as_a_script_from_another_directory(tmp_path):
  # `memory` runs the script again, by its own path, in one child per system.
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
  proc = subprocess.run(
      [sys.executable, str(SCRIPT), "--only=memory", "--json=bench.json", *TINY],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  out = json.loads((tmp_path / "bench.json").read_text())  # --json: the caller's path
  records = out["records"]
  assert {r["system"] for r in records} == (
      {"tfx_jax", "torch_eager"} if HAS_TORCH else {"tfx_jax"})
  for r in records:
    assert r["measurement"] == "train_lm_peak_rss" and r["unit"] == "MiB", r
    assert 0 < r["value"] < 4096, r
    assert r["config"]["batch"] == 2 and r["config"]["model"]["d_model"] == 32
  assert out["environment"]["cpus"] == os.cpu_count()
  assert "| train_lm_peak_rss | tfx_jax |" in proc.stdout
  # `fixed` trains configs/lm.py:tiny in the repository the script belongs to.
  assert (bench.ROOT / "configs" / "lm.py").is_file()


def test_peak_memory_is_the_measured_process_own_not_its_parents():
  # A forked child keeps its parent's ru_maxrss across exec; the benchmark's
  # memory children must report their own peak. The parent here holds 1 GiB.
  ballast = b"\x01" * (1 << 30)
  proc = subprocess.run(
      [sys.executable, "-c", "from bench import _peak_rss_mb; print(_peak_rss_mb())"],
      cwd=SCRIPT.parent, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert float(proc.stdout.split()[-1]) < 700 < len(ballast) / 2**20


@pytest.mark.slow
def test_bench_kernels_rates_every_product_and_the_attention(tmp_path):
  path = tmp_path / "bench.json"
  bench.main(["--only=kernels", f"--json={path}", *TINY])
  records = json.loads(path.read_text())["records"]
  products = bench._matmul_shapes(bench.Shape(vocab=64, d_model=32, d_ff=32, seq=16,
                                               batch=2))
  tfx = {r["measurement"]: r for r in records if r["system"] == "tfx_jax"}
  assert set(tfx) == {f"matmul {name}" for name in products} | {"attention"}
  for name, (m, k, n, lhs_t, rhs_t) in products.items():
    r = tfx[f"matmul {name}"]
    assert r["unit"] == "GFLOP/s" and r["value"] > 0
    assert r["config"] == dict(m=m, k=k, n=n, lhs_transposed=lhs_t, rhs_transposed=rhs_t)
  assert tfx["attention"]["unit"] == "tokens/s" and tfx["attention"]["config"]["causal"]
  if HAS_TORCH:
    peers = {r["measurement"] for r in records if r["system"].startswith("torch")}
    assert peers == set(tfx)
    assert "attention fwd+bwd: tfx_jax / torch SDPA" in json.loads(path.read_text())["ratios"]


def test_each_timed_call_follows_untimed_calls_of_the_same_system():
  calls = []

  class System:
    def __init__(self, name):
      self.name = name

    def __call__(self):
      calls.append(self.name)

  times = bench._alternate({"a": System("a"), "b": System("b")}, rounds=2, warmup=1,
                           lead_in=2)
  assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}
  # warm-up of each, then per round: a's lead-in and timed call, then b's.
  assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3


@pytest.mark.slow
def test_bench_bf16_rows_against_pytorch_autocast(tmp_path):
  """``--precision`` adds ``*_bf16`` rows: tfx_jax with compute_dtype=bfloat16
  against PyTorch under autocast, and each side's bf16 / float32 ratio; the
  environment says whether the CPU has bf16 units."""
  path = tmp_path / "bench.json"
  bench.main(["--only=train", "--precision=float32,bfloat16", f"--json={path}", *TINY])
  out = json.loads(path.read_text())
  rows = {(r["measurement"], r["system"]): r for r in out["records"]}
  bf16 = rows[("train_lm_bf16", "tfx_jax")]
  assert bf16["config"]["dtype"] == "bfloat16" and bf16["value"] > 0
  assert rows[("train_lm", "tfx_jax")]["config"]["dtype"] == "float32"
  # Random tokens over 64 ids: the first loss is about ln 64 in either precision.
  assert abs(rows[("train_lm_bf16_first_loss", "tfx_jax")]["value"] - math.log(64)) < 0.3
  assert "train: tfx_jax bf16 / float32" in out["ratios"]
  assert {"amx_bf16", "avx512_bf16", "machine"} <= set(out["environment"])
  if HAS_TORCH:
    assert ("train_lm_bf16", "torch_eager[threads=%d]" % bench.os.cpu_count()) in rows
    assert "train bf16: tfx_jax / PyTorch eager" in out["ratios"]
    assert "train: PyTorch eager bf16 / float32" in out["ratios"]


def test_bf16_units_are_read_from_cpuinfo():
  info = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
          "flags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n\n"
          "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
          "flags\t\t: fpu sse\n")
  assert bench.cpu_bf16_units(info) == {"machine": "Intel(R) Xeon(R) Platinum 8480+",
                                        "amx_bf16": True, "avx512_bf16": True}
  amd = "model name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n"
  assert bench.cpu_bf16_units(amd) == {"machine": "AMD EPYC", "amx_bf16": False,
                                       "avx512_bf16": True}
  assert bench.cpu_bf16_units("") == {"amx_bf16": None, "avx512_bf16": None}


def test_bad_precision_is_refused():
  with pytest.raises(SystemExit):
    bench.parse_args(["--precision=float16"])


mfu = _load_script(ROOT / "benchmarks" / "mfu.py")


@pytest.mark.slow
def test_mfu_counts_palm_flops_and_reads_known_peaks(tmp_path):
  """``benchmarks/mfu.py`` on CPU: the project's step on the tiny LM, its
  FLOPs per token by PaLM's count (6 N + 12 L H Q T, the position table not
  in N), and no MFU without a known peak."""
  path = tmp_path / "mfu.json"
  r, learned = mfu.main(["--config", str(ROOT / "configs" / "lm.py") + ":tiny", "--batch",
                          "2", "--steps", "1", "--warmup", "1", "--variant",
                          "small:model.num_layers=1,model.d_model=32", "--variant",
                          "learned:model.num_layers=1,model.d_model=32,model.position=learned",
                          "--json", str(path)])
  # A learned position table is a lookup: not counted.
  assert learned["matmul_params"] == r["matmul_params"]
  assert [x["variant"] for x in json.loads(path.read_text())] == ["small", "learned"]
  # Tied 1024 x 32 table, one pre-norm layer of d 32 (4 x 32^2 attention, 2 x 32 x
  # d_ff FFN with biases off), final norm; rope: no position table.
  assert r["flops_per_token"] == 6 * r["matmul_params"] + 12 * 1 * 32 * r["seq"]
  assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["compute_dtype"] == "float32"
  assert mfu.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
  assert mfu.peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
  assert mfu.peak_tflops("NVIDIA A100-SXM4-80GB", "float32") == 156.0
  assert mfu.peak_tflops("cpu", "bfloat16") is None


sweep_cost = _load_script(ROOT / "benchmarks" / "sweep_cost.py")


def test_sweep_cost_passes_the_ladder_its_flags_and_refuses_them_elsewhere(capsys):
  """``--only ladder`` hands the ladder's own flags to benchmarks/ladder_cost.py,
  which checks them (an unknown arm exits 2 before any sweep runs); with other
  sweeps they are refused."""
  with pytest.raises(SystemExit) as exit_:
    sweep_cost.main(["--only", "ladder", "--tokens-per-param", "4,8", "--arms", "bogus"])
  assert exit_.value.code == 2
  assert "--arms bogus: choose from per-rung, transfer, branched, shared" in capsys.readouterr().err
  with pytest.raises(SystemExit) as exit_:
    sweep_cost.main(["--only", "grid", "--tokens-per-param", "4,8"])
  assert exit_.value.code == 2
  assert "the ladder's flags need --only ladder alone" in capsys.readouterr().err
