"""A split read as ``num_shards`` grain pipelines, divided among the processes.

The global batch is the concatenation of one sub-batch from every data shard,
in shard order: shard ``s`` is the strided slice ``s::num_shards`` of the split
with its own shuffle, packing and ``batch_size // num_shards`` rows a batch.
With ``num_shards`` fixed, the global batches are the same whatever the number
of processes that reads them, so a run moves between process counts without
changing its data:

* ``num_shards >= num_processes`` (a multiple): every process reads its own
  ``num_shards / num_processes`` shards and nothing else;
* ``num_shards < num_processes`` (a divisor): ``num_processes / num_shards``
  processes read the same shard and each keeps its block of its rows.

Finite splits (evaluation) end at different batches on different shards. An
ended shard contributes all-zero rows (weights and segment_ids 0, weighted out
of every metric) until every shard has ended, so every process runs the same
number of batches; processes agree on that end through ``any_process``.

The iterator state lists every shard's grain state (gathered from all
processes through ``gather``), so a checkpoint written on N processes restores
on M.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tfx_jax.core.errors import ConfigError

STATE_KIND = "tfx_jax.shards"


def assignment(num_shards: int, num_processes: int, process_index: int
               ) -> tuple[list[int], tuple[int, int] | None]:
  """(the shards ``process_index`` reads, the block of their rows it keeps)."""
  if num_shards % num_processes == 0:
    per = num_shards // num_processes
    return list(range(process_index * per, (process_index + 1) * per)), None
  if num_processes % num_shards == 0:
    readers = num_processes // num_shards
    return [process_index // readers], (process_index % readers, readers)
  raise ConfigError(
      f"data.num_shards={num_shards} and the {num_processes} processes do not divide "
      f"one another; choose a multiple or a divisor of {num_processes} "
      f"(0: one shard per process)")


def shard_count_of(state: Any) -> int:
  """The number of data shards an iterator state was written with."""
  if isinstance(state, dict) and state.get("kind") == STATE_KIND:
    return int(state["num_shards"])
  return 1  # One grain iterator's own state (checkpoints of a single pipeline).


def _no_other_process(flag: bool) -> bool:
  return flag


def _only_this_process(value: Any) -> list[Any]:
  return [value]


class ShardedBatches:
  """An iterable of this process's rows of the global batches (see module doc).

  Args:
    datasets: one grain dataset of batches per shard this process reads.
    shards: their shard indices.
    num_shards: the number of shards of the split.
    rows: (block, blocks): keep that block of each batch's rows split into
      ``blocks`` equal blocks (None: all of them).
    finite: pad ended shards with zero rows until all have ended.
    any_process: True when the flag is True on any process (a collective).
    gather: the list of a JSON-able value from every process, in process order.
  """

  def __init__(self, datasets: Sequence[Any], shards: Sequence[int], num_shards: int, *,
               rows: tuple[int, int] | None = None, finite: bool = False,
               any_process: Callable[[bool], bool] = _no_other_process,
               gather: Callable[[Any], list[Any]] = _only_this_process):
    self.datasets, self.shards, self.num_shards = list(datasets), list(shards), num_shards
    self.rows, self.finite = rows, finite
    self.any_process, self.gather = any_process, gather

  def __iter__(self) -> "ShardedIterator":
    return ShardedIterator(self)


class ShardedIterator(Iterator[dict]):
  """Iterator of ``ShardedBatches``, with grain-style ``get_state``/``set_state``."""

  def __init__(self, spec: ShardedBatches):
    self.spec = spec
    self.iters = [iter(ds) for ds in spec.datasets]
    self.ended = [False] * len(self.iters)
    self.template: dict | None = None

  def _next_of(self, k: int) -> dict | None:
    if self.ended[k]:
      return None
    try:
      batch = next(self.iters[k])
    except StopIteration:
      if not self.spec.finite:
        raise
      self.ended[k] = True
      return None
    if self.template is None:
      self.template = {key: np.zeros_like(v) for key, v in batch.items()}
    return batch

  def __next__(self) -> dict:
    parts = [self._next_of(k) for k in range(len(self.iters))]
    if not self.spec.any_process(any(p is not None for p in parts)):
      raise StopIteration
    if self.template is None:
      raise ConfigError(
          f"data shards {self.spec.shards} of {self.spec.num_shards} yielded no rows while "
          f"other shards did; use fewer data.num_shards for this split")
    parts = [self.template if p is None else p for p in parts]
    if len(parts) == 1:
      batch = parts[0]
    else:
      batch = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    if self.spec.rows is not None:
      block, blocks = self.spec.rows
      batch = {key: np.split(v, blocks)[block] for key, v in batch.items()}
    return batch

  def get_state(self) -> Any:
    """Every shard's state; a collective when several processes read shards."""
    local = {str(s): it.get_state() for s, it in zip(self.spec.shards, self.iters)}
    if self.spec.num_shards == 1:
      return local["0"]  # The plain grain state, as a single pipeline writes it.
    states: dict[str, Any] = {}
    for part in self.spec.gather(local):
      states.update(part)
    missing = sorted(set(map(str, range(self.spec.num_shards))) - states.keys(), key=int)
    if missing:
      raise RuntimeError(f"no process holds the state of data shards {missing}")
    return {"kind": STATE_KIND, "num_shards": self.spec.num_shards,
            "shards": [states[str(s)] for s in range(self.spec.num_shards)]}

  def set_state(self, state: Any) -> None:
    saved = shard_count_of(state)
    if saved != self.spec.num_shards:
      raise ConfigError(
          f"the checkpoint's data position was written with data.num_shards={saved}, "
          f"this run reads {self.spec.num_shards} shards; resume with "
          f"--config.data.num_shards={saved} (or 0, which keeps the checkpoint's)")
    shard_states = state["shards"] if saved > 1 else [state]
    for s, it in zip(self.spec.shards, self.iters):
      it.set_state(shard_states[s])

