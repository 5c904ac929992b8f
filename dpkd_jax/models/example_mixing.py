"""Proves on a jaxpr that a batched function keeps its examples apart, or names the op that mixes.

Ghost clipping's batched pass (`models.ghost`) differentiates Σ_i loss_i once and reads row i of
each layer's output gradient as ∂loss_i/∂z_i. That is right iff row i of every value depends on
example i alone: no op may reduce over, contract over, reorder, slice or otherwise combine the
batch axis (BatchNorm's batch statistics, `x - x.mean(0)`, `x @ x.T`, a sort or cumsum along the
batch). `batch_axes` follows the batch axis through the equations of the model's jaxpr, the way
`jax.vmap`'s batching rules would, and raises `MixingError` at the first equation where it cannot
show that rows stay apart, naming the primitive and the source line.

The rules are conservative: an op is accepted only if its rule is listed here (elementwise ops,
reshapes that keep the batch axis, transposes, broadcasts, reductions over other axes,
dot_general with the batch axis free or paired, channels-last or any convolution whose batch dim
is the input's, pads/slices/windows that leave the batch axis whole, and calls into sub-jaxprs:
jit, custom_jvp/custom_vjp primal functions, cond branches). Anything else that touches a batched
value is refused, so a model the rules cannot follow gets a clear error rather than wrong norms.
Custom differentiation rules (fast_conv, fast_pool) are trusted to be row-wise where their primal
function is, as JAX's own rules are.

A batch of one cannot mix examples; `batch_axes` still runs, but sizes then cannot tell the batch
axis from other length-1 axes, so callers check with at least two examples.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import flax
import jax
from jax.extend import core as jax_core

Axis = int | None  # the axis that indexes the examples; None: the value is the same for all

# Ops that act position by position on operands of one rank (size-1 axes and scalars broadcast).
_ELEMENTWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh bitcast_convert_type cbrt ceil clamp
clz complex conj convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp
exp2 expm1 floor ge gt igamma igammac imag integer_pow is_finite le lgamma log log1p logistic lt
max min mul ne neg nextafter not or optimization_barrier pcast polygamma population_count pow
pvary real reduce_precision rem round rsqrt select_n shift_left shift_right_arithmetic
shift_right_logical sign sin sinh sqrt square stop_gradient sub tan tanh xor zeta
""".split())
_REDUCTIONS = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or "
                        "reduce_xor argmax argmin".split())
_ALONG_ONE_AXIS = {"cumsum": "axis", "cumprod": "axis", "cummax": "axis", "cummin": "axis",
                   "cumlogsumexp": "axis", "sort": "dimension", "split": "axis"}
_WINDOWS = frozenset("reduce_window_sum reduce_window_max reduce_window_min reduce_window".split())
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
          "custom_vjp_call_jaxpr": "fun_jaxpr", "checkpoint": "jaxpr", "remat": "jaxpr"}


class MixingError(ValueError):
  """An equation combines the rows of different examples (or the rules cannot show it does not)."""


# Frames in these packages are skipped when naming the line that made an equation.
_LIBRARIES = tuple(os.path.dirname(module.__file__) + os.sep for module in (jax, flax))


def _where(eqn: Any) -> str:
  """The innermost frame outside JAX and Flax that made `eqn`: "file.py:line (function)"."""
  traceback = getattr(eqn.source_info, "traceback", None)
  for frame in getattr(traceback, "frames", ()):
    if not frame.file_name.startswith(_LIBRARIES):
      return f"{frame.file_name}:{frame.line_num} ({frame.function_name})"
  return "an unknown line"


def _fail(eqn: Any, reason: str) -> MixingError:
  return MixingError(f"{eqn.primitive.name} at {_where(eqn)} {reason}")


def _shape(var: Any) -> tuple[int, ...]:
  return tuple(getattr(var.aval, "shape", ()))


def _common(eqn: Any, axes: Sequence[Axis]) -> int:
  """The one batch axis of the batched operands of an elementwise op."""
  batched = {a for a in axes if a is not None}
  if len(batched) != 1:
    raise _fail(eqn, f"combines operands batched along different axes {sorted(batched)}")
  return batched.pop()


def _reshape(eqn: Any, axis: int) -> int:
  """Where a row-major reshape puts the batch axis, if it keeps it whole."""
  if eqn.params.get("dimensions") is not None:
    raise _fail(eqn, "reorders dimensions before reshaping")
  before = int(_prod(_shape(eqn.invars[0])[:axis]))
  size = _shape(eqn.invars[0])[axis]
  out = _shape(eqn.outvars[0])
  for k in range(len(out)):
    if _prod(out[:k]) == before and out[k] == size:
      return k
  raise _fail(eqn, f"merges or splits the batch axis ({_shape(eqn.invars[0])} → {out})")


