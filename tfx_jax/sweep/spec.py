"""What a sweep is: a base config, axes over dotted config paths, seeds.

A sweep is declared once, either in ``experiments/<name>.py``::

    def get_sweep(variant="default"):
      return Sweep(
          name="activations",
          config="configs/lm.py:tiny",
          overrides={"train.num_steps": 500},           # applied to every run
          axes=[{"model.activation": ["relu", "swiglu"]},  # cartesian product
                {"model.norm_type": ["layernorm", "rmsnorm"]}],
          seeds=[0, 1, 2],
          evaluations=[["--lengths", "1x,2x,4x,8x"]])   # after training

An evaluation is the arguments of ``python -m tfx_jax.evaluate --workdir RUN``
after training, for every run, or ``Evaluation(args, when={"model.position":
"rope"})`` for the runs whose overrides set those values (a field set by an
axis, a tuned field or an override of the sweep).

or on the command line (``tfx_jax.sweep.cli``). ``tune={"optim.learning_rate":
[1e-3, 3e-3, 1e-2]}`` (``--tune``) adds tuned fields: every point runs at
every tuned value (several fields: their product) and every seed, as
ordinary runs whose names include the tuned values; the report picks each
point's own best value by ``select_by`` on the validation split and compares
points at their chosen values on a split the selection never saw. A tuned
field's grid may depend on the point, as evaluations do (``TunedGrid``)::

    tune={"optim.learning_rate": [
              {"values": [1e-3, 3e-3, 1e-2], "when": {"optim.optimizer": "adamw"}},
              {"values": [1e-4, 3e-4, 1e-3], "when": {"optim.optimizer": "lion"}}],
          "optim.adam_learning_rate_ratio": {
              "values": [0.1, 0.3], "when": {"optim.optimizer": "muon"}}}

Each point runs the product of the grids whose ``when`` its axis values
match (a field no grid of which matches is not tuned there: the Muon point
above tunes only the Adam ratio); each ``when`` names an axis field and one
of its values, at most one grid of a field applies to a point, and every
grid applies to some point (ConfigError otherwise). The report's choice,
sensitivity and grid-edge check read each point's own grid.
``confirm=N`` (``--confirm``) adds a confirmation stage: once every tuning
run is done, each point runs N fresh seeds at its chosen value (the same
seeds for every point, right above the declared ones), and the verdicts read
those runs only, never the seeds that chose the value. An axis is

- ``{"path": [v1, v2, ...]}``: one field, one run per value;
- ``{"a": [1, 2], "b": [3, 4]}``: fields that move together (zipped: a=1,b=3
  and a=2,b=4);
- ``[{"a": 1}, {"b": 5, "c": 6}, {}]``: a list of override dicts, one per
  value (``{}`` is the base itself), for ablation tables whose rows change
  different fields (Vaswani et al. 2017, Table 3).

The report compares every value of an axis with the axis's base value
(``reference_index``), in each combination of the other axes.
``comparisons=[(a, b), ...]`` adds comparisons between other values: a and b
are two values of one axis, written as that axis lists them (override
dicts), and a is compared against b, b playing the base, in every context::

    moe, shared = {"model.num_experts": 8}, {"model.num_experts": 8, "model.shared_experts": 1}
    Sweep(..., axes=[[{}, moe, shared]], comparisons=[(shared, moe)])

They join the report's family of comparisons (Holm; the sequential test of
adaptive seeds). A pair whose values are in no axis or in different axes,
that compares a value with itself, or that repeats a comparison the report
makes already (with the base value, or another pair, either way round) is a
ConfigError (``comparison_pairs``).

Runs are the cartesian product of the axes times the seeds. Each run's name
is made of the fields its axis values set plus the seed (``run_name``), so
names are stable, filesystem-safe and independent of the order runs execute.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import pathlib
import re
from typing import Any, Mapping, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import transfer as transfer_lib
from tfx_jax.records import ladder as ladder_lib
from tfx_jax.records.claims import Claim
from tfx_jax.records.ladder import BUDGET_FIELD, Ladder, LadderPlan
from tfx_jax.records.sweep import (Evaluation, Tune, TunedGrid, grid_at, parse_evaluation,
                                   tune_grids)

Overrides = Mapping[str, Any]


def normalize_evaluation(evaluation: Any) -> Evaluation:
  """An ``Evaluation`` (its arguments as a tuple), an argument list, or
  sweep.json's {"args", "when"} (ConfigError if malformed)."""
  if isinstance(evaluation, Evaluation):
    evaluation = {"args": evaluation.args, "when": evaluation.when}
  return parse_evaluation(evaluation)


