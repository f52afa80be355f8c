"""Sweep reports: ``python -m tfx_jax.report runs/<sweep>``.

  collect.py  event files (TensorBoard's reader), status, extra evaluations
  stats.py    mean +- std, Welch t intervals
  points.py   runs grouped into points; labels
  build.py    tables, report.md, report.csv
  plots.py    PNG plots (matplotlib)
"""
