"""Executes a validated sweep: picks the runs left to do, hands them to the
local or SLURM executor, keeps ``sweep.json`` current, prints a summary and
writes the report.

Which runs are left: not finished, not diverged (a diverged run is a result),
not failed unless ``--retry-failed``, not a superseded confirmation run (a
stale confirmation, moved to the point's new choice: ``confirm``). Unfinished
runs resume from their checkpoints, so the same command is both "run" and
"resume".

Stages (``transfer``, ``confirm``): the local executor runs the tuning
stage, writes the report (each point's chosen value), adds and runs the
transfer stage (a sweep with ``tune_at`` and no confirmation seeds) and
writes the report again, adds and runs the confirmation stage (with
``tune_at``, the transferred points at their proxies' values: they run no
transfer stage, ``sweep.transfer``), writes the report again, then
``--until-resolved``'s rounds. The SLURM executor submits, per invocation,
what the finished stages allow: the tuning stage; once it is done, the
transfer stage or the confirmation stage; once that is done, one
``--until-resolved`` round.
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import TYPE_CHECKING, Sequence

from tfx_jax.records import status as status_lib
from tfx_jax.records import sweep as sweep_record
from tfx_jax.sweep import branching
from tfx_jax.sweep import state as state_lib
from tfx_jax.records.sweep import RunEntry, SweepRecord

if TYPE_CHECKING:
  from tfx_jax.report.schema import Report


def runs_to_do(record: SweepRecord, retry_failed: bool) -> list[RunEntry]:
  todo = []
  for entry in record.runs:
    if entry.state in state_lib.DONE or entry.stage in sweep_record.SUPERSEDED:
      continue
    if entry.state == "failed" and not retry_failed:
      continue
    todo.append(entry)
  return with_trunks(record, todo, retry_failed)


def with_trunks(record: SweepRecord, entries: Sequence[RunEntry],
                retry_failed: bool = False) -> list[RunEntry]:
  """``entries`` with the trunks their branched budgets need first: those of
  a ladder's new budgets added (``branching.attach``), and any not done."""
  branching.attach(record, entries)
  return [*branching.trunks_to_do(record, entries, state_lib.DONE, retry_failed), *entries]


# status.json's phases (``status.PHASES``) as the summary names them.
PHASE_NAMES = {"startup": "startup", "compile": "compile", "train_steps": "train steps",
               "evaluations": "evaluations", "checkpointing": "checkpointing"}


def time_line(sweep_dir: pathlib.Path, record: SweepRecord) -> str | None:
  """Where the runs' time went, summed over the runs (their status.json's
  ``seconds``), beside their wall time as the sweep measured it (process
  launches included); None before any run wrote it."""
  entries = [*record.runs, *record.trunks]  # a ladder's trunks are its runs' cost too
  statuses = [status_lib.read_status(state_lib.run_dir(sweep_dir, e.name)) for e in entries]
  seconds = status_lib.summed(statuses)
  if not any(seconds.values()):
    return None
  runs = sum(1 for s in statuses if s and s.seconds)
  wall = sum(e.wall_seconds for e in entries)
  what = f"{runs} run(s)" + (f", {len(record.trunks)} of them trunks" if record.trunks else "")
  line = ("  time in the runs, summed over " + f"{what}: " + ", ".join(
      f"{PHASE_NAMES[p]} {seconds[p]:.1f}s" for p in status_lib.PHASES))
  if wall > 0:
    line += (f"; wall {wall:.1f}s, of which train steps "
             f"{100 * seconds['train_steps'] / wall:.0f}%")
  return line


