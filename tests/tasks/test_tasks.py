"""The task registry: every task declares every part, and its parts agree.

Each test runs over ``registry.TASKS`` (or the package's modules), so a new
task is covered without editing this file: a task module that is not
registered, a part left out, baseline targets that count something else than
the rows predict, an l0 that is not its loss at initialisation, or a metric
nothing computes fails here. The baselines are computed on a tiny in-memory
corpus with every feature a task reads, and skip cases of each kind.
"""

import ast
import dataclasses
import importlib
import math
import pathlib
import pkgutil
import types
from typing import get_args

import numpy as np
import pytest

import tfx_jax.tasks
from tfx_jax.data import baselines
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import sources
from tfx_jax.data import tokenizer as tokenizer_lib
from tfx_jax.core.errors import ConfigError
from tfx_jax import tasks
from tfx_jax.tasks import task as task_lib

PACKAGE = pathlib.Path(tfx_jax.tasks.__file__).parent
TOK = tokenizer_lib.ByteTokenizer()
# An in-memory dataset with every feature a task may read.
DATA = types.SimpleNamespace(name="memory", data_dir=None, text_key="text", source_key="en",
                             target_key="de", label_key="label", tokenizer_dataset=None)
KEYS = sources.resolve_keys(DATA)
CORPUS = [
    {"text": b"To be, or not to be", "en": b"file not found",
     "de": b"Datei nicht gefunden", "label": 0},
    {"text": b"", "en": b"", "de": b"leer", "label": 1},  # blank text, empty source
    {"text": b"that is the question:", "en": b"invalid operand",
     "de": "ungültiger Operand".encode(), "label": 2},
    {"text": b"Whether 'tis nobler in the mind", "en": b"unused variable {0}",
     "de": b"unbenutzte Variable {0}", "label": -1},  # unlabelled
    {"text": b"   \n", "en": b"no target", "de": b"", "label": 1},  # blank text, empty target
    {"text": b"to suffer the slings", "en": b"{0} is not a type",
     "de": b"{0} ist kein Typ", "label": 2},
]
# The settings the tasks' functions read, by attribute only (as a ConfigDict
# and the typed run config both give them).
CONFIG = types.SimpleNamespace(
    model=types.SimpleNamespace(vocab_size=TOK.vocab_size, num_classes=3),
    train=types.SimpleNamespace(label_smoothing=0.1, z_loss=1e-4),
    finetune=types.SimpleNamespace(lambda_pt=0.5),
    eval=types.SimpleNamespace(num_bleu_examples=0, num_samples=0),
    data=DATA)


def task_modules() -> dict[str, object]:
  """{name: module} of the package's modules that declare a ``TASK``."""
  out = {}
  for info in pkgutil.iter_modules([str(PACKAGE)]):
    module = importlib.import_module(f"tfx_jax.tasks.{info.name}")
    if hasattr(module, "TASK"):
      out[info.name] = module
  return out


def rows_of(task, example, index):
  """The task's rows of one example; every maskable position masked (mask rate
  1), so that the weighted targets are every target the task predicts."""
  build = task.rows.bind(tok=TOK, keys=KEYS, seq_len=64, target_seq_len=64,
                         counts=rows_lib.Counts("test"), seed=0, mask_rate=1.0,
                         n_classes=None)
  return build(example, index)


def predicted(task, rows) -> list[int]:
  """What the rows are scored on: their labels, or their weighted targets."""
  if task.rows.labelled:
    return [int(r["label"]) for r in rows]
  return [int(t) for r in rows for t in r["targets"][r["weights"] > 0]]


def batch_of(rows) -> dict[str, np.ndarray]:
  """The rows as one batch, each key zero-padded to its longest row."""
  batch = {}
  for key in rows[0]:
    values = [np.asarray(r[key]) for r in rows]
    if values[0].ndim == 0:
      batch[key] = np.stack(values)
      continue
    width = max(len(v) for v in values)
    batch[key] = np.stack([rows_lib.pad(v, width, v.dtype) for v in values])
  return batch


