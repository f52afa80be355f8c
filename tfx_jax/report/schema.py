"""``runs/<sweep>/report.json``: what a sweep's runs say, as types.

  Report        the whole: the options and baselines it used, its points,
                comparisons, failed comparisons, sensitivity, noise and scale
  Point         one combination of axis values: its runs at each tuned value
                (``TunedValue``, each seed a ``SeedResult``), the value chosen
                and its lead over the next best (``ChoiceMargin``), its
                confirmation runs (a sweep with confirmation seeds; ``stale``
                where they ran at another value than is chosen now) and the
                per-seed metrics it is compared on, with its evaluations'
                standard error beside its seed-to-seed spread
  Comparison    a value against its base in one context, on one metric (the
                base: its axis's base value, or the second value of a pair
                the sweep declares, ``Sweep.comparisons``): the interval
                (``stats.Interval``), the Holm-adjusted p, the verdict
                (``stats.Verdict``) and its sentence (rendered when report.json is
                written, ``sections.verdicts``); with adaptive seeds,
                its ``Look`` in the report's ``Sequential`` test
  FailedComparison, StaleComparison, Sensitivity, Noise, ScaleEffect: the
                other sections (a comparison a side of which never learned,
                or whose confirmation is stale, is listed, not made);
  ``speedup.Speedup`` the effective speedup over AdamW
  Trend         whether a point's validation loss still fell at its last
                evaluations by more than the seed noise (``Point.trend``)
  EvaluationEffect, LayerProfile  the effects tested as families of their
                own (``report.effects``, re-exported here)

``assemble.analyze`` builds a ``Report`` from its sections (``sections/``);
the markdown, the plots and the sweep's adaptive seeds read it;
report.json is ``Report.to_json`` and reads back with ``Report.from_json``
(``records.serial``, from these types: seeds, which JSON keys as strings,
back to ints; the layouts say where a file's keys are not the fields in
order; the migrations of older files are at the end). The comparison's interval
is written flat beside its other fields (``method``, ``diff``, ``low``,
``high``, ``df``, ``se``, ``p``, ``n``, ``n_base``, ``level``), as readers of
report.json know it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Iterable, Literal, Mapping

from tfx_jax.records import serial
from tfx_jax.report import stats
from tfx_jax.report import stats_sequential
from tfx_jax.records.compute import Compute, StepCost
from tfx_jax.records.speedup import Speedup
from tfx_jax.records.sweep import Split, Tune, tune_grids
from tfx_jax.report.effects import EvaluationEffect, LayerProfile
from tfx_jax.report.ladder_schema import Ladder
from tfx_jax.report.transfer_schema import Transfer

FILENAME = "report.json"
# A comparison with a side that never learned, at any tuned value.
Failure = Literal["failed", "base failed", "both failed"]
# The runs a report's verdicts read. "all": nothing was tuned, so no run
# chose anything. "tuning": a tuned sweep without confirmation seeds, whose
# verdicts read the seeds that chose each point's tuned value (selection-
# biased: a seed lucky at a value favours its point). "reserved": the same
# without a test split, the first seed only choosing and the others compared
# on validation. "confirmation": the confirmation seeds, fresh seeds at each
# point's chosen value that the selection never read.
VerdictRuns = Literal["all", "tuning", "reserved", "confirmation"]
# Where a point's l0, the loss at initialisation, comes from: "step 0", the
# mean of its runs' evaluations before the first update (``eval.at_start``);
# "uniform", the loss of the uniform prediction (ln |V|, or ln of the classes:
# the task's ``initial_loss``) for runs that did not evaluate at step 0.
InitialLossSource = Literal["step 0", "uniform"]
# Whose runs gave a point's seed noise in ``Trend``: its own, or (a point
# with one run) the base point's, every axis at its base value.
NoiseFrom = Literal["point", "base point"]
# Each evaluation logs a metric's standard error beside its mean, as
# ``<metric>_se`` (eval/loss_se): the sampling error of the evaluated sample,
# across its rows for losses and accuracy (``tasks.losses.standard_error``),
# sacreBLEU's bootstrap for BLEU and chrF (``tasks/bleu.py``).
SE_SUFFIX = "_se"


def is_standard_error(metric: str) -> bool:
  """``metric`` is another metric's evaluation standard error (eval/loss_se)."""
  return metric.endswith(SE_SUFFIX)