@dataclasses.dataclass(frozen=True)
class Axis:
  """One sweep axis: a label and its values, each a dict of overrides."""
  label: str
  values: tuple[dict[str, Any], ...]

  @property
  def fields(self) -> list[str]:
    """Every dotted path this axis sets, in first-seen order."""
    seen: dict[str, None] = {}
    for value in self.values:
      seen.update(dict.fromkeys(value))
    return list(seen)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep declaration (see the module docstring)."""
  name: str
  config: str  # "configs/lm.py:tiny"
  axes: Sequence[Any] = ()
  seeds: Sequence[int] = (0,)
  overrides: Overrides = dataclasses.field(default_factory=dict)
  # Extra ``python -m tfx_jax.evaluate --workdir RUN ARGS`` after training:
  # argument lists, or ``Evaluation``s for the runs that match their ``when``.
  evaluations: Sequence[Sequence[str] | Evaluation] = ()
  description: str = ""
  # Tuned fields: {path: [values]}, or per-point grids ({"values", "when"}
  # entries, ``sweep_record.tune_grids``); each point is compared at its best.
  tune: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # The metric that chooses a point's tuned values (on the validation split).
  select_by: str = "eval/loss"
  # Confirmation seeds per point (0: none), run at each point's chosen tuned
  # values after the tuning stage; only they enter the verdicts.
  confirm: int = 0
  # Comparisons besides every value against its axis's base value: pairs (a, b)
  # of values of one axis, each written as the axis lists it, a compared
  # against b (b plays the base) in every context of the other axes
  # (``comparison_pairs``).
  comparisons: Sequence[tuple[Overrides, Overrides]] = ()
  # The papers' claims this sweep tests (``Claim``, tfx_jax/records/claims.py):
  # the report labels each by one rule, Holm over all of them.
  claims: Sequence[Claim] = ()
  # The report's transfer check: a variant's optimum learning rate transfers
  # where its shift per doubling of size lies within this factor either way.
  transfer_band: float = math.sqrt(2)
  # The proxy sizes at which the tuning runs run: {axis field: value or
  # [values]}; every other point takes the value chosen at the nearest proxy
  # size below it (``records.transfer``). Empty: every point tunes.
  tune_at: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # Model sizes crossed with training lengths (``records.ladder``): two axes
  # ahead of the declared ones, each budget's steps from its rung's
  # non-embedding parameters, the budgets branched from a shared wsd stable
  # phase (``sweep.branching``).
  ladder: Ladder | None = None


@dataclasses.dataclass(frozen=True)
class Run:
  """One point of a sweep: its name, axis values and full override set."""
  name: str
  seed: int
  values: tuple[dict[str, Any], ...]  # the value of each axis, in axis order
  overrides: dict[str, Any]  # base overrides + axis values + tuned values + seed
  tuned: dict[str, Any] = dataclasses.field(default_factory=dict)  # {path: value}
  # "tune": a declared run; "transfer": a run of a point that takes a
  # transferred value (``tune_at``), at one value of its grid: the transfer
  # stage runs the ones at the value its proxy chose (``sweep.transfer``).
  stage: str = "tune"


def normalize_axis(axis: Any) -> Axis:
  """An axis in any of the three declared forms -> ``Axis`` (ConfigError if bad)."""
  if isinstance(axis, Axis):
    values = list(axis.values)
    label = axis.label
  elif isinstance(axis, Mapping):
    if not axis:
      raise ConfigError("a sweep axis declares no field.")
    lists = {k: list(v) if isinstance(v, (list, tuple)) else None
             for k, v in axis.items()}
    for k, v in lists.items():
      if v is None:
        raise ConfigError(f"axis {k}: values must be a list, got {axis[k]!r}.")
    lengths = {len(v) for v in lists.values()}
    if len(lengths) > 1:
      raise ConfigError(
          f"axis {'+'.join(lists)}: zipped fields need lists of one length, got "
          + ", ".join(f"{k}: {len(v)}" for k, v in lists.items()) + ".")
    values = [dict(zip(lists, vals)) for vals in zip(*lists.values())]
    label = "+".join(lists)
  elif isinstance(axis, (list, tuple)):
    if not all(isinstance(v, Mapping) for v in axis):
      raise ConfigError(f"an axis given as a list must hold override dicts, got {axis!r}.")
    values = [dict(v) for v in axis]
    fields = list(dict.fromkeys(k for v in values for k in v))
    label = "+".join(fields) or "variant"
  else:
    raise ConfigError(f"a sweep axis is a dict or a list of dicts, got {axis!r}.")
  if not values:
    raise ConfigError(f"axis {label} has no values.")
  for value in values:
    if "seed" in value:
      raise ConfigError(f"axis {label} sets 'seed'; declare seeds with seeds=[...] "
                        "(--seeds on the command line).")
  return Axis(label, tuple(values))


# Characters kept in run names; anything else becomes "_".
_UNSAFE = re.compile(r"[^A-Za-z0-9.+-]")


def safe(text: str) -> str:
  """A filesystem- and shell-safe fragment of a run name."""
  return _UNSAFE.sub("_", text)


def format_value(value: Any) -> str:
  """A value as a ``--config.a.b=VALUE`` flag and in run names."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (list, tuple)):
    return ",".join(format_value(v) for v in value)
  return str(value)


