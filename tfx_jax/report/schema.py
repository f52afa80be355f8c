"""``runs/<sweep>/report.json``: what a sweep's runs say, as types.

  Report        the whole: the options and baselines it used, its points,
                comparisons, failed comparisons, sensitivity, noise and scale
  Point         one combination of axis values: its runs at each tuned value
                (``TunedValue``, each seed a ``SeedResult``), the value chosen,
                its confirmation runs (a sweep with confirmation seeds) and the
                per-seed metrics it is compared on, with its evaluations'
                standard error beside its seed-to-seed spread
  Comparison    a value against its base in one context, on one metric (the
                base: its axis's base value, or the second value of a pair
                the sweep declares, ``Sweep.comparisons``): the interval
                (``stats.Interval``), the Holm-adjusted p, the verdict
                (``stats.Verdict``) and its sentence (rendered when report.json is
                written, ``sections.verdicts``); with adaptive seeds,
                its ``Look`` in the report's ``Sequential`` test
  FailedComparison, Sensitivity, Noise, ScaleEffect: the other sections;
  ``speedup.Speedup`` the effective speedup over AdamW
  Trend         whether a point's validation loss still fell at its last
                evaluations by more than the seed noise (``Point.trend``)
  EvaluationEffect  a point's models evaluated another way (RoPE scaled at
                evaluation) against as trained, paired by seed
  LayerProfile  a point's per-layer statistic (the gradient norm at
                initialisation) per stack, and its last-over-first trend

``assemble.analyze`` builds a ``Report`` from its sections (``sections/``);
the markdown, the plots and the sweep's adaptive seeds read it;
report.json is ``Report.to_json`` and reads back with ``Report.from_json``
(seeds, which JSON keys as strings, back to ints). The comparison's interval
is written flat beside its other fields (``method``, ``diff``, ``low``,
``high``, ``df``, ``se``, ``p``, ``n``, ``n_base``, ``level``), as readers of
report.json know it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pathlib
import typing
from typing import Any, Iterable, Literal, Mapping

from tfx_jax.report import stats
from tfx_jax.report import stats_sequential
from tfx_jax.records.compute import Compute
from tfx_jax.records.speedup import Speedup
from tfx_jax.records.sweep import Split, Tune, tune_grids, tune_json

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


def _choice(value: Any, kind: Any, what: str) -> Any:
  """``value`` if it is one of the ``Literal`` ``kind``'s choices (None passes)."""
  if value is not None and value not in typing.get_args(kind):
    raise ValueError(f"report.json: {what}={value!r} is not one of "
                     f"{list(typing.get_args(kind))}.")
  return value


