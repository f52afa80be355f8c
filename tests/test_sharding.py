"""One code path from 1 device to a mesh: 8 fake CPU devices give the same loss.

The multi-device runs happen in a subprocess, because the device count must be
fixed (XLA_FLAGS) before JAX is imported.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from tfx_jax import config_base, run_setup, sharding
    c = config_base.base_config()
    c.model.update(dict(family="decoder_only", num_layers=2, d_model=32, num_heads=4,
                        num_kv_heads=2, d_ff=64, vocab_size=64, max_len=16,
                        position="rope", activation="swiglu", scan_layers=True))
    c.train.update(batch_size=8, seq_len=16, num_steps=3)
    c.optim.update(warmup_steps=1, learning_rate=1e-2)
    c.mesh.update(json.loads(sys.argv[1]))
    model_cfg = run_setup.validate_run_config(c)
    setup = run_setup.ShardedRun(c, model_cfg)
    state = setup.init_state()
    train_step, eval_step = setup.compile_steps()
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(3):
      ids = rng.integers(5, 64, size=(8, 17)).astype(np.int32)
      batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:],
               "segment_ids": np.ones((8, 16), np.int32),
               "positions": np.tile(np.arange(16, dtype=np.int32), (8, 1)),
               "weights": np.ones((8, 16), np.float32)}
      state, m = train_step(state, sharding.global_batch(batch, setup.mesh))
      losses.append(float(m["loss"]))
    kernel = state.params["decoder"]["layers"]["ffn"]["wi"]["kernel"]
    print(json.dumps({"losses": losses, "devices": len(jax.devices()),
                      "kernel_spec": str(kernel.sharding.spec)}))
""")


def _run(mesh: dict, devices: int) -> dict:
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(mesh)], env=env,
                       capture_output=True, text=True, check=True, timeout=300,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_eight_fake_devices_match_one_device():
  one = _run({"data": -1, "fsdp": 1, "tensor": 1}, 1)
  data = _run({"data": -1, "fsdp": 1, "tensor": 1}, 8)
  mixed = _run({"data": 2, "fsdp": 2, "tensor": 2}, 8)
  assert one["devices"] == 1 and data["devices"] == 8
  # Parameters really are sharded over fsdp (embed) and tensor (mlp) axes.
  assert "fsdp" in mixed["kernel_spec"] and "tensor" in mixed["kernel_spec"]
  for other in (data, mixed):
    for a, b in zip(one["losses"], other["losses"]):
      assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