def short_names(fields: Sequence[str]) -> dict[str, str]:
  """Each dotted path's shortest unambiguous suffix (``model.activation`` -> ``activation``)."""
  out = {}
  for field in fields:
    parts = field.split(".")
    for k in range(1, len(parts) + 1):
      suffix = ".".join(parts[-k:])
      clash = [f for f in fields if f != field and
               (f == suffix or f.endswith("." + suffix))]
      if not clash:
        out[field] = suffix
        break
    else:
      out[field] = field
  return out


def run_name(values: Sequence[Mapping[str, Any]], seed: int,
             names: Mapping[str, str], tuned: Mapping[str, Any] | None = None) -> str:
  """``activation-swiglu_norm_type-rmsnorm_s0``: the axis fields, the tuned
  values (``_learning_rate-0.003``) and the seed."""
  parts = [f"{safe(names[k])}-{safe(format_value(v))}"
           for value in [*values, dict(tuned or {})] for k, v in value.items()]
  return "_".join(parts or ["base"]) + f"_s{seed}"


def tune_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
  """Every combination of a point's tuned values ([{}] when nothing is tuned)."""
  fields = list(grid)
  return [dict(zip(fields, combo)) for combo in itertools.product(*grid.values())]


def check_conditions(tune: Tune, axes: Sequence[Axis]) -> None:
  """Each grid's ``when`` names an axis field and one of its values (ConfigError
  naming the choices): a grid is per point, and points are axis values."""
  choices: dict[str, list[Any]] = {}
  for axis in axes:
    for value in axis.values:
      for k, v in value.items():
        if v not in choices.setdefault(k, []):
          choices[k].append(v)
  for field, grids in tune.items():
    for grid in grids:
      for k, v in grid.when.items():
        if k not in choices:
          raise ConfigError(f"tune {field} when {k}: no axis sets {k}; a grid's "
                            f"condition names an axis field: {list(choices) or 'none'}.")
        if v not in choices[k]:
          raise ConfigError(f"tune {field} when {k}={format_value(v)}: not a value of its "
                            f"axis; choose from {[format_value(c) for c in choices[k]]}.")


def ladder_axes(ladder: Ladder) -> list[Axis]:
  """The two axes a ladder puts ahead of the declared ones: the rungs and the budgets."""
  ladder = ladder_lib.check_declaration(ladder)
  fields = list(ladder.rungs[0])
  return [Axis("+".join(fields), tuple(dict(r) for r in ladder.rungs)),
          Axis(BUDGET_FIELD, tuple({BUDGET_FIELD: b} for b in ladder.tokens_per_param))]


def declared_axes(sweep: Sweep) -> list[Axis]:
  """The sweep's own axes (a ladder's two apart), checked; a declared axis that
  sets a rung's field, or the budget field, is a ConfigError."""
  axes = [normalize_axis(a) for a in sweep.axes]
  if sweep.ladder is not None:
    rung_fields = set(ladder_axes(sweep.ladder)[0].fields) | {BUDGET_FIELD}
    for axis in axes:
      clash = sorted(rung_fields & set(axis.fields))
      if clash:
        raise ConfigError(f"axis {axis.label} sets {clash}, which the ladder's rungs or "
                          "budgets set; a variant axis sets other fields.")
  return axes