# ----------------------------------------------------------------- inputs
@dataclasses.dataclass(frozen=True)
class Options:
  """The report's knobs (``python -m tfx_jax.report`` flags)."""
  stall_margin: float = 0.05          # nats below the unigram entropy to count as learned
  equivalence_margin: float | None = None  # for select_by; None: by metric kind
  alpha: float = 0.05
  power: float = 0.8


@dataclasses.dataclass(frozen=True)
class Baseline:
  """What a run's loss is judged against (per dataset, tokenizer and task)."""
  unigram_entropy: float | None  # the best context-free loss; None: not known
  # The uniform prediction's loss, ln |V| (classes for classification): l0
  # where a point's runs did not evaluate at step 0 (``sections.selection.initial_loss``).
  initial_loss: float | None


# ------------------------------------------------------------------ points
@dataclasses.dataclass(frozen=True)
class Counts:
  """Finished runs by outcome (``stats.Outcome``)."""
  learned: int = 0
  stalled: int = 0
  diverged: int = 0

  @classmethod
  def of(cls, outcomes: Iterable[stats.Outcome | None]) -> Counts:
    """The counts of ``outcomes`` (None, a run not finished, is not counted)."""
    found = list(outcomes)
    return cls(**{o: found.count(o) for o in stats.OUTCOMES})

  @property
  def finished(self) -> int:
    return sum(getattr(self, o) for o in stats.OUTCOMES)

  def __add__(self, other: Counts) -> Counts:
    return Counts(**{o: getattr(self, o) + getattr(other, o) for o in stats.OUTCOMES})


@serial.layout(omit_none=("test",))  # written only where read
@dataclasses.dataclass(frozen=True)
class SeedResult:
  """One run of a point at one tuned value: its outcome and final metrics."""
  run: str
  outcome: stats.Outcome | None  # None: not finished
  validation: dict[str, float]   # final eval/* metrics on validation
  test: dict[str, float] | None  # on test (``eval/test-<step>.json``); None: not read
  lengths: dict[str, float]      # perplexity at k x the training length: {"ppl@2x": ...}
  num_params: int | None
  # What training logged of its stability (``collect.training_signals``): the
  # output log Z's first, last, min and max, the largest attention logit.
  training: dict[str, float] = dataclasses.field(default_factory=dict)

  def on(self, split: Split) -> dict[str, float]:
    """The metrics on ``split``."""
    return self.validation if split == "validation" else self.test or {}


@dataclasses.dataclass(frozen=True)
class TunedValue:
  """A point's runs at one combination of tuned values, and how it is chosen."""
  tuned: dict[str, Any]   # {path: value}; {} untuned
  label: str              # "learning_rate=0.003"; "" untuned
  seeds: dict[int, SeedResult]
  counts: Counts
  selection_mean: float | None   # mean select_by of the learned choosing runs
  selection_failed: int          # choosing runs that stalled or diverged
  selection_score: tuple[float, ...] | None  # lowest is chosen; None: none learned


@dataclasses.dataclass(frozen=True)
class Trend:
  """Was the point's validation loss still falling when its runs stopped?

  ``drop``: the mean, over the point's learned runs that its verdicts read
  (its confirmation runs, else its runs at its chosen tuned value), of each
  run's fall in validation loss (``eval/loss``) between its last two
  evaluations after step 0 (``steps``: the first run's). ``seed_noise``: the
  seed-to-seed standard deviation (n - 1) of those runs' final validation
  loss, or, where the point has a single run, the base point's
  (``noise_from``). ``still_improving``: drop > seed_noise, i.e. the last
  interval of training alone moved the loss by more than a change of seed
  does, so a longer run may change a verdict; None where no seed noise is
  known (one run here and at the base point).
  """
  steps: tuple[int, int]
  drop: float
  runs: int
  seed_noise: float | None
  noise_from: NoiseFrom | None
  still_improving: bool | None


@dataclasses.dataclass(frozen=True)
class ChoiceMargin:
  """How far a tuned point's chosen value is ahead of the next best
  (``runner_up``) on what chose it, against the point's seed spread
  (``sections.choices``). ``margin``: the runner-up's selection score minus
  the chosen's (``TunedValue.selection_score``: ``select_by`` on validation
  over the choosing seeds, lower first; >= 0). ``spread``: the seed-to-seed
  standard deviation (n - 1) of ``select_by`` on validation over the point's
  learned confirmation runs (a sweep without them: its runs at the chosen
  value), or, where it has fewer than two, the base point's (``spread_from``,
  as ``Trend.noise_from``). ``within_noise``: margin < spread: a change of
  seed moves the metric by more than the choice's lead, so the tuning seeds
  decided which value won; None where no spread is known."""
  runner_up: str
  margin: float
  spread: float | None
  spread_from: NoiseFrom | None
  within_noise: bool | None


