"""The coordinate check (``python -m tfx_jax.summary --coord-check``).

Yang et al. 2022 (Tensor Programs V, section 7 and Figure 5; the ``mup``
package's ``get_coord_data``) check a parametrization by training the same
model at several widths for a few steps on the same data and reading the size
of one coordinate of every layer's output, its RMS, against the width: under
muP it stays put, under the standard parametrization the output logits (and,
with Adam, the hidden activations after a few steps) grow with width.

For each width the run's config is taken with ``model.d_model`` = width, the
heads unchanged and every other explicit width (``parametrization.
WIDTH_FIELDS``) scaled with it (the base shape, ``model.mup_base_d_model``,
stays); each model is trained ``steps`` updates by the run's own train step
(optimizer, its settings and groups, seed) on the same first batches of the
training split, at the run's peak learning rate from the first update (a
constant schedule, no warmup: as the ``mup`` package's ``get_coord_data``
trains at a fixed rate). A warmup would make the first few updates a small
fraction of the tuned rate, and the check would then measure the
initialisation only: under muP the output logits and the attention logits of
an untrained model shrink as width^-1/2 (the readout's 1/m and the logits'
1/d_head on independent coordinates; TP5, Table 3), which the updates'
width-independent contribution overtakes once the rate is the tuned one.
At step t (0: at initialisation; t: after t updates) one forward without
dropout on the batch of update t + 1 (the one the step would train on next)
records, through the model's probes (``model/layers/probes.py``, a collection
no training step collects):

- ``<stack>/embedding``: the input layer's output (tokens, positions, norm),
  as the stack reads it;
- ``<stack>_<NN>/<sublayer>``: every residual branch (self-attention,
  cross-attention, FFN or mixture) as it joins the stream;
- ``<stack>_<NN>/<sublayer>_logits``: the attention logits q.k (scaled as
  the model scales them), over the keys each query sees;
- ``output_logits``: the model's output logits (or class logits).

The slope of log RMS against log width (least squares over the widths) says
how each grows: about 0 is width-independent.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import numpy as np

from tfx_jax.core.errors import ConfigError
from tfx_jax.model import parametrization

DEFAULT_WIDTHS = (64, 128, 256, 512)
DEFAULT_STEPS = 5
# The quantity groups: the tables' order and the figure's panels (:func:`group_of`).
GROUPS = ("embedding", "attention output", "ffn output", "attention logits",
          "output logits")


def group_of(name: str) -> str:
  """The group of a quantity, by its name (see the module docstring)."""
  leaf = name.rsplit("/", 1)[-1]
  if name == "output_logits":
    return "output logits"
  if leaf == "embedding":
    return "embedding"
  if leaf.endswith("_logits"):
    return "attention logits"
  return "attention output" if leaf.endswith("attention") else "ffn output"

def parse_widths(text: str) -> tuple[int, ...]:
  """``"64,128,256"`` -> (64, 128, 256): positive, distinct, at least two."""
  try:
    widths = tuple(int(w) for w in text.split(",") if w.strip())
  except ValueError:
    raise ConfigError(f"--widths={text!r} must be comma-separated integers, e.g. "
                      "--widths=64,128,256,512.") from None
  if len(widths) < 2 or len(set(widths)) != len(widths) or min(widths) <= 0:
    raise ConfigError(f"--widths={text!r} must name at least two distinct positive widths "
                      "(the slope is fitted over them), e.g. --widths=64,128,256,512.")
  return tuple(sorted(widths))


def at_width(config, width: int):
  """``config`` (a ConfigDict) with model.d_model = ``width``: the heads as they
  are, every explicit width of ``parametrization.WIDTH_FIELDS`` scaled with it,
  the base shape kept. ConfigError where a width would not be whole."""
  model = config.model
  d_model = int(model.d_model)
  head_dim = int(model.get("head_dim", 0) or 0)
  if not head_dim and width % int(model.num_heads):
    raise ConfigError(
        f"--widths: {width} is not divisible by model.num_heads={model.num_heads} (the "
        f"heads stay as they are and d_head = width / num_heads): choose widths that are "
        f"multiples of {model.num_heads}.")
  out = copy.deepcopy(config)
  for field in parametrization.WIDTH_FIELDS:
    value = int(out.model.get(field, 0) or 0)
    if field == "d_model" or not value:
      continue
    scaled = value * width / d_model
    if scaled != int(scaled):
      raise ConfigError(
          f"--widths: model.{field}={value} scaled from d_model {d_model} to {width} is "
          f"{scaled:g}, not whole: choose widths whose ratio to {d_model} keeps it whole.")
    out.model[field] = int(scaled)
  out.model.d_model = int(width)
  return out


def at_peak_rate(config):
  """``config`` with the optimizer at its peak rate from the first update:
  ``optim.schedule='constant'``, no warmup, the other schedules' fields at
  their defaults (see the module docstring)."""
  from tfx_jax.run import optim
  if config.optim.get("scale_by_d_model", False):
    raise ConfigError(
        "optim.scale_by_d_model=True sets the peak rate from the warmup (lr x d_model^-0.5 "
        "x warmup^-0.5); the coordinate check trains at a constant peak rate: set it to "
        "False and optim.learning_rate to that peak.")
  out = copy.deepcopy(config)
  defaults = optim.OptimSection()
  for fields in optim.SCHEDULE_FIELDS.values():
    for field in fields:
      out.optim[field] = getattr(defaults, field)
  out.optim.schedule = "constant"
  out.optim.warmup_steps = 0
  out.optim.decay_steps = 0
  return out


def resolve_widths(config, widths):
  """The resolved run config at each width (every rule checked, nothing built)."""
  from tfx_jax.run import config as run_config
  return [run_config.resolve(at_peak_rate(at_width(config, w))) for w in widths]


@dataclasses.dataclass(frozen=True)
class CoordCheck:
  """RMS[quantity] = [len(widths), steps + 1] array (step 0: at initialisation)."""
  widths: tuple[int, ...]
  steps: int
  parametrization: str
  rms: dict[str, np.ndarray]

  def slope(self, name: str, step: int | None = None) -> float:
    """Least-squares slope of log RMS on log width at ``step`` (default: the last)."""
    y = self.rms[name][:, self.steps if step is None else step]
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
      return float("nan")
    return float(np.polyfit(np.log(self.widths), np.log(y), 1)[0])

  def ordered(self) -> list[str]:
    """The quantities in the order of ``GROUPS``, then by name."""
    return sorted(self.rms, key=lambda n: (GROUPS.index(group_of(n)), n))


def _flatten_probes(sown) -> dict[str, np.ndarray]:
  """{quantity: value} from the probes' collection: a scanned stack's values
  (``<stack>/layers/...``, one per layer along the leading axis) and a looped
  one's (``<stack>/layer_<i>/...``) both as ``<stack>_<NN>/<name>``."""
  from flax import traverse_util
  out = {}
  for path, value in traverse_util.flatten_dict(sown).items():
    value = np.asarray(value[0] if isinstance(value, tuple) else value)
    *where, name = path
    name = name.removesuffix("_output")
    if name == "logit_rms":  # sown by the attention module: <sublayer>/logit_rms
      name = where.pop() + "_logits"
    if len(where) >= 2 and where[1] == "layers":
      for i, v in enumerate(value.reshape(-1)):
        out[f"{where[0]}_{i:02d}/{name}"] = float(v)
    elif len(where) >= 2 and where[1].startswith("layer_"):
      out[f"{where[0]}_{int(where[1].split('_')[1]):02d}/{name}"] = float(value)
    else:  # <stack>/embedding, the stack's input
      out["/".join([*where, name])] = float(value)
  return out


