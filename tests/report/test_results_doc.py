"""docs/results.md against the committed reports (``report/results_doc.py``,
``report/results_check.py``).

On the committed page: its summary is the one ``python -m tfx_jax.report
--results docs/results.md`` generates from docs/results/**/report.json;
every ``## `<experiment>`: ...`` section links its reports (its own and its
variants', none selection-biased); and (once every experiment section's
reports carry claims) every label and interval its prose quotes is
report.json's. On planted reports and pages:
the summary's rows, rounding and counts, the page outside the markers kept
byte for byte, bad input refused with nothing written, and the checker
finding a wrong label, an unnamed label, an unknown claim, a double-rounded
interval (4.72545 quoted as 4.726 fails, 4.725 passes) and mean ± std, each
at its line.
"""

from __future__ import annotations

import json
import math
import pathlib
import textwrap
from typing import Sequence

import pytest

from tfx_jax.records import serial
from tfx_jax.records.speedup import Interval as SpeedupInterval
from tfx_jax.records.speedup import Speedup
from tfx_jax.report import claims_transfer
from tfx_jax.report import results_check, results_doc, schema, stats
from tfx_jax.report.__main__ import main
from tfx_jax.report.claims import ClaimResult

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results.md"


# ------------------------------------------------------------ committed page
def test_committed_summary_is_the_generated_one():
  found = results_doc.committed(results_doc.results_dir(PAGE))
  text = PAGE.read_text()
  assert results_doc.regenerate(text, found) == text, (
      f"docs/results.md's summary is stale: run {results_doc.COMMAND}")


def test_committed_intervals_are_their_reports():
  # An interval reads no claim: every section's are checked now.
  found = results_doc.committed(results_doc.results_dir(PAGE))
  mismatches = [m for m in results_check.check(PAGE.read_text(), found)
                if m.kind in ("interval", "page")]
  assert not mismatches, "docs/results.md:\n" + "\n".join(map(str, mismatches))


def test_committed_labels_and_spreads_are_their_reports():
  found = results_doc.committed(results_doc.results_dir(PAGE))
  text = PAGE.read_text()
  waiting = results_check.unlabelled(text, found)
  if waiting:
    pytest.skip("the prose's labels and means ± std are checked once every section's "
                "experiment has claims (the prose is rewritten from them then); sections "
                "without: " + "; ".join(waiting))
  mismatches = [m for m in results_check.check(text, found) if m.kind in ("label", "spread")]
  assert not mismatches, "docs/results.md:\n" + "\n".join(map(str, mismatches))


def test_every_experiment_section_links_its_reports():
  found = {c.name: c for c in results_doc.committed(results_doc.results_dir(PAGE))}
  text = PAGE.read_text()
  lines = text.split("\n")
  tops = [s for s in results_doc.sections(text, list(found)) if not s.heading.startswith("###")]
  experiments = [s for s in tops if s.experiment is not None]
  assert experiments, "no ## `<experiment>`: ... section"
  for section, following in zip(tops, [*tops[1:], None]):
    if section.experiment is None:
      continue
    assert section.scope, f"{section.heading}: no docs/results/{section.experiment}/report.json"
    body = "\n".join(lines[section.first:following.first - 1 if following else len(lines)])
    for name in section.scope:
      relative = f"results/{name}/report.json"
      assert (PAGE.parent / relative).with_suffix(".md").exists(), relative
      assert f"({relative})" in body, f"{section.heading}: {relative} not linked"
      # A claim may rest on the seeds that chose the values only where it reads
      # the whole tuning curve, every tuned value alike (the optimum's shift,
      # every rate, the sensitivity), not the comparisons at the chosen ones.
      at_chosen = [c.id for c in found[name].claims
                   if not (claims_transfer.handles(c.metric) or c.metric == "sensitivity")]
      assert not (found[name].report.selection_biased and at_chosen), (
          f"{relative}: its claims {at_chosen} read the seeds that chose its values")


# ----------------------------------------------------------------- planting
def claim(id_: str, label: str = "reproduced", estimate: float | None = -0.1,
          low: float | None = -0.2, high: float | None = -0.05, **fields) -> ClaimResult:
  values = dict(
      id=id_, source="Someone et al. 2020", statement=f"the {id_} claim", metric="eval/loss",
      expect="lower", point_a="a", point_b="b", label=label, reason="resolved lower",
      estimate=estimate, low=low, high=high, level=0.95, band=0.01, seeds=4, p=0.001,
      p_adjusted=0.004, p_equivalence=0.9, p_equivalence_adjusted=1.0, family=3,
      design="4 seeds, paired by seed; Holm over the 3 claims of this report")
  values.update(fields)
  return ClaimResult(**values)