def _by_seed(data: Mapping[Any, Any], value=lambda v: v) -> dict[int, Any]:
  """JSON's {"0": ...} (or an in-memory {0: ...}) as {0: ...}."""
  return {int(seed): value(v) for seed, v in data.items()}


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

  def to_json(self) -> dict[str, int]:
    return {o: getattr(self, o) for o in stats.OUTCOMES}

  @classmethod
  def from_json(cls, data: Mapping[str, int]) -> Counts:
    return cls(**{o: int(data[o]) for o in stats.OUTCOMES})


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

  def to_json(self) -> dict[str, Any]:
    out = {"run": self.run, "outcome": self.outcome, "validation": dict(self.validation)}
    if self.test is not None:
      out["test"] = dict(self.test)
    return {**out, "lengths": dict(self.lengths), "num_params": self.num_params,
            "training": dict(self.training)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> SeedResult:
    """Reports before ``training`` have none (not read)."""
    return cls(data["run"], _choice(data["outcome"], stats.Outcome, "outcome"),
               dict(data["validation"]), data.get("test"), dict(data["lengths"]),
               data["num_params"], dict(data.get("training", {})))


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

  def to_json(self) -> dict[str, Any]:
    return {"tuned": dict(self.tuned), "label": self.label,
            "seeds": {s: r.to_json() for s, r in self.seeds.items()},
            "counts": self.counts.to_json(), "selection_mean": self.selection_mean,
            "selection_failed": self.selection_failed,
            "selection_score": (None if self.selection_score is None
                                else list(self.selection_score))}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> TunedValue:
    score = data["selection_score"]
    return cls(dict(data["tuned"]), data["label"], _by_seed(data["seeds"], SeedResult.from_json),
               Counts.from_json(data["counts"]), data["selection_mean"],
               int(data["selection_failed"]), None if score is None else tuple(score))


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

  def to_json(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "steps": list(self.steps)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Trend:
    return cls(tuple(data["steps"]), data["drop"], int(data["runs"]), data["seed_noise"],
               _choice(data["noise_from"], NoiseFrom, "noise_from"),
               data["still_improving"])


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

  def to_json(self) -> dict[str, Any]:
    return {"key": list(self.key), "values": dict(self.values),
            "chosen": None if self.chosen is None else dict(self.chosen),
            "chosen_label": self.chosen_label, "chosen_at_edge": dict(self.chosen_at_edge),
            "tuned": [t.to_json() for t in self.tuned], "counts": self.counts.to_json(),
            "runs": self.runs,
            "compared": {s: dict(m) for s, m in self.compared.items()},
            "num_params": self.num_params,
            # Derived from ``compared`` (not read back): the evaluation noise
            # beside the seed noise.
            "eval_se": self.eval_se, "seed_sd": self.seed_sd,
            "trend": None if self.trend is None else self.trend.to_json(),
            "confirmed": None if self.confirmed is None else dict(self.confirmed),
            "confirmation": {s: r.to_json() for s, r in self.confirmation.items()}}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Point:
    return cls(tuple(data["key"]), dict(data["values"]), data["chosen"],
               data["chosen_label"], dict(data["chosen_at_edge"]),
               tuple(TunedValue.from_json(t) for t in data["tuned"]),
               Counts.from_json(data["counts"]), int(data["runs"]),
               _by_seed(data["compared"], dict), data["num_params"],
               trend=None if data["trend"] is None else Trend.from_json(data["trend"]),
               confirmed=data["confirmed"],
               confirmation=_by_seed(data["confirmation"], SeedResult.from_json))


# -------------------------------------------------------------- comparisons
def interval_to_json(iv: stats.Interval) -> dict[str, Any]:
  """report.json's flat form of an interval (``p`` the p-value, ``n`` and
  ``n_base`` the values on each side)."""
  return {"method": iv.method, "diff": iv.diff, "low": iv.low, "high": iv.high,
          "df": iv.df, "se": iv.se, "p": iv.p_value, "n": iv.n_a, "n_base": iv.n_b,
          "level": iv.level}


def interval_from_json(data: Mapping[str, Any]) -> stats.Interval:
  return stats.Interval(
      diff=data["diff"], low=data["low"], high=data["high"], df=data["df"], se=data["se"],
      p_value=data["p"], method=_choice(data["method"], stats.Method, "method"),
      n_a=int(data["n"]), n_b=int(data["n_base"]), level=data["level"])


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

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Look:
    return cls(int(data["look"]), int(data["looks"]), float(data["share"]),
               data["p_equivalence"])


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

  def to_json(self) -> dict[str, Any]:
    return {"axis": self.axis, "axis_index": self.axis_index, "value": self.value,
            "value_index": self.value_index, "base_index": self.base_index,
            "base_value": self.base_value,
            "context": self.context, "context_key": list(self.context_key),
            "metric": self.metric, "split": self.split, "seeds": list(self.seeds),
            "base_seeds": list(self.base_seeds), "margin": self.margin,
            "chosen": self.chosen, "base_chosen": self.base_chosen,
            "counts": self.counts.to_json(), "base_counts": self.base_counts.to_json(),
            "p_adjusted": self.p_adjusted, "verdict": self.verdict,
            "seeds_needed": self.seeds_needed, "text": self.text,
            "look": None if self.look is None else self.look.to_json(),
            "design": self.design, **interval_to_json(self.interval)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Comparison:
    return cls(
        axis=data["axis"], axis_index=int(data["axis_index"]), value=data["value"],
        value_index=int(data["value_index"]), base_index=int(data["base_index"]),
        base_value=data["base_value"],
        context=data["context"], context_key=tuple(data["context_key"]),
        metric=data["metric"], split=_choice(data["split"], Split, "split"),
        seeds=tuple(data["seeds"]),
        base_seeds=tuple(data["base_seeds"]), interval=interval_from_json(data),
        margin=data["margin"], chosen=data["chosen"], base_chosen=data["base_chosen"],
        counts=Counts.from_json(data["counts"]),
        base_counts=Counts.from_json(data["base_counts"]), p_adjusted=data["p_adjusted"],
        verdict=_choice(data["verdict"], stats.Verdict, "verdict"),
        seeds_needed=data["seeds_needed"], text=data["text"],
        look=None if data["look"] is None else Look.from_json(data["look"]),
        design=data.get("design", ""))


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

  def to_json(self) -> dict[str, Any]:
    return {"axis": self.axis, "value": self.value, "base_value": self.base_value,
            "context": self.context, "counts": self.counts.to_json(),
            "base_counts": self.base_counts.to_json(), "runs": self.runs,
            "base_runs": self.base_runs, "verdict": self.verdict, "text": self.text,
            "confirmed": self.confirmed, "base_confirmed": self.base_confirmed}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> FailedComparison:
    return cls(data["axis"], data["value"], data["base_value"], data["context"],
               Counts.from_json(data["counts"]), Counts.from_json(data["base_counts"]),
               int(data["runs"]), int(data["base_runs"]),
               _choice(data["verdict"], Failure, "verdict"), data["text"],
               data["confirmed"], data["base_confirmed"])


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

  def to_json(self) -> dict[str, Any]:
    return {"tuned": dict(self.tuned), "label": self.label, "seeds": dict(self.seeds),
            "mean": self.mean, "failed": self.failed, "value": self.value}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> CurvePoint:
    return cls(dict(data["tuned"]), data["label"], _by_seed(data["seeds"]), data["mean"],
               int(data["failed"]), data["value"])


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

  def to_json(self) -> dict[str, Any]:
    return {"point": dict(self.point), "key": list(self.key),
            "curve": [c.to_json() for c in self.curve], "initial_loss": self.initial_loss,
            "initial_loss_source": self.initial_loss_source,
            "initial_loss_runs": self.initial_loss_runs,
            "sensitivity": self.sensitivity, "all_failed": self.all_failed}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Sensitivity:
    return cls(dict(data["point"]), tuple(data["key"]),
               tuple(CurvePoint.from_json(c) for c in data["curve"]), data["initial_loss"],
               data["sensitivity"], bool(data["all_failed"]),
               _choice(data["initial_loss_source"], InitialLossSource,
                       "initial_loss_source"),
               int(data["initial_loss_runs"]))


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

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Noise:
    return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


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

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> ScaleEffect:
    return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class EvaluationEffect:
  """One point's models evaluated another way against as trained, the same
  runs paired by seed: RoPE scaled at evaluation only (``evaluate --lengths
  --rope_scaling``) against its positions as trained, at one length. Two
  evaluations of one set of models, not two models: a family of its own,
  Holm over the report's evaluation effects."""
  key: tuple[int, ...]
  point: str        # the point's axis values, as a label
  evaluation: str   # how it was evaluated: "yarn-x8-from64"
  metric: str       # "ppl@8x"
  seeds: tuple[int, ...]
  interval: stats.Interval  # evaluated this way - as trained
  margin: float
  p_adjusted: float | None
  verdict: stats.Verdict

  def to_json(self) -> dict[str, Any]:
    return {"key": list(self.key), "point": self.point, "evaluation": self.evaluation,
            "metric": self.metric, "seeds": list(self.seeds), "margin": self.margin,
            "p_adjusted": self.p_adjusted, "verdict": self.verdict,
            **interval_to_json(self.interval)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> EvaluationEffect:
    return cls(key=tuple(data["key"]), point=data["point"], evaluation=data["evaluation"],
               metric=data["metric"], seeds=tuple(data["seeds"]),
               interval=interval_from_json(data), margin=data["margin"],
               p_adjusted=data["p_adjusted"],
               verdict=_choice(data["verdict"], stats.Verdict, "verdict"))


# Which way a per-layer statistic runs from the first layer to the last
# (``LayerProfile``): resolved up or down after Holm, or not resolved.
LayerTrend = Literal["grows", "falls", "unresolved"]


@dataclasses.dataclass(frozen=True)
class LayerProfile:
  """One point's per-layer statistic in one stack over the runs the report's
  per-layer table shows (its confirmation runs where it ran them; the
  gradient norm at initialisation where runs logged it, Xiong et al.'s
  Figure 3): each layer's mean over the
  seeds with its 95% t-interval's half-width, and the profile's trend, the
  last layer's value over the first's. The trend is tested on the log scale,
  paired by seed (ln last - ln first against 0), and reported as the ratio:
  the geometric mean over seeds with its interval; p adjusted by Holm over
  the report's profiles, a family of their own."""
  key: tuple[int, ...]
  point: str       # the point's axis values, as a label
  statistic: str   # "init_grad_norm/ffn_out": the layer_stats tag's kind and part
  stack: str       # "encoder", "decoder"
  seeds: tuple[int, ...]
  means: tuple[float, ...]                 # per layer, first to last
  half_widths: tuple[float | None, ...]    # None: one seed
  interval: stats.Interval  # ln(last) - ln(first), paired by seed
  p_adjusted: float | None
  trend: LayerTrend
  # The earlier point whose profile this one equals on every seed, tested
  # once for both (None: tested itself).
  same_as: str | None = None

  @property
  def ratio(self) -> tuple[float, float | None, float | None]:
    """last / first: (geometric mean over seeds, its interval's low, high)."""
    iv = self.interval
    return (math.exp(iv.diff), None if iv.low is None else math.exp(iv.low),
            None if iv.high is None else math.exp(iv.high))

  def to_json(self) -> dict[str, Any]:
    ratio, low, high = self.ratio
    return {"key": list(self.key), "point": self.point, "statistic": self.statistic,
            "stack": self.stack, "seeds": list(self.seeds), "means": list(self.means),
            "half_widths": list(self.half_widths), "ratio": ratio, "ratio_low": low,
            "ratio_high": high, "p_adjusted": self.p_adjusted, "trend": self.trend,
            "same_as": self.same_as, "log_ratio": interval_to_json(self.interval)}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> LayerProfile:
    return cls(key=tuple(data["key"]), point=data["point"], statistic=data["statistic"],
               stack=data["stack"], seeds=tuple(data["seeds"]), means=tuple(data["means"]),
               half_widths=tuple(data["half_widths"]),
               interval=interval_from_json(data["log_ratio"]),
               p_adjusted=data["p_adjusted"],
               trend=_choice(data["trend"], LayerTrend, "trend"), same_as=data["same_as"])


# ------------------------------------------------------------------- whole
@dataclasses.dataclass(frozen=True)
class Sequential:
  """How a sweep with adaptive seeds (``--until-resolved MAX_SEEDS``) is
  tested: ``design``'s looks (``stats_sequential.SequentialDesign``: seeds in a verdict
  at the first and the last look), the method and its reference."""
  max_seeds: int
  design: stats_sequential.SequentialDesign
  method: str = stats_sequential.SEQUENTIAL_METHOD
  reference: str = stats_sequential.SEQUENTIAL_REFERENCE

  def to_json(self) -> dict[str, Any]:
    return {"method": self.method, "reference": self.reference,
            "max_seeds": self.max_seeds, "first": self.design.first,
            "last": self.design.last, "looks": self.design.looks, "rho": self.design.rho}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Sequential:
    return cls(int(data["max_seeds"]),
               stats_sequential.SequentialDesign(int(data["first"]), int(data["last"]),
                                      float(data["rho"])),
               data["method"], data["reference"])


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
  # Scaled at evaluation against as trained (``EvaluationEffect``; none: no run was).
  evaluation_effects: tuple[EvaluationEffect, ...] = ()
  # Per-layer statistics' profiles and trends (``LayerProfile``; none: no run logged them).
  layer_profiles: tuple[LayerProfile, ...] = ()

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
    return {
        "sweep": self.sweep, "select_by": self.select_by,
        "tune": tune_json(self.tune),
        "report_split": self.report_split, "reserved_seed": self.reserved_seed,
        "options": dataclasses.asdict(self.options),
        "baselines": {name: dataclasses.asdict(b) for name, b in self.baselines.items()},
        "points": [p.to_json() for p in self.points],
        "comparisons": [c.to_json() for c in self.comparisons],
        "failed": [f.to_json() for f in self.failed],
        "sensitivity": [s.to_json() for s in self.sensitivity],
        "noise": [n.to_json() for n in self.noise],
        "scale": [s.to_json() for s in self.scale],
        "verdict_runs": self.verdict_runs, "selection_biased": self.selection_biased,
        "tuning_seeds": list(self.tuning_seeds),
        "confirmation_seeds": list(self.confirmation_seeds),
        "sequential": None if self.sequential is None else self.sequential.to_json(),
        "speedups": [s.to_json() for s in self.speedups],
        "compute": None if self.compute is None else self.compute.to_json(),
        "evaluation_effects": [e.to_json() for e in self.evaluation_effects],
        "layer_profiles": [p.to_json() for p in self.layer_profiles]}

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Report:
    """A report written by this or an earlier version (``_migrate``)."""
    data = _migrate(data)
    return cls(
        sweep=data["sweep"], select_by=data["select_by"],
        tune=tune_grids(data["tune"]),
        report_split=_choice(data["report_split"], Split, "report_split"),
        reserved_seed=data["reserved_seed"], options=Options(**data["options"]),
        baselines={name: Baseline(**b) for name, b in data["baselines"].items()},
        points=tuple(Point.from_json(p) for p in data["points"]),
        comparisons=tuple(Comparison.from_json(c) for c in data["comparisons"]),
        failed=tuple(FailedComparison.from_json(f) for f in data["failed"]),
        sensitivity=tuple(Sensitivity.from_json(s) for s in data["sensitivity"]),
        noise=tuple(Noise.from_json(n) for n in data["noise"]),
        scale=tuple(ScaleEffect.from_json(s) for s in data["scale"]),
        verdict_runs=_choice(data["verdict_runs"], VerdictRuns, "verdict_runs"),
        tuning_seeds=tuple(data["tuning_seeds"]),
        confirmation_seeds=tuple(data["confirmation_seeds"]),
        sequential=(None if data["sequential"] is None
                    else Sequential.from_json(data["sequential"])),
        speedups=tuple(Speedup.from_json(s) for s in data["speedups"]),
        compute=None if data["compute"] is None else Compute.from_json(data["compute"]),
        evaluation_effects=tuple(EvaluationEffect.from_json(e)
                                 for e in data["evaluation_effects"]),
        layer_profiles=tuple(LayerProfile.from_json(p) for p in data["layer_profiles"]))


def _migrate(data: Mapping[str, Any]) -> dict[str, Any]:
  """report.json's content in the current shape (a copy; the current shape as is).

  What earlier versions did not write: the failed comparisons (``failed``);
  per point, the tuned values chosen at a grid's end (``chosen_at_edge``);
  per tuned value, the failed choosing runs and the score
  (``selection_failed``, ``selection_score``: not known, None); per
  comparison, the outcome counts of both sides and the seeds needed
  (``counts``, ``base_counts``, ``seeds_needed``); per point, its ``trend``
  (not known, None); per sensitivity, where l0 came from (earlier reports
  took it as the uniform prediction's loss, ln |V|: ``initial_loss_source``
  "uniform", ``initial_loss_runs`` 0) and each tuned value's capped mean
  (``value``: not known, None; those reports' ``seeds`` are None for stalled
  runs too). Before confirmation seeds: no ``verdict_runs`` (a tuned sweep's
  verdicts read its tuning seeds, or all but the reserved seed; an untuned
  sweep's every run), ``tuning_seeds`` (not known: empty) or
  ``confirmation_seeds`` (none); per point no ``confirmed`` or
  ``confirmation``; per failed comparison no ``confirmed`` side. Before the
  sequential test of adaptive seeds: no ``sequential`` and no ``look`` per
  comparison (those reports tested every look at a fixed alpha: None).
  Before declared comparisons: no ``base_index`` per comparison (every base
  was its axis's base value: the index of the points' value of that label).
  Before the effective speedup: no ``speedups`` (none). Before the compute
  table: no ``compute`` (None: not recorded). Before the evaluation effects:
  no ``evaluation_effects`` (none tested). Before the layer profiles: no
  ``layer_profiles`` (none). Before per-point
  tuned grids: each tuned field as one list of values, which ``tune_grids``
  reads as it is.
  """
  data = copy.deepcopy(dict(data))
  data.setdefault("failed", [])
  data.setdefault("evaluation_effects", [])
  data.setdefault("layer_profiles", [])
  data.setdefault("verdict_runs", "all" if not data["tune"] else
                  "tuning" if data.get("reserved_seed") is None else "reserved")
  data.setdefault("tuning_seeds", [])
  data.setdefault("confirmation_seeds", [])
  data.setdefault("sequential", None)
  data.setdefault("speedups", [])
  data.setdefault("compute", None)
  for row in data["failed"]:
    row.setdefault("confirmed", None)
    row.setdefault("base_confirmed", None)
  for point in data["points"]:
    point.setdefault("chosen_at_edge", {})
    point.setdefault("trend", None)
    point.setdefault("confirmed", None)
    point.setdefault("confirmation", {})
    for row in point["tuned"]:
      row.setdefault("selection_failed", 0)
      row.setdefault("selection_score", None)
  for row in data["comparisons"]:
    for key in ("counts", "base_counts"):
      row.setdefault(key, Counts().to_json())
    row.setdefault("seeds_needed", None)
    row.setdefault("look", None)
    if "base_index" not in row:
      row["base_index"] = next(
          p["key"][row["axis_index"]] for p in data["points"]
          if p["values"].get(row["axis"]) == row["base_value"])
  for row in data.get("sensitivity", []):
    row.setdefault("initial_loss_source",
                   None if row.get("initial_loss") is None else "uniform")
    row.setdefault("initial_loss_runs", 0)
    for point in row["curve"]:
      point.setdefault("value", None)
  return data


def read(sweep_dir: str | pathlib.Path) -> Report | None:
  """The sweep directory's report, None where none was written yet."""
  try:
    text = (pathlib.Path(sweep_dir) / FILENAME).read_text()
  except FileNotFoundError:
    return None
  return Report.from_json(json.loads(text))
