"""A sweep's ladder resolved against its config: each point's parameter
counts and FLOPs per token, each budget's steps, tokens, epochs and branch
point (``records.ladder`` says what a ladder is), and the dry run's table.

Counts come from the model's shapes (``run.footprint``: ``jax.eval_shape``,
nothing allocated), the same ones ``python -m tfx_jax.summary`` prints. A
rung's non-embedding count is its model's parameters without the token,
position and type tables (Kaplan et al. 2020's N), at the base value of
every declared axis; its budgets' tokens are tokens per parameter x that
count, so the variants of a rung train on the same tokens.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import ladder as ladder_lib
from tfx_jax.records.ladder import Ladder, LadderPlan, PointCount
from tfx_jax.run.config_base import apply_overrides, find_field, load_config_file
from tfx_jax.sweep.spec import (Axis, format_value, ladder_axes, parse_axis_flag,
                               reference_index)

def _resolved(base_spec: str, overrides: Mapping[str, Any]):
  """The run config of ``base_spec`` with ``overrides`` (a ConfigError names a bad field)."""
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  config = load_config_file(base_spec)
  apply_overrides(config, dict(overrides))
  return config, run_config.resolve(config)


def _counts(run) -> tuple[int, int, int, int]:
  """(params, non-embedding params, active params, training FLOPs per token)."""
  from tfx_jax.run import footprint  # pylint: disable=import-outside-toplevel
  shapes = footprint.param_shapes(run.model)
  total = sum(math.prod(v.shape) for v in shapes.values())
  active = footprint.active_params(run.model, shapes)
  flops = footprint.flops_per_token(run.model, run.train.seq_len, shapes)["train"]
  return total, footprint.non_embedding_params(shapes), active, int(flops)


def corpus_tokens(config) -> int | None:
  """The training split's target tokens (None where they cannot be counted)."""
  from tfx_jax import tasks  # pylint: disable=import-outside-toplevel
  from tfx_jax.data import baselines  # pylint: disable=import-outside-toplevel
  from tfx_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  try:
    tok = tokenizer_lib.tokenizer_from_config(config.data)
    return baselines.target_tokens(config.data, tok, tasks.get(config.task).targets)
  except (ConfigError, OSError, ValueError, KeyError):
    return None


def plan(base_spec: str, overrides: Mapping[str, Any], ladder: Ladder,
         declared: Sequence[Axis], count_corpus: bool = True) -> LadderPlan:
  """The ladder of a sweep resolved (module docstring); a ConfigError (exit 2
  at ``--dry-run``) where a rung's field is no config field, two rungs have
  the same parameter count (a rung that does not change the size), or the
  warmup of a branched wsd ladder does not end before its first branch point."""
  ladder = ladder_lib.check_declaration(ladder)
  rung_axis, _ = ladder_axes(ladder)
  config, base_run = _resolved(base_spec, overrides)
  for field in rung_axis.fields:
    find_field(config, field)  # ConfigError naming the field and the choices
  fields = [f for a in declared for f in a.fields]
  base = {}
  for field in fields:
    node, key = find_field(config, field)
    base[field] = node[key]
  references = [reference_index(a, base) for a in declared]
  tokens_per_step = base_run.train.batch_size * base_run.train.seq_len
  counts: dict[tuple[int, tuple[int, ...]], tuple[int, int, int, int]] = {}
  combos = list(itertools.product(*(range(len(a.values)) for a in declared)))
  for ri, rung in enumerate(ladder.rungs):
    for combo in combos:
      point = dict(overrides)
      for axis, vi in zip(declared, combo):
        point.update(axis.values[vi])
      point.update(rung)
      try:
        _, run = _resolved(base_spec, point)
      except ConfigError as e:
        raise ConfigError(f"ladder rung {ri} {_text(rung)}: {e}") from None
      counts[ri, combo] = _counts(run)
  rung_params = tuple(counts[ri, tuple(references)][1] for ri in range(len(ladder.rungs)))
  for ri, n in enumerate(rung_params):
    if n in rung_params[:ri]:
      other = rung_params.index(n)
      raise ConfigError(
          f"ladder rung {ri} {_text(ladder.rungs[ri])} has {n:,} non-embedding parameters, "
          f"as rung {other} {_text(ladder.rungs[other])} has: a rung must change the "
          "model's size.")
  schedule = base_run.optim
  branch = ladder.branch and schedule.schedule == "wsd" and len(ladder.tokens_per_param) > 1
  points = []
  for ri in range(len(ladder.rungs)):
    for bi, tpp in enumerate(ladder.tokens_per_param):
      steps = ladder_lib.steps_for(tpp, rung_params[ri], tokens_per_step)
      at = ladder_lib.branch_step(steps, schedule.decay_fraction) if branch else None
      if at is not None and schedule.warmup_steps >= at:
        raise ConfigError(
            f"ladder rung {ri} at tokens_per_param {format_value(tpp)}: {steps} steps, whose "
            f"wsd decay starts at step {at}, not after optim.warmup_steps="
            f"{schedule.warmup_steps}; the budgets branch from a shared stable phase, so the "
            "warmup must end before the first branch point: lower optim.warmup_steps or "
            "raise the smallest tokens_per_param.")
      for combo in combos:
        total, non_embedding, active, flops = counts[ri, combo]
        points.append(PointCount((ri, bi, *combo), total, non_embedding, active, flops,
                                 steps, steps * tokens_per_step, at))
  corpus = corpus_tokens(base_run) if count_corpus else None
  return LadderPlan(fields=tuple(rung_axis.fields), rungs=tuple(dict(r) for r in ladder.rungs),
                    tokens_per_param=ladder.tokens_per_param, rung_params=rung_params,
                    tokens_per_step=tokens_per_step, points=tuple(points),
                    corpus_tokens=corpus, branch=branch, share_tuning=ladder.share_tuning)


