"""One run compiled for one machine: its memory, FLOPs, collectives and roofline.

``check(config, topology)`` builds the run as training builds it
(``run_setup.ShardedRun`` on the topology's devices), compiles its train and
evaluation steps ahead of time and returns a ``Report``;
``format_report`` is what ``python -m tfx_jax.compile`` prints. The memory
figures are ``Compiled.memory_analysis()`` per device: the arguments (of
which the parameters and optimizer state are counted apart with
``footprint.bytes_per_device``, the accounting of ``summary --mesh``), the
temporaries XLA allocates (activations, gradients, the optimizer's working
set), the outputs not written in place of a donated argument, and the code.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tfx_jax.run import footprint

from tfx_jax.run import config as run_config

from tfx_jax.run import setup as run_setup
from tfx_jax.run import sharding as sharding_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax.records import serial
from tfx_jax.scale import flops as flops_lib
from tfx_jax.scale import hlo
from tfx_jax.scale import roofline as roofline_lib
from tfx_jax.scale import topology as topology_lib

GIB = 2**30


# Written with its total last (derived, not read back).
@serial.layout(order=("parameters", "optimizer", "other_arguments", "temporaries", "outputs",
                      "code", "total"),
               derived={"total": lambda m: m.total})
@dataclasses.dataclass
class StepMemory:
  """Bytes per device of one compiled step."""
  parameters: int
  optimizer: int
  other_arguments: int
  temporaries: int
  outputs: int
  code: int

  @property
  def total(self) -> int:
    return (self.parameters + self.optimizer + self.other_arguments + self.temporaries
            + self.outputs + self.code)


@dataclasses.dataclass
class Knob:
  """A setting that lowers the memory per device, with its compiled total."""
  overrides: dict[str, Any]
  why: str
  total: int | None = None  # bytes per device, None: not compiled
  fits: bool | None = None


@dataclasses.dataclass
class Report:
  config: str
  topology: str
  machine: str
  mesh: dict[str, int]
  batch: dict[str, int]
  seq_len: int
  params: int
  train: StepMemory | None
  eval: StepMemory | None
  hbm: int | None  # bytes per device; None: no limit (cpu-N)
  fits: bool | None
  refused: str = ""  # the compiler's refusal (out of memory), if it refused
  knobs: list[Knob] = dataclasses.field(default_factory=list)
  flops: dict[str, float] = dataclasses.field(default_factory=dict)
  collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  collective_matmuls: dict[str, int] = dataclasses.field(default_factory=dict)
  # Among the all-reduces: those read only as this device's slice, i.e.
  # reduce-scatters the compiler runs as all-reduces (scale/hlo.py).
  sliced_all_reduces: dict[str, int] = dataclasses.field(default_factory=dict)
  roofline: dict[str, Any] | None = None
  compile_seconds: dict[str, float] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    """The check as JSON (``serial.to_json``): ``compile --out``'s file."""
    return serial.to_json(self)


# ------------------------------------------------------------------ building
def abstract_batch(run, sharded, split: str) -> dict:
  """The global batch of ``split`` ("train" or "eval") as ShapeDtypeStructs on
  the batch sharding: the fields ``data/pipeline.py`` documents per task."""
  size = (run.train if split == "train" else run.eval).batch_size
  length = run.train.seq_len
  ids = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharded.batch_sharding)
  floats = jax.ShapeDtypeStruct((size, length), jnp.float32, sharding=sharded.batch_sharding)
  fields = {
      "lm": ("inputs", "targets", "segment_ids", "positions"),
      "mlm": ("inputs", "targets", "segment_ids", "positions"),
      "translate": ("inputs", "decoder_inputs", "targets"),
      "classify": ("inputs", "segment_ids", "positions", "targets"),
  }
  if run.task not in fields:
    raise ConfigError(f"task={run.task!r}: no batch layout known to the compile check; "
                      f"it knows {', '.join(fields)}.")
  batch = {name: ids(size, length) for name in fields[run.task]}
  batch["weights"] = floats
  if run.task == "classify":
    batch["label"] = ids(size)
  return batch


def _replicated(tree, sharding):
  return jax.tree.map(
      lambda v: jax.ShapeDtypeStruct(np.shape(v), jnp.asarray(v).dtype, sharding=sharding),
      tree)