def summary(record: SweepRecord, elapsed: float, sweep_dir: pathlib.Path | None = None
            ) -> str:
  counts = state_lib.counts(record)
  trunks = ""
  if record.trunks:
    done = sum(1 for t in record.trunks if t.state in state_lib.DONE)
    trunks = f"; trunks: {done} of {len(record.trunks)} done"
  lines = [f"sweep {record.name}: " + ", ".join(
      f"{n} {s}" for s, n in counts.items() if n) + trunks + f" ({elapsed:.0f}s)"]
  for entry in record.runs:
    if entry.state in ("failed", "diverged"):
      lines.append(f"  {entry.state}: {entry.name}: {entry.reason}")
  compiles = [e.compile_seconds for e in record.runs
              if isinstance(e.compile_seconds, (int, float))]
  if compiles:
    lines.append("  compile seconds per run: " + ", ".join(f"{c:.1f}" for c in compiles))
  spent = time_line(sweep_dir, record) if sweep_dir is not None else None
  if spent:
    lines.append(spent)
  return "\n".join(lines)


def execute(args, sweep_dir: pathlib.Path, record: SweepRecord, header: str,
            user_env: dict[str, str], candidates: Sequence[RunEntry] = ()) -> int:
  """Runs what is left of the sweep; returns the process exit code.
  ``candidates``: a sweep with ``tune_at``'s transferred points at every
  value of their grids (``cli.candidate_entries``), of which the transfer
  stage runs those at the values their proxies chose (the confirmation
  stage copies them, on a sweep with confirmation seeds)."""
  def save():
    sweep_record.write(sweep_dir, record)

  save()
  todo = runs_to_do(record, args.retry_failed)
  skipped_failed = [e.name for e in _failed(record) if not args.retry_failed]
  print(header, flush=True)
  if skipped_failed:
    print(f"  leaving {len(skipped_failed)} failed run(s) alone (--retry-failed reruns "
          f"them): {', '.join(skipped_failed)}")
  if args.executor == "slurm":
    return _submit(args, sweep_dir, record, todo, save, user_env, candidates)
  start = time.time()
  code = _run_local(args, sweep_dir, record, todo, save, user_env)
  if code:
    return code
  print(summary(record, time.time() - start, sweep_dir), flush=True)
  report = _write_report(sweep_dir)
  if record.tune_at and report is not None:
    code, report = _transfer_stage(args, sweep_dir, record, report, save, user_env,
                                   candidates)
    if code:
      return code
  if record.confirm and report is not None:
    code, report = _confirmation_stage(args, sweep_dir, record, report, save, user_env,
                                       candidates)
    if code:
      return code
  while args.until_resolved and report is not None:
    from tfx_jax.sweep import adaptive  # pylint: disable=import-outside-toplevel
    added = with_trunks(record, adaptive.add_seeds(record, report, args.until_resolved))
    if not added:
      unresolved = [r for r in report.comparisons if r.verdict == "unresolved"]
      print(f"  --until-resolved: {len(unresolved)} comparison(s) unresolved"
            + (f" at the seed budget ({args.until_resolved})" if unresolved else ""),
            flush=True)
      break
    save()
    print(f"  --until-resolved: one more seed for {len(added)} point(s): "
          + ", ".join(e.name for e in added), flush=True)
    code = _run_local(args, sweep_dir, record, added, save, user_env)
    if code:
      return code
    report = _write_report(sweep_dir)
  return 1 if _failed(record) else 0


def _failed(record: SweepRecord) -> list[RunEntry]:
  """The failed runs that still count: not superseded confirmation runs."""
  return [e for e in record.runs if e.state == "failed"
          and e.stage not in sweep_record.SUPERSEDED]