def _text(rung: Mapping[str, Any]) -> str:
  return "{" + ", ".join(f"{k}={format_value(v)}" for k, v in rung.items()) + "}"


def _si(x: float) -> str:
  """3.2e+13 -> '3.2e13'; small counts as they are."""
  if x < 1e6:
    return f"{x:,.0f}"
  mantissa, exponent = f"{x:.2e}".split("e")
  return f"{mantissa}e{int(exponent)}"


def too_many_epochs(plan_: LadderPlan) -> str | None:
  """The warning of a ladder whose largest budget repeats the corpus more than
  ``MAX_EPOCHS`` times (None where it does not, or the corpus is not counted)."""
  worst = max(plan_.points, key=lambda p: p.tokens)
  epochs = plan_.epochs(worst.tokens)
  if epochs is None or epochs <= ladder_lib.MAX_EPOCHS:
    return None
  ri, bi = worst.key[:2]
  return (f"warning: rung {ri} {_text(plan_.rungs[ri])} at tokens_per_param "
          f"{format_value(plan_.tokens_per_param[bi])} trains on {worst.tokens:,} tokens, "
          f"{epochs:.1f} epochs of the training split ({plan_.corpus_tokens:,} tokens), more "
          f"than {ladder_lib.MAX_EPOCHS:g}: repeated data lowers the loss less than fresh "
          "data (Muennighoff et al. 2023), so the largest rungs' fits bend; use a larger "
          "corpus (data.name) or smaller budgets.")


