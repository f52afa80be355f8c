"""The report's section "Where the tuned values came from", on a sweep with
``tune_at`` (``records.transfer``): per point whether its tuned values were
tuned at it or transferred from a proxy size (which, by which rule, with the
flag "transferred under sp: not expected to hold" where the point is under
the standard parametrization), and per comparison the same for both of its
sides (in its design line, ``comparison_text``). report.json's ``provenance``: one ``Provenance`` per point.

``provenance(record, points)`` is the question asked of every point; a
check of whether a transferred value held (was it inside a larger tuned
size's optimum interval?) reads its ``source_size`` and ``value``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Mapping, Sequence

from tfx_jax.records import transfer as transfer_lib
from tfx_jax.records.sweep import DECLARED, SweepRecord
from tfx_jax.report.context import Context, tuned_key
from tfx_jax.report.points import fmt_value
from tfx_jax.report.schema import Comparison, Point, Report
from tfx_jax.report.sections import selection
from tfx_jax.report.tables import Lines, markdown_table

SP_FLAG = "transferred under sp: not expected to hold"
# The stages of a transfer stage's runs.
TRANSFER_STAGES = ("transfer", "superseded_transfer")


@dataclasses.dataclass(frozen=True)
class Provenance:
  """Where a point's tuned values came from.

  ``source``: ``tuned`` (its own tuning runs chose them) or ``transferred``
  (the value chosen at ``source_key``, the proxy point of size
  ``source_size``, e.g. ``d_model=64``, carried over by ``rule``). ``value``:
  the tuned values the point's runs ran at, its transfer-stage runs' or, on
  a sweep with confirmation seeds (no transfer stage), its confirmation
  runs' (None: none yet, or nothing chosen); ``source_value``: what its proxy chooses now (a transferred
  point's runs at another value are stale until the sweep runs again).
  ``expected_to_hold``: False under ``sp`` (a plain copy), True under muP and
  CompleteP (their rules), None where the point tunes."""
  point: dict[str, str]
  key: tuple[int, ...]
  source: Literal["tuned", "transferred"]
  value: dict[str, Any] | None
  parametrization: str
  source_key: tuple[int, ...] | None = None
  source_point: dict[str, str] | None = None
  source_size: str | None = None
  source_value: dict[str, Any] | None = None
  rule: str | None = None
  expected_to_hold: bool | None = None

  @property
  def text(self) -> str:
    """``tuned here`` or ``transferred from d_model=64`` (and the sp flag)."""
    if self.source == "tuned":
      return "tuned here"
    return f"transferred from {self.source_size}" + (
        "" if self.expected_to_hold else f" ({SP_FLAG})")


def provenance(record: SweepRecord, points: Sequence[Point]) -> list[Provenance]:
  """Each point's ``Provenance`` (none where the sweep has no ``tune_at``)."""
  if not record.tune_at:
    return []
  plan = transfer_lib.record_sources(record)
  by_key = {p.key: p for p in points}
  runs: dict[tuple[int, ...], list] = {}
  for entry in record.runs:
    runs.setdefault(record.point_key(entry), []).append(entry)
  out = []
  for point in points:
    entries = runs.get(point.key, [])
    form = transfer_lib.parametrization(record, entries[0].overrides if entries else {})
    source = transfer_lib.source_key(plan, point.key)
    if source == point.key:
      out.append(Provenance(point=point.values, key=point.key, source="tuned",
                            value=point.chosen, parametrization=form))
      continue
    # Its transfer-stage runs' value, else (a sweep with confirmation seeds
    # runs no transfer stage) its confirmation runs'.
    ran = next((dict(e.tuned) for e in entries if e.stage in DECLARED), point.confirmed)
    proxy = by_key.get(source)
    out.append(Provenance(
        point=point.values, key=point.key, source="transferred", value=ran,
        parametrization=form, source_key=source,
        source_point=None if proxy is None else proxy.values,
        source_size=transfer_lib.size_label(record, source),
        source_value=None if proxy is None else proxy.chosen,
        rule=transfer_lib.RULES.get(form, "a copy"),
        expected_to_hold=transfer_lib.expected_to_hold(form)))
  return out