def test_every_task_module_is_registered_under_its_name():
  modules = task_modules()
  assert set(modules) == set(tasks.TASKS)
  for name, module in modules.items():
    assert tasks.get(name) is module.TASK and module.TASK.name == name
  with pytest.raises(ConfigError, match="choices: lm, translate, mlm, classify"):
    tasks.get("summarize")


def test_every_task_declares_every_part():
  """Every field of ``Task`` without a default is a part each task must declare."""
  required = [f.name for f in dataclasses.fields(task_lib.Task)
              if f.default is dataclasses.MISSING]
  assert {"rows", "objective", "targets", "initial_loss", "metrics"} <= set(required)
  for task in tasks.TASKS.values():
    for name in required:
      assert getattr(task, name) is not None, (task.name, name)
    assert isinstance(task.rows, rows_lib.RowFormat) and callable(task.rows.build)
    assert isinstance(task.targets, baselines.Targets) and callable(task.targets.ids)
    assert task.targets.kind == task.rows.name == task.name
    assert set(task.targets.keys) == set(task.rows.keys)
    for part in ("model_inputs", "objective", "initial_loss", "predictions",
                 "prediction_texts"):
      assert callable(getattr(task, part)), (task.name, part)
    assert task.metrics and set(task.metrics) <= set(get_args(task_lib.Metric))
    assert set(task.families) <= {"decoder_only", "encoder_only", "encoder_decoder"}


def test_every_metric_has_what_computes_it():
  assert set(task_lib.FROM_SUMS) | set(task_lib.FROM_GENERATION) == set(
      get_args(task_lib.Metric))
  for task in tasks.TASKS.values():
    if set(task.metrics) & set(task_lib.FROM_GENERATION):
      assert task.score_by_generation is not None, task.name
  lm = tasks.get("lm")
  with pytest.raises(ValueError, match="need score_by_generation"):
    dataclasses.replace(lm, metrics=("perplexity", "bleu"))
  with pytest.raises(ValueError, match="must be the task's name"):
    dataclasses.replace(lm, targets=tasks.get("mlm").targets)


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_baseline_counts_exactly_what_the_rows_predict(name):
  task = tasks.get(name)
  kept, want = 0, []
  for i, example in enumerate(CORPUS):
    rows = rows_of(task, example, i)
    kept += bool(rows)
    want += predicted(task, rows)
  assert 0 < kept < len(CORPUS)  # the corpus has examples each task skips
  counts, examples = baselines.target_counts(CORPUS, TOK, task.targets, KEYS)
  assert examples == kept
  np.testing.assert_array_equal(counts, np.bincount(want, minlength=len(counts)))
  entropy = baselines.unigram_entropy(DATA, TOK, task.targets, source=CORPUS)
  assert entropy == pytest.approx(baselines.entropy_nats(np.bincount(want)), rel=1e-12)
  assert 0 < entropy < math.log(TOK.vocab_size)


@pytest.mark.parametrize("name", list(tasks.TASKS))
def test_l0_is_the_loss_of_the_uniform_prediction(name):
  """At zero logits (the uniform prediction) every family's evaluation loss is
  the task's l0, and the training objective (label smoothing, z-loss) is
  finite: the settings are read by attribute."""
  task = tasks.get(name)
  rows = [r for i, example in enumerate(CORPUS) for r in rows_of(task, example, i)]
  batch = batch_of(rows)
  if "bpb" in task.metrics:  # the evaluation step gathers them (run/setup.make_eval_step)
    batch["target_bytes"] = TOK.byte_lengths()[batch["targets"]]
  width = batch["targets"].shape[1]
  outputs = {"logits": np.zeros((len(rows), width, CONFIG.model.vocab_size), np.float32),
             "class_logits": np.zeros((len(rows), CONFIG.model.num_classes), np.float32)}
  l0 = task.initial_loss(CONFIG)
  for family in task.families:
    _, sums = task.objective(CONFIG, family, train=False)(outputs, batch)
    metrics = task_lib.metrics_from_sums(task, sums)
    assert metrics["eval/loss"] == pytest.approx(l0, rel=1e-6), family
    assert {f"eval/{m}" for m in task.metrics if m in task_lib.FROM_SUMS} <= set(metrics)
    if "bpb" in task.metrics:  # l0 in bits, over the bytes of the scored tokens
      scored_bytes = float(np.sum(batch["target_bytes"] * batch["weights"]))
      assert metrics["eval/bpb"] == pytest.approx(
          l0 / math.log(2) * float(sums["weight"]) / scored_bytes, rel=1e-6)
    objective, _ = task.objective(CONFIG, family, train=True)(outputs, batch)
    assert np.isfinite(float(objective))
  uniform = CONFIG.model.num_classes if task.rows.labelled else CONFIG.model.vocab_size
  assert l0 == pytest.approx(math.log(uniform))