def comparison(value: str, diff: float, low: float, high: float) -> schema.Comparison:
  counts = schema.Counts(learned=4)
  return schema.Comparison(
      axis="model.x", axis_index=0, value=value, value_index=1, base_index=0,
      base_value="base", context="-", context_key=(None,), metric="eval/loss", split="test",
      seeds=(1, 2, 3, 4), base_seeds=(1, 2, 3, 4),
      interval=stats.Interval(diff, low, high, 3.0, 0.01, 0.01, "paired", 4, 4, 0.95),
      margin=0.01, chosen=None, base_chosen=None, counts=counts, base_counts=counts,
      p_adjusted=0.02, verdict="worse", seeds_needed=None, text=f"{value} vs base")


def speedup(value: float, low: float, high: float, low_beyond: bool = False) -> Speedup:
  return Speedup(context="-", point={"optim.name": "lion"}, optimizer="lion", steps=400,
                 metric="eval/loss", split="test", seeds=(1, 2, 3), loss=4.0,
                 reference_steps=(200, 400), reference_losses=(4.5, 4.0),
                 reference_steps_to_reach=250.0, speedup=value,
                 interval=SpeedupInterval(low, high, low_beyond, False, 0.1, 3))


def point(losses: Sequence[float]) -> schema.Point:
  """A point whose confirmation runs end at test loss ``losses``."""
  runs = {seed: schema.SeedResult(run=f"r{seed}", outcome="learned", validation={},
                                  test={"eval/loss": loss}, lengths={}, num_params=1000)
          for seed, loss in enumerate(losses, start=1)}
  return schema.Point(key=(0,), values={"model.x": "a"}, chosen={}, chosen_label="",
                      chosen_at_edge={}, tuned=(), counts=schema.Counts(learned=len(runs)),
                      runs=len(runs), compared={}, num_params=1000, confirmation=runs)


def plant(root: pathlib.Path, name: str, claims=(), comparisons=(), speedups=(),
          points=()) -> None:
  """docs/results/<name>/report.json under ``root``, its claims as given
  (none: a report not yet relabelled)."""
  report = schema.Report(
      sweep=name, select_by="eval/loss", tune={}, report_split="test", reserved_seed=None,
      options=schema.Options(), baselines={}, points=tuple(points),
      comparisons=tuple(comparisons),
      failed=(), sensitivity=(), noise=(), scale=(), speedups=tuple(speedups))
  data = report.to_json()
  if claims:
    data["claims"] = serial.to_json(tuple(claims))
  path = root / "results" / name / "report.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(data))


HEAD = "# Results\n\nHand-written words.\n\n## Summary\n\nThe table:\n\n"
TAIL = "\n\nMore words, kept as they are.\n"


def page(root: pathlib.Path, body: str = "", summary: str = "| old | table |") -> pathlib.Path:
  path = root / "results.md"
  path.write_text(HEAD + f"{results_doc.BEGIN}\n{summary}\n{results_doc.END}" + TAIL
                  + textwrap.dedent(body))
  return path


def planted_reports(root: pathlib.Path) -> None:
  plant(root, "exp", claims=[
      claim("loss_lower", estimate=4.72545, low=4.55047, high=4.90001),
      claim("ratio_8x", metric="ppl@8x/1x", label="in direction", estimate=math.log(0.9),
            low=math.log(0.8), high=math.log(1.05), reason="unresolved, the estimate lower"),
      claim("level", label="not reproduced", expect="equivalent within +-0.5",
            reason="resolved different, outside +-0.5", outside_regime=(
                "outside the paper's regime: the paper 100M parameters; here 1M parameters")),
      claim("untested", label="not tested here", estimate=None, low=None, high=None,
            reason="one run per rate", descriptive="0.59 against 0.16", seeds=0, p=None,
            p_adjusted=None, p_equivalence=None, p_equivalence_adjusted=None)],
        comparisons=[comparison("x", 0.0832, 0.0691, 0.0963)],
        speedups=[speedup(0.6179, 0.5, 1.0557, low_beyond=True)],
        points=[point([4.70045, 4.75045])])
  plant(root, "exp/variant", claims=[claim("variant_claim", label="inconclusive",
                                          estimate=0.02, low=-0.01, high=0.05)])
  plant(root, "plain", comparisons=[comparison("y", -0.0211, -0.0334, -0.0084)])


