"""sweep.json and status.json as the code's own writers write them, for
tests/records/test_records.py: the same records, built through the public API, are
written by the code under test and compared byte for byte with the files in
tests/fixtures/records/ (written by these same functions with the code
before records were typed; see that test).

Only what differs from run to run is normalised: the times stamped when a
file is written and the working directory a sweep is declared in."""

from __future__ import annotations

import pathlib
import re

STAMPED = re.compile(r'("(?:updated|created|cwd)": )"[^"]*"')


def normalised(text: str) -> str:
  """``text`` with its time stamps and working directory replaced by "-"."""
  return STAMPED.sub(r'\1"-"', text)


def write_sweeps(out: pathlib.Path) -> list[pathlib.Path]:
  """sweep.json of a record with every part (tuned runs, conditional
  evaluations, declared comparisons, added seeds, SLURM jobs, margins, a run
  observed), and one of a file in the first sweeps' shape read and written
  again."""
  import json  # pylint: disable=import-outside-toplevel
  import textwrap  # pylint: disable=import-outside-toplevel
  from tfx_jax.records import sweep as sweep_record  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import cli  # pylint: disable=import-outside-toplevel
  from tfx_jax.sweep import spec as spec_lib  # pylint: disable=import-outside-toplevel
  out.mkdir(parents=True, exist_ok=True)
  file = out / "every.py"
  file.write_text(textwrap.dedent("""
      from tfx_jax.sweep import Evaluation, Sweep
      def get_sweep(variant="default"):
        return Sweep(
            name="every", config="configs/lm.py:tiny", description="every part",
            axes=[{"model.position": ["rope", "alibi"]}, {"model.num_layers": [2, 1, 3]}],
            seeds=[0, 1], confirm=2, overrides={"train.num_steps": 30, "model.use_bias": False},
            tune={"optim.learning_rate": [{"values": [1e-3, 3e-3],
                                           "when": {"model.position": "rope"}},
                                          {"values": [1e-2], "when": {"model.position": "alibi"}}],
                  "optim.weight_decay": [0.0, 0.1]},
            comparisons=[({"model.num_layers": 3}, {"model.num_layers": 1})],
            evaluations=[["--split", "test"],
                         Evaluation(["--lengths", "1x,2x", "--rope_scaling", "yarn",
                                     "--rope_scaling_factor", "2"],
                                    when={"model.position": "rope"})])
  """))
  sweep = cli.declared_sweep(cli._parser().parse_args([str(file)]), {})
  axes, runs = spec_lib.expand(sweep)
  record = cli.build_record(sweep, axes, runs, "python -m tfx_jax.sweep ...", None,
                            sweep_record.ReportOptions(stall_margin=0.1))
  record.added.append(sweep_record.AddedRun("x_s2", 2, record.runs[0].name, "confirm"))
  record.slurm_jobs.append(sweep_record.SlurmJob("17", "now", "--time=1:00:00",
                                                 ("a_s0", "b_s0")))
  record.runs[0].observe(sweep_record.RunProgress("finished", 30, "", 1.5))
  record.runs[1].observe(sweep_record.RunProgress("diverged", 12, "nan at step 12", None))
  record.runs[1].attempts, record.runs[1].wall_seconds = 2, 17.25
  full = out / "full"
  sweep_record.write(full, record)
  first = out / "first"
  first.mkdir(parents=True, exist_ok=True)
  (first / "sweep.json").write_text(json.dumps({
      "name": "old", "config": "configs/lm.py:tiny", "seeds": [0],
      "axes": [{"label": "model.activation",
                "values": [{"model.activation": "relu"}, {"model.activation": "swiglu"}]}],
      "command": "python -m tfx_jax.sweep --until-resolved 4",
      "evaluations": [["--split", "test"]],
      "runs": [{"name": f"activation-{act}_s0", "seed": 0,
                "values": [{"model.activation": act}],
                "overrides": {"model.activation": act, "seed": 0}, "state": "running",
                "step": 10, "wall_seconds": 12.5}
               for act in ("relu", "swiglu")]}))
  sweep_record.write(first, sweep_record.read(first))
  return [full / "sweep.json", first / "sweep.json"]


def write_statuses(out: pathlib.Path) -> list[pathlib.Path]:
  """status.json as the trainer and the sweep write it at each stage: started,
  compiled, finished, diverged, preempted, failed by the sweep, finished again."""
  from tfx_jax.records import status as status_lib  # pylint: disable=import-outside-toplevel
  seconds = {"startup": 9.1, "compile": 6.6, "train_steps": 58.0, "evaluations": 3.2,
             "checkpointing": 0.8}
  writes = {
      "started": ("running", 0, {"seconds": seconds, "cores": 2}),
      "compiled": ("running", 0, {"compile_seconds": 6.6, "num_params": 1234,
                                  "seconds": seconds, "cores": 2}),
      "finished": ("finished", 30, {"reason": "", "num_nonfinite_skipped": 0,
                                    "num_params": 1234, "compile_seconds": 6.6,
                                    "seconds": seconds, "cores": 2}),
      "diverged": ("diverged", 12, {"reason": "non-finite loss or gradient at step 12",
                                    "num_nonfinite_skipped": 3, "num_params": 1234,
                                    "seconds": seconds, "cores": 1}),
      "preempted": ("preempted", 20, {"reason": "interrupted; resumes from step 20",
                                      "seconds": seconds, "cores": 4}),
      "failed": ("failed", 7, {"reason": "exit code 1"}),
      "again": ("finished", 30, {"reason": "already finished", "num_nonfinite_skipped": 0,
                                 "num_params": 1234, "compile_seconds": 6.6,
                                 "seconds": seconds, "cores": 2}),
  }
  paths = []
  for name, (state, step, fields) in writes.items():
    (out / name).mkdir(parents=True, exist_ok=True)
    status_lib.write_status(out / name, state, step, **fields)
    paths.append(out / name / "status.json")
  return paths
