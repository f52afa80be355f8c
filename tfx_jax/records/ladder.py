"""A sweep's ladder: model sizes (rungs) crossed with training lengths
(tokens per parameter), as declared and as the sweep resolved it.

``Ladder`` is the declaration, ``Sweep(ladder=Ladder(rungs=[...],
tokens_per_param=[...]))``: each rung is a dict of model fields (zipped
width, depth, heads, FFN width), each ``tokens_per_param`` value a training
length in tokens per non-embedding parameter of the rung. The sweep makes of
it two axes ahead of the declared ones, the rung axis (its values the rungs)
and the budget axis (its values ``{BUDGET_FIELD: tokens per parameter}``), so
that every variant, tuned value and seed runs at every rung and budget.

``LadderPlan`` is what the sweep resolved and sweep.json keeps: per point of
the sweep (its key over every axis, the ladder's two first), the parameter
counts of its model, the training FLOPs per token at the run's sequence
length (``run.footprint.flops_per_token``, the count ``summary`` prints), and
the steps, tokens, epochs and branch step of its budget, and whether the
budgets share their tuned value (``share_tuning``). A rung's tokens come
from the rung's count at the base values of the declared axes (``rung_params``),
so every variant of a rung trains on the same tokens: a variant that changes
the count (an MoE's routed experts, a wider FFN) is compared on the same data,
its FLOPs per token its own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import serial

# The budget axis's one field: not a config field; each run's value becomes
# its ``train.num_steps`` (``LadderPlan.steps``).
BUDGET_FIELD = "ladder.tokens_per_param"
# The ladder's two axes come first in a laddered sweep's axes.
RUNG_AXIS, BUDGET_AXIS = 0, 1
# A ladder whose largest rung repeats the corpus more than this says so.
MAX_EPOCHS = 4.0


@dataclasses.dataclass(frozen=True)
class Ladder:
  """Model sizes crossed with training lengths (see the module docstring).

  ``branch``: with ``optim.schedule=wsd``, the budgets of one (rung, variant,
  tuned value, seed) share their stable phase: one trunk run trains to the
  last decay start, each budget's decay runs from its branch point as its
  own run (``sweep.branching``). False: every budget runs from scratch.

  ``share_tuning``: the budgets of a (rung, variant) share one tuned value,
  the one with the lowest mean selection score over the budgets among those
  scored at every budget (``report.sections.selection``), so that their
  confirmation runs branch from one trunk too. False: each budget chooses its
  own.
  """
  rungs: Sequence[Mapping[str, Any]]
  tokens_per_param: Sequence[float]
  branch: bool = True
  share_tuning: bool = False


def check_declaration(ladder: Any) -> Ladder:
  """``ladder`` checked for what needs no config (ConfigError naming the problem):
  a ``Ladder``, >= 2 rungs each a non-empty dict of the same fields, no two
  alike, tokens per parameter > 0, none repeated."""
  if not isinstance(ladder, Ladder):
    raise ConfigError(f"ladder: expected Ladder(rungs=[...], tokens_per_param=[...]), "
                      f"got {ladder!r}.")
  rungs = [dict(r) if isinstance(r, Mapping) else r for r in ladder.rungs]
  if len(rungs) < 2:
    raise ConfigError(f"ladder: {len(rungs)} rung(s); a ladder needs >= 2 sizes to fit "
                      "across (4 or more for a fit with its lack-of-fit check).")
  for i, rung in enumerate(rungs):
    if not isinstance(rung, dict) or not rung:
      raise ConfigError(f"ladder rung {i}: expected a dict of model fields such as "
                        f"{{'model.d_model': 64, 'model.num_layers': 2}}, got {rung!r}.")
    if set(rung) != set(rungs[0]):
      raise ConfigError(f"ladder rung {i} sets {sorted(rung)}, rung 0 sets "
                        f"{sorted(rungs[0])}; every rung sets the same fields.")
    for field in rung:
      if not field.startswith("model."):
        raise ConfigError(f"ladder rung {i}: {field} is not a model field; a rung sets "
                          "the model's size (model.d_model, model.num_layers, "
                          "model.num_heads, model.d_ff, ...).")
  for i, rung in enumerate(rungs):
    if rung in rungs[:i]:
      raise ConfigError(f"ladder rung {i} {rung} repeats rung {rungs.index(rung)}; "
                        "each rung is another size.")
  budgets = list(ladder.tokens_per_param)
  if not budgets:
    raise ConfigError("ladder: no tokens_per_param; give the training lengths, such as "
                      "tokens_per_param=[10, 20].")
  for b in budgets:
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b <= 0:
      raise ConfigError(f"ladder tokens_per_param {b!r}: each must be a number > 0 "
                        "(tokens per non-embedding parameter; Chinchilla's optimum is "
                        "about 20).")
  if len(set(budgets)) != len(budgets):
    raise ConfigError(f"ladder tokens_per_param {budgets} repeats a value.")
  if not isinstance(ladder.share_tuning, bool):
    raise ConfigError(f"ladder share_tuning {ladder.share_tuning!r}: expected True (the "
                      "budgets of a rung and variant share one tuned value) or False "
                      "(each budget chooses its own).")
  return Ladder(tuple(rungs), tuple(float(b) for b in budgets), bool(ladder.branch),
                ladder.share_tuning)


@dataclasses.dataclass(frozen=True)
class PointCount:
  """One point of a laddered sweep: its model's counts and its budget."""
  key: tuple[int, ...]          # the point's index on every axis (rung, budget first)
  params: int                   # every parameter
  non_embedding_params: int     # without the token, position and type tables
  active_params: int            # those one token computes with (MoE: k of E experts)
  flops_per_token: int          # training FLOPs per token at train.seq_len
  steps: int                    # train.num_steps of the budget
  tokens: int                   # steps x batch x sequence length
  branch_step: int | None = None  # where the budget's decay branches (None: from scratch)

  @property
  def flops(self) -> float:
    """Training FLOPs of one run: tokens x FLOPs per token."""
    return float(self.tokens) * float(self.flops_per_token)


