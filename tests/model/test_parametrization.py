"""model.parametrization's initialisation and forward multipliers, measured on
real initialisations of every family (model/parametrization.py's table).

Under muP (Yang et al. 2022, Table 3, in base units): input weights (token and
position tables) and the readout keep the base width's initialisation; hidden
matrices keep Glorot's variance at their own fans, the base's / m; a router (a
readout without a multiplier) has the base's variance / m^2. Each measured
standard deviation is compared with the table's value within five standard
errors of a standard deviation estimated from N draws, 5 sqrt(1 / (2N)) of it
for a normal (the uniform and truncated normal initialisers here have lighter
tails, so smaller errors): a wrong rule (a factor sqrt(2) at the first
doubling) is far outside it, and a right one never fails by chance (the
initialisation is seeded).
"""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from tfx_jax.core.errors import ConfigError, InactiveSetting
from tfx_jax.model import parametrization
from tfx_jax.model.config import model_config_from_dict
from tfx_jax.model.families import build_model, dummy_inputs

BASE = 32
V = 512  # vocabulary: 16k entries in the base's token table
WIDTHS = (BASE, 2 * BASE, 4 * BASE)
FAMILIES = {
    # GQA (one key/value head of two), a gated FFN (swiglu), a mixture of
    # experts (router and experts) and an untied readout.
    "decoder_only": dict(num_kv_heads=1, activation="swiglu", ffn_type="moe",
                         num_experts=16, experts_per_token=2, tie_embeddings=False),
    # Tied embeddings (the MLM head reads the token table), learned positions.
    "encoder_only": dict(position="learned", learned_position_init="token",
                         tie_embeddings=True),
    # Cross-attention, tied embeddings.
    "encoder_decoder": dict(tie_embeddings=True),
}


def _cfg(family, width, parametrization_="mup", **overrides):
  kw = dict(family=family, num_layers=1, d_model=width, num_heads=2, d_ff=2 * width,
            vocab_size=V, max_len=64, parametrization=parametrization_,
            **FAMILIES[family])
  if kw.get("ffn_type") == "moe":
    kw["expert_d_ff"] = width
  if parametrization_ != "sp":
    kw["mup_base_d_model"] = BASE
  kw.update(overrides)
  return model_config_from_dict(kw)


def _params(cfg) -> dict[str, np.ndarray]:
  # Jitted: one compile of the initialiser is faster than its ops one by one.
  model, inputs = build_model(cfg), dummy_inputs(cfg, 1, 8)
  params = jax.jit(lambda key: model.init(key, **inputs))(jax.random.PRNGKey(0))["params"]
  return {k: np.asarray(v) for k, v in
          traverse_util.flatten_dict(nn.unbox(params), sep="/").items()}


def _fans(path: str, shape) -> tuple[int, int]:
  """(fan-in, fan-out) of a kernel in the 2-D form its initialiser reads."""
  if path.endswith("self_attention/out/kernel") or path.endswith("cross_attention/out/kernel"):
    return shape[0] * shape[1], shape[2]  # [heads, kv, embed]
  if "attention" in path:
    return shape[0], shape[1] * shape[2]  # [embed, heads, kv]
  return shape[-2], shape[-1]  # [embed, mlp], [experts, embed, mlp]


def expected_std(cfg, path: str, shape) -> float | None:
  """The table's initial standard deviation of ``path`` at ``cfg``'s width (base BASE)."""
  m = cfg.d_model / BASE
  name = path.split("/")
  if path in ("embedding/embedding", "output/kernel"):
    return math.sqrt(2 / (V + BASE))  # Glorot over [vocab, base d_model]: the base's
  if path == "positions/embedding":
    # GPT-2's N(0, 0.02^2) whatever the width, or drawn like the token table.
    return 0.02 if cfg.learned_position_init == "small" else math.sqrt(2 / (V + BASE))
  if name[-2:] == ["router", "kernel"]:
    return math.sqrt(0.1 / BASE) / m  # Switch's 0.1 / fan-in at the base, / m
  if name[-1] == "kernel":
    fan_in, fan_out = _fans(path, shape)
    base = math.sqrt(2 / (fan_in / m + fan_out / m))  # Glorot at the base's fans
    return base / math.sqrt(m)
  return None


