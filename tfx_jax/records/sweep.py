"""``runs/<sweep>/sweep.json``: what a sweep is and where each of its runs stands.

  SweepRecord   the declaration as run (config, overrides, seeds, axes with
                their base values, tuned grids (``TunedGrid``: a field's
                values for every point, or for the points whose axis
                values match), the proxy sizes of ``tune_at``,
                confirmation seeds, evaluations), the
                command that reproduces it, the SLURM jobs,
                the runs added after the declared ones (the transfer and
                confirmation stages, ``--until-resolved``) and the budget of the latter,
                the report's margins, and its runs
  RunEntry      one run: name, seed, axis values, tuned values, every
                override it is trained with, its evaluations, its stage (the
                tuning stage, a transferred value, a confirmation seed, or a
                superseded one), and
                where it stands (state, step, reason, attempts, times)

``python -m tfx_jax.sweep`` writes it (``write``: atomically, as
``status.json`` is written for a run) and rewrites it whenever a run
changes; the executors update the entries' bookkeeping from the runs' own
workdirs; the report reads it (``read``). It sits below both packages: the
sweep writes it and calls the report, the report reads it, so neither
package imports the other's record module.

Override values are the fields' own Python types (``validate.coerce`` made
them so once, from the command line's strings): a learning rate is a float
in memory, in this file and in the run's ``run_spec.json``
(``records.run_spec``), which its process trains from.

sweep.json is ``SweepRecord.to_json`` and reads back with
``SweepRecord.from_json`` (``records.serial``, from these types). Files
written by earlier versions load (the migrations at the end, the one place
that knows the older shapes, run first), so a sweep started before resumes
and reports with the same command.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import pathlib
import shlex
from typing import Annotated, Any, Literal, Mapping, Sequence

from tfx_jax.core import atomic as files
from tfx_jax.core.errors import ConfigError
from tfx_jax.records import serial
from tfx_jax.records.ladder import LadderPlan
from tfx_jax.records.claims import Claim

FILENAME = "sweep.json"
# The transfer check's default band: the optimum may move by sqrt(2) per
# doubling of size either way (0.5 in log2 units) and still count as transferred.
TRANSFER_BAND = math.sqrt(2)

State = Literal["pending", "running", "finished", "diverged", "failed"]
# The split a sweep's comparisons read: test where the dataset has one (the
# selection of tuned values reads validation only), else validation.
Split = Literal["test", "validation"]
# The stage a run belongs to. ``tune``: the declared runs (every point at every
# tuned value and declared seed; a sweep without tuned fields has only
# these). ``confirm``: a point's fresh seeds at the tuned value its tuning
# stage chose (``Sweep(confirm=N)``), the only runs a confirmed sweep's
# verdicts read. ``superseded``: confirmation runs at a value the point no
# longer chooses (its grid widened, tuning runs added since): kept on disk and
# in this record, never run again, read by no verdict (``sweep.confirm``).
# ``transfer``: a point of a sweep with ``tune_at`` that is not a proxy size,
# at the value its proxy's tuning stage chose, on the declared seeds
# (``sweep.transfer``; none on a sweep with confirmation seeds, whose
# confirmation stage runs such a point); ``superseded_transfer``: such runs at a value the
# proxy no longer chooses (kept, never run again, read by no verdict).
Stage = Literal["tune", "confirm", "superseded", "transfer", "superseded_transfer"]
# The stages whose runs are kept but never run again nor read by a verdict.
SUPERSEDED: tuple[Stage, ...] = ("superseded", "superseded_transfer")
# The stages whose runs are a point's runs at its tuned values on the declared
# seeds: every value at a tuning point, the transferred value elsewhere.
DECLARED: tuple[Stage, ...] = ("tune", "transfer")


def now() -> str:
  """A timestamp of sweep.json and the sweep's logs: UTC, to the second."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """``python -m tfx_jax.evaluate --workdir RUN *args`` after a run's training,
  for the runs whose overrides match ``when`` (every run when it is empty)."""
  args: tuple[str, ...]
  when: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def applies(self, overrides: Mapping[str, Any]) -> bool:
    return all(k in overrides and overrides[k] == v for k, v in self.when.items())


def parse_evaluation(data: Any) -> Evaluation:
  """An evaluation declared (or read from sweep.json) as an argument list or
  {"args", "when"} (ConfigError naming what is wrong)."""
  if isinstance(data, Mapping):
    unknown = set(data) - {"args", "when"}
    if unknown or "args" not in data:
      raise ConfigError(f"an evaluation given as a dict has keys 'args' and optionally "
                        f"'when', got {sorted(data)}.")
    args, when = data["args"], data.get("when") or {}
  else:
    args, when = data, {}
  if isinstance(args, str) or not all(isinstance(a, str) for a in args):
    raise ConfigError(f"an evaluation's arguments are a list of strings, got {args!r}.")
  return Evaluation(tuple(args), dict(when))


# sweep.json's form of an evaluation: its argument list, or {"args", "when"}
# when it is conditional.
serial.form(Evaluation,
            lambda e: {"args": list(e.args), "when": dict(e.when)} if e.when else list(e.args),
            parse_evaluation)


def evaluations_for(evaluations: Sequence[Evaluation], overrides: Mapping[str, Any]
                    ) -> tuple[tuple[str, ...], ...]:
  """The argument lists of ``evaluations`` that apply to a run with these
  overrides, in declared order."""
  return tuple(e.args for e in evaluations if e.applies(overrides))


@dataclasses.dataclass(frozen=True)
class TunedGrid:
  """A tuned field's values at the points whose overrides match ``when``
  (every point where it is empty), as evaluations are conditional: each
  optimizer its own learning-rate grid, Muon alone its Adam ratio.

  Declared as a plain list (one grid for every point), as ``{"values": [...],
  "when": {...}}``, or as a list of such entries (``tune_grids``)."""
  values: tuple[Any, ...]
  when: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def applies(self, overrides: Mapping[str, Any]) -> bool:
    return all(k in overrides and overrides[k] == v for k, v in self.when.items())


def _grid(field: str, entry: Any) -> TunedGrid:
  """One declared entry (a ``TunedGrid`` or {"values", "when"}) checked."""
  if isinstance(entry, TunedGrid):
    values, when = entry.values, entry.when
  else:
    unknown = set(entry) - {"values", "when"}
    if unknown or "values" not in entry:
      raise ConfigError(f"tune {field}: a conditional grid is {{'values': [...], 'when': "
                        f"{{AXIS_FIELD: VALUE}}}}, got keys {sorted(entry)}.")
    values, when = entry["values"], entry.get("when") or {}
  if not isinstance(values, (list, tuple)) or not values:
    raise ConfigError(f"tune {field}: values must be a non-empty list, got {values!r}.")
  if len(set(map(repr, values))) != len(values):
    raise ConfigError(f"tune {field}: {list(values)} repeats a value.")
  if not isinstance(when, Mapping):
    raise ConfigError(f"tune {field}: 'when' is a dict {{AXIS_FIELD: VALUE}}, got {when!r}.")
  return TunedGrid(tuple(values), dict(when))


def tune_grids(tune: Mapping[str, Any]) -> Tune:
  """Each tuned field's grids from any declared form (ConfigError if malformed):

  - ``[1e-3, 3e-3]``: every point runs at these values;
  - ``{"values": [1e-3, 3e-3], "when": {"optim.optimizer": "muon"}}``: the
    points whose axis values match ``when`` only;
  - a list of such entries: each group of points its own grid (a point no
    entry matches is not tuned on the field).

  sweep.json and report.json write this same form (``tune_json``)."""
  out: Tune = {}
  for field, spec in tune.items():
    if isinstance(spec, (TunedGrid, Mapping)):
      out[field] = (_grid(field, spec),)
    elif isinstance(spec, (list, tuple)):
      entries = [isinstance(v, (TunedGrid, Mapping)) for v in spec]
      if spec and all(entries):
        out[field] = tuple(_grid(field, e) for e in spec)
      elif any(entries):
        raise ConfigError(f"tune {field}: give either a list of values or a list of "
                          f"conditional grids {{'values', 'when'}}, not both: {spec!r}.")
      else:
        out[field] = (_grid(field, {"values": spec}),)
    else:
      raise ConfigError(f"tune {field}: values must be a non-empty list, got {spec!r}.")
  return out


def tune_json(tune: Tune) -> dict[str, Any]:
  """A field with one grid for every point as its list of values (the shape
  sweep.json had before per-point grids), else its grids as {"values", "when"}."""
  return {field: (list(grids[0].values) if len(grids) == 1 and not grids[0].when
                  else [serial.to_json(g) for g in grids])
          for field, grids in tune.items()}


# {field: its grids, at most one of which applies at any point}; in sweep.json
# and report.json in the form ``tune_json`` writes, any declared form read.
Tune = Annotated[dict[str, tuple[TunedGrid, ...]], serial.Form(tune_json, tune_grids)]


def tune_at_json(tune_at: Sequence[tuple[str, Sequence[Any]]]) -> dict[str, list[Any]]:
  """``SweepRecord.tune_at`` as sweep.json writes it: {field: [values]}."""
  return {field: list(values) for field, values in tune_at}


def tune_at_pairs(data: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
  """sweep.json's (or a declaration's) {field: value or [values]} as
  ``SweepRecord.tune_at`` (ConfigError where malformed)."""
  if isinstance(data, (list, tuple)) and all(
      isinstance(p, (list, tuple)) and len(p) == 2 for p in data):
    data = dict(data)
  if not isinstance(data, Mapping):
    raise ConfigError(f"tune_at is {{SIZE_FIELD: value or [values]}}, such as "
                      f"{{'model.d_model': 64}}; got {data!r}.")
  out = []
  for field, values in data.items():
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
      raise ConfigError(f"tune_at {field}: no value; name the proxy size(s), such as "
                        f"{{'{field}': 64}}.")
    if len(set(map(repr, values))) != len(values):
      raise ConfigError(f"tune_at {field}: {list(values)} repeats a value.")
    out.append((str(field), values))
  return tuple(out)


# ((size field, (values, ...)), ...); in sweep.json as {field: [values]}.
TuneAt = Annotated[tuple[tuple[str, tuple[Any, ...]], ...],
                   serial.Form(tune_at_json, tune_at_pairs)]


def grid_at(tune: Tune, overrides: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
  """{field: values} of the grids that apply to a point whose runs have
  ``overrides`` (a field no grid applies to is not tuned there); a
  ConfigError where two grids of one field apply."""
  out = {}
  for field, grids in tune.items():
    applying = [g for g in grids if g.applies(overrides)]
    if len(applying) > 1:
      raise ConfigError(
          f"tune {field}: {len(applying)} grids apply to the point "
          f"{ {k: overrides.get(k) for g in applying for k in g.when} }: "
          + "; ".join(f"{list(g.values)} when {dict(g.when) or 'always'}" for g in applying)
          + ". Make their conditions exclusive.")
    if applying:
      out[field] = applying[0].values
  return out


def tuned_values(grids: Sequence[TunedGrid]) -> tuple[Any, ...]:
  """Every value of a field's grids, in first-seen order."""
  seen: dict[str, Any] = {}
  for grid in grids:
    for value in grid.values:
      seen.setdefault(repr(value), value)
  return tuple(seen.values())


