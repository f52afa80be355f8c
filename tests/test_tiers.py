"""The fast tier (``--fast``, conftest.py) tells the tests that train or start
processes from the pure ones by what they call."""

from __future__ import annotations

import subprocess
import sys

import conftest
import helpers
from helpers import train


def _pure():
  return sum(range(3))


def _trains_by_name(workdir):
  return train("lm.py:tiny", workdir)


def _trains_through_the_module(workdir):
  return helpers.train_cli("lm.py:tiny", workdir)


def _trains_through_a_helper_of_its_module(workdir):
  return [_pure(), _trains_by_name(workdir)]


def _starts_a_process():
  return subprocess.run([sys.executable, "-c", "pass"], check=True)


def _imports_the_trainer(config, workdir):
  from tfx_jax.run import trainer  # pylint: disable=import-outside-toplevel
  return trainer.train_and_evaluate(config, workdir)


def _lambda_that_trains():
  return lambda workdir: train("lm.py:tiny", workdir)


# Held in a dict, so that the test below is not itself read as calling them.
SAMPLES = {"pure": [_pure],
           "trains": [_trains_by_name, _trains_through_the_module,
                      _trains_through_a_helper_of_its_module, _starts_a_process,
                      _imports_the_trainer, _lambda_that_trains]}


def test_a_test_is_fast_unless_it_calls_what_trains_or_starts_processes():
  for func in SAMPLES["pure"]:
    assert not conftest._trains(func, set()), func.__name__
  for func in SAMPLES["trains"]:
    assert conftest._trains(func, set()), func.__name__
