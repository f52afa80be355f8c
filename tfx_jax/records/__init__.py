"""Floor 1: the records a run and a sweep write to disk (``status.json``,
``sweep.json``, a sweep run's ``run_spec.json``). Imports core only.
"""
