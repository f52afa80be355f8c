"""A paper's claim, declared with the sweep that tests it (``Sweep(claims=[...])``).

A claim names two points of the sweep (``compare``), the metric it reads and
what the paper expects of ``point_a`` against ``point_b``: ``"lower"``,
``"higher"`` or ``Equivalent(band)``. The report (``report/claims.py``)
tests every claim of a sweep as one family (Holm over all of them) and gives
each its label by one rule; nothing else assigns a label.

A point is named by a value label of one of the sweep's axes (``"alibi"``,
``"base"``, ``"dropout=0"``) or by a dict {axis field: value}
(``{"model.d_model": 128}``: one field of a zipped axis is enough);
``context`` fixes the other axes for both points. ``point_b`` may be None
where the metric is a quantity of one point against a fixed reference (a
layer profile against flat, a speedup against 1x).

The metrics a claim may read (``report.claims.read``):

  eval/loss, eval/bleu, ...    a split metric of each point's compared runs
  ppl@8x                       perplexity at 8x the training length
  ppl@8x/1x                    the length effect relative to the training
                               length: ln ppl@8x - ln ppl@1x per seed
  training/output_log_z_max    what training logged of its stability
  evaluation/<how>/<metric>    a point evaluated another way against as trained
                               (``evaluation/yarn-x8-from64/ppl@8x``)
  layer_profile/<stat>/<stack> ln(last layer / first) of a per-layer statistic
  speedup                      the effective speedup over AdamW (ln, against 1x;
                               with point_b, ln a's against ln b's, Welch)
  sensitivity                  the learning-rate sensitivity (Wortsman et al.;
                               tested only with >= 2 seeds per rate)
  transfer/shift               a variant's shift of log2(optimum learning rate)
                               per doubling of size, against 0 (compare=(variant,
                               None), the variant named as a point is, without
                               the size axis; ``transfer/shift/num_layers`` where
                               the sweep has two size axes; the default band the
                               sweep's ``transfer_band``)
  ladder/multiplier            a laddered sweep's variant's compute multiplier over
                               the base (ln, against 1x) at every rung, an
                               intersection-union test (compare=(variant, None),
                               the variant named over the declared axes)
  ladder/trend                 the slope of its ln multiplier against ln compute
                               ("lower": it shrinks with scale; default band
                               ``report.multiplier.BAND``)
  every_rate/eval/loss         a's metric against b's at every learning rate both
                               ran (tuning runs, validation, paired by seed), an
                               intersection-union test: "lower" holds where a is
                               lower at each rate (the largest size against the
                               smallest: wider is better at every rate)

``regime`` states where the paper's claim holds; a design outside it keeps
its computed label, marked "outside the paper's regime", and the summary
counts it neither for nor against the paper. ``requires`` is a precondition
read from the runs without which the design cannot show the claim (output
log Z must first diverge for z-loss to prevent it): unmet, the label is
*not tested here*, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, Union

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import serial

# A point: a value label of one axis, or {axis field: value}.
PointSpec = Union[str, dict[str, Any]]
Direction = Literal["lower", "higher"]
DIRECTIONS = ("lower", "higher")
# The quantities a claim reads beside a split's metrics, by prefix (see the docstring).
DERIVED_PREFIXES = ("training/", "evaluation/", "layer_profile/")
SINGLE_POINT_METRICS = ("speedup", "sensitivity", "layer_profile/", "evaluation/",
                        "transfer/shift", "ladder/")


@dataclasses.dataclass(frozen=True)
class Equivalent:
  """The paper expects no difference: within +-``band`` in the metric's units."""
  band: float

  def __post_init__(self):
    if not isinstance(self.band, (int, float)) or isinstance(self.band, bool) or self.band <= 0:
      raise ConfigError(f"Equivalent(band): the band is a number > 0, got {self.band!r}.")


@dataclasses.dataclass(frozen=True)
class Regime:
  """Where a paper's claim holds, as the paper ran it. ``params``: its models'
  parameter counts (lowest, highest); ``tokens_per_param``: its training
  tokens per parameter (lowest, highest); ``converged``: the claim is about
  training run until the loss stops improving. ``text``: the paper's words."""
  params: tuple[float, float] | None = None
  tokens_per_param: tuple[float, float] | None = None
  converged: bool = False
  text: str = ""

  def __post_init__(self):
    for name in ("params", "tokens_per_param"):
      span = getattr(self, name)
      if span is not None and (len(span) != 2 or not 0 < span[0] <= span[1]):
        raise ConfigError(f"Regime({name}=...): (lowest, highest) with 0 < lowest <= "
                          f"highest, got {span!r}.")


