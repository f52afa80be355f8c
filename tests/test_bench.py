"""``python -m tfx_jax.bench`` end to end on a tiny shape: it runs and its JSON holds
one record per system and measurement."""

import importlib.util
import json

from tfx_jax import bench

TINY = ["--vocab=64", "--d_model=32", "--layers=1", "--heads=2", "--d_ff=32", "--seq=16",
        "--batch=2", "--s2s_layers=1", "--s2s_d_ff=32", "--s2s_seq=8", "--rounds=1",
        "--warmup=1", "--decode_batch=1", "--prefix=4", "--new_tokens=4",
        "--torch_threads=0", "--no_compile"]
HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


def test_bench_tiny_end_to_end(tmp_path, capsys):
  path = tmp_path / "bench.json"
  bench.main(["--only=train,seq2seq,position,decode", f"--json={path}", *TINY])
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
