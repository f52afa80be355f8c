"""Every shipped experiment declares valid sweeps: each variant's dry run
checks every run's config (fields, values, the model) without devices and
writes nothing."""

from __future__ import annotations

import os
import re

import pytest

from tfx_jax.sweep import cli
from helpers import ROOT

EXPERIMENTS = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))


def _variants(file: str) -> list[str]:
  return re.findall(r'variant == "(\w+)"', (ROOT / "experiments" / file).read_text())


CASES = [(f, v) for f in EXPERIMENTS for v in _variants(f)]


def test_every_experiment_has_a_tiny_and_a_default_variant():
  assert "stability.py" in EXPERIMENTS
  for file in EXPERIMENTS:
    assert {"tiny", "default"} <= set(_variants(file)), file


@pytest.mark.parametrize("file,variant", CASES, ids=[f"{f[:-3]}:{v}" for f, v in CASES])
def test_experiment_variant_is_a_valid_sweep(file, variant, capsys):
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    code = cli.main([f"experiments/{file}:{variant}", "--dry-run"])
  finally:
    os.chdir(cwd)
  out = capsys.readouterr().out
  assert code == 0, out
  assert re.search(r"\d+ runs", out) and "dry run: nothing written" in out