def _kinds(path: str) -> str:
  if path in ("embedding/embedding", "positions/embedding"):
    return "embedding"
  if path == "output/kernel":
    return "readout"
  return "router" if "router" in path else "hidden"


@pytest.mark.parametrize("family", FAMILIES)
def test_init_std_per_kind_follows_the_table_at_two_widths(family):
  seen = set()
  for width in WIDTHS:
    cfg = _cfg(family, width)
    for path, x in _params(cfg).items():
      want = expected_std(cfg, path, x.shape)
      if want is None:
        continue
      seen.add(_kinds(path))
      tol = 5 * math.sqrt(1 / (2 * x.size))
      assert np.std(x) == pytest.approx(want, rel=tol), (family, width, path)
  wanted = {"decoder_only": {"embedding", "readout", "router", "hidden"},
            "encoder_only": {"embedding", "hidden"},
            "encoder_decoder": {"embedding", "hidden"}}[family]
  assert seen == wanted


@pytest.mark.parametrize("family", FAMILIES)
def test_the_base_width_under_mup_is_sp_bitwise(family):
  """At the base shape every multiplier is 1 and every initialiser today's: the
  parameters are sp's, bitwise (the proxy a rate is tuned on is the sp model)."""
  sp, mup = _params(_cfg(family, BASE, "sp")), _params(_cfg(family, BASE))
  assert sp.keys() == mup.keys()
  for path in sp:
    np.testing.assert_array_equal(sp[path], mup[path], err_msg=path)
  cfg = _cfg(family, BASE)
  assert parametrization.output_multiplier(cfg) == 1.0
  assert parametrization.query_scale(cfg) == 1.0
  assert parametrization.router_init_scale(cfg) == 0.1


def test_forward_multipliers_follow_the_table():
  """MuReadout's alpha_out / m; logits q.k x alpha / d_head with alpha =
  sqrt(base d_head) (so q.k / sqrt(d_head) at the base); CompleteP's m_L^-alpha."""
  cfg = _cfg("decoder_only", 4 * BASE, mup_output_multiplier=2.0)
  assert parametrization.output_multiplier(cfg) == pytest.approx(2.0 / 4)
  d_head, base_head = 4 * BASE // 2, BASE // 2
  # The factor on q that turns q.k / sqrt(d_head) into q.k sqrt(base_head) / d_head.
  assert parametrization.query_scale(cfg) == pytest.approx(
      math.sqrt(base_head) / d_head * math.sqrt(d_head))
  assert parametrization.query_scale(_cfg("decoder_only", 4 * BASE,
                                          mup_attention_scale=8.0)) == pytest.approx(
      8.0 / d_head * math.sqrt(d_head))
  deep = _cfg("decoder_only", BASE, "completep", num_layers=4, mup_base_layers=1,
              depth_alpha=0.5)
  assert parametrization.branch_multiplier(deep, 4) == pytest.approx(4 ** -0.5)
  assert parametrization.branch_multiplier(_cfg("decoder_only", BASE), 4) == 1.0
  assert parametrization.embedding_width(_cfg("decoder_only", 4 * BASE, "sp")) == 4 * BASE


@pytest.mark.parametrize("overrides, error, names", [
    (dict(parametrization="mup", mup_base_d_model=0), ConfigError, "mup_base_d_model"),
    (dict(parametrization="completep"), ConfigError, "mup_base_layers"),
    (dict(parametrization="completep", mup_base_layers=1, norm_position="post"),
     ConfigError, "norm_position"),
    (dict(mup_base_layers=1), InactiveSetting, "mup_base_layers"),
    (dict(mup_base_d_model=32), InactiveSetting, "mup_base_d_model"),
    (dict(parametrization="mup", attention_gate="headwise"), ConfigError, "attention_gate"),
    (dict(parametrization="mup", scale_embeddings=True), ConfigError, "scale_embeddings"),
    (dict(parametrization="mup", mup_base_d_model=33), ConfigError, "num_heads"),
])
def test_combinations_without_a_rule_are_errors_naming_the_field(overrides, error, names):
  kw = dict(family="decoder_only", num_layers=1, d_model=64, num_heads=2, vocab_size=V)
  if overrides.get("parametrization") in ("mup", "completep"):
    kw["mup_base_d_model"] = BASE
  kw.update(overrides)
  with pytest.raises(error, match=names):
    model_config_from_dict(kw)
