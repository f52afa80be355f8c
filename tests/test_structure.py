"""The package's structure: the import graph of ``tfx_jax`` has no cycle,
between modules or between packages.

The graph is built from the source with ``ast``, so function-local imports
count as much as module-level ones, and importing a submodule counts as
importing its parent packages (Python runs their ``__init__`` first). In the
package graph each subpackage (``tfx_jax.data``, ``tfx_jax.sweep``, ...) is
one node and each top-level module another: a subpackage that imports a
module which imports the subpackage back is a cycle even when no two modules
form one.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfx_jax"


def module_files() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _with_parents(name: str, modules) -> list[str]:
  """``a.b.c`` -> the existing modules among a.b.c, a.b (a is the root: skipped)."""
  parts = name.split(".")
  return [".".join(parts[:i]) for i in range(len(parts), 1, -1)
          if ".".join(parts[:i]) in modules]


@functools.cache  # the source does not change during a session; callers only read it
def import_graph() -> dict[str, set[str]]:
  """{module: the tfx_jax modules it imports anywhere in its source}."""
  modules = module_files()
  graph = {}
  for name, path in modules.items():
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      targets = []
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(anchor + ([base] if base else []))
        # `from pkg import mod` imports the module pkg.mod; else a name of pkg.
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
      for target in targets:
        if target.split(".")[0] == "tfx_jax":
          # The packages that hold this module ran their __init__ before it:
          # importing a sibling (tfx_jax.hf.rules from tfx_jax.hf.llama) does not
          # run tfx_jax.hf again, so it is no edge to it; a name read from it
          # (`from tfx_jax.hf import X`, target tfx_jax.hf itself) still is.
          edges.update(m for m in _with_parents(target, modules) if m != name and (
              m == target or not name.startswith(m + ".")))
    graph[name] = edges
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle as [a, b, ..., a], or None (depth-first search)."""
  state: dict[str, int] = {}  # 1 on the current path, 2 done
  path: list[str] = []

  def visit(node):
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_the_cycle_finder_finds_cycles():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_graph_sees_function_local_and_parent_package_imports(tmp_path):
  graph = import_graph()
  # run_setup imports the data pipeline at module level; the trainer the
  # run setup; the evaluate command loads runs inside main().
  assert "tfx_jax.data.pipeline" in graph["tfx_jax.run.setup"]
  assert "tfx_jax.data" in graph["tfx_jax.run.setup"]  # the parent package
  assert "tfx_jax.run.setup" in graph["tfx_jax.run.trainer"]
  assert "tfx_jax.run.trained_run" in graph["tfx_jax.evaluate"]  # a local import