@dataclasses.dataclass(frozen=True)
class AxisRecord:
  """An axis as recorded: its label, every field it sets, its values (each a
  dict of overrides, ``{}`` the base itself), the index of the value the
  others are compared with (``spec.reference_index``) and the comparisons the
  sweep declares besides (``Sweep.comparisons``): (value index, base index)
  pairs, the value compared against the pair's base in every context."""
  label: str
  fields: tuple[str, ...]
  values: tuple[dict[str, Any], ...]
  reference: int = 0
  comparisons: tuple[tuple[int, int], ...] = ()

  def __post_init__(self):
    n = len(self.values)
    for v, b in self.comparisons:
      if v == b or not (0 <= v < n and 0 <= b < n):
        raise ValueError(f"sweep.json: axis {self.label}: comparison [{v}, {b}] is not "
                         f"two different value indices of its {n} values.")


@dataclasses.dataclass(frozen=True)
class RunProgress:
  """Where a run stands, as read from its workdir (``state.run_state``)."""
  state: State
  step: int
  reason: str
  compile_seconds: float | None


@serial.layout(order=("name", "seed", "values", "tuned", "overrides", "evaluations", "notes",
                      "stage", "trunk", "state", "step", "reason", "attempts",
                      "wall_seconds", "compile_seconds"),
               omit_default=("trunk",))
