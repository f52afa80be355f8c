"""The report's headline figure, ``forest.png``: every comparison of
report.json as one row, one panel per compared metric (the selection metric
first).

Each row is a value against its base, the axis's base value or the second
value of a pair the sweep declares ("model.norm_position: post vs pre
(learning rate tuned, 3 paired seeds)"): the difference value − base
as a marker whose shape and colour say the verdict, its 95% interval (thin
whiskers: the test of a difference), its 90% interval (thick bar: the two
one-sided tests of equivalence, Schuirmann 1987, inside the band means
equivalent), each seed's own difference as a faint dot where the seeds are
paired, the zero line, and the equivalence band ±margin shaded.

``forest_panels`` returns what is drawn (pure, tested); ``forest_plot``
draws it.
"""

from __future__ import annotations

import dataclasses
import pathlib
import textwrap

from tfx_jax.report import stats
from tfx_jax.report import style
from tfx_jax.report.context import lower_is_better
from tfx_jax.report.schema import Comparison, Report
from tfx_jax.records.sweep import SweepRecord

# verdict -> (marker, colour, filled): distinct in shape and in colour.
VERDICT_STYLE = {
    "better": ("o", "#1a9850", True),
    "worse": ("s", "#d73027", True),
    "equivalent": ("D", "#4575b4", True),
    "unresolved": ("o", "#7f7f7f", False),
}
VERDICT_LEGEND = {
    "better": "better than its base (the value after \"vs\")",
    "worse": "worse than its base",
    "equivalent": "equivalent (equivalence-test interval inside the band)",
    "unresolved": "unresolved: the seeds cannot decide",
}
BAND_COLOUR = "#c6dbef"
LEGEND_INCHES = 0.55  # below the panels
PLOT_INCHES = 6.0     # the panels' own width; the labels' is added
CHAR_INCHES = 0.068   # one character of a 9-point label
LINE_INCHES = 0.16    # one line of a 9-point label, with its leading
ROW_INCHES = 0.5      # a row, at least
LABEL_CHARS = 60      # a row label's line
SEED_OFFSET = 0.28    # the seeds' dots sit just below their row


@dataclasses.dataclass(frozen=True)
class Row:
  """One comparison as drawn."""
  label: str                 # "model.norm_position: post vs pre (...)"
  diff: float                # value - base
  low: float | None          # 95% interval (None: fewer than two seeds a side)
  high: float | None
  tost_low: float | None     # 90% interval, the equivalence test's
  tost_high: float | None
  seed_diffs: tuple[float, ...]  # per-seed differences (paired rows only)
  verdict: str
  marker: str
  colour: str
  filled: bool
  numbers: str               # "-0.276 [-0.373, -0.180]"


@dataclasses.dataclass(frozen=True)
class Panel:
  """One metric's comparisons."""
  metric: str
  title: str
  xlabel: str
  margin: float
  lower_is_better: bool
  level: float       # of the thin interval (0.95)
  tost_level: float  # of the thick one: 1 - 2 alpha (0.90)
  rows: tuple[Row, ...]
  # Adaptive seeds: each row's intervals are at its look's levels, 1 - alpha w
  # and 1 - 2 alpha w (``stats_sequential.SequentialDesign``), not at ``level``.
  sequential: bool = False


def row_label(record: SweepRecord, comparison: Comparison) -> str:
  """``model.norm_position: post vs pre, position=rope (learning rate tuned,
  3 paired seeds)``."""
  c, iv = comparison, comparison.interval
  where = f", {c.context}" if c.context != "-" else ""
  kind = "confirmation seed" if record.confirm else "seed"
  if iv.low is None:
    seeds = (f"{iv.n_a} {kind}{'s' if iv.n_a != 1 else ''} a side, no interval"
             if iv.n_a == iv.n_b else f"{iv.n_a} vs {iv.n_b} {kind}s, no interval")
  elif iv.method == "paired":
    seeds = f"{iv.n_a} paired {kind}s"
  else:
    seeds = f"{iv.n_a} vs {iv.n_b} {kind}s, unpaired"
  if c.look is not None:
    seeds += f", look {c.look.look} of {c.look.looks}"
  tuned = ", ".join(style.tuned_name(f) for f in record.tune)
  how = f"{tuned} tuned, {seeds}" if tuned else seeds
  return f"{c.axis}: {c.value} vs {c.base_value}{where} ({how})"


