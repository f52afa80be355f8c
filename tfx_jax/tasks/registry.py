"""The tasks by name (``config.task``): the one dispatch point, and the API
the rest of tfx_jax uses.

The run config, the run setup, the training loop, scoring and the report
look a task up with ``get(name)`` and never switch on its name:

  from tfx_jax import tasks
  task = tasks.check_task(config.task, model_cfg.family)
  loss = task.objective(config, model_cfg.family, train=True)
"""

from __future__ import annotations

from tfx_jax.core.errors import ConfigError
from tfx_jax.tasks import classify, lm, mlm, translate
from tfx_jax.tasks.classify import classify_loss
from tfx_jax.tasks.losses import token_loss
from tfx_jax.tasks.task import Task, add_sums, metrics_from_sums

__all__ = ["TASKS", "Task", "add_sums", "check_task", "classify_loss", "get",
           "metrics_from_sums", "token_loss"]

# In this order in messages that list the choices.
TASKS: dict[str, Task] = {t.name: t for t in (
    lm.TASK, translate.TASK, mlm.TASK, classify.TASK)}


def get(name: str) -> Task:
  """The declaration of task ``name``; ConfigError listing the choices otherwise."""
  if name not in TASKS:
    raise ConfigError(f"task={name!r} is not a valid choice; choices: "
                      f"{', '.join(TASKS)}.")
  return TASKS[name]


def check_task(name: str, family: str) -> Task:
  """The task, after checking that ``family`` can run it."""
  task = get(name)
  if family not in task.families:
    raise ConfigError(f"task={name!r} needs model.family in {task.families}, "
                      f"but model.family={family!r}.")
  return task
