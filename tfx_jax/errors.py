"""The project-wide user-input error.

Every module that validates user input (config fields, flags, paths) raises
``ConfigError``; the command-line entry points turn it into ``error: ...`` and
exit code 2. It lives here, at the bottom of the import graph, so that raising
it never pulls in the model config or anything else.
"""


class ConfigError(ValueError):
  """Bad user input: names the field, the value and the valid choices."""