def _confirmation_stage(args, sweep_dir, record, report, save, user_env, candidates=()
                        ) -> tuple[int, Report | None]:
  """Adds the confirmation runs the finished tuning stage allows and runs
  them (``candidates``: the transferred points', as ``execute``'s); (exit
  code, the report written after them)."""
  from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
  _print_stale(record, report)
  before = _stages(record)
  added = with_trunks(record, confirm.add_confirmation(record, report, candidates))
  moved = _stages(record) != before
  if not added:
    reason = confirm.waiting(record)
    if reason:
      print(f"  confirmation stage: {reason}", flush=True)
    if moved:  # back to runs the point has already: nothing to run, the report changes
      save()
      return 0, _write_report(sweep_dir)
    return 0, report
  save()
  print(f"  confirmation stage: {len(added)} run(s), seeds "
        f"{confirm.seeds_text(record.confirmation_seeds())} at each point's chosen value: "
        + ", ".join(e.name for e in added), flush=True)
  start = time.time()
  code = _run_local(args, sweep_dir, record, added, save, user_env)
  if code:
    return code, report
  print(summary(record, time.time() - start, sweep_dir), flush=True)
  return 0, _write_report(sweep_dir)


def _transfer_stage(args, sweep_dir, record, report, save, user_env, candidates
                    ) -> tuple[int, Report | None]:
  """Adds the transferred points' runs the finished tuning stage allows and
  runs them (``sweep.transfer``); (exit code, the report written after them)."""
  from tfx_jax.sweep import transfer  # pylint: disable=import-outside-toplevel
  before = _stages(record)
  added = with_trunks(record, transfer.add_transfer(record, report, candidates))
  moved = _stages(record) != before
  if not added:
    reason = transfer.waiting(record)
    if reason and not transfer.runs_none(record):  # else the confirmation stage says it
      print(f"  transfer stage: {reason}", flush=True)
    if moved:
      save()
      return 0, _write_report(sweep_dir)
    return 0, report
  save()
  print(f"  transfer stage: {len(added)} run(s) at the values chosen at the proxy "
        "sizes: " + ", ".join(e.name for e in added), flush=True)
  start = time.time()
  code = _run_local(args, sweep_dir, record, added, save, user_env)
  if code:
    return code, report
  print(summary(record, time.time() - start, sweep_dir), flush=True)
  return 0, _write_report(sweep_dir)


def _stages(record: SweepRecord) -> list[tuple[str, str]]:
  """Each run's stage, which the confirmation stage may move."""
  return [(e.name, e.stage) for e in record.runs]


def _print_stale(record: SweepRecord, report: Report) -> None:
  """Prints each stale confirmation that the confirmation stage is about to
  move (``confirm.add_confirmation``)."""
  from tfx_jax.report.context import tuned_key  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
  stale = confirm.stale_points(record, report) if confirm.waiting(record) is None else []
  for point, value in stale:
    label = ", ".join(f"{k}={v}" for k, v in point.values.items()) or "base"
    print(f"  confirmation stage: point {label} is stale: confirmed at {tuned_key(value)}, "
          f"{point.chosen_label or 'nothing'} is chosen now; its runs at "
          f"{tuned_key(value)} are superseded (kept)"
          + (f", re-confirming at {point.chosen_label}" if point.chosen is not None else ""),
          flush=True)


def _run_local(args, sweep_dir, record, todo, save, user_env) -> int:
  """Runs ``todo`` on this machine; 130 if interrupted (the state saved)."""
  if todo:
    from tfx_jax.sweep.local import LocalExecutor  # pylint: disable=import-outside-toplevel
    executor = LocalExecutor(sweep_dir, record, args.parallel, user_env,
                             retry_failed=args.retry_failed,
                             out=lambda msg: print(msg, flush=True),
                             separate_evaluations=args.separate_evaluations)
    print(f"  {len(todo)} to run, {args.parallel} at a time, "
          f"{len(executor.cores[0])} core(s) each", flush=True)
    try:
      executor.run(todo, save)
    except KeyboardInterrupt:
      state_lib.refresh(sweep_dir, record)
      save()
      print("interrupted; run the same command to resume.", file=sys.stderr)
      return 130
  else:
    print("  nothing to run: every run is finished, diverged or failed.")
  state_lib.refresh(sweep_dir, record)
  save()
  return 0


