"""Weight rules: how one HF tensor becomes tfx_jax parameters and back.

A :class:`Rule` names one HF tensor, the tfx_jax parameters it becomes, and a
pair of exact array maps (transposes, reshapes, splits, row slices), so that
export -> import is bit-identical. The maps every architecture shares are here;
``add_attention``, ``add_norm`` and ``add_dense`` append the rules of a whole block.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

Array = np.ndarray


# ----------------------------------------------------------- array maps
@dataclasses.dataclass(frozen=True)
class Rule:
  """One HF tensor <-> one or more tfx_jax parameters ('/'-joined paths); or
  several HF tensors (``hf`` a tuple: the experts of a mixture, one tensor
  each) <-> one parameter, ``to_tfx`` taking them all and ``to_hf`` giving
  them back as a tuple."""
  hf: str | tuple[str, ...]
  tfx: tuple[str, ...]
  to_tfx: Callable[..., tuple[Array, ...]]
  to_hf: Callable[..., Array | tuple[Array, ...]]

  @property
  def hf_names(self) -> tuple[str, ...]:
    return (self.hf,) if isinstance(self.hf, str) else self.hf

  def hf_tensors(self, *tfx_arrays) -> dict[str, Array]:
    """{HF name: tensor} of this rule's parameters."""
    out = self.to_hf(*tfx_arrays)
    return dict(zip(self.hf_names, (out,) if isinstance(self.hf, str) else out))


def same(hf, tfx):
  return Rule(hf, (tfx,), lambda w: (w,), lambda x: x)


def linear(hf, tfx):
  """torch Linear [out, in] <-> Dense kernel [in, out]."""
  return Rule(hf, (tfx,), lambda w: (w.T,), lambda x: x.T)


def heads_in(hf, tfx, heads):
  """torch Linear [H*K, D] <-> DenseGeneral kernel [D, H, K]."""
  return Rule(hf, (tfx,), lambda w: (w.T.reshape(w.shape[1], heads, -1),),
              lambda x: x.reshape(x.shape[0], -1).T)


def heads_bias(hf, tfx, heads):
  return Rule(hf, (tfx,), lambda b: (b.reshape(heads, -1),), lambda x: x.reshape(-1))


def heads_out(hf, tfx, heads):
  """torch Linear [D, H*K] <-> DenseGeneral kernel [H, K, D]."""
  return Rule(hf, (tfx,), lambda w: (w.T.reshape(heads, -1, w.shape[0]),),
              lambda x: x.reshape(-1, x.shape[-1]).T)


def rows_from(hf, tfx, offset):
  """A learned position table whose first ``offset`` rows are never read (BART)."""
  return Rule(hf, (tfx,), lambda w: (w[offset:],),
              lambda x: np.concatenate([np.zeros((offset, x.shape[1]), x.dtype), x]))


def flat_row(hf, tfx):
  """A [1, V] buffer <-> a [V] vector (BART's and Marian's final_logits_bias)."""
  return Rule(hf, (tfx,), lambda w: (w.reshape(-1),), lambda x: x[None])


def stacked_linear(hf_names, tfx):
  """One torch Linear [out, in] per expert <-> an [E, in, out] kernel (the
  experts of a mixture stacked on a leading axis, model/layers/moe.py)."""
  return Rule(tuple(hf_names), (tfx,), lambda *ws: (np.stack([w.T for w in ws]),),
              lambda x: tuple(np.ascontiguousarray(x[e].T) for e in range(x.shape[0])))


def add_attention(rules, hf, tfx, heads, kv_heads, names, bias):
  """q, k, v, out of one attention block; ``names`` are HF's four projections."""
  for name, ours, h in zip(names[:3], ("query", "key", "value"), (heads, kv_heads, kv_heads)):
    rules.append(heads_in(f"{hf}.{name}.weight", f"{tfx}/{ours}/kernel", h))
    if bias:
      rules.append(heads_bias(f"{hf}.{name}.bias", f"{tfx}/{ours}/bias", h))
  rules.append(heads_out(f"{hf}.{names[3]}.weight", f"{tfx}/out/kernel", heads))
  if bias:
    rules.append(same(f"{hf}.{names[3]}.bias", f"{tfx}/out/bias"))


def add_norm(rules, hf, tfx, bias=True, gain="weight"):
  """A norm's gain (HF's ``gain`` tensor) and, with ``bias``, its bias."""
  rules.append(same(f"{hf}.{gain}", f"{tfx}/scale"))
  if bias:
    rules.append(same(f"{hf}.bias", f"{tfx}/bias"))


def add_dense(rules, hf, tfx, bias=True):
  """A torch Linear's weight and, with ``bias``, its bias <-> a Dense kernel and bias."""
  rules.append(linear(f"{hf}.weight", f"{tfx}/kernel"))
  if bias:
    rules.append(same(f"{hf}.bias", f"{tfx}/bias"))
