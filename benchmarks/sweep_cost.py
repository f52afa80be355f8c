"""What a tuned sweep of the tiny LM costs, and where its time goes.

  python benchmarks/sweep_cost.py                  # both sweeps, after and before (~40 min on 2 cores)
  python benchmarks/sweep_cost.py --quick          # 30 steps, the first sweep only (~5 min)
  python benchmarks/sweep_cost.py --only tuned --json cost.json
  python benchmarks/sweep_cost.py --steps 100 --config.eval.num_batches=4

A script, not part of the package: it runs ``python -m tfx_jax.sweep`` from
the repository above it, each sweep in a fresh directory with its own
persistent compilation cache (the sweep's ``.jax_cache``), twice:

  after    as the sweep runs by default: traced optimizer hyperparameters
           (one train-step program per architecture) and the evaluations in
           the training process;
  before   ``--config.optim.trace_hyperparameters=false`` (each learning rate
           compiled into its own program) and ``--separate-evaluations`` (a
           ``python -m tfx_jax.evaluate`` process per evaluation).

The sweeps (``--only``):

  grid     ``--axis model.norm_position=post,pre --tune
           optim.learning_rate=1e-3,3e-3 --seeds 0`` (``--parallel 2``)
  tuned    the same with ``--tune optim.learning_rate=1e-3,2e-3,3e-3 --seeds 0,1``

and ``ladder`` (``--only ladder``), the cost of tuning a scaling ladder
(``benchmarks/ladder_cost.py``, which says how, and takes its own flags after
``--only ladder``: ``--tokens-per-param 4,8``, ``--arms ...``): per-rung grids
with every budget from scratch, against tuning at the smallest rung and
transferring up (``--tune-at``, muP) with budgets branched from one trunk.

For each of grid and tuned: the runs' summed wall time (as the sweep measures it: process
launches included) split into the phases the runs' status.json records
(startup, compile, train steps, evaluations, checkpointing) and the rest
(process launches, and before: the separate evaluation processes); the
overhead, everything but the train steps and the evaluations, as a fraction
of the summed wall time; and the train-step programs compiled (entries of the
sweep's compilation cache named after ``train_step``). The evaluations of
``before``'s separate processes are counted at the seconds ``after`` spent on
the same evaluations of the same runs (the same forward passes), so that both
overheads leave out the same work; both include the evaluation step's
compilation in "evaluations". Ratios compare after with before, measured in
the same invocation. ``--json PATH`` writes one record per sweep and mode.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PHASES = ("startup", "compile", "train_steps", "evaluations", "checkpointing")
SWEEPS = {
    "grid": ["--tune", "optim.learning_rate=1e-3,3e-3", "--seeds", "0"],
    "tuned": ["--tune", "optim.learning_rate=1e-3,2e-3,3e-3", "--seeds", "0,1"],
}
AXIS = ["--axis", "model.norm_position=post,pre"]
MODES = {
    "after": [],
    "before": ["--config.optim.trace_hyperparameters=false", "--separate-evaluations"],
}


def train_step_programs(cache: pathlib.Path) -> int:
  """Train-step executables in a persistent compilation cache: JAX names each
  entry ``jit_<function>-<key>`` (with a ``-cache`` suffix, beside an
  ``-atime`` file in newer versions)."""
  if not cache.is_dir():
    return 0
  return sum(1 for p in cache.iterdir()
             if p.name.startswith("jit_train_step-") and not p.name.endswith("-atime"))


def run_command(command: list[str], label: str) -> tuple[subprocess.CompletedProcess, float]:
  """Runs one sweep command from the repository with no compilation cache
  (each arm compiles its own programs); (the process, its wall seconds)."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "TFX_JAX_COMPILATION_CACHE")}
  env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
  print(f"[{label}] {' '.join(command[1:])}", flush=True)
  start = time.time()
  proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
  elapsed = time.time() - start
  if proc.returncode != 0:
    raise SystemExit(f"the sweep failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                     f"{proc.stderr[-3000:]}")
  return proc, elapsed


def run_sweep(name: str, mode: str, args, workdir: pathlib.Path) -> dict:
  """Runs one sweep in ``workdir``; its record (times, phases, programs)."""
  sweep_name = f"{name}_{mode}"
  command = [sys.executable, "-m", "tfx_jax.sweep", "--config", "configs/lm.py:tiny",
             *AXIS, *SWEEPS[name], "--name", sweep_name, "--workdir", str(workdir),
             "--parallel", str(args.parallel), f"--config.train.num_steps={args.steps}",
             *args.overrides, *MODES[mode]]
  proc, elapsed = run_command(command, f"{name}, {mode}")
  sweep_dir = workdir / sweep_name
  record = json.loads((sweep_dir / "sweep.json").read_text())
  runs = {}
  for entry in record["runs"]:
    status = json.loads((sweep_dir / entry["name"] / "status.json").read_text())
    runs[entry["name"]] = {
        "wall": float(entry["wall_seconds"]), "seconds": status.get("seconds") or {},
        "cores": status.get("cores", 1), "evaluations": len(entry["evaluations"])}
  summary = [line for line in proc.stdout.splitlines() if "time in the runs" in line]
  return {"sweep": name, "mode": mode, "command": " ".join(command[1:]),
          "elapsed": elapsed, "runs": runs,
          "train_step_programs": train_step_programs(sweep_dir / ".jax_cache"),
          "summary_line": summary[-1].strip() if summary else ""}


def breakdown(result: dict, after: dict | None = None) -> dict:
  """Summed seconds per phase, the rest, and the overhead (see the docstring).
  ``after``: the same sweep's after-mode result, whose evaluation seconds
  stand for the forward passes of before's separate evaluation processes."""
  phases = dict.fromkeys(PHASES, 0.0)
  wall = 0.0
  separate = 0.0
  for name, run in result["runs"].items():
    wall += run["wall"]
    for p in PHASES:
      phases[p] += float(run["seconds"].get(p) or 0.0)
    if after is not None and run["evaluations"]:
      # The same run after: its evaluations less this run's (the in-training
      # ones, the only ones this run's training process ran).
      twin = after["runs"].get(name)
      if twin is not None:
        separate += max(0.0, float(twin["seconds"].get("evaluations") or 0.0)
                        - float(run["seconds"].get("evaluations") or 0.0))
  rest = wall - sum(phases.values())
  useful = phases["train_steps"] + phases["evaluations"] + separate
  overhead = wall - useful
  return {"wall": wall, **phases, "rest": rest, "separate_evaluations": separate,
          "overhead": overhead, "overhead_fraction": overhead / wall if wall else None,
          "train_fraction": phases["train_steps"] / wall if wall else None}


def _table(rows: list[dict]) -> str:
  head = (f"{'sweep':<6} {'mode':<7} {'runs':>4} {'wall s':>8} {'startup':>8} "
          f"{'compile':>8} {'train':>8} {'evals':>8} {'ckpt':>6} {'rest':>7} "
          f"{'overhead':>9} {'programs':>8}")
  lines = [head, "-" * len(head)]
  for r in rows:
    b = r["breakdown"]
    lines.append(
        f"{r['sweep']:<6} {r['mode']:<7} {len(r['runs']):>4} {b['wall']:>8.1f} "
        f"{b['startup']:>8.1f} {b['compile']:>8.1f} {b['train_steps']:>8.1f} "
        f"{b['evaluations'] + b['separate_evaluations']:>8.1f} {b['checkpointing']:>6.1f} "
        f"{b['rest']:>7.1f} {100 * b['overhead_fraction']:>8.1f}% "
        f"{r['train_step_programs']:>8}")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--only", default="grid,tuned", help="sweeps: grid, tuned, ladder")
  p.add_argument("--steps", type=int, default=None, help="train steps (default 300)")
  p.add_argument("--parallel", type=int, default=2, help="runs at a time")
  p.add_argument("--quick", action="store_true", help="30 steps, the grid sweep only")
  p.add_argument("--keep", default=None, help="run the sweeps in this directory "
                 "(default: a temporary one, removed)")
  p.add_argument("--json", default=None, help="write the records here")
  args, rest = p.parse_known_args(argv)
  names = ["grid"] if args.quick and args.only == "grid,tuned" else args.only.split(",")
  # The ladder's own flags (--rungs, --tokens-per-param, --arms, ...) go to
  # benchmarks/ladder_cost.py, which checks them.
  bad = [a for a in rest if not a.startswith("--config.")]
  if bad and names != ["ladder"]:
    p.error(f"unrecognised arguments: {' '.join(bad)} (overrides are --config.a.b=v; "
            "the ladder's flags need --only ladder alone)")
  args.overrides = rest
  if args.steps is None:
    args.steps = 30 if args.quick else 300
  if "ladder" in names:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import ladder_cost  # pylint: disable=import-outside-toplevel
    rows = ladder_cost.main(rest + (["--keep", args.keep] if args.keep else [])
                            + (["--json", args.json] if args.json else [])
                            + ["--parallel", str(args.parallel)])
    names = [n for n in names if n != "ladder"]
    if not names:
      return rows
  unknown = [n for n in names if n not in SWEEPS]
  if unknown:
    p.error(f"--only {','.join(unknown)}: choose from {', '.join(SWEEPS)}")
  sys.path.insert(0, str(ROOT))
  from tfx_jax.run.config_base import base_config  # pylint: disable=import-outside-toplevel
  if "trace_hyperparameters" not in base_config().optim:
    p.error("this tfx_jax has no optim.trace_hyperparameters: before and after "
            "would compile alike")
  workdir = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="sweep_cost_"))
  rows = []
  try:
    for name in names:
      after = run_sweep(name, "after", args, workdir)
      before = run_sweep(name, "before", args, workdir)
      after["breakdown"] = breakdown(after)
      before["breakdown"] = breakdown(before, after)
      rows += [after, before]
      print(f"  after:  {after['summary_line']}", flush=True)
  finally:
    if args.keep is None:
      shutil.rmtree(workdir, ignore_errors=True)
  print(f"\nsummed over each sweep's runs, seconds ({args.steps} steps, "
        f"--parallel {args.parallel}); overhead = all but train steps and evaluations")
  print(_table(rows))
  for name in names:
    after, before = (next(r for r in rows if r["sweep"] == name and r["mode"] == m)
                     for m in ("after", "before"))
    a, b = after["breakdown"], before["breakdown"]
    print(f"{name}: wall {a['wall']:.1f} s vs {b['wall']:.1f} s ({a['wall'] / b['wall']:.2f}x); "
          f"overhead {a['overhead']:.1f} s vs {b['overhead']:.1f} s "
          f"({100 * a['overhead_fraction']:.1f}% vs {100 * b['overhead_fraction']:.1f}%); "
          f"train-step programs {after['train_step_programs']} vs "
          f"{before['train_step_programs']}; per run: "
          f"{a['overhead'] / len(after['runs']):.1f} s overhead of "
          f"{a['wall'] / len(after['runs']):.1f} s")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"written: {args.json}")
  return rows


if __name__ == "__main__":
  main()