def expand(sweep: Sweep, extra_overrides: Overrides | None = None,
           plan: LadderPlan | None = None) -> tuple[list[Axis], list[Run]]:
  """Every run of ``sweep``: the product of its axes times its seeds, seed-major.

  ``extra_overrides`` (command-line ``--config.a.b=v``) apply to every run
  after the sweep's own. Duplicate run names are a ConfigError. A sweep with
  a ladder has its two axes first; ``plan`` (``sweep.ladder.plan``) gives
  each budget's ``train.num_steps`` (without it, the runs keep the base's).
  """
  axes = declared_axes(sweep)
  if sweep.ladder is not None:
    axes = ladder_axes(sweep.ladder) + axes
  seeds = [int(s) for s in sweep.seeds]
  if not seeds:
    raise ConfigError("the sweep has no seeds.")
  if len(set(seeds)) != len(seeds):
    raise ConfigError(f"seeds {seeds} repeat a seed.")
  base = {**dict(sweep.overrides), **dict(extra_overrides or {})}
  fields = list(dict.fromkeys(f for a in axes for f in a.fields))
  tune = tune_grids(sweep.tune)
  for field in tune:
    if field in fields:
      raise ConfigError(f"{field} is both an axis and tuned; tune a field the axes "
                        "do not set.")
    if field == "seed":
      raise ConfigError("seeds are not tuned; declare them with seeds=[...].")
  check_conditions(tune, axes)
  comparison_pairs(sweep.comparisons, axes)
  tune_at = transfer_lib.tune_at_pairs(sweep.tune_at) if sweep.tune_at else ()
  if tune_at and not tune:
    raise ConfigError(f"tune_at {transfer_lib.tune_at_text(tune_at)} (--tune-at): the "
                      "sweep tunes no field, so there is no value to transfer; declare "
                      "tuned fields (--tune PATH=V1,V2) or leave --tune-at out.")
  sources = transfer_lib.plan(axes, tune_at)
  sized = {f for ai in sources for f in axes[ai].fields}
  for field, grids in tune.items():
    for grid in grids:
      if set(grid.when) & sized:
        raise ConfigError(f"tune {field} when {dict(grid.when)}: a condition on a field of "
                          "a tune_at axis gives its sizes different grids, so a proxy's "
                          "value may not be one of a larger size's; condition on other "
                          "axes.")
  # Each point's own grid: the grids whose conditions its axis values match.
  combos = []
  for combo in itertools.product(*(a.values for a in axes)):
    point = dict(base)
    for value in combo:
      point.update(value)
    key = tuple(a.values.index(v) for a, v in zip(axes, combo))
    if BUDGET_FIELD in point:  # a ladder's budget: its steps, not a config field
      del point[BUDGET_FIELD]
      if plan is not None:
        point["train.num_steps"] = plan.point(key).steps
    stage = "tune" if transfer_lib.source_key(sources, key) == key else "transfer"
    combos.append((combo, point, tune_grid(grid_at(tune, point)), stage))
  for field, grids in tune.items():
    for grid in grids:
      if not any(grid.applies(point) for _, point, _, stage in combos if stage == "tune"):
        raise ConfigError(f"tune {field} {list(grid.values)} when {dict(grid.when)}: no "
                          "point of the sweep that tunes has these values together.")
  names = short_names(fields + list(tune))
  runs, seen = [], {}
  # Seeds outermost: runs execute in this order, so a sweep stopped half-way
  # has every point with its first seeds rather than some points with all.
  for seed in seeds:
    for combo, point, point_grid, stage in combos:
      for tuned in point_grid:
        overrides = dict(point)
        overrides.update(tuned)
        overrides["seed"] = seed
        name = run_name(combo, seed, names, tuned)
        if name in seen:
          raise ConfigError(f"two points of the sweep have the same name {name!r}: "
                            f"{seen[name]} and {combo}; make the axis values distinct.")
        seen[name] = combo
        runs.append(Run(name, seed, tuple(dict(v) for v in combo), overrides,
                        dict(tuned), stage))
  return axes, runs


