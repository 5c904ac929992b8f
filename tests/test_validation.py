"""Shared parameter checks of dpkd_jax.privacy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import validation


def test_check_int():
  assert validation.check_int("steps", np.int64(3), minimum=0) == 3
  for bad in (True, 2.5, "3", None):
    with pytest.raises(ValueError, match="steps must be an integer"):
      validation.check_int("steps", bad, minimum=0)
  with pytest.raises(ValueError, match="k must be >= 2, got 1"):
    validation.check_int("k", 1, minimum=2)


@pytest.mark.parametrize("value,positive,allow_inf,ok", [
    (1.0, True, False, True), (0.0, True, False, False), (0.0, False, False, True),
    (-1e-9, False, False, False), (math.nan, False, False, False),
    (math.inf, True, False, False), (math.inf, True, True, True), (-math.inf, True, True, False),
])
def test_check_float(value, positive, allow_inf, ok):
  if ok:
    assert validation.check_float("sigma", value, positive=positive, allow_inf=allow_inf) == value
  else:
    with pytest.raises(ValueError, match="sigma must be"):
      validation.check_float("sigma", value, positive=positive, allow_inf=allow_inf)


def test_check_float_rejects_non_numbers_and_skips_tracers():
  with pytest.raises(ValueError, match="must be a number"):
    validation.check_float("C", "big", positive=True)
  seen = []
  jax.jit(lambda c: seen.append(validation.check_float("C", c, positive=True)) or c)(jnp.float32(-1))
  assert seen == [None]  # traced: unknown at trace time, not checked


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 2.0, math.nan])
def test_check_delta_rejects_outside_open_unit_interval(delta):
  with pytest.raises(ValueError, match="delta must be"):
    validation.check_delta(delta)
  assert validation.check_delta(1e-5) == 1e-5
