"""``python -m tfx_jax.compile``: a run compiled ahead of time for a machine.

The TPU tests compile for compile-only TPU devices with libtpu on this CPU
(the ``tpu-aot`` extra) and are skipped without it; the cpu-N path, the
topology names, and the HLO counts are checked without libtpu.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tfx_jax import compile as compile_cmd
from tfx_jax.scale import hlo
from tfx_jax.scale import topology as topology_lib
from tests.helpers import ROOT, load_config, run_command, sweep_in_process

TINY = str(ROOT / "configs" / "lm.py") + ":tiny"
needs_libtpu = pytest.mark.skipif(
    not topology_lib.libtpu_available(),
    reason="compiling for a TPU topology needs libtpu: install the tpu-aot extra "
           '(pip install -e ".[tpu-aot]")')


# ------------------------------------------------------------------ names
def test_topology_names_count_as_cloud_tpu_counts_them():
  """N counts chips for v5e/v6e and TensorCores (two a chip) for v4/v5p."""
  cases = {"v5e-16": (16, (4, 4)), "v5e-1": (1, (1, 1)), "v6e-64": (64, (8, 8)),
           "v4-32": (16, (2, 2, 4)), "v5p-128": (64, (4, 4, 4)), "v4-8": (4, (2, 2, 1)),
           "v5e:4x4": (16, (4, 4)), "v5p:2x2x1": (4, (2, 2, 1))}
  for name, (chips, grid) in cases.items():
    t = topology_lib.parse(name)
    assert (t.platform, t.num_devices, t.grid) == ("tpu", chips, grid), name
  assert topology_lib.parse("v5p-128").libtpu_name == "v5:4x4x4"
  assert topology_lib.parse("v5e-16").chip.hbm_gib == 16
  cpu = topology_lib.parse("cpu-8")
  assert (cpu.platform, cpu.num_devices, cpu.chip) == ("cpu", 8, None)


@pytest.mark.parametrize("name", ["v5x-16", "v5e-12", "v4-3", "cpu-0", "v5e:4x4x4", "tpu"])
def test_a_bad_topology_is_exit_2_listing_the_valid_names(name):
  code, out, err = run_command(compile_cmd, ["--config", TINY, "--topology", name])
  assert code == 2 and not out
  assert f"--topology={name!r}" in err
  for valid in ("v5e-N", "v4-N", "v5p-N", "v6e-N", "v5e:4x4", "cpu-N", "TensorCores"):
    assert valid in err


# ------------------------------------------------------------- HLO counts
_MODULE = """HloModule m, is_scheduled=true

%fused_product (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %convolution.1 = f32[8,4]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%all-reduce-scatter.3 (input.1: f32[16,4]) -> f32[4,4] {
  %input.1 = f32[16,4]{1,0} parameter(0)
  %all-reduce.7 = f32[16,4]{1,0} all-reduce(%input.1), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  ROOT %slice.2 = f32[4,4]{1,0} slice(%all-reduce.7), slice={[0:4], [0:4]}
}

%body (param: (s32[], f32[8,16], f32[16,4])) -> (s32[], f32[8,16], f32[16,4]) {
  %param = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%param), index=0
  %x.1 = f32[8,16]{1,0} get-tuple-element(%param), index=1
  %w = f32[16,4]{1,0} get-tuple-element(%param), index=2
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %fusion.1 = f32[8,4]{1,0} fusion(%x.1, %w), kind=kOutput, calls=%fused_product
  %all-gather.1 = f32[16,4]{1,0} all-gather(%w), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
  ROOT %tuple = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) tuple(%next, %x.1, %all-gather.1)
}

%cond (param.1: (s32[], f32[8,16], f32[16,4])) -> pred[] {
  %param.1 = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%param.1), index=0
  %bound = s32[] constant(5)
  ROOT %lt = pred[] compare(%i.1, %bound), direction=LT
}

