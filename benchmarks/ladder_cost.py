"""What tuning a scaling ladder costs: per-rung grids with separate runs,
against tuning at the smallest rung, transferring up, and branching budgets.

  python benchmarks/sweep_cost.py --only ladder          # ~70 minutes on 2 cores
  python benchmarks/sweep_cost.py --only ladder --tokens-per-param 4,8 --arms per-rung,shared
  python benchmarks/ladder_cost.py --rungs 32,48 --tokens-per-param 1,2 --rates 1e-2,3e-2
  python benchmarks/ladder_cost.py --json ladder_cost.json

A script, not part of the package. One small ladder (``--rungs`` widths of
the tiny LM at 2 heads, ``--tokens-per-param`` budgets, GELU and SwiGLU, the
settings of ``experiments/ladders.py``: muP with base width 32, untied
embeddings, wsd, evaluations on a subset with the last one and the test pass
on the whole split), tuned over ``--rates`` on seed 0 with ``--confirm``
confirmation seeds per point, is run four ways, each a ``python -m
tfx_jax.sweep`` in a fresh directory:

  per-rung    every (rung, budget, variant) tunes its own grid, every budget
              runs from scratch (``--no-branch``)
  transfer    the grid runs at the smallest rung only (``--tune-at``), every
              larger rung at the value chosen there; budgets from scratch
  branched    the same, the budgets of a (rung, variant, rate, seed)
              branched from one trunk run (the ladder's default)
  shared      branched, and the budgets of a (rung, variant) sharing one
              chosen rate (``--share-tuning``), so that their confirmation
              runs branch from one trunk too

Per-rung, transfer and branched choose a rate per budget, so branched forms a
trunk only where a (rung, variant)'s budgets chose the same rate; shared
chooses one per (rung, variant) over its budgets, the lowest mean validation
score (docs/scaling.md).

Measured (2-vCPU AMD EPYC, the defaults, ``--arms per-rung,transfer,branched``,
other processes at nice 19 beside it): per-rung 112 runs, 3,717 core-s;
transfer 52 runs, 1,255 core-s (0.338); branched 52 runs and 10 trunks, 1,304
core-s (0.351 of per-rung, over the 1/3 target): the budgets chose different
rates at every confirmed point, so only the tuning stage branched, and at the
smallest rung a trunk's process costs more than the steps it saves. A run's
fixed costs (startup 3.3-5 s, the whole-split final and test evaluations
3.6-7 s, compilation 0.7-4.8 s) are as large as the train steps of the two
smallest rungs (0.7-10 s), so at these budgets no arm gets far under 1/3;
at larger budgets (``--tokens-per-param 4,8``, the shipped ladders' 8,16)
the train steps dominate and the ratios approach their arithmetic floor,
C / (R + C) x the branching factor plus the proxy's grid (R rates, C
confirmation seeds: 2/7 x 0.73 at the defaults).

Every arm runs the same rungs, variants and confirmation seeds. Its cost is
the core-seconds of every process it ran (runs and trunks: each one's wall
time as the sweep measured it, launches included, x its cores), split into
the phases the runs' status.json records. Printed: each arm's runs, trunks,
core-seconds and phases, and the ratios transfer / per-rung, branched /
transfer, branched / per-rung and shared / per-rung (the target: at most
1/3), measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import runpy
import shutil
import sys
import tempfile

import sweep_cost  # benchmarks/: the sweep command runner and the phases

ROOT = pathlib.Path(__file__).resolve().parents[1]
PHASES = sweep_cost.PHASES
ARMS = {
    "per-rung": ["--no-branch"],
    "transfer": ["--tune-at", "{smallest}", "--no-branch"],
    "branched": ["--tune-at", "{smallest}"],
    "shared": ["--tune-at", "{smallest}", "--share-tuning"],
}


def _base_flags() -> list[str]:
  """The shipped ladders' settings (``experiments/ladders.py``'s BASE)."""
  base = runpy.run_path(str(ROOT / "experiments" / "ladders.py"))["BASE"]
  out = []
  for k, v in base.items():
    out.append(f"--config.{k}={'true' if v is True else 'false' if v is False else v}")
  return out


def run_arm(arm: str, args, workdir: pathlib.Path) -> dict:
  """Runs one arm; its record (processes, core-seconds, phases)."""
  widths = args.rungs.split(",")
  name = f"ladder_{arm.replace('-', '_')}"
  flags = [f.replace("{smallest}", f"model.d_model={widths[0]}") for f in ARMS[arm]]
  command = [sys.executable, "-m", "tfx_jax.sweep", "--config", "configs/lm.py:tiny",
             "--ladder", f"model.d_model={args.rungs}",
             "--tokens-per-param", args.tokens_per_param,
             "--axis", "model.activation=gelu,swiglu",
             "--tune", f"optim.learning_rate={args.rates}", "--seeds", "0",
             "--confirm", str(args.confirm), "--name", name, "--workdir", str(workdir),
             "--parallel", str(args.parallel), *_base_flags(), *args.overrides, *flags]
  _, elapsed = sweep_cost.run_command(command, arm)
  sweep_dir = workdir / name
  record = json.loads((sweep_dir / "sweep.json").read_text())
  phases = dict.fromkeys(PHASES, 0.0)
  core_seconds = 0.0
  counted = {"runs": 0, "trunks": 0}
  for kind in ("runs", "trunks"):
    for entry in record.get(kind, []):
      if entry["stage"].startswith("superseded"):
        continue
      status_file = sweep_dir / entry["name"] / "status.json"
      if not status_file.exists():
        continue
      status = json.loads(status_file.read_text())
      cores = int(status.get("cores") or 1)
      core_seconds += float(entry["wall_seconds"]) * cores
      for p in PHASES:
        phases[p] += float((status.get("seconds") or {}).get(p) or 0.0) * cores
      counted[kind] += 1
  return {"arm": arm, "command": " ".join(command[3:]), "elapsed": elapsed,
          "core_seconds": core_seconds, "phases": phases, **counted}


def _table(rows: list[dict]) -> str:
  head = (f"{'arm':<9} {'runs':>5} {'trunks':>6} {'core-s':>9} {'startup':>8} "
          f"{'compile':>8} {'train':>8} {'evals':>8} {'ckpt':>6} {'eval/train':>10}")
  lines = [head, "-" * len(head)]
  for r in rows:
    p = r["phases"]
    share = p["evaluations"] / p["train_steps"] if p["train_steps"] else float("nan")
    lines.append(f"{r['arm']:<9} {r['runs']:>5} {r['trunks']:>6} {r['core_seconds']:>9.1f} "
                 f"{p['startup']:>8.1f} {p['compile']:>8.1f} {p['train_steps']:>8.1f} "
                 f"{p['evaluations']:>8.1f} {p['checkpointing']:>6.1f} {share:>10.2f}")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rungs", default="32,48,64,96", help="widths (d_model) of the rungs")
  p.add_argument("--tokens-per-param", default="2,4", help="the budgets")
  p.add_argument("--rates", default="1e-3,3.16e-3,1e-2,3.16e-2,1e-1",
                 help="the learning-rate grid (the transfer experiment's)")
  p.add_argument("--confirm", type=int, default=2, help="confirmation seeds per point")
  p.add_argument("--parallel", type=int, default=2, help="runs at a time")
  p.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}")
  p.add_argument("--keep", default=None, help="run the sweeps in this directory "
                 "(default: a temporary one, removed)")
  p.add_argument("--json", default=None, help="write the records here")
  args, rest = p.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith("--config.")]
  if bad:
    p.error(f"unrecognised arguments: {' '.join(bad)} (overrides are --config.a.b=v)")
  args.overrides = rest
  arms = args.arms.split(",")
  unknown = [a for a in arms if a not in ARMS]
  if unknown:
    p.error(f"--arms {','.join(unknown)}: choose from {', '.join(ARMS)}")
  workdir = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="ladder_cost_"))
  rows = []
  try:
    for arm in arms:
      rows.append(run_arm(arm, args, workdir))
      print(f"  {arm}: {rows[-1]['core_seconds']:.1f} core-s in {rows[-1]['elapsed']:.0f} s",
            flush=True)
  finally:
    if args.keep is None:
      shutil.rmtree(workdir, ignore_errors=True)
  print(f"\nladder d_model {args.rungs} x tokens/param {args.tokens_per_param} x "
        f"GELU, SwiGLU; rates {args.rates}; {args.confirm} confirmation seeds; "
        f"--parallel {args.parallel}; core-seconds summed over every process")
  print(_table(rows))
  cost = {r["arm"]: r["core_seconds"] for r in rows}
  for a, b in (("transfer", "per-rung"), ("branched", "transfer"), ("branched", "per-rung"),
               ("shared", "per-rung")):
    if a in cost and b in cost and cost[b] > 0:
      print(f"{a} / {b}: {cost[a] / cost[b]:.3f}"
            + (" (target: at most 1/3)" if b == "per-rung" and a != "transfer" else ""))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"written: {args.json}")
  return rows


if __name__ == "__main__":
  main()
