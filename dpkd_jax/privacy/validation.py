"""Parameter checks shared by every privacy module (one place, one wording).

Checks run on concrete Python/NumPy values only: a traced value (a parameter passed through
`jax.vmap`/`jit` as an array) cannot be inspected at trace time, so it is accepted unchecked
and the caller documents that.
"""

from __future__ import annotations

import math
import operator
import warnings

import jax


def is_traced(value) -> bool:
  """True if `value` is a JAX tracer (its value is unknown at trace time)."""
  return isinstance(value, jax.core.Tracer)


def check_int(name: str, value: int, *, minimum: int) -> int:
  """`value` as a Python int >= minimum (bools rejected), else ValueError naming `name`."""
  try:
    if isinstance(value, bool):
      raise TypeError
    value = operator.index(value)
  except TypeError:
    raise ValueError(f"{name} must be an integer, got {value!r}") from None
  if value < minimum:
    raise ValueError(f"{name} must be >= {minimum}, got {value}")
  return value


def check_float(name: str, value: float, *, positive: bool, allow_inf: bool = False) -> float | None:
  """`value` as a float that is >= 0 (> 0 if `positive`) and finite unless `allow_inf`.

  Returns None (no check) for traced values; raises ValueError naming `name` otherwise.
  """
  if is_traced(value):
    return None
  try:
    value = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number, got {value!r}") from None
  finite_ok = math.isfinite(value) or (allow_inf and value == math.inf)
  if not finite_ok or value < 0 or (positive and value == 0):
    bound = "> 0" if positive else ">= 0"
    finite = "" if allow_inf else "finite and "
    raise ValueError(f"{name} must be {finite}{bound}, got {value!r}")
  return value


def check_delta(delta: float) -> float:
  """δ as a float in the open interval (0, 1)."""
  value = check_float("delta", delta, positive=True)
  if value is None:
    raise ValueError("delta must be a concrete number, not a traced value")
  if value >= 1:
    raise ValueError(f"delta must be in (0, 1), got {delta!r}")
  return value


def renamed_keyword(function: str, *, new: str, new_value, old: str, old_value):
  """The value of keyword `new` of `function`, which accepts its old name `old` for one
  release (as optax and jax_privacy deprecate arguments): `old_value` with a
  `DeprecationWarning` when only the old name is given.

  Raises:
    TypeError: neither name given, or both.
  """
  if old_value is None:
    if new_value is None:
      raise TypeError(f"{function}() missing required keyword argument: '{new}'")
    return new_value
  if new_value is not None:
    raise TypeError(f"{function}() got '{new}' and its deprecated name '{old}': give '{new}'")
  # stacklevel=3: point at the caller of `function`.
  warnings.warn(f"{function}(): '{old}' is deprecated, use '{new}' (same meaning)",
                DeprecationWarning, stacklevel=3)
  return old_value
