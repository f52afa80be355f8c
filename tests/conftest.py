"""Test-session setup. It starts nothing itself: the one-node SLURM cluster
is a fixture (``slurm_cluster.py``) that only the tests which use it start."""

pytest_plugins = ["slurm_cluster"]
