"""``docs/results.md`` from the committed reports: its Summary table.

The page is written by hand except its summary, which is generated
(``python -m tfx_jax.report --results docs/results.md``) between the markers
``<!-- summary -->`` and ``<!-- /summary -->`` from every committed
``docs/results/**/report.json`` with ``claims`` (``report.claims.ClaimResult``):
one row per claim, its label as the one rule gave it, its numbers rounded
once from the full values in report.json. Everything outside the markers is
left byte for byte; a report without claims (not yet relabelled,
``python -m tfx_jax.sweep EXPERIMENT --relabel DIR``) has no rows, and the
line under the table names it.

The page's structure, which the prose check (``results_check``) reads too:
each ``## `name`: ...`` heading opens the section of the experiment whose
report is ``docs/results/<name>/report.json``; its text may quote that
report and its variants' (``docs/results/<name>/<variant>/``), and a
``### ... (`variant`)`` heading narrows what follows to that variant's
report (``(`default`)``: the experiment's own) until the next heading.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
from typing import Sequence

from tfx_jax.records import serial
from tfx_jax.report import claims as claims_lib
from tfx_jax.report.claims import LABELS, ClaimResult
from tfx_jax.report.schema import FILENAME, Report
from tfx_jax.report.tables import Lines, markdown_table

BEGIN, END = "<!-- summary -->", "<!-- /summary -->"
COMMAND = "python -m tfx_jax.report --results docs/results.md"
DEFAULT_VARIANT = "default"  # a ### heading's name for the experiment's own report


class ResultsError(ValueError):
  """The page or its reports cannot give a summary (no markers, no claims)."""


@dataclasses.dataclass(frozen=True)
class Committed:
  """One committed report.json."""
  name: str            # its directory under docs/results ("stability/high_rate")
  path: pathlib.Path   # the report.json
  report: Report
  claims: tuple[ClaimResult, ...]  # report.json's ``claims`` (none: not relabelled)


def results_dir(doc: str | pathlib.Path) -> pathlib.Path:
  """The reports' directory beside the page: docs/results.md -> docs/results."""
  return pathlib.Path(doc).with_suffix("")


def committed(directory: str | pathlib.Path) -> list[Committed]:
  """Every report.json under ``directory``, by name."""
  directory = pathlib.Path(directory)
  out = []
  for path in sorted(directory.rglob(FILENAME)):
    data = json.loads(path.read_text())
    where = str(path)
    claims = tuple(serial.from_json(ClaimResult, row, where) for row in data.get("claims", ()))
    out.append(Committed(path.parent.relative_to(directory).as_posix(), path,
                         serial.from_json(Report, data, where), claims))
  return sorted(out, key=lambda c: c.name)


# ------------------------------------------------------------------ sections
@dataclasses.dataclass(frozen=True)
class Section:
  """A stretch of the page under one heading, and the reports it may quote."""
  heading: str             # the heading line
  first: int               # its line number (1-based)
  last: int                # the line before the next heading (or the end)
  experiment: str | None   # the ## heading's backticked name (None: no experiment)
  scope: tuple[str, ...]   # the reports' names its text may quote


_HEADING = re.compile(r"^(#{2,6}) +(.*)$")
_NAME = re.compile(r"`([^`]+)`")


def sections(text: str, names: Sequence[str]) -> list[Section]:
  """The page's sections (``##`` and deeper headings outside code blocks),
  each with the reports its text may quote (see the module docstring)."""
  lines = text.split("\n")
  heads = []  # (index, level, title)
  fenced = False
  for i, line in enumerate(lines):
    if line.lstrip().startswith("```"):
      fenced = not fenced
    found = None if fenced else _HEADING.match(line)
    if found:
      heads.append((i, len(found.group(1)), found.group(2)))
  out, experiment, whole = [], None, ()
  for n, (i, level, title) in enumerate(heads):
    last = heads[n + 1][0] if n + 1 < len(heads) else len(lines)
    named = _NAME.findall(title)
    if level == 2:
      experiment = named[0] if named and title.startswith("`") else None
      whole = () if experiment is None else tuple(
          m for m in names if m == experiment or m.startswith(experiment + "/"))
      scope = whole
    else:
      variants = [f"{experiment}/{v}" for v in named if f"{experiment}/{v}" in names]
      default = experiment is not None and DEFAULT_VARIANT in named and experiment in names
      scope = (variants[0],) if variants else (experiment,) if default else whole
    out.append(Section(lines[i], i + 1, last, experiment, scope))
  return out


def order(text: str, found: Sequence[Committed]) -> list[Committed]:
  """``found`` in the order the page's sections name them, then the rest by name."""
  names = [c.name for c in found]
  seen: list[str] = []
  for section in sections(text, names):
    seen += [n for n in section.scope if n not in seen]
  rank = {n: i for i, n in enumerate(seen)}
  return sorted(found, key=lambda c: (rank.get(c.name, len(rank)), c.name))


