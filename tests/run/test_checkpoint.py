"""Checkpointer: round trip, retention, damage, incompatibility, atomicity."""

import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfx_jax.run import checkpoint


@flax.struct.dataclass
class State:
  step: Any
  params: Any
  opt_state: Any
  rng: Any


def _state(step, width=4):
  params = {"dense": {"kernel": jnp.full((3, width), float(step)),
                      "bias": jnp.arange(width, dtype=jnp.float32)}}
  opt_state = optax.adam(1e-3).init(params)
  return State(step=jnp.int32(step), params=params, opt_state=opt_state,
               rng=jax.random.fold_in(jax.random.key(0), step))


def _abstract(state):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      jax.eval_shape(lambda: state))


CONFIG = {"model.d_model": 64, "model.num_layers": 2, "data.name": "tiny",
          "optim.learning_rate": 1e-3, "model.mlp_dims": (8, 8)}


def _save_steps(directory, steps, **kwargs):
  with checkpoint.Checkpointer(directory, **kwargs) as ckpt:
    for step in steps:
      ckpt.save(step, _state(step), {"epoch": 0, "position": step}, CONFIG)
    ckpt.wait()
    return ckpt.all_steps()


def test_round_trip_restores_state_data_and_config(tmp_path):
  state = _state(7)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() is None
    assert ckpt.save(7, state, b'{"next_index": 12}', CONFIG)
    ckpt.wait()
    assert ckpt.latest_step() == 7
    abstract = _abstract(state)
    restored, data_state, config = ckpt.restore(abstract_state=abstract)

  assert isinstance(restored, State)
  for got, want, target in zip(jax.tree.leaves(restored),
                               jax.tree.leaves(state),
                               jax.tree.leaves(abstract)):
    if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
      got, want = jax.random.key_data(got), jax.random.key_data(want)
    np.testing.assert_array_equal(got, want)
    assert got.sharding == target.sharding
  assert data_state == b'{"next_index": 12}'
  assert config == {**CONFIG, "model.mlp_dims": [8, 8]}


def test_dict_data_state_and_read_config(tmp_path):
  _save_steps(tmp_path, [1, 2])
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.read_config()["model.d_model"] == 64
    restored = ckpt.restore(1, _abstract(_state(1)))
  assert restored.data_state == {"epoch": 0, "position": 1}
  assert int(restored.state.step) == 1


def test_keeps_last_k_and_respects_interval(tmp_path):
  assert _save_steps(tmp_path, [1, 2, 3, 4], max_to_keep=2) == [3, 4]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["3", "4"]
  with checkpoint.Checkpointer(tmp_path / "b", save_interval_steps=5) as ckpt:
    assert not ckpt.save(3, _state(3), None, CONFIG)
    assert ckpt.save(5, _state(5), None, CONFIG)
    assert ckpt.save(6, _state(6), None, CONFIG, force=True)
    assert not ckpt.save(6, _state(6), None, CONFIG, force=True)  # exists
    ckpt.wait()
    assert ckpt.all_steps() == [5, 6]


def test_keep_steps_outlive_max_to_keep(tmp_path):
  """checkpoint.keep_steps (a trunk's branch points): kept whatever
  max_to_keep deletes, beside the newest max_to_keep."""
  kept = _save_steps(tmp_path, [2, 3, 4, 5, 6], max_to_keep=1, keep_steps=(3, 5))
  assert kept == [3, 5, 6]
  with checkpoint.Checkpointer(tmp_path, max_to_keep=1, keep_steps=(3, 5)) as ckpt:
    ckpt.save(7, _state(7), None, CONFIG)
    ckpt.wait()
    assert ckpt.all_steps() == [3, 5, 7]


def test_a_read_only_checkpointer_writes_and_removes_nothing(tmp_path):
  """Another run's checkpoints (train.branch_from): read, never cleaned up.
  A save in progress there (its tmp directory) is left alone."""
  _save_steps(tmp_path, [1, 2])
  partial = tmp_path / "3.orbax-checkpoint-tmp-1700000000000000"
  shutil.copytree(tmp_path / "2", partial)
  with checkpoint.Checkpointer(tmp_path, read_only=True, max_to_keep=1) as ckpt:
    assert ckpt.all_steps() == [1, 2]
    assert int(ckpt.restore(1, _abstract(_state(1))).state.step) == 1
  assert partial.exists() and sorted(p.name for p in tmp_path.iterdir())[:2] == ["1", "2"]
  with pytest.raises(checkpoint.ConfigError, match="no checkpoint directory"):
    checkpoint.Checkpointer(tmp_path / "none", read_only=True)
  assert not (tmp_path / "none").exists()


def _delete_array_files(step_dir: pathlib.Path):
  for path in (step_dir / "state").rglob("*"):
    if path.is_dir() and path.name == "d":
      shutil.rmtree(path)


def _truncate_array_files(step_dir: pathlib.Path):
  for path in (step_dir / "state").rglob("*"):
    if path.is_file() and path.parent.name == "d":
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _delete_state_metadata(step_dir: pathlib.Path):
  (step_dir / "state" / "_METADATA").unlink()


