"""The report's section "Output log Z and attention logits": what training
logged of the two instabilities of Wortsman et al. 2023, per tuned value,
where the sweep is about them (each run's ``training`` in report.json)."""

from __future__ import annotations

from typing import Mapping

from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import stats
from tfx_jax.report.context import Context
from tfx_jax.report.schema import Report
from tfx_jax.report.tables import Lines, markdown_table


def shows_training_signals(record: SweepRecord, report: Report) -> bool:
  """Whether the report has a stability section: some run logged attention
  logits (``train.log_layer_stats``) or trained with z-loss. (Every run logs
  its output log Z; a sweep that asks neither is not about stability.)"""
  results = [r for p in report.points
             for r in [*p.confirmation.values(), *(r for t in p.tuned for r in t.seeds.values())]]
  return (any("max_attention_logit" in r.training for r in results)
          or any(e.overrides.get("train.z_loss") for e in record.runs))


def training_signals_table(record: SweepRecord, report: Report) -> list[list[str]]:
  """Each point at each tuned value (its confirmation runs on a row of their
  own): the output log Z from first to last logged step, its range, and the
  largest attention logit, means over the runs (a diverged run's values up to
  its divergence)."""
  keys = ("output_log_z_first", "output_log_z_last", "output_log_z_min",
          "output_log_z_max", "max_attention_logit", "max_attention_logit_last")
  rows = [[a.label for a in record.axes] + [
      "tuned", "runs", "log Z first", "log Z last", "log Z min", "log Z max",
      "largest attention logit", "at the last step"]]

  def cells(results) -> list[str]:
    out = []
    for key in keys:
      values = [r.training[key] for r in results if key in r.training]
      out.append(f"{stats.mean_std(values)[0]:.4g}" if values else "-")
    return [str(len(results))] + out

  for point in report.points:
    for row in point.tuned:
      rows.append(list(point.values.values()) + [row.label or "-"]
                  + cells(list(row.seeds.values())))
    if point.confirmation:
      rows.append(list(point.values.values()) + [f"{point.chosen_label} (confirmation)"]
                  + cells(list(point.confirmation.values())))
  return rows


def markdown(ctx: Context, report: Report, plots: Mapping[str, str]) -> Lines:
  """The output log Z and attention logits per tuned value (Wortsman et al.
  2023's two instabilities), where the sweep is about them."""
  record = ctx.record
  if not shows_training_signals(record, report):
    return []
  return ["## Output log Z and attention logits", "",
          "What training logged of the two instabilities of Wortsman et al. 2023, "
          "mean over each row's runs: the output softmax's mean log Z "
          "(`train/output_log_z`; z-loss pulls it towards 0, and without it the "
          "output logits can drift) at the first and last logged steps and its range "
          "over them, and the largest self-attention logit of any layer "
          "(`layer_stats/max_attention_logit/*`, with `train.log_layer_stats`; its "
          "growth is what qk-layernorm prevents) over the run and at its last logged "
          "step. A diverged run counts with its values up to the divergence. In "
          "`report.json`: each run's `training`.", "",
          markdown_table(training_signals_table(record, report)), ""]

