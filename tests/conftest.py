"""Test-session setup. It starts nothing itself: the one-node SLURM cluster
is a fixture (``slurm_cluster.py``) that only the tests which use it start.

``./launch.sh test`` runs the suite on every core with pytest-xdist
(``-n auto --dist loadgroup``). Tests are spread one by one, except those that
share something costly: the tests of a file with a module-scoped fixture (a
trained run, a compilation cache) stay together on one worker, so the
fixture is built once, and the tests that use the SLURM cluster share one
worker, so one cluster is started.
"""

import pytest

pytest_plugins = ["slurm_cluster"]


def _shares_a_module_fixture(item) -> bool:
  defs = item._fixtureinfo.name2fixturedefs  # pylint: disable=protected-access
  return any(d.scope == "module" for chain in defs.values() for d in chain)


def pytest_collection_modifyitems(config, items):
  for item in items:
    if "slurm_cluster" in item.fixturenames:
      item.add_marker(pytest.mark.xdist_group("slurm"))
    elif _shares_a_module_fixture(item):
      item.add_marker(pytest.mark.xdist_group(item.module.__name__))