@pytest.mark.parametrize("damage", [_delete_array_files, _truncate_array_files,
                                    _delete_state_metadata])
def test_damaged_latest_falls_back_with_warning(tmp_path, caplog, damage):
  _save_steps(tmp_path, [1, 2, 3])
  damage(tmp_path / "3")
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with caplog.at_level(logging.WARNING):
      restored = ckpt.restore(abstract_state=_abstract(_state(3)))
  assert int(restored.state.step) == 2
  np.testing.assert_array_equal(restored.state.params["dense"]["kernel"], 2.0)
  assert restored.data_state == {"epoch": 0, "position": 2}
  assert "step 3" in caplog.text and "falling back to step 2" in caplog.text
  # One line: which step, which file, what was done (not TensorStore's dump).
  [warning] = [r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING and "unreadable" in r.getMessage()]
  assert "\n" not in warning and len(warning) < 300 + len(str(tmp_path)) * 2, warning
  assert warning.startswith(f"checkpoint at step 3 in {tmp_path} is unreadable (")
  assert warning.endswith(f"; moved it to {tmp_path / '3.damaged'}; falling back to step 2")
  if damage is not _delete_state_metadata:  # the arrays' files: named
    assert " reading 3/state/d/" in warning, warning
  # The damaged step is set aside, so it is no longer "latest" and step 3 can
  # be written again by the resumed run.
  assert (tmp_path / "3.damaged").is_dir() and not (tmp_path / "3").exists()
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 2
    assert ckpt.save(3, _state(3), None, CONFIG, force=True)
    ckpt.wait()
    assert ckpt.latest_step() == 3


def test_a_damaged_step_is_described_in_one_short_line(tmp_path):
  """TensorStore's error (the driver spec, escaped, thousands of characters)
  becomes its status code and the deepest file it names under the step."""
  step_dir = tmp_path / "3"
  spec = '{\\"path\\":\\"' + f"{step_dir}/state/" + '\\"}' * 40
  error = ValueError(
      f'NOT_FOUND: Error opening "zarr" driver: Error reading "step/.zarray" at local file '
      f'"{step_dir}/state/": Error reading local file "{step_dir}/state/d/44a3" '
      f"[tensorstore_spec='{spec}']\n  and more")
  assert checkpoint.damage_text(error, step_dir) == "ValueError NOT_FOUND reading 3/state/d/44a3"
  # Another step's files (30 is not 3) are not this step's; a long first line is cut.
  other = FileNotFoundError(f"{tmp_path / '30' / 'state'} " + "x" * 200 + "\nsecond line")
  text = checkpoint.damage_text(other, step_dir)
  assert text.startswith(f"FileNotFoundError {tmp_path / '30'}") and text.endswith("...")
  assert "reading" not in text and "\n" not in text and len(text) < 140


def test_explicit_damaged_step_does_not_fall_back(tmp_path):
  _save_steps(tmp_path, [1, 2])
  _delete_array_files(tmp_path / "2")
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.ConfigError, match="no readable checkpoint"):
      ckpt.restore(2, _abstract(_state(2)))
    with pytest.raises(checkpoint.ConfigError, match=r"available steps: \[1, 2\]"):
      ckpt.restore(5, _abstract(_state(2)))


def test_interrupted_write_is_ignored(tmp_path):
  _save_steps(tmp_path, [1, 2])
  # A save of step 3 killed before finalisation leaves only a tmp directory.
  partial = tmp_path / "3.orbax-checkpoint-tmp-1700000000000000"
  shutil.copytree(tmp_path / "2", partial)
  (partial / "commit_success.txt").unlink()
  _delete_array_files(partial)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 2
    assert ckpt.all_steps() == [1, 2]
    restored = ckpt.restore(abstract_state=_abstract(_state(2)))
    assert int(restored.state.step) == 2
    # The resumed run can write step 3 for real.
    assert ckpt.save(3, _state(3), None, CONFIG, force=True)
    ckpt.wait()
    assert ckpt.latest_step() == 3
  assert not partial.exists()


_SAVE_FOREVER = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from tfx_jax.run import checkpoint
    ckpt = checkpoint.Checkpointer(sys.argv[1], max_to_keep=2)
    for step in range(1, 10_000):
      state = {"step": jnp.int32(step), "w": jnp.full((512, 1024), float(step))}
      ckpt.save(step, state, {"position": step}, {"model.d_model": 1024})