def table(plan_: LadderPlan) -> list[str]:
  """The dry run's lines: each rung at each budget (counts at the base
  variant; each variant's FLOPs per token where they differ), the branch
  points and the steps branching saves, and whether the budgets share their
  tuned value."""
  lines = [f"  ladder: {len(plan_.rungs)} rungs x {len(plan_.tokens_per_param)} budgets "
           f"(tokens per non-embedding parameter: "
           f"{', '.join(format_value(t) for t in plan_.tokens_per_param)}); "
           f"{plan_.tokens_per_step:,} tokens per step; training split "
           + (f"{plan_.corpus_tokens:,} tokens" if plan_.corpus_tokens else "not counted")]
  header = ["rung", *(f.removeprefix("model.") for f in plan_.fields), "non-emb params",
            "params", "FLOPs/token", "tokens/param", "steps", "tokens", "epochs", "FLOPs",
            "branch at"]
  rows = [header]
  by_rung: dict[int, list[PointCount]] = {}
  for p in plan_.points:
    by_rung.setdefault(p.key[0], []).append(p)
  for ri, rung in enumerate(plan_.rungs):
    base = min(by_rung[ri], key=lambda p: p.key[2:])  # the base variant's counts
    flops = sorted({p.flops_per_token for p in by_rung[ri]})
    for bi, tpp in enumerate(plan_.tokens_per_param):
      p = next(q for q in by_rung[ri] if q.key[1] == bi and q.key[2:] == base.key[2:])
      epochs = plan_.epochs(p.tokens)
      rows.append([str(ri), *(format_value(rung[f]) for f in plan_.fields),
                   f"{plan_.rung_params[ri]:,}", f"{base.params:,}",
                   "/".join(f"{f:,}" for f in flops), format_value(tpp), f"{p.steps:,}",
                   f"{p.tokens:,}", "-" if epochs is None else f"{epochs:.2f}",
                   _si(p.flops), "-" if p.branch_step is None else f"{p.branch_step:,}"])
  widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
  lines += ["    " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
  if any(len({p.flops_per_token for p in by_rung[ri]}) > 1 for ri in by_rung):
    lines.append("    (FLOPs/token: each variant's where they differ, in axis order; the "
                 "FLOPs column is the base variant's; a variant's runs train on the same "
                 "tokens)")
  if plan_.branch:
    without = with_ = 0
    for ri in range(len(plan_.rungs)):
      rows = sorted({(p.key[1], p.steps, p.branch_step) for p in by_rung[ri]})
      a, b = ladder_lib.steps_saved([s for _, s, _ in rows], [at for *_, at in rows])
      without, with_ = without + a, with_ + b
    lines.append(f"  branched budgets: per (variant, tuned value, seed), {with_:,} steps "
                 f"trained with branching against {without:,} without "
                 f"({without - with_:,} saved, {1 - with_ / without:.0%}): one trunk per rung "
                 "trains to its last branch point, each budget's decay runs from its own")
  else:
    lines.append("  budgets run from scratch (Ladder(branch=False) or --no-branch; branching "
                 "also needs optim.schedule=wsd and >= 2 budgets)")
  if plan_.share_tuning:
    lines.append("  shared tuning (Ladder(share_tuning=True) or --share-tuning): the budgets "
                 "of each rung and variant share one tuned value, the one with the lowest "
                 "mean validation score over the budgets, so their confirmation runs "
                 + ("branch from one trunk" if plan_.branch else "run at one value"))
  warning = too_many_epochs(plan_)
  if warning:
    lines.append("  " + warning)
  return lines


LADDER_FORM = ("--ladder 'model.d_model=64,128,256;model.num_heads=2,4,8' "
               "--tokens-per-param 10,20")


def parse_flags(ladder: str | None, tokens_per_param: str | None
                       ) -> Ladder:
  """``--ladder`` and ``--tokens-per-param`` -> ``Sweep.ladder`` (values are
  strings here; the sweep coerces them to the fields' types)."""
  if not ladder or not tokens_per_param:
    given, missing = (("--ladder", "--tokens-per-param") if ladder
                      else ("--tokens-per-param", "--ladder"))
    raise ConfigError(f"{given} needs {missing}: a ladder is its rungs and its budgets, "
                      f"e.g. {LADDER_FORM}.")
  try:
    fields = parse_axis_flag(ladder)
  except ConfigError as e:
    raise ConfigError(f"--ladder: {e} Expected {LADDER_FORM}.") from None
  lengths = {len(v) for v in fields.values()}
  if len(lengths) > 1:
    raise ConfigError(f"--ladder {ladder!r}: zipped fields need one number of values, got "
                      + ", ".join(f"{k}: {len(v)}" for k, v in fields.items()) + ".")
  try:
    budgets = [float(t) for t in tokens_per_param.split(",") if t.strip()]
  except ValueError:
    raise ConfigError(f"--tokens-per-param={tokens_per_param!r}: expected numbers such as "
                      "10,20.") from None
  rungs = [dict(zip(fields, values)) for values in zip(*fields.values())]
  return Ladder(rungs=rungs, tokens_per_param=budgets)
