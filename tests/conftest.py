"""Test-session setup. It starts nothing itself: the one-node SLURM cluster
is a fixture (``slurm_cluster.py``) that only the tests which use it start.

``./launch.sh test`` runs the suite on every core with pytest-xdist
(``-n auto --dist loadgroup``). A file's tests run together on one worker:
a module-scoped fixture (a trained run, a compilation cache) is then built
once, and so is what the file's tests compile alike (JAX compiles each
operation once per shape and process, and most files run many small models
of one shape).

The files whose tests start several busy processes at once (sweeps with
``--parallel 2``, two-process runs, 8-device meshes) mark themselves
``xdist_group("processes")`` and run one after another on one worker: two of
them at once would put four busy processes on 2 cores. That group holds the
tests that use the SLURM cluster, so one cluster is started; a file that uses
it without the mark forms the "slurm" group.

The files that train tiny runs share one persistent JAX compilation cache per
pytest process (``jax_cache_dir``): each turns it on for its own tests with
``pytest.mark.usefixtures("shared_compilation_cache")``, and hands the
directory to its training subprocesses (``helpers.subprocess_env``), so that a
step compiled once by any of them is read back by the others.
"""

import pytest

from helpers import compilation_cache

pytest_plugins = ["slurm_cluster"]


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory):
  """The compilation cache's directory: one per pytest process (per xdist
  worker), under its base temporary directory."""
  return tmp_path_factory.getbasetemp() / "jax_cache"


@pytest.fixture(scope="module")
def shared_compilation_cache(jax_cache_dir):
  """JAX's persistent compilation cache in ``jax_cache_dir``, on for one file's
  tests, in this process and in the training command run in it (``run_cli``
  reads ``TFX_JAX_COMPILATION_CACHE``); yields the directory.

  The directory lasts the session; the cache is on only while a file that asks
  for it runs, so that the other files' compiled programs are not written to
  disk.
  """
  with compilation_cache(jax_cache_dir), pytest.MonkeyPatch.context() as patch:
    patch.setenv("TFX_JAX_COMPILATION_CACHE", str(jax_cache_dir))
    yield jax_cache_dir


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the markers
def pytest_collection_modifyitems(config, items):
  on_slurm = {item.module.__name__ for item in items if "slurm_cluster" in item.fixturenames}
  for item in items:
    if item.get_closest_marker("xdist_group") is not None:
      continue  # the file chose its group
    module = item.module.__name__
    item.add_marker(pytest.mark.xdist_group("slurm" if module in on_slurm else module))
