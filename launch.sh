#!/usr/bin/env bash
# tfx_jax entry points. Usage: ./launch.sh {quickstart|test [--fast]|smoke|train ARGS...|srun-train ARGS...|sweep ARGS...|report SWEEP_DIR|bench ARGS...|compile ARGS...}
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=.venv
PY="$VENV/bin/python"

usage() {
  cat >&2 <<'USAGE'
usage: ./launch.sh COMMAND

  quickstart      set up .venv, build the embedded Shakespeare corpus, train
                  the tiny language model, evaluate it and sample from it
  test [--fast] [PYTEST ARGS...]
                  set up .venv and run the test suite (every test, as CI
                  does); --fast: only the tests of pure functions and
                  formulas, none that trains or starts processes (a few
                  minutes; tests/conftest.py says how a test's tier is found)
  smoke           run the tiny variant of every experiment in experiments/
                  (a smoke test of each, in a temporary directory)
  train ARGS...   python -m tfx_jax.train ARGS... inside .venv
                  (e.g. --config configs/lm.py:tiny --workdir runs/lm_tiny)
  srun-train ARGS...
                  one run over all tasks of a SLURM allocation (sbatch,
                  salloc): srun starts python -m tfx_jax.train --distributed
                  ARGS... in every task (see scripts/train.sbatch)
  sweep ARGS...   python -m tfx_jax.sweep ARGS... inside .venv (e.g.
                  experiments/activations.py:tiny --parallel 2; --dry-run,
                  --executor slurm, --status, --retry-failed, --workdir)
  report DIR      python -m tfx_jax.report DIR (a sweep directory, runs/NAME)
  bench ARGS...   python benchmarks/bench.py ARGS... inside .venv: speed against
                  Hugging Face PyTorch (e.g. --quick --json bench.json; a
                  relative path is in the repository); the PyTorch side needs
                  the bench extra (docs/performance.md)
  compile ARGS... python -m tfx_jax.compile ARGS... inside .venv, with the
                  tpu-aot extra (libtpu) installed: compile a run for a TPU
                  topology on this machine and check that it fits (e.g.
                  --config configs/lm.py:llama_7b --topology v5e-16; docs/scale.md)
USAGE
}

# Creates .venv (reusing packages already installed for the system Python)
# and installs the project in editable mode with its test extras (and the
# extras named as arguments, e.g. tpu-aot). The install is redone only when
# pyproject.toml or the extras change.
setup_venv() {
  if [[ ! -x "$PY" ]]; then
    echo "==> creating $VENV" >&2
    "${PYTHON:-python3}" -m venv --system-site-packages "$VENV"
  fi
  # The stamp is named after pyproject.toml and lists the extras installed with
  # it: asking for one more installs once, asking for fewer installs nothing.
  local stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
  local extras=() extra missing=0
  [[ -f "$stamp" ]] && mapfile -t extras < "$stamp"
  for extra in test "$@"; do
    if [[ " ${extras[*]} " != *" $extra "* ]]; then
      extras+=("$extra")
      missing=1
    fi
  done
  if (( missing )); then
    local joined
    joined="$(IFS=,; echo "${extras[*]}")"
    echo "==> installing tfx_jax and its dependencies ($joined) into $VENV" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check -e ".[$joined]"
    rm -f "$VENV"/.installed-*
    printf '%s\n' "${extras[@]}" > "$stamp"
  fi
}

quickstart() {
  local workdir=runs/quickstart
  setup_venv
  echo "==> building the embedded dataset tfx_shakespeare" >&2
  # vocab 1024: the SentencePiece size of configs/lm.py:tiny (data.vocab_size)
  "$PY" -m tfx_jax.data.prepare --name tfx_shakespeare --vocab_size 1024
  echo "==> training the tiny language model in $workdir" >&2
  "$PY" -m tfx_jax.train --config configs/lm.py:tiny --workdir "$workdir"
  echo "==> evaluating" >&2
  "$PY" -m tfx_jax.evaluate --workdir "$workdir"
  echo "==> sampling" >&2
  "$PY" -m tfx_jax.generate --workdir "$workdir" --prompt $'ROMEO.\n' \
      --temperature 0.8 --top_k 40 --max_new_tokens 64
  echo >&2
  echo "TensorBoard logs: $workdir  (view with: $VENV/bin/tensorboard --logdir $workdir)" >&2
}

case "${1:-}" in
  quickstart)
    quickstart
    ;;
  test)
    shift
    setup_venv
    # One pytest-xdist worker per core, at most 4 (each worker holds its own
    # JAX runtime); TFX_TEST_WORKERS=0 runs the suite in this process.
    workers="${TFX_TEST_WORKERS:-$(nproc)}"
    if (( workers > 4 )); then workers=4; fi
    "$PY" -m pytest -q -n "$workers" --dist loadgroup "$@"
    ;;
  smoke)
    shift
    setup_venv
    smoke_dir="$(mktemp -d)"
    for file in experiments/*.py; do
      start=$SECONDS
      if ! "$PY" -m tfx_jax.sweep "$file:tiny" --workdir "$smoke_dir" --parallel 2 "$@" \
          > "$smoke_dir/$(basename "$file" .py).log" 2>&1; then
        tail -20 "$smoke_dir/$(basename "$file" .py).log" >&2
        echo "smoke: $file:tiny failed (log: $smoke_dir)" >&2
        exit 1
      fi
      echo "smoke: $file:tiny finished in $((SECONDS - start)) s"
    done
    rm -rf "$smoke_dir"
    ;;
  train)
    shift
    setup_venv
    "$PY" -m tfx_jax.train "$@"
    ;;
  srun-train)
    shift
    setup_venv  # once, here, not in every task
    # One task per process; JAX reads the coordinator, the process count and
    # this process's index from SLURM. A task that fails ends the others.
    srun --kill-on-bad-exit=1 "$PY" -m tfx_jax.train --distributed "$@"
    ;;
  sweep)
    shift
    setup_venv
    "$PY" -m tfx_jax.sweep "$@"
    ;;
  report)
    shift
    setup_venv
    "$PY" -m tfx_jax.report "$@"
    ;;
  bench)
    shift
    setup_venv
    "$PY" benchmarks/bench.py "$@"
    ;;
  compile)
    shift
    setup_venv tpu-aot  # libtpu, matched to jax: compiles for TPU topologies here
    "$PY" -m tfx_jax.compile "$@"
    ;;
  -h|--help|help)
    usage
    ;;
  *)
    usage
    exit 2
    ;;
esac
