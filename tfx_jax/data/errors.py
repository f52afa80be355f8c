"""The project-wide user-input error, shared by every data module."""

try:
  from tfx_jax.model_config import ConfigError
except ImportError:  # model_config.py not importable: keep the same contract.

  class ConfigError(ValueError):
    """Bad user input: names the field, the value and the valid choices."""


__all__ = ["ConfigError"]
