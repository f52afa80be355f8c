"""report.json's records of the effects tested as families of their own,
beside the comparisons (``schema.Report`` holds them; ``schema`` re-exports
them, so ``schema.EvaluationEffect`` and ``schema.LayerProfile`` read as before):

  EvaluationEffect  a point's models evaluated another way (RoPE scaled at
                    evaluation) against as trained, paired by seed
  LayerProfile      a point's per-layer statistic (the gradient norm at
                    initialisation) per stack, and its last-over-first trend

Their serialisation and migrations are ``schema``'s (``records.serial``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from tfx_jax.records import serial
from tfx_jax.report import stats


@serial.layout(order=("key", "point", "evaluation", "metric", "seeds", "margin",
                      "p_adjusted", "verdict", "interval"),
               flat=("interval",))
@dataclasses.dataclass(frozen=True)
class EvaluationEffect:
  """One point's models evaluated another way against as trained, the same
  runs paired by seed: RoPE scaled at evaluation only (``evaluate --lengths
  --rope_scaling``) against its positions as trained, at one length. Two
  evaluations of one set of models, not two models: a family of its own,
  Holm over the report's evaluation effects."""
  key: tuple[int, ...]
  point: str        # the point's axis values, as a label
  evaluation: str   # how it was evaluated: "yarn-x8-from64"
  metric: str       # "ppl@8x"
  seeds: tuple[int, ...]
  interval: stats.Interval  # evaluated this way - as trained
  margin: float
  p_adjusted: float | None
  verdict: stats.Verdict


# Which way a per-layer statistic runs from the first layer to the last
# (``LayerProfile``): resolved up or down after Holm, or not resolved.
LayerTrend = Literal["grows", "falls", "unresolved"]


# The ratio and its ends are derived from the interval (written, not read back).
@serial.layout(order=("key", "point", "statistic", "stack", "seeds", "means", "half_widths",
                      "ratio", "ratio_low", "ratio_high", "p_adjusted", "trend", "same_as",
                      "interval"),
               keys={"interval": "log_ratio"},
               derived={"ratio": lambda p: p.ratio[0], "ratio_low": lambda p: p.ratio[1],
                        "ratio_high": lambda p: p.ratio[2]})
@dataclasses.dataclass(frozen=True)
class LayerProfile:
  """One point's per-layer statistic in one stack over the runs the report's
  per-layer table shows (its confirmation runs where it ran them; the
  gradient norm at initialisation where runs logged it, Xiong et al.'s
  Figure 3): each layer's mean over the
  seeds with its 95% t-interval's half-width, and the profile's trend, the
  last layer's value over the first's. The trend is tested on the log scale,
  paired by seed (ln last - ln first against 0), and reported as the ratio:
  the geometric mean over seeds with its interval; p adjusted by Holm over
  the report's profiles, a family of their own."""
  key: tuple[int, ...]
  point: str       # the point's axis values, as a label
  statistic: str   # "init_grad_norm/ffn_out": the layer_stats tag's kind and part
  stack: str       # "encoder", "decoder"
  seeds: tuple[int, ...]
  means: tuple[float, ...]                 # per layer, first to last
  half_widths: tuple[float | None, ...]    # None: one seed
  interval: stats.Interval  # ln(last) - ln(first), paired by seed
  p_adjusted: float | None
  trend: LayerTrend
  # The earlier point whose profile this one equals on every seed, tested
  # once for both (None: tested itself).
  same_as: str | None = None

  @property
  def ratio(self) -> tuple[float, float | None, float | None]:
    """last / first: (geometric mean over seeds, its interval's low, high)."""
    iv = self.interval
    return (math.exp(iv.diff), None if iv.low is None else math.exp(iv.low),
            None if iv.high is None else math.exp(iv.high))
