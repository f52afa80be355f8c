"""One code path from 1 device to a mesh, and checkpoints that move between meshes.

Data-parallel, FSDP, tensor-parallel and mixed meshes on fake CPU devices give
the one-device losses, with every parameter (and its optimizer moments) sharded
as ``sharding.LOGICAL_RULES`` says. A checkpoint saved on 8 devices as 2x2x2
restores with identical values on 1 device and on 2 processes, whose
checkpoint restores on 8 devices again.

The multi-device runs happen in subprocesses, because the device count must be
fixed (XLA_FLAGS) before JAX is imported.
"""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from helpers import free_port

# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = pytest.mark.xdist_group("processes")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SETUP = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from tfx_jax.run import config_base
    from tfx_jax.run import config as run_config
    from tfx_jax.run import setup as run_setup
    from tfx_jax.run import sharding

    def make_run(mesh):
      c = config_base.base_config()
      c.model.update(dict(family="decoder_only", num_layers=2, d_model=32, num_heads=4,
                          num_kv_heads=2, d_ff=64, vocab_size=64, max_len=16,
                          position="rope", activation="swiglu", scan_layers=True))
      c.train.update(batch_size=8, seq_len=16, num_steps=3)
      c.optim.update(warmup_steps=1, learning_rate=1e-2)
      c.mesh.update(mesh)
      return run_setup.ShardedRun(r := run_config.resolve(c), r.model)

    def batches(n):
      rng = np.random.default_rng(0)
      for _ in range(n):
        ids = rng.integers(5, 64, size=(8, 17)).astype(np.int32)
        yield {"inputs": ids[:, :-1], "targets": ids[:, 1:],
               "segment_ids": np.ones((8, 16), np.int32),
               "positions": np.tile(np.arange(16, dtype=np.int32), (8, 1)),
               "weights": np.ones((8, 16), np.float32)}
""")

# argv[1]: JSON list of meshes, each trained for 3 steps from the same init.
_TRAIN = _SETUP + textwrap.dedent("""
    import flax
    out = []
    for mesh in json.loads(sys.argv[1]):
      setup = make_run(mesh)
      state = setup.init_state()
      train_step, _ = setup.compile_steps()
      losses = []
      for batch in batches(3):
        state, m = train_step(state, sharding.global_batch(batch, setup.mesh),
                              setup.step_hparams())
        losses.append(float(m["loss"]))
      flat = flax.traverse_util.flatten_dict(state.params, sep="/")
      mu = flax.traverse_util.flatten_dict(state.opt_state[1][0].mu, sep="/")
      params = {k: {"shape": list(v.shape), "spec": [a if a is None or isinstance(a, str)
                                                     else list(a) for a in v.sharding.spec],
                    "shard": list(v.addressable_shards[0].data.shape),
                    "mu_spec_same": mu[k].sharding.spec == v.sharding.spec}
                for k, v in flat.items()}
      out.append({"losses": losses, "devices": len(jax.devices()),
                  "mesh": dict(setup.mesh.shape), "params": params})
    print(json.dumps(out))