# ------------------------------------------------------------------- numbers
def number(x: float, ratio: bool) -> str:
  """One number of a claim, rounded once from the full value: a log ratio as
  the ratio exp(x) with 3 decimals, any other difference signed with 3."""
  return f"{math.exp(x):.3f}" if ratio else f"{x:+.3f}"


def estimate_text(row: ClaimResult) -> str:
  """The estimate with its interval (``0.902x [0.894, 0.910]``; ``+0.083
  [+0.069, +0.096]``), or the untested claim's reason and description."""
  if row.estimate is None:
    text = f"no test: {row.reason}"
    return text + (f"; descriptive: {row.descriptive}" if row.descriptive else "")
  ratio = claims_lib.log_ratio(row.metric)
  text = number(row.estimate, ratio) + ("x" if ratio else "")
  if row.low is not None and row.high is not None:
    level = "" if row.level in (None, 0.95) else f" ({100 * row.level:.3g}%)"
    text += f" [{number(row.low, ratio)}, {number(row.high, ratio)}]{level}"
  return text


def p_text(row: ClaimResult) -> str:
  """The adjusted p's the label read: the difference's, and TOST's for an
  equivalence claim or a difference claim labelled by equivalence."""
  equivalence = row.expect.startswith("equivalent") or row.reason.startswith("equivalent")
  out = [] if row.p_adjusted is None else [f"p (Holm) {row.p_adjusted:.4g}"]
  if equivalence and row.p_equivalence_adjusted is not None:
    out.append(f"TOST p (Holm) {row.p_equivalence_adjusted:.4g}")
  return "; ".join(out)


def key_numbers(row: ClaimResult) -> str:
  parts = [estimate_text(row)]
  if row.estimate is not None:
    parts += [p_text(row), f"{row.seeds} seeds"]
  return "; ".join(p for p in parts if p)


def label_text(row: ClaimResult) -> str:
  return f"*{row.label}*" + (" (outside the paper's regime)" if row.outside_regime else "")


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------- summary
def summary_lines(found: Sequence[Committed]) -> Lines:
  """The block between the markers: the table of every claim of ``found``
  (in that order), the counts of the labels that count, and the reports
  without claims."""
  labelled = [c for c in found if c.claims]
  if not labelled:
    raise ResultsError("no report.json with claims: relabel one "
                       "(python -m tfx_jax.sweep experiments/<name>.py --relabel "
                       "docs/results/<name>) or run its sweep; reports found: "
                       f"{[c.name for c in found] or 'none'}.")
  table = [["experiment", "claim", "source", "statement", "label",
            "key numbers: estimate [95% interval] (a ratio for x), adjusted p, seeds"]]
  for c in labelled:
    for row in c.claims:
      table.append([f"`{c.name}`", f"`{row.id}`", _cell(row.source), _cell(row.statement),
                    label_text(row), _cell(key_numbers(row))])
  out = [BEGIN, markdown_table(table), "",
         "Claims counted by label (not *not tested here*, not outside the paper's regime), "
         "by experiment:", ""]
  for name in LABELS:
    if name != "not tested here":
      out.append(f"- *{name}*: " + _count(
          {c.name: sum(r.counts and r.label == name for r in c.claims) for c in labelled}))
  out.append("- not counted: " + _count(
      {c.name: sum(not r.counts for r in c.claims) for c in labelled})
      + " (*not tested here*, or outside the paper's regime)")
  absent = [c.name for c in found if not c.claims]
  out += ["", f"Generated by `{COMMAND}` from each committed report.json's claims."
          + (" Reports without claims (not yet relabelled), absent from the table until "
             f"they are: {', '.join(f'`{n}`' for n in absent)}." if absent else ""), END]
  return out


def _count(per: dict[str, int]) -> str:
  """``3 (`a` 2, `b` 1)``: the total and each experiment's share of it."""
  shares = ", ".join(f"`{name}` {n}" for name, n in per.items() if n)
  return f"{sum(per.values())}" + (f" ({shares})" if shares else "")


def regenerate(text: str, found: Sequence[Committed]) -> str:
  """The page ``text`` with its summary block replaced (ResultsError where
  it has no single pair of markers or no report has claims)."""
  if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
    raise ResultsError(f"the page has no summary block: put one line {BEGIN} before the "
                       f"Summary table and one line {END} after it (found {text.count(BEGIN)} "
                       f"and {text.count(END)}).")
  head, rest = text.split(BEGIN, 1)
  tail = rest.split(END, 1)[1]
  return head + "\n".join(summary_lines(order(text, found))) + tail


def write(doc: str | pathlib.Path) -> tuple[list[Committed], bool]:
  """Regenerates ``doc``'s summary from the reports beside it; returns the
  reports read and whether the file changed. Nothing is written on a
  ResultsError (or a missing file: FileNotFoundError)."""
  doc = pathlib.Path(doc)
  text = doc.read_text()
  directory = results_dir(doc)
  if not directory.is_dir():
    raise ResultsError(f"no reports' directory {directory} beside {doc}.")
  found = committed(directory)
  new = regenerate(text, found)
  if new != text:
    doc.write_text(new)
  return found, new != text
