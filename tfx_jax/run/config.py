"""What a run config means, resolved and checked once, without devices.

A locked ConfigDict (``configs/*.py`` plus ``--config.*`` overrides) is the
file format and the command line; :func:`resolve` turns it, here and nowhere
else, into a :class:`RunConfig`: one frozen dataclass per section
(``ModelConfig``, ``DataConfig``, ``TrainConfig``, ``EvalConfig``,
``CheckpointConfig``, ``OptimConfig`` (the chosen optimizer's class),
``FinetuneConfig``, ``MeshConfig``),
every field typed and every rule checked, with the values derived from others
filled in (the optimizer's decay end). The ConfigDict's defaults are generated
from the same dataclasses (``config_base``). Nothing here looks at devices or
processes, builds a mesh, an optimizer or a model, or compiles anything, so a
run meant for an 8-GPU node is checked on a laptop. What depends on the
machine (the mesh against the devices, the batch against the processes) is
checked when a run starts (``run_setup.check_devices``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, get_args

from absl import logging
import flax

from tfx_jax.run import optim
from tfx_jax.run import param_groups
from tfx_jax.run import qk_clip
from tfx_jax.run import sharding
from tfx_jax import tasks
from tfx_jax.core import typed_config
from tfx_jax.data import files_corpus
from tfx_jax.data.config import DataConfig
from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.run.layer_stats import Param as LayerStatsParam
from tfx_jax.model.config import DType, ModelConfig, model_config_from_dict
from tfx_jax.run.optim import OptimConfig, OptimSection
from tfx_jax.run.sharding import MeshConfig

need = typed_config.need

# Config fields a checkpoint must agree on to be resumed: they decide shapes,
# data order or what is learned. Others (num_steps, eval, logging) may change.
RESUME_FIELDS = ("model.", "compute_dtype", "task", "seed", "data.name", "data.version",
                 "data.tokenizer",
                 "data.vocab_size", "data.mask_rate", "data.packing",
                 "data.train_fraction", "train.batch_size",
                 "train.seq_len", "optim.optimizer", "optim.accumulate_steps")
# stop: end the run as diverged; skip: drop the update and keep going.
OnNonfinite = Literal["stop", "skip"]
# Where the MoE load-balancing loss takes its loads: over the whole batch, or
# over each sequence, then averaged (DeepSeek-V3's sequence-wise loss).
MoeAuxScope = Literal["batch", "sequence"]
NONFINITE_CHOICES = get_args(OnNonfinite)
DEFAULT_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """``config.train``."""

  num_steps: int = 1000
  batch_size: int = 32
  seq_len: int = 128
  log_every_steps: int = 50
  label_smoothing: float = 0.0
  # z-loss (PaLM: 1e-4): the objective + z_loss * log^2 Z of the output softmax,
  # averaged over tokens, logged as train/z_loss (train/output_log_z, the mean
  # log Z, is logged always).
  z_loss: float = 0.0
  on_nonfinite: OnNonfinite = "stop"
  # Per-layer gradient, parameter and update norms as TensorBoard scalars
  # (layer_stats/<kind>_norm/<stack>_<NN>) and each layer's largest
  # self-attention logit (layer_stats/max_attention_logit/<stack>_<NN>),
  # computed inside the jitted step.
  log_layer_stats: bool = False
  # The arrays each layer's statistics are taken over (tfx_jax/run/layer_stats.py):
  # all (every array of the layer), or one part, e.g. ffn_out, the FFN's output
  # matrix W2 of Xiong et al. 2020's Figure 3; tags then name it
  # (layer_stats/grad_norm/ffn_out/<stack>_<NN>).
  layer_stats_param: LayerStatsParam = "all"
  # N > 0: before the first update, each layer's gradient norm at the initial
  # parameters on the first N training batches, their mean logged at step 0
  # as layer_stats/init_grad_norm/<layer_stats_param>/<stack>_<NN> (Xiong et
  # al. 2020, Figure 3, average over batches).
  layer_stats_init_batches: int = 0
  # Mixture of experts (model.ffn_type=moe; model/layers/moe.py), logged as
  # train/moe_aux_loss and train/router_z_loss: the weight of the
  # load-balancing loss with model.moe_balance=aux_loss (Switch: 0.01), where
  # it takes its loads (moe_aux_scope), and the weight of the router z-loss
  # (ST-MoE, Zoph et al. 2022: 0.001; 0 = off).
  moe_aux_loss: float = 0.01
  moe_aux_scope: MoeAuxScope = "batch"
  router_z_loss: float = 0.0
  # Several WSD budgets from one run (docs/configs.md): stop_step > 0 follows
  # the schedule of num_steps but stops after update stop_step (a trunk that
  # trains to its last branch point); branch_from (a run's workdir or its
  # checkpoints dir) with branch_step starts a run from that run's whole state
  # at branch_step (a budget's decay) where its own workdir has no checkpoint.
  stop_step: int = 0
  branch_from: str = ""
  branch_step: int = 0
  # QK-clip (Kimi K2's MuonClip; tfx_jax/run/qk_clip.py): tau > 0 scales the
  # query and key projections of each head whose largest attention logit of
  # the step exceeded tau by sqrt(tau / max), after each update (K2: 100;
  # 0 = off); logged as train/qk_clip_fraction.
  qk_clip: float = 0.0

  @property
  def end_step(self) -> int:
    """The step the run trains to: stop_step where set, else num_steps."""
    return self.stop_step or self.num_steps

  def check(self) -> TrainConfig:
    for name in ("num_steps", "batch_size", "seq_len", "log_every_steps"):
      need(getattr(self, name) > 0, f"train.{name}", getattr(self, name), "must be > 0")
    need(0 <= self.stop_step <= self.num_steps, "train.stop_step", self.stop_step,
         f"must be in [0, train.num_steps={self.num_steps}] (0 = off)")
    need(self.branch_step >= 0, "train.branch_step", self.branch_step,
         "must be >= 0 (0 = off)")
    if self.branch_step and not self.branch_from:
      raise InactiveSetting(
          "train.branch_step", 0,
          f"train.branch_step={self.branch_step} is the step of train.branch_from's "
          "checkpoint a run starts from; train.branch_from is not set: set it to the "
          "trunk's workdir, or leave train.branch_step at 0.")
    if self.branch_from and not self.branch_step:
      raise ConfigError(
          f"train.branch_from={self.branch_from!r} needs train.branch_step, the step of "
          "its checkpoint to start from (> 0).")
    need(self.seq_len >= 2, "train.seq_len", self.seq_len, "must be >= 2")
    need(0.0 <= self.label_smoothing < 1.0, "train.label_smoothing", self.label_smoothing,
         "must be in [0, 1)")
    need(math.isfinite(self.z_loss) and self.z_loss >= 0, "train.z_loss", self.z_loss,
         "must be a number >= 0 (0 = off; PaLM: 1e-4)")
    for name in ("moe_aux_loss", "router_z_loss"):
      value = getattr(self, name)
      need(math.isfinite(value) and value >= 0, f"train.{name}", value,
           "must be a number >= 0 (0 = off)")
    need(math.isfinite(self.qk_clip) and self.qk_clip >= 0, "train.qk_clip", self.qk_clip,
         "must be a number >= 0 (0 = off; Kimi K2: 100)")
    need(self.layer_stats_init_batches >= 0, "train.layer_stats_init_batches",
         self.layer_stats_init_batches, "must be >= 0 (0 = off)")
    if (self.layer_stats_param != "all" and not self.log_layer_stats
        and not self.layer_stats_init_batches):
      raise InactiveSetting(
          "train.layer_stats_param", "all",
          f"train.layer_stats_param={self.layer_stats_param!r} chooses the arrays of the "
          "per-layer statistics, which are off: set train.log_layer_stats=True or "
          "train.layer_stats_init_batches > 0, or leave it at 'all'.")
    return self


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """``config.eval``."""

  every_steps: int = 200
  # Batches of the fixed evaluation shuffle each evaluation reads; 0: the whole
  # split. The tiny presets read the whole split: a sample of it adds its own
  # noise to every run's loss (eval/loss_se), larger than a quarter of the
  # seed-to-seed spread for the tiny LM at 4 batches (docs/fair-comparisons.md).
  num_batches: int = 8
  # Batches the last evaluation of training (at train.num_steps, whose eval/*
  # values are the run's final ones, which the sweep report's tuning selects
  # on) reads; -1: as eval.num_batches; 0: the whole split. With
  # eval.num_batches > 0 the evaluations before it read a fixed subset (the
  # first batches of the fixed shuffle) and the final one the whole split:
  # in a tuned sweep of the tiny LM reading the whole split at every
  # evaluation took 184 s of the runs' 496 s against 255 s of train steps.
  final_batches: int = -1
  batch_size: int = 32
  num_bleu_examples: int = 64  # translation: BLEU on a fixed validation subset
  num_samples: int = 3  # decoded samples written to TensorBoard text
  # One evaluation at step 0, before the first update: the loss at
  # initialisation l0, which the sweep report's learning-rate sensitivity
  # (Wortsman et al. 2023) caps each run's loss at, measured instead of
  # assumed ln |V|. Logged as the ordinary eval/* scalars at step 0 (the
  # metrics only: no decoded samples or BLEU of an untrained model). A run
  # resumed from a checkpoint has it already and does not evaluate step 0 again.
  at_start: bool = True

  def check(self) -> EvalConfig:
    for name in ("every_steps", "batch_size"):
      need(getattr(self, name) > 0, f"eval.{name}", getattr(self, name), "must be > 0")
    need(self.num_batches >= 0, "eval.num_batches", self.num_batches,
         "must be >= 0 (0: the whole split)")
    need(self.final_batches >= -1, "eval.final_batches", self.final_batches,
         "must be -1 (as eval.num_batches), 0 (the whole split) or a number of "
         "batches > 0")
    # The final pass gives the intermediate subset's loss too (its first
    # batches), which the still-improving check compares with the evaluation
    # before it: it reads at least that subset.
    need(self.final_batches in (-1, 0) or 0 < self.num_batches <= self.final_batches,
         "eval.final_batches", self.final_batches,
         f"reads at least the batches of the other evaluations (eval.num_batches="
         f"{self.num_batches}; 0: the whole split): -1 (as eval.num_batches), 0 (the "
         f"whole split) or a number >= eval.num_batches")
    for name in ("num_bleu_examples", "num_samples"):
      need(getattr(self, name) >= 0, f"eval.{name}", getattr(self, name), "must be >= 0")
    return self

  def batches_at(self, step: int, num_steps: int) -> int:
    """The batches the evaluation at ``step`` of a run of ``num_steps`` reads
    (0: the whole split): eval.final_batches at the last step, where it is
    set, else eval.num_batches."""
    if step == num_steps and self.final_batches != -1:
      return self.final_batches
    return self.num_batches


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """``config.checkpoint``."""

  every_steps: int = 500
  max_to_keep: int = 3
  # Steps also saved, and never deleted by max_to_keep: a trunk's branch points.
  keep_steps: tuple[int, ...] = ()

  def check(self, end_step: int | None = None) -> CheckpointConfig:
    """``end_step``: the run's last step (train.stop_step or train.num_steps)."""
    for name in ("every_steps", "max_to_keep"):
      need(getattr(self, name) > 0, f"checkpoint.{name}", getattr(self, name), "must be > 0")
    outside = [s for s in self.keep_steps if not 1 <= s <= (end_step or s)]
    need(not outside, "checkpoint.keep_steps", self.keep_steps,
         f"steps {outside} are not in 1..{end_step}, the run's steps "
         "(train.stop_step, or train.num_steps)")
    return self


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
  """``config.finetune``."""

  init_checkpoint: str | None = None  # a workdir or checkpoints dir
  lambda_pt: float = 0.5  # L = L_FT + lambda * L_PT (decoder_only)

  def check(self) -> FinetuneConfig:
    need(0.0 <= self.lambda_pt <= 1.0, "finetune.lambda_pt", self.lambda_pt,
         "must be in [0, 1]")
    return self


