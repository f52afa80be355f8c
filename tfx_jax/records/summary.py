"""A run's figures as the report reads them: ``RunSummary``.

``report.collect.read_run`` builds one from what the run left in its workdir
(status.json, the TensorBoard scalars, ``evaluate``'s results) and its
sweep.json entry; the tables, statistics and plots are pure functions of
these records, so a test plants them without training. It lives in memory
only (nothing writes it to disk).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping


def _empty():
  return dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """The figures of one run that the report aggregates; a figure the run did
  not log is empty (None, {}), so a test plants only what it reads."""
  # status.json's state and last step (a run without one: its sweep.json
  # entry's state, step 0).
  state: str
  step: int = 0
  # The last value of every eval/* and train/nll tag, each evaluation
  # metric's standard error ``eval/<metric>_se`` among them.
  final: dict[str, float] = _empty()
  # Every eval/* tag at step 0, the evaluation before the first update
  # (``eval.at_start``); {} for a run that did not evaluate at step 0.
  initial: dict[str, float] = _empty()
  # {tag: [(step, value)]} for train/loss, train/nll, eval/loss and, where the
  # last evaluation read more than the others (eval.final_batches),
  # eval_subset/loss: its loss over the others' subset.
  curves: dict[str, list[tuple[int, float]]] = _empty()
  # The median of train/tokens_per_sec, its first interval (which includes
  # compilation) left out; None: not logged.
  tokens_per_sec: float | None = None
  # The sweep's measure of the run (every attempt, launches included), else
  # the span of its logged points; None: nothing logged.
  wall_seconds: float | None = None
  compile_seconds: float | None = None  # status.json's, else the sweep entry's
  # The newest ``evaluate --lengths``: {multiple: perplexity}, the split it
  # read, and {multiple: the window in tokens}.
  lengths: dict[int, float | None] = _empty()
  window_tokens: dict[int, int] = _empty()
  # The same with RoPE scaled at evaluation, per scaling:
  # {"rope-yarn-x8-from64": {multiple: perplexity}}.
  scaled_lengths: dict[str, dict[int, float | None]] = _empty()
  lengths_split: str | None = None
  # {kind: {(stack, layer): value}} at the first step they were logged; kind
  # ``grad_norm``, ``param_norm``, ``update_norm``, with ``/<param>`` for
  # ``train.layer_stats_param`` other than all, and ``init_grad_norm/<param>``,
  # the mean at initialisation logged at step 0.
  layer_stats: dict[str, dict[tuple[str, int], float]] = _empty()
  layer_stats_step: int | None = None  # the first step of those logged during training
  # What training logged of its stability (``collect.training_signals``): the
  # output log Z's first, last, min and max, the largest attention logit.
  training: dict[str, float] = _empty()
  test: dict[str, float] = _empty()  # the newest ``evaluate --split test`` ({}: none)
  num_params: int | None = None  # the model's parameter count (status.json)
  # What a comparison can hold equal (status.json's ``budgets``, run/footprint.py):
  # params, non_embedding_params, train_flops_per_token, kv_bytes_per_token,
  # state_bytes_per_sequence; {} for a run whose status has none.
  budgets: dict[str, int] = _empty()
  # Where the run's time went: status.json's ``seconds`` ({}: not recorded),
  # and the cores it had (status.json's ``cores``).
  seconds: dict[str, float] = _empty()
  cores: int | None = None
  # A train step's seconds: the train_steps phase over the steps the run took
  # in its workdir (a branched budget's from its branch step); None: either
  # not recorded. The compiled train step's bytes per device (status.json's
  # ``train_step_memory``: arguments, outputs, temporaries, total; {}: not
  # recorded) and the training process's peak resident bytes.
  step_seconds: float | None = None
  train_step_memory: dict[str, int] = _empty()
  peak_rss_bytes: int | None = None


# {run name: its summary}: what the report reads of a sweep's runs.
RunSummaries = Mapping[str, RunSummary]