""")


def test_kill_during_saves_leaves_a_restorable_checkpoint(tmp_path):
  child = subprocess.Popen([sys.executable, "-c", _SAVE_FOREVER, str(tmp_path)],
                           stderr=subprocess.DEVNULL)
  try:
    # The child imports jax and orbax before its first save: seconds on a quiet
    # machine, a minute or more beside a busy suite. The wait ends at the save.
    deadline = time.time() + 600
    while not (tmp_path / "2").exists():  # let a few saves finish
      assert child.poll() is None, f"the saving process exited with {child.returncode}"
      assert time.time() < deadline, "no second checkpoint within 600 s"
      time.sleep(0.05)
    time.sleep(0.3)
  finally:
    child.send_signal(signal.SIGKILL)
    child.wait()

  abstract = {"step": jax.ShapeDtypeStruct((), jnp.int32),
              "w": jax.ShapeDtypeStruct((512, 1024), jnp.float32)}
  with checkpoint.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    assert ckpt.all_steps()
    state, data_state, _ = ckpt.restore(abstract_state=abstract)
  step = int(state["step"])
  assert step >= 2 and data_state == {"position": step}
  np.testing.assert_array_equal(state["w"], float(step))
  assert not list(tmp_path.glob("*.orbax-checkpoint-tmp*"))


def test_check_compatible_names_every_differing_field():
  new = {**CONFIG, "model.d_model": 128, "data.name": "wmt",
         "model.dropout": 0.1, "optim.learning_rate": 5.0}
  del new["model.num_layers"]
  with pytest.raises(checkpoint.ConfigError) as error:
    checkpoint.check_compatible(CONFIG, new, ["model", "data.name"])
  message = str(error.value)
  assert "model.d_model: saved 64 -> new 128" in message
  assert "data.name: saved 'tiny' -> new 'wmt'" in message
  assert "model.num_layers: saved 2 -> new '<absent>'" in message
  assert "model.dropout: saved '<absent>' -> new 0.1" in message
  assert "optim" not in message  # not a checked field
  # Tuples match their JSON (list) form saved in the checkpoint.
  checkpoint.check_compatible({"model.mlp_dims": [8, 8]}, CONFIG, ["model.mlp_dims"])
  checkpoint.check_compatible(CONFIG, {**CONFIG, "optim.learning_rate": 1.0},
                              ["model.", "data.name"])


def test_restore_checks_config_and_shapes_before_reading_arrays(tmp_path):
  _save_steps(tmp_path, [1])
  wider = {**CONFIG, "model.d_model": 128}
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.ConfigError, match="model.d_model"):
      ckpt.restore(abstract_state=_abstract(_state(1, width=8)),
                   check_config=lambda saved: checkpoint.check_compatible(
                       saved, wider, ["model"]))
    # Without the config check, shapes are still compared, field by field.
    with pytest.raises(checkpoint.ConfigError) as error:
      ckpt.restore(abstract_state=_abstract(_state(1, width=8)))
  assert "params.dense.kernel: saved (3, 4) -> new (3, 8)" in str(error.value)
  assert "params.dense.bias: saved (4,) -> new (8,)" in str(error.value)


def test_unwritable_workdir_is_a_config_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(checkpoint.ConfigError, match="is not writable"):
    checkpoint.ensure_writable(blocker / "run")
  with pytest.raises(checkpoint.ConfigError, match="is not writable"):
    checkpoint.Checkpointer(blocker / "run" / "checkpoints")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_workdir_is_a_config_error(tmp_path):
  tmp_path.chmod(0o500)
  try:
    with pytest.raises(checkpoint.ConfigError, match="is not writable"):
      checkpoint.ensure_writable(tmp_path)
  finally:
    tmp_path.chmod(0o700)


def test_no_checkpoint_is_a_config_error(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.ConfigError, match="no checkpoint"):
      ckpt.restore(abstract_state=_abstract(_state(1)))


# ------------------------------------------- checkpoints of earlier versions
FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "lm_before_restructure"


def test_a_checkpoint_from_before_the_restructure_restores_exactly():
  """A tiny run written by the code before the run side was reorganised
  (byte tokenizer, 1 layer, 4 steps): its parameters load bitwise."""
  from tfx_jax.run import trained_run
  run = trained_run.load_run(FIXTURE)
  assert run.step == 4
  saved = np.load(FIXTURE / "params_at_save.npz")
  from flax import traverse_util
  restored = traverse_util.flatten_dict(jax.device_get(run.params), sep="/")
  assert sorted(restored) == sorted(saved.files)
  for key in saved.files:
    np.testing.assert_array_equal(restored[key], saved[key], err_msg=key)


def test_a_checkpoint_from_before_the_restructure_resumes(tmp_path):
  """The same command with more steps continues the old run from step 4."""
  import json

  from tfx_jax.run import config_base

  from tfx_jax.run import trained_run

  from tfx_jax.run import trainer
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURE, workdir)
  config = config_base.base_config()
  config.update(json.loads((FIXTURE / "config.json").read_text()))
  config.train.num_steps = 6
  result = trainer.train_and_evaluate(config, str(workdir))
  assert (result.status, result.step) == ("finished", 6)
  assert trained_run.load_run(workdir).step == 6
  # Checkpoints now record the dataset's version, which later resumes compare.
  from tfx_jax.data import sources
  with checkpoint.Checkpointer(workdir / "checkpoints") as ckpt:
    step, saved = ckpt.read_latest_config()
  assert step == 6 and saved["data.version"] == sources.embedded_version("tfx_shakespeare")