def _seed_diffs(report: Report, c: Comparison) -> tuple[float, ...]:
  """Each shared seed's own difference value - base (paired rows; () else)."""
  if c.interval.method != "paired":
    return ()
  a = report.point(c.key_of(c.value_index)).compared
  b = report.point(c.base_key).compared
  return tuple(a[s][c.metric] - b[s][c.metric] for s in c.seeds if s in c.base_seeds)


def forest_panels(record: SweepRecord, report: Report) -> list[Panel]:
  """What ``forest_plot`` draws: one panel per metric (report order, the
  selection metric first), one row per comparison."""
  alpha = report.options.alpha
  split = report.report_split
  metrics: list[str] = []
  for c in report.comparisons:
    if c.metric not in metrics:
      metrics.append(c.metric)
  metrics.sort(key=lambda m: m != report.select_by)  # stable: the rest in order
  panels = []
  for metric in metrics:
    rows = []
    comparisons = [c for c in report.comparisons if c.metric == metric]
    for c in comparisons:
      iv = c.interval
      marker, colour, filled = VERDICT_STYLE[c.verdict]
      # The equivalence test's level: alpha, or the look's share of it.
      a = alpha * c.look.share if c.look is not None and c.look.share > 0 else alpha
      if iv.se is not None:
        half = stats.t_quantile(1.0 - a, iv.df) * iv.se if iv.se else 0.0
        tost = (iv.diff - half, iv.diff + half)
      else:
        tost = (None, None)
      numbers = (f"{iv.diff:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"
                 if iv.low is not None else f"{iv.diff:+.3f}")
      rows.append(Row(label=row_label(record, c), diff=iv.diff, low=iv.low,
                      high=iv.high, tost_low=tost[0], tost_high=tost[1],
                      seed_diffs=_seed_diffs(report, c), verdict=c.verdict,
                      marker=marker, colour=colour, filled=filled, numbers=numbers))
    name = style.metric_name(metric)
    panels.append(Panel(
        metric=metric,
        title=f"{metric}, {split} split",
        xlabel=style.with_unit(f"difference in {name}, value − base", metric),
        margin=comparisons[0].margin,
        lower_is_better=lower_is_better(metric),
        level=comparisons[0].interval.level, tost_level=1.0 - 2.0 * alpha,
        rows=tuple(rows), sequential=any(c.look is not None for c in comparisons)))
  return panels


def wrap(label: str) -> str:
  """A row label on two or more lines: what is compared, then how."""
  what, _, how = label.partition(" (")
  lines = textwrap.wrap(what, LABEL_CHARS, break_on_hyphens=False) + (
      [f"({how}"] if how else [])
  return "\n".join(lines)


