"""Helpers shared by the test modules (fixtures live in conftest.py).

- The tiny run: ``TINY`` overrides, ``load_config`` / ``tiny_config`` (a config
  file's preset, shrunk), ``cli_flags`` (the same overrides as flags) and the
  config files' presets (``CONFIG_FILES``, ``presets``, ``ALL_PRESETS``).
- A tiny run in this process: through the trainer (``train``) or the
  training command (``train_cli``, ``run_cli``); or as a subprocess
  (``train_command`` with ``subprocess_env``). They share one persistent JAX
  compilation cache (``compilation_cache``; a test file turns it on with the
  ``shared_compilation_cache`` fixture of conftest.py).
- Any command (train, evaluate, generate) in this process: ``run_command``.
- Processes and ports: ``free_port``, ``wait_until``.
- ``trains``: marks the helpers above that train or start processes, which
  keep a test out of the fast tier (conftest.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def trains(helper):
  """Marks a helper that trains or starts processes: a test that calls it
  (itself, through a helper of its module or through a fixture) is left out
  of the fast tier (``./launch.sh test --fast``, conftest.py)."""
  helper.trains = True
  return helper
CONFIG_FILES = sorted(p.name for p in (ROOT / "configs").glob("*.py"))

# Every training test shrinks a preset with these overrides: seconds on a CPU.
# The vocabulary stays the preset's (= data.vocab_size), so the SentencePiece
# model prepared once in the default TFDS data dir is reused. decay_steps is
# pinned so that runs of different lengths share one learning-rate schedule
# (and one compiled train step).
TINY = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.d_ff": 64,
    "train.batch_size": 4,
    "train.seq_len": 32,
    "train.num_steps": 20,
    "train.log_every_steps": 1,
    "eval.every_steps": 10,
    "eval.num_batches": 2,
    "eval.batch_size": 4,
    "eval.num_samples": 0,
    "eval.num_bleu_examples": 0,
    "checkpoint.every_steps": 10,
    "optim.warmup_steps": 5,
    "optim.decay_steps": 20,
}


def _config_module(file: str, name: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(spec: str):
  """``"lm.py:tiny"`` -> the locked ConfigDict of configs/lm.py, preset tiny."""
  file, _, preset = spec.partition(":")
  module = _config_module(file, f"_config_{file[:-3]}")
  return module.get_config(preset) if preset else module.get_config()


def presets(file: str) -> tuple[str, ...]:
  """The preset names of one config file (its ``PRESETS``)."""
  return _config_module(file, f"_presets_{file[:-3]}").PRESETS


ALL_PRESETS = [(f, p) for f in CONFIG_FILES for p in presets(f)]


def tiny_config(spec: str = "lm.py:tiny", overrides: dict | None = None):
  """``spec`` shrunk by ``TINY``, then ``overrides`` ({"train.num_steps": 10})."""
  config = load_config(spec)
  config.update_from_flattened_dict({**TINY, **(overrides or {})})
  return config


def cli_flags(overrides: dict | None = None) -> list[str]:
  """``TINY`` + ``overrides`` as ``--config.a.b=v`` flags (same values as tiny_config)."""
  return [f"--config.{k}={v}" for k, v in {**TINY, **(overrides or {})}.items()]


@trains
def train_command(spec: str, workdir, overrides: dict | None = None) -> list[str]:
  """The training command of config ``spec`` shrunk by ``TINY`` + ``overrides``."""
  return [sys.executable, "-m", "tfx_jax.train", "--config", f"configs/{spec}",
          "--workdir", str(workdir), *cli_flags(overrides)]


@trains
def subprocess_env(cache_dir) -> dict:
  """Environment of training subprocesses: CPU, one shared compilation cache."""
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
              JAX_COMPILATION_CACHE_DIR=str(cache_dir),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


@contextlib.contextmanager
def compilation_cache(cache_dir):
  """JAX's persistent compilation cache in ``cache_dir``, for this block only.

  Runs of the same tiny config then compile their steps once per session,
  in this process and in the training subprocesses (``subprocess_env``).
  """
  from jax.experimental.compilation_cache import compilation_cache as cc  # pylint: disable=import-outside-toplevel
  settings = {"jax_compilation_cache_dir": str(cache_dir),
              "jax_persistent_cache_min_compile_time_secs": 0.0,
              "jax_persistent_cache_min_entry_size_bytes": 0}
  old = {name: getattr(jax.config, name) for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  cc.reset_cache()
  try:
    yield
  finally:
    for name, value in old.items():
      jax.config.update(name, value)
    cc.reset_cache()


@trains
def run_command(module, args) -> tuple[int, str, str]:
  """Runs ``python -m <module> ARGS`` in this process, for a command module of
  tfx_jax (``train``, ``evaluate``, ``generate``): (exit code, stdout, stderr).

  The real entry point (absl flag parsing, config overrides, error handling)
  runs; ``run_main`` resets the command's own flag registry on every call.
  """
  from tfx_jax.core import flags as cli  # pylint: disable=import-outside-toplevel
  argv = [module.__name__, *[str(a) for a in args]]
  old_argv, sys.argv = sys.argv, argv  # ml_collections reads overrides from sys.argv
  out, err = io.StringIO(), io.StringIO()
  code = 0
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      cli.run_main(module.main, module.FLAGS, argv)
  except SystemExit as e:
    code = 0 if e.code is None else e.code
  finally:
    sys.argv = old_argv
  return code, out.getvalue(), err.getvalue()


@trains
def run_cli(args: list[str]) -> tuple[int, str, str]:
  """Runs ``python -m tfx_jax.train ARGS`` in this process: (exit code, stdout, stderr)."""
  from tfx_jax import train as command  # pylint: disable=import-outside-toplevel
  return run_command(command, args)


def _merged(overrides) -> dict:
  """Dicts of overrides as one, later ones winning."""
  merged = {}
  for more in overrides:
    merged.update(more)
  return merged


@trains
def train(spec: str, workdir, *overrides: dict):
  """A tiny run in ``workdir``, in this process: config ``spec`` shrunk by ``TINY``,
  then by each of ``overrides`` in turn (a file's own settings, then a test's).

  Returns the trainer's ``RunResult``, whatever the run's status; errors raise.
  """
  from tfx_jax.run import trainer  # pylint: disable=import-outside-toplevel
  return trainer.train_and_evaluate(tiny_config(spec, _merged(overrides)), str(workdir))


@trains
def train_cli(spec: str, workdir, *overrides: dict) -> tuple[int, str, str]:
  """The same run through ``python -m tfx_jax.train``, in this process (``run_cli``):
  (exit code, stdout, stderr)."""
  return run_cli(["--config", str(ROOT / "configs" / spec), "--workdir", str(workdir),
                  *cli_flags(_merged(overrides))])


def sweep_in_process(args, capsys) -> tuple[int, str, str]:
  """``python -m tfx_jax.sweep ARGS`` in this process from the repository root:
  (exit code, stdout, stderr). Validation and dry runs start nothing."""
  from tfx_jax.sweep import cli  # pylint: disable=import-outside-toplevel
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    code = cli.main([str(a) for a in args])
  finally:
    os.chdir(cwd)
  out = capsys.readouterr()
  return code, out.out, out.err


def free_port() -> int:
  """A TCP port on localhost that nothing listens on (now)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, logs=None) -> None:
  """Polls ``predicate`` until true; AssertionError "``what`` within ..." after
  ``timeout`` seconds, with the tails of ``logs``' *.log and *.out files."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  detail = ""
  if logs is not None:
    detail = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                       for p in sorted(logs.glob("*.log")) + sorted(logs.glob("*.out")))
  raise AssertionError(f"{what} within {timeout:.0f}s\n{detail}")


def start_until(command, env, marker: str):
  """Starts the sweep ``command`` and reads its output up to the line holding
  ``marker``: (the process, the lines read)."""
  proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if marker in line:
      break
  return proc, seen