# ``eval_se`` and ``seed_sd`` are derived from ``compared`` (not read back):
# the evaluation noise beside the seed noise. ``stale`` is written where true.
@serial.layout(order=("key", "values", "chosen", "chosen_label", "chosen_at_edge", "tuned",
                      "counts", "runs", "compared", "num_params", "eval_se", "seed_sd",
                      "trend", "confirmed", "confirmation", "stale", "choice"),
               derived={"eval_se": lambda p: p.eval_se, "seed_sd": lambda p: p.seed_sd},
               omit_none=("choice",), omit_default=("stale",))
@dataclasses.dataclass(frozen=True)
class Point:
  """One combination of axis values (``key``: the index of each axis's value)."""
  key: tuple[int, ...]
  values: dict[str, str]   # {axis label: value label}
  chosen: dict[str, Any] | None  # the tuned values compared; None: nothing learned
  chosen_label: str | None
  chosen_at_edge: dict[str, str]  # {field: "lowest" | "highest"}: at its grid's end
  tuned: tuple[TunedValue, ...]
  counts: Counts
  runs: int
  compared: dict[int, dict[str, float]]  # {seed: {metric: value}} at the chosen value
  num_params: int | None
  trend: Trend | None = None  # None: no learned run with two evaluations after step 0
  # A sweep with confirmation seeds: the tuned values its confirmation runs
  # ran at (None: none yet, or nothing to confirm) and those runs, whose
  # learned ones are ``compared``; ``tuned`` and ``counts`` are the tuning stage's.
  confirmed: dict[str, Any] | None = None
  confirmation: dict[int, SeedResult] = dataclasses.field(default_factory=dict)
  # The confirmation runs ran at other tuned values than the point chooses now
  # (a grid widened, tuning runs added since: ``sections.choices.is_stale``):
  # nothing is ``compared`` and its comparisons are left out
  # (``Report.stale_comparisons``) until the sweep re-confirms it.
  stale: bool = False
  # The chosen value's lead over the next best (None: nothing tuned, a single
  # value learned, or a choice made by fewer failed runs).
  choice: ChoiceMargin | None = None

  @property
  def confirmation_counts(self) -> Counts:
    """The confirmation runs by outcome."""
    return Counts.of(s.outcome for s in self.confirmation.values())

  @property
  def seed_sd(self) -> dict[str, float]:
    """{metric: the seed-to-seed standard deviation (n - 1) of ``compared``},
    for the metrics two or more compared seeds have."""
    out = {}
    for metric in sorted({m for v in self.compared.values() for m in v}):
      values = [v[metric] for v in self.compared.values() if metric in v]
      if len(values) > 1 and not is_standard_error(metric):
        out[metric] = stats.mean_std(values)[1]
    return out

  @property
  def eval_se(self) -> dict[str, float]:
    """{metric: the evaluation standard error of the compared runs}: the root
    mean square of each run's own ``<metric>_se`` (variances average), for
    the metrics whose evaluations logged one. Beside ``seed_sd`` it says how
    much of the seed-to-seed spread the evaluated sample alone could make."""
    out = {}
    for key in sorted({m for v in self.compared.values() for m in v}):
      if is_standard_error(key):
        se = [v[key] for v in self.compared.values() if key in v]
        out[key[:-len(SE_SUFFIX)]] = (sum(x * x for x in se) / len(se)) ** 0.5
    return out


# -------------------------------------------------------------- comparisons
# report.json's form of an interval: ``p`` the p-value, ``n`` and ``n_base``
# the values on each side (written flat beside a comparison's other fields).
serial.layout(order=("method", "diff", "low", "high", "df", "se", "p_value", "n_a", "n_b",
                     "level"),
              keys={"p_value": "p", "n_a": "n", "n_b": "n_base"})(stats.Interval)


@dataclasses.dataclass(frozen=True)
class Look:
  """Where a comparison of a sweep with adaptive seeds stands in its
  sequential design (``Sequential``): look ``look`` of ``looks``, whose tests
  spend ``share`` (w_k) of alpha. The comparison's interval is at level
  1 - alpha * w_k and its ``p_adjusted`` is the Holm-adjusted sequential p of
  the difference; ``p_equivalence`` is that of the equivalence test."""
  look: int
  looks: int
  share: float
  p_equivalence: float | None