ENTRY %main (a: f32[8,16], b: f32[16,4]) -> f32[4,4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) tuple(%zero, %a, %b)
  %while.1 = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}) while(%init), condition=%cond, body=%body
  %out = f32[16,4]{1,0} get-tuple-element(%while.1), index=2
  ROOT %fusion.2 = f32[4,4]{1,0} fusion(%out), kind=kCustom, calls=%all-reduce-scatter.3
}
"""


def test_the_hlo_counts_weight_each_loop_body_by_its_trip_count():
  """A loop of 5 products [8, 16] x [16, 4] (a convolution, as TPU programs
  write them) with an all-gather each, then TPU's reduce-scatter fusion."""
  counts = hlo.count_program(_MODULE, num_devices=4)
  assert counts.trip_counts == {"body": 5} and not counts.unknown_trip_counts
  assert counts.flops == 5 * 2 * 8 * 4 * 16
  totals = counts.collective_totals()
  assert totals["all-gather"] == {"count": 5, "bytes": 5 * 16 * 4 * 4}
  assert totals["reduce-scatter"] == {"count": 1, "bytes": 16 * 4 * 4}
  assert totals["all-reduce"]["count"] == 0
  assert {c.group for c in counts.collectives} == {4}


_SLICED = """HloModule m, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%slice_mine (p0: f32[16,4], p1: s32[]) -> f32[4,4] {
  %p0 = f32[16,4]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero.1 = s32[] constant(0)
  ROOT %dynamic-slice.1 = f32[4,4]{1,0} dynamic-slice(%p0, %p1, %zero.1), dynamic_slice_sizes={4,4}
}

ENTRY %main (g: f32[16,4], h: f32[16,4]) -> (f32[4,4], f32[16,4]) {
  %g = f32[16,4]{1,0} parameter(0)
  %h = f32[16,4]{1,0} parameter(1)
  %all-reduce.1 = (f32[16,4]{1,0}, f32[16,4]{1,0}) all-reduce(%g, %h), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%add
  %g.1 = f32[16,4]{1,0} get-tuple-element(%all-reduce.1), index=0
  %h.1 = f32[16,4]{1,0} get-tuple-element(%all-reduce.1), index=1
  %all-reduce.2 = f32[16,4]{1,0} all-reduce(%g), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%add
  %pid = u32[] partition-id()
  %pid.1 = s32[] convert(%pid)
  %four = s32[] constant(4)
  %offset = s32[] multiply(%pid.1, %four)
  %mine = f32[4,4]{1,0} fusion(%all-reduce.2, %offset), kind=kLoop, calls=%slice_mine
  %mine.1 = f32[4,4]{1,0} fusion(%g.1, %offset), kind=kLoop, calls=%slice_mine
  %whole = f32[16,4]{1,0} add(%h.1, %h.1)
  %both = f32[4,4]{1,0} add(%mine, %mine.1)
  ROOT %out = (f32[4,4]{1,0}, f32[16,4]{1,0}) tuple(%both, %whole)
}
"""


def test_an_all_reduce_read_only_as_each_devices_slice_is_counted_apart():
  """A reduce-scatter the compiler runs as all-reduce + dynamic-slice (libtpu,
  for groups spanning two torus dimensions): the all-reduce read only through
  each device's quarter is counted apart; the combined one whose second result
  is read whole is not."""
  counts = hlo.count_program(_SLICED, num_devices=4)
  assert counts.collective_totals()["all-reduce"]["count"] == 2
  assert counts.sliced_all_reduces == {"count": 1, "bytes": 16 * 4 * 4}


def test_xla_counts_a_scanned_body_once_and_the_hlo_counts_every_trip():
  """A real scan of 6 products compiled on this CPU: XLA's cost_analysis has
  one iteration's FLOPs; the HLO count has all six, exactly."""
  def f(x, ws):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

  compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((8, 32), jnp.float32),
                              jax.ShapeDtypeStruct((6, 32, 32), jnp.float32)).compile()
  counts = hlo.count_program(compiled.as_text(), num_devices=1)
  per_product = 2 * 8 * 32 * 32
  assert list(counts.trip_counts.values()) == [6]
  assert counts.flops == 6 * per_product
  xla = compiled.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] < 2 * per_product