# The sections besides ``model``, in the order of the config, with their types
# as the ConfigDict holds them (``optim``: flat, every optimizer's fields).
SECTIONS = {"data": DataConfig, "train": TrainConfig, "eval": EvalConfig,
            "checkpoint": CheckpointConfig, "optim": OptimSection,
            "finetune": FinetuneConfig, "mesh": MeshConfig}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run config resolved: typed sections, every rule checked.

  ``notes`` are what the resolution adapted (said in the run's log);
  ``source`` is the config as given (``config.json``), which evaluation,
  generation and resumes read back.
  """

  seed: int
  task: str
  compute_dtype: DType
  model: ModelConfig
  data: DataConfig
  train: TrainConfig
  eval: EvalConfig
  checkpoint: CheckpointConfig
  optim: OptimConfig
  finetune: FinetuneConfig
  mesh: MeshConfig
  notes: tuple[str, ...] = ()
  source: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def to_dict(self) -> dict[str, Any]:
    """The config as given (nested sections), as ``config.json`` holds it."""
    return self.source

  def with_data_name(self, name: str) -> RunConfig:
    """The same run reading ``data.name`` = ``name`` (a pinned dataset version)."""
    source = {**self.source, "data": {**self.source["data"], "name": name}}
    return dataclasses.replace(self, data=dataclasses.replace(self.data, name=name),
                               source=source)


def flatten_config(config) -> dict[str, Any]:
  """{"model.d_model": 128, ...} with JSON-able values."""
  d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  flat = flax.traverse_util.flatten_dict(d, sep=".")
  return {k: (list(v) if isinstance(v, tuple) else v) for k, v in flat.items()}


def compute_dtype(flat_or_config) -> str:
  """The computation dtype: ``compute_dtype``, or its deprecated alias
  ``model.dtype`` where only that is set. Parameters stay float32 either way.

  Accepts a ConfigDict or a flattened config (a checkpoint's). Both set to
  different values is a ConfigError naming both.
  """
  flat = isinstance(flat_or_config, dict)
  chosen = flat_or_config.get("compute_dtype")
  legacy = flat_or_config.get("model.dtype") if flat else flat_or_config.model.get("dtype")
  choices = get_args(DType)
  for field, value in (("compute_dtype", chosen), ("model.dtype", legacy)):
    if value is not None and value not in choices:
      raise ConfigError(f"{field}={value!r} is not a valid choice; choose one of: "
                        f"{', '.join(choices)}.")
  if legacy is None or legacy == chosen:
    return chosen or DEFAULT_DTYPE
  if chosen not in (None, DEFAULT_DTYPE):
    raise ConfigError(f"compute_dtype={chosen!r} and model.dtype={legacy!r} disagree; "
                      "model.dtype is the deprecated name of compute_dtype: set "
                      "compute_dtype only.")
  if not flat:
    logging.warning("model.dtype is deprecated: set compute_dtype=%s instead.", legacy)
  return legacy


def resume_view(flat: dict[str, Any]) -> dict[str, Any]:
  """A flattened config as a resume compares it: the computation dtype under
  its one name (a checkpoint written with ``model.dtype`` resumes under
  ``compute_dtype``), and the dataset's version (``data.version``, recorded
  by the trainer) apart from its name (``tfx_shakespeare:1.0.0`` is
  ``tfx_shakespeare`` at version 1.0.0)."""
  out = {k: v for k, v in flat.items() if k != "model.dtype"}
  out["compute_dtype"] = compute_dtype(flat)
  name, _, version = str(flat.get("data.name", "")).partition(":")
  out["data.name"] = name
  if version and not out.get("data.version"):
    out["data.version"] = version
  return out


def _resolve_model(config) -> ModelConfig:
  """``config.model`` + ``compute_dtype`` + the task's needs -> ModelConfig."""
  model = config.model.to_dict()
  model["dtype"] = compute_dtype(config)
  cfg = model_config_from_dict(model, seq_len=config.train.seq_len)
  task = tasks.check_task(config.task, cfg.family)
  if task.rows.labelled and cfg.num_classes < 2:
    raise ConfigError(
        f"task={config.task!r} needs model.num_classes >= 2 (the number of labels of "
        f"data.name={config.data.name!r}), got {cfg.num_classes}.")
  return cfg


def _check_router_losses(model: ModelConfig, train: TrainConfig) -> None:
  """train.moe_aux_loss, moe_aux_scope and router_z_loss are set only where a
  mixture of experts reads them."""
  defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
  reads = {"moe_aux_loss": model.ffn_type == "moe" and model.moe_balance == "aux_loss",
           "moe_aux_scope": model.ffn_type == "moe" and model.moe_balance == "aux_loss",
           "router_z_loss": model.ffn_type == "moe"}
  for name, read in reads.items():
    value = getattr(train, name)
    if not read and value != defaults[name]:
      raise InactiveSetting(
          f"train.{name}", defaults[name],
          f"train.{name}={value!r} is read by a mixture of experts "
          f"(model.ffn_type=moe{' with model.moe_balance=aux_loss' if name != 'router_z_loss' else ''}); "
          f"this model has ffn_type={model.ffn_type!r}, moe_balance={model.moe_balance!r}: "
          f"leave it at {defaults[name]!r}.")


def decay_start(opt: OptimConfig) -> int:
  """The last update of a resolved wsd schedule at the peak rate: the decay
  starts after it, at decay_steps x (1 - decay_fraction)."""
  return int(opt.decay_steps * (1.0 - opt.decay_fraction))


def _check_branch_step(train: TrainConfig, opt: OptimConfig) -> None:
  """A branched run continues a trunk's stable phase into its own decay: a wsd
  schedule, branched at or before its decay starts (the trunk's schedule, which
  is checked against this one when the run starts, run/branch.py)."""
  if opt.schedule != "wsd":
    raise ConfigError(
        f"train.branch_from starts a run from another run's stable phase, which "
        f"optim.schedule='wsd' has; this run's schedule is {opt.schedule!r}: set "
        "optim.schedule=wsd, or leave train.branch_from unset.")
  need(train.branch_step < train.num_steps, "train.branch_step", train.branch_step,
       f"must be < train.num_steps={train.num_steps}")
  start = decay_start(opt)
  need(train.branch_step <= start, "train.branch_step", train.branch_step,
       f"must be at or before this run's decay start, step {start} = "
       f"optim.decay_steps ({opt.decay_steps}) x (1 - optim.decay_fraction "
       f"{opt.decay_fraction}): the updates up to it are the trunk's")


def check_expert_axis(model: ModelConfig, expert: int) -> None:
  """A mixture of experts splits its experts over the mesh's ``expert`` axis,
  num_experts / expert on each device (model/layers/expert_parallel.py): that
  size must divide model.num_experts. A dense model's expert axis shards the
  batch alone (model/axes.py, BATCH_AXES): any size."""
  if model.ffn_type != "moe" or model.num_experts % expert == 0:
    return
  sizes = [d for d in range(1, model.num_experts + 1) if model.num_experts % d == 0]
  raise ConfigError(
      f"mesh.expert={expert} does not divide model.num_experts={model.num_experts}: each "
      f"device of the expert axis holds num_experts / mesh.expert experts. Choose "
      f"mesh.expert in {sizes} (the divisors of model.num_experts), or model.num_experts "
      f"a multiple of {expert}.")


def resolve(config) -> RunConfig:
  """Every section of ``config`` read and checked, before devices, data or
  compilation; raises ConfigError naming the field (exit 2 at the commands)."""
  model = _resolve_model(config)
  sections = {name: typed_config.read(kind, name, config[name])
              for name, kind in SECTIONS.items()}
  for name in ("data", "train", "eval", "finetune"):
    sections[name].check()
  train, data = sections["train"], sections["data"]
  sections["checkpoint"].check(end_step=train.end_step)
  sections["optim"], notes = optim.resolve(sections["optim"],
                                           num_train_steps=train.num_steps)
  if train.branch_from:
    _check_branch_step(train, sections["optim"])
    if sections["finetune"].init_checkpoint:
      raise ConfigError(
          f"train.branch_from={train.branch_from!r} starts the run from another run's "
          f"whole state; finetune.init_checkpoint={sections['finetune'].init_checkpoint!r} "
          "loads another run's parameters into a fresh one: set one of them.")
  # An optimizer with no rule under model.parametrization, before any compile.
  param_groups.check_optimizer(model, sections["optim"])
  rows = tasks.get(config.task).rows
  if rows.check_data is not None:
    rows.check_data(data)
  if train.layer_stats_param == "cross_attention" and model.family != "encoder_decoder":
    raise ConfigError(
        "train.layer_stats_param='cross_attention' reads the decoder's cross-attention "
        f"of model.family='encoder_decoder'; this model is {model.family!r}: choose one "
        f"of {', '.join(c for c in get_args(LayerStatsParam) if c != 'cross_attention')}.")
  if data.packing == "stream" and rows.window is None:
    raise ConfigError(
        f"data.packing='stream' cuts the split's token stream into windows, which only "
        f"the tasks that read text have (task in "
        f"{', '.join(t.name for t in tasks.TASKS.values() if t.rows.window)}); "
        f"task={config.task!r} reads whole examples: use data.packing='documents'.")
  # data.name=files: the fields, the task's needs and the patterns (no file read).
  files_corpus.check_config(data, rows)
  _check_router_losses(model, train)
  qk_clip.check(model, train.qk_clip)
  n_data, n_fsdp, _, n_expert = sharding.mesh_sizes(sections["mesh"])
  if n_expert != -1:  # else checked once the devices are (run_setup.ShardedRun)
    check_expert_axis(model, n_expert)
  # The expert axis shards the batch outside the experts (model/axes.py, BATCH_AXES).
  axes = "mesh.data x mesh.fsdp" + (" x mesh.expert" if n_expert != 1 else "")
  for section in ("train", "eval"):
    size = sections[section].batch_size
    if data.num_shards:
      need(size % data.num_shards == 0, f"{section}.batch_size", size,
           f"must be divisible by the number of data shards "
           f"(data.num_shards={data.num_shards})")
    if -1 not in (n_data, n_fsdp, n_expert):  # else known once the devices are
      n_batch = n_data * n_fsdp * n_expert
      need(size % n_batch == 0, f"{section}.batch_size", size,
           f"must be divisible by the batch axes of the mesh ({axes} = {n_batch})")
  source = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  return RunConfig(seed=typed_config.check_value("", "seed", int, config.seed),
                   task=config.task, compute_dtype=model.dtype, model=model,
                   notes=notes, source=source, **sections)


def log_notes(run: RunConfig) -> None:
  """Says in the run's log what the resolution adapted."""
  for note in run.notes:
    logging.warning("%s", note)
