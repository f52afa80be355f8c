"""Run semantics: the training NLL, per-layer statistics, the one evaluation
forward, and translation sources encoded as in training."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from tfx_jax.run import metrics

from tfx_jax.run import setup as run_setup

from tfx_jax.tasks import text_io as texts

from tfx_jax.run import trainer
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


# Which arrays of a layer each train.layer_stats_param reads, by their path in
# the layer (the names of blocks.TransformerLayer), spelled out independently.
LAYER_ARRAYS = {
    "all": lambda path: True,
    "self_attention": lambda path: path.startswith("self_attention/"),
    "attention_qkv": lambda path: path in ("self_attention/query/kernel",
                                           "self_attention/key/kernel",
                                           "self_attention/value/kernel"),
    "attention_out": lambda path: path == "self_attention/out/kernel",
    "cross_attention": lambda path: path.startswith("cross_attention/"),
    "ffn": lambda path: path.startswith("ffn/"),
    "ffn_in": lambda path: path in ("ffn/wi/kernel", "ffn/wv/kernel"),
    "ffn_out": lambda path: path == "ffn/wo/kernel",
}


def _tiny_model(family, scanned, activation="gelu"):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from tfx_jax.model.config import model_config_from_dict  # pylint: disable=import-outside-toplevel
  from tfx_jax.model.families import build_model  # pylint: disable=import-outside-toplevel
  cfg = model_config_from_dict(dict(family=family, num_layers=3, d_model=8, num_heads=2,
                                    vocab_size=32, max_len=8, scan_layers=scanned,
                                    activation=activation))
  model = build_model(cfg)
  ids = np.ones((2, 6), np.int32)
  args = (ids,) if family != "encoder_decoder" else (ids, ids)
  return model, nn.unbox(model.init(jax.random.PRNGKey(0), *args)["params"]), args


@pytest.mark.parametrize("scanned", [True, False], ids=["scan", "loop"])
@pytest.mark.parametrize("family", ["decoder_only", "encoder_only", "encoder_decoder"])
@pytest.mark.slow
def test_layer_stats_param_reads_its_arrays(family, scanned):
  """Each choice of train.layer_stats_param (all of them, from the Literal)
  gives each layer the NumPy norm of the arrays it names, in every family,
  scanned or looped; a stack without them (an encoder's cross_attention) is
  left out."""
  import flax  # pylint: disable=import-outside-toplevel
  from typing import get_args  # pylint: disable=import-outside-toplevel
  from tfx_jax.run import layer_stats  # pylint: disable=import-outside-toplevel
  assert set(LAYER_ARRAYS) == set(get_args(layer_stats.Param))
  _, params, _ = _tiny_model(family, scanned, activation="swiglu")
  params = jax.tree.map(np.asarray, params)
  for param, chosen in LAYER_ARRAYS.items():
    norms = run_setup.per_layer_norms(params, param)
    for stack in ("encoder", "decoder"):
      if stack not in params:
        continue
      for i in range(3):
        layer = params[stack]["layers"] if scanned else params[stack][f"layer_{i}"]
        flat = flax.traverse_util.flatten_dict(layer, sep="/")
        arrays = [x[i] if scanned else x for path, x in flat.items() if chosen(path)]
        if not arrays:
          assert stack not in norms, (param, stack)
          break
        want = math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
        np.testing.assert_allclose(float(norms[stack][i]), want, rtol=1e-5,
                                   err_msg=f"{param} {stack} {i}")
  if family == "encoder_decoder":  # the decoder's cross-attention, not the encoder's
    assert set(run_setup.per_layer_norms(params, "cross_attention")) == {"decoder"}


@pytest.mark.slow
def test_init_grad_norms_of_ffn_out_averaged_over_batches():
  """train.layer_stats_init_batches: each layer's gradient norm of its FFN output
  matrix W2 (Xiong et al. 2020, Figure 3) is the NumPy norm of that array's
  gradient, and the logged value is its mean over the N batches, batch i with
  the dropout key of step i."""
  from tfx_jax.run import layer_stats  # pylint: disable=import-outside-toplevel
  model, params, _ = _tiny_model("decoder_only", scanned=False)
  task = tasks.get("lm")
  config = tiny_config("lm.py:tiny")
  loss = task.objective(config, "decoder_only", train=True)
  grad_norms = jax.jit(layer_stats.make_grad_norms(model, task, loss, "ffn_out"))
  rng = np.random.default_rng(0)
  batches = [{"inputs": rng.integers(5, 32, (2, 6)).astype(np.int32),
              "targets": rng.integers(5, 32, (2, 6)).astype(np.int32),
              "weights": np.ones((2, 6), np.float32),
              "segment_ids": np.ones((2, 6), np.int32),
              "positions": np.tile(np.arange(6, dtype=np.int32), (2, 1))}
             for _ in range(4)]
  key = jax.random.PRNGKey(3)

  @jax.jit
  def gradient(p, batch, rng):
    def objective(q):
      out = model.apply({"params": q}, **task.model_inputs(batch), rngs={"dropout": rng})
      return loss(out, batch)[0]
    return jax.grad(objective)(p)

  per_batch = []
  for i, batch in enumerate(batches[:3]):
    grads = gradient(params, batch, jax.random.fold_in(key, i))["decoder"]
    per_batch.append([np.linalg.norm(np.asarray(grads[f"layer_{j}"]["ffn"]["wo"]["kernel"],
                                                np.float64)) for j in range(3)])
  mean = layer_stats.mean_init_grad_norms(grad_norms, params, iter(batches), key, 3)
  np.testing.assert_allclose(mean["decoder"], np.mean(per_batch, axis=0), rtol=1e-5)
  assert not np.allclose(per_batch[0], per_batch[1])  # the batches differ
  tags = layer_stats.tags({"layer_stats/init_grad_norm/ffn_out": mean})
  assert sorted(tags) == [f"layer_stats/init_grad_norm/ffn_out/decoder_{j:02d}"
                          for j in range(3)]


# Two documents of 19 and 12 UTF-8 bytes ("ï" and "é" are 2 each), cut into
# rows of 8 tokens.
TWO_DOCUMENTS = [{"text": "To be, or not to be".encode()}, {"text": "naïve café".encode()}]
TWO_DOCUMENTS_BYTES = 19 + 12


@pytest.mark.parametrize("spec", ["lm.py:tiny", "mlm.py:tiny"])
def test_eval_bits_per_byte_are_the_same_for_any_batch_size(spec):
  """The evaluation step's bits per byte (the tokenizer's bytes gathered in
  the step) over two documents read in batches of 1, 2 and all rows: the
  split's bits over its bytes, whatever the batches; a language model's
  bytes are the documents' (eos counts none)."""
  from tfx_jax.data import pipeline  # pylint: disable=import-outside-toplevel
  from tfx_jax.run import config as run_config  # pylint: disable=import-outside-toplevel
  run = run_config.resolve(tiny_config(spec, {"data.tokenizer": "byte",
                                              "model.vocab_size": 261}))
  tok = tokenizer_lib.ByteTokenizer()
  sharded = run_setup.ShardedRun(run, run.model, byte_lengths=tok.byte_lengths())
  params = sharded.init_state().params
  task = tasks.get(run.task)
  got = []
  for batch_size in (1, 2, 16):
    batches = pipeline.make_dataset(
        run.data, task.rows, "validation", batch_size=batch_size, seq_len=8,
        seed=run_setup.EVAL_SEED, tokenizer=tok, shuffle=False, num_epochs=1,
        drop_remainder=False, source=TWO_DOCUMENTS)
    sums = run_setup.evaluate_batches(sharded.eval_step(), params, batches, sharded.mesh)
    metrics = tasks.metrics_from_sums(task, sums)
    assert metrics["eval/bpb"] * math.log(2) * float(sums["bytes"]) == pytest.approx(
        metrics["eval/loss"] * float(sums["weight"]), rel=1e-6)
    if run.task == "lm":
      assert float(sums["bytes"]) == TWO_DOCUMENTS_BYTES
    got.append(metrics)
  for metrics in got[1:]:
    for key in ("eval/loss", "eval/bpb", "eval/bpb_se"):
      assert metrics[key] == pytest.approx(got[0][key], rel=1e-5), key
