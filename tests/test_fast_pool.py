"""Tests of `dpkd_jax.kernels.xla_cpu.fast_pool`: values and gradients equal to `nnx.max_pool`'s.

Values are maxima (no arithmetic) and gradients are cotangents routed to one element per
window, so both must be *exactly* equal to `nnx.max_pool`'s (tolerance 0), ties included.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax.kernels.xla_cpu import fast_pool
from dpkd_jax.models import classifiers, compact, core


def normal(shape, seed):
  """Fixed-seed float32 data made on the host (no threefry kernel to compile per shape)."""
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def reference_pool(x, window=(2, 2), strides=None):
  return nnx.max_pool(x, window_shape=window, strides=strides or window, padding="VALID")


def fast(x, window=(2, 2), strides=None):
  return fast_pool.max_pool(x, window_shape=window, strides=strides)


def value_and_input_grad(pool, x, cotangent):
  """Output and input gradient, jitted: one compilation instead of one per eager op (as the
  models run the op, under jit)."""
  def run(x, cotangent):
    y, vjp = jax.vjp(pool, x)
    return y, vjp(cotangent)[0]
  return jax.jit(run)(x, cotangent)


# (input shape, window): even and odd (floored) sizes, a non-square window, a 3×3 window.
CASES = [((2, 6, 8, 3), (2, 2)), ((3, 7, 5, 2), (2, 2)), ((2, 6, 9, 2), (2, 3)),
         ((1, 9, 9, 4), (3, 3))]


@pytest.mark.parametrize("shape,window", CASES)
def test_values_and_gradients_equal_nnx_max_pool(shape, window):
  x = normal(shape, seed=0)
  cotangent = normal(reference_pool(x, window).shape, seed=1)
  expected_y, expected_dx = value_and_input_grad(lambda v: reference_pool(v, window), x, cotangent)
  y, dx = value_and_input_grad(lambda v: fast(v, window), x, cotangent)
  chex.assert_trees_all_equal((y, dx), (expected_y, expected_dx))


@pytest.mark.parametrize("window", [(2, 2), (3, 3)])
def test_ties_send_the_gradient_where_select_and_scatter_does(window):
  # Small integers make many ties per window, including all-equal windows; NaN and ±inf check
  # that the replayed `>=` scan matches XLA's in the corner cases too.
  values = np.random.default_rng(2).integers(0, 3, size=(2, 6, 6, 5)).astype(np.float32)
  values[0, 0, 0, 0] = np.nan
  values[0, 1, 1, 1] = np.nan
  values[1, :2, :2, 2] = np.inf
  values[1, 2:4, :2, 3] = -np.inf
  x = jnp.asarray(values)
  cotangent = normal(reference_pool(x, window).shape, seed=3)
  expected = value_and_input_grad(lambda v: reference_pool(v, window), x, cotangent)
  actual = value_and_input_grad(lambda v: fast(v, window), x, cotangent)
  np.testing.assert_array_equal(np.asarray(actual[0]), np.asarray(expected[0]))
  np.testing.assert_array_equal(np.asarray(actual[1]), np.asarray(expected[1]))


def test_a_tie_gives_the_whole_gradient_to_the_first_element_in_row_major_order():
  x = jnp.array([[1.0, 5.0], [5.0, 5.0]]).reshape(1, 2, 2, 1)
  dx = jax.grad(lambda v: fast(v).sum())(x)
  np.testing.assert_array_equal(np.asarray(dx).reshape(2, 2), [[0.0, 1.0], [0.0, 0.0]])
  # A plain reshape + max would split it (1/3 each): the behaviour fast_pool avoids.
  split = jax.grad(lambda v: v.reshape(1, 1, 2, 1, 2, 1).max(axis=(2, 4)).sum())(x)
  assert float(split[0, 0, 1, 0]) == pytest.approx(1 / 3)


def test_per_example_gradients_are_per_example():
  x = normal((4, 6, 6, 3), seed=4)
  weights = normal((3, 3, 3), seed=5)

  def loss(v):  # v (6, 6, 3): one example
    return jnp.sum(jnp.sin(fast(v[None])[0]) * weights)

  batched, single = jax.jit(jax.vmap(jax.grad(loss))), jax.jit(jax.grad(loss))  # two compiles
  per_example = batched(x)
  one_by_one = jnp.stack([single(x[i]) for i in range(x.shape[0])])
  chex.assert_trees_all_equal(per_example, one_by_one)
  # Example 0's gradient does not change when the other examples do.
  changed = x.at[1:].set(normal((3, 6, 6, 3), seed=6))
  chex.assert_trees_all_equal(batched(changed)[0], per_example[0])


def test_forward_mode_and_second_order_match_nnx():
  x = normal((2, 4, 4, 2), seed=7)
  tangent = normal(x.shape, seed=8)
  jvp = lambda pool: jax.jit(lambda v, t: jax.jvp(pool, (v,), (t,)))(x, tangent)  # noqa: E731
  chex.assert_trees_all_equal(jvp(fast), jvp(reference_pool))

  def hvp(pool):  # jitted: one compilation instead of one per eager op
    grad = jax.grad(lambda v: jnp.sum(jnp.tanh(pool(v)) ** 2))
    return jax.jit(lambda v, t: jax.jvp(grad, (v,), (t,))[1])(x, tangent)
  chex.assert_trees_all_close(hvp(fast), hvp(reference_pool), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(window=(2, 2), strides=(1, 1)),
                                    dict(window=(3, 3), strides=(2, 2))])
def test_overlapping_windows_fall_back_to_nnx(kwargs):
  x = normal((1, 7, 7, 2), seed=9)
  expected = nnx.max_pool(x, window_shape=kwargs["window"], strides=kwargs["strides"])
  chex.assert_trees_all_equal(fast(x, kwargs["window"], kwargs["strides"]), expected)
  jaxpr = str(jax.make_jaxpr(lambda v: fast(v, kwargs["window"], kwargs["strides"]))(x))
  assert "custom_jvp" not in jaxpr and "reduce_window_max" in jaxpr


def test_same_padding_falls_back_to_nnx():
  x = normal((1, 5, 5, 2), seed=10)
  chex.assert_trees_all_equal(fast_pool.max_pool(x, (2, 2), (2, 2), padding="SAME"),
                              nnx.max_pool(x, (2, 2), (2, 2), padding="SAME"))


def test_tiled_case_uses_no_select_and_scatter():
  x = normal((2, 4, 4, 2), seed=11)
  jaxpr = str(jax.make_jaxpr(jax.grad(lambda v: fast(v).sum()))(x))
  assert "select_and_scatter" not in jaxpr and "reduce_window" not in jaxpr
  reference = str(jax.make_jaxpr(jax.grad(lambda v: reference_pool(v).sum()))(x))
  assert "select_and_scatter" in reference  # the op this module exists to avoid


@pytest.mark.parametrize("dtype", ["float64", "bfloat16", "float16"])
def test_other_float_widths_equal_nnx_max_pool(dtype):
  # The picked element's key is an integer as wide as the float: int64 for float64 (x64 on),
  # int16 for the half types. Ties, NaN and ±inf as in the float32 test.
  values = np.random.default_rng(4).integers(0, 3, size=(2, 6, 6, 3)).astype(np.float64)
  values[0, 0, 0, 0] = np.nan
  values[1, :2, :2, 2] = np.inf
  values[1, 2:4, :2, 1] = -np.inf
  values[0, 2, 2, :] = -0.0
  with jax.enable_x64(dtype == "float64"):
    x = jnp.asarray(values, dtype=dtype)
    assert x.dtype == jnp.dtype(dtype)
    cotangent = jnp.asarray(np.random.default_rng(5).standard_normal((2, 3, 3, 3)), dtype=dtype)
    expected = value_and_input_grad(reference_pool, x, cotangent)
    actual = value_and_input_grad(fast, x, cotangent)
    chex.assert_trees_all_equal(actual, expected)
