"""The prose of ``docs/results.md`` against the committed reports: every label
and every interval it quotes must be its report.json's.

The page's sections map to reports as ``results_doc`` reads them (a ``##
`name`: ...`` heading, a ``### ... (`variant`)`` heading); the summary block
(generated) and code blocks are not read. Two conventions make the prose
checkable:

  labels     a claim's id in backticks, then an italic label within the
             same sentence or table row: "`alibi_8x` *reproduced*", "`alibi_2x`
             and `alibi_8x` *reproduced*", "| `alibi_8x` | ... | *reproduced* |"
             (each id takes the first label after it before the sentence or the
             row ends). The label must be the one
             report.json's ``claims`` give that id, in the section's reports;
             an id-like name followed by a label that is no claim there (nor a
             report's name) is a mismatch too, and so is a label with no id
             before it (it cannot be checked). Sections whose reports have no
             claims yet are not label-checked (``unlabelled`` names them).
  intervals  ``X [A, B]``, signed or unsigned decimals (an ``x`` after X for a
             ratio: ``2.78x [2.19, 3.53]``; ``<``/``>`` before an end that is a
             bound, as speedups print it). The three numbers, each at its own
             printed decimals, must be some triple of the section's reports
             rounded once from the full values: a claim's estimate (a log-ratio
             claim's also as the ratio), a comparison's difference, an
             evaluation effect, a scale effect, a layer profile's log ratio or
             ratio, a speedup. "4.726" for 4.72545 (rounded to 4.7255 first) is
             a mismatch; 4.725 is not.
  spreads    ``M ± S``: the mean and the (n - 1) standard deviation, each at its
             printed decimals, of one metric over one group of a point's
             learned runs in the section's reports (its confirmation runs, or
             its runs at one tuned value), on the validation or test split,
             at a length (``ppl@Kx``) or in what training logged.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import pathlib
import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal, Sequence

from tfx_jax.report import claims as claims_lib
from tfx_jax.report import results_doc, stats
from tfx_jax.report.claims import LABELS
from tfx_jax.report.results_doc import Committed, ResultsError


@dataclasses.dataclass(frozen=True)
class Mismatch:
  """One thing the prose quotes that its report.json does not say."""
  line: int      # 1-based line of the page
  quoted: str    # as printed
  why: str
  kind: Literal["label", "interval", "spread", "page"] = "label"

  def __str__(self) -> str:
    return f"{self.line}: {self.quoted}: {self.why}"


@dataclasses.dataclass(frozen=True)
class Triple:
  """An estimate with its interval, as report.json holds it (full values)."""
  what: str         # where in report.json ("comparison alibi vs rope (eval/loss)")
  estimate: float
  low: float
  high: float
  ratio: bool = False        # a ratio (printed with an "x")
  low_bound: bool = False    # the end lies beyond what was run: a bound
  high_bound: bool = False


def triples(found: Committed) -> list[Triple]:
  """Every (estimate, low, high) of one report."""
  report, out = found.report, []

  def add(what, estimate, low, high, **kw):
    if None not in (estimate, low, high) and all(
        math.isfinite(v) for v in (estimate, low, high)):
      out.append(Triple(f"{found.name}: {what}", estimate, low, high, **kw))

  for row in found.claims:
    add(f"claim {row.id}", row.estimate, row.low, row.high)
    if claims_lib.log_ratio(row.metric) and row.estimate is not None and row.low is not None:
      add(f"claim {row.id} as a ratio", math.exp(row.estimate), math.exp(row.low),
          math.exp(row.high), ratio=True)
  for c in report.comparisons:
    iv = c.interval
    context = "" if c.context == "-" else f", {c.context}"
    add(f"comparison {c.value} vs {c.base_value} ({c.metric}{context})", iv.diff, iv.low,
        iv.high)
  for e in report.evaluation_effects:
    iv = e.interval
    add(f"evaluation effect {e.point} {e.evaluation} ({e.metric})", iv.diff, iv.low, iv.high)
  for s in report.scale:
    add(f"scale effect {s.value} vs {s.base_value} ({s.context})", s.diff, s.low, s.high)
  for profile in report.layer_profiles:
    iv = profile.interval
    what = f"layer profile {profile.point} {profile.statistic} {profile.stack}"
    add(f"{what} (ln last/first)", iv.diff, iv.low, iv.high)
    add(what, *profile.ratio, ratio=True)
  for s in report.speedups:
    if s.speedup is not None and s.interval is not None:
      add(f"speedup {s.optimizer} ({s.context})", s.speedup, s.interval.low, s.interval.high,
          ratio=True, low_bound=s.interval.low_beyond, high_bound=s.interval.high_beyond)
  for v in report.ladder.variants if report.ladder is not None else ():
    _ladder_triples(v, add)
  return out


def _ladder_triples(v, add) -> None:
  """A ladder variant's quoted numbers: its fitted constants, its multiplier
  at each rung and its trend, and its backtest's predictions."""
  name = v.variant if v.budget is None else f"{v.variant} @ {v.tokens_per_param:g} tokens/param"
  for fit in (v.fit, v.params_tokens):
    for c in (fit.parameters if fit is not None and fit.identifiable else ()):
      add(f"ladder {name} {fit.form} {c.name}", c.value, c.low, c.high)
  m = v.multiplier
  for row in m.rungs if m is not None else ():
    if row.multiplier is not None and row.interval is not None:
      add(f"ladder {name} multiplier at C = {row.compute:.3g}", row.multiplier,
          row.interval.low, row.interval.high, ratio=True,
          low_bound=row.interval.low_beyond, high_bound=row.interval.high_beyond)
  if m is not None and m.trend is not None and m.trend.interval is not None:
    add(f"ladder {name} trend", m.trend.slope, m.trend.interval.low, m.trend.interval.high)
  for held in v.backtest.held_out if v.backtest is not None else ():
    if held.interval is not None:
      add(f"ladder {name} backtest at C = {held.compute:.3g}", held.predicted,
          held.interval.low, held.interval.high)


