"""The report's sections, one module each, in report order (``SECTIONS``).

A section module holds what it computes, its markdown and its plots, each
an optional module-level function of the report's ``context.Context``:

  compute(ctx) -> {field: value}
      report.json's fields it fills. A field of ``schema.Report`` becomes
      that field; any other is written into report.json beside them under
      its name (a dataclass as its fields), so a new statistic needs no edit
      of the schema. Read another section's numbers through its own
      functions (``selection.points(ctx)``, ``comparisons.rows(ctx)``), which
      ``Context.once`` computes once.
  markdown(ctx, report, plots) -> [line, ...]
      Its part of report.md ([] where it does not apply), from the report's
      numbers; ``plots`` is {plot key: file name} of every section's plots.
  plots(ctx, report, sweep_dir, palette) -> {plot key: file name}
      The PNG files it writes into the sweep directory (matplotlib imported
      inside, so the numbers and the markdown need none).

The report (``report.assemble``) walks ``SECTIONS``: every section's
``compute``, then every section's ``plots``, then every section's
``markdown`` in this order. Adding a statistic is one new module here and
one line in ``SECTIONS``. ``claims`` reads the finished report (its
``results(ctx, report)``), so its numbers come after every ``compute``.
``trends`` (a point's still-improving check, read by the points table and
the verdicts) and ``choices`` (a stale confirmation, a choice within the
noise: read by the points, tuned-values and comparisons sections) compute
inside the points and have no part of their own.
"""

from tfx_jax.report.sections import claims
from tfx_jax.report.sections import comparisons
from tfx_jax.report.sections import compute
from tfx_jax.report.sections import evaluation_effects
from tfx_jax.report.sections import ladder
from tfx_jax.report.sections import layer_profiles
from tfx_jax.report.sections import lengths
from tfx_jax.report.sections import noise
from tfx_jax.report.sections import provenance
from tfx_jax.report.sections import reproduce
from tfx_jax.report.sections import scale
from tfx_jax.report.sections import selection
from tfx_jax.report.sections import sequential
from tfx_jax.report.sections import speedup
from tfx_jax.report.sections import step_costs
from tfx_jax.report.sections import title
from tfx_jax.report.sections import training_signals
from tfx_jax.report.sections import transfer
from tfx_jax.report.sections import tuned
from tfx_jax.report.sections import tuning_stage
from tfx_jax.report.sections import verdicts

SECTIONS = (
    title,              # the sweep's name and description
    claims,             # the declared claims: the one family, each labelled
    verdicts,           # the headline figure, the design, every verdict in words
    reproduce,          # the command, the base config, what became of the runs
    selection,          # the points: chosen values, outcomes, metrics
    tuning_stage,       # a confirmed sweep's tuning stage, for reference
    tuned,              # each tuned value, grid edges, learning-rate sensitivity
    transfer,           # the optimum learning rate against size, per variant
    provenance,         # tune_at: tuned here or transferred, per point and comparison
    training_signals,   # output log Z and attention logits
    comparisons,        # every value against its base, per axis
    sequential,         # the looks of adaptive seeds (report.json's ``sequential``)
    speedup,            # the effective speedup over AdamW
    ladder,             # a ladder's fits per variant, the compute multiplier, the backtest
    noise,              # the noise floor and the smallest detectable difference
    scale,              # the effects against model size
    lengths,            # length extrapolation
    evaluation_effects,  # RoPE scaled at evaluation against as trained
    layer_profiles,     # the gradient norm per layer and its profile
    step_costs,         # each point's train step time and memory against the base's
    compute,            # what the runs cost
)