@dataclasses.dataclass(frozen=True)
class Requires:
  """A precondition of a claim, read from the runs of ``point``.

  ``metric`` with ``above`` (or ``below``): some run of the point, tuning or
  confirmation, has the metric above (below) the value ("some run without
  z-loss had its output log Z diverge": ``training/output_log_z_max`` above
  20). ``converged``: the point's validation loss was no longer improving
  when its runs stopped (the report's still-improving check says no).
  ``text`` says it in words, for the label's reason."""
  point: Any  # PointSpec
  text: str
  metric: str | None = None
  above: float | None = None
  below: float | None = None
  converged: bool = False

  def __post_init__(self):
    bounded = self.above is not None or self.below is not None
    if self.converged == (self.metric is not None) or bounded != (self.metric is not None):
      raise ConfigError("Requires: give either metric with above= or below=, or "
                        f"converged=True, got metric={self.metric!r}, above={self.above!r}, "
                        f"below={self.below!r}, converged={self.converged!r}.")


# sweep.json's form of an equivalence expectation.
serial.form(Equivalent, lambda e: {"equivalent": e.band},
            lambda data: Equivalent(float(data["equivalent"])))


@serial.layout(omit_none=("context", "regime", "requires"))
@dataclasses.dataclass(frozen=True)
class Claim:
  """One claim of a paper, tested by the sweep it is declared with."""
  id: str           # short and unique in the sweep: "alibi_flat_8x"
  source: str       # "Press et al. 2022"
  statement: str    # the paper's claim in words
  compare: tuple[Any, Any]  # (point_a, point_b): PointSpec, point_b possibly None
  metric: str
  expect: Any       # "lower" | "higher" | Equivalent(band)
  context: dict[str, Any] | None = None
  regime: Regime | None = None
  requires: Requires | None = None

  def __post_init__(self):
    if isinstance(self.expect, Mapping):  # read back from sweep.json
      object.__setattr__(self, "expect", Equivalent(float(self.expect["equivalent"])))
    object.__setattr__(self, "compare", tuple(self.compare))
    check(self)

  @property
  def equivalence(self) -> bool:
    return isinstance(self.expect, Equivalent)


def check(claim: Claim) -> None:
  """The declaration's own problems (ConfigError): what can be known without
  the sweep's points (those: ``report.claims.check_points``)."""
  where = f"claim {claim.id!r}"
  if not isinstance(claim.id, str) or not claim.id:
    raise ConfigError(f"a claim's id is a non-empty string, got {claim.id!r}.")
  if len(claim.compare) != 2 or claim.compare[0] is None:
    raise ConfigError(f"{where}: compare is (point_a, point_b), point_b None only for a "
                      f"quantity of one point; got {claim.compare!r}.")
  if not (isinstance(claim.expect, Equivalent) or claim.expect in DIRECTIONS):
    raise ConfigError(f"{where}: expect is 'lower', 'higher' or Equivalent(band), got "
                      f"{claim.expect!r}.")
  if not isinstance(claim.metric, str) or not claim.metric:
    raise ConfigError(f"{where}: metric is a name such as 'eval/loss', got {claim.metric!r}.")
  single = claim.metric.startswith(SINGLE_POINT_METRICS)
  if single and claim.compare[1] is not None and claim.metric not in ("sensitivity",
                                                                      "speedup"):
    raise ConfigError(f"{where}: {claim.metric} is a quantity of one point: compare=(point, "
                      "None).")
  if claim.compare[1] is None and not single:
    raise ConfigError(f"{where}: {claim.metric} compares two points: give point_b.")
  for spec in [*claim.compare, *(() if claim.requires is None else (claim.requires.point,))]:
    if spec is not None and not isinstance(spec, (str, Mapping)):
      raise ConfigError(f"{where}: a point is a value label or a dict {{axis field: value}}, "
                        f"got {spec!r}.")


def check_all(claims) -> tuple[Claim, ...]:
  """``claims`` as a tuple of Claims, their ids unique (ConfigError)."""
  claims = tuple(claims or ())
  for claim in claims:
    if not isinstance(claim, Claim):
      raise ConfigError(f"claims are Claim(...) objects (from tfx_jax.sweep import Claim), "
                        f"got {claim!r}.")
  ids = [c.id for c in claims]
  repeated = sorted({i for i in ids if ids.count(i) > 1})
  if repeated:
    raise ConfigError(f"claim ids repeat: {repeated}; each claim needs its own id.")
  return claims