def _memory(compiled, params: int, optimizer: int) -> StepMemory:
  m = compiled.memory_analysis()
  return StepMemory(
      parameters=params, optimizer=optimizer,
      other_arguments=max(0, m.argument_size_in_bytes - params - optimizer),
      temporaries=m.temp_size_in_bytes,
      outputs=max(0, m.output_size_in_bytes - m.alias_size_in_bytes),
      code=m.generated_code_size_in_bytes)


_REFUSAL = re.compile(r"RESOURCE_EXHAUSTED[^\n]*")


def refusal(error: Exception) -> str | None:
  """The compiler's out-of-memory message, or None for any other error."""
  found = _REFUSAL.search(str(error))
  return found.group(0).strip() if found else None


@dataclasses.dataclass
class Compiled:
  sharded: Any
  train: Any
  eval: Any
  seconds: dict[str, float]


def lower_run(run, devices):
  """(ShardedRun, lowered train step, lowered evaluation step) on ``devices``:
  traced, not compiled (the mesh and batches checked against the devices)."""
  run_setup.check_batches(run, process_count=1)
  sharded = run_setup.ShardedRun(run, run.model, devices=devices)
  run_setup.check_batches(run, process_count=1, batch_axes=(
      sharding_lib.batch_shards(sharded.mesh), sharded.mesh.devices.size))
  train = sharded.train_step().lower(
      sharded.abstract_state, abstract_batch(run, sharded, "train"),
      _replicated(sharded.hparams, sharded.replicated))
  evaluated = sharded.eval_step().lower(
      sharded.abstract_state.params, abstract_batch(run, sharded, "eval"))
  return sharded, train, evaluated


def compile_run(run, devices) -> Compiled:
  """The run's train and evaluation steps compiled for ``devices``."""
  start = time.perf_counter()
  sharded, train, evaluated = lower_run(run, devices)
  train = train.compile()
  seconds = {"train": time.perf_counter() - start}
  start = time.perf_counter()
  evaluated = evaluated.compile()
  seconds["eval"] = time.perf_counter() - start
  return Compiled(sharded, train, evaluated, seconds)


def step_memory(run, built: Compiled) -> tuple[StepMemory, StepMemory]:
  """(train, eval) memory per device of a compiled run."""
  boxed = footprint.boxed_state(run, run.model)
  mesh_shape = dict(built.sharded.mesh.shape)
  params = footprint.bytes_per_device(boxed.params, mesh_shape)
  optimizer = footprint.bytes_per_device(boxed.opt_state, mesh_shape)
  return _memory(built.train, params, optimizer), _memory(built.eval, params, 0)


# ------------------------------------------------------------------ the check
def check(config, topology: topology_lib.Topology, *, knobs: str = "auto",
          name: str = "config") -> Report:
  """Compiles ``config`` (a ConfigDict, called ``name``) for ``topology``."""
  run = run_config.resolve(config)
  devices = topology_lib.devices(topology)
  chip = topology.chip
  hbm = int(chip.limit_gib * GIB) if chip else None
  boxed = footprint.boxed_state(run, run.model)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(boxed.params))
  report = Report(
      config=name, topology=topology.name, machine=topology.describe(),
      mesh={}, batch={"train": run.train.batch_size, "eval": run.eval.batch_size},
      seq_len=run.train.seq_len, params=n_params, train=None, eval=None, hbm=hbm,
      fits=None)
  try:
    built = compile_run(run, devices)
  except Exception as e:  # pylint: disable=broad-except
    refused = refusal(e)
    if refused is None:
      raise
    report.fits, report.refused = False, refused
    report.knobs = _knobs(config, run, topology, devices, hbm, knobs, n_params)
    return report
  report.mesh = dict(built.sharded.mesh.shape)
  report.train, report.eval = step_memory(run, built)
  report.compile_seconds = built.seconds
  if hbm is not None:
    report.fits = max(report.train.total, report.eval.total) <= hbm
    if not report.fits:
      report.knobs = _knobs(config, run, topology, devices, hbm, knobs, n_params)
  counts = hlo.count_program(built.train.as_text(), len(devices))
  _add_flops(report, run, built, counts, len(devices))
  report.collectives = counts.collective_totals()
  report.collective_matmuls = counts.collective_matmuls
  report.sliced_all_reduces = counts.sliced_all_reduces
  if chip is not None:
    estimate = roofline_lib.estimate(
        counts, chip, run.compute_dtype,
        step_flops=max(counts.flops, report.flops["model_per_device"]),
        model_flops=report.flops["model_per_device"])
    report.roofline = {"chip": chip.name, "source": chip.source,
                       "peak_tflops": estimate.peak_tflops,
                       "compute_s": estimate.compute_s, "memory_s": estimate.memory_s,
                       "interconnect_s": estimate.interconnect_s,
                       "step_s": estimate.step_s, "bound": estimate.bound,
                       "mfu": estimate.mfu}
  return report


