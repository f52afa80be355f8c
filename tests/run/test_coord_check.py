"""The coordinate check (run/coord_check.py, ``summary --coord-check``).

At initialisation (step 0) muP's table fixes how each coordinate scales with
the width m (Yang et al. 2022, Table 3, in base units):

- the input layer's output and every residual branch: Theta(1), slope 0;
- the output logits: the readout keeps the base's initialisation and its
  input is multiplied by 1/m, so the logits of an untrained model are a sum of
  m d_base independent terms of variance ~1/m^2: RMS ~ m^-1/2 (they vanish
  with width; the updates' contribution, Theta(1), takes over once trained:
  ``summary --coord-check`` after 5 updates of configs/lm.py:tiny gives a slope
  of about -0.04);
- the attention logits, q.k / d_head over independent q and k at init: m^-1/2.

Under sp the token table's Glorot variance 2 / (V + d) barely moves while
the readout sums d terms: the output logits grow as m^+1/2.

Tolerance: 0.1 on each slope, fitted over 3 widths from seeded
initialisations. The widths' draws are independent, and an RMS over the
B L d coordinates of one batch still varies by a few percent from draw to
draw: slopes of quantities the table holds flat came out within 0.06 of 0
(and the logits within 0.02 of -1/2 and +1/2) at these widths; a wrong rule
moves a slope by 1/2 or more (an sp readout under mup: +1/2 instead of
-1/2). The attention branch is left out of the flat ones at these widths: as
the logits fall from about 1 to 0.5 its weights become nearly uniform over
the causal prefix and its output's RMS settles (-0.19 over 32-128, within
0.1 of 0 over 64-512 in ``summary --coord-check``): a finite-width transient
of the 1/d_head rule, bounded, not a growth.
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers import ROOT, run_command, tiny_config
from tfx_jax import summary
from tfx_jax.core.errors import ConfigError
from tfx_jax.run import coord_check
from tfx_jax.run import setup as run_setup

pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")

WIDTHS = (32, 64, 128)
TOL = 0.1


@pytest.fixture(scope="module")
def at_init():
  """The step-0 coord checks of the tiny LM under mup (base 32) and sp."""
  mup = {"model.parametrization": "mup", "model.mup_base_d_model": 32}
  return {name: coord_check.measure(tiny_config("lm.py:tiny", o), WIDTHS, 0,
                                    log=lambda line: None)
          for name, o in (("mup", mup), ("sp", {}))}


def test_mup_keeps_each_coordinate_at_the_base_scale_at_init(at_init):
  check = at_init["mup"]
  assert check.parametrization == "mup" and check.rms["output_logits"].shape == (3, 1)
  for name in ("decoder/embedding", "decoder_00/ffn"):
    assert abs(check.slope(name, 0)) < TOL, (name, check.rms[name])
  for name in ("output_logits", "decoder_00/self_attention_logits"):
    assert abs(check.slope(name, 0) + 0.5) < TOL, (name, check.rms[name])
  # The base width's coordinates are sp's (the same model at m = 1).
  sp = at_init["sp"]
  for name in check.rms:
    assert check.rms[name][0, 0] == pytest.approx(sp.rms[name][0, 0], rel=1e-5), name


def test_sp_output_logits_grow_with_width(at_init):
  check = at_init["sp"]
  assert abs(check.slope("output_logits", 0) - 0.5) < TOL, check.rms["output_logits"]
  assert abs(check.slope("decoder/embedding", 0)) < TOL


def test_at_width_scales_every_explicit_width_and_keeps_the_base():
  config = tiny_config("lm.py:tiny", {"model.parametrization": "mup",
                                      "model.mup_base_d_model": 32, "model.d_ff": 100})
  wide = coord_check.at_width(config, 128)
  assert (wide.model.d_model, wide.model.d_ff, wide.model.mup_base_d_model,
          wide.model.num_heads) == (128, 400, 32, 2)
  assert config.model.d_model == 32  # the given config is left as it was
  with pytest.raises(ConfigError, match="not whole"):
    coord_check.at_width(config, 34)  # d_ff 100 x 34 / 32 = 106.25
  with pytest.raises(ConfigError, match="num_heads"):
    coord_check.at_width(config, 33)


def test_the_check_trains_at_the_peak_rate():
  run = coord_check.resolve_widths(tiny_config("lm.py:tiny"), (32, 64))[1]
  assert (run.optim.schedule, run.optim.warmup_steps, run.model.d_model) == (
      "constant", 0, 64)


def test_tables_slopes_and_figure(tmp_path):
  widths = (64, 128, 256)
  w = np.asarray(widths, float)[:, None]
  check = coord_check.CoordCheck(widths=widths, steps=1, parametrization="sp", rms={
      "decoder/embedding": np.ones((3, 2)), "decoder_00/ffn": 0.5 * (w / 64) ** 0.25 * [1, 2],
      "decoder_00/self_attention_logits": (w / 64) ** -0.5 * [1, 1],
      "output_logits": (w / 64) * [1, 3]})
  assert check.slope("output_logits") == pytest.approx(1.0)
  assert check.slope("decoder_00/ffn", 0) == pytest.approx(0.25)
  assert check.ordered() == ["decoder/embedding", "decoder_00/ffn",
                             "decoder_00/self_attention_logits", "output_logits"]
  text = coord_check.format_tables(check)
  assert "step 0 (at initialisation)" in text and "step 1 (after 1 update)" in text
  assert "  output logits        1.000" in text
  path = coord_check.plot(check, tmp_path / "out" / "cc.png")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, names", [
    (["--widths", "64,128"], "--coord-check"),
    (["--steps", "3"], "--coord-check"),
    (["--coord-check", "--widths", "64,130"], "num_heads"),
    (["--coord-check", "--widths", "64"], "at least two"),
    (["--coord-check", "--widths", "64,x"], "integers"),
    (["--coord-check", "--config.model.parametrization=mup"], "mup_base_d_model"),
])
def test_bad_input_exits_2_before_compiling(args, names, monkeypatch):
  def must_not_run(*a, **k):
    raise AssertionError("bad input must fail before data is read or anything built")

  for name in ("load_tokenizer", "make_data", "ShardedRun"):
    monkeypatch.setattr(run_setup, name, must_not_run)
  # configs/lm.py:tiny has 4 heads.
  code, _, err = run_command(summary, ["--config", f"{ROOT / 'configs' / 'lm.py'}:tiny",
                                       *args])
  assert code == 2 and err.startswith("error: ") and names in err, err
  assert "Traceback" not in err