@dataclasses.dataclass
class RunEntry:
  """One run of the sweep.

  The first fields say what the run is and never change once the record is
  built; the rest is its bookkeeping, which the executors update in place as
  the run progresses (``observe``, ``attempts``, ``wall_seconds``) before
  sweep.json is written again.
  """
  name: str
  seed: int
  values: tuple[dict[str, Any], ...]  # the value of each axis, in axis order
  overrides: dict[str, Any]  # the sweep's overrides + axis values + tuned values + seed
  tuned: dict[str, Any] = dataclasses.field(default_factory=dict)  # {path: value}
  evaluations: tuple[tuple[str, ...], ...] = ()  # evaluate's arguments, after training
  # What the sweep's validation noted for this run: a setting the whole sweep
  # shares that has no effect at this point, left at its default here.
  notes: tuple[str, ...] = ()
  stage: Stage = "tune"
  # A budget of a ladder that branches (``sweep.branching``): the name of the
  # trunk run (in ``SweepRecord.trunks``) whose checkpoint at its
  # ``train.branch_step`` it starts from; "": the run starts from scratch.
  trunk: str = ""
  state: State = "pending"
  step: int = 0
  reason: str = ""
  attempts: int = 0
  wall_seconds: float = 0.0
  compile_seconds: float | None = None

  def observe(self, progress: RunProgress) -> None:
    """Takes the state read from the run's workdir."""
    self.state, self.step = progress.state, progress.step
    self.reason, self.compile_seconds = progress.reason, progress.compile_seconds

  def inherit(self, previous: RunEntry | None) -> None:
    """Keeps what an earlier invocation counted for this run: its attempts and times."""
    if previous is not None:
      self.attempts, self.wall_seconds = previous.attempts, previous.wall_seconds
      self.compile_seconds = previous.compile_seconds



