"""``python -m tfx_jax.report runs/<sweep>``: writes report.md, report.json,
report.csv and PNG plots into the sweep directory (see tfx_jax/report/assemble.py).

``python -m tfx_jax.report --results docs/results.md``: regenerates the page's
summary table from every committed report.json with claims under
docs/results/, the rest of the page as it was (tfx_jax/report/results_doc.py);
with ``--check`` it writes nothing and checks the page against the reports:
the summary is the generated one, and every label and interval its prose
quotes is report.json's (tfx_jax/report/results_check.py)."""

import argparse
import sys


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m tfx_jax.report",
                              description="Seed-aggregated report of a sweep.")
  p.add_argument("sweep_dir", nargs="?", help="runs/<sweep>")
  p.add_argument("--stall-margin", type=float, default=None,
                 help="a finished run whose final validation loss is not below the "
                 "unigram entropy of the training targets by this many nats has "
                 "stalled (default: the sweep's, else 0.05)")
  p.add_argument("--equivalence-margin", type=float, default=None,
                 help="two points are equivalent when the 90%% interval of their "
                 "difference in the selection metric lies within +-this (default: the "
                 "sweep's, else 0.01 nats for losses, 0.5 for BLEU)")
  p.add_argument("--results", metavar="PAGE", default=None,
                 help="instead of a sweep: regenerate PAGE's summary (docs/results.md, "
                 "between <!-- summary --> and <!-- /summary -->) from every report.json "
                 "with claims in the directory beside it (docs/results/)")
  p.add_argument("--check", action="store_true",
                 help="with --results: write nothing; exit 1 unless PAGE's summary is the "
                 "generated one and every label and interval its prose quotes is its "
                 "report.json's (each mismatch listed with its line)")
  args = p.parse_args(argv)
  if args.results is not None:
    if args.sweep_dir is not None or args.stall_margin is not None or (
        args.equivalence_margin is not None):
      print("error: --results PAGE takes no sweep directory, --stall-margin or "
            "--equivalence-margin.", file=sys.stderr)
      return 2
    return _results(args.results, args.check)
  if args.sweep_dir is None or args.check:
    print("error: give a sweep directory (python -m tfx_jax.report runs/<sweep>), or "
          "--results docs/results.md [--check].", file=sys.stderr)
    return 2
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


def _results(page: str, check: bool) -> int:
  """``--results PAGE [--check]``."""
  # Deferred: a sweep's report does not need them.
  from tfx_jax.report import results_check, results_doc  # pylint: disable=import-outside-toplevel
  try:
    if check:
      mismatches, skipped = results_check.check_page(page)
    else:
      found, changed = results_doc.write(page)
  except (results_doc.ResultsError, FileNotFoundError) as e:
    print(f"error: {page}: {e}", file=sys.stderr)
    return 2
  if check:
    for line in skipped:
      print(f"labels not checked: {line}")
    for m in mismatches:
      print(f"{page}:{m}")
    print(f"{len(mismatches)} mismatch{'es' * (len(mismatches) != 1)}")
    return 1 if mismatches else 0
  absent = [c.name for c in found if not c.claims]
  claims = sum(len(c.claims) for c in found)
  print(f"{'written' if changed else 'unchanged'}: {page}'s summary, {claims} claims from "
        f"{len(found) - len(absent)} reports"
        + (f"; without claims (no rows): {', '.join(absent)}" if absent else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
