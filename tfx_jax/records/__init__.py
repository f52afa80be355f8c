"""Floor 1: the records a run and a sweep write to disk, typed once
(``serial``: dataclass <-> JSON from type hints, the migrations of older
files in one place): ``status.json`` (``status.Status``), ``sweep.json``
(``sweep.SweepRecord``), a sweep run's ``run_spec.json``
(``run_spec.RunSpec``), and a run's figures as the report reads them
(``summary.RunSummary``). Imports core only.
"""
