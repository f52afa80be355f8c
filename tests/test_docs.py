"""README.md and docs/*.md against the code they quote.

Every ``python -m tfx_jax.<command> ...`` and ``./launch.sh <cmd> ...`` quoted
in a code block or in inline code is checked, without training or compiling,
against the parser the command really uses: the module exists; each
``--flag`` is one the command defines (the absl ``FLAGS`` of train, evaluate,
generate, summary, compile and data.prepare; the argparse parsers of sweep,
report and convert, which parse the quoted arguments); each
``--config.a.b=v`` override is a field of the config it applies to, with a
value of the field's type (``run/config_base.py``'s ``find_field`` and
``coerce``); every ``configs/<file>.py:<preset>`` and
``experiments/<file>.py:<variant>`` named loads. Every relative link, and
every ``#anchor``, points to an existing file and heading.

A quoted command may elide (``...``, ``ARGS...``), offer alternatives
(``[--greedy | --beam_size 4]``: every flag in them is checked) or name
placeholders (``runs/NAME``, ``experiments/<name>.py``): what it elides or
leaves open is not checked, everything it does say is.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import pathlib
import re
import shlex

import pytest
from absl import flags

from tfx_jax.core.errors import ConfigError
from tfx_jax.run import config_base

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
COMMAND_START = re.compile(r"^(python -m tfx_jax\.|\./launch\.sh\s)")
CONFIG_SPEC = re.compile(r"^configs/\w+\.py(:\w+)?$")
SWEEP_SPEC = re.compile(r"^experiments/\w+\.py(:\w+)?$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# ./launch.sh's commands that run a python -m tfx_jax.<command> with the rest of
# their arguments (srun-train adds --distributed).
LAUNCHED = {"train": "train", "srun-train": "train", "sweep": "sweep",
            "report": "report", "compile": "compile"}


def _logical_lines(block: str) -> list[str]:
  """A code block's lines, each backslash continuation joined to its line."""
  lines, current = [], ""
  for line in block.splitlines():
    if line.rstrip().endswith("\\"):
      current += line.rstrip()[:-1] + " "
    else:
      lines.append(current + line)
      current = ""
  return lines + ([current] if current else [])


def quoted_commands(text: str) -> list[str]:
  """The commands quoted in a markdown text: code-block lines and inline code
  that start with ``python -m tfx_jax.`` or ``./launch.sh``."""
  commands = []
  for block in FENCE.findall(text):
    for line in _logical_lines(block.split("\n", 1)[1].rsplit("```", 1)[0]):
      line = line.strip()
      if COMMAND_START.match(line):
        commands.append(line)
  for span in INLINE.findall(FENCE.sub("", text)):
    span = " ".join(span.split())
    if COMMAND_START.match(span):
      commands.append(span)
  return commands


def _placeholder(token: str) -> bool:
  return "<" in token or "..." in token or token.isupper()


def _tokens(command: str) -> tuple[list[str], bool]:
  """(the command's words with alternatives' brackets and bars removed and
  elisions dropped, whether it elides or names a placeholder)."""
  words = shlex.split(command, comments=True)
  tokens, open_ended = [], False
  for word in words:
    if word in ("|", "[", "]"):
      continue
    if word.startswith("["):
      word = word[1:]
    if word.endswith("]"):
      word = word[:-1]
    if word.endswith("..."):
      open_ended = True
      continue
    open_ended |= _placeholder(word.split("=", 1)[-1])
    tokens.append(word)
  return tokens, open_ended


def _check_specs(tokens: list[str]) -> list[str]:
  """Every configs/<file>.py:<preset> and experiments/<file>.py:<variant> loads."""
  problems = []
  for token in tokens:
    spec = token.split("=", 1)[-1]
    try:
      if CONFIG_SPEC.match(spec):
        config_base.load_config_file(spec)
      elif SWEEP_SPEC.match(spec):
        from tfx_jax.sweep import spec as spec_lib  # pylint: disable=import-outside-toplevel
        spec_lib.load_experiment(spec)
    except ConfigError as e:
      problems.append(f"{spec}: {e}")
  return problems


def _check_overrides(config_spec: str | None, overrides: dict[str, str]) -> list[str]:
  """Each --config.a.b=v is a field of the config, with a value of its type."""
  if not overrides or not config_spec or not CONFIG_SPEC.match(config_spec):
    return []
  try:
    config = config_base.load_config_file(config_spec)
  except ConfigError:
    return []  # reported by _check_specs
  problems = []
  for path, value in overrides.items():
    try:
      config_base.find_field(config, path)
      if not _placeholder(value):
        config_base.coerce(config, path, value)
    except ConfigError as e:
      problems.append(f"--config.{path}: {e}")
  return problems


def _overrides(tokens: list[str]) -> tuple[list[str], dict[str, str]]:
  rest, overrides = [], {}
  for token in tokens:
    if token.startswith("--config."):
      path, _, value = token[len("--config."):].partition("=")
      overrides[path] = value
    else:
      rest.append(token)
  return rest, overrides