def _probe_step(run, platform):
  """``probe(params, batch) -> {quantity: RMS}``: one forward without dropout
  with the probes' collection mutable, jitted."""
  import jax
  from tfx_jax import tasks
  from tfx_jax.model.families import build_model
  from tfx_jax.model.layers import probes

  task = tasks.get(run.task)
  model = build_model(run.model, deterministic=True, platform=platform)

  def probe(params, batch):
    out, sown = model.apply({"params": params}, **task.model_inputs(batch),
                            mutable=[probes.COLLECTION])
    logits = out["logits"] if "logits" in out else out["class_logits"]
    return sown[probes.COLLECTION], probes.rms(logits)

  return jax.jit(probe)


def measure(config, widths=DEFAULT_WIDTHS, steps: int = DEFAULT_STEPS, *, log=print
            ) -> CoordCheck:
  """Trains ``config`` (a ConfigDict) at each of ``widths`` for ``steps``
  updates on the same batches and records every probe at every step (see the
  module docstring). Every width's config is resolved before anything compiles."""
  import jax
  from tfx_jax.run import setup as run_setup
  from tfx_jax.run import sharding as sharding_lib

  if steps < 0:
    raise ConfigError(f"--steps={steps} must be >= 0 (0: at initialisation only).")
  runs = resolve_widths(config, widths)
  tokenizer = run_setup.load_tokenizer(runs[0])
  run_setup.check_data(runs[0])
  data = iter(run_setup.make_data(runs[0], tokenizer, "train", train=True))
  # The same batches for every width: the data do not depend on the width.
  batches = [next(data) for _ in range(steps + 1)]
  rms: dict[str, np.ndarray] = {}
  for i, run in enumerate(runs):
    log(f"coord check: d_model {widths[i]} ({steps} steps)")
    sharded = run_setup.ShardedRun(run, run.model)
    state, hparams = sharded.init_state(), sharded.step_hparams()
    train_step, probe = sharded.train_step(), _probe_step(run, sharded.platform)
    for t in range(steps + 1):
      batch = sharding_lib.global_batch(batches[t], sharded.mesh)
      sown, logits = jax.device_get(probe(state.params, batch))
      values = {**_flatten_probes(sown), "output_logits": float(logits)}
      for name, value in values.items():
        rms.setdefault(name, np.full((len(runs), steps + 1), np.nan))[i, t] = value
      if t < steps:
        state, _ = train_step(state, batch, hparams)
  return CoordCheck(widths=tuple(widths), steps=steps,
                    parametrization=runs[0].model.parametrization, rms=rms)