def spreads(found: Committed) -> list[tuple[str, float, float]]:
  """Every (where, mean, std) of one report: each metric over each group of
  a point's learned runs (two or more)."""
  out = []
  for point in found.report.points:
    groups = [("confirmation", point.confirmation)] + [(row.label, row.seeds)
                                                         for row in point.tuned]
    for group, seeds in groups:
      runs = [r for r in seeds.values() if r.outcome == "learned"]
      tables = {"validation": [r.validation for r in runs], "test": [r.test or {} for r in runs],
                "lengths": [r.lengths for r in runs], "training": [r.training for r in runs]}
      for where, rows in tables.items():
        for metric in sorted({k for row in rows for k in row}):
          values = [row[metric] for row in rows
                    if metric in row and row[metric] is not None and math.isfinite(row[metric])]
          if len(values) >= 2:
            mean, std = stats.mean_std(values)
            point_name = claims_lib.point_label(point)
            out.append((f"{found.name}: {point_name} {group or ''} {where} {metric} "
                        f"({len(values)} runs)".replace("  ", " "), mean, std))
  return out


# -------------------------------------------------------------------- text
_NUMBER = r"[+\-\u2212]?\d+(?:,\d{3})*(?:\.\d+)?"
INTERVAL = re.compile(
    rf"(?<![\w.+\-\u2212])(?P<x>{_NUMBER})(?P<unit>x?)\s*\[\s*(?P<lb>[<>]?)\s*(?P<a>{_NUMBER})"
    rf"x?\s*,\s*(?P<hb>[<>]?)\s*(?P<b>{_NUMBER})x?\s*\]")
SPREAD = re.compile(rf"(?<![\w.+\-\u2212])(?P<mean>{_NUMBER})\s*±\s*(?P<std>\d+(?:\.\d+)?)")
_LABEL = "|".join(l.replace(" ", r"\s+") for l in LABELS)
LABEL = re.compile(rf"(?<!\*)\*(?P<label>{_LABEL})\*(?!\*)")
NAME = re.compile(r"`(?P<name>[^`\n]+)`")
# Where a sentence ends: a blank line, a list item, or a full stop before a
# capital (not a decimal point, not "et al. 2022"); a table row ends at its
# line's end (``_row_ends``), so a row's label cells read its id cells.
BOUNDARY = re.compile(r"\n[ \t]*\n|\n[ \t]*(?:[-*+]|\d+\.)[ \t]|[.!?](?=\s+[A-Z`*(\[]|\s*$)")
_ROW = re.compile(r"^[ \t]*\|.*$", re.M)
CLAIM_ID = re.compile(r"[a-z][a-z0-9_]*")


def _readable(text: str) -> list[str]:
  """The page's lines, the summary block and code blocks blanked (numbering kept)."""
  out, fenced, summary = [], False, False
  for line in text.split("\n"):
    fence = line.lstrip().startswith("```")
    summary = summary or line.strip() == results_doc.BEGIN
    out.append("" if fenced or fence or summary else line)
    fenced = fenced != fence
    summary = summary and line.strip() != results_doc.END
  return out


