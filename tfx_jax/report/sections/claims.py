"""The report's section "Claims": each claim the sweep declares, its test and
its label by the one rule of ``report.claims``, Holm over all of them.

It reads the finished report (``results(ctx, report)``), so it computes
after the other sections: its numbers are report.json's ``claims``, written
by ``assemble.report_json``. ``markdown_lines`` renders them from those
numbers alone, which is how a committed report is relabelled
(``python -m tfx_jax.report DIR --relabel EXPERIMENT``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import claims as claims_lib
from tfx_jax.report.claims import ClaimResult
from tfx_jax.report.context import Context
from tfx_jax.report.schema import Report
from tfx_jax.report.tables import Lines, markdown_table

BEGIN, END = "<!-- claims -->", "<!-- /claims -->"


def results(ctx: Context, report: Report) -> tuple[ClaimResult, ...]:
  """Every declared claim's test and label (none: the sweep declares none)."""
  if not ctx.record.claims:
    return ()
  return ctx.once("claims", lambda: claims_lib.evaluate(
      ctx.record.claims, report, design_tokens(ctx.record)))


def design_tokens(record: SweepRecord) -> dict[tuple[int, ...], float]:
  """{point key: training tokens of one of its runs} (steps x batch x
  sequence length), where a claim's regime reads tokens per parameter."""
  if not any(c.regime is not None and c.regime.tokens_per_param for c in record.claims):
    return {}
  # Deferred: config loading reads the config files (not needed otherwise).
  from tfx_jax.run.config_base import (  # pylint: disable=import-outside-toplevel
      apply_overrides, load_config_file)
  out = {}
  for entry in record.runs:
    key = record.point_key(entry)
    if key in out:
      continue
    config = load_config_file(record.config)
    apply_overrides(config, entry.overrides)
    train = config.train
    out[key] = float(train.num_steps * train.batch_size * train.seq_len)
  return out


def _interval(row: ClaimResult) -> str:
  if row.estimate is None:
    return row.descriptive or "-"
  ratio = claims_lib.log_ratio(row.metric)
  if ratio:
    import math  # pylint: disable=import-outside-toplevel
    text = f"{math.exp(row.estimate):.3f}x"
    if row.low is not None:
      text += f" [{math.exp(row.low):.3f}, {math.exp(row.high):.3f}]{_level(row)}"
    return text + " (ratio)"
  text = _number(row.estimate)
  if row.low is not None:
    text += f" [{_number(row.low)}, {_number(row.high)}]{_level(row)}"
  return text


def _level(row: ClaimResult) -> str:
  """The interval's level where it is not 95% (a look of adaptive seeds)."""
  return "" if row.level is None or abs(row.level - 0.95) < 1e-9 else f" ({row.level:.1%})"


def _number(x: float) -> str:
  """A signed difference, 3 decimals (1 from 100 up), rounded once from the full value."""
  return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"


def _p(value: float | None) -> str:
  return "-" if value is None else f"{value:.4g}"


def markdown_lines(rows: Sequence[ClaimResult], relabelled: bool = False) -> Lines:
  """The section's markdown from report.json's ``claims`` alone, between
  markers so that a relabelled report.md replaces it whole. ``relabelled``:
  the sections below were written before the claims were declared, and say
  so."""
  if not rows:
    return []
  family = rows[0].family
  table = [["claim", "source", "compares", "metric", "expects", "estimate [interval]",
            "p (Holm)", "label"]]
  for row in rows:
    compares = row.point_a if row.point_b is None else f"{row.point_a} vs {row.point_b}"
    label = f"*{row.label}*" + (" (outside the paper's regime)" if row.outside_regime else "")
    # The test the label rests on: TOST where equivalence was found or expected
    # and the difference not resolved, else the difference.
    equivalence = row.expect.startswith("equivalent") or row.reason.startswith("equivalent")
    resolved = row.p_adjusted is not None and row.p_adjusted < 0.05
    p = _p(row.p_equivalence_adjusted if equivalence and not resolved else row.p_adjusted)
    table.append([f"`{row.id}`: {row.statement}", row.source, compares, f"`{row.metric}`",
                  row.expect, _interval(row), p, label])
  out = [BEGIN, "## Claims", "",
         f"The claims this sweep tests, {family} tested: the report's one confirmatory "
         "family, Holm-adjusted over all of them whatever test each needs. Each label "
         "comes from one rule (`tfx_jax/report/claims.py`): a difference claim is "
         "*reproduced* when resolved in the paper's direction, *not reproduced* when "
         "resolved against it or equivalent within its band, else *in direction* or "
         "*inconclusive* by the estimate's side; an equivalence claim is *reproduced* "
         "when equivalent (TOST), *not reproduced* when resolved different outside the "
         "band. *not tested here*: the design could not show it (the reason below). "
         "Everything else in this report is exploratory: not labelled."
         + (" The sections below were written before the claims were declared "
            "(`python -m tfx_jax.sweep EXPERIMENT --relabel REPORT_DIR`): their verdicts are Holm-adjusted over "
            "the report's own comparisons, which makes them no less strict, and they "
            "label nothing." if relabelled else " Its p-values are unadjusted."), "",
         markdown_table(table), ""]
  for row in rows:
    notes = [row.reason, row.design]
    if row.outside_regime:
      notes.append(row.outside_regime)
    if row.descriptive and row.estimate is None:
      notes.append(f"descriptive only: {row.descriptive}")
    out.append(f"- `{row.id}` ({row.label}): " + "; ".join(n for n in notes if n) + ".")
  return out + ["", END, ""]


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  return markdown_lines(results(ctx, report))


def replace_block(text: str, lines: Lines) -> str:
  """report.md ``text`` with its claims block replaced by ``lines`` (inserted
  after the title and description where it has none)."""
  block = "\n".join(lines)
  if BEGIN in text and END in text:
    head, rest = text.split(BEGIN, 1)
    return head + block.rstrip("\n") + rest.split(END, 1)[1]
  parts = text.split("\n## ", 1)
  if len(parts) == 1:
    return text.rstrip("\n") + "\n\n" + block
  return parts[0].rstrip("\n") + "\n\n" + block + "\n## " + parts[1]