def test_tfx_jax_import_graph_is_acyclic():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def package_of(module: str) -> str:
  """``tfx_jax.data.rows`` -> ``tfx_jax.data``; top-level modules are their own."""
  parts = module.split(".")
  return ".".join(parts[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The module graph with every subpackage collapsed to one node."""
  out: dict[str, set[str]] = {}
  for module, targets in graph.items():
    node = package_of(module)
    out.setdefault(node, set()).update(
        package_of(t) for t in targets if package_of(t) != node)
  return out


def test_the_package_graph_sees_a_loop_through_a_subpackage():
  modules = {"tfx_jax.data.pipeline": {"tfx_jax.tasks"},
             "tfx_jax.tasks": {"tfx_jax.data.rows"}, "tfx_jax.data.rows": set()}
  assert find_cycle(modules) is None  # no loop between modules...
  assert find_cycle(package_graph(modules)) == [  # ...but one between packages
      "tfx_jax.data", "tfx_jax.tasks", "tfx_jax.data"]


def test_tfx_jax_package_graph_is_acyclic():
  cycle = find_cycle(package_graph(import_graph()))
  assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


@pytest.mark.parametrize("lower, upper", [
    ("tfx_jax.run.config", "tfx_jax.run.setup"),
    ("tfx_jax.run.config", "tfx_jax.run.trainer"),
    ("tfx_jax.data.pipeline", "tfx_jax.tasks"),
    ("tfx_jax.run.setup", "tfx_jax.run.trainer"),
    ("tfx_jax.run.setup", "tfx_jax.run.scoring"),
    ("tfx_jax.run.setup", "tfx_jax.run.trained_run"),
    ("tfx_jax.tasks", "tfx_jax.run.setup"),
    ("tfx_jax.core.errors", "tfx_jax.model.config"),
])
def test_run_semantics_sit_below_the_commands(lower, upper):
  """The lower module never reaches the upper one, directly or through others."""
  graph = import_graph()
  seen, todo = set(), [lower]
  while todo:
    node = todo.pop()
    for nxt in graph.get(node, ()):
      if nxt not in seen:
        seen.add(nxt)
        todo.append(nxt)
  assert upper not in seen


# ------------------------------------------------------------------ floors
# Each package of tfx_jax stands on a floor; a package imports only packages on
# lower floors, so an arrow back up (or sideways) fails the suite. The commands
# (the modules at the top level, ``python -m tfx_jax.<command>``) stand above
# every package. ``tfx_jax/__init__.py`` imports ``core.host`` only.
FLOORS = {
    "core": 0,     # errors, atomic files, typed config sections, flags, preemption, host
    "records": 1,  # what runs and sweeps write to disk (status.json, sweep.json)
    "data": 1,     # datasets, tokenizers, the input pipeline
    "model": 2,    # model config, families, blocks, decoding, logical axes, layers/
    "tasks": 3,    # the task registry: losses, metrics, text in and out of a run
    "hf": 3,       # Hugging Face architecture maps
    "run": 4,      # one run: config, setup, training loop, optimizers, checkpoints, ...
    "scale": 5,    # FLOPs, rooflines, TPU topologies and compile plans
    "report": 6,   # a sweep's report
    "sweep": 7,    # sweeps: the record, the executors, the stages
}
COMMANDS = {"train", "evaluate", "generate", "summary", "convert", "compile"}
COMMAND_FLOOR = max(FLOORS.values()) + 1


def floor_of(module: str) -> tuple[str, int]:
  """(the package or command a module belongs to, its floor)."""
  parts = module.split(".")
  if len(parts) == 1:
    return "tfx_jax", -1  # the root package: checked on its own below
  name = parts[1]
  if name in FLOORS:
    return name, FLOORS[name]
  assert name in COMMANDS, f"{module}: neither a package with a floor nor a command"
  return name, COMMAND_FLOOR


def test_the_top_level_holds_only_commands():
  top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
  assert top == COMMANDS, f"library modules at the top level: {sorted(top - COMMANDS)}"
  packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
  assert packages == set(FLOORS), f"packages without a floor: {sorted(packages - set(FLOORS))}"


def test_every_import_goes_down_a_floor():
  wrong = []
  for module, targets in import_graph().items():
    here, level = floor_of(module)
    for target in targets:
      there, target_level = floor_of(target)
      if module == "tfx_jax":
        if target != "tfx_jax.core" and not target.startswith("tfx_jax.core."):
          wrong.append(f"{module} -> {target} (the root imports core only)")
      elif there != here and not target_level < level:
        wrong.append(f"{module} ({here}, floor {level}) -> {target} ({there}, floor {target_level})")
  assert not wrong, "imports that do not go down a floor:\n" + "\n".join(sorted(wrong))


def test_the_floor_check_sees_an_arrow_back_up(monkeypatch):
  planted = {"tfx_jax.model.families": {"tfx_jax.run.setup"}}
  monkeypatch.setattr(__import__(__name__), "import_graph", lambda: planted)
  with pytest.raises(AssertionError, match="tfx_jax.model.families"):
    test_every_import_goes_down_a_floor()


MAX_LINES = 600


def test_no_module_holds_several_jobs():
  """A module past 600 lines is a sign that one file holds several jobs
  (STYLE.md): split it by responsibility."""
  long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
          if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines: {long}"
