"""Shared command-line handling: bad flags and configs are a short message and exit 2."""

from __future__ import annotations

import sys

from absl import app


def run_main(main) -> None:
  """``app.run(main)``, turning config-file and override errors into exit code 2.

  ml_collections reports a bad ``--config.x=...`` override (unknown field, wrong
  type) while absl parses flags, before ``main`` runs; those surface here as a
  flags error or a KeyError/TypeError/ValueError, which we print in one
  paragraph instead of a traceback.
  """
  def quiet_main(argv):
    # Library INFO logs (orbax, tfds) drown the console; --verbosity=0 restores them.
    from absl import logging
    if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
      logging.set_verbosity(logging.WARNING)
    return main(argv)

  try:
    app.run(quiet_main, flags_parser=_parse)
  except _FlagError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


class _FlagError(Exception):
  pass


def _parse(argv):
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as e:
    unknown = _unknown_field(argv)
    raise _FlagError(unknown or _clean(str(e))) from None


def _unknown_field(argv) -> str | None:
  """Names an override path that is not a config field, with a suggestion."""
  import difflib
  from absl import flags
  config = _config_from_argv(argv)
  if config is None:
    return None
  for arg in argv[1:]:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config."):].split("=", 1)[0].split(".")
    node, seen = config, []
    for key in path:
      keys = list(node.keys()) if hasattr(node, "keys") else []
      if key not in keys:
        where = ".".join(["config"] + seen)
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.4)
        hint = f" Did you mean {'.'.join(seen + [close[0]])!r}?" if close else ""
        return (f"{'.'.join(seen + [key])!r} is not a config field.{hint} "
                f"Fields of {where}: {', '.join(sorted(keys))}.")
      node, seen = node[key], seen + [key]
  return None


def _config_from_argv(argv):
  """Loads the ``--config file[:preset]`` named in ``argv`` (None if it fails)."""
  import importlib.util
  spec_arg = None
  for i, arg in enumerate(argv):
    if arg == "--config" and i + 1 < len(argv):
      spec_arg = argv[i + 1]
    elif arg.startswith("--config="):
      spec_arg = arg.split("=", 1)[1]
  if not spec_arg:
    return None
  path, _, preset = spec_arg.partition(":")
  try:
    spec = importlib.util.spec_from_file_location("_tfx_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset) if preset else module.get_config()
  except Exception:  # pylint: disable=broad-except
    return None


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
