"""``python -m tfx_jax.sweep``: declare, validate, run and inspect a sweep.

  python -m tfx_jax.sweep experiments/activations.py[:tiny] [--parallel 2]
  python -m tfx_jax.sweep --config configs/lm.py:tiny \\
      --axis model.activation=relu,swiglu --axis model.norm_type=layernorm,rmsnorm \\
      --seeds 0,1 --name act_norm [--config.train.num_steps=50 ...]

Flags: ``--dry-run`` (list the runs, run nothing; with ``--topology NAME`` also
compile each distinct program for that machine and check that it fits),
``--parallel N``,
``--executor local|slurm`` (``--slurm-args "..."``), ``--workdir`` (default
``runs/``), ``--retry-failed``, ``--separate-evaluations``, ``--status``,
``--tune``, ``--tune-at``, ``--confirm``, ``--until-resolved``, ``--relabel REPORT_DIR`` (label the
sweep's claims on a committed report, from its report.json). Every run is validated before anything runs (exit 2,
nothing written). Exit code 1 if a run failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import shlex
import sys
from typing import Any, Mapping, Sequence

from tfx_jax.records import sweep as sweep_record
from tfx_jax.core.flags import exit_code
from tfx_jax.core.errors import ConfigError
from tfx_jax.records import claims as claims_lib
from tfx_jax.records import ladder as ladder_record
from tfx_jax.records.ladder import LadderPlan
from tfx_jax.records import transfer as transfer_lib
from tfx_jax.run.config_base import load_config_file
from tfx_jax.sweep import adaptive
from tfx_jax.sweep import ladder as ladder_plan
from tfx_jax.sweep import spec as spec_lib
from tfx_jax.sweep import state as state_lib
from tfx_jax.sweep import validate
from tfx_jax.records.sweep import AxisRecord, ReportOptions, RunEntry, SweepRecord


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m tfx_jax.sweep", allow_abbrev=False,
      description="Run an ablation sweep: every point an ordinary training run in "
      "WORKDIR/<sweep>/<run>. Extra arguments --config.a.b=v apply to every run.")
  p.add_argument("sweep", nargs="?", help="experiments/<name>.py[:variant]")
  p.add_argument("--config", help="base config without a sweep file, e.g. configs/lm.py:tiny")
  p.add_argument("--axis", action="append", default=[], metavar="PATH=V1,V2",
                 help="an axis (repeatable; product of axes); 'a=1,2;b=3,4' zips fields")
  p.add_argument("--tune", action="append", default=[], metavar="PATH=V1,V2[@AXIS=V]",
                 help="a tuned field (repeatable; product): every point runs at every "
                 "value and is compared at its best, e.g. optim.learning_rate=1e-3,3e-3; "
                 "'@AXIS_FIELD=VALUE' (repeatable: all must hold) tunes it only at the "
                 "points with that axis value, a flag per grid, e.g. "
                 "optim.learning_rate=1e-4,3e-4@optim.optimizer=lion"),
  p.add_argument("--tune-at", action="append", default=[], metavar="AXIS_FIELD=V1[,V2]",
                 help="tune only at these proxy sizes (values of an axis field, e.g. "
                 "model.d_model=64 or model.d_model=32,64; a flag per field): every "
                 "other point runs at the value chosen at the nearest proxy size below "
                 "it, after the tuning stage (needs --tune)")
  p.add_argument("--ladder", metavar="PATH=V1,V2[;PATH=V1,V2]",
                 help="a ladder of model sizes, zipped fields as --axis zips them, e.g. "
                 "'model.d_model=64,128,256;model.num_heads=2,4,8': every variant, tuned "
                 "value and seed runs at every rung and at every --tokens-per-param "
                 "budget (docs/scaling.md)")
  p.add_argument("--tokens-per-param", metavar="T1,T2",
                 help="with --ladder: the budgets, in training tokens per non-embedding "
                 "parameter of each rung, e.g. 10,20")
  p.add_argument("--no-branch", action="store_true",
                 help="run every budget of a ladder from scratch (default with "
                 "optim.schedule=wsd: the budgets branch from one trunk run's stable phase)")
  p.add_argument("--share-tuning", action="store_true",
                 help="with --ladder and --tune: the budgets of each rung and variant share "
                 "one tuned value, the one with the lowest mean validation score over the "
                 "budgets, so their confirmation runs branch from one trunk (default: each "
                 "budget chooses its own; docs/scaling.md)")
  p.add_argument("--select-by", help="metric that picks each point's tuned values on "
                 "the validation split (default: the sweep's, or eval/loss)")
  p.add_argument("--confirm", type=int, default=None, metavar="N",
                 help="after the tuning stage, each point runs N fresh seeds (the same "
                 "for every point, right above the tuning seeds) at its chosen tuned "
                 "values; the verdicts read those runs only (default: the sweep's, or 0)")
  p.add_argument("--seeds", help="seeds, e.g. 0,1,2 or 0-4 (default: the sweep's, or 0)")
  p.add_argument("--name", help="sweep name (directory under --workdir)")
  p.add_argument("--workdir", default="runs", help="parent of the sweep directory")
  p.add_argument("--dry-run", action="store_true", help="list every run; run nothing")
  p.add_argument("--relabel", metavar="REPORT_DIR", default=None,
                 help="label the claims this sweep declares on the report already in "
                 "REPORT_DIR (docs/results/<name>), from its report.json alone, when its "
                 "runs are gone: rewrites report.json's claims and report.md's claims "
                 "block; runs nothing")
  p.add_argument("--topology", help="with --dry-run: compile every run for this machine "
                 "(v5e-16, v4-32, cpu-8, ...; python -m tfx_jax.compile) and check that "
                 "it fits; exit 1 if one does not")
  p.add_argument("--parallel", type=int, default=1, help="runs at a time (local)")
  p.add_argument("--executor", choices=("local", "slurm"), default="local")
  p.add_argument("--slurm-args", default="", help='extra sbatch arguments, e.g. '
                 '"--partition=gpu --gres=gpu:1 --time=4:00:00"')
  p.add_argument("--retry-failed", action="store_true", help="run failed runs again")
  p.add_argument("--separate-evaluations", action="store_true",
                 help="run each evaluation after training as its own python -m "
                 "tfx_jax.evaluate process (default: in the training process)")
  p.add_argument("--status", action="store_true",
                 help="show each run's state (and SLURM's queue), the unresolved "
                 "comparisons, each point's seeds and any stale confirmation; run nothing")
  p.add_argument("--stall-margin", type=float, default=None,
                 help="the report's stall margin in nats (default 0.05; see "
                 "python -m tfx_jax.report --help)")
  p.add_argument("--equivalence-margin", type=float, default=None,
                 help="the report's equivalence margin of the selection metric "
                 "(default 0.01 nats for losses, 0.5 for BLEU)")
  p.add_argument("--until-resolved", type=int, default=0, metavar="MAX_SEEDS",
                 help="after the runs, add seeds one at a time to the points of "
                 "unresolved comparisons until all are resolved or the points have "
                 "MAX_SEEDS seeds (confirmation seeds, on a tuned sweep: needs --confirm)")
  return p


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
  """Separates ``--config.a.b=v`` overrides from the other arguments."""
  rest, overrides = [], {}
  for arg in argv:
    if arg.startswith("--config."):
      path, eq, value = arg[len("--config."):].partition("=")
      if not eq:
        raise ConfigError(f"{arg}: write overrides as --config.a.b=VALUE.")
      overrides[path] = value
    else:
      rest.append(arg)
  return rest, overrides


def declared_sweep(args, cli_overrides: dict[str, str]) -> spec_lib.Sweep:
  """The sweep from its file or from --config/--axis, with --seeds/--name applied."""
  if args.sweep:
    if args.config or args.axis:
      raise ConfigError("give either a sweep file or --config with --axis, not both.")
    sweep = spec_lib.load_experiment(args.sweep)
  elif args.config:
    axes = [spec_lib.parse_axis_flag(a) for a in args.axis]
    fields = [f.split(".")[-1] for a in axes for f in a]
    sweep = spec_lib.Sweep(name=args.name or "_".join(fields) or "sweep",
                           config=args.config, axes=axes)
  else:
    raise ConfigError("name a sweep file (experiments/<name>.py[:variant]) or a base "
                      "config (--config configs/lm.py:tiny --axis ...).")
  changes: dict[str, Any] = {}
  if args.seeds:
    changes["seeds"] = spec_lib.parse_seeds(args.seeds)
  if args.name:
    changes["name"] = args.name
  if args.tune:
    changes["tune"] = spec_lib.parse_tune_flags(args.tune)
  if args.tune_at:
    changes["tune_at"] = spec_lib.parse_tune_at_flags(args.tune_at)
  if args.ladder or args.tokens_per_param:
    changes["ladder"] = ladder_plan.parse_flags(args.ladder, args.tokens_per_param)
  for given, flag, change, what in (
      (args.no_branch, "--no-branch", {"branch": False}, "would branch"),
      (args.share_tuning, "--share-tuning", {"share_tuning": True},
       "would share a tuned value")):
    if not given:
      continue
    ladder = changes.get("ladder", sweep.ladder)
    if ladder is None:
      raise ConfigError(f"{flag}: the sweep has no ladder (--ladder, or "
                        f"Sweep(ladder=...)) whose budgets {what}.")
    changes["ladder"] = dataclasses.replace(ladder, **change)
  if args.select_by:
    changes["select_by"] = args.select_by
  if args.confirm is not None:
    if args.confirm < 1:
      raise ConfigError(f"--confirm={args.confirm}: the number of confirmation seeds per "
                        "point, >= 1.")
    changes["confirm"] = args.confirm
  sweep = dataclasses.replace(sweep, **changes)
  check_confirm(sweep)
  if spec_lib.safe(sweep.name) != sweep.name:
    raise ConfigError(f"sweep name {sweep.name!r}: use letters, digits, '.', '+', '-', '_'.")
  # Command-line strings become typed values (the fields' own types).
  base = load_config_file(sweep.config)
  overrides = {k: validate.coerce(base, k, v)
               for k, v in {**dict(sweep.overrides), **cli_overrides}.items()}
  axes = []
  for axis in sweep.axes:
    norm = spec_lib.normalize_axis(axis)
    try:
      axes.append([{k: validate.coerce(base, k, v) for k, v in value.items()}
                   for value in norm.values])
    except ConfigError as e:
      raise ConfigError(f"axis {norm.label}: {e}") from None
  tune = {}
  for field, grids in sweep_record.tune_grids(sweep.tune).items():
    try:
      tune[field] = tuple(sweep_record.TunedGrid(
          tuple(validate.coerce(base, field, v) for v in g.values),
          {k: validate.coerce(base, k, v) for k, v in g.when.items()}) for g in grids)
    except ConfigError as e:
      raise ConfigError(f"tune {field}: {e}") from None
  ladder = sweep.ladder
  if ladder is not None:
    ladder = ladder_record.check_declaration(ladder)
    if ladder.share_tuning and not tune:
      raise ConfigError("ladder share_tuning=True (--share-tuning): the sweep tunes nothing "
                        "(tune=..., --tune), so there is no tuned value to share.")
    try:
      ladder = dataclasses.replace(ladder, rungs=tuple(
          {k: validate.coerce(base, k, v) for k, v in rung.items()} for rung in ladder.rungs))
    except ConfigError as e:
      raise ConfigError(f"ladder: {e}") from None
  # The proxy sizes as the axis values are (typed); a field no axis sets is
  # left for ``expand`` to name with the axes' fields.
  axis_fields = {k for a in axes for v in a for k in v}
  if ladder is not None:
    axis_fields |= set(ladder.rungs[0])
  tune_at = {}
  for field, values in sweep_record.tune_at_pairs(sweep.tune_at or {}):
    try:
      tune_at[field] = [validate.coerce(base, field, v) if field in axis_fields else v
                        for v in values]
    except ConfigError as e:
      raise ConfigError(f"tune_at {field}: {e}") from None
  # A pair's values as the axes' are (typed), so that each side matches its axis value.
  comparisons = []
  for pair in sweep.comparisons:
    sides = spec_lib.pair_sides(pair)
    try:
      comparisons.append(tuple({k: validate.coerce(base, k, v) for k, v in side.items()}
                               for side in sides))
    except ConfigError as e:
      raise ConfigError(f"comparison {' vs '.join(map(spec_lib.value_text, sides))}: "
                        f"{e}") from None
  evaluations = [spec_lib.normalize_evaluation(e) for e in sweep.evaluations]
  settable = list(dict.fromkeys([*overrides, *(k for a in axes for v in a for k in v),
                                 *tune]))
  for i, e in enumerate(evaluations):
    for k, v in e.when.items():
      if k not in settable:
        raise ConfigError(f"evaluation {list(e.args)} when {k}: no axis, tuned field or "
                          f"override of this sweep sets it; choose from {settable}.")
    evaluations[i] = dataclasses.replace(
        e, when={k: validate.coerce(base, k, v) for k, v in e.when.items()})
  test = spec_lib.Evaluation(tuple(TEST_EVALUATION))
  if tune and report_split(base, overrides) == "test" and test not in evaluations:
    evaluations.append(test)
  return dataclasses.replace(sweep, overrides=overrides, axes=axes, tune=tune,
                             evaluations=evaluations, comparisons=comparisons,
                             tune_at=tune_at, ladder=ladder)




def check_confirm(sweep: spec_lib.Sweep) -> None:
  """Confirmation seeds need a selection to confirm: tuned fields (ConfigError)."""
  if isinstance(sweep.confirm, bool) or not isinstance(sweep.confirm, int) or (
      sweep.confirm < 0):
    raise ConfigError(f"confirm={sweep.confirm!r}: the number of confirmation seeds per "
                      "point, an integer >= 0.")
  if sweep.confirm and not sweep.tune:
    raise ConfigError(
        f"confirm={sweep.confirm} (--confirm): the sweep tunes no field, so there is no "
        "selection to confirm; its verdicts already read runs no selection saw. Declare "
        "tuned fields (--tune PATH=V1,V2) or leave --confirm out.")


def check_until_resolved(sweep: spec_lib.Sweep, max_seeds: int) -> None:
  """``--until-resolved`` on a tuned sweep adds confirmation seeds (ConfigError
  without them: more of the seeds that chose would not remove their bias)."""
  if max_seeds < 0:
    raise ConfigError(f"--until-resolved={max_seeds}: must be a number of seeds >= 1.")
  if max_seeds and sweep.tune and not sweep.confirm:
    raise ConfigError(
        f"--until-resolved {max_seeds} on a tuned sweep without confirmation seeds: its "
        "verdicts read the seeds that chose each point's value, and adding more of them "
        "does not remove that bias. Add --confirm N (fresh seeds at the chosen values; "
        "--until-resolved then adds confirmation seeds, up to MAX_SEEDS per point).")


def transfer_band(sweep: spec_lib.Sweep) -> float:
  """The sweep's ``transfer_band``, a factor per doubling of size > 1 (ConfigError)."""
  band = sweep.transfer_band
  if isinstance(band, bool) or not isinstance(band, (int, float)) or not band > 1:
    raise ConfigError(f"transfer_band={band!r}: the factor per doubling of size within which "
                      "a variant's optimum learning rate counts as transferred, a number > 1 "
                      "(the default sqrt(2): 1.41x either way).")
  return float(band)


