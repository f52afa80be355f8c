"""``runs/<sweep>/report.csv``: one row per run, its values and final metrics."""

from __future__ import annotations

import csv
import math
import pathlib
from typing import Sequence

from tfx_jax.records.summary import RunSummaries, RunSummary
from tfx_jax.records.sweep import SweepRecord

METRIC_ORDER = ("eval/loss", "eval/perplexity", "eval/bpb", "eval/accuracy", "eval/bleu",
                "train/nll")


def run_metrics(summary: RunSummary) -> dict[str, float]:
  """Final metrics of one run, length extrapolation included as ``ppl@Kx``."""
  out = {k: v for k, v in summary.final.items() if v is not None and math.isfinite(v)}
  for k, ppl in summary.lengths.items():
    if ppl is not None:
      out[f"ppl@{k}x"] = ppl
  return out


def metric_names(summaries: Sequence[RunSummary]) -> list[str]:
  names = {m for s in summaries for m in run_metrics(s)}
  ordered = [m for m in METRIC_ORDER if m in names]
  rest = sorted(n for n in names if n not in METRIC_ORDER and not n.startswith("ppl@"))
  ppl = sorted((n for n in names if n.startswith("ppl@")), key=lambda n: int(n[4:-1]))
  return ordered + rest + ppl


def write_csv(path: pathlib.Path, record: SweepRecord, summaries: RunSummaries,
              metrics: Sequence[str]) -> None:
  """One row per run: its seed, stage, axis and tuned values, state, final
  metrics, speed and cost: tokens/s, wall and compile seconds, ms per train
  step (``collect.step_seconds``), the compiled train step's bytes per device
  and the process's peak resident bytes (status.json's ``train_step_memory``
  total and ``peak_rss_bytes``)."""
  fields = [f for a in record.axes for f in a.fields] + list(record.tune)
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "seed", "stage", *fields, "state", "step", *metrics,
                "tokens_per_sec", "wall_seconds", "compile_seconds", "step_ms",
                "train_step_bytes", "peak_rss_bytes"])
    for entry in record.runs:
      s = summaries[entry.name]
      values = {k: v for value in [*entry.values, entry.tuned] for k, v in value.items()}
      m = run_metrics(s)
      w.writerow([entry.name, entry.seed, entry.stage, *[values.get(f, "") for f in fields],
                  s.state, s.step, *[m.get(k, "") for k in metrics],
                  s.tokens_per_sec or "", s.wall_seconds or "",
                  s.compile_seconds if s.compile_seconds is not None else "",
                  "" if s.step_seconds is None else round(1000.0 * s.step_seconds, 3),
                  s.train_step_memory.get("total", ""),
                  "" if s.peak_rss_bytes is None else s.peak_rss_bytes])