def _decimals(printed: str) -> int:
  return len(printed.split(".")[1]) if "." in printed else 0


def _value(printed: str) -> Decimal:
  return Decimal(printed.replace(",", "").replace("\u2212", "-"))


def rounded(value: float, decimals: int) -> Decimal:
  """``value`` rounded once, from its full binary value, to ``decimals``."""
  return Decimal(f"{value:.{decimals}f}")


def _matches(printed: str, value: float) -> bool:
  return _value(printed) == rounded(value, _decimals(printed))


def _twice(printed: str, value: float) -> bool:
  """Whether ``printed`` is ``value`` rounded to one more decimal first."""
  d = _decimals(printed)
  step = rounded(value, d + 1).quantize(Decimal(1).scaleb(-d), rounding=ROUND_HALF_UP)
  return _value(printed) == step and not _matches(printed, value)


# Beyond this relative distance the nearest candidate is no hint of what was meant.
FAR = 0.05


def _rounded_twice(pairs: Sequence[tuple[str, float]]) -> list[str]:
  """The printed numbers rounded twice from their values, where every other
  one is rounded once (none where any is simply another number)."""
  twice = [p for p, v in pairs if _twice(p, v)]
  return twice if all(_matches(p, v) or p in twice for p, v in pairs) else []


def _interval_mismatch(found: re.Match, candidates: Sequence[Triple]) -> str | None:
  """None where a candidate gives the quoted interval; else why not."""
  x, a, b = found.group("x"), found.group("a"), found.group("b")
  ratio = bool(found.group("unit"))
  bounds = (found.group("lb") != "", found.group("hb") != "")
  usable = [t for t in candidates if t.ratio or not ratio]
  for t in usable:
    if (_matches(x, t.estimate) and _matches(a, t.low) and _matches(b, t.high)
        and (t.low_bound, t.high_bound) == bounds):
      return None
  if not usable:
    return "no interval in the section's report.json to compare with"

  def distance(t):
    return max(abs(float(_value(p)) - v) / max(abs(v), 1e-12)
               for p, v in ((x, t.estimate), (a, t.low), (b, t.high)))
  near = min(usable, key=distance)
  if distance(near) > FAR:
    return "no interval of the section's report.json is near it"
  shown = (f"{rounded(near.estimate, _decimals(x))} [{rounded(near.low, _decimals(a))}, "
           f"{rounded(near.high, _decimals(b))}]")
  why = (f"no triple of the section's report.json rounds to it; nearest: {near.what}, "
         f"{near.estimate:.6g} [{near.low:.6g}, {near.high:.6g}], which prints as {shown}")
  twice = _rounded_twice(((x, near.estimate), (a, near.low), (b, near.high)))
  if twice:
    why += f" ({', '.join(twice)} rounded twice)"
  if (near.low_bound, near.high_bound) != bounds and distance(near) == 0:
    why += "; its ends' bounds differ"
  return why


def _spread_mismatch(found: re.Match, candidates: Sequence[tuple[str, float, float]]
                     ) -> str | None:
  mean, std = found.group("mean"), found.group("std")
  if any(_matches(mean, m) and _matches(std, s) for _, m, s in candidates):
    return None
  if not candidates:
    return "no runs in the section's report.json to compare with"

  def distance(c):
    return (abs(float(_value(mean)) - c[1]) / max(abs(c[1]), 1e-12)
            + abs(float(_value(std)) - c[2]) / max(abs(c[2]), 1e-12))
  where, m, s = min(candidates, key=distance)
  if distance((where, m, s)) > FAR:
    return "no mean ± std of the section's runs is near it (report.json may not hold its runs)"
  why = (f"no mean ± std of the section's runs rounds to it; nearest: {where}, "
         f"{m:.6g} ± {s:.6g}, which prints as {rounded(m, _decimals(mean))} ± "
         f"{rounded(s, _decimals(std))}")
  twice = _rounded_twice(((mean, m), (std, s)))
  return why + (f" ({', '.join(twice)} rounded twice)" if twice else "")