""")


def _run(script, args, devices: int, env=None, **kwargs) -> subprocess.Popen:
  env = dict(os.environ, **(env or {}), PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return subprocess.Popen([sys.executable, "-c", script, *args], env=env, cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs)


def _output(proc: subprocess.Popen) -> str:
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-4000:]
  return out.strip().splitlines()[-1] if out.strip() else ""


def _train(meshes: list[dict], devices: int) -> subprocess.Popen:
  return _run(_TRAIN, [json.dumps(meshes)], devices)


# The rules, restated: logical axis -> mesh axis (docs/scale.md, "Meshes and logical axis names").
RULES = {"embed": "fsdp", "mlp": "tensor", "heads": "tensor", "vocab": "tensor"}
NAMES = {"kernel": {"wi": ("layers", "embed", "mlp"), "wv": ("layers", "embed", "mlp"),
                    "wo": ("layers", "mlp", "embed"),
                    "query": ("layers", "embed", "heads", "kv"),
                    "key": ("layers", "embed", "heads", "kv"),
                    "value": ("layers", "embed", "heads", "kv"),
                    "out": ("layers", "heads", "kv", "embed")},
         "embedding": ("vocab", "embed")}


def _expected_names(path: str):
  parts = path.split("/")
  if parts[-1] == "kernel":
    return NAMES["kernel"][parts[-2]]
  if parts[-1] == "embedding":
    return NAMES["embedding"]
  return None  # biases and norms: checked through their shard shapes only


@pytest.mark.slow
def test_data_fsdp_tensor_and_mixed_meshes_match_one_device():
  runs = [_train([{"data": -1, "fsdp": 1, "tensor": 1}], 1),
          _train([{"data": -1, "fsdp": 1, "tensor": 1}, {"data": 1, "fsdp": -1, "tensor": 1},
                  {"data": 2, "fsdp": 2, "tensor": 2}], 8),
          _train([{"data": 1, "fsdp": 1, "tensor": -1}], 2)]
  [one], eight, [tensor] = (json.loads(_output(proc)) for proc in runs)
  assert one["devices"] == 1 and eight[0]["devices"] == 8 and tensor["devices"] == 2
  for run in (*eight, tensor):
    for a, b in zip(one["losses"], run["losses"]):
      # Sums over shards in another order: float32 rounding only.
      assert a == pytest.approx(b, rel=1e-5, abs=1e-6), run["mesh"]
    mesh = run["mesh"]
    for path, p in run["params"].items():
      names = _expected_names(path)
      if names is not None:
        assert p["spec"][:len(names)] + [None] * (len(names) - len(p["spec"])) == [
            RULES.get(n) for n in names], (mesh, path, p["spec"])
      # Each device holds its block: every dimension divided by its mesh axes.
      divisors = [1 if a is None else math.prod(mesh[x] for x in ([a] if isinstance(a, str)
                                                                 else a))
                  for a in p["spec"]] + [1] * (len(p["shape"]) - len(p["spec"]))
      assert p["shard"] == [d // k for d, k in zip(p["shape"], divisors)], (mesh, path)
      assert p["mu_spec_same"], (mesh, path)  # Adam's moments are sharded as the params
  mixed = eight[2]["params"]["decoder/layers/ffn/wi/kernel"]
  assert mixed["spec"] == [None, "fsdp", "tensor"] and mixed["shard"] == [2, 16, 24]
  assert eight[0]["params"]["embedding/embedding"]["shard"] == [64, 32]  # replicated


# argv: mode (save | restore | restore_save), checkpoint dir, mesh JSON, values .npz,
# then for two processes: coordinator port, process id.
_RESTORE = _SETUP + textwrap.dedent("""
    mode, directory, mesh, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    if len(sys.argv) > 5:
      jax.distributed.initialize(f"127.0.0.1:{sys.argv[5]}", 2, int(sys.argv[6]))
    from jax.experimental import multihost_utils
    from tfx_jax.run import checkpoint
    setup = make_run(mesh)

    def host_values(state):
      leaves = jax.tree_util.tree_flatten_with_path(state)[0]
      return {jax.tree_util.keystr(k): np.asarray(multihost_utils.process_allgather(v, tiled=True))
              for k, v in leaves}

    if mode == "save":
      state = setup.init_state()
      train_step = setup.train_step()
      for batch in batches(2):
        state, _ = train_step(state, sharding.global_batch(batch, setup.mesh),
                              setup.step_hparams())
      with checkpoint.Checkpointer(directory) as ckpt:
        ckpt.save(2, state, {"position": 2}, {"mesh": str(mesh)})
      np.savez(values, **host_values(state))
    else:
      with checkpoint.Checkpointer(directory) as ckpt:
        restored = ckpt.restore(abstract_state=setup.abstract_state)
      state = restored.state
      want = np.load(values)
      got = host_values(state)
      assert sorted(got) == sorted(want.files)
      for k in want.files:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
      assert restored.data_state == {"position": 2}
      leaf = state.params["decoder"]["layers"]["ffn"]["wi"]["kernel"]
      assert leaf.sharding.mesh.shape == setup.mesh.shape, leaf.sharding
      if mode == "restore_save":
        with checkpoint.Checkpointer(directory + "_moved") as ckpt:
          ckpt.save(2, state, restored.data_state, restored.config)
      print(json.dumps({"process": jax.process_index(), "devices": len(jax.devices()),
                        "mesh": dict(setup.mesh.shape), "leaves": len(got)}))
""")


@pytest.mark.slow
def test_checkpoint_restores_across_meshes_and_process_counts(tmp_path):
  ckpt, values = str(tmp_path / "ckpt"), str(tmp_path / "values.npz")
  mixed = json.dumps({"data": 2, "fsdp": 2, "tensor": 2})
  _output(_run(_RESTORE, ["save", ckpt, mixed, values], 8))
  # 8 devices (2x2x2) -> 1 device, and -> 2 processes of one device (fsdp=2),
  # which save it again, all together; that checkpoint restores on 8 devices.
  one = _run(_RESTORE, ["restore", ckpt, json.dumps({"data": -1, "fsdp": 1, "tensor": 1}),
                        values], 1)
  port = str(free_port())
  two = [_run(_RESTORE, ["restore_save", ckpt, json.dumps({"data": 1, "fsdp": 2,
                                                           "tensor": 1}),
                         values, port, str(i)], 1) for i in range(2)]
  got = [json.loads(_output(p)) for p in (one, *two)]
  assert [g["devices"] for g in got] == [1, 2, 2]
  # Meshes given without an expert axis have one of size 1 (sharding.mesh_sizes).
  assert got[1]["mesh"] == {"data": 1, "fsdp": 2, "tensor": 1, "expert": 1}
  assert got[1]["leaves"] > 20
  back = json.loads(_output(_run(_RESTORE, ["restore", ckpt + "_moved", mixed, values], 8)))
  assert back["devices"] == 8 and back["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2,
                                                   "expert": 1}


def test_summary_shows_each_parameters_sharding_and_the_memory_per_device():
  proc = subprocess.run(
      [sys.executable, "-m", "tfx_jax.summary", "--config", "configs/lm.py:llama_7b",
       "--mesh", "data=2,fsdp=2,tensor=2"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  row = next(l for l in lines if l.startswith("decoder/layers/ffn/wi/kernel "))
  assert row.split()[-6:] == ["(None,", "fsdp,", "tensor)", "(32,", "2048,", "5504)"]
  # 6,738,415,616 float32 parameters, nearly all split 4 ways (fsdp x tensor);
  # AdamW keeps two moments of each, sharded the same way.
  assert lines[-2] == "per device: params 6.28 GiB  optimizer 12.55 GiB"
  assert "(8 devices)" in lines[-3]
  bad = subprocess.run(
      [sys.executable, "-m", "tfx_jax.summary", "--config", "configs/lm.py:tiny",
       "--mesh", "data=2,fsdq=2"], cwd=ROOT, capture_output=True, text=True,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"), timeout=300)
  assert bad.returncode == 2 and "fsdq" in bad.stderr and "Traceback" not in bad.stderr