def _prod(values: Sequence[int]) -> int:
  total = 1
  for v in values:
    total *= int(v)
  return total


def _dot_general(eqn: Any, lhs: Axis, rhs: Axis) -> int:
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
  if lhs in lhs_contract or rhs in rhs_contract:
    raise _fail(eqn, "contracts over the batch axis")
  if lhs is not None and rhs is not None:
    if lhs not in lhs_batch or rhs not in rhs_batch or lhs_batch.index(lhs) != rhs_batch.index(rhs):
      raise _fail(eqn, "multiplies every example by every other one")
    return lhs_batch.index(lhs)
  if lhs is not None:
    if lhs in lhs_batch:
      return lhs_batch.index(lhs)
    free = [d for d in range(len(_shape(eqn.invars[0])))
            if d not in lhs_contract and d not in lhs_batch]
    return len(lhs_batch) + free.index(lhs)
  if rhs in rhs_batch:
    return rhs_batch.index(rhs)
  lhs_free = len(_shape(eqn.invars[0])) - len(lhs_contract) - len(lhs_batch)
  free = [d for d in range(len(_shape(eqn.invars[1])))
          if d not in rhs_contract and d not in rhs_batch]
  return len(lhs_batch) + lhs_free + free.index(rhs)


def _conv(eqn: Any, lhs: Axis, rhs: Axis) -> int:
  numbers = eqn.params["dimension_numbers"]
  if rhs is not None or lhs != numbers.lhs_spec[0] or eqn.params["batch_group_count"] != 1:
    raise _fail(eqn, "does not keep the batch as the convolution's batch dimension")
  return numbers.out_spec[0]


def _whole(eqn: Any, axis: int, ok: bool, what: str) -> int:
  if not ok:
    raise _fail(eqn, f"{what} along the batch axis")
  return axis


def _single(eqn: Any, axes: Sequence[Axis]) -> int:
  """The batch axis of the first operand, the only one that may be batched."""
  if axes[0] is None or any(a is not None for a in axes[1:]):
    raise _fail(eqn, "takes batched indices or updates")
  return axes[0]


def _rule(eqn: Any, axes: Sequence[Axis]) -> list[Axis]:
  """Output batch axes of one equation with at least one batched operand."""
  name, params = eqn.primitive.name, eqn.params
  nout = len(eqn.outvars)
  if name in _ELEMENTWISE:
    axis = _common(eqn, axes)
    out = _shape(eqn.outvars[0])
    # Operands of equal rank may have size-1 axes that broadcast; the batch axis must not.
    if any(a is not None and (len(_shape(v)) != len(out) or _shape(v)[a] != out[a])
           for a, v in zip(axes, eqn.invars)):
      raise _fail(eqn, "broadcasts a batched operand")
    return [axis] * nout
  if name in _CALLS:
    closed = params[_CALLS[name]]
    jaxpr = getattr(closed, "jaxpr", closed)
    return batch_axes(jaxpr, axes)
  if name == "cond":
    if axes[0] is not None:
      raise _fail(eqn, "branches on a value that depends on the examples")
    outs = [batch_axes(branch.jaxpr, axes[1:]) for branch in params["branches"]]
    if any(o != outs[0] for o in outs[1:]):
      raise _fail(eqn, "has branches whose outputs are batched differently")
    return outs[0]
  if name == "dot_general":
    return [_dot_general(eqn, *axes)]
  if name == "conv_general_dilated":
    return [_conv(eqn, *axes)]
  if name == "concatenate":
    axis = _common(eqn, axes)
    return [_whole(eqn, axis, params["dimension"] != axis, "concatenates")]
  axis = _single(eqn, axes) if name in ("dynamic_slice", "dynamic_update_slice", "pad") else axes[0]
  if axis is None or any(a is not None and a != axis for a in axes):
    raise _fail(eqn, "combines operands batched along different axes")
  if name in _REDUCTIONS:
    dims = params["axes"]
    return [_whole(eqn, axis, axis not in dims, "reduces") - sum(d < axis for d in dims)] * nout
  if name in _ALONG_ONE_AXIS:
    return [_whole(eqn, axis, params[_ALONG_ONE_AXIS[name]] != axis, "sorts, scans or splits")
            ] * nout
  if name == "reshape":
    return [_reshape(eqn, axis)]
  if name == "broadcast_in_dim":
    return [params["broadcast_dimensions"][axis]]
  if name == "transpose":
    return [tuple(params["permutation"]).index(axis)]
  if name == "squeeze":
    return [_whole(eqn, axis, axis not in params["dimensions"], "squeezes")
            - sum(d < axis for d in params["dimensions"])]
  if name == "rev":
    return [_whole(eqn, axis, axis not in params["dimensions"], "reverses")]
  if name == "pad":
    return [_whole(eqn, axis, tuple(params["padding_config"][axis]) == (0, 0, 0), "pads")]
  if name == "slice":
    strides = params["strides"]
    whole = (params["start_indices"][axis] == 0
             and params["limit_indices"][axis] == _shape(eqn.invars[0])[axis]
             and (strides is None or strides[axis] == 1))
    return [_whole(eqn, axis, whole, "slices")]
  if name == "dynamic_slice":
    whole = params["slice_sizes"][axis] == _shape(eqn.invars[0])[axis]
    return [_whole(eqn, axis, whole, "slices")]
  if name == "dynamic_update_slice":  # constant rows written into the batch: still row-wise
    return [axis]
  if name in _WINDOWS:
    whole = (params["window_dimensions"][axis] == 1 and params["window_strides"][axis] == 1
             and tuple(params["padding"][axis]) == (0, 0)
             and params["base_dilation"][axis] == 1 and params["window_dilation"][axis] == 1)
    return [_whole(eqn, axis, whole, "pools")] * nout
  if name == "top_k":
    return [_whole(eqn, axis, axis != len(_shape(eqn.invars[0])) - 1, "sorts")] * nout
  raise _fail(eqn, "is not an op whose batch axis ghost clipping can follow")