def _absl_problems(module, name: str, tokens: list[str], open_ended: bool) -> list[str]:
  """Flags of an absl command: each one of its FLAGS (or --noBOOL)."""
  flag_values: flags.FlagValues = module.FLAGS
  rest, overrides = _overrides(tokens)
  problems, config_spec = [], None
  for i, token in enumerate(rest):
    if not token.startswith("--"):
      continue
    flag, eq, value = token[2:].partition("=")
    if flag == "config":
      config_spec = value if eq else (rest[i + 1] if i + 1 < len(rest) else None)
    known = flag in flag_values or (
        flag.startswith("no") and flag[2:] in flag_values
        and isinstance(flag_values[flag[2:]], flags.BooleanFlag))
    if not known:
      problems.append(f"--{flag} is not a flag of python -m {name}")
    if flag == "evaluate" and eq:  # train's --evaluate="evaluate's arguments"
      problems += check_command(f"python -m tfx_jax.evaluate --workdir W {value}")
  if overrides and "config" not in flag_values:
    problems.append(f"python -m {name} takes no --config.* overrides")
  return problems + _check_overrides(config_spec, overrides)


class _Parsed(Exception):
  """Raised instead of running the command once its parser has parsed."""

  def __init__(self, namespace):
    super().__init__("parsed")
    self.namespace = namespace


@contextlib.contextmanager
def _parse_only():
  """Every argparse parser parses as it would, then stops the command."""
  original = argparse.ArgumentParser.parse_args

  def parse_args(self, args=None, namespace=None):
    raise _Parsed(original(self, args, namespace))

  argparse.ArgumentParser.parse_args = parse_args
  try:
    yield
  finally:
    argparse.ArgumentParser.parse_args = original


def _argparse_problems(module, name: str, tokens: list[str],
                       open_ended: bool) -> list[str]:
  """Arguments of an argparse command, parsed by its own parser; for the sweep
  also its --config.* overrides, --axis and --tune fields against its config."""
  stderr = io.StringIO()
  try:
    with _parse_only(), contextlib.redirect_stderr(stderr):
      module.main(list(tokens))
  except _Parsed as parsed:
    args = parsed.namespace
  except SystemExit:
    return [f"python -m {name} {shlex.join(tokens)}: {stderr.getvalue().strip()}"]
  except ConfigError as e:
    return [f"python -m {name} {shlex.join(tokens)}: {e}"]
  else:
    return [f"python -m {name}: its parser was never called"]
  if name != "tfx_jax.sweep" or open_ended:
    return []
  from tfx_jax.sweep import cli, spec as spec_lib  # pylint: disable=import-outside-toplevel
  _, overrides = cli.split_overrides(list(tokens))
  try:
    sweep = cli.declared_sweep(args, overrides)
  except ConfigError as e:
    return [f"python -m {name} {shlex.join(tokens)}: {e}"]
  problems = _check_overrides(sweep.config, overrides)
  # An axis's values are each an override of its field; a tuned field's grid
  # is read by the sweep, its path checked here.
  for text in args.axis:
    for path, values in spec_lib.parse_axis_flag(text).items():
      for value in values:
        problems += _check_overrides(sweep.config, {path: value})
  for path in spec_lib.parse_tune_flags(args.tune):
    problems += _check_overrides(sweep.config, {path: "..."})
  return sorted(set(problems))


def _launch_commands() -> set[str]:
  text = (ROOT / "launch.sh").read_text()
  case = text.split('case "${1:-}" in', 1)[1]
  labels = re.findall(r"^  ([\w|-]+)\)$", case, flags=re.M)
  return {name for label in labels for name in label.split("|")}


def check_command(command: str) -> list[str]:
  """What is wrong with a quoted command (empty: nothing found)."""
  tokens, open_ended = _tokens(command)
  if tokens[0] == "./launch.sh":
    sub = tokens[1] if len(tokens) > 1 else ""
    if sub not in _launch_commands():
      return [f"./launch.sh has no command {sub!r}"]
    if sub not in LAUNCHED:
      return []
    extra = ["--distributed"] if sub == "srun-train" else []
    tokens = ["python", "-m", f"tfx_jax.{LAUNCHED[sub]}", *extra, *tokens[2:]]
  name, args = tokens[2], tokens[3:]
  problems = _check_specs(args)
  target = name
  if importlib.util.find_spec(name) is None:
    return problems + [f"python -m {name}: no such module"]
  if importlib.util.find_spec(name).submodule_search_locations is not None:
    target = f"{name}.__main__"
    if importlib.util.find_spec(target) is None:
      return problems + [f"python -m {name}: a package without __main__"]
  module = importlib.import_module(target)
  if isinstance(getattr(module, "FLAGS", None), flags.FlagValues):
    return problems + _absl_problems(module, name, args, open_ended)
  if hasattr(module, "main"):
    return problems + _argparse_problems(module, name, args, open_ended)
  return problems + [f"python -m {name}: neither absl FLAGS nor a main()"]


QUOTED = [(page.relative_to(ROOT).as_posix(), command)
          for page in PAGES for command in quoted_commands(page.read_text())]


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch):
  """Relative paths (configs/, experiments/) as a reader runs them: from the root."""
  monkeypatch.chdir(ROOT)


