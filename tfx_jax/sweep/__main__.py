"""``python -m tfx_jax.sweep``: see tfx_jax/sweep/cli.py."""

import sys

from tfx_jax.sweep.cli import main

if __name__ == "__main__":
  sys.exit(main())