@serial.layout(order=("axis", "axis_index", "value", "value_index", "base_index",
                      "base_value", "context", "context_key", "metric", "split", "seeds",
                      "base_seeds", "margin", "chosen", "base_chosen", "counts",
                      "base_counts", "p_adjusted", "verdict", "seeds_needed", "text", "look",
                      "design", "interval"),
               flat=("interval",))
@dataclasses.dataclass(frozen=True)
class Comparison:
  """A value against its base, in one context, on one metric. The base is its
  axis's base value (``AxisRecord.reference``), or the second value of a pair
  the sweep declares (``AxisRecord.comparisons``)."""
  axis: str
  axis_index: int
  value: str
  value_index: int
  base_index: int  # the base's index among the axis's values
  base_value: str
  context: str    # the other axes' values ("-": none)
  context_key: tuple[int | None, ...]  # their indices (None at axis_index)
  metric: str
  split: Split
  seeds: tuple[int, ...]       # the value's compared seeds
  base_seeds: tuple[int, ...]  # the base's
  interval: stats.Interval     # value - base
  margin: float                # of the equivalence test
  chosen: str | None           # the tuned values compared, as labels
  base_chosen: str | None
  counts: Counts
  base_counts: Counts
  p_adjusted: float | None     # Holm over every comparison of the report
  verdict: stats.Verdict
  seeds_needed: int | None     # unresolved: seeds that would detect this difference
  text: str                    # the verdict as a sentence
  look: Look | None = None     # adaptive seeds: the look (None: fixed-seed analysis)
  design: str = ""             # the design in one line (``sections.comparisons.design_line``)

  @property
  def base_key(self) -> tuple[int, ...]:
    """The key of the point this comparison's value is compared against."""
    return self.key_of(self.base_index)

  def key_of(self, value_index: int) -> tuple[int, ...]:
    """The key of the point at ``value_index`` of this comparison's axis, in its context."""
    return tuple(value_index if j == self.axis_index else c
                 for j, c in enumerate(self.context_key))


@dataclasses.dataclass(frozen=True)
class FailedComparison:
  """A comparison a side of which never learned: listed with its counts."""
  axis: str
  value: str
  base_value: str
  context: str
  counts: Counts
  base_counts: Counts
  runs: int
  base_runs: int
  verdict: Failure
  text: str
  # Where a side's counts are its confirmation runs: the tuned values they
  # ran at, as a label (None: the counts are its tuning stage's).
  confirmed: str | None = None
  base_confirmed: str | None = None


@dataclasses.dataclass(frozen=True)
class StaleComparison:
  """A comparison left out because a side's confirmation is stale
  (``Point.stale``: its confirmation runs ran at other tuned values than it
  chooses now). ``stale``: those sides' value labels; ``text``: why, in words."""
  axis: str
  value: str
  base_value: str
  context: str
  stale: tuple[str, ...]
  text: str


# ------------------------------------------------------- sensitivity, noise
@dataclasses.dataclass(frozen=True)
class CurvePoint:
  """The selection metric of a point at one tuned value."""
  tuned: dict[str, Any]
  label: str
  seeds: dict[int, float | None]  # each finished seed's final value; None: it diverged
  mean: float | None              # of the learned seeds
  failed: int                     # stalled or diverged seeds
  # l(eta) of the sensitivity: the mean of min(value, l0) over the declared
  # seeds, a diverged seed at l0 (``stats.capped_mean``); None: l0 not known.
  value: float | None = None


@serial.layout(order=("point", "key", "curve", "initial_loss", "initial_loss_source",
                      "initial_loss_runs", "sensitivity", "all_failed"))
@dataclasses.dataclass(frozen=True)
class Sensitivity:
  """A point's learning-rate curve and its sensitivity (Wortsman et al. 2023)."""
  point: dict[str, str]   # the point's values, as ``Point.values``
  key: tuple[int, ...]
  curve: tuple[CurvePoint, ...]
  initial_loss: float | None  # l0
  sensitivity: float | None
  all_failed: bool            # no run learned, at any tuned value: no number
  initial_loss_source: InitialLossSource | None = None  # None: l0 not known
  initial_loss_runs: int = 0  # the runs whose step-0 evaluations l0 is the mean of


