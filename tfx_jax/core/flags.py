"""Shared command-line handling: bad flags and configs are a short message and exit 2."""

from __future__ import annotations

import sys
from typing import Callable

from absl import flags

from tfx_jax.core.errors import ConfigError


# {id(flag registry): explain(argv) -> message or None}: how a command that takes
# ``--config.*`` overrides names a bad one (``config_base.unknown_override``);
# declared by the command, so this module stays below everything it serves.
_EXPLAIN: dict[int, Callable[[list[str]], str | None]] = {}


def new_flags(explain: Callable[[list[str]], str | None] | None = None
              ) -> flags.FlagValues:
  """A command's own flag registry.

  Each command module defines its flags here rather than in absl's global
  registry, so importing several commands in one process (tests, notebooks,
  the trainer importing the text library) never clashes. ``explain(argv)``
  names what is wrong with the arguments when the flags fail to parse (e.g.
  an override of a field the config does not have, with a suggestion).
  """
  fv = flags.FlagValues()
  if explain is not None:
    _EXPLAIN[id(fv)] = explain
  flags.DEFINE_integer("verbosity", -1, "absl logging verbosity: -1 warnings only, "
                       "0 info.", flag_values=fv)
  return fv


def run_main(main, flag_values: flags.FlagValues, argv=None) -> None:
  """Parses ``argv`` into ``flag_values`` and calls ``main(remaining_argv)``.

  Bad flags and bad ``--config.x=...`` overrides (ml_collections reports them
  while flags are parsed: unknown field, wrong type), and a ``ConfigError``
  raised by ``main``, become a one-paragraph ``error: ...`` on stderr and exit
  code 2, never a traceback.
  """
  from absl import logging
  argv = list(sys.argv if argv is None else argv)
  # A clean slate when called more than once in a process.
  for name in [n for n in flag_values if n.startswith("config.")]:
    delattr(flag_values, name)
  flag_values.unparse_flags()
  if any(a in ("--help", "-h", "--helpfull", "-?") for a in argv[1:]):
    print(flag_values.main_module_help() or flag_values.get_help())
    sys.exit(0)
  try:
    remaining = flag_values(argv)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as e:
    explain = _EXPLAIN.get(id(flag_values))
    print(f"error: {(explain and explain(argv)) or _clean(str(e))}", file=sys.stderr)
    sys.exit(2)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()  # absl logging reads the global registry
  # Library INFO logs (orbax, tfds) drown the console; --verbosity=0 restores them.
  logging.set_verbosity(flag_values["verbosity"].value)
  code = exit_code(main, remaining)
  if code:
    sys.exit(code)


def exit_code(main, *args) -> int:
  """The exit code of ``main(*args)`` (None: 0). A ConfigError (bad input
  found after the flags were parsed: a field's value, a path, the devices)
  becomes ``error: ...`` on stderr and exit code 2, never a traceback."""
  try:
    return main(*args) or 0
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _clean(msg: str) -> str:
  """One paragraph; for an error raised inside a config file, its last line."""
  msg = msg.strip()
  if len(msg) > 1 and msg[0] == msg[-1] and msg[0] in "'\"":
    msg = msg[1:-1]  # str(KeyError) quotes the whole message
  if "Traceback (most recent call last)" in msg:
    lines = [l for l in msg.splitlines() if l.strip()]
    head = msg.split("Traceback")[0].strip()
    msg = f"{head} {lines[-1].strip()}" if lines else msg
  return " ".join(msg.split())
