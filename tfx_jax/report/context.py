"""What every section of a report computes from (``Context``) and the sweep's
design that all of them read.

The context is the sweep record (``sweep.json``), each run's summary
(``records.summary.RunSummary``, by run name), each run's dataset baseline and the
report's options; the runs grouped into points (``groups``) and the
sequential design of adaptive seeds (``design``) are derived from the record
once. A section that needs another section's numbers asks for them through
``Context.once``, so each is computed once however many sections read it
(the points, with their trends: ``sections.selection.points``).

The design: which runs a verdict reads (``verdict_runs``; ``reserved_seed``
where a tuned sweep without a test split keeps its first seed for the
choice), the seeds of the first look and the looks of a sweep with adaptive
seeds (``first_look_seeds``, ``sequential_design``), which way a metric is
better and its equivalence margin (``lower_is_better``, ``margin_for``), and
the metric the comparisons lead with (``compared_by``: bits per byte where
the points differ in tokenizer).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, TypeVar

from tfx_jax.records.ladder import BUDGET_AXIS, RUNG_AXIS
from tfx_jax.records.summary import RunSummaries
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.points import Points, fmt_value, group_points
from tfx_jax.report.schema import Baseline, Options, Point, SeedResult, VerdictRuns
from tfx_jax.report.stats_sequential import SequentialDesign

T = TypeVar("T")

LOWER_IS_BETTER = ("loss", "perplexity", "nll", "ppl", "bpb")
# Default equivalence margins by metric kind: 0.01 nats of loss, 0.5 BLEU
# (or chrF) points, half a point of accuracy, 0.005 bits per byte (0.01 nats
# per token at about 3 bytes a token: 0.01 / (3 ln 2)).
DEFAULT_MARGINS = (("bleu", 0.5), ("chrf", 0.5), ("accuracy", 0.005), ("loss", 0.01),
                   ("bpb", 0.005))
# The fields that change the tokenizer or its vocabulary. A token holds more
# text under a larger vocabulary, so nats per token (eval/loss, perplexity,
# ppl@k) are not comparable across them: points that differ in one are
# compared in bits per byte (``BITS_PER_BYTE``) instead (``compared_by``).
TOKENIZER_FIELDS = ("data.tokenizer", "data.tokenizer_file", "data.tokenizer_dataset",
                    "data.vocab_size", "model.vocab_size")
BITS_PER_BYTE = "eval/bpb"


@dataclasses.dataclass
class Context:
  """A sweep's record, its runs' summaries and baselines, the report's options."""
  record: SweepRecord
  summaries: RunSummaries
  baselines: Mapping[str, Baseline]  # {run name: its dataset's baseline}
  options: Options = Options()
  _once: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

  def once(self, key: str, make: Callable[[], T]) -> T:
    """``make()``, computed the first time ``key`` is asked for, then kept."""
    if key not in self._once:
      self._once[key] = make()
    return self._once[key]

  @functools.cached_property
  def groups(self) -> Points:
    """{point key: [(entry, summary)]}: every run of each point (``group_points``)."""
    return group_points(self.record, self.summaries)

  @functools.cached_property
  def design(self) -> SequentialDesign | None:
    """The looks of adaptive seeds (``sequential_design``; None: fixed seeds)."""
    return sequential_design(self.record)


def adjust(record: SweepRecord, pvalues: list[float | None]) -> list[float | None]:
  """The p-values a section's verdicts read: Holm over its family where the
  sweep declares no claims; where it does, the claims are the report's one
  confirmatory family (``report.claims``) and everything else is
  exploratory, read unadjusted and never labelled."""
  return list(pvalues) if record.claims else stats.holm(pvalues)


def exploratory(record: SweepRecord) -> bool:
  """Whether the report's comparisons are exploratory (the sweep declares claims)."""
  return bool(record.claims)


def context_axes(record: SweepRecord) -> frozenset[int]:
  """The axes that are only contexts: their values are never compared with
  one another, the other axes are compared within each of them. A ladder's
  rung and budget axes (``records.ladder``): a larger model or a longer run
  being better is no finding, so the variants are compared within each rung
  and budget, and the ladder's own section reads the scale."""
  return frozenset((RUNG_AXIS, BUDGET_AXIS)) if record.ladder is not None else frozenset()


def lower_is_better(metric: str) -> bool:
  return any(word in metric for word in LOWER_IS_BETTER)


