"""Multi-process training: two processes on localhost (gloo), and under ``srun -n 2``.

Every process runs ``python -m tfx_jax.train ... --distributed`` over one CPU
device; JAX's coordinator listens on a free localhost port. Each process reads
its own data shard (``data.num_shards=0``: one per process), and the global
batch is one sub-batch per shard, so two processes see the same data as one
process reading the same two shards (``data.num_shards=2``) and differ only by
float32 rounding: the data-parallel
gradient is summed by a gloo all-reduce of two partial sums, not in one
device's order. That rounding (~1e-7 relative per sum) stays below 3e-7
relative on the losses over 20 Adam steps (measured; 1.1e-6 on the
perplexity, the exponential of a loss near 7), so they are compared at
rel=1e-5: well above rounding, far below what a change of data or
initialisation does to them.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tfx_jax.run import metrics
from tfx_jax.run import setup as run_setup
from tfx_jax.records import status as status_lib
from tfx_jax.data import pipeline
from tfx_jax.data import shards as shards_lib
from tfx_jax.core.errors import ConfigError
from helpers import (ROOT, cli_flags, compilation_cache, free_port, run_cli, subprocess_env,
                     tiny_config, wait_until)

# Its tests start several busy processes at once: the "processes" group
# (conftest.py).
pytestmark = [pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning"),
              pytest.mark.xdist_group("processes")]

TOLERANCE = {"rel": 1e-5, "abs": 1e-6}
# The two-process runs leave data.num_shards at 0: one shard per process.
ONE_PROCESS_TWO_SHARDS = {"data.num_shards": 2}
# eval/bpb: bits and bytes are summed over the global batch, so over both processes.
COMPARED = ("train/loss", "train/nll", "train/grad_norm", "eval/loss", "eval/perplexity",
            "eval/bpb", "eval/bpb_se")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return tmp_path_factory.getbasetemp() / "jax_cache"


def scalars(workdir) -> dict:
  return metrics.read_scalars(pathlib.Path(workdir) / "tensorboard")


def start(workdir, num_processes: int, cache_dir, overrides: dict | None = None,
          command: list[str] | None = None) -> list[subprocess.Popen]:
  """``num_processes`` training processes of one run, coordinated on localhost.

  ``command``: another command's arguments than the training run's."""
  port = free_port()
  procs = []
  for i in range(num_processes):
    args = [sys.executable, "-m", *(command or [
        "tfx_jax.train", "--config", "configs/lm.py:tiny", "--workdir", str(workdir),
        *cli_flags(overrides)]), "--distributed",
            f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}",
            f"--process_id={i}"]
    log = open(pathlib.Path(workdir).parent / f"{pathlib.Path(workdir).name}.{i}.log", "ab")
    procs.append(subprocess.Popen(args, cwd=ROOT, env=subprocess_env(cache_dir),
                                  stdout=log, stderr=subprocess.STDOUT))
  return procs


def finish(procs, workdir, timeout=240) -> None:
  for i, proc in enumerate(procs):
    code = proc.wait(timeout=timeout)
    log = pathlib.Path(workdir).parent / f"{pathlib.Path(workdir).name}.{i}.log"
    assert code == 0, f"process {i} exited {code}:\n{log.read_text()[-4000:]}"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cache_dir):
  workdir = tmp_path_factory.mktemp("one") / "run"
  with compilation_cache(cache_dir):
    code, _, err = run_cli(["--config", f"{ROOT / 'configs/lm.py'}:tiny", "--workdir",
                            workdir, *cli_flags(ONE_PROCESS_TWO_SHARDS)])
  assert code == 0, err[-3000:]
  return workdir


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, cache_dir):
  workdir = tmp_path_factory.mktemp("two") / "run"
  workdir.mkdir()
  finish(start(workdir, 2, cache_dir), workdir)
  return workdir


def assert_close(got: dict, want: dict) -> None:
  for tag in COMPARED:
    assert [s for s, _ in got[tag]] == [s for s, _ in want[tag]], tag
    for (step, a), (_, b) in zip(got[tag], want[tag]):
      assert a == pytest.approx(b, **TOLERANCE), (tag, step)


@pytest.mark.slow
def test_two_processes_train_and_evaluate_to_the_one_process_numbers(one_process,
                                                                     two_processes):
  got = scalars(two_processes)
  assert_close(got, scalars(one_process))
  assert [s for s, _ in got["eval/loss"]] == [0, 10, 20]  # step 0: eval.at_start
  # Only process 0 writes TensorBoard, status.json and the console.
  assert len(list((two_processes / "tensorboard").glob("events.*"))) == 1
  assert status_lib.read_status(two_processes).state == "finished"
  logs = [(two_processes.parent / f"run.{i}.log").read_text() for i in range(2)]
  assert "Finished at step 20" in logs[0] and "Finished at step 20" not in logs[1]
  assert "step     20/20" not in logs[1]


@pytest.mark.slow
def test_two_processes_evaluate_a_split_to_the_one_process_metrics(one_process,
                                                                   two_processes, cache_dir):
  # 3 documents make 9 rows, read as 2 shards (documents 0 and 2, and 1) of
  # unequal lengths: the process whose shard ends first pads with zero rows
  # until the other's has ended too, so both run the same number of batches.
  split = "validation[:3]"
  command = ["tfx_jax.evaluate", "--workdir", str(two_processes), "--split", split]
  finish(start(two_processes, 2, cache_dir, command=command), two_processes)
  proc = subprocess.run([sys.executable, "-m", "tfx_jax.evaluate", "--workdir",
                         str(one_process), "--split", split], cwd=ROOT,
                        env=subprocess_env(cache_dir), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  one, two = (workdir / "eval" for workdir in (one_process, two_processes))
  want = json.loads((one / f"{split}-20.json").read_text())
  got = json.loads((two / f"{split}-20.json").read_text())
  assert got["num_examples"] == want["num_examples"] == 9
  # The standard errors across rows too: the padding rows of the shard that
  # ended first count for nothing. Bits per byte: the split's bits over its
  # bytes, both summed over the processes' rows before dividing.
  for key in ("loss", "perplexity", "loss_se", "bpb", "bpb_se"):
    assert got[key] == pytest.approx(want[key], **TOLERANCE)
  # Process 0 writes every process's examples, in the one-process order.
  assert (two / f"{split}-20.ref.txt").read_text() == (one / f"{split}-20.ref.txt").read_text()


@pytest.mark.slow
def test_kill_9_of_either_process_then_restarting_both_resumes_exactly(two_processes,
                                                                       tmp_path, cache_dir):
  workdir = tmp_path / "run"
  workdir.mkdir()
  log0 = workdir.parent / "run.0.log"
  # Checkpoints every 5 steps leave time to kill the run between two of them.
  overrides = {"checkpoint.every_steps": 5}

  def kill(procs, first: int) -> None:
    # One process dies; its peer is then stuck in a collective (or fails on
    # the lost coordinator) and is killed too, as a cluster manager would.
    procs[first].send_signal(signal.SIGKILL)
    procs[first].wait()
    time.sleep(0.5)
    procs[1 - first].send_signal(signal.SIGKILL)
    procs[1 - first].wait()
    status = status_lib.read_status(workdir)
    assert status is None or status.state != "finished", (
        "the run finished before it was killed")

  # 1. Process 0 (coordinator, checkpoint primary) dies after step 5's checkpoint.
  procs = start(workdir, 2, cache_dir, overrides)
  wait_until(lambda: (workdir / "checkpoints" / "5").is_dir()
             or any(p.poll() is not None for p in procs), 240, "no checkpoint at step 5")
  kill(procs, 0)
  # 2. Restarted, process 1 dies at once after the resume, at any moment of
  # the compilation or the first steps.
  procs = start(workdir, 2, cache_dir, overrides)
  wait_until(lambda: "Resumed from step " in log0.read_text(errors="replace")
             or any(p.poll() is not None for p in procs), 240, "no resume")
  kill(procs, 1)
  # 3. Restarted again, the run finishes with the uninterrupted run's numbers.
  finish(start(workdir, 2, cache_dir, overrides), workdir)
  assert log0.read_text().count("Resumed from step ") == 2
  got, want = scalars(workdir), scalars(two_processes)
  for tag in ("train/loss", "train/grad_norm", "eval/loss"):
    assert got[tag] == want[tag], tag  # bitwise: same process count, same order


@pytest.mark.slow
def test_srun_two_tasks_train_to_the_one_process_numbers(slurm_cluster, one_process,
                                                         tmp_path, cache_dir):
  workdir = tmp_path / "run"
  # With no --coordinator_address/--num_processes/--process_id, JAX reads them
  # from SLURM's task environment; the coordinator port is pinned to a free one.
  env = {**subprocess_env(cache_dir), **slurm_cluster,
         "JAX_COORDINATOR_PORT": str(free_port())}
  proc = subprocess.run(
      ["srun", "-n", "2", "--kill-on-bad-exit=1", sys.executable, "-m", "tfx_jax.train",
       "--config", "configs/lm.py:tiny", "--workdir", str(workdir), *cli_flags(),
       "--distributed"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.count("Finished at step 20") == 1  # process 0 only
  assert_close(scalars(workdir), scalars(one_process))


@pytest.mark.slow
def test_runs_resume_on_another_number_of_processes(one_process, two_processes, tmp_path,
                                                    cache_dir):
  # The two-process run (data.num_shards=0: 2 shards) goes on in one process,
  # which keeps the checkpoint's 2 shards; the one-process run of 2 shards goes
  # on in two processes. Both continue the same data to the same numbers.
  more = {"train.num_steps": 30}
  on_one, on_two = tmp_path / "on_one" / "run", tmp_path / "on_two" / "run"
  shutil.copytree(two_processes, on_one)
  shutil.copytree(one_process, on_two)
  with compilation_cache(cache_dir):
    code, out, err = run_cli(["--config", f"{ROOT / 'configs/lm.py'}:tiny", "--workdir",
                              on_one, *cli_flags(more)])
  assert code == 0, err[-3000:]
  assert "Resumed from step 20" in out + err
  finish(start(on_two, 2, cache_dir, {**more, **ONE_PROCESS_TWO_SHARDS}), on_two)
  got, want = scalars(on_one), scalars(on_two)
  for tag in ("train/loss", "train/grad_norm", "eval/loss"):
    assert [s for s, _ in got[tag]][-1] == 30, tag
    tail = [(s, v) for s, v in got[tag] if s > 20]
    assert tail and [s for s, _ in tail] == [s for s, _ in want[tag] if s > 20]
    for (step, a), (_, b) in zip(tail, [(s, v) for s, v in want[tag] if s > 20]):
      assert a == pytest.approx(b, **TOLERANCE), (tag, step)


@pytest.mark.slow
def test_the_sbatch_script_trains_one_run_over_two_tasks(slurm_cluster, one_process,
                                                         tmp_path, cache_dir):
  if not (ROOT / ".venv" / "bin" / "python").exists():
    pytest.skip("scripts/train.sbatch runs ./launch.sh, which needs the .venv that "
                "`./launch.sh test` creates")
  workdir, log = tmp_path / "run", tmp_path / "job.out"
  env = {**subprocess_env(cache_dir), **slurm_cluster,
         "JAX_COORDINATOR_PORT": str(free_port())}
  # The script asks for 2 GPU nodes; the one-node CPU cluster gets 2 tasks on
  # its one node instead, by the command line's options, which win over #SBATCH.
  proc = subprocess.run(
      ["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0",
       "--cpus-per-task=1", f"--output={log}", "scripts/train.sbatch",
       "--config", "configs/lm.py:tiny", "--workdir", str(workdir), *cli_flags()],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
  output = log.read_text() if log.exists() else ""
  assert proc.returncode == 0, proc.stdout + proc.stderr + output[-3000:]
  assert output.count("Finished at step 20") == 1  # process 0 only
  assert_close(scalars(workdir), scalars(one_process))


@pytest.mark.parametrize("flags,message", [
    (["--num_processes=2"], "need(s) --distributed"),
    (["--distributed", "--num_processes=2"], "also needs --coordinator_address"),
    (["--distributed", "--coordinator_address=localhost", "--num_processes=2",
      "--process_id=0"], "must be host:port"),
    (["--distributed", "--coordinator_address=localhost:1", "--num_processes=2",
      "--process_id=2"], "must be in [0"),
])
def test_bad_distributed_flags_exit_2_before_jax_starts(flags, message, tmp_path):
  code, _, err = run_cli(["--config", f"{ROOT / 'configs/lm.py'}:tiny", "--workdir",
                          tmp_path / "run", *flags])
  assert code == 2 and message in err and "Traceback" not in err
  assert not (tmp_path / "run").exists()


def test_distributed_without_flags_or_a_cluster_exits_2(tmp_path):
  env = {k: v for k, v in subprocess_env(tmp_path / "cache").items()
         if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
  proc = subprocess.run([sys.executable, "-m", "tfx_jax.train", "--config",
                         "configs/lm.py:tiny", "--workdir", str(tmp_path / "run"),
                         "--distributed"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "found no cluster to join" in proc.stderr and "Traceback" not in proc.stderr
  assert not (tmp_path / "run").exists()


# ------------------------------------------------------------ data per process
def _small_source(monkeypatch, n: int) -> None:
  """make_data reads ``n`` short in-memory documents instead of the corpus."""
  real = pipeline.make_dataset
  docs = [{"text": f"document {i}: " + "to be or not to be " * (1 + i % 5)}
          for i in range(n)]
  monkeypatch.setattr(pipeline, "make_dataset",
                      lambda *a, **kw: real(*a, source=docs, **kw))


def _batches(config, tokenizer, split, train, *, num_shards, process_index=0,
             process_count=1, count=6):
  it = iter(run_setup.make_data(config, tokenizer, split, train=train, num_shards=num_shards,
                                process_index=process_index, process_count=process_count))
  return list(itertools.islice(it, count))


@pytest.mark.parametrize("num_shards,num_processes", [(2, 2), (4, 2), (1, 2), (2, 4)])
def test_processes_read_their_shards_of_the_same_global_batches(monkeypatch, num_shards,
                                                                num_processes):
  _small_source(monkeypatch, 23)
  config = tiny_config(overrides={"eval.batch_size": 8, "train.batch_size": 8})
  tokenizer = run_setup.load_tokenizer(config)
  reads = []
  real = pipeline.make_dataset
  monkeypatch.setattr(pipeline, "make_dataset",
                      lambda *a, **kw: reads.append(kw["shard_index"]) or real(*a, **kw))
  for split, train in (("train", True), ("validation", False)):
    one = _batches(config, tokenizer, split, train, num_shards=num_shards)
    parts = []
    for i in range(num_processes):
      reads.clear()
      parts.append(_batches(config, tokenizer, split, train, num_shards=num_shards,
                            process_index=i, process_count=num_processes))
      # Each process builds the pipelines of its own shards only.
      per = max(1, num_shards // num_processes)
      first = i * per if num_shards >= num_processes else i // (num_processes // num_shards)
      assert reads == list(range(first, first + per))
    # The same number of batches on every process (no stalled collective) ...
    assert all(len(part) == len(one) for part in parts)
    for whole, *rows in zip(one, *parts):
      # ... and together exactly the one-process global batch of as many shards.
      for key in whole:
        assert {r[key].shape[0] for r in rows} == {8 // num_processes}
        np.testing.assert_array_equal(np.concatenate([r[key] for r in rows]), whole[key])
    if not train:
      # 23 short documents pack into fewer rows than 6 batches: the last batch is
      # padded with zero-weight rows, which the evaluation sums weigh out.
      assert len(one) < 6 and one[-1]["weights"][-1].sum() == 0


def test_shards_change_the_order_not_the_evaluated_tokens(monkeypatch):
  _small_source(monkeypatch, 23)
  config = tiny_config(overrides={"eval.batch_size": 8})
  tokenizer = run_setup.load_tokenizer(config)

  def tokens(num_shards):
    batches = _batches(config, tokenizer, "validation", False, num_shards=num_shards,
                       count=100)
    return sorted(int(t) for b in batches for t in b["targets"][b["weights"] > 0])

  one = tokens(1)
  assert tokens(2) == tokens(4) == one and len(one) > 500


def test_a_sharded_position_restores_on_another_process_count(monkeypatch):
  _small_source(monkeypatch, 23)
  config = tiny_config(overrides={"train.batch_size": 8})
  tokenizer = run_setup.load_tokenizer(config)
  it = iter(run_setup.make_data(config, tokenizer, "train", train=True, num_shards=2))
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # as a checkpoint stores it
  want = next(it)
  for n in (1, 2):
    got = []
    for i in range(n):
      resumed = iter(run_setup.make_data(config, tokenizer, "train", train=True,
                                         num_shards=2, process_index=i, process_count=n))
      resumed.set_state(state)
      got.append(next(resumed))
    for key in want:
      np.testing.assert_array_equal(np.concatenate([g[key] for g in got]), want[key])
  with pytest.raises(ConfigError, match="written with data.num_shards=2"):
    iter(run_setup.make_data(config, tokenizer, "train", train=True,
                             num_shards=4)).set_state(state)


@pytest.mark.parametrize("overrides,processes,message", [
    ({"train.batch_size": 8}, 3, "divisible by the number of processes"),
    ({"train.batch_size": 6, "data.num_shards": 4}, 1, "divisible by the number of data shards"),
])
def test_batches_that_do_not_divide_among_processes_or_shards_are_refused(
    overrides, processes, message):
  config = tiny_config(overrides=overrides)
  with pytest.raises(ConfigError, match=message):
    run_setup.check_batches(config, process_count=processes)


def test_shard_counts_that_do_not_divide_the_processes_are_refused():
  with pytest.raises(ConfigError, match="data.num_shards=3 and the 2 processes"):
    shards_lib.assignment(3, 2, 0)


_LOCKED = """
import sys, time
from tfx_jax.data import sources
with sources.build_lock(sys.argv[1], "tfx_shakespeare"):
  with open(sys.argv[2], "a") as f:
    f.write("start\\n"); f.flush(); time.sleep(0.5); f.write("end\\n")
"""


def test_datasets_and_tokenizers_are_built_by_one_process_at_a_time(tmp_path):
  log = tmp_path / "log"
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-c", _LOCKED, str(tmp_path), str(log)],
                            env=env) for _ in range(2)]
  assert [p.wait(timeout=120) for p in procs] == [0, 0]
  assert log.read_text().split() == ["start", "end", "start", "end"]
