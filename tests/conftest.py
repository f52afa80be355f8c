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

The fast tier (``pytest --fast``, ``./launch.sh test --fast``): the tests of
pure functions and formulas, which neither train nor start processes. A test
is left out of it when it is marked ``slow``, uses a fixture that trains or
starts processes (``shared_compilation_cache``, ``slurm_cluster``, or one
whose code does, as below), or calls, itself or through a function of its
module, a helper marked ``helpers.trains``, the trainer's
``train_and_evaluate``, or ``subprocess``/``multiprocessing`` (``_trains``
reads the calls from the code). A new test lands in its tier by what it
calls; a pure one that still takes more than a few seconds is marked slow
(those of the fast tier that took more than ``FAST_SECONDS`` are named at the
end of a ``--fast`` run).
"""

import dis
import inspect
import multiprocessing
import pathlib
import subprocess
import types

import pytest

from helpers import compilation_cache

pytest_plugins = ["slurm_cluster"]

TESTS = pathlib.Path(__file__).resolve().parent
# What keeps a test out of the fast tier (besides the helpers marked ``trains``).
TRAINING_FIXTURES = {"shared_compilation_cache", "slurm_cluster"}
PROCESS_MODULES = {subprocess, multiprocessing}
TRAINING_NAMES = {"train_and_evaluate", "subprocess", "multiprocessing"}
# A fast-tier test that takes longer (its setup or its call) is named at the end
# of a --fast run: marked slow if it is slow by itself (the first test of a file
# may pay for compilations its neighbours then share).
FAST_SECONDS = 5.0
_over_time: list[tuple[str, float]] = []


def pytest_addoption(parser):
  parser.addoption("--fast", action="store_true",
                   help="run the fast tier only: no test that trains, starts processes or "
                        "is marked slow (tests/conftest.py)")


def pytest_runtest_logreport(report):
  if report.when in ("setup", "call") and report.duration > FAST_SECONDS:
    _over_time.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter, config):
  if config.getoption("fast") and _over_time:
    terminalreporter.write_sep("-", f"fast-tier tests over {FAST_SECONDS:g} s (slow by "
                                    "themselves: mark them slow)")
    for nodeid, seconds in sorted(_over_time, key=lambda t: -t[1]):
      terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")


def _codes(code: types.CodeType):
  """``code`` and the code nested in it (lambdas, comprehensions, inner functions)."""
  yield code
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      yield from _codes(const)


def _trains(func, seen: set) -> bool:
  """Whether ``func`` (a test, a fixture, a function of a test module) calls
  something that trains or starts processes, itself or through a function
  of its own module."""
  func = inspect.unwrap(func)
  if func in seen or not isinstance(func, types.FunctionType):
    return False
  seen.add(func)
  module = inspect.getmodule(func)
  names = vars(module) if module is not None else {}
  for code in _codes(func.__code__):
    module_loaded = None  # the module a global just loaded names (``helpers.train``)
    for ins in dis.get_instructions(code):
      if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_NAME", "IMPORT_FROM"):
        attribute = getattr(module_loaded, str(ins.argval), None)
        if (str(ins.argval).split(".")[0] in TRAINING_NAMES
            or getattr(attribute, "trains", False) is True):
          return True
      value = names.get(ins.argval) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") else None
      module_loaded = value if isinstance(value, types.ModuleType) else None
      if getattr(value, "trains", False) is True or any(value is m for m in PROCESS_MODULES):
        return True
      if (isinstance(value, types.FunctionType) and value.__module__ == func.__module__
          and _trains(value, seen)):
        return True
  return False


def _fast(item) -> bool:
  """Whether a collected test belongs to the fast tier (the module docstring)."""
  if item.get_closest_marker("slow") is not None:
    return False
  if TRAINING_FIXTURES & set(item.fixturenames):
    return False
  seen = set()
  fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
              if TESTS in pathlib.Path(inspect.getfile(d.func)).resolve().parents]
  return not any(_trains(f, seen) for f in [item.function, *fixtures])


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
  if config.getoption("fast"):
    slow = [item for item in items if not _fast(item)]
    if slow:
      config.hook.pytest_deselected(items=slow)
      left = set(slow)
      items[:] = [item for item in items if item not in left]
  on_slurm = {item.module.__name__ for item in items if "slurm_cluster" in item.fixturenames}
  for item in items:
    if item.get_closest_marker("xdist_group") is not None:
      continue  # the file chose its group
    module = item.module.__name__
    item.add_marker(pytest.mark.xdist_group("slurm" if module in on_slurm else module))
