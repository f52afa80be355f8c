"""experiments/attention.py holds what its docstring says it holds equal: the
kv variant's points at the base's parameters, and its MLA at grouped
attention's cache bytes."""

from __future__ import annotations

import runpy

from tfx_jax.model import budgets
from helpers import ROOT

ATTENTION = runpy.run_path(str(ROOT / "experiments" / "attention.py"))
LM = ATTENTION["_lm_configs"]()


def _run(overrides):
  return LM._resolved("tiny", overrides)  # pylint: disable=protected-access


def test_mla_at_gqa_caches_what_gqa_caches():
  _, gqa, mqa, mla, mla_small = ATTENTION["kv_points"]()
  kv = lambda p: budgets.kv_cache_bytes_per_token(_run(p).model)
  assert kv(mla_small) == kv(gqa) == kv({}) // 2
  assert kv(mqa) < kv(mla_small) < kv(mla) < kv({})


def test_kv_and_hybrid_points_match_the_base_parameters():
  for common, points in (({}, ATTENTION["kv_points"]()),
                         (ATTENTION["DEEP"], ATTENTION["hybrid_points"]())):
    target = LM._budget(_run(common), "params")  # pylint: disable=protected-access
    for point in points:
      got = LM._budget(_run({**common, **point}), "params")  # pylint: disable=protected-access
      assert abs(got / target - 1) <= LM.MATCH_TOLERANCE, (point, got, target)
