"""Sweep reports: ``python -m tfx_jax.report runs/<sweep>``.

  assemble.py   the driver: walks the sections, writes report.md, report.json,
                report.csv and the plots
  sections/     one module per section of the report, in report order
                (``sections.SECTIONS``): its numbers, its markdown, its plots;
                a new statistic is one module there and one registry line
  context.py    what the sections compute from (record, summaries, baselines,
                options) and the sweep's design (which runs a verdict reads)
  collect.py    event files (TensorBoard's reader), status, test-split metrics
  stats.py      paired / Welch intervals, Holm, TOST, verdicts, power, LR
                sensitivity; stats_sequential.py the looks of adaptive seeds
  baselines.py  each run's unigram entropy and loss at initialisation
  schema.py     report.json as types: Report, Point, Comparison (their JSON)
  points.py     runs grouped into points; labels
  tuning.py     tuned grids, their edges, the learning-rate sensitivity
  optimum.py    the optimum of a learning-rate curve and its shift per doubling
                of size (the transfer check; transfer_schema.py its records)
  tables.py     markdown tables and their cells; runs_csv.py report.csv
  plots.py      PNG plots (matplotlib)
  forest.py     the headline figure: every comparison, its interval and verdict
  style.py      the plots' colours per axis value, plain tick labels, units
  claims.py     each declared claim's test and its label, by the one rule,
                Holm over the claims; claim_checks.py their checks at --dry-run;
                claim_test.py a claim's test before Holm; claims_transfer.py
                the transfer claims (transfer/shift, every_rate/<metric>)
  results_doc.py  docs/results.md's summary table from the committed reports'
                claims (``python -m tfx_jax.report --results docs/results.md``);
                results_check.py the page's prose against them (``--check``)
"""
