"""``python -m tfx_jax.report runs/<sweep>``: writes report.md, report.csv and
PNG plots into the sweep directory (see tfx_jax/report/build.py)."""

import argparse
import sys


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tfx_jax.report",
                              description="Seed-aggregated report of a sweep.")
  p.add_argument("sweep_dir", help="runs/<sweep>")
  args = p.parse_args(argv)
  from tfx_jax.report import build  # pylint: disable=import-outside-toplevel
  try:
    path = build.write_report(args.sweep_dir)
  except FileNotFoundError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(path.read_text())
  print(f"written: {path}, {path.with_suffix('.csv')} and the PNG plots beside them")
  return 0


if __name__ == "__main__":
  sys.exit(main())