# ------------------------------------------------------------ cpu-N (no libtpu)
_CPU_SCRIPT = """
import json, sys
from tfx_jax.run.config_base import apply_overrides, load_config_file
from tfx_jax.scale import plan, topology
t = topology.parse("cpu-4")
out = {}
for name, mesh in (("data", {"mesh.data": 4, "mesh.fsdp": 1}),
                   ("fsdp", {"mesh.data": 1, "mesh.fsdp": 4})):
  config = load_config_file(sys.argv[1])
  apply_overrides(config, {"model.num_layers": 1, "model.d_model": 64, "train.batch_size": 8,
                           "eval.batch_size": 8, **mesh})
  out[name] = plan.check(config, t, name=sys.argv[1]).to_json()
print(json.dumps(out))
"""


def test_cpu_topology_compiles_without_libtpu_and_fsdp_shrinks_parameters():
  """cpu-4 (fake CPU devices, no extra): the figures without a memory limit;
  FSDP over the 4 devices holds a quarter of the parameters and optimizer
  state on each, and gathers them (all-gathers) where data parallelism does not."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  proc = subprocess.run([sys.executable, "-c", _CPU_SCRIPT, TINY], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  reports = json.loads(proc.stdout.strip().splitlines()[-1])
  data, fsdp = reports["data"], reports["fsdp"]
  assert data["fits"] is None and data["hbm"] is None and data["roofline"] is None
  assert (data["mesh"]["data"], fsdp["mesh"]["fsdp"]) == (4, 4)
  assert data["train"]["parameters"] == 4 * fsdp["train"]["parameters"]
  # The optimizer's step counters (scalars) are whole on every device either way:
  # the moments are a quarter, the counters' few bytes are not.
  assert 0 < 4 * fsdp["train"]["optimizer"] - data["train"]["optimizer"] <= 3 * 64
  assert fsdp["collectives"]["all-gather"]["count"] > 0
  assert data["collectives"]["all-gather"]["count"] == 0
  # Both count the same model: the compiled matmul FLOPs per device are a
  # quarter of the step's, within the few non-matmul FLOPs of either.
  assert data["flops"]["model_per_step"] == fsdp["flops"]["model_per_step"]
  for r in (data, fsdp):
    assert 0.7 < r["flops"]["compiled_per_device"] / r["flops"]["model_per_device"] < 1.3


@pytest.mark.slow
def test_a_sweep_dry_run_compiles_each_distinct_program_once(tmp_path, capsys):
  """``--dry-run --topology``: 2 activations x 2 seeds are 4 runs but 2 programs
  (the seed is not part of the program); each run gets its memory line."""
  args = ["--config", TINY, "--axis", "model.activation=relu,swiglu", "--seeds", "0,1",
          "--name", "check", "--workdir", tmp_path, "--config.model.num_layers=1",
          "--config.model.d_model=32", "--config.train.batch_size=4",
          "--config.eval.batch_size=4"]
  code, out, err = sweep_in_process([*args, "--topology", "cpu-1"], capsys)
  assert code == 2 and "--dry-run" in err  # checks before submitting, never instead
  code, out, err = sweep_in_process([*args, "--dry-run", "--topology", "cpu-1"], capsys)
  assert code == 0, err
  assert "4 runs, 2 distinct programs compiled" in out
  assert out.count("per device") == 4 and not (tmp_path / "check").exists()


# ------------------------------------------------------------------ TPU
def _tiny(**overrides):
  from tfx_jax.run.config_base import apply_overrides  # pylint: disable=import-outside-toplevel
  config = load_config("lm.py:tiny")
  apply_overrides(config, {"compute_dtype": "bfloat16", "model.scan_layers": True,
                           "train.seq_len": 128, "mesh.data": 1, "mesh.fsdp": -1,
                           "train.batch_size": 8, "eval.batch_size": 8, **overrides})
  return config


@pytest.fixture(scope="module")
def v5e_reports():
  from tfx_jax.scale import plan  # pylint: disable=import-outside-toplevel
  t = topology_lib.parse("v5e-4")
  return {b: plan.check(_tiny(**{"train.batch_size": b}), t) for b in (8, 16)}


@needs_libtpu
@pytest.mark.slow
def test_the_tiny_preset_compiles_for_a_tpu_topology(v5e_reports):
  """v5e-4 from this CPU: a TPU program (the splash attention kernel, chosen
  for the target and not for this host), FSDP over 4 chips, loops counted by
  their trip counts, a roofline from v5e's peaks; it fits in 16 GiB."""
  r = v5e_reports[8]
  # The compiler's own limit on a v5e chip (16 GiB HBM): 15.75 GiB.
  assert r.fits is True and r.hbm == int(15.75 * 2**30) and r.mesh["fsdp"] == 4
  assert r.flops["kernels"] > 0  # splash attention: a Pallas TPU kernel
  assert sorted(r.flops["loop_trip_counts"].values())[-1] == 2  # 2 scanned layers
  assert r.flops["compiled_per_device"] > r.flops["xla_cost_analysis_per_device"]
  assert r.roofline["chip"] == "TPU v5e" and 0 < r.roofline["mfu"] <= 1
  assert r.collectives["all-gather"]["count"] > 0
  assert r.collectives["reduce-scatter"]["count"] > 0  # gradients, under FSDP
  assert max(r.train.total, r.eval.total) <= r.hbm