def until_resolved_budget(max_seeds: int, previous: SweepRecord | None) -> int | None:
  """The MAX_SEEDS sweep.json keeps (``SweepRecord.until_resolved``): the first
  ``--until-resolved`` given fixes it, since the report's sequential test
  splits alpha over the looks it allows before seeing any of them; an
  invocation without the flag keeps it. A different budget later is a
  ConfigError: alpha already split cannot be split again after a look, and
  re-splitting it would bring back the optional stopping the test removes."""
  kept = previous.until_resolved if previous else None
  if not max_seeds:
    return kept
  if kept is not None and kept != max_seeds:
    raise ConfigError(
        f"--until-resolved {max_seeds}: this sweep's seeds are added up to {kept} "
        f"(--until-resolved {kept}, in sweep.json): its verdicts' sequential test spends "
        f"alpha over the looks that budget allows, fixed before the first look. Run it "
        f"with --until-resolved {kept} (or without the flag), or start a new sweep "
        "(--name, other --seeds) with the new budget.")
  return max_seeds


def warn_if_already_tested(sweep_dir: pathlib.Path) -> None:
  """A warning where ``--until-resolved`` comes to a sweep whose report
  already tested its comparisons at the full alpha: a design declared after
  a look does not undo that look (continuing because it was unresolved is
  optional stopping again). Its guarantee holds when it is declared on the
  sweep's first invocation."""
  from tfx_jax.report import schema  # pylint: disable=import-outside-toplevel
  try:
    report = schema.read(sweep_dir)
  except (ValueError, KeyError):  # unreadable: nothing to say about it
    return
  if report is not None and any(c.p_adjusted is not None for c in report.comparisons):
    print(f"warning: {sweep_dir / schema.FILENAME} already tested this sweep's "
          "comparisons at the full alpha, before --until-resolved was declared; the "
          "sequential test keeps alpha for looks planned before the first, so adding "
          "seeds now because a verdict was unresolved can raise the chance of a false "
          "one. Declare --until-resolved on a sweep's first invocation.", file=sys.stderr)