@serial.layout(omit_none=("corpus_tokens",), omit_default=("share_tuning",))
@dataclasses.dataclass(frozen=True)
class LadderPlan:
  """What the sweep resolved of its ladder (module docstring)."""
  fields: tuple[str, ...]               # the fields every rung sets
  rungs: tuple[dict[str, Any], ...]
  tokens_per_param: tuple[float, ...]
  rung_params: tuple[int, ...]          # each rung's non-embedding count that sets its tokens
  tokens_per_step: int                  # train.batch_size x train.seq_len
  points: tuple[PointCount, ...]
  corpus_tokens: int | None = None      # the training split's tokens (None: not known)
  branch: bool = False                  # budgets branch from a shared stable phase
  # The budgets of a (rung, variant) share one tuned value (``Ladder``);
  # written only where True, so a file from before it reads as False.
  share_tuning: bool = False

  def point(self, key: Sequence[int]) -> PointCount | None:
    """The counts of the point with this key (None: not a point of the plan)."""
    key = tuple(key)
    return next((p for p in self.points if p.key == key), None)

  def epochs(self, tokens: int) -> float | None:
    """Passes over the training split that ``tokens`` make (None: size unknown)."""
    return None if not self.corpus_tokens else tokens / self.corpus_tokens

  def steps_for(self, rung: int, budget: int) -> int:
    """``train.num_steps`` of a rung at a budget: its tokens per parameter x
    the rung's non-embedding count, in whole steps (at least one)."""
    return steps_for(self.tokens_per_param[budget], self.rung_params[rung],
                     self.tokens_per_step)


def steps_for(tokens_per_param: float, rung_params: int, tokens_per_step: int) -> int:
  """The steps of a budget: tokens per parameter x parameters / tokens per step,
  rounded to a whole step (at least one)."""
  return max(1, round(tokens_per_param * rung_params / tokens_per_step))


def branch_step(num_steps: int, decay_fraction: float) -> int:
  """The last step of a wsd run's stable phase, where its decay branches off:
  the decay's start as ``run.optim.resolve`` computes it."""
  return int(num_steps * (1.0 - decay_fraction))


def steps_saved(steps: Sequence[int], branch_steps: Sequence[int]) -> tuple[int, int]:
  """(steps trained without branching, with): every budget from scratch, or
  one trunk to the last branch point and each budget's decay from its own."""
  return sum(steps), max(branch_steps) + sum(s - b for s, b in zip(steps, branch_steps))
