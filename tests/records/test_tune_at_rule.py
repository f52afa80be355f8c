"""Which points tune and where every other point's value comes from
(``records.transfer``): the nearest proxy size below, the smallest where none
is below, and the errors that name the valid choices."""

from __future__ import annotations

import pytest

from tfx_jax.core.errors import ConfigError
from tfx_jax.records import transfer
from tfx_jax.records.sweep import AxisRecord

WIDTHS = [{"model.d_model": d} for d in (32, 64, 128, 256, 512)]


def axis(**fields) -> AxisRecord:
  """An axis of zipped fields, as sweep.json records it."""
  values = tuple(dict(zip(fields, v)) for v in zip(*fields.values()))
  return AxisRecord("+".join(fields), tuple(fields), values)


@pytest.mark.parametrize("proxies, sources", [
    # Two proxy sizes: each other size from the nearest one below it.
    ((64, 256), [1, 1, 1, 3, 3]),
    # None below 32 and 64: the smallest proxy size.
    ((128,), [2, 2, 2, 2, 2]),
    ((32, 128, 512), [0, 0, 2, 2, 4]),
])
def test_each_size_takes_the_nearest_proxy_size_below(proxies, sources):
  assert transfer.axis_sources(WIDTHS, "model.d_model", proxies, "d_model") == sources


def test_sizes_are_ordered_by_value_not_by_their_place_in_the_axis():
  shuffled = [WIDTHS[i] for i in (3, 0, 4, 1, 2)]  # 256, 32, 512, 64, 128
  assert transfer.axis_sources(shuffled, "model.d_model", (64,), "d_model") == [3, 3, 3, 3, 3]
  assert transfer.axis_sources(shuffled, "model.d_model", (32, 128), "d_model") == [
      4, 1, 4, 1, 4]


def test_a_field_that_is_not_a_number_is_ordered_as_the_axis_lists_it():
  values = [{"model.activation": a} for a in ("relu", "gelu", "swiglu")]
  assert transfer.axis_sources(values, "model.activation", ("gelu",), "activation") == [
      1, 1, 1]


def test_the_errors_name_the_valid_choices():
  with pytest.raises(ConfigError, match=r"model.d_model=48: not a value of axis d_model; "
                     r"choose from 32, 64, 128, 256, 512"):
    transfer.axis_sources(WIDTHS, "model.d_model", (48,), "d_model")
  with pytest.raises(ConfigError, match=r"does not set model.d_model"):
    transfer.axis_sources([{}, *WIDTHS], "model.d_model", (64,), "variant")
  twins = [{"model.d_model": 64, "model.num_heads": h} for h in (2, 4)] + [WIDTHS[2]]
  with pytest.raises(ConfigError, match=r"2 values of axis v have this size"):
    transfer.axis_sources(twins, "model.d_model", (64,), "v")
  axes = [axis(**{"model.d_model": [32, 64], "model.num_heads": [2, 4]}),
          axis(**{"model.activation": ["relu", "gelu"]})]
  with pytest.raises(ConfigError, match=r"no axis sets model.dropout; tune_at names a field "
                     r"of a \(size\) axis: \['model.d_model', 'model.num_heads', "
                     r"'model.activation'\]"):
    transfer.plan(axes, (("model.dropout", (0.1,)),))
  with pytest.raises(ConfigError, match=r"named by another field of tune_at already"):
    transfer.plan(axes, (("model.d_model", (32,)), ("model.num_heads", (2,))))


def test_a_point_takes_its_source_on_each_named_axis_and_keeps_the_others():
  axes = [axis(**{"model.activation": ["relu", "gelu"]}),
          axis(**{"model.d_model": [32, 64, 128]}),
          axis(**{"model.num_layers": [2, 4, 8]})]
  plan = transfer.plan(axes, (("model.d_model", (32,)), ("model.num_layers", (2, 4))))
  assert transfer.source_key(plan, (1, 2, 2)) == (1, 0, 1)
  assert transfer.source_key(plan, (0, 0, 0)) == (0, 0, 0)


def test_the_rule_by_parametrization():
  assert not transfer.expected_to_hold("sp")
  assert transfer.expected_to_hold("mup") and transfer.expected_to_hold("completep")
  assert set(transfer.RULES) == {"sp", "mup", "completep"}
