"""The tasks (``config.task``), one module each, and what they share.

A task declares, in its module, everything the rest of the code needs to
know about it (``task.Task``): the families that run it, its row format
(the row builder: one raw example -> batch rows), the model inputs, its loss
with the settings it reads, the targets its context-free baseline counts, its
loss at initialisation l0, its evaluation metrics, how predictions read as
text, and what it generates at every evaluation.

  lm.py          decoder_only: next-token cross entropy over real tokens
  translate.py   encoder_decoder: label-smoothed cross entropy over target
                 tokens; BLEU and chrF of decoded translations
  mlm.py         encoder_only: cross entropy at the masked positions (BERT)
  classify.py    decoder_only or encoder_only: cross entropy of the class
                 head, plus lambda * the LM loss for decoder_only (GPT-1)
  task.py        Task, the metrics from evaluation sums, the parts the
                 token-level tasks share (inputs, argmax, texts)
  losses.py      label-smoothed cross entropy, z-loss, the token loss, ln |V|
  generation.py  evaluation by decoding (BLEU, samples): the one module that
                 imports decoding (tfx_jax.tasks.text_io)
  registry.py    TASKS, get, check_task: the API the rest of tfx_jax imports

Adding a task: a module here declaring ``TASK = Task(...)`` (its row builder,
baseline targets and l0 beside it; shared losses from losses.py, decoding
only through generation.py), one entry in ``registry.TASKS``, and the data it
reads. ``tests/tasks/test_tasks.py`` then checks every part of it: its rows against
its baseline targets on a tiny corpus, its loss at zero logits against its l0,
its metrics. Nothing else switches on task names, and ``tfx_jax.data`` knows
rows, not tasks.

The registry's API is exported here (``from tfx_jax import tasks``;
``tasks.get(name)``). The modules of the package import each other by their own
names, never a name of this file, which runs first.
"""

from tfx_jax.tasks.registry import (TASKS, Task, add_sums, check_task, classify_loss, get,
                                    metrics_from_sums, token_loss)

__all__ = ["TASKS", "Task", "add_sums", "check_task", "classify_loss", "get",
           "metrics_from_sums", "token_loss"]