@dataclasses.dataclass(frozen=True)
class SlurmJob:
  """One submitted job array: task i runs ``runs[i]``."""
  job_id: str
  submitted: str
  slurm_args: str
  runs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class AddedRun:
  """A run added after the declared ones: run ``like`` (declared, or added
  before it) at another seed, in ``stage``: a confirmation seed, or a seed
  ``--until-resolved`` added. Its tuned values are ``like``'s, fixed when it
  was added: a later analysis never moves a run already added. A
  transferred point's own runs (stage ``transfer``) copy no run: ``like`` is
  their own name, the sweep's declaration of the point at the value."""
  name: str
  seed: int
  like: str
  stage: Stage = "tune"


@dataclasses.dataclass(frozen=True)
class ReportOptions:
  """The report's margins given to the sweep command (None: the report's default)."""
  stall_margin: float | None = None
  equivalence_margin: float | None = None

  def to_json(self) -> dict[str, Any]:
    """{margin: value} (``serial.to_json``)."""
    return serial.to_json(self)


@serial.layout(order=("name", "description", "config", "overrides", "seeds", "evaluations",
                      "tune", "tune_at", "select_by", "confirm", "until_resolved", "report_split", "axes",
                      "base_values", "command", "cwd", "created", "slurm_jobs", "runs",
                      "added", "report_options", "updated", "claims",
                      "transfer_band", "ladder", "trunks"),
               omit_default=("claims", "tune_at", "transfer_band", "trunks"),
               omit_none=("ladder",))