def per_token(metric: str) -> bool:
  """A metric in nats per token, or a function of them (perplexity)."""
  return metric in ("eval/loss", "eval/perplexity") or metric.startswith("ppl@")


def tokenizer_axes(record: SweepRecord) -> tuple[str, ...]:
  """The labels of the axes whose values change the tokenizer or its
  vocabulary (``TOKENIZER_FIELDS``)."""
  return tuple(a.label for a in record.axes
               if len(a.values) > 1 and set(a.fields) & set(TOKENIZER_FIELDS))


def compared_by(record: SweepRecord) -> str:
  """The metric the comparisons lead with: the selection metric, or bits per
  byte in place of a per-token one where the points differ in tokenizer
  (``tokenizer_axes``). Within a point the tokenizer is one, so the tuned
  values are still chosen by ``select_by``."""
  if tokenizer_axes(record) and per_token(record.select_by):
    return BITS_PER_BYTE
  return record.select_by


def margin_for(metric: str, select_by: str, options: Options) -> float:
  """The equivalence margin of ``metric``: the given one for the selection
  metric, else the default of its kind (``DEFAULT_MARGINS``)."""
  if metric == select_by and options.equivalence_margin is not None:
    return float(options.equivalence_margin)
  for word, margin in DEFAULT_MARGINS:
    if word in metric:
      return margin
  return 0.01


def tuned_key(tuned: Mapping[str, Any]) -> str:
  """A tuned-value combination as a label: ``learning_rate=0.003`` ("" untuned)."""
  return ",".join(f"{k.split('.')[-1]}={fmt_value(v)}" for k, v in tuned.items())


def compared_at(point: Point) -> str | None:
  """The tuned values a point is compared at, as a label: those of its
  confirmation runs where it has some (fixed when they were added), else the
  chosen ones."""
  return point.chosen_label if point.confirmed is None else tuned_key(point.confirmed)


# ------------------------------------------------------------------ design
def reserved_seed(record: SweepRecord) -> int | None:
  """The seed that only chooses tuned values: a tuned sweep whose dataset has
  no test split compares the other seeds on validation (a sweep with
  confirmation seeds compares those, which the selection never read)."""
  if (record.tune and not record.confirm and record.report_split == "validation"
      and len(record.seeds) > 1):
    return record.seeds[0]
  return None


def verdict_runs(record: SweepRecord) -> VerdictRuns:
  """The runs a report's verdicts read (``schema.VerdictRuns``)."""
  if record.confirm:
    return "confirmation"
  if not record.tune:
    return "all"
  return "tuning" if reserved_seed(record) is None else "reserved"


def point_verdict_runs(record: SweepRecord, point: Point) -> Mapping[int, SeedResult]:
  """{seed: run} of the runs a point's verdicts read, finished or not: its
  confirmation runs, else its runs at the chosen value (the reserved seed
  left out)."""
  if record.confirm:
    return point.confirmation
  row = next((r for r in point.tuned if r.label == point.chosen_label), None)
  if point.chosen is None or row is None:
    return {}
  reserved = reserved_seed(record)
  return {seed: s for seed, s in row.seeds.items() if seed != reserved}


def first_look_seeds(record: SweepRecord) -> set[int]:
  """The seeds whose runs enter a verdict at the first look, before any seed
  is added: a confirmed sweep's confirmation seeds, else its declared seeds
  (but the one reserved for the choice)."""
  if record.confirm:
    return set(record.confirmation_seeds())
  return set(record.seeds) - {reserved_seed(record)}


def sequential_design(record: SweepRecord) -> SequentialDesign | None:
  """The looks of a sweep with adaptive seeds (``record.until_resolved``);
  None: a fixed-seed sweep, tested once.

  ``--until-resolved MAX_SEEDS`` adds one seed at a time to a point (one look
  each) until it has MAX_SEEDS, counted as ``adaptive.add_seeds`` counts
  them: its confirmation seeds, else all its runs at the chosen value (a
  reserved seed too). So a comparison has at most MAX_SEEDS - counted + 1
  looks, the first with ``first_look_seeds``.
  """
  if not record.until_resolved:
    return None
  first = len(first_look_seeds(record))
  counted = record.confirm or len(record.seeds)
  return SequentialDesign(first, first + max(0, record.until_resolved - counted))