@dataclasses.dataclass(frozen=True)
class Noise:
  """An axis's noise floor and the smallest difference its seeds detect."""
  axis: str
  metric: str
  base_value: str
  base_sd: float | None
  seeds: int
  min_detectable_difference: float | None
  method: stats.Method | None
  power: float


@dataclasses.dataclass(frozen=True)
class ScaleEffect:
  """One comparison's difference against the parameter count of its context."""
  size_axis: str
  axis: str
  value: str
  base_value: str
  context: str
  num_params: int
  diff: float
  low: float | None
  high: float | None
  verdict: stats.Verdict


# ------------------------------------------------------------------- whole
# The design's looks, derived from its first and last, are written beside them.
serial.layout(order=("first", "last", "looks", "rho"),
              derived={"looks": lambda d: d.looks})(stats_sequential.SequentialDesign)


@serial.layout(order=("method", "reference", "max_seeds", "design"), flat=("design",))
@dataclasses.dataclass(frozen=True)
class Sequential:
  """How a sweep with adaptive seeds (``--until-resolved MAX_SEEDS``) is
  tested: ``design``'s looks (``stats_sequential.SequentialDesign``: seeds in a verdict
  at the first and the last look), the method and its reference."""
  max_seeds: int
  design: stats_sequential.SequentialDesign
  method: str = stats_sequential.SEQUENTIAL_METHOD
  reference: str = stats_sequential.SEQUENTIAL_REFERENCE


@serial.layout(order=("sweep", "select_by", "tune", "report_split", "reserved_seed",
                      "options", "baselines", "points", "comparisons", "failed",
                      "sensitivity", "noise", "scale", "verdict_runs", "selection_biased",
                      "tuning_seeds", "confirmation_seeds", "sequential", "speedups",
                      "compute", "step_costs", "evaluation_effects", "layer_profiles",
                      "stale_comparisons", "transfer", "ladder"),
               derived={"selection_biased": lambda r: r.selection_biased},
               omit_default=("step_costs", "stale_comparisons", "transfer"),
               omit_none=("ladder",))