# ------------------------------------------------------------------ summary
def test_summary_rows_rounded_once_and_counted(tmp_path):
  planted_reports(tmp_path)
  doc = page(tmp_path, "\n## `exp`: the experiment\n\nWords.\n")
  before = doc.read_text()
  assert main(["--results", str(doc)]) == 0
  text = doc.read_text()
  head, block = text.split(results_doc.BEGIN)
  block, tail = block.split(results_doc.END)
  # Outside the markers the page is as it was, byte for byte.
  assert head == before.split(results_doc.BEGIN)[0]
  assert tail == before.split(results_doc.END)[1]
  rows = [r for r in block.split("\n") if r.startswith("| `")]
  assert [r.split(" | ")[:2] for r in rows] == [
      ["| `exp`", "`loss_lower`"], ["| `exp`", "`ratio_8x`"], ["| `exp`", "`level`"],
      ["| `exp`", "`untested`"], ["| `exp/variant`", "`variant_claim`"]]
  # 4.72545 rounds once to 4.725 (not 4.7255 -> 4.726); 4.55047 to 4.550.
  assert "| *reproduced* | +4.725 [+4.550, +4.900]; p (Holm) 0.004; 4 seeds |" in rows[0]
  # A log ratio printed as the ratio, 3 decimals and an x.
  assert "| *in direction* | 0.900x [0.800, 1.050]; p (Holm) 0.004; 4 seeds |" in rows[1]
  assert "*not reproduced* (outside the paper's regime)" in rows[2]
  assert "TOST p (Holm) 1" in rows[2]
  assert "no test: one run per rate; descriptive: 0.59 against 0.16" in rows[3]
  # Counted: neither the untested claim nor the one outside the regime.
  assert "- *reproduced*: 1 (`exp` 1)" in block
  assert "- *in direction*: 1 (`exp` 1)" in block
  assert "- *inconclusive*: 1 (`exp/variant` 1)" in block
  assert "- *not reproduced*: 0\n" in block
  assert "- not counted: 2 (`exp` 2)" in block
  assert "absent from the table until they are: `plain`." in block
  # Regenerating again changes nothing.
  assert main(["--results", str(doc)]) == 0
  assert doc.read_text() == text


def test_summary_follows_the_page_order(tmp_path):
  planted_reports(tmp_path)
  plant(tmp_path, "alpha", claims=[claim("first")])
  doc = page(tmp_path, "\n## `exp`: one\n\n## `alpha`: two\n")
  main(["--results", str(doc)])
  rows = [r.split(" | ")[0] for r in doc.read_text().split("\n") if r.startswith("| `")]
  assert rows == ["| `exp`"] * 4 + ["| `exp/variant`", "| `alpha`"]


def test_bad_input_writes_nothing(tmp_path, capsys):
  planted_reports(tmp_path)
  doc = tmp_path / "results.md"
  doc.write_text("# Results\n\n| a table | without markers |\n")
  assert main(["--results", str(doc)]) == 2
  assert "<!-- summary -->" in capsys.readouterr().err
  assert doc.read_text() == "# Results\n\n| a table | without markers |\n"

  bare = tmp_path / "bare"
  plant(bare, "plain", comparisons=[comparison("y", -0.02, -0.03, -0.01)])
  doc = page(bare)
  before = doc.read_text()
  assert main(["--results", str(doc)]) == 2
  err = capsys.readouterr().err
  assert "no report.json with claims" in err and "plain" in err
  assert doc.read_text() == before
  assert main(["--results", str(doc), "--check"]) == 2
  assert main(["--results", str(tmp_path / "missing.md")]) == 2
  # The sweep directory is optional only with --results.
  assert main([]) == 2
  assert main(["--check", str(tmp_path)]) == 2
  assert main(["--results", str(doc), str(tmp_path)]) == 2


# ------------------------------------------------------------------- checker
def checked(tmp_path, body: str) -> list[results_check.Mismatch]:
  planted_reports(tmp_path)
  doc = page(tmp_path, body)
  main(["--results", str(doc)])
  mismatches, _ = results_check.check_page(doc)
  return mismatches


def line_of(doc_text: str, needle: str) -> int:
  """The line number of the first line after the summary block with ``needle``."""
  lines = doc_text.split("\n")
  start = lines.index(results_doc.END)
  return next(i for i, line in enumerate(lines) if i > start and needle in line) + 1