@dataclasses.dataclass(frozen=True)
class SweepRecord:
  """The content of sweep.json. Its fields are fixed once built; its lists
  grow as the sweep goes (``runs`` and ``added`` by the confirmation stage
  and ``--until-resolved``, ``slurm_jobs`` by each submission) and its
  entries' bookkeeping changes."""
  name: str
  config: str  # "configs/lm.py:tiny"
  seeds: tuple[int, ...]  # the declared seeds (a tuned sweep's tuning seeds)
  axes: tuple[AxisRecord, ...]
  runs: list[RunEntry]
  description: str = ""
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # every run's
  evaluations: tuple[Evaluation, ...] = ()
  # Each tuned field's grids (``TunedGrid``; a plain list given is read as one
  # grid for every point): ``grid`` says which apply at a run's point.
  tune: Tune = dataclasses.field(default_factory=dict)
  # The proxy sizes (``Sweep.tune_at``): ((size field, (values, ...)), ...);
  # tuning runs only at the points of those sizes, every other point at the
  # value chosen at the nearest one below (``records.transfer``). In the file
  # as {field: [values]}; absent: every point tunes.
  tune_at: TuneAt = ()
  select_by: str = "eval/loss"
  # Confirmation seeds per point (0: none): fresh seeds at each point's chosen
  # tuned value, once the tuning stage has finished (``confirmation_seeds``).
  confirm: int = 0
  # --until-resolved's MAX_SEEDS, fixed by the first invocation that adds
  # seeds adaptively: it fixes the looks over which the report's sequential
  # test spends alpha (``report.context.sequential_design``). None: seeds are
  # never added, and the report keeps the fixed-seed analysis.
  until_resolved: int | None = None
  report_split: Split = "validation"
  # The base config's value (with the sweep's overrides) of the axes' fields,
  # and on a sweep with ``tune_at`` of ``model.parametrization`` (the rule by
  # which a transferred point's value carries over: ``records.transfer``).
  base_values: dict[str, Any] = dataclasses.field(default_factory=dict)
  command: str = ""  # the command that reproduces the sweep
  cwd: str = ""
  created: str = ""
  updated: str = ""
  slurm_jobs: list[SlurmJob] = dataclasses.field(default_factory=list)
  added: list[AddedRun] = dataclasses.field(default_factory=list)
  report_options: ReportOptions = ReportOptions()
  # The papers' claims the sweep tests (``records.claims``): the report's
  # confirmatory family; none: the report's comparisons are its family.
  claims: tuple[Claim, ...] = ()
  # The transfer check's band: a factor per doubling of size (``Sweep.transfer_band``).
  transfer_band: float = TRANSFER_BAND
  # The ladder (``Sweep.ladder``) as resolved: its rungs, budgets and each
  # point's counts (``records.ladder``); None: the sweep has none. Its two
  # axes are the first of ``axes``.
  ladder: LadderPlan | None = None
  # The trunk runs of a branched ladder: each trains the shared stable phase
  # of its budgets (the runs whose ``trunk`` names it) and is no point of the
  # report; its cost is the ladder's (``sweep.branching``).
  trunks: list[RunEntry] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    object.__setattr__(self, "tune", tune_grids(self.tune))
    object.__setattr__(self, "tune_at", tune_at_pairs(self.tune_at))

  def grid(self, entry: RunEntry) -> dict[str, tuple[Any, ...]]:
    """{field: values} tuned at ``entry``'s point: its own grid, which every
    run of the point shares (the grids' conditions read axis values)."""
    return grid_at(self.tune, entry.overrides)

  def point_grid(self, key: tuple[int, ...]) -> dict[str, tuple[Any, ...]]:
    """``grid`` of the point with this key ({} where it has no run)."""
    entry = next((e for e in self.runs if self.point_key(e) == tuple(key)), None)
    return {} if entry is None else self.grid(entry)

  def point_key(self, entry: RunEntry) -> tuple[int, ...]:
    """The index of each of the run's axis values: the point it belongs to."""
    return tuple(axis.values.index(value) for axis, value in zip(self.axes, entry.values))

  def confirmation_seeds(self) -> tuple[int, ...]:
    """The ``confirm`` seeds right above the largest tuning seed (``--seeds 0
    --confirm 3``: 1, 2, 3): the same for every point, so comparisons stay
    paired, and none of them a seed of the tuning stage (a sweep started
    before stages existed may have seeds added above the declared ones)."""
    top = max([*self.seeds, *(e.seed for e in self.runs if e.stage in DECLARED)])
    return tuple(range(top + 1, top + 1 + self.confirm))

  def to_json(self) -> dict[str, Any]:
    """sweep.json's content (``serial.to_json``)."""
    return serial.to_json(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> SweepRecord:
    """The record of sweep.json's content, written by this or an earlier
    version (its migrations below)."""
    return serial.from_json(cls, data)


# ----------------------------------------------------------- older files
# What earlier versions of sweep.json did not write, oldest first, where the
# field's default does not say it (``serial.versioned``). The defaults say the
# rest: before tuned fields, no ``tune`` (nothing tuned), ``select_by``
# (eval/loss), ``report_split`` (validation, the only split then) and no
# ``tuned`` per run; before ``--until-resolved``, no ``added``; before the
# report's margins were kept, no ``report_options`` (the report's defaults);
# before confirmation seeds, no ``confirm`` (0: none) and no ``stage`` per run
# or per added run (every run was a declared run or a seed added to one:
# ``tune``); before shared settings inactive at some points were allowed, no
# ``notes`` per run; before declared comparisons, no ``comparisons`` per axis
# (every value against the axis's reference only); before per-point tuned
# grids, each tuned field as one list of values for every point, which
# ``tune_grids`` reads as it is (the form still written for such a field).
# And the bookkeeping a hand-written record (a test, a tool) may leave out:
# description, overrides, base values, command, cwd, times, SLURM jobs; an
# axis's ``reference`` (its first value); a run's state (pending), step,
# reason, attempts and times.
def _axis_fields(data: dict[str, Any]) -> None:
  """An axis without ``fields`` (a hand-written record): those its values set."""
  for axis in data["axes"]:
    axis.setdefault("fields", list(dict.fromkeys(k for v in axis["values"] for k in v)))


def _run_overrides(data: dict[str, Any]) -> None:
  """A run without ``overrides`` (a hand-written record): none."""
  for run in data["runs"]:
    run.setdefault("overrides", {})


def _run_evaluations(data: dict[str, Any]) -> None:
  """Before conditional evaluations, evaluations were argument lists only and
  a run had no ``evaluations`` of its own: it had every one of the record."""
  evaluations = [parse_evaluation(e) for e in data.get("evaluations", [])]
  for run in data["runs"]:
    if "evaluations" not in run:
      run["evaluations"] = [list(a) for a in evaluations_for(evaluations, run["overrides"])]


def _until_resolved_recorded(data: dict[str, Any]) -> None:
  """Before the sequential test of adaptive seeds, no ``until_resolved``: a
  sweep whose command has ``--until-resolved N`` was run with adaptive seeds,
  up to N (``_until_resolved``), and its report tests it sequentially;
  otherwise none (None: the fixed-seed analysis)."""
  if "until_resolved" not in data:
    data["until_resolved"] = _until_resolved(data)


def _job_ids(data: dict[str, Any]) -> None:
  """A SLURM job id written as a number (a tool): its string."""
  for job in data.get("slurm_jobs", []):
    if isinstance(job.get("job_id"), int):
      job["job_id"] = str(job["job_id"])


serial.versioned(SweepRecord, FILENAME, (_axis_fields, _run_overrides, _run_evaluations,
                                         _until_resolved_recorded, _job_ids))


def _until_resolved(data: Mapping[str, Any]) -> int | None:
  """MAX_SEEDS of a sweep.json written before it was recorded: the value of
  ``--until-resolved`` in its command (the latest invocation's), else, where
  seeds were added all the same (an invocation without the flag came last),
  the most seeds any point reached at one tuned value: the smallest budget
  consistent with the file. None: no seed was ever added adaptively."""
  try:
    argv = shlex.split(data.get("command") or "")
  except ValueError:
    argv = []
  for i, arg in enumerate(argv):
    value = (arg.partition("=")[2] if arg.startswith("--until-resolved=")
             else argv[i + 1] if arg == "--until-resolved" and i + 1 < len(argv) else None)
    if value is not None and value.isdigit() and int(value) > 0:
      return int(value)
  if not data.get("added"):
    return None
  seeds: dict[str, set[int]] = {}
  for run in data["runs"]:
    key = json.dumps([run["values"], run.get("tuned", {})], sort_keys=True)
    seeds.setdefault(key, set()).add(int(run["seed"]))
  return max(len(s) for s in seeds.values())


def read(sweep_dir: str | pathlib.Path) -> SweepRecord | None:
  """The sweep directory's record, None where it has no sweep.json yet."""
  try:
    text = (pathlib.Path(sweep_dir) / FILENAME).read_text()
  except FileNotFoundError:
    return None
  return SweepRecord.from_json(json.loads(text))


def write(sweep_dir: str | pathlib.Path, record: SweepRecord) -> None:
  """Atomically replaces sweep.json (a reader never sees half a file), stamped
  with the time it was written."""
  sweep_dir = pathlib.Path(sweep_dir)
  sweep_dir.mkdir(parents=True, exist_ok=True)
  files.write_json(sweep_dir / FILENAME, {**record.to_json(), "updated": now()})