# A tuned sweep evaluates every run on the split its selection never reads.
TEST_EVALUATION = ["--split", "test"]


def report_split(base, overrides: dict[str, Any]) -> sweep_record.Split:
  """``test`` where the sweep's dataset has one, else ``validation`` (the
  report then reserves the first seed for the selection)."""
  from tfx_jax.data import sources  # pylint: disable=import-outside-toplevel
  name = overrides.get("data.name", base.data.name)
  data_dir = overrides.get("data.data_dir", base.data.data_dir)
  return "test" if sources.has_split(name, "test", data_dir) else "validation"


def build_record(sweep: spec_lib.Sweep, axes: Sequence[spec_lib.Axis],
                 runs: Sequence[spec_lib.Run], command: str, previous: SweepRecord | None,
                 report_options: ReportOptions = ReportOptions(),
                 notes: Mapping[str, Sequence[str]] | None = None,
                 until_resolved: int | None = None,
                 ladder: LadderPlan | None = None) -> SweepRecord:
  """sweep.json's record; attempts, times, SLURM jobs and added seeds carried
  over from ``previous``. ``notes``: {run name: what validation noted};
  ``until_resolved``: the MAX_SEEDS kept (``until_resolved_budget``).
  ``runs`` of stage ``transfer`` (a sweep with ``tune_at``) are not the
  record's runs: the transfer stage adds the ones it runs, or, with
  confirmation seeds, the confirmation stage copies them
  (``candidate_entries``, ``sweep.transfer``)."""
  fields = [f for a in axes for f in a.fields if f != ladder_record.BUDGET_FIELD]
  base = validate.base_values(sweep.config, sweep.overrides, fields)
  if sweep.tune_at:  # the rule a transferred value carries over by
    base.update(validate.base_values(sweep.config, sweep.overrides,
                                     [transfer_lib.PARAMETRIZATION]))
  old = {e.name: e for e in previous.runs} if previous else {}
  evaluations = tuple(spec_lib.normalize_evaluation(e) for e in sweep.evaluations)
  entries = []
  for entry in candidate_entries(sweep, [r for r in runs if r.stage == "tune"], notes):
    entry.inherit(old.get(entry.name))
    entries.append(entry)
  references = [spec_lib.reference_index(a, base) for a in axes]
  pairs = spec_lib.comparison_pairs(sweep.comparisons, axes, references)
  test = spec_lib.Evaluation(tuple(TEST_EVALUATION))
  record = SweepRecord(
      name=sweep.name, description=sweep.description, config=sweep.config,
      overrides=dict(sweep.overrides), seeds=tuple(sweep.seeds), evaluations=evaluations,
      tune=sweep_record.tune_grids(sweep.tune), select_by=sweep.select_by,
      tune_at=sweep_record.tune_at_pairs(sweep.tune_at or {}),
      confirm=sweep.confirm, until_resolved=until_resolved,
      report_split="test" if test in evaluations else "validation",
      axes=tuple(AxisRecord(a.label, tuple(a.fields), tuple(dict(v) for v in a.values),
                            references[i], tuple((v, b) for j, v, b in pairs if j == i))
                 for i, a in enumerate(axes)),
      base_values=base, command=command, cwd=os.getcwd(),
      created=(previous.created if previous and previous.created else sweep_record.now()),
      slurm_jobs=list(previous.slurm_jobs) if previous else [], runs=entries,
      report_options=report_options, claims=claims_lib.check_all(sweep.claims),
      transfer_band=transfer_band(sweep), ladder=ladder,
      trunks=list(previous.trunks) if previous else [])
  adaptive.restore_added(record, previous, {
      e.name: e for e in candidate_entries(sweep, [r for r in runs if r.stage == "transfer"],
                                           notes)})
  if ladder is not None:  # the budgets' trunks, as an earlier invocation made them
    from tfx_jax.sweep import branching  # pylint: disable=import-outside-toplevel
    branching.attach(record)
  # A claim the sweep cannot test: exit 2, nothing written (the report's
  # statistics load only where a sweep declares claims).
  if record.claims:
    from tfx_jax.report import claim_checks  # pylint: disable=import-outside-toplevel
    claim_checks.check_sweep(record)
  return record