def _write_report(sweep_dir: pathlib.Path) -> Report | None:
  """Writes the report; returns it as read back from report.json (None if it failed)."""
  try:
    from tfx_jax.report import assemble, schema  # pylint: disable=import-outside-toplevel
    path = assemble.write_report(sweep_dir)
    print(f"report: {path}", flush=True)
    return schema.read(sweep_dir)
  except Exception as e:  # pylint: disable=broad-except  # the runs are what matter
    print(f"warning: the report could not be written: {type(e).__name__}: {e}",
          file=sys.stderr)
    return None


def _submit(args, sweep_dir, record, todo, save, env, candidates=()) -> int:
  from tfx_jax.core.errors import ConfigError  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import slurm  # pylint: disable=import-outside-toplevel
  queued = slurm.queued_runs(record)
  todo = [e for e in todo if e.name not in queued]
  if queued:
    print(f"  {len(queued)} run(s) already queued or running in SLURM: not resubmitted")
  if not todo and not queued and record.tune_at:
    # The tuning stage is done: its report chooses the values to transfer
    # (with confirmation seeds none is run: the confirmation stage below runs
    # the transferred points; the move keeps an earlier version's runs in step).
    from tfx_jax.sweep import transfer  # pylint: disable=import-outside-toplevel
    report = _write_report(sweep_dir)
    before = _stages(record)
    todo = with_trunks(record, transfer.add_transfer(record, report, candidates)
                       if report else [])
    if todo or _stages(record) != before:
      save()
    if todo:
      print(f"  transfer stage: {len(todo)} run(s) at the values chosen at the proxy "
            "sizes; run the same command again once they are done")
    elif transfer.waiting(record) and not transfer.runs_none(record):
      print(f"  transfer stage: {transfer.waiting(record)}")
  if not todo and not queued and record.confirm:
    # The tuning stage is done: its report chooses the values to confirm.
    from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
    report = _write_report(sweep_dir)
    if report:
      _print_stale(record, report)
    before = _stages(record)
    todo = with_trunks(record, confirm.add_confirmation(record, report, candidates)
                       if report else [])
    if todo or _stages(record) != before:
      save()
    if todo:
      print(f"  confirmation stage: {len(todo)} run(s), seeds "
            f"{confirm.seeds_text(record.confirmation_seeds())} at each point's chosen "
            "value; run the same command again once they are done")
    elif confirm.waiting(record):
      print(f"  confirmation stage: {confirm.waiting(record)}")
  if not todo and not queued and args.until_resolved:
    # One round per invocation: the runs so far are done; add the next seeds.
    from tfx_jax.sweep import adaptive  # pylint: disable=import-outside-toplevel
    report = _write_report(sweep_dir)
    todo = with_trunks(record, adaptive.add_seeds(record, report, args.until_resolved)
                       if report else [])
    if todo:
      save()
      print(f"  --until-resolved: one more seed for {len(todo)} point(s); run the same "
            "command again once they are done")
  if not todo:
    print("  nothing to submit.")
    return 0
  # A branched budget waits for its trunk's checkpoints: trunks first, their
  # budgets on the next invocation (as the stages do).
  waiting = [e for e in todo if e.trunk and (e.trunk in queued
                                            or any(t.name == e.trunk for t in todo))]
  if waiting:
    todo = [e for e in todo if e not in waiting]
    print(f"  {len(waiting)} branched budget(s) wait for their trunks: run the same command "
          "again once the trunks are done")
  try:
    job_id, script = slurm.submit_sweep(sweep_dir, record, todo, sys.executable,
                                        args.slurm_args, pathlib.Path.cwd(), env,
                                        separate_evaluations=args.separate_evaluations)
  except (ConfigError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2 if isinstance(e, ConfigError) else 1
  save()
  print(f"submitted job array {job_id} ({len(todo)} tasks): {script}")
  print(f"  progress: {record.command} --status   (logs: {sweep_dir / 'slurm'})")
  print(job_id)
  return 0
