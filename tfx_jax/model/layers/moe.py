"""A mixture of experts in the FFN's place (the ``model.ffn_type`` axis).

  MoE(x) = s sum_{i in TopK(r(x) + b)} g_i(x) E_i(x)  +  sum_j S_j(x)

Each expert E_i is the FFN of ``model/layers/ffn.py`` (the activation axis applies
to every expert), the shared experts S_j (DeepSeekMoE, Dai et al. 2024) see
every token (one FFN, ``model.shared_expert_d_ff`` wide or shared_experts x the
expert width; with ``model.shared_expert_gate`` times sigmoid(x w), Qwen3-Next's
shared_expert_gate). The router (``route``) scores the experts, r(x) = softmax(x W_r)
(Switch, Fedus et al. 2022; Mixtral) or sigmoid(x W_r) (DeepSeek-V3, Liu et
al. 2024, eq. 15), picks the k best of r(x) + b, b the expert bias of the
auxiliary-loss-free balancing (zero without it; it chooses experts, never
weighs them), and weighs each chosen expert by its score, renormalised over
the k with ``model.router_norm_topk`` (Mixtral's softmax over the top-k
logits is the softmax renormalised over its top-k); s is ``model.router_scale``
(DeepSeek-V3's routed_scaling_factor; 1 otherwise). With ``model.router_groups``
G > ``model.router_topk_groups`` G' the k come from each token's G' best groups
of E/G consecutive experts, a group scored by the sum of its two best r + b
(DeepSeek-V3's node-limited routing, as transformers' DeepseekV3TopkRouter).

Dispatch (``dispatch``): each (token, expert) assignment becomes one row of
the experts' products, rows grouped by expert.
  * dropless (``model.capacity_factor`` = 0; MegaBlocks, Gale et al. 2023):
    the assignments sorted by expert, every one computed, the groups of
    varying size multiplied by one grouped matmul (``jax.lax.ragged_dot``);
  * capacity (> 0; GShard, Lepikhin et al. 2021; Switch): each expert has C =
    ceil(factor * T * k / E) rows for the T tokens of the batch; the
    assignments take them in priority order (every token's first choice before
    any second choice, then token order) and those past C are dropped (the
    token keeps its other experts and the residual), counted in
    ``dropped_tokens``; the [E, C] rows are one batched product.
When nothing overflows the two compute the same rows, so the same outputs (up
to the products' summation order).
Padding tokens (no key to attend to) are not routed.
With a mesh axis ``expert`` of size ep > 1 (``config.mesh.expert``) each
device holds E/ep experts and the rows travel to their experts' devices and
back by all-to-alls (model/layers/expert_parallel.py): per layer, two of k T_l D
activations per device (there and back) for its T_l tokens in the forward
pass and two in the backward (capacity: x the factor; XLA:CPU's dense
dropless exchange: x ep, its worst-case buffers), instead of every device
gathering every expert's kernels. The router and its
statistics are the same; the capacity is then per device, C_l = ceil(factor
T_l k / E) (GShard's per-group capacity).

The layer returns, besides its output, the router statistics per sequence
(``RouterStats``), from which the task's loss takes the balancing loss
(``balance_loss``, per batch or per sequence) and the router z-loss
(``router_z_loss``), the train step the update of the expert bias
(``update_expert_bias``, DeepSeek-V3 section 2.1.2) and the logs the loads.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from tfx_jax.model.layers import expert_parallel
from tfx_jax.model.layers.ffn import FeedForward
from tfx_jax.model.config import moe_layers
from tfx_jax.model.config_moe import shared_dim

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class MoeSpec:
  """The mixture of experts of one stack, resolved from ``model.*``."""
  num_experts: int
  experts_per_token: int
  expert_dim: int
  shared_dim: int  # width of the shared experts together; 0: none
  score: Callable[[jax.Array], jax.Array]  # logits [T, E] -> scores [T, E]
  norm_topk: bool
  expert_bias: bool  # model.moe_balance='bias'
  capacity_factor: float  # 0: dropless
  # The router's initial variance over its fan-in (Switch: 0.1; under muP the
  # base's / m, model/parametrization.py).
  router_init_scale: float = 0.1
  scale: float = 1.0  # model.router_scale: the routed experts' weights x this
  groups: int = 1  # model.router_groups
  topk_groups: int = 1  # model.router_topk_groups; = groups: plain top-k
  # model.shared_expert_gate: the shared experts' output x sigmoid(x w) (Qwen3-Next).
  shared_gate: bool = False
  router_bias: bool = False  # model.router_use_bias: a bias on the router logits


def _softmax_scores(logits_TE):
  return jax.nn.softmax(logits_TE, axis=-1)


def _sigmoid_scores(logits_TE):
  return jax.nn.sigmoid(logits_TE)


_SCORES = {"softmax": _softmax_scores, "sigmoid": _sigmoid_scores}


def moe_spec(cfg, router_init_scale: float = 0.1) -> MoeSpec | None:
  """The one dispatch point of ``model.ffn_type`` and ``model.router``: None
  for a dense FFN."""
  if cfg.ffn_type == "dense":
    return None
  return MoeSpec(
      num_experts=cfg.num_experts, experts_per_token=cfg.experts_per_token,
      expert_dim=cfg.expert_dim, shared_dim=shared_dim(cfg), shared_gate=cfg.shared_expert_gate,
      score=_SCORES[cfg.router], norm_topk=cfg.router_norm_topk,
      expert_bias=cfg.moe_balance == "bias", capacity_factor=cfg.capacity_factor,
      router_init_scale=router_init_scale, scale=cfg.router_scale,
      groups=cfg.router_groups, topk_groups=cfg.router_topk_groups,
      router_bias=cfg.router_use_bias)


# ------------------------------------------------------------------ router
def route(logits_TE, bias_E, k: int, score, norm_topk: bool, *, scale: float = 1.0,
          groups: int = 1, topk_groups: int = 1):
  """(weights [T, k], experts [T, k], scores [T, E]) of router logits.

  The experts are the top k of scores + bias (the bias, out of the gradient,
  only chooses: DeepSeek-V3 eq. 16), among the ``topk_groups`` best of
  ``groups`` groups where that is fewer (``keep_best_groups``); the weights
  are the chosen scores, divided by their sum with ``norm_topk``, times
  ``scale``.
  """
  scores_TE = score(logits_TE.astype(F32))
  choice_TE = scores_TE if bias_E is None else scores_TE + jax.lax.stop_gradient(bias_E)
  if topk_groups < groups:
    choice_TE = keep_best_groups(choice_TE, groups, topk_groups)
  _, experts_TK = jax.lax.top_k(choice_TE, k)
  weights_TK = jnp.take_along_axis(scores_TE, experts_TK, axis=-1)
  if norm_topk:
    weights_TK = weights_TK / jnp.sum(weights_TK, axis=-1, keepdims=True)
  if scale != 1.0:
    weights_TK = weights_TK * scale
  return weights_TK, experts_TK, scores_TE


def keep_best_groups(choice_TE, groups: int, kept: int):
  """``choice_TE`` with every expert outside each token's ``kept`` best of
  ``groups`` groups of consecutive experts at -inf, a group scored by the sum
  of its two best choice scores (DeepSeek-V3's node-limited routing; its
  ``n_group``, ``topk_group``)."""
  T, E = choice_TE.shape
  choice_TGX = choice_TE.reshape(T, groups, E // groups)
  group_TG = jnp.sum(jax.lax.top_k(choice_TGX, 2)[0], axis=-1)
  _, best_TK = jax.lax.top_k(group_TG, kept)
  keep_TG = jnp.sum(jax.nn.one_hot(best_TK, groups, dtype=jnp.int32), axis=1) > 0
  return jnp.where(keep_TG[:, :, None], choice_TGX, -jnp.inf).reshape(T, E)


# ---------------------------------------------------------------- dispatch
def dropless_rows(experts_A, num_experts: int):
  """(row of each assignment, number of rows, rows per expert): the
  assignments sorted by expert. Expert ids >= ``num_experts`` (not routed)
  sort last, past every group: the grouped matmul leaves their rows zero."""
  order_A = jnp.argsort(experts_A, stable=True)
  row_A = jnp.zeros_like(order_A).at[order_A].set(jnp.arange(order_A.shape[0]))
  sizes_E = jnp.bincount(experts_A, length=num_experts).astype(jnp.int32)
  return row_A, experts_A.shape[0], sizes_E


def capacity(num_tokens: int, k: int, num_experts: int, factor: float) -> int:
  """Rows per expert, C = ceil(factor * T * k / E) (GShard; Switch eq. 3 for k = 1)."""
  return max(1, math.ceil(factor * num_tokens * k / num_experts))


def capacity_rows(experts_TK, num_experts: int, factor: float):
  """(row of each assignment, number of rows, rows per expert) with C rows
  per expert: expert e's rows are e C ... e C + C - 1, taken in priority
  order (all first choices in token order, then all second choices, ...);
  an assignment past C (or not routed) gets row E C, out of range: dropped."""
  T, K = experts_TK.shape
  # Priority order: slot-major, as GShard's second expert after every first.
  experts_P = experts_TK.T.reshape(-1)
  c = capacity(T, K, num_experts, factor)
  onehot_PE = jax.nn.one_hot(experts_P, num_experts, dtype=jnp.int32)
  position_P = jnp.sum((jnp.cumsum(onehot_PE, axis=0) - 1) * onehot_PE, axis=-1)
  kept_P = (experts_P < num_experts) & (position_P < c)
  row_P = jnp.where(kept_P, experts_P * c + position_P, num_experts * c)
  row_A = row_P.reshape(K, T).T.reshape(-1)  # back to token-major
  return row_A, num_experts * c, jnp.full((num_experts,), c, jnp.int32)


def dispatch(x_TD, experts_TK, weights_TK, rows_fn, num_experts: int,
             capacity_factor: float, dtype):
  """(y [T, D], dropped [T, k]): every (token, expert) assignment a row, laid
  out by ``capacity_rows`` (factor > 0) or ``dropless_rows``, run through the
  experts by ``rows_fn(rows [N, D], rows per expert [E], capacity or 0)``
  (``expert_rows``; across devices, model/layers/expert_parallel.py), and the k
  results of each token summed with their ``weights_TK``."""
  (T, K), D, E = experts_TK.shape, x_TD.shape[-1], num_experts
  if capacity_factor > 0:
    row_A, rows, sizes_E = capacity_rows(experts_TK, E, capacity_factor)
  else:
    row_A, rows, sizes_E = dropless_rows(experts_TK.reshape(-1), E)
  token_A = jnp.repeat(jnp.arange(T), K)
  x_ND = jnp.zeros((rows, D), dtype).at[row_A].set(x_TD[token_A].astype(dtype), mode="drop")
  y_ND = rows_fn(x_ND, sizes_E, rows // E if capacity_factor > 0 else 0)
  y_TKD = y_ND.at[row_A].get(mode="fill", fill_value=0).reshape(T, K, D)
  y_TD = jnp.einsum("tk,tkd->td", weights_TK.astype(dtype), y_TKD)
  return y_TD, (row_A >= rows).reshape(T, K)


# ---------------------------------------------------------------- the experts
class ExpertProjection(NamedTuple):
  """One projection of every expert: ``kernel`` [E, in, out], ``bias`` [E, out] or None."""
  kernel: jax.Array
  bias: jax.Array | None


class ExpertDense(nn.Module):
  """The parameters of one projection of every expert: ``kernel`` [E, in,
  out] (``bias`` [E, out]), returned as ``ExpertProjection`` in ``dtype``."""
  num_experts: int
  features: int
  axes: tuple[str, str]  # logical names of (in, out); the expert axis is "expert"
  use_bias: bool
  gain: float
  distribution: str
  dtype: Any

  @nn.compact
  def __call__(self, in_features: int) -> ExpertProjection:
    # Xavier per expert (DeepNorm's gain where it applies), from the fans of one
    # expert's [in, out] matrix: the expert axis is a batch axis.
    init = nn.initializers.variance_scaling(
        self.gain**2, "fan_avg", self.distribution, in_axis=-2, out_axis=-1,
        batch_axis=(0,))
    kernel = self.param("kernel", nn.with_logical_partitioning(init, ("expert", *self.axes)),
                        (self.num_experts, in_features, self.features), F32)
    bias = None
    if self.use_bias:
      bias = self.param("bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("expert", self.axes[1])),
          (self.num_experts, self.features), F32).astype(self.dtype)
    return ExpertProjection(kernel.astype(self.dtype), bias)


def expert_dense(x_NI, w: ExpertProjection, sizes_E, group_N, capacity: int = 0):
  """Rows [N, in] grouped by expert (``sizes_E`` each, rows past them left
  zero) -> [N, out] by one grouped matmul. With ``capacity`` C > 0 every
  expert has exactly C rows (N = E C): a batched product over the experts,
  which XLA's CPU backend runs ~15x faster than the grouped one (the same
  products, in another summation order). ``group_N``: each row's expert, for
  the bias."""
  if capacity:
    E = w.kernel.shape[0]
    y_NO = jnp.einsum("eci,eio->eco", x_NI.reshape(E, capacity, -1),
                      w.kernel).reshape(E * capacity, -1)
  else:
    y_NO = jax.lax.ragged_dot(x_NI, w.kernel, sizes_E)
  if w.bias is not None:
    y_NO = y_NO + w.bias[group_N]
  return y_NO


def expert_rows(x_ND, projections: dict[str, ExpertProjection], sizes_E, capacity: int,
                act, drop: Callable[[jax.Array], jax.Array], up=None):
  """Every row through its expert's FFN (``projections``: wi, wv if gated,
  wo, of the experts at hand): rows grouped by expert, in order, ``sizes_E``
  rows each; ``capacity`` > 0: that many rows per expert (``expert_dense``);
  ``drop`` the dropout on the hidden units; ``up`` the map of x V (None: as
  it is; ffn.ffn_activation)."""
  group_N = None
  if projections["wo"].bias is not None:  # each row's expert, for its biases
    group_N = jnp.repeat(jnp.arange(sizes_E.shape[0]), sizes_E,
                         total_repeat_length=x_ND.shape[0])
  h_NF = act(expert_dense(x_ND, projections["wi"], sizes_E, group_N, capacity))
  if "wv" in projections:
    v_NF = expert_dense(x_ND, projections["wv"], sizes_E, group_N, capacity)
    h_NF = h_NF * (v_NF if up is None else up(v_NF))
  return expert_dense(drop(h_NF), projections["wo"], sizes_E, group_N, capacity)


def _dropout(rate: float, key):
  """``nn.Dropout`` as a function of its key (for the per-device program)."""
  if key is None:
    return lambda h: h
  def drop(h):
    keep = jax.random.bernoulli(key, 1.0 - rate, h.shape)
    return jax.lax.select(keep, h / (1.0 - rate), jnp.zeros_like(h))
  return drop


@flax.struct.dataclass
class RouterStats:
  """One MoE layer's router statistics, summed over each sequence's real
  tokens ([B] or [B, E]; a stack stacks its layers in front)."""
  counts: jax.Array  # [B, E] assignments chosen per expert (before any drop)
  scores: jax.Array  # [B, E] sum of the balance scores P (normalised over experts)
  tokens: jax.Array  # [B] real tokens
  log_z_sq: jax.Array  # [B] sum of logsumexp(router logits)^2
  dropped: jax.Array  # [B] assignments dropped past the capacity


class MixtureOfExperts(nn.Module):
  """Router, routed experts (grouped matmuls) and shared experts.

  ``__call__(x [B, L, D], real [B, L] bool) -> (y [B, L, D], RouterStats)``.
  Parameters: ``router/kernel`` [D, E] (``router/bias`` [E] with
  ``model.router_use_bias``), ``wi/kernel`` (and ``wv/kernel``
  gated) [E, D, F], ``wo/kernel`` [E, F, D] (with ``use_bias``, their
  ``bias`` [E, F], [E, D]),
  ``expert_bias`` [E] with the bias balancing (a parameter with no gradient,
  set by the train step), and ``shared`` (an FFN of width shared_dim; with
  ``shared_gate`` its output x sigmoid(x ``shared_gate/kernel`` [D, 1])).
  Traced under a mesh with an ``expert`` axis > 1, the routed experts run per
  device (``_local_dispatch``); otherwise, as one program (``dispatch``).
  """
  spec: MoeSpec
  act: Callable[[jax.Array], jax.Array]
  gated: bool
  use_bias: bool = False
  dropout: float = 0.0
  deterministic: bool = True
  vo_gain: float = 1.0
  vo_distribution: str = "uniform"
  dtype: Any = jnp.float32
  platform: str = "cpu"  # the backend compiled for (the shared experts' products)
  up: Callable[[jax.Array], jax.Array] | None = None  # gated: x V's map (ffn_activation)

  @nn.compact
  def __call__(self, x_BLD, real_BL):
    s = self.spec
    B, L, D = x_BLD.shape
    E, K, F = s.num_experts, s.experts_per_token, s.expert_dim
    x_TD = x_BLD.reshape(-1, D)
    real_T = real_BL.reshape(-1)
    T = x_TD.shape[0]
    # The router in float32 (Switch's "selective precision"), initialised small:
    # truncated normal with variance 0.1 / fan_in (Switch section 2.4).
    logits_TE = nn.Dense(
        E, use_bias=s.router_bias, dtype=F32, param_dtype=F32, name="router",
        kernel_init=nn.with_logical_partitioning(
            nn.initializers.variance_scaling(s.router_init_scale, "fan_in",
                                             "truncated_normal"),
            ("embed", None)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (None,)))(
            x_TD.astype(F32))
    bias_E = None
    if s.expert_bias:
      bias_E = self.param("expert_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, (None,)), (E,), F32)
    weights_TK, experts_TK, scores_TE = route(
        logits_TE, bias_E, K, s.score, s.norm_topk, scale=s.scale, groups=s.groups,
        topk_groups=s.topk_groups)
    experts_TK = jnp.where(real_T[:, None], experts_TK, E)  # padding: not routed
    weights_TK = jnp.where(real_T[:, None], weights_TK, 0.0)
    proj = lambda name, shape, axes: ExpertDense(
        E, shape[1], axes, self.use_bias, self.vo_gain, self.vo_distribution,
        self.dtype, name=name)(shape[0])
    projections = {"wi": proj("wi", (D, F), ("embed", "mlp"))}
    if self.gated:
      projections["wv"] = proj("wv", (D, F), ("embed", "mlp"))
    projections["wo"] = proj("wo", (F, D), ("mlp", "embed"))
    ep = expert_parallel.expert_axis_size()
    if ep == 1:
      drop = lambda h: nn.Dropout(self.dropout)(h, deterministic=self.deterministic)
      rows_fn = lambda x, sizes, c: expert_rows(x, projections, sizes, c, self.act, drop,
                                                self.up)
      y_TD, dropped_TK = dispatch(x_TD, experts_TK, weights_TK, rows_fn, E,
                                  s.capacity_factor, self.dtype)
    else:
      y_BLD, dropped_BLK = expert_parallel.per_device(
          self._local_dispatch(ep), x_BLD, experts_TK.reshape(B, L, K),
          weights_TK.reshape(B, L, K), projections,
          self.make_rng("dropout") if self.dropout > 0 and not self.deterministic else None)
      y_TD, dropped_TK = y_BLD.reshape(T, D), dropped_BLK.reshape(T, K)
    if s.shared_dim:
      shared_TD = FeedForward(
          d_ff=s.shared_dim, act=self.act, gated=self.gated, use_bias=self.use_bias,
          up=self.up,
          dropout=self.dropout, deterministic=self.deterministic,
          kernel_init=nn.initializers.variance_scaling(
              self.vo_gain**2, "fan_avg", self.vo_distribution),
          dtype=self.dtype, platform=self.platform, name="shared")(x_TD)
      if s.shared_gate:  # Qwen3-Next's shared_expert_gate: sigmoid(x w), w [D, 1]
        shared_TD = shared_TD * jax.nn.sigmoid(nn.Dense(
            1, use_bias=False, dtype=self.dtype, name="shared_gate",
            kernel_init=nn.with_logical_partitioning(
                nn.initializers.xavier_uniform(), ("embed", None)))(x_TD))
      y_TD = y_TD + shared_TD
    return y_TD.reshape(B, L, D).astype(self.dtype), self._stats(
        logits_TE, scores_TE, experts_TK, dropped_TK, real_T, B)

  def _local_dispatch(self, ep: int):
    """``dispatch`` on one device of an ``expert`` axis of size ``ep``
    (model/layers/expert_parallel.py): its tokens' rows exchanged with the devices
    of their experts, its own E/ep experts run on the rows it receives.
    Ragged exchanges where the backend has them."""
    s = self.spec
    if s.num_experts % ep:
      raise ValueError(f"model.num_experts={s.num_experts} does not divide among "
                       f"mesh.expert={ep} devices.")

    def local(x_TD, experts_TK, weights_TK, projections, key):
      drop = _dropout(self.dropout, key)
      ffn = lambda x, sizes, c: expert_rows(x, projections, sizes, c, self.act, drop,
                                            self.up)
      rows_fn = (expert_parallel.capacity_exchange(ffn, ep) if s.capacity_factor > 0 else
                 expert_parallel.dropless_exchange(
                     ffn, ep, ragged=self.platform in expert_parallel.RAGGED_PLATFORMS))
      return dispatch(x_TD, experts_TK, weights_TK, rows_fn, s.num_experts,
                      s.capacity_factor, self.dtype)
    return local

  def _stats(self, logits_TE, scores_TE, experts_TK, dropped_TK, real_T, B):
    E = self.spec.num_experts
    real = real_T.astype(F32)
    per_seq = lambda v: v.reshape(B, -1, *v.shape[1:]).sum(axis=1)
    counts_TE = jnp.sum(jax.nn.one_hot(experts_TK, E, dtype=F32), axis=1)  # E: none
    # P of the balance loss: the scores normalised over the experts (softmax:
    # as they are; sigmoid: DeepSeek-V3 eq. 20, s / sum_j s_j).
    p_TE = scores_TE / jnp.sum(scores_TE, axis=-1, keepdims=True)
    lse_T = jax.nn.logsumexp(logits_TE.astype(F32), axis=-1)
    dropped_T = jnp.sum(dropped_TK.astype(F32), axis=-1) * real
    return RouterStats(counts=per_seq(counts_TE), scores=per_seq(p_TE * real[:, None]),
                       tokens=per_seq(real), log_z_sq=per_seq(jnp.square(lse_T) * real),
                       dropped=per_seq(dropped_T))


# -------------------------------------------------- losses and the bias
def balance_loss(stats: RouterStats, scope: str) -> jax.Array:
  """The load-balancing loss, mean over the stacked layers (axis 0).

  L = E * sum_i f_i P_i with f_i the fraction of the k T assignments that
  chose expert i and P_i the mean balance score of expert i (Switch eq. 4,
  for any k as DeepSeek-V2/V3's f_i = E / (k T) * count_i; 1 when the load
  is uniform). ``scope`` "batch": f and P over every token of the batch;
  "sequence": over each sequence (row), then the mean over the sequences
  (DeepSeek-V3's complementary sequence-wise loss, eqs. 17-20).
  """
  counts, scores, tokens = stats.counts, stats.scores, stats.tokens  # [n, B, ...]
  if scope == "batch":
    counts, scores, tokens = (x.sum(axis=1, keepdims=True) for x in (counts, scores, tokens))
  E = counts.shape[-1]
  # k T: every real token's k assignments (the counts' own total).
  f = counts / jnp.maximum(counts.sum(axis=-1, keepdims=True), 1.0)
  p = scores / jnp.maximum(tokens, 1.0)[..., None]
  per_row = E * jnp.sum(f * p, axis=-1)  # [n, B] or [n, 1]
  has = (tokens > 0).astype(F32)
  return jnp.mean(jnp.sum(per_row * has, axis=1) / jnp.maximum(jnp.sum(has, axis=1), 1.0))


def router_z_loss(stats: RouterStats) -> jax.Array:
  """(1/T) sum_t (log sum_j exp x_tj)^2 of the router logits (ST-MoE, Zoph et
  al. 2022, eq. 5), mean over the stacked layers."""
  return jnp.mean(jnp.sum(stats.log_z_sq, axis=1) /
                  jnp.maximum(jnp.sum(stats.tokens, axis=1), 1.0))


def expert_loads(stats: RouterStats) -> jax.Array:
  """[layers, E]: each expert's share of the assignments x E (1 = uniform)."""
  counts = stats.counts.sum(axis=1)
  return counts * counts.shape[-1] / jnp.maximum(counts.sum(axis=-1, keepdims=True), 1.0)


def dropped_fraction(stats: RouterStats) -> jax.Array:
  """[layers]: the fraction of the real tokens' assignments dropped."""
  return stats.dropped.sum(axis=1) / jnp.maximum(stats.counts.sum(axis=(1, 2)), 1.0)


def router_sums(router: dict, scope: str) -> dict:
  """What a train step reads of the router statistics of every stack
  (``router``: the model's ``moe`` output): ``router/aux_loss`` and
  ``router/z_loss`` (means over all MoE layers), and per stack
  ``router/counts`` [layers, E], ``router/load`` [layers, E] (``expert_loads``)
  and ``router/dropped`` [layers]."""
  stacks = list(router.values())
  layers = sum(st.counts.shape[0] for st in stacks)
  mean = lambda f: sum(f(st) * st.counts.shape[0] for st in stacks) / layers
  return {"router/aux_loss": mean(lambda st: balance_loss(st, scope)),
          "router/z_loss": mean(router_z_loss),
          "router/counts": {k: st.counts.sum(axis=1) for k, st in router.items()},
          "router/load": {k: expert_loads(st) for k, st in router.items()},
          "router/dropped": {k: dropped_fraction(st) for k, st in router.items()}}


def router_metrics(sums: dict) -> dict:
  """The train step's metrics of ``router_sums``: ``moe_aux_loss``,
  ``router_z_loss`` and, as {stack: [MoE layers]}, ``moe/expert_load_max``,
  ``moe/expert_load_min`` and ``moe/dropped_tokens`` (``log_scalars`` names
  them by layer)."""
  if "router/counts" not in sums:
    return {}
  load = sums["router/load"]
  return {"moe_aux_loss": sums["router/aux_loss"], "router_z_loss": sums["router/z_loss"],
          "moe/expert_load_max": {k: v.max(axis=-1) for k, v in load.items()},
          "moe/expert_load_min": {k: v.min(axis=-1) for k, v in load.items()},
          "moe/dropped_tokens": dict(sums["router/dropped"])}


def log_scalars(metrics: dict, model_cfg) -> dict[str, float]:
  """TensorBoard scalars of ``router_metrics`` (host values): train/moe_aux_loss,
  train/router_z_loss, and per MoE layer layer_stats/expert_load_max,
  expert_load_min (an expert's share of the assignments x E: 1 is uniform)
  and dropped_tokens (the fraction of assignments dropped past the capacity)
  as ``layer_stats/<kind>/<stack>_<NN>``, NN the layer's index in its stack."""
  if "moe_aux_loss" not in metrics:
    return {}
  out = {"train/moe_aux_loss": float(metrics["moe_aux_loss"]),
         "train/router_z_loss": float(metrics["router_z_loss"])}
  sizes = {"encoder": model_cfg.encoder_layers, "decoder": model_cfg.decoder_layers}
  for kind in ("expert_load_max", "expert_load_min", "dropped_tokens"):
    for stack, values in metrics[f"moe/{kind}"].items():
      layers = moe_layers(model_cfg, sizes[stack])
      for i, value in zip(layers, jax.device_get(values)):
        out[f"layer_stats/{kind}/{stack}_{i:02d}"] = float(value)
  return out


def _bias_paths(flat: dict) -> list[tuple]:
  """The paths of a stack's ``expert_bias`` leaves (of its flattened
  parameters) in layer order."""
  layer_no = lambda path: int(path[0].split("_")[1]) if path[0].startswith("layer_") else 0
  return sorted((p for p in flat if p[-1] == "expert_bias"), key=layer_no)


def update_expert_bias(params, old_params, counts: dict, rate: float):
  """``params`` with each MoE layer's expert bias set by DeepSeek-V3's rule
  (section 2.1.2) from its value in ``old_params``: b_i <- b_i + u sign(mean_j
  c_j - c_i), c_i the assignments expert i got in this step (``counts``:
  {stack: [MoE layers, E]}, summed over the batch), u = ``model.router_bias_rate``.
  An overloaded expert is chosen less next step, an underloaded one more. The
  optimizer's own change of the bias (its gradient is 0; weight decay) is
  discarded: the bias follows this rule alone. The train step moves it once
  per optimizer update: with ``optim.accumulate_steps`` k > 1, at the last of
  the k micro-batches, from that micro-batch's loads (``rate`` 0 at the
  others), so that u is the step per update that the paper tunes."""
  params = dict(params)
  for stack, c_LE in counts.items():
    tree = flax.traverse_util.flatten_dict(flax.core.unfreeze(params[stack]))
    old = flax.traverse_util.flatten_dict(flax.core.unfreeze(old_params[stack]))
    step_LE = rate * jnp.sign(jnp.mean(c_LE, axis=-1, keepdims=True) - c_LE)
    i = 0
    for path in _bias_paths(tree):
      b = old[path]
      if b.ndim == 2:  # scanned: [layers, E]
        tree[path] = b + step_LE[i:i + b.shape[0]]
        i += b.shape[0]
      else:
        tree[path] = b + step_LE[i]
        i += 1
    params[stack] = flax.traverse_util.unflatten_dict(tree)
  return params
