"""Sweep reports: ``python -m tfx_jax.report runs/<sweep>``.

  collect.py    event files (TensorBoard's reader), status, test-split metrics
  stats.py      paired / Welch intervals, Holm, TOST, verdicts, power, sequential
                looks of adaptive seeds, LR sensitivity
  baselines.py  each run's unigram entropy and loss at initialisation
  analysis.py   points, chosen tuned values, outcomes, comparisons
  schema.py     report.json as types: Report, Point, Comparison (their JSON)
  points.py     runs grouped into points; labels
  build.py      report.md (verdicts first), report.csv
  plots.py      PNG plots (matplotlib)
  forest.py     the headline figure: every comparison, its interval and verdict
  style.py      the plots' colours per axis value, plain tick labels, units
"""
