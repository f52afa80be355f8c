"""The report's section "Length extrapolation": perplexity at k x the training
length (``python -m tfx_jax.evaluate --lengths``), per point and per way of
evaluating its positions (as trained, or RoPE scaled at evaluation), and its
plot. Read from the runs' summaries: report.json keeps each run's
``lengths`` only."""

from __future__ import annotations

from typing import Mapping

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report.context import Context
from tfx_jax.report.points import Points, at_chosen
from tfx_jax.report.schema import Report
from tfx_jax.report.tables import Lines, markdown_table, pm, point_cells, shown_seeds


def lengths_table(record: SweepRecord, points: Points) -> list[list[str]] | None:
  multiples = sorted({k for runs in points.values() for _, s in runs for k in s.lengths})
  if not multiples:
    return None
  scaled = any(s.scaled_lengths for runs in points.values() for _, s in runs)
  rows = [[a.label for a in record.axes] + (["positions at evaluation"] if scaled else [])
          + [f"{k}x" for k in multiples]]
  for key, runs in points.items():
    labels = point_cells(record, key)
    for scaling, table in [("", lambda s: s.lengths)] + [
        (tag, lambda s, tag=tag: s.scaled_lengths.get(tag, {}))
        for tag in sorted({t for _, s in runs for t in s.scaled_lengths})]:
      cells = []
      for k in multiples:
        vals = [table(s)[k] for _, s in runs if table(s).get(k) is not None]
        cells.append(pm(vals, 2) if vals else "n/a")
      # RoPE runs evaluated with scaled positions: a row each, e.g. "yarn-x8-from64".
      how = [scaling.removeprefix("rope-") if scaling else "as trained"] if scaled else []
      rows.append(labels + how + cells)
  return rows



def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Perplexity at k x the training length (``evaluate --lengths``)."""
  record, points = ctx.record, ctx.groups
  lengths = lengths_table(record, at_chosen(points, report.chosen()))
  if not lengths:
    return []
  splits = sorted({s.lengths_split or "validation"
                   for runs in points.values() for _, s in runs if s.lengths})
  out = ["## Length extrapolation", "",
         f"Perplexity on the {' / '.join(splits)} split in non-overlapping windows "
         "of k × the training length (`python -m tfx_jax.evaluate --lengths`), mean ± "
         f"std over {shown_seeds(record)}.", "",
         markdown_table(lengths), ""]
  if plots.get("lengths"):
    out += [f"![length extrapolation]({plots['lengths']})", ""]
  return out


def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """Perplexity against the length multiple."""
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  if plots_lib.lengths_plot(sweep_dir / "lengths.png", ctx.record,
                            at_chosen(ctx.groups, report.chosen()), palette):
    return {"lengths": "lengths.png"}
  return {}