def batch_axes(jaxpr: jax_core.Jaxpr, in_axes: Sequence[Axis]) -> list[Axis]:
  """The batch axis of every output of `jaxpr`, given those of its inputs.

  Args:
    jaxpr: an open jaxpr (`ClosedJaxpr.jaxpr`); its constants are the same for every example.
    in_axes: per input variable, the axis indexing the examples, or None.

  Returns:
    Per output, the axis indexing the examples (None: it does not depend on them).

  Raises:
    MixingError: an equation combines rows of different examples, changes the batch size, or
      is not covered by the rules (see the module docstring); the message names the primitive
      and the source line.
  """
  if len(in_axes) != len(jaxpr.invars):
    raise ValueError(f"{len(in_axes)} input axes for {len(jaxpr.invars)} jaxpr inputs")
  env: dict[Any, Axis] = dict(zip(jaxpr.invars, in_axes))

  def read(var: Any) -> Axis:
    return None if isinstance(var, jax_core.Literal) else env.get(var)

  for eqn in jaxpr.eqns:
    axes = [read(v) for v in eqn.invars]
    if all(a is None for a in axes):
      outs: list[Axis] = [None] * len(eqn.outvars)
    else:
      outs = _rule(eqn, axes)
      sizes = {_shape(v)[a] for v, a in zip(eqn.invars, axes) if a is not None}
      for var, axis in zip(eqn.outvars, outs):
        if axis is not None and _shape(var)[axis] not in sizes:
          raise _fail(eqn, "changes the batch size")
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def input_uses(jaxpr: jax_core.Jaxpr) -> list[int]:
  """How many equations read each input of `jaxpr`, counted inside called sub-jaxprs (jit,
  custom_jvp/vjp primal functions, cond branches: the most any branch reads)."""
  counts = {var: 0 for var in jaxpr.invars}
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name in _CALLS or name == "cond":
      if name == "cond":
        inner = [max(col) for col in zip(*(input_uses(b.jaxpr) for b in eqn.params["branches"]))]
        operands = eqn.invars[1:]
      else:
        closed = eqn.params[_CALLS[name]]
        inner, operands = input_uses(getattr(closed, "jaxpr", closed)), eqn.invars
      for var, count in zip(operands, inner):
        if not isinstance(var, jax_core.Literal) and var in counts:
          counts[var] += count
    else:
      for var in eqn.invars:
        if not isinstance(var, jax_core.Literal) and var in counts:
          counts[var] += 1
  for var in jaxpr.outvars:
    if not isinstance(var, jax_core.Literal) and var in counts:
      counts[var] += 1
  return [counts[var] for var in jaxpr.invars]
