"""The checks a sweep's claims pass before anything runs (``--dry-run``
included): each point named exists, once, and each quantity read is one the
sweep's runs log (``check_sweep``; a ConfigError, exit 2); the transfer
claims' own (a size axis, a tuned learning rate, the variant) are
``claims_transfer.check``'s, the ladder claims' (a ladder, a variant that is
not the base) ``claims_ladder.check``'s."""

from __future__ import annotations

from typing import Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records.claims import Claim
from tfx_jax.records.sweep import SweepRecord
from tfx_jax.report import claims_ladder, claims_transfer
from tfx_jax.report.claims import (SPLIT_METRICS, TRAINING_SIGNALS, axis_points, find_point,
                                   length_keys)


def _check_metric(claim: Claim, lengths: Sequence[str], evaluations: Sequence[str],
                  layer_stats: bool, tuned: bool, laddered: bool = False) -> None:
  """A ConfigError where ``claim`` reads a quantity the sweep's runs do not
  log: ``lengths`` the ``ppl@Kx`` keys its evaluations compute,
  ``evaluations`` the RoPE scalings its runs are also evaluated with
  (``yarn``: the report names them ``yarn-x8-from64``), ``layer_stats``
  whether they log per-layer statistics, ``tuned`` whether a learning rate
  is tuned, ``laddered`` whether the sweep has a ladder (``claims_ladder``)."""
  metric, where = claim.metric, f"claim {claim.id!r}"
  name = metric.split("/")
  if metric.startswith("eval/"):
    ok = name[1] in SPLIT_METRICS and len(name) == 2
    valid = [f"eval/{m}" for m in SPLIT_METRICS]
  elif metric.startswith("ppl@"):
    parts = length_keys(metric)
    ok = all(p in lengths for p in parts) and len(parts) <= 2
    valid = [*lengths, *(f"{k}/{lengths[0][4:]}" for k in lengths[1:])] if lengths else []
  elif metric.startswith("training/"):
    ok, valid = name[-1] in TRAINING_SIGNALS, [f"training/{s}" for s in TRAINING_SIGNALS]
  elif metric.startswith("evaluation/"):
    ok = len(name) == 3 and name[1].split("-")[0] in evaluations and name[2] in lengths
    valid = [f"evaluation/{e}-x<factor>[-from<length>]/{k}" for e in evaluations
             for k in lengths]
  elif metric.startswith("layer_profile/"):
    # A statistic may hold a slash (``init_grad_norm/ffn_out``): the stack is the last part.
    ok, valid = layer_stats and len(name) >= 3, ["layer_profile/<statistic>/<stack>"]
  else:
    ok = metric == "speedup" or (metric == "sensitivity" and tuned)
    valid = ["speedup", *(["sensitivity", "transfer/shift", "every_rate/eval/loss"]
                          if tuned else []), *(claims_ladder.METRICS if laddered else [])]
  if not ok:
    raise ConfigError(f"{where}: the sweep's runs do not log {metric!r}; it can read "
                      f"{valid or 'no such quantity'}.")


def _check_every_rate(claim: Claim, where: str) -> None:
  """``every_rate/<metric>`` reads a split metric of the tuning runs (ConfigError)."""
  if not claim.metric.startswith(claims_transfer.EVERY_RATE):
    return
  name = claim.metric[len(claims_transfer.EVERY_RATE):].split("/")
  if len(name) != 2 or name[0] != "eval" or name[1] not in SPLIT_METRICS:
    valid = [f"{claims_transfer.EVERY_RATE}eval/{m}" for m in SPLIT_METRICS]
    raise ConfigError(f"{where}: the sweep's runs do not log {claim.metric!r}; it can read "
                      f"{valid}.")


def check_sweep(record: SweepRecord) -> None:
  """A ConfigError for the first claim of ``record`` that the sweep cannot
  test as declared: a point it does not have (or names ambiguously), a
  precondition's point likewise, or a quantity its runs do not log. Run on
  every invocation before anything is written (``--dry-run`` included)."""
  values = axis_points(record.axes)
  lengths: list[str] = []
  evaluations: list[str] = []
  for evaluation in record.evaluations:
    args = list(evaluation.args)
    if "--lengths" in args[:-1]:
      lengths += [f"ppl@{k}" for k in args[args.index("--lengths") + 1].split(",")]
    if "--rope_scaling" in args[:-1]:
      evaluations.append(args[args.index("--rope_scaling") + 1])
  # Per-layer statistics come from training (``train.log_layer_stats``) or
  # from the initial parameters (``train.layer_stats_init_batches`` > 0).
  layer_stats = any(bool(overrides.get(key))
                    for overrides in [record.overrides, *(e.overrides for e in record.runs)]
                    for key in ("train.log_layer_stats", "train.layer_stats_init_batches"))
  tuned = "optim.learning_rate" in record.tune
  for claim in record.claims:
    where = f"claim {claim.id!r}"
    transfer = claims_transfer.handles(claim.metric)  # transfer/shift, every_rate/<metric>
    ladder = claims_ladder.handles(claim.metric)  # ladder/multiplier, ladder/trend
    # A shift names a variant: its point over every axis but the size axis; a
    # ladder's claim one over the declared axes.
    declared = claims_ladder.check(record, claim, where) if ladder else []
    named = (axis_points(claims_transfer.check(record, claim, where)) if transfer
             else axis_points(declared) if ladder else values)
    for spec in claim.compare:
      if spec is not None:
        index = find_point(spec, claim.context, named, where)
        if ladder and claims_ladder.names_base(declared, index):
          raise ConfigError(f"{where}: {claim.metric} reads a variant over the base; "
                            f"{spec!r} names the base itself (every declared axis at its "
                            "base value).")
    if claim.requires is not None:
      find_point(claim.requires.point, claim.context, values, f"{where} (requires)")
    if transfer:
      _check_every_rate(claim, where)
    elif not ladder:
      _check_metric(claim, list(dict.fromkeys(lengths)), evaluations, layer_stats, tuned,
                    record.ladder is not None)