@dataclasses.dataclass(frozen=True)
class Report:
  """report.json."""
  sweep: str
  select_by: str
  tune: Tune  # the sweep's tuned grids (``sweep_record.TunedGrid``)
  report_split: Split
  reserved_seed: int | None  # no test split: the seed that only chooses
  options: Options
  baselines: dict[str, Baseline]  # {run name: its baseline}
  points: tuple[Point, ...]
  comparisons: tuple[Comparison, ...]
  failed: tuple[FailedComparison, ...]
  sensitivity: tuple[Sensitivity, ...]
  noise: tuple[Noise, ...]
  scale: tuple[ScaleEffect, ...]
  verdict_runs: VerdictRuns = "all"  # the runs the verdicts read
  tuning_seeds: tuple[int, ...] = ()        # the declared seeds
  confirmation_seeds: tuple[int, ...] = ()  # a confirmed sweep's declared ones
  sequential: Sequential | None = None  # adaptive seeds' test (None: fixed seeds)
  speedups: tuple[Speedup, ...] = ()  # effective speedup over AdamW (``speedup``)
  compute: Compute | None = None  # what the runs cost (``compute``; None: not recorded)
  step_costs: tuple[StepCost, ...] = ()  # per point, a train step's time and memory
  # Scaled at evaluation against as trained (``EvaluationEffect``; none: no run was).
  evaluation_effects: tuple[EvaluationEffect, ...] = ()
  # Per-layer statistics' profiles and trends (``LayerProfile``; none: no run logged them).
  layer_profiles: tuple[LayerProfile, ...] = ()
  # Left out: a side's confirmation is stale (written where there is one).
  stale_comparisons: tuple[StaleComparison, ...] = ()
  transfer: tuple[Transfer, ...] = ()  # the optimum against size (``sections.transfer``)
  ladder: Ladder | None = None  # fits and multipliers of a ladder (``sections.ladder``)

  def __post_init__(self):
    object.__setattr__(self, "tune", tune_grids(self.tune))

  @property
  def selection_biased(self) -> bool:
    """The verdicts read the seeds that chose each point's tuned value."""
    return self.verdict_runs == "tuning"

  def point(self, key: tuple[int, ...]) -> Point | None:
    return next((p for p in self.points if p.key == tuple(key)), None)

  def chosen(self) -> dict[tuple[int, ...], dict[str, Any] | None]:
    """{point key: its chosen tuned values (None: nothing learned)}."""
    return {p.key: p.chosen for p in self.points}

  def to_json(self) -> dict[str, Any]:
    """report.json's content (``serial.to_json``)."""
    return serial.to_json(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Report:
    """The report of report.json's content, written by this or an earlier
    version (its migrations below)."""
    return serial.from_json(cls, data)


# ---------------------------------------------------------- older reports
# What earlier versions of report.json did not write, oldest first: each step
# adds what its era's files lack (``serial.versioned``). A key whose absence
# means its field's default needs no step: per point its ``trend`` (not
# known), ``confirmed`` and ``confirmation`` (before confirmation seeds);
# per comparison its ``look`` (before the sequential test: every look at a
# fixed alpha) and ``design`` line; per failed comparison its ``confirmed``
# sides; per seed its ``training`` signals (not read); per sensitivity its
# ``initial_loss_runs`` (0) and each tuned value's capped mean (``value``: not
# known; those reports' ``seeds`` are None for stalled runs too); the
# report's ``tuning_seeds`` (not known: empty), ``confirmation_seeds``,
# ``sequential``, ``speedups``, ``compute`` and ``step_costs`` (not recorded),
# ``evaluation_effects``, ``layer_profiles`` and ``stale_comparisons``
# (none); per point its ``choice`` (not known). Before per-point tuned grids
# each tuned field was one list of values, which ``tune_grids`` reads as it
# is. A point's ``stale`` flag has its step: absent, it is read from the file.
def _failed_comparisons(data: dict[str, Any]) -> None:
  """Before comparisons with a side that never learned were listed: none."""
  data.setdefault("failed", [])


def _grid_edges(data: dict[str, Any]) -> None:
  """Before a choice at a grid's end was flagged: none flagged."""
  for point in data["points"]:
    point.setdefault("chosen_at_edge", {})


def _selection_failures(data: dict[str, Any]) -> None:
  """Before a tuned value counted its failed choosing runs and its score:
  none counted, the score not known."""
  for point in data["points"]:
    for row in point["tuned"]:
      row.setdefault("selection_failed", 0)
      row.setdefault("selection_score", None)


def _outcome_counts(data: dict[str, Any]) -> None:
  """Before a comparison kept both sides' outcome counts and the seeds it
  needs: none counted, not known."""
  for row in data["comparisons"]:
    for key in ("counts", "base_counts"):
      row.setdefault(key, serial.to_json(Counts()))
    row.setdefault("seeds_needed", None)


def _initial_loss_source(data: dict[str, Any]) -> None:
  """Before l0 was read at step 0: it was the uniform prediction's loss, ln |V|."""
  for row in data.get("sensitivity", []):
    row.setdefault("initial_loss_source",
                   None if row.get("initial_loss") is None else "uniform")


def _verdict_runs(data: dict[str, Any]) -> None:
  """Before confirmation seeds: a tuned sweep's verdicts read its tuning
  seeds, or all but the reserved seed; an untuned sweep's every run."""
  data.setdefault("verdict_runs", "all" if not data["tune"] else
                  "tuning" if data.get("reserved_seed") is None else "reserved")


def _base_index(data: dict[str, Any]) -> None:
  """Before declared comparisons every base was its axis's base value: the
  index of the points' value of that label."""
  for row in data["comparisons"]:
    if "base_index" not in row:
      row["base_index"] = next(
          p["key"][row["axis_index"]] for p in data["points"]
          if p["values"].get(row["axis"]) == row["base_value"])


def _stale_confirmations(data: dict[str, Any]) -> None:
  """Before stale confirmations were flagged: a point whose confirmation runs
  ran at other tuned values than it chose (kept when the choice moved) is
  stale; its comparisons, made then, stay as the file has them."""
  for point in data["points"]:
    if "stale" not in point and point.get("confirmed") not in (None, point["chosen"]):
      point["stale"] = True


serial.versioned(Report, FILENAME, (_failed_comparisons, _grid_edges, _selection_failures,
                                    _outcome_counts, _initial_loss_source, _verdict_runs,
                                    _base_index, _stale_confirmations))


def read(sweep_dir: str | pathlib.Path) -> Report | None:
  """The sweep directory's report, None where none was written yet."""
  try:
    text = (pathlib.Path(sweep_dir) / FILENAME).read_text()
  except FileNotFoundError:
    return None
  return Report.from_json(json.loads(text))