def test_only_the_generation_module_imports_decoding():
  decoding = {"tfx_jax.tasks.text_io", "tfx_jax.model.decoding", "tfx_jax.generate", "tfx_jax.tasks.bleu"}
  importers = set()
  for path in PACKAGE.glob("*.py"):
    if f"tfx_jax.tasks.{path.stem}" in decoding:
      continue  # the decoding machinery that lives in tasks/ itself (text in and out, BLEU)
    for node in ast.walk(ast.parse(path.read_text())):
      names = []
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
      if decoding & set(names):
        importers.add(path.stem)
  assert importers == {"generation"}


@pytest.mark.parametrize("name", list(tasks.TASKS))
@pytest.mark.slow
def test_evaluation_standard_errors_are_those_of_the_rows(name):
  """eval/loss_se (and eval/accuracy_se) on a planted batch against NumPy: the
  cluster-robust standard error of a mean with each row a cluster, computed
  from its definition (the residuals of every scored token summed per row),
  which for one scored unit per row (classification) is scipy's plain
  standard error of the mean; padding rows count for nothing, and the sums of
  two batches give the standard error of their rows together."""
  import scipy.stats  # pylint: disable=import-outside-toplevel
  task = tasks.get(name)
  rows = [r for i, example in enumerate(CORPUS) for r in rows_of(task, example, i)]
  rows.append({k: np.zeros_like(np.asarray(v)) for k, v in rows[0].items()})  # padding
  batch = batch_of(rows)
  rng = np.random.default_rng(1)
  width = batch["targets"].shape[1]
  outputs = {"logits": rng.normal(0, 2, (len(rows), width, CONFIG.model.vocab_size)),
             "class_logits": rng.normal(0, 2, (len(rows), CONFIG.model.num_classes))}
  outputs = {k: v.astype(np.float32) for k, v in outputs.items()}
  log_p = lambda z: z - scipy.special.logsumexp(z.astype(np.float64), -1, keepdims=True)
  if task.rows.labelled:  # one scored unit per real row
    scored = batch["segment_ids"].max(-1)[:, None] > 0
    nll = -np.take_along_axis(log_p(outputs["class_logits"]), batch["label"][:, None], -1)
    correct = outputs["class_logits"].argmax(-1)[:, None] == batch["label"][:, None]
  else:
    scored = batch["weights"] > 0
    nll = -np.take_along_axis(log_p(outputs["logits"]), batch["targets"][..., None], -1)[..., 0]
    correct = outputs["logits"].argmax(-1) == batch["targets"]

  def row_clustered_se(values):
    mean = values[scored].mean()
    per_row = np.where(scored, values - mean, 0.0).sum(1)
    rows_scored = int(scored.any(1).sum())
    return math.sqrt(rows_scored / (rows_scored - 1) * np.sum(per_row ** 2)) / scored.sum()

  def cancellation(values):
    """sum_r X_r^2 / sum_r (X_r - m N_r)^2. The device's sums are centred on
    the batch's mean (``losses.row_moments``), so the float32 rounding of the
    rows' sums X_r (~1e-7 of X_r) reaches the standard error amplified by
    about its square root, not by itself as raw sums of squares would."""
    x, n = np.where(scored, values, 0.0).sum(1), scored.sum(1)
    return np.sum(x ** 2) / max(np.sum((x - x.sum() / n.sum() * n) ** 2), 1e-300)

  want = {"eval/loss_se": row_clustered_se(nll),
          "eval/accuracy_se": row_clustered_se(correct.astype(np.float64))}
  rel = {"eval/loss_se": 1e-6 * math.sqrt(cancellation(nll)),
         "eval/accuracy_se": 1e-6 * math.sqrt(cancellation(correct.astype(np.float64)))}
  if task.rows.labelled:
    assert want["eval/loss_se"] == pytest.approx(scipy.stats.sem(nll[scored]), rel=1e-12)
  for family in task.families:
    loss = task.objective(CONFIG, family, train=False)
    _, sums = loss(outputs, batch)
    metrics = task_lib.metrics_from_sums(task, task_lib.add_sums(None, sums))
    expected = {k: v for k, v in want.items() if k[:-len("_se")] in metrics}
    assert "eval/loss_se" in expected and set(expected) <= set(metrics), family
    for key, value in expected.items():
      assert metrics[key] == pytest.approx(value, rel=rel[key]), (family, key)
    # Two batches (the rows split anywhere) add up to the standard error of all rows.
    total = None
    for part in (slice(0, 3), slice(3, None)):
      _, part_sums = loss({k: v[part] for k, v in outputs.items()},
                          {k: v[part] for k, v in batch.items()})
      total = task_lib.add_sums(total, part_sums)
    together = task_lib.metrics_from_sums(task, total)
    for key, value in expected.items():
      assert together[key] == pytest.approx(value, rel=rel[key]), (family, key)