def test_labels_against_report_json(tmp_path):
  body = """
  ## `exp`: the experiment

  Right: `loss_lower` *reproduced*, and `ratio_8x` at 8x *in direction*.
  Wrong: `loss_lower` is *in direction* here. Both `level` and `ratio_8x`
  are *inconclusive*.

  | claim | label |
  |---|---|
  | `untested` | *not tested here* |
  | `loss_lower` | *inconclusive* |
  | `nonexistent_claim` | *reproduced* |

  A report's name is no claim: `variant` at 1e-1 *in direction*.
  A bare *reproduced* names nothing. `loss_lower` has no label in this
  sentence. *reproduced* is not its label either.

  ### The variant (`variant`)

  `variant_claim` *inconclusive*; `loss_lower` *reproduced* is not the
  variant's claim.

  ## `plain`: no claims yet

  `whatever` *reproduced*, not checked: the report has no claims.
  """
  mismatches = checked(tmp_path, body)
  text = (tmp_path / "results.md").read_text()
  found = sorted((m.line, m.quoted) for m in mismatches)
  assert found == sorted([
      (line_of(text, "Wrong:"), "`loss_lower` *in direction*"),
      (line_of(text, "Wrong:"), "`level` *inconclusive*"),
      (line_of(text, "Wrong:"), "`ratio_8x` *inconclusive*"),
      (line_of(text, "| `loss_lower` |"), "`loss_lower` *inconclusive*"),
      (line_of(text, "`nonexistent_claim`"), "`nonexistent_claim` *reproduced*"),
      (line_of(text, "A report's name"), "*in direction*"),
      (line_of(text, "A bare"), "*reproduced*"),
      (line_of(text, "is not its label"), "*reproduced*"),
      (line_of(text, "is not the"), "`loss_lower` *reproduced*"),
  ]), "\n".join(map(str, mismatches))
  assert {m.kind for m in mismatches} == {"label"}
  wrong = next(m for m in mismatches if m.quoted == "`loss_lower` *in direction*")
  assert "exp *reproduced*" in wrong.why


def test_intervals_rounded_once(tmp_path):
  body = """
  ## `exp`: the experiment

  Once: +4.725 [+4.550, +4.900], as a ratio 0.900x [0.800, 1.050], the
  comparison +0.083 [+0.069,
  +0.096] across a line, the speedup 0.62x [<0.50, 1.06], the log ratio
  -0.105 [-0.223, +0.049], at fewer decimals +4.73 [+4.6, +4.9].

  Twice: 4.726 [4.550, 4.900].
  Not a ratio: 0.900 [0.800, 1.050] is fine, 0.90x [0.80, 1.0500] too, but
  not -0.105x [-0.223, +0.049].
  Not a bound: 0.62x [0.50, 1.06]. Not there: +0.021 [+0.033, +0.008].

  ```
  +9.999 [+9.000, +9.500] in a code block is not read
  ```

  ### The variant (`variant`)

  +0.020 [-0.010, +0.050] is the variant's; +0.083 [+0.069, +0.096] is not.

  ## `plain`: no claims yet

  -0.021 [-0.033, -0.008] is checked without claims, -0.022 [-0.033, -0.008] too.
  """
  mismatches = checked(tmp_path, body)
  text = (tmp_path / "results.md").read_text()
  found = sorted((m.line, m.quoted) for m in mismatches)
  assert found == sorted([
      (line_of(text, "Twice:"), "4.726 [4.550, 4.900]"),
      (line_of(text, "not -0.105x"), "-0.105x [-0.223, +0.049]"),
      (line_of(text, "Not a bound"), "0.62x [0.50, 1.06]"),
      (line_of(text, "Not a bound"), "+0.021 [+0.033, +0.008]"),
      (line_of(text, "is the variant's"), "+0.083 [+0.069, +0.096]"),
      (line_of(text, "too."), "-0.022 [-0.033, -0.008]"),
  ]), "\n".join(map(str, mismatches))
  assert {m.kind for m in mismatches} == {"interval"}
  twice = next(m for m in mismatches if m.quoted.startswith("4.726"))
  assert "4.72545" in twice.why and "4.726 rounded twice" in twice.why


def test_means_and_spreads_rounded_once(tmp_path):
  body = """
  ## `exp`: the experiment

  Test loss 4.725 ± 0.035 over 2 seeds, 4.73 ± 0.04 at fewer decimals.
  Twice: 4.726 ± 0.035. Not there: 4.725 ± 0.050.
  """
  mismatches = checked(tmp_path, body)
  text = (tmp_path / "results.md").read_text()
  assert sorted((m.line, m.quoted, m.kind) for m in mismatches) == [
      (line_of(text, "Twice:"), "4.725 ± 0.050", "spread"),
      (line_of(text, "Twice:"), "4.726 ± 0.035", "spread")], "\n".join(map(str, mismatches))
  assert "4.726 rounded twice" in next(m.why for m in mismatches if "4.726" in m.quoted)


def test_check_command(tmp_path, capsys):
  planted_reports(tmp_path)
  doc = page(tmp_path, "\n## `exp`: one\n\n`loss_lower` *inconclusive*.\n")
  assert main(["--results", str(doc), "--check"]) == 1
  out = capsys.readouterr().out
  # The summary is the planted old table: stale; the label is wrong.
  assert f"{doc}:{HEAD.count(chr(10)) + 1}: the summary" in out
  assert "`loss_lower` *inconclusive*" in out
  assert "labels not checked" not in out
  main(["--results", str(doc)])
  before = doc.read_text()
  doc.write_text(before.replace("`loss_lower` *inconclusive*", "`loss_lower` *reproduced*"))
  assert main(["--results", str(doc), "--check"]) == 0
  assert "0 mismatches" in capsys.readouterr().out