def test_the_pages_quote_commands():
  pages = {page for page, _ in QUOTED}
  assert {"README.md", "docs/sweeps.md", "docs/scale.md"} <= pages, sorted(pages)
  assert len(QUOTED) > 40, len(QUOTED)


@pytest.mark.parametrize("page,command", QUOTED, ids=[f"{p}:{c[:60]}" for p, c in QUOTED])
def test_every_quoted_command_parses(page, command):
  assert check_command(command) == [], page


@pytest.mark.parametrize("command,wrong", [
    ("python -m tfx_jax.train --config configs/lm.py:tiny --workdir w --num_steps 3",
     "--num_steps is not a flag"),
    ("python -m tfx_jax.train --config configs/lm.py:tiny --workdir w "
     "--config.model.nrom=rms", "'model.nrom' is not a config field"),
    ("python -m tfx_jax.train --config configs/lm.py:tiny --workdir w "
     "--config.train.num_steps=many", "is not a valid int"),
    ("python -m tfx_jax.train --config configs/lm.py:huge --workdir w", "huge"),
    ("python -m tfx_jax.evaluate --workdir w [--split test | --beam 4]", "--beam is not a flag"),
    ("python -m tfx_jax.train --config ... --workdir w --evaluate='--splitt test'",
     "--splitt is not a flag of python -m tfx_jax.evaluate"),
    ("python -m tfx_jax.sweep experiments/activations.py:tiny --paralel 2",
     "unrecognized arguments: --paralel"),
    ("python -m tfx_jax.sweep experiments/activations.py:tinny --dry-run",
     "unknown variant 'tinny'"),
    ("python -m tfx_jax.sweep --config configs/lm.py:tiny --axis model.activaton=relu,swiglu",
     "'model.activaton' is not a config field"),
    ("python -m tfx_jax.sweep experiments/moe.py --config.optim.lerning_rate=1e-3",
     "'optim.lerning_rate' is not a config field"),
    ("python -m tfx_jax.report runs/x --equivalence-margin", "expected one argument"),
    ("python -m tfx_jax.convert from-hf --hf_dir d --workdir w",
     "the following arguments are required: --hf-dir"),
    ("python -m tfx_jax.trian --config configs/lm.py:tiny", "no such module"),
    ("./launch.sh trian --config configs/lm.py:tiny", "no command 'trian'"),
    ("./launch.sh sweep experiments/activations.py:tiny --paralel 2",
     "unrecognized arguments: --paralel"),
])
def test_the_checker_finds_a_planted_mistake(command, wrong):
  problems = check_command(command)
  assert any(wrong in problem for problem in problems), problems


def test_the_checker_passes_a_right_command():
  assert check_command(
      "python -m tfx_jax.sweep --config configs/lm.py:tiny --axis model.activation=relu,swiglu "
      "--tune optim.learning_rate=1e-3,3e-3 --seeds 0,1 --config.train.num_steps=200") == []
  assert check_command("python -m tfx_jax.generate --workdir runs/NAME --prompt 'R:' "
                       "[--greedy | --temperature 0.8 --top_k 40 --beam_size 4]") == []


def test_commands_are_found_in_blocks_and_inline_code():
  text = ("Run `python -m tfx_jax.report\nruns/x` or `pip install`:\n\n```bash\n"
          "python -m tfx_jax.train --config configs/lm.py:tiny \\\n    --workdir w  # a run\n"
          "tensorboard --logdir runs/\n```\n")
  assert quoted_commands(text) == [
      "python -m tfx_jax.train --config configs/lm.py:tiny      --workdir w  # a run",
      "python -m tfx_jax.report runs/x"]


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to -."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
  anchors, seen = set(), {}
  for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), flags=re.M):
    slug = _slug(heading)
    anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
    seen[slug] = seen.get(slug, 0) + 1
  return anchors


def broken_links(page: pathlib.Path) -> list[str]:
  """The relative links and anchors of a page that point nowhere."""
  text = page.read_text()
  prose = INLINE.sub("", FENCE.sub("", text))
  broken = []
  for target in LINK.findall(prose):
    if re.match(r"^[a-z]+:", target):
      continue  # https:, mailto:
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    if not linked.exists():
      broken.append(target)
    elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
      broken.append(target)
  return broken


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
  assert broken_links(page) == []


def test_the_link_check_finds_a_broken_link(tmp_path):
  (tmp_path / "there.md").write_text("# A heading: `here`\n")
  page = tmp_path / "page.md"
  page.write_text("[ok](there.md#a-heading-here) [gone](missing.md) [web](https://x.org) "
                  "[anchor](there.md#nowhere) `[code](not-a-link.md)`\n")
  assert broken_links(page) == ["missing.md", "there.md#nowhere"]


def test_the_readme_fits_two_screens_and_links_every_page():
  readme = (ROOT / "README.md").read_text()
  assert len(readme.splitlines()) <= 250
  for page in PAGES[1:]:
    assert f"(docs/{page.name})" in readme, page.name