def forest_plot(path: pathlib.Path, panels: list[Panel]) -> bool:
  """Draws ``panels`` stacked, one row per comparison; False when empty."""
  if not panels:
    return False
  plt = style.pyplot()
  # Inches: each row, tall enough for the panel's longest wrapped label (long
  # axis values, a declared pair's two), plus each panel's title, ticks and
  # axis label.
  lines = [max(wrap(r.label).count("\n") + 1 for r in p.rows) for p in panels]
  heights = [max(ROW_INCHES, LINE_INCHES * k) * len(p.rows) + 0.6
             for p, k in zip(panels, lines)]
  height = sum(heights) + 0.9 * len(panels) + LEGEND_INCHES
  labels = [wrap(r.label) for p in panels for r in p.rows]
  numbers = [f"{r.numbers}  {r.verdict}" for p in panels for r in p.rows]
  width = (PLOT_INCHES + CHAR_INCHES * max(len(line) for text in labels
                                           for line in text.split("\n"))
           + CHAR_INCHES * max(len(n) for n in numbers))
  fig, axes = plt.subplots(len(panels), 1, figsize=(width, height),
                           gridspec_kw={"height_ratios": heights}, squeeze=False)
  for ax, panel in zip(axes[:, 0], panels):
    n = len(panel.rows)
    ys = list(range(n))[::-1]  # the first row on top
    ax.axvspan(-panel.margin, panel.margin, color=BAND_COLOUR, alpha=0.6, linewidth=0)
    ax.axvline(0.0, color="#444444", linewidth=1.0)
    xs = [0.0, -panel.margin, panel.margin]
    for y, row in zip(ys, panel.rows):
      if row.seed_diffs:
        ax.scatter(row.seed_diffs, [y - SEED_OFFSET] * len(row.seed_diffs), s=16,
                   color=row.colour, alpha=style.SEED_ALPHA + 0.2, linewidths=0, zorder=2)
        xs += list(row.seed_diffs)
      if row.low is not None:
        ax.plot([row.low, row.high], [y, y], color=row.colour, linewidth=1.2, zorder=3)
        for end in (row.low, row.high):
          ax.plot([end, end], [y - 0.15, y + 0.15], color=row.colour, linewidth=1.2,
                  zorder=3)
        xs += [row.low, row.high]
      if row.tost_low is not None:
        ax.plot([row.tost_low, row.tost_high], [y, y], color=row.colour, linewidth=4.5,
                alpha=0.45, solid_capstyle="butt", zorder=3)
      ax.scatter([row.diff], [y], marker=row.marker, s=70, zorder=4,
                 facecolors=row.colour if row.filled else "white",
                 edgecolors=row.colour, linewidths=1.5)
      xs.append(row.diff)
    lo, hi = min(xs), max(xs)
    pad = 0.12 * (hi - lo) or 0.1
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_yticks(ys, [wrap(r.label) for r in panel.rows], fontsize=9)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(ys, [f"{r.numbers}  {r.verdict}" for r in panel.rows], fontsize=9)
    right.tick_params(length=0)
    style.plain_axis(ax.xaxis)
    ax.set_xlabel(panel.xlabel)
    ax.set_title(panel.title, fontsize=10, loc="left")
    left, right_word = (("better", "worse") if panel.lower_is_better
                        else ("worse", "better"))
    ax.set_title(f"← value {left}   |   value {right_word} →", loc="right", fontsize=8,
                 color="#555555")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
  handles = [_verdict_handle(v) for v in VERDICT_STYLE]
  from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel
  from matplotlib.patches import Patch  # pylint: disable=import-outside-toplevel
  sequential = any(p.sequential for p in panels)
  handles += [Line2D([], [], color="#555555", linewidth=1.2,
                     label=("interval at its look's level (1 − α·w)" if sequential
                            else f"{panels[0].level:.0%} interval")),
              Line2D([], [], color="#555555", linewidth=4.5, alpha=0.45,
                     label=("equivalence test's interval (1 − 2α·w)" if sequential
                            else f"{panels[0].tost_level:.0%} interval (equivalence test)")),
              Line2D([], [], marker="o", linestyle="", color="#555555", alpha=0.35,
                     markersize=4, label="one seed's difference (paired)"),
              Patch(color=BAND_COLOUR, alpha=0.6, label="equivalence band (±margin)")]
  fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False,
             bbox_to_anchor=(0.5, 0.0))
  fig.tight_layout(rect=(0, LEGEND_INCHES / height, 1, 1))
  return style.save(plt, fig, path, True)


def _verdict_handle(verdict: str):
  from matplotlib.lines import Line2D  # pylint: disable=import-outside-toplevel
  marker, colour, filled = VERDICT_STYLE[verdict]
  return Line2D([], [], marker=marker, linestyle="", markersize=8, color=colour,
                markerfacecolor=colour if filled else "white", markeredgewidth=1.5,
                label=VERDICT_LEGEND[verdict])