def value_text(value: Mapping[str, Any]) -> str:
  """An axis value in a message: ``{model.activation=swiglu}`` (``{}``: the base)."""
  return "{" + ", ".join(f"{k}={format_value(v)}" for k, v in value.items()) + "}"


def pair_sides(pair: Any) -> tuple[dict[str, Any], dict[str, Any]]:
  """A declared comparison's two values (ConfigError if it is not a pair of dicts)."""
  if (not isinstance(pair, (list, tuple)) or len(pair) != 2
      or not all(isinstance(side, Mapping) for side in pair)):
    raise ConfigError(f"comparisons: each is a pair (a, b) of values of one axis, "
                      f"override dicts as the axis lists them; got {pair!r}.")
  return dict(pair[0]), dict(pair[1])


def comparison_pairs(pairs: Sequence[Any], axes: Sequence[Axis],
                     references: Sequence[int] | None = None
                     ) -> list[tuple[int, int, int]]:
  """``Sweep.comparisons`` as (axis index, value index, base index), in order.

  ConfigError naming the pair where a side is not an override dict or not a
  value of any axis, the sides are values of different axes (or both of
  several: ambiguous), a value is compared with itself, or the pair repeats
  another pair, either way round (the same test, its sign flipped, counted
  twice in the report's family). With ``references`` (each axis's
  ``reference_index``, known once the base config is read), also where it
  repeats a comparison with the axis's base value, which the report makes
  anyway.
  """
  out: list[tuple[int, int, int]] = []
  for pair in pairs:
    a, b = pair_sides(pair)
    what = f"comparison {value_text(a)} vs {value_text(b)}"
    if a == b:
      raise ConfigError(f"{what}: compares a value with itself; a pair names two "
                        "different values of one axis.")
    holders = [[ai for ai, axis in enumerate(axes) if side in axis.values]
               for side in (a, b)]
    for side, where in zip((a, b), holders):
      if not where:
        choices = "; ".join(f"axis {axis.label}: " + ", ".join(map(value_text, axis.values))
                            for axis in axes) or "the sweep has no axis"
        raise ConfigError(f"{what}: {value_text(side)} is not a value of any axis; "
                          f"each side is written as its axis lists it ({choices}).")
    common = [ai for ai in holders[0] if ai in holders[1]]
    if not common:
      raise ConfigError(
          f"{what}: {value_text(a)} is a value of axis {axes[holders[0][0]].label}, "
          f"{value_text(b)} of axis {axes[holders[1][0]].label}; a pair compares two "
          "values of one axis.")
    if len(common) > 1:
      raise ConfigError(f"{what}: both are values of axes "
                        f"{', '.join(axes[ai].label for ai in common)}; make the axes' "
                        "values distinct so that the pair names one axis.")
    ai = common[0]
    vi, bi = axes[ai].values.index(a), axes[ai].values.index(b)
    for other_ai, other_vi, other_bi in out:
      if other_ai == ai and {other_vi, other_bi} == {vi, bi}:
        values = axes[ai].values
        raise ConfigError(f"{what}: repeats the comparison {value_text(values[other_vi])} "
                          f"vs {value_text(values[other_bi])} declared before.")
    if references is not None and references[ai] in (vi, bi):
      raise ConfigError(
          f"{what}: the report compares every value of axis {axes[ai].label} with its "
          f"base value {value_text(axes[ai].values[references[ai]])} already; declare "
          "pairs of two other values.")
    out.append((ai, vi, bi))
  return out


def reference_index(axis: Axis, base_values: Mapping[str, Any]) -> int:
  """The axis value that the others are compared with.

  The value equal to the base config on every field it sets (``{}`` always
  is); otherwise the first value.
  """
  for i, value in enumerate(axis.values):
    if all(base_values.get(k) == v for k, v in value.items()):
      return i
  return 0


def load_experiment(spec: str) -> Sweep:
  """``experiments/activations.py[:tiny]`` -> the file's ``get_sweep(variant)``."""
  path, _, variant = spec.partition(":")
  file = pathlib.Path(path)
  if not file.is_file():
    raise ConfigError(f"sweep file {path!r} does not exist.")
  module_spec = importlib.util.spec_from_file_location(f"_sweep_{file.stem}", file)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"{path} defines no get_sweep(variant).")
  try:
    sweep = module.get_sweep(variant) if variant else module.get_sweep()
  except ValueError as e:
    raise ConfigError(f"{spec}: {e}") from None
  if not isinstance(sweep, Sweep):
    raise ConfigError(f"{path}: get_sweep() must return a tfx_jax.sweep.Sweep.")
  return sweep


