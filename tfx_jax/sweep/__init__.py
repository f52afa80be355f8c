"""Ablation sweeps: declare once (``experiments/<name>.py`` or the command
line), run on this machine or a SLURM cluster, resume, report.

  spec.py      Sweep / axes / run enumeration and names (claims: Claim,
               Equivalent, Regime, Requires from tfx_jax/records/claims.py)
  validate.py  every run's config checked before anything runs
  state.py     runs/<sweep>/ layout, run states, locks (sweep.json itself:
               tfx_jax/records/sweep.py, below the sweep and the report)
  local.py     local executor (N runs at a time, cores split, death-linked children)
  slurm.py     SLURM job array executor, squeue status
  execute.py   what is left to run, summary, report
  confirm.py   the confirmation stage: fresh seeds at each point's chosen value
  transfer.py  the transfer stage (tune_at): the other sizes at their proxy's value
  adaptive.py  --until-resolved: more seeds where a comparison is unresolved
  ladder.py    a ladder resolved: counts, steps, epochs, branch points; the dry run's table
  branching.py a branched ladder's trunk runs (several wsd budgets from one run)
  core/flags.py       ``python -m tfx_jax.sweep``
"""

from tfx_jax.records.claims import Claim, Equivalent, Regime, Requires
from tfx_jax.records.ladder import Ladder
from tfx_jax.sweep.spec import Evaluation, Sweep

__all__ = ["Claim", "Equivalent", "Evaluation", "Ladder", "Regime", "Requires", "Sweep"]
