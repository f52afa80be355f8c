"""Run semantics: the training NLL, per-layer statistics, the one evaluation
forward, and translation sources encoded as in training."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from tfx_jax import metrics, run_setup, texts, trainer
from tfx_jax import tasks
from tfx_jax.tasks import translate
from tfx_jax.data import rows as rows_lib
from tfx_jax.data import tokenizer as tokenizer_lib
from helpers import tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")


def _tree(layers: int, scanned: bool, seed: int = 0):
  rng = np.random.default_rng(seed)
  if scanned:
    stack = {"layers": {"ffn": {"kernel": rng.normal(size=(layers, 3, 4))},
                        "norm": {"scale": rng.normal(size=(layers, 3))}}}
  else:
    stack = {f"layer_{i}": {"ffn": {"kernel": rng.normal(size=(3, 4))},
                            "norm": {"scale": rng.normal(size=(3,))}}
             for i in range(layers)}
  return {"decoder": stack, "embedding": {"embedding": rng.normal(size=(7, 3))}}


@pytest.mark.parametrize("scanned", [True, False])
def test_per_layer_norms_against_numpy(scanned):
  tree = _tree(12, scanned)
  norms = run_setup.per_layer_norms(jax.tree.map(np.asarray, tree))
  assert set(norms) == {"decoder"}  # the embedding belongs to no layer
  for i in range(12):
    if scanned:
      layer = [x[i] for x in jax.tree.leaves(tree["decoder"]["layers"])]
    else:  # layer_10 sorts after layer_1 and layer_2 by number, not by name
      layer = jax.tree.leaves(tree["decoder"][f"layer_{i}"])
    expected = math.sqrt(sum(float(np.sum(x ** 2)) for x in layer))
    np.testing.assert_allclose(float(norms["decoder"][i]), expected, rtol=1e-6)


def test_training_logs_nll_and_per_layer_statistics(tmp_path):
  config = tiny_config("translate.py:tiny", {
      "train.num_steps": 4, "train.log_every_steps": 2, "eval.every_steps": 4,
      "eval.num_bleu_examples": 0, "model.num_layers": 2,
      "train.log_layer_stats": True, "train.label_smoothing": 0.1})
  result = trainer.train_and_evaluate(config, str(tmp_path / "run"))
  assert result.status == "finished"
  scalars = metrics.read_scalars(tmp_path / "run" / "tensorboard")
  # Label smoothing: the objective is a KL to the smoothed targets; train/nll
  # is the plain NLL, the quantity eval/loss measures.
  # Layer statistics log the first update too: its gradients are at initialisation.
  assert [s for s, _ in scalars["train/nll"]] == [1, 2, 4]
  assert all(math.isfinite(v) for _, v in scalars["train/nll"])
  assert scalars["train/nll"] != scalars["train/loss"]
  for kind in ("grad_norm", "param_norm", "update_norm", "max_attention_logit"):
    for stack in ("encoder", "decoder"):
      for i in range(2):
        values = [v for _, v in scalars[f"layer_stats/{kind}/{stack}_{i:02d}"]]
        assert len(values) == 3 and all(math.isfinite(v) for v in values)
        if kind.endswith("_norm"):  # a largest logit may be negative; a norm may not
          assert all(v > 0 for v in values)
  # The layers are part of the model: their gradients hold part of the total.
  for step_index in range(3):
    layer_sq = sum(scalars[f"layer_stats/grad_norm/{s}_{i:02d}"][step_index][1] ** 2
                   for s in ("encoder", "decoder") for i in range(2))
    total = scalars["train/grad_norm"][step_index][1]
    assert 0 < layer_sq < total ** 2 * (1 + 1e-5)


def test_layer_stats_of_a_scanned_stack_with_every_attention_knob(tmp_path):
  """The largest attention logit per layer comes out of a scanned stack whose
  windowed and fully attending layers alternate, with the other knobs on."""
  config = tiny_config("lm.py:tiny", {
      "train.num_steps": 2, "train.log_every_steps": 1, "eval.every_steps": 2,
      "eval.num_samples": 0, "train.log_layer_stats": True, "train.z_loss": 1e-4,
      "model.num_layers": 2, "model.scan_layers": True, "model.position": "rope",
      "model.qk_norm": "rmsnorm", "model.attention_gate": "headwise",
      "model.norm_type": "dyt", "model.block": "parallel",
      "model.attention_window": 4, "model.global_every": 2,
      "model.attention_logit_softcap": 50.0, "model.final_logit_softcap": 30.0})
  result = trainer.train_and_evaluate(config, str(tmp_path / "run"))
  assert result.status == "finished"
  scalars = metrics.read_scalars(tmp_path / "run" / "tensorboard")
  for i in range(2):
    values = [v for _, v in scalars[f"layer_stats/max_attention_logit/decoder_{i:02d}"]]
    assert len(values) == 2 and all(math.isfinite(v) for v in values)
  assert all(v > 0 for _, v in scalars["train/z_loss"])


def test_nll_equals_the_objective_without_smoothing(tmp_path):
  config = tiny_config("lm.py:tiny", {"train.num_steps": 2, "train.log_every_steps": 1,
                                      "eval.every_steps": 2, "eval.num_samples": 0})
  trainer.train_and_evaluate(config, str(tmp_path / "run"))
  scalars = metrics.read_scalars(tmp_path / "run" / "tensorboard")
  np.testing.assert_allclose([v for _, v in scalars["train/nll"]],
                             [v for _, v in scalars["train/loss"]], rtol=1e-6)
  assert not any(t.startswith("layer_stats/") for t in scalars)  # off by default
  # The output softmax's mean log Z is logged always; the z-loss term only when on.
  assert [s for s, _ in scalars["train/output_log_z"]] == [1, 2]
  assert "train/z_loss" not in scalars


def test_z_loss_adds_its_term_to_the_objective(tmp_path):
  """train/loss = train/nll + train/z_loss, and train/z_loss = c * mean log^2 Z,
  at or above c * (mean log Z)^2 (Jensen)."""
  c = 0.05
  config = tiny_config("lm.py:tiny", {"train.num_steps": 2, "train.log_every_steps": 1,
                                      "eval.every_steps": 2, "eval.num_samples": 0,
                                      "train.z_loss": c})
  trainer.train_and_evaluate(config, str(tmp_path / "run"))
  scalars = metrics.read_scalars(tmp_path / "run" / "tensorboard")
  values = {tag: [v for _, v in scalars[tag]]
            for tag in ("train/loss", "train/nll", "train/z_loss", "train/output_log_z")}
  np.testing.assert_allclose(values["train/loss"],
                             np.add(values["train/nll"], values["train/z_loss"]), rtol=1e-5)
  for z, log_z in zip(values["train/z_loss"], values["train/output_log_z"]):
    assert z >= c * log_z ** 2 * (1 - 1e-5) and z > 0


def test_token_loss_with_z_loss_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, size=(2, 5))
  weights = (rng.random((2, 5)) > 0.3).astype(np.float32)
  batch = {"targets": targets, "weights": weights}
  c = 1e-2
  objective, sums = tasks.token_loss({"logits": logits}, batch, z_loss=c)
  log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  nll = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  want = np.sum((nll + c * log_z ** 2) * weights) / weights.sum()
  np.testing.assert_allclose(float(objective), want, rtol=1e-5)
  np.testing.assert_allclose(float(sums["log_z"]), np.sum(log_z * weights), rtol=1e-5)


def test_translation_sources_keep_their_eos_at_inference_as_in_training():
  tok = tokenizer_lib.ByteTokenizer()
  seq_len = 8
  long_text = "a source much longer than eight bytes"
  ids = texts.encode_sources(tok, [long_text, "ab"], seq_len, rows=3)
  row = translate.translate_rows({"en": long_text, "de": "x"}, 0, tok=tok,
                                 keys=type("K", (), {"source_key": "en", "target_key": "de"}),
                                 seq_len=seq_len, target_seq_len=seq_len,
                                 counts=rows_lib.Counts("test"))[0]
  np.testing.assert_array_equal(ids[0], row["inputs"])
  assert ids[0, -1] == tok.eos_id
  assert list(ids[1, :3]) == tok.encode("ab") + [tok.eos_id] and not ids[1, 3:].any()
  assert not ids[2].any()  # batch padding


def test_every_task_is_declared_once_with_its_hooks():
  assert set(tasks.TASKS) == {"lm", "translate", "mlm", "classify"}
  for task in tasks.TASKS.values():
    assert task.families and callable(task.rows.build) and callable(task.objective)
    assert (task.sample_inputs is None) == (task.sample_report is None)
  with pytest.raises(Exception, match="choices: lm, translate, mlm, classify"):
    tasks.get("summarize")
