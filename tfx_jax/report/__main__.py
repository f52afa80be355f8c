"""``python -m tfx_jax.report runs/<sweep>``: writes report.md, report.json,
report.csv and PNG plots into the sweep directory (see tfx_jax/report/assemble.py)."""

import argparse
import sys


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tfx_jax.report",
                              description="Seed-aggregated report of a sweep.")
  p.add_argument("sweep_dir", help="runs/<sweep>")
  p.add_argument("--stall-margin", type=float, default=None,
                 help="a finished run whose final validation loss is not below the "
                 "unigram entropy of the training targets by this many nats has "
                 "stalled (default: the sweep's, else 0.05)")
  p.add_argument("--equivalence-margin", type=float, default=None,
                 help="two points are equivalent when the 90%% interval of their "
                 "difference in the selection metric lies within +-this (default: the "
                 "sweep's, else 0.01 nats for losses, 0.5 for BLEU)")
  args = p.parse_args(argv)
  if (args.stall_margin is not None and args.stall_margin < 0) or (
      args.equivalence_margin is not None and args.equivalence_margin <= 0):
    print("error: --stall-margin must be >= 0 and --equivalence-margin > 0.",
          file=sys.stderr)
    return 2
  from tfx_jax.report import assemble  # pylint: disable=import-outside-toplevel
  try:
    path = assemble.write_report(args.sweep_dir, stall_margin=args.stall_margin,
                              equivalence_margin=args.equivalence_margin)
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(path.read_text())
  print(f"written: {path}, {path.with_suffix('.json')}, {path.with_suffix('.csv')} and "
        "the PNG plots beside them")
  return 0


if __name__ == "__main__":
  sys.exit(main())