def parse_axis_flag(text: str) -> dict[str, list[str]]:
  """``model.activation=relu,swiglu`` -> {"model.activation": ["relu", "swiglu"]}.

  Several fields joined by ``;`` move together (a zipped axis):
  ``"model.d_model=64,128;model.num_heads=2,4"``.
  """
  axis = {}
  for part in text.split(";"):
    path, eq, values = part.partition("=")
    path = path.strip()
    if not eq or not path:
      raise ConfigError(f"--axis {text!r}: expected PATH=V1,V2,... such as "
                        "model.activation=relu,swiglu.")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
      raise ConfigError(f"axis {path} has no values (--axis {text!r}).")
    axis[path.removeprefix("config.")] = items
  return axis


TUNE_FORM = ("PATH=V1,V2,...[@AXIS_FIELD=VALUE...], such as optim.learning_rate=1e-3,3e-3 "
             "or optim.learning_rate=1e-4,3e-4@optim.optimizer=lion")


def parse_tune_flags(texts: Sequence[str]) -> dict[str, list[Any]]:
  """``--tune`` flags -> ``Sweep.tune``; several flags tune several fields
  (their product at each point).

  ``optim.learning_rate=1e-3,3e-3`` tunes the field at every point;
  ``optim.learning_rate=1e-4,3e-4@optim.optimizer=lion`` only at the points
  whose axis sets ``optim.optimizer`` to ``lion`` (several conditions:
  ``@a=x@b=y``, all of them). A field given again with other conditions gets
  a grid for each: {"optim.learning_rate": [{"values": [...], "when": {...}},
  ...]}. Values are strings here; the sweep coerces them to the fields' types.
  """
  grids: dict[str, list[TunedGrid]] = {}
  for text in texts:
    head, *conditions = text.split("@")
    path, eq, values = head.partition("=")
    path = path.strip().removeprefix("config.")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or not path or not items:
      raise ConfigError(f"--tune {text!r}: expected {TUNE_FORM}.")
    when = {}
    for condition in conditions:
      field, eq, value = (c.strip() for c in condition.partition("="))
      field = field.removeprefix("config.")
      if not eq or not field or not value or "," in value:
        raise ConfigError(f"--tune {text!r}: the condition {condition!r} is AXIS_FIELD=VALUE "
                          f"with one value (a flag per value for several); expected "
                          f"{TUNE_FORM}.")
      if field in when:
        raise ConfigError(f"--tune {text!r}: the condition on {field} is given twice.")
      when[field] = value
    if any(g.when == when for g in grids.get(path, [])):
      where = f" when {when}" if when else ""
      raise ConfigError(f"--tune {path} is given twice{where}.")
    grids.setdefault(path, []).append(TunedGrid(tuple(items), when))
  return {path: (list(g[0].values) if len(g) == 1 and not g[0].when
                 else [{"values": list(e.values), "when": dict(e.when)} for e in g])
          for path, g in grids.items()}


TUNE_AT_FORM = "AXIS_FIELD=V1[,V2...], such as model.d_model=64 or model.d_model=32,64"


def parse_tune_at_flags(texts: Sequence[str]) -> dict[str, list[str]]:
  """``--tune-at`` flags -> ``Sweep.tune_at``: ``model.d_model=64`` (one
  proxy size) or ``model.d_model=32,64`` (several); a flag per field.
  Values are strings here; the sweep coerces them to the field's type."""
  out: dict[str, list[str]] = {}
  for text in texts:
    path, eq, values = text.partition("=")
    path = path.strip().removeprefix("config.")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or not path or not items:
      raise ConfigError(f"--tune-at {text!r}: expected {TUNE_AT_FORM}.")
    if path in out:
      raise ConfigError(f"--tune-at {path} is given twice; give its sizes in one flag "
                        f"({path}={','.join(out[path] + items)}).")
    out[path] = items
  return out


def parse_seeds(text: str) -> list[int]:
  """``0,1,2`` or ``0-4`` -> list of seeds."""
  try:
    if "-" in text and "," not in text:
      lo, hi = text.split("-")
      return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise ConfigError(f"--seeds={text!r}: expected integers such as 0,1,2 or 0-4.") from None