def candidate_entries(sweep: spec_lib.Sweep, runs: Sequence[spec_lib.Run],
                      notes: Mapping[str, Sequence[str]] | None = None) -> list[RunEntry]:
  """The record's entries of ``runs`` (pending): the declared runs, or a
  transferred point's runs at every value of its grid, of which the transfer
  stage adds those at its proxy's choice (stage ``transfer``; with
  confirmation seeds, the confirmation stage's runs copy them instead)."""
  evaluations = tuple(spec_lib.normalize_evaluation(e) for e in sweep.evaluations)
  return [RunEntry(name=run.name, seed=run.seed, values=tuple(dict(v) for v in run.values),
                   overrides=dict(run.overrides), tuned=dict(run.tuned),
                   evaluations=sweep_record.evaluations_for(evaluations, run.overrides),
                   notes=tuple((notes or {}).get(run.name, ())),
                   stage="transfer" if run.stage == "transfer" else "tune")
          for run in runs]


def relabel(record: SweepRecord, report_dir: pathlib.Path) -> int:
  """``--relabel REPORT_DIR``: the sweep's claims labelled on a committed report."""
  from tfx_jax.report import assemble  # pylint: disable=import-outside-toplevel
  from tfx_jax.report.sections import claims  # pylint: disable=import-outside-toplevel
  if not (report_dir / "report.json").is_file():
    raise ConfigError(f"--relabel {report_dir}: no report.json there to relabel.")
  if not record.claims:
    raise ConfigError(f"--relabel: the sweep {record.name} declares no claims "
                      "(Sweep(claims=[...])).")
  path = assemble.relabel(report_dir, record)
  text = path.read_text()
  print(text.split(claims.BEGIN, 1)[1].split(claims.END, 1)[0].strip())
  print(f"relabelled: {path} and {path.with_suffix('.json')}")
  return 0