def format_tables(check: CoordCheck) -> str:
  """One table per step: rows the quantities, columns the widths, and the
  log-log slope; the last step's slopes again, per group, at the end."""
  names = check.ordered()
  col = max(11, *(len(str(w)) + 2 for w in check.widths))
  label = max(len(n) for n in names) + 2
  head = "".join(f"{f'd={w}':>{col}}" for w in check.widths) + f"{'slope':>9}"
  lines = [f"coordinate check (model.parametrization={check.parametrization}; the "
           f"optimizer at its peak rate, constant): RMS of each coordinate against d_model; "
           f"slope = d log RMS / d log d_model"]
  for t in range(check.steps + 1):
    lines.append("")
    lines.append(f"step {t}" + (" (at initialisation)" if t == 0 else
                                f" (after {t} update{'s' if t > 1 else ''})"))
    lines.append(f"{'quantity':<{label}}{head}")
    for n in names:
      row = "".join(f"{v:>{col}.4g}" for v in check.rms[n][:, t])
      lines.append(f"{n:<{label}}{row}{check.slope(n, t):>9.3f}")
  lines.append("")
  lines.append(f"slopes at step {check.steps} (mean over each group's quantities):")
  for group in GROUPS:
    slopes = [check.slope(n) for n in names if group_of(n) == group]
    if slopes:
      lines.append(f"  {group:<18} {np.mean(slopes):>7.3f}  "
                   f"(min {np.min(slopes):.3f}, max {np.max(slopes):.3f}, "
                   f"{len(slopes)} quantities)")
  return "\n".join(lines)


def plot(check: CoordCheck, path) -> Path:
  """RMS against width, log-log, one panel per quantity group (the geometric
  mean over its quantities), a line per step: Yang et al.'s Figure 5 layout."""
  import matplotlib
  import matplotlib.ticker
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  groups = [g for g in GROUPS if any(group_of(n) == g for n in check.rms)]
  fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 3.2), squeeze=False)
  colours = plt.cm.viridis(np.linspace(0, 0.9, check.steps + 1))
  for ax, group in zip(axes[0], groups):
    names = [n for n in check.rms if group_of(n) == group]
    values = np.exp(np.mean(np.log(np.stack([check.rms[n] for n in names])), axis=0))
    for t in range(check.steps + 1):
      ax.plot(check.widths, values[:, t], "o-", color=colours[t], ms=3, label=f"t={t}")
    slope = np.mean([check.slope(n) for n in names])
    ax.set(xscale="log", yscale="log", xlabel="d_model",
           title=f"{group}\nslope at t={check.steps}: {slope:.2f}")
    ax.set_xticks(check.widths, [str(w) for w in check.widths])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    # At least a factor of 4 top to bottom: a flat line reads as flat, not as
    # noise magnified to the panel's height.
    finite = values[np.isfinite(values) & (values > 0)]
    if finite.size:
      low, high = float(finite.min()), float(finite.max())
      if high / low < 4:
        middle = math.sqrt(low * high)
        low, high = middle / 2, middle * 2
      ax.set_ylim(low / 1.1, high * 1.1)
  axes[0][0].set_ylabel("RMS of a coordinate")
  axes[0][-1].legend(fontsize=7)
  fig.suptitle(f"coordinate check, model.parametrization={check.parametrization}")
  fig.tight_layout()
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def run(config, widths=DEFAULT_WIDTHS, steps: int = DEFAULT_STEPS, out="coord_check.png",
        *, log=print) -> CoordCheck:
  """:func:`measure`, its tables printed and its figure written to ``out``."""
  check = measure(config, widths, steps, log=log)
  log(format_tables(check))
  log(f"coord check figure written to {plot(check, out).resolve()}")
  return check