def of_ctx(ctx: Context) -> list[Provenance]:
  """``provenance`` of the report's points, computed once per report."""
  return ctx.once("provenance", lambda: provenance(ctx.record, selection.points(ctx)))


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``provenance`` (a sweep with ``tune_at`` only)."""
  found = of_ctx(ctx)
  return {"provenance": tuple(found)} if found else {}


def side_text(record: SweepRecord, key: Sequence[int]) -> str:
  """``tuned here`` or ``transferred from d_model=64`` (with the sp flag) of
  the point ``key``, from the record alone (``Provenance.text``)."""
  source = transfer_lib.transferred(record, key)
  if source is None:
    return "tuned here"
  entry = next((e for e in record.runs if record.point_key(e) == tuple(key)), None)
  form = transfer_lib.parametrization(record, entry.overrides if entry else {})
  return f"transferred from {transfer_lib.size_label(record, source)}" + (
      "" if transfer_lib.expected_to_hold(form) else f" ({SP_FLAG})")


def comparison_text(record: SweepRecord, row: Comparison) -> str:
  """Where both sides of a comparison took their tuned values (a comparison's
  design line, ``sections.comparisons.design_line``): ``tuned values:
  d_model=128 transferred from d_model=64 (...), d_model=64 tuned here``
  ("" where the sweep has no ``tune_at``)."""
  if not record.tune_at:
    return ""
  sides = [f"{label} {side_text(record, row.key_of(vi))}"
           for label, vi in ((row.value, row.value_index), (row.base_value, row.base_index))]
  return "tuned values: " + ", ".join(sides)


def _value(value: Mapping[str, Any] | None) -> str:
  return tuned_key(value) if value else "-"


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Each point's source of its tuned values; each comparison's two sides'."""
  found = of_ctx(ctx)
  if not found:
    return []
  record = ctx.record
  rows = [[a.label for a in record.axes]
          + ["tuned values", "from", "parametrization", "rule", "proxy chooses now"]]
  for p in found:
    stale = (p.source == "transferred" and p.value is not None
             and p.source_value is not None and p.value != p.source_value)
    rows.append(list(p.point.values())
                + [_value(p.value), p.text, p.parametrization, p.rule or "-",
                   "-" if p.source == "tuned" else
                   _value(p.source_value) + (" (stale: rerun the sweep)" if stale else "")])
  sizes = ", ".join(f"`{field}` = {', '.join(fmt_value(v) for v in values)}"
                    for field, values in record.tune_at)
  # With confirmation seeds a transferred point runs no transfer stage (a
  # sweep of an earlier version ran one, and its report says so still).
  seeds = ("declared seeds" if any(e.stage in TRANSFER_STAGES for e in record.runs)
           or not record.confirm else "confirmation seeds (no transfer stage: the "
           "verdicts read the confirmation runs only)")
  out = ["## Where the tuned values came from", "",
         f"Tuned at the proxy sizes only ({sizes}): every other point ran its {seeds} "
         "at the value chosen at the nearest proxy size below it. Under `mup` and "
         "`completep` the learning rate is in base units, so the same number is the "
         "transferred value their rules prescribe; under `sp` it is a plain copy, which "
         "nothing makes hold as the model grows (the optimum moves with width: Yang et "
         "al. 2022).", "", markdown_table(rows), ""]
  flagged = [p for p in found if p.source == "transferred" and not p.expected_to_hold]
  if flagged:
    out += [f"{SP_FLAG.capitalize()}: " + "; ".join(
        ", ".join(p.point.values()) or "base" for p in flagged) + ".", ""]
  out += ["Each comparison's design line (Comparisons) says where both of its sides "
          "took their values.", ""]
  held = held_lines(found, report)
  if held:
    out += ["Where a larger size was tuned too, whether the value chosen at the tuned size "
            "below it (the value a transfer would have carried) lies inside that size's "
            "fitted optimum interval (Learning-rate transfer):", "", *held, ""]
  return out


LEARNING_RATE = "optim.learning_rate"


def held_lines(found: Sequence[Provenance], report: Report) -> list[str]:
  """One line per tuned size above another tuned size of the same variant:
  the lower one's chosen rate against the higher one's optimum interval
  (``report.transfer``)."""
  by_key = {tuple(p.key): p for p in found}
  lines = []
  for check in report.transfer:
    tuned = [o for o in check.optima
             if (p := by_key.get(tuple(o.key))) and p.source == "tuned" and p.value
             and LEARNING_RATE in p.value]
    for lower, higher in zip(tuned, tuned[1:]):
      value = by_key[tuple(lower.key)].value[LEARNING_RATE]
      where = (f"- {check.variant_label}, {check.size_field.split('.')[-1]} "
               f"{fmt_value(higher.size)}: the rate chosen at {fmt_value(lower.size)}, "
               f"{fmt_value(value)}, ")
      if higher.low is None or higher.high is None:
        lines.append(where + "has no interval to be read against "
                     f"({higher.reason or 'fewer than 2 seeds'}).")
      elif higher.low <= value <= higher.high:
        lines.append(where + f"lies inside its optimum's interval [{higher.low:.3g}, "
                     f"{higher.high:.3g}]: the transfer held.")
      else:
        lines.append(where + f"lies outside its optimum's interval [{higher.low:.3g}, "
                     f"{higher.high:.3g}]: the transfer did not hold.")
  return lines
