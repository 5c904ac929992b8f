"""dpkd_jax.config_checks: one wording for config field checks."""

import dataclasses
import math

import pytest

from dpkd_jax import config_checks as checks


@dataclasses.dataclass
class _Cfg:
  lr: float = 1e-3
  steps: int = 10
  weight: float = 0.0


def test_one_of_names_the_field_and_the_known_values():
  checks.one_of("model", "a", {"a": 1, "b": 2})
  with pytest.raises(ValueError, match=r"unknown model 'c'; known: \['a', 'b'\]"):
    checks.one_of("model", "c", {"a": 1, "b": 2})


@pytest.mark.parametrize("value", [True, 1.5, "3", None])
def test_integer_refuses_non_integers(value):
  with pytest.raises(ValueError, match="steps must be an integer"):
    checks.integer("steps", value, minimum=1)


def test_integer_bounds_and_numpy_ints():
  import numpy as np
  assert checks.integer("steps", np.int64(3), minimum=1) == 3
  with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
    checks.integer("steps", 0, minimum=1)
  checks.integers(_Cfg(), "steps")
  with pytest.raises(ValueError, match="steps must be >= 11"):
    checks.integers(_Cfg(), "steps", minimum=11)


@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan, True, "1"])
def test_positive_refuses(value):
  with pytest.raises(ValueError, match="lr must be a finite number > 0"):
    checks.positive(_Cfg(lr=value), "lr")


def test_non_negative_admits_zero_only_among_the_edges():
  checks.non_negative(_Cfg(), "weight")
  for value in (-1e-9, math.inf, math.nan):
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
      checks.non_negative(_Cfg(weight=value), "weight")


def test_fraction_intervals():
  checks.fraction("p", 0.5)
  checks.fraction("p", 0.0, open_low=False)
  checks.fraction("p", 1.0, open_high=False)
  with pytest.raises(ValueError, match=r"p must be in \(0, 1\), got 0"):
    checks.fraction("p", 0)
  with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1.5"):
    checks.fraction("p", 1.5, open_low=False, open_high=False)


def test_seed():
  checks.seed(None)
  checks.seed(2**64 - 1)
  for bad in (-1, True, 1.0, 2**64):
    with pytest.raises(ValueError, match="seed"):
      checks.seed(bad)