def print_runs(record: SweepRecord, sweep_dir: pathlib.Path, queued=None) -> None:
  width = max(len(r.name) for r in record.runs)
  for r in record.runs:
    axis = " ".join(f"{k}={spec_lib.format_value(v)}"
                    for value in [*r.values, r.tuned] for k, v in value.items())
    slurm = f"  slurm {queued[r.name]}" if queued and r.name in queued else ""
    reason = f"  ({r.reason})" if r.reason else ""
    stage = f"{r.stage:<10} " if record.confirm or record.tune_at else ""
    print(f"  {r.name:<{width}}  {stage}{r.state:<8} step {r.step:<6} "
          f"{axis} seed={r.seed}{slurm}{reason}")


def reproduce_command(argv: list[str]) -> str:
  drop = {"--dry-run", "--status", "--retry-failed"}
  return "python -m tfx_jax.sweep " + shlex.join(a for a in argv if a not in drop)


def main(argv: list[str] | None = None) -> int:
  """The command's exit code: 2 for bad input (nothing written), 1 if a run failed."""
  return exit_code(_sweep, list(sys.argv[1:] if argv is None else argv))


def _sweep(argv: list[str]) -> int:
  rest, cli_overrides = split_overrides(argv)
  args = _parser().parse_args(rest)
  if args.parallel < 1:
    raise ConfigError(f"--parallel={args.parallel}: must be >= 1.")
  if args.stall_margin is not None and args.stall_margin < 0:
    raise ConfigError(f"--stall-margin={args.stall_margin}: must be >= 0 (nats).")
  if args.equivalence_margin is not None and args.equivalence_margin <= 0:
    raise ConfigError(f"--equivalence-margin={args.equivalence_margin}: must be > 0.")
  if args.topology and not args.dry_run:
    raise ConfigError("--topology checks the runs before they are submitted: use it "
                      "with --dry-run.")
  topology = None
  if args.topology:
    from tfx_jax.scale import topology as topology_lib  # pylint: disable=import-outside-toplevel
    topology = topology_lib.parse(args.topology)  # a bad name: exit 2, nothing compiled
    topology_lib.prepare_host(topology)
  sweep = declared_sweep(args, cli_overrides)
  check_until_resolved(sweep, args.until_resolved)
  plan = None
  if sweep.ladder is not None:
    plan = ladder_plan.plan(sweep.config, sweep.overrides, sweep.ladder,
                            spec_lib.declared_axes(sweep))
  axes, every_run = spec_lib.expand(sweep, plan=plan)
  notes = validate.check_runs(sweep.config, axes, every_run)
  # A sweep with tune_at: the declared runs are the tuning points'; the
  # others' runs at every value are the transfer stage's candidates.
  runs = [r for r in every_run if r.stage == "tune"]
  sweep_dir = pathlib.Path(args.workdir) / sweep.name
  previous = sweep_record.read(sweep_dir)
  # Margins not given keep the ones an earlier invocation was given.
  kept = previous.report_options if previous else ReportOptions()
  options = ReportOptions(
      stall_margin=(args.stall_margin if args.stall_margin is not None
                    else kept.stall_margin),
      equivalence_margin=(args.equivalence_margin if args.equivalence_margin is not None
                          else kept.equivalence_margin))
  record = build_record(sweep, axes, every_run, reproduce_command(argv), previous, options,
                        notes, until_resolved_budget(args.until_resolved, previous), plan)
  candidates = candidate_entries(sweep, [r for r in every_run if r.stage == "transfer"], notes)
  if args.relabel:
    return relabel(record, pathlib.Path(args.relabel))
  if record.until_resolved and not (previous and previous.until_resolved):
    warn_if_already_tested(sweep_dir)
  state_lib.refresh(sweep_dir, record)
  n_axes = " x ".join(str(len(a.values)) for a in axes) or "1"
  if record.tune_at:  # only the proxy sizes' points run the tuning stage
    n_axes = f"{len({tuple(map(repr, r.values)) for r in runs})} tuning"
  # Each point's own grid: "6 tuned values" where every point has that many,
  # else the points' tuned values in all (per-point grids).
  per_point = {}
  for run in runs:
    per_point.setdefault(tuple(map(repr, run.values)), set()).add(repr(run.tuned))
  sizes = {len(v) for v in per_point.values()}
  tuned = ("points x " if not sweep.tune else f"points x {sizes.pop()} tuned values x "
           if len(sizes) == 1 else
           f"points, {sum(map(len, per_point.values()))} with their own tuned values, x ")
  first = (f"sweep {sweep.name}: {len(runs)} runs ({n_axes} {tuned}"
           f"{len(sweep.seeds)} seeds) in {sweep_dir}")
  stages = ""
  if record.tune_at:
    from tfx_jax.sweep import transfer  # pylint: disable=import-outside-toplevel
    stages += "\n" + transfer.plan_text(record, candidates)
  if record.confirm:
    from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
    n_points = math.prod(len(a.values) for a in axes)
    stages += (f"\n  then the confirmation stage: {n_points} points x {record.confirm} "
              f"seeds ({confirm.seeds_text(record.confirmation_seeds())}), each point at "
              "the tuned values its tuning stage chose"
              + (", the transferred points at their proxies' values" if record.tune_at
                 else "") + "; the verdicts read these runs only")
  if record.ladder is not None:
    from tfx_jax.sweep import branching  # pylint: disable=import-outside-toplevel
    stages += "\n" + "\n".join(ladder_plan.table(record.ladder))
    saved = branching.steps_text(record)
    if saved:
      stages += "\n" + saved
  header = first + stages
  if args.dry_run:
    print(first + "  [dry run: nothing written]" + stages)
    print(f"  base: {sweep.config} " + " ".join(
        f"--config.{k}={spec_lib.format_value(v)}" for k, v in sweep.overrides.items()))
    for r in record.runs:
      axis = " ".join(
          f"--config.{k}={spec_lib.format_value(v)}" if k != ladder_record.BUDGET_FIELD
          else f"--config.train.num_steps={r.overrides['train.num_steps']}"
          for value in [*r.values, r.tuned] for k, v in value.items())
      print(f"  {r.name}  {r.state}  {sweep_dir / r.name}  {axis} "
            f"--config.seed={r.seed}")
      for note in r.notes:
        print(f"      note: {note}")
      if r.trunk:
        print(f"      branches from {r.trunk} at step {r.overrides['train.branch_step']}")
      for e in r.evaluations:
        print(f"      then: python -m tfx_jax.evaluate {shlex.join(e)}")
    for t in record.trunks:
      print(f"  {t.name}  {t.state}  {sweep_dir / t.name}  trunk: trains to step "
            f"{t.overrides['train.stop_step']} of {t.overrides['train.num_steps']}, keeps "
            f"steps {', '.join(map(str, t.overrides['checkpoint.keep_steps']))}")
    if topology is not None:
      from tfx_jax.scale import sweep_check  # pylint: disable=import-outside-toplevel
      # The transferred points' runs too: their sizes are other programs.
      return sweep_check.check_runs(sweep.config, every_run, topology)
    return 0
  if args.status:
    from tfx_jax.report import schema  # pylint: disable=import-outside-toplevel
    from tfx_jax.sweep import slurm  # pylint: disable=import-outside-toplevel
    print(header)
    print_runs(record, sweep_dir, slurm.queued_runs(record))
    print("  " + ", ".join(f"{n} {s}" for s, n in state_lib.counts(record).items() if n))
    report = schema.read(sweep_dir)
    if record.tune_at:
      from tfx_jax.sweep import transfer  # pylint: disable=import-outside-toplevel
      print("\n".join(transfer.status_lines(record, report)))
    if record.confirm:
      from tfx_jax.sweep import confirm  # pylint: disable=import-outside-toplevel
      print("\n".join(confirm.status_lines(record, report)))
    if report is not None:
      print(f"comparisons (from {sweep_dir / schema.FILENAME}):")
      print("\n".join(adaptive.unresolved_lines(record, report)))
    return 0
  from tfx_jax.sweep import execute  # pylint: disable=import-outside-toplevel
  return execute.execute(args, sweep_dir, record, header, dict(os.environ), candidates)
