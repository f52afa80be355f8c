"""The report's section "Tuned values": each point at each tuned value (the
selection metric on validation, outcomes, the one chosen), the choices at a
grid's end, a ladder's choice shared across its budgets, and the
learning-rate sensitivity (Wortsman et al. 2023:
``tuning.sensitivity``), report.json's ``sensitivity``, with its plots.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfx_jax.records.ladder import BUDGET_AXIS
from tfx_jax.records.sweep import SweepRecord, tuned_values
from tfx_jax.report import stats
from tfx_jax.report import tuning
from tfx_jax.report.context import Context
from tfx_jax.report.points import fmt_value
from tfx_jax.report.schema import Point, Report
from tfx_jax.report.sections import choices, provenance, selection
from tfx_jax.report.tables import Lines, fmt, markdown_table, outcome_cells


def compute(ctx: Context) -> dict[str, Any]:
  """report.json's ``sensitivity``: each tuned point's curve and number."""
  return {"sensitivity": tuple(tuning.sensitivity(
      ctx.record, selection.points(ctx),
      selection.initial_losses(ctx.record, ctx.summaries, ctx.baselines)))}


def tuned_table(record: SweepRecord, report: Report,
                sources: Mapping[tuple[int, ...], str] | None = None) -> list[list[str]]:
  """Each point at each tuned value: the selection metric (validation);
  ``sources`` (a sweep with ``tune_at``): {point key: where its value came
  from}, "tuned here" or "transferred from d_model=64" (``sections.provenance``)."""
  head = [a.label for a in record.axes] + [
      "tuned", f"{report.select_by} (validation)", "learned", "stalled", "diverged",
      "chosen"]
  if sources:
    head.append("value from")
  rows = [head]
  for point in report.points:
    for row in point.tuned:
      finished = [s.validation.get(report.select_by) for s in row.seeds.values()
                  if s.outcome in ("learned", "stalled")]
      finished = [v for v in finished if v is not None]
      mean = (fmt(row.selection_mean) if row.selection_mean is not None
              else f"none learned ({fmt(stats.mean_std(finished)[0])})" if finished
              else "-")
      rows.append(list(point.values.values()) + [row.label, mean]
                  + outcome_cells(row.counts)
                  + [_chosen_mark(point) if row.label == point.chosen_label else ""]
                  + ([sources.get(point.key, "-")] if sources else []))
  return rows


def _chosen_mark(point: Point) -> str:
  """The chosen row's mark: within the noise where its lead over the next best
  is below the point's seed spread (``Point.choice``)."""
  return "✓ within the noise" if point.choice and point.choice.within_noise else "✓"


def shared_lines(record: SweepRecord, report: Report) -> Lines:
  """A ladder whose budgets share their tuned value (``Ladder(share_tuning=True)``):
  how the value is chosen (``selection.shared_picks``), and the rungs and
  variants where no value is scored at every budget, so nothing is chosen."""
  if record.ladder is None or not record.ladder.share_tuning:
    return []
  budget = record.axes[BUDGET_AXIS].label
  unchosen = dict.fromkeys(
      ", ".join(v for k, v in p.values.items() if k != budget) for p in report.points
      if p.chosen is None and any(r.selection_score is not None for r in p.tuned))
  text = ("Shared across budgets (`Ladder(share_tuning=True)`): the budgets of each rung and "
          "variant share one tuned value, chosen by the lowest mean validation score over "
          "the budgets (the score each point is chosen by, among the values scored at every "
          "budget), so their confirmation runs (where the sweep has them) "
          + ("branch from one trunk" if record.ladder.branch else "run at one value")
          + "; a short budget runs "
          "at a value chosen partly by the long ones, and a transferred rung takes its "
          "proxy's value.")
  if unchosen:
    text += (" No tuned value is scored at every budget of " + "; ".join(unchosen)
             + ": nothing is chosen there.")
  return [text, ""]


def sensitivity_table(report: Report) -> list[list[str]]:
  rows = [["point", "sensitivity", "failed runs", "l0", "l0 from"]]
  source = {"step 0": lambda s: f"step 0 (mean of {s.initial_loss_runs} runs)",
            "uniform": lambda s: "uniform prediction (no run evaluated at step 0)",
            None: lambda s: "-"}
  for s in report.sensitivity:
    rows.append([", ".join(s.point.values()) or "base",
                 "all failed" if s.all_failed else fmt(s.sensitivity),
                 str(sum(c.failed for c in s.curve)), fmt(s.initial_loss, 3),
                 source[s.initial_loss_source](s)])
  return rows


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """Each point at each tuned value, choices at a grid's end, the sensitivity."""
  record = ctx.record
  if not record.tune:
    return []
  sources = {p.key: p.text for p in provenance.of_ctx(ctx)}
  out = (["## Tuned values", "", markdown_table(tuned_table(record, report, sources)), ""]
         + shared_lines(record, report) + choices.noise_lines(report))
  edges = [(p, field, end) for p in report.points for field, end in p.chosen_at_edge.items()]
  if edges:
    out += ["Chosen at the end of the grid, so the best value may lie beyond what "
            "was tried (extend the grid to bracket it): "
            + "; ".join(f"{', '.join(p.values.values())} "
                        f"({field.split('.')[-1]} = {fmt_value(p.chosen[field])}, "
                        f"the {end} tried)" for p, field, end in edges) + ".", ""]
  if report.sensitivity:
    out += ["### Learning-rate sensitivity", "",
            "Wortsman et al. 2023: E_η[min(l(η), l0) − min_η l(η)] over the tuned "
            "values, l(η) the mean over the value's runs (the declared seeds) of each "
            "run's final validation loss capped at l0: a stalled run at its own loss, "
            "a diverged run at l0. l0 is the loss at initialisation: the mean of the "
            "point's evaluations at step 0 (`eval.at_start`), or, for runs that did "
            "not evaluate at step 0, the loss of the uniform prediction (ln |V|; ln "
            "of the classes for classification); the last column says which. Lower: "
            "the point trains well over a wider range.", "",
            markdown_table(sensitivity_table(report)), ""]
    for key, name in plots.items():
      if key.startswith("sensitivity:"):
        out += [f"![sensitivity]({name})", ""]
  return out



def plots(ctx: Context, report: Report, sweep_dir, palette) -> dict[str, str]:
  """The sensitivity curves: per numeric tuned field, one plot per axis."""
  # matplotlib, imported where a plot is drawn
  from tfx_jax.report import plots as plots_lib  # pylint: disable=import-outside-toplevel
  record, out = ctx.record, {}
  for field, grids in record.tune.items():
    values = tuned_values(grids)  # every point's grid of the field
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
               for v in values):
      continue  # a non-numeric tuned field has no log axis; its table stays
    for ai in range(len(record.axes)) or [None]:
      label = "base" if ai is None else record.axes[ai].label
      name = plots_lib.file_name("sensitivity", field, label)
      if report.sensitivity and plots_lib.sensitivity_plot(sweep_dir / name, record, report,
                                                           field, ai, palette):
        out[f"sensitivity:{field}:{ai}"] = name
  return out
