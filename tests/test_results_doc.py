"""docs/results.md against the report.json files it quotes.

Every experiment reported with the current method has a section ``## `<name>`:
...`` before "## Earlier runs" and a row in the summary table, and takes its
numbers from ``docs/results/<name>/report.json``, or from its variants'
(``docs/results/<name>/<variant>/report.json``). Each estimate with its
interval written there, ``-0.072 [-0.109, -0.036]`` or ``2.78x [2.19, 3.53]``,
must be one record's estimate and interval in that report.json, to the digits
printed: a number edited by hand, or left from an earlier run, fails here.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results.md"
NUMBER = r"[+\-−]?\d+(?:\.\d+)?"
# An estimate, optionally a factor ("x"), then its interval.
INTERVAL = re.compile(rf"({NUMBER})x? \[({NUMBER}), ({NUMBER})\]")


def _sections(text: str) -> dict[str, str]:
  """{experiment: its section's text} for the sections before "Earlier runs"."""
  current = text.split("\n## Earlier runs", 1)[0]
  parts = re.split(r"^## `(\w+)`.*$", current, flags=re.M)
  return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _summary_rows(text: str) -> dict[str, str]:
  """{experiment: its row} of the first table under "## Summary"."""
  summary = text.split("\n## Summary", 1)[1].split("\n## ", 1)[0]
  table = summary.split("\n\n| experiment")[1].split("\n\n", 1)[0]
  rows = {}
  for line in table.splitlines():
    m = re.match(r"\| `(\w+)` \|", line)
    if m:
      rows[m.group(1)] = line
  return rows


def _groups(data) -> list[list[float]]:
  """The numbers of each record of a report.json: a dict's own numbers and
  those of the dicts directly inside it (an interval kept as a sub-record)."""
  groups = []

  def numbers(d: dict) -> list[float]:
    return [float(v) for v in d.values()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]

  def walk(node):
    if isinstance(node, dict):
      group = numbers(node)
      for v in node.values():
        if isinstance(v, dict):
          group += numbers(v)
      groups.append(group)
      for v in node.values():
        walk(v)
    elif isinstance(node, list):
      for v in node:
        walk(v)

  walk(data)
  return groups


def _matches(printed: str, value: float) -> bool:
  printed = printed.replace("−", "-")
  decimals = len(printed.split(".")[1]) if "." in printed else 0
  return abs(value - float(printed)) <= 0.5 * 10 ** -decimals + 1e-9


def _found(triple: tuple[str, str, str], groups: list[list[float]]) -> bool:
  return any(all(any(_matches(p, v) for v in group) for p in triple) for group in groups)


def test_the_interval_matching_tells_a_changed_digit():
  groups = _groups({"comparisons": [{"diff": -0.0722, "low": -0.1090, "high": -0.0357}],
                    "speedups": [{"speedup": 2.781, "interval": {"low": 2.1896, "high": 3.533}}]})
  assert _found(("-0.072", "-0.109", "-0.036"), groups)
  assert _found(("2.78", "2.19", "3.53"), groups)
  assert not _found(("-0.072", "-0.109", "-0.035"), groups)
  assert not _found(("-0.073", "-0.109", "-0.036"), groups)
  # The three numbers must come from one record.
  assert not _found(("-0.072", "2.19", "3.53"), groups)


TEXT = RESULTS.read_text()
SECTIONS = _sections(TEXT)


def _reports(name: str) -> list[pathlib.Path]:
  """An experiment's report.json files: its own and its variants'."""
  folder = ROOT / "docs" / "results" / name
  return sorted([*folder.glob("report.json"), *folder.glob("*/report.json")])


def test_every_current_section_has_a_summary_row_and_its_report():
  rows = _summary_rows(TEXT)
  assert SECTIONS, "no experiment section before 'Earlier runs'"
  assert set(rows) == set(SECTIONS), (sorted(rows), sorted(SECTIONS))
  for name, section in SECTIONS.items():
    reports = _reports(name)
    assert reports, f"{name}: no docs/results/{name}/report.json"
    for path in reports:
      relative = path.relative_to(ROOT / "docs").as_posix()
      assert path.with_suffix(".md").exists(), relative
      assert f"({relative})" in section, f"{name}: {relative} not linked"
      data = json.loads(path.read_text())
      assert data["selection_biased"] is False, (
          f"{relative}: its verdicts read the seeds that chose its values")
    label = re.search(r"\*(reproduced|in direction|not reproduced|inconclusive|"
                      r"not tested here)\*", rows[name])
    assert label, f"{name}: its summary row has no label of the rule"


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_interval_quoted_is_in_the_report_json(name):
  groups = [g for path in _reports(name) for g in _groups(json.loads(path.read_text()))]
  text = SECTIONS[name] + "\n" + _summary_rows(TEXT)[name]
  quoted = INTERVAL.findall(text)
  assert quoted, f"{name}: no estimate with its interval"
  missing = [t for t in quoted if not _found(t, groups)]
  assert not missing, f"{name}: not in its report.json files: {missing}"