def _label_mismatches(chunk: str, line_of, section: results_doc.Section,
                      found: dict[str, Committed], names: set[str]) -> list[Mismatch]:
  ids: dict[str, list[tuple[str, str]]] = {}
  for name in section.scope:
    for row in found[name].claims:
      ids.setdefault(row.id, []).append((name, row.label))
  events = sorted([(m.start(), "name", m) for m in NAME.finditer(chunk)]
                  + [(m.start(), "label", m) for m in LABEL.finditer(chunk)]
                  + [(m.start(), "end", m) for m in BOUNDARY.finditer(chunk)]
                  + [(m.end(), "end", m) for m in _ROW.finditer(chunk)],
                  key=lambda e: e[0])
  out, pending = [], []
  for start, kind, m in events:
    if kind == "end":
      pending = []
    elif kind == "name":
      # A report's name or a config path is no claim: it takes no label.
      if m.group("name") in ids or (CLAIM_ID.fullmatch(m.group("name")) and (
          m.group("name") not in names | {results_doc.DEFAULT_VARIANT})):
        pending.append(m)
    else:
      quoted = " ".join(m.group("label").split())
      if not pending:
        out.append(Mismatch(line_of(start), f"*{quoted}*",
                            "a label with no claim id before it in its sentence or table row: "
                            "name the claim it is (`id` *label*)"))
      for name_match in pending:
        claim = name_match.group("name")
        where = line_of(name_match.start())
        if claim in ids:
          labels = {label for _, label in ids[claim]}
          if labels != {quoted}:
            given = "; ".join(f"{r} *{label}*" for r, label in ids[claim])
            out.append(Mismatch(where, f"`{claim}` *{quoted}*",
                                f"report.json labels it: {given}"))
        else:
          out.append(Mismatch(where, f"`{claim}` *{quoted}*",
                              f"no claim {claim!r} in {', '.join(section.scope)} (its claims: "
                              f"{', '.join(sorted(ids))})"))
      pending = []
  return out


def unlabelled(text: str, found: Sequence[Committed]) -> list[str]:
  """The experiment sections whose reports have no claims (or no report),
  each as "line N ## heading: the reports"."""
  by_name = {c.name: c for c in found}
  out = []
  for section in results_doc.sections(text, list(by_name)):
    if section.experiment is None or section.heading.startswith("###"):
      continue
    lacking = [n for n in section.scope if not by_name[n].claims] or (
        [] if section.scope else [f"{section.experiment} (no report.json)"])
    if lacking:
      out.append(f"line {section.first} {section.heading}: no claims in "
                 f"{', '.join(lacking)}")
  return out


def check(text: str, found: Sequence[Committed]) -> list[Mismatch]:
  """Every label and interval the prose of ``text`` quotes that the reports
  ``found`` do not give, in page order (see the module docstring)."""
  by_name = {c.name: c for c in found}
  lines = _readable(text)
  out = []
  for section in results_doc.sections(text, list(by_name)):
    if section.experiment is None:
      continue
    if not section.scope:
      out.append(Mismatch(section.first, section.heading,
                          f"no docs/results/{section.experiment}/report.json", "page"))
      continue
    body = lines[section.first:section.last]  # after the heading line
    chunk = "\n".join(body)
    starts = [0]
    for line in body[:-1]:
      starts.append(starts[-1] + len(line) + 1)

    def line_of(offset, first=section.first):
      return first + bisect.bisect_right(starts, offset)

    candidates = [t for n in section.scope for t in triples(by_name[n])]
    for m in INTERVAL.finditer(chunk):
      why = _interval_mismatch(m, candidates)
      if why:
        out.append(Mismatch(line_of(m.start()), " ".join(m.group(0).split()), why,
                            "interval"))
    spread = [c for n in section.scope for c in spreads(by_name[n])]
    for m in SPREAD.finditer(chunk):
      why = _spread_mismatch(m, spread)
      if why:
        out.append(Mismatch(line_of(m.start()), " ".join(m.group(0).split()), why, "spread"))
    if all(by_name[n].claims for n in section.scope):
      out += _label_mismatches(chunk, line_of, section, by_name, set(by_name) | {
          n.rsplit("/", 1)[-1] for n in by_name})
  return sorted(out, key=lambda m: m.line)


def check_page(page: str | pathlib.Path) -> tuple[list[Mismatch], list[str]]:
  """The page's mismatches (its summary not the generated one among them)
  and the sections not label-checked (``unlabelled``). ResultsError where it
  has no summary block or no report has claims."""
  page = pathlib.Path(page)
  text = page.read_text()
  directory = results_doc.results_dir(page)
  if not directory.is_dir():
    raise ResultsError(f"no reports' directory {directory} beside {page}.")
  found = results_doc.committed(directory)
  out = check(text, found)
  if results_doc.regenerate(text, found) != text:
    line = text[:text.index(results_doc.BEGIN)].count("\n") + 1
    out.insert(0, Mismatch(line, "the summary", "not the one the reports give: regenerate it "
                           f"({results_doc.COMMAND})", "page"))
  return out, unlabelled(text, found)
