"""Tests of `dpkd_jax.kernels.xla_cpu.banded_conv`: a convolution as one product with a banded matrix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dpkd_jax.kernels.xla_cpu import banded_conv

NHWC = ("NHWC", "HWIO", "NHWC")


def normal(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def assert_close(actual, expected, tolerance=1e-5):
  assert actual.shape == expected.shape
  scale = float(jnp.max(jnp.abs(expected)))
  assert float(jnp.max(jnp.abs(actual - expected))) <= tolerance * scale


def test_band_matrix_places_each_tap_on_its_diagonal():
  # (kh, kw, C, O) = (2, 3, 1, 1) on a padded width of 5: Wo = 3 columns, row i's band has
  # w[i, j] at (q + j, q).
  kernel = jnp.arange(1.0, 7.0).reshape(2, 3, 1, 1)
  band = np.asarray(banded_conv.band_matrix(kernel, padded_w=5)).reshape(2, 5, 3)
  expected_row0 = np.array([[1, 0, 0], [2, 1, 0], [3, 2, 1], [0, 3, 2], [0, 0, 3]])
  np.testing.assert_array_equal(band[0], expected_row0)
  np.testing.assert_array_equal(band[1], expected_row0 + 3 * (expected_row0 > 0))


# (kernel (kh, kw, C, O), padding, input (H, W)): LeNet-5's two layers, SAME, uneven and
# cropping pads, a non-square kernel.
CASES = [
    ((5, 5, 1, 6), ((2, 2), (2, 2)), (12, 12)),
    ((5, 5, 6, 16), ((0, 0), (0, 0)), (9, 9)),
    ((3, 3, 2, 3), ((1, 1), (1, 1)), (6, 7)),
    ((5, 5, 2, 3), ((2, 1), (0, 2)), (6, 7)),
    ((2, 3, 3, 2), ((-1, 1), (2, 0)), (7, 6)),
]


@pytest.mark.parametrize("kernel_shape,padding,input_hw", CASES)
def test_values_and_gradients_match_lax(kernel_shape, padding, input_hw):
  x, w = normal((3, *input_hw, kernel_shape[2]), 0), normal(kernel_shape, 1)

  def loss(conv, x, w):
    y = conv(x, w)
    return jnp.sum(jnp.tanh(y) * jnp.cos(jnp.arange(y.size).reshape(y.shape))), y

  banded = jax.jit(jax.value_and_grad(lambda x, w: loss(
      lambda x, w: banded_conv.conv(x, w, padding), x, w), argnums=(0, 1), has_aux=True))
  plain = jax.jit(jax.value_and_grad(lambda x, w: loss(
      lambda x, w: lax.conv_general_dilated(x, w, (1, 1), padding, dimension_numbers=NHWC),
      x, w), argnums=(0, 1), has_aux=True))
  (_, y_banded), grads_banded = banded(x, w)
  (_, y_plain), grads_plain = plain(x, w)
  assert_close(y_banded, y_plain)
  for actual, expected in zip(grads_banded, grads_plain):
    assert_close(actual, expected)


def test_per_example_gradients_by_vmap_match_lax():
  x, w = normal((4, 8, 8, 1), 0), normal((5, 5, 1, 6), 1)

  def per_example(conv):
    return jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.sin(conv(x[None], w)))),
                            in_axes=(None, 0)))(w, x)

  assert_close(per_example(lambda x, w: banded_conv.conv(x, w, ((2, 2), (2, 2)))),
               per_example(lambda x, w: lax.conv_general_dilated(
                   x, w, (1, 1), ((2, 2), (2, 2)), dimension_numbers=NHWC)))


def test_non_finite_inputs_stay_non_finite_but_spread_along_the_row():
  # The band's zeros multiply every input value of a row: 0 · inf and 0 · NaN are NaN, so a
  # non-finite input makes its example's whole output rows non-finite, where lax's convolution marks
  # only the windows that read it. Every output lax makes non-finite is non-finite here too
  # (nothing is hidden), and the other examples are untouched (no mixing across examples).
  x = normal((2, 6, 6, 1), 0).at[0, 2, 3, 0].set(jnp.nan).at[0, 4, 1, 0].set(jnp.inf)
  w = normal((3, 3, 1, 2), 1)
  banded = banded_conv.conv(x, w, ((1, 1), (1, 1)))
  plain = lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=NHWC)
  plain_bad = ~np.isfinite(np.asarray(plain))
  assert plain_bad.any() and np.all(~np.isfinite(np.asarray(banded))[plain_bad])
  rows_touched = np.zeros((6,), bool)
  rows_touched[1:6] = True  # rows 1..3 read input row 2, rows 3..5 read input row 4
  assert not np.isfinite(np.asarray(banded)[0, rows_touched]).any()
  assert_close(banded[1], plain[1])


@pytest.mark.parametrize("lhs_shape,rhs_shape,strides,padding,offered", [
    ((256, 28, 28, 1), (5, 5, 1, 6), (1, 1), ((2, 2), (2, 2)), True),   # LeNet-5 conv1
    ((256, 14, 14, 6), (5, 5, 6, 16), (1, 1), ((0, 0), (0, 0)), True),  # LeNet-5 conv2
    ((256, 14, 14, 32), (3, 3, 32, 64), (1, 1), ((1, 1), (1, 1)), False),  # wide input
    ((8, 28, 28, 1), (3, 3, 1, 8), (2, 2), ((1, 1), (1, 1)), False),  # strided
    ((8, 224, 224, 3), (3, 3, 3, 64), (1, 1), ((1, 1), (1, 1)), False),  # band too large
])
def test_supported(lhs_shape, rhs_shape, strides, padding, offered):
  assert banded_conv.supported(lhs_shape, rhs_shape, strides, padding) == offered