def _add_flops(report: Report, run, built, counts, n_devices: int) -> None:
  n_matmul = flops_lib.matmul_params(built.sharded.abstract_state.params, run.model)
  tokens = run.train.batch_size * run.train.seq_len
  model = flops_lib.flops_per_token(n_matmul, run.model, run.train.seq_len) * tokens
  xla = built.train.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  report.flops = {
      "matmul_params": n_matmul, "model_per_step": model,
      "model_per_device": model / n_devices,
      "attention_per_device": flops_lib.attention_flops_per_token(
          run.model, run.train.seq_len) * tokens / n_devices,
      "compiled_per_device": counts.flops,
      "xla_cost_analysis_per_device": float((xla or {}).get("flops", 0.0)),
      "loop_trip_counts": counts.trip_counts,
      "unknown_trip_counts": counts.unknown_trip_counts, "kernels": counts.kernels,
      "bytes_accessed_per_device": counts.bytes_accessed}


# ------------------------------------------------------------------- knobs
def _knob_candidates(run, n_devices: int) -> list[Knob]:
  """Settings that lower the memory per device, from the run's own values."""
  out = []
  if run.model.remat != "full":
    out.append(Knob({"model.remat": "full"},
                    "recompute each layer in the backward pass (saves its inputs only)"))
  if run.model.num_layers > 1 and not run.model.scan_layers:
    out.append(Knob({"model.scan_layers": True}, "one compiled layer, scanned"))
  data, fsdp = run.mesh.data, run.mesh.fsdp
  if fsdp != -1 and fsdp < n_devices:
    out.append(Knob({"mesh.data": 1, "mesh.fsdp": -1},
                    "shard parameters and optimizer state over all devices (FSDP)"))
  for section in ("train", "eval"):
    size = getattr(run, section).batch_size
    if size % 2 == 0 and size // 2 >= max(1, data if data > 0 else 1):
      out.append(Knob({f"{section}.batch_size": size // 2},
                      f"half the {section} batch (activations scale with it)"))
  if run.train.seq_len % 2 == 0 and run.train.seq_len >= 256:
    out.append(Knob({"train.seq_len": run.train.seq_len // 2},
                    "half the sequence length (activations scale with it)"))
  return out


# Models above this many parameters take minutes per compile on a CPU host:
# ``--knobs=auto`` names their helping settings without compiling each.
KNOB_COMPILE_PARAMS = 2e9


def _knobs(config, run, topology, devices, hbm, mode: str, n_params: int) -> list[Knob]:
  from tfx_jax.run.config_base import apply_overrides  # pylint: disable=import-outside-toplevel
  candidates = _knob_candidates(run, len(devices))
  compile_each = mode == "compile" or (mode == "auto" and n_params < KNOB_COMPILE_PARAMS)
  if not compile_each:
    return candidates
  for knob in candidates:
    variant = copy.deepcopy(config)
    apply_overrides(variant, knob.overrides)
    try:
      changed = run_config.resolve(variant)
      built = compile_run(changed, devices)
    except ConfigError:
      continue
    except Exception as e:  # pylint: disable=broad-except
      if refusal(e) is None:
        raise
      knob.fits = False
      continue
    train, evaluated = step_memory(changed, built)
    knob.total = max(train.total, evaluated.total)
    knob.fits = knob.total <= hbm
  return candidates


# ------------------------------------------------------------------ printing
def format_size(n: float | None) -> str:
  if n is None:
    return "-"
  return f"{n / GIB:,.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


def _overrides(o: dict) -> str:
  return " ".join(f"--config.{k}={v}" for k, v in o.items())


def format_report(r: Report) -> str:
  """The report as ``python -m tfx_jax.compile`` prints it."""
  lines = [f"{r.config} on {r.topology}: {r.machine}"]
  if r.mesh:
    lines.append("mesh " + " x ".join(f"{k}={v}" for k, v in r.mesh.items()) +
                 f"; batch train {r.batch['train']}, eval {r.batch['eval']}; seq "
                 f"{r.seq_len}; {r.params:,} parameters")
  if r.train is not None:
    lines += ["", "memory per device        train step    eval step"]
    for field in ("parameters", "optimizer", "other_arguments", "temporaries", "outputs",
                  "code"):
      label = field.replace("_", " ")
      if field == "temporaries":
        label = "activations/temporaries"
      lines.append(f"  {label:<23}{format_size(getattr(r.train, field)):>12}"
                   f"{format_size(getattr(r.eval, field)):>13}")
    limit = (f" of {format_size(r.hbm)} usable HBM" if r.hbm else " (no memory limit)")
    lines.append(f"  {'total':<23}{format_size(r.train.total):>12}{format_size(r.eval.total):>13}{limit}")
  if r.refused:
    lines += ["", f"the compiler refused: {r.refused}"]
  if r.fits is True:
    lines.append("fits: yes")
  elif r.fits is False:
    lines.append("fits: NO (does not fit)")
    if r.knobs:
      lines.append("settings that would help (total per device where compiled):")
      for k in r.knobs:
        figure = ("" if k.total is None and k.fits is None else
                  f"  -> {format_size(k.total)}" + (" fits" if k.fits else " does not fit")
                  if k.total is not None else "  -> does not fit (refused)")
        lines.append(f"  {_overrides(k.overrides)}: {k.why}{figure}")
  else:
    lines.append("fits: (cpu topology: no memory limit, figures only)")
  if r.flops:
    f = r.flops
    lines += ["", "FLOPs per step per device",
              f"  analytic 6 N D + attention (PaLM)  {f['model_per_device']:.3e}"
              f"  ({f['matmul_params']:,} matmul parameters)",
              f"  compiled, loops x trip counts      {f['compiled_per_device']:.3e}"
              f"  (loop trips {sorted(f['loop_trip_counts'].values()) or 'none'}; "
              f"{f['kernels']} custom kernel calls, e.g. splash attention, not counted)",
              f"  XLA cost_analysis (loops once)     {f['xla_cost_analysis_per_device']:.3e}"]
  if r.collectives:
    lines += ["", "collectives per step (per device program)"]
    for kind, c in r.collectives.items():
      lines.append(f"  {kind:<20}{int(c['count']):>6}  {format_size(c['bytes']):>12}")
    sliced = r.sliced_all_reduces or {}
    if sliced.get("count"):
      lines.append(f"  of the all-reduces, {sliced['count']} ({format_size(sliced['bytes'])}) are "
                   "read only as a slice: reduce-scatters run as whole all-reduces")
      lines.append("  (libtpu does so over all the chips of a square slice; docs/scale.md "
                   "names meshes that avoid it)")
    if any(r.collective_matmuls.values()):
      lines.append("  collective matmuls (XLA's windowed einsums: the gather or scatter done "
                   "by the permutes above,")
      lines.append("  overlapped with the product): " + ", ".join(
          f"{kind} {n}" for kind, n in r.collective_matmuls.items()))
  if r.roofline:
    x = r.roofline
    lines += ["", f"roofline estimate ({x['chip']}, {x['peak_tflops']:g} TFLOP/s peak; "
              f"{x['source']})",
              f"  compute {x['compute_s'] * 1e3:.1f} ms  memory {x['memory_s'] * 1e3:.1f} ms"
              f"  interconnect {x['interconnect_s'] * 1e3:.1f} ms",
              f"  step >= {x['step_s'] * 1e3:.1f} ms ({x['bound']}-bound); MFU <= "
              f"{100 * x['mfu']:.1f}% (an estimate: a bound, not a measurement)"]
  if r.compile_seconds:
    lines.append("")
    lines.append("compiled in " + ", ".join(f"{k} {v:.1f} s"
                                           for k, v in r.compile_seconds.items()))
  return "\n".join(lines)