# Two documents whose UTF-8 bytes are counted by hand: 5 and 6 ("ï" is 2).
TWO_DOCUMENTS = [{"text": "To be".encode()}, {"text": "naïve".encode()}]
TWO_DOCUMENTS_BYTES = 5 + 6


@pytest.mark.parametrize("name", [n for n, t in tasks.TASKS.items() if "bpb" in t.metrics])
def test_bits_per_byte_is_the_corpus_bits_over_its_bytes(name):
  """eval/bpb on two documents: the NLL of every scored target (eos too, at 0
  bytes) in bits over the documents' bytes counted by hand; eval/bpb_se the
  delta method's standard error of that ratio with each row a cluster; both
  the same from the sums of any split of the rows into batches."""
  task = tasks.get(name)
  rows = [r for i, example in enumerate(TWO_DOCUMENTS) for r in rows_of(task, example, i)]
  rows.append({k: np.zeros_like(np.asarray(v)) for k, v in rows[0].items()})  # padding
  batch = batch_of(rows)
  batch["target_bytes"] = TOK.byte_lengths()[batch["targets"]]
  rng = np.random.default_rng(2)
  logits = rng.normal(0, 2, (*batch["targets"].shape, TOK.vocab_size)).astype(np.float32)
  z = logits.astype(np.float64)
  log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_p, batch["targets"][..., None], -1)[..., 0] * batch["weights"]
  bytes_ = batch["target_bytes"] * batch["weights"]
  assert bytes_.sum() == TWO_DOCUMENTS_BYTES
  bits_r, bytes_r = nll.sum(1) / math.log(2), bytes_.sum(1)
  bpb = bits_r.sum() / TWO_DOCUMENTS_BYTES
  rows_scored = int((batch["weights"].sum(1) > 0).sum())
  # The ratio's delta method: Var(sum X / sum B) ~ sum_r (X_r - bpb B_r)^2 / (sum B)^2.
  se = math.sqrt(rows_scored / (rows_scored - 1) * np.sum((bits_r - bpb * bytes_r) ** 2)
                 ) / TWO_DOCUMENTS_BYTES
  loss = task.objective(CONFIG, task.families[0], train=False)
  n = len(rows)
  for size in (1, 2, n):
    total = None
    for start in range(0, n, size):
      part = slice(start, start + size)
      _, sums = loss({"logits": logits[part]}, {k: v[part] for k, v in batch.items()})
      total = task_lib.add_sums(total, sums)
    metrics = task_lib.metrics_from_sums(task, total)
    assert metrics["eval/bpb"] == pytest.approx(bpb, rel=1e-6), size
    assert metrics["eval/bpb_se"] == pytest.approx(se, rel=1e-5), size
  # Without the targets' bytes (a translation's evaluation), no bpb at all.
  _, sums = loss({"logits": logits}, {k: v for k, v in batch.items() if k != "target_bytes"})
  assert not {"eval/bpb", "eval/bpb_se"} & set(task_lib.metrics_from_sums(task, sums))