@needs_libtpu
@pytest.mark.slow
def test_memory_grows_with_the_batch(v5e_reports):
  small, large = v5e_reports[8].train, v5e_reports[16].train
  assert large.temporaries > small.temporaries
  assert (large.parameters, large.optimizer) == (small.parameters, small.optimizer)


@needs_libtpu
def test_a_run_too_large_for_the_chip_does_not_fit_exit_1_with_the_knobs(tmp_path):
  """One v5e chip, a batch whose activations exceed its memory: exit 1, "does
  not fit", and the settings that would lower the memory."""
  path = tmp_path / "report.json"
  code, out, err = run_command(compile_cmd, [
      "--config", TINY, "--topology", "v5e-1", "--config.train.batch_size=65536",
      "--config.model.remat=none", "--knobs=list", "--json", path])
  assert code == 1, err[-2000:]
  assert "does not fit" in out
  for knob in ("--config.model.remat=full", "--config.train.batch_size=32768"):
    assert knob in out
  report = json.loads(path.read_text())
  assert report["fits"] is False and report["knobs"]


@needs_libtpu
def test_libtpu_runs_a_reduce_scatter_across_two_torus_dimensions_as_an_all_reduce():
  """Why FSDP gradients over a whole v5e-16 (4x4) slice are all-reduced: even an
  explicit ``psum_scatter`` over the 16 chips compiles to an all-reduce read
  as each chip's slice (counted apart as such); over one torus dimension (4
  chips of a row) it stays a reduce-scatter. docs/scale.md names the meshes
  that keep the gradients reduce-scattered."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  devices = sorted(topology_lib.devices(topology_lib.parse("v5e-16")),
                   key=lambda d: (d.coords[1], d.coords[0]))
  mesh = Mesh(np.asarray(devices).reshape(4, 4), ("y", "x"))

  def counts(axes):
    def grad(x_TD, g_TM):  # a weight gradient: the tokens' sum, scattered over axes
      return jax.lax.psum_scatter(x_TD.T @ g_TM, axes, scatter_dimension=0, tiled=True)
    step = jax.shard_map(grad, mesh=mesh, in_specs=(P(axes), P(axes)), out_specs=P(axes))
    args = [jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P(axes)))] * 2
    return hlo.count_program(jax.jit(step).lower(*args).compile().as_text(), 16)

  both, row = counts(("y", "x")), counts("x")
  assert both.collective_totals()["reduce-scatter"]["count"] == 0
  assert both.sliced_all_reduces == {"count": 1, "bytes": 512 * 512 * 2}
  assert row.collective_totals()["reduce-scatter"]["count"] == 1
  assert row.sliced_all_reduces["count"] == 0
