"""Floor 1: the records a run and a sweep write to disk (``status.json``,
``sweep.json``). Imports core only.
"""
