"""Tests of `dpkd_jax.kernels.xla_cpu.upsample_conv`: nearest ×2 upsampling → 3×3 SAME conv as four
2×2 sub-pixel convolutions.

The reference is the two layers in turn, `lax.conv_general_dilated(upsample_nearest_2x(x), w)`
(and, for the generator, the DAFL generator with its upsampling and convolutions composed as
before). The sub-pixel form sums the taps that read one source pixel before the product, so
values and gradients agree to float32 rounding: max |new − reference| ≤ 1e-5 · max |reference|.
A wrongly placed tap or phase would show as an O(1) error.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from dpkd_jax.kernels.xla_cpu import fast_conv, upsample_conv
from dpkd_jax.models import core, generators

TOLERANCE = 1e-5
SPECS = ("NHWC", "HWIO", "NHWC")


def normal(shape, seed, scale=1.0):
  values = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
  return jnp.asarray(values * scale)


def assert_close(actual, expected, tolerance=TOLERANCE, floor=1e-30):
  """max |actual − expected| ≤ tolerance · max(max |expected|, floor), leaf by leaf."""
  chex.assert_trees_all_equal_shapes_and_dtypes(actual, expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    a, e = np.asarray(a), np.asarray(e)
    scale = float(np.max(np.abs(e), initial=0.0))
    error = float(np.max(np.abs(a - e), initial=0.0))
    assert error <= tolerance * max(scale, floor), f"max error {error:.2e} vs scale {scale:.2e}"


def reference(x, kernel):
  return lax.conv_general_dilated(upsample_conv.upsample_nearest_2x(x), kernel, (1, 1), "SAME",
                                  dimension_numbers=SPECS)


def sub_pixel(x, kernel):
  return upsample_conv.upsample_conv(x, kernel)


SHAPES = [((2, 3, 3, 1), 4), ((3, 7, 7, 8), 6), ((2, 4, 6, 5), 3), ((1, 1, 1, 2), 2)]


@pytest.mark.parametrize("x_shape,out_channels", SHAPES)
@pytest.mark.parametrize("conv", ["fast", "lax"])
def test_values_and_gradients_match_upsample_then_conv(x_shape, out_channels, conv):
  conv_fn = {"fast": fast_conv.conv_general_dilated, "lax": lax.conv_general_dilated}[conv]
  x = normal(x_shape, seed=0)
  kernel = normal((3, 3, x_shape[-1], out_channels), seed=1)
  fn = lambda x, k: upsample_conv.upsample_conv(x, k, conv_general_dilated=conv_fn)  # noqa: E731
  y = jax.jit(fn)(x, kernel)
  assert_close(y, jax.jit(reference)(x, kernel))
  cotangent = normal(y.shape, seed=2)
  grads = jax.jit(jax.grad(lambda x, k: jnp.sum(fn(x, k) * cotangent), (0, 1)))(x, kernel)
  expected = jax.jit(jax.grad(lambda x, k: jnp.sum(reference(x, k) * cotangent), (0, 1)))(
      x, kernel)
  assert_close(grads, expected)


def test_every_tap_reaches_the_right_pixels():
  """One-hot kernels and inputs: each tap's contribution lands exactly where upsampling puts it
  (an exact 0/1 comparison, no rounding involved)."""
  x = normal((1, 4, 4, 1), seed=3)
  new, old = jax.jit(sub_pixel), jax.jit(reference)  # one compilation each for the nine kernels
  for i in range(3):
    for j in range(3):
      kernel = jnp.zeros((3, 3, 1, 1)).at[i, j].set(1.0)
      np.testing.assert_array_equal(new(x, kernel), old(x, kernel))


def test_vmap_matches_per_example_calls():
  x = normal((3, 2, 5, 5, 4), seed=4)
  kernel = normal((3, 3, 4, 2), seed=5)
  # Jitted (one compilation per function; eagerly, one per op).
  batched = jax.jit(jax.vmap(sub_pixel, in_axes=(0, None)))(x, kernel)
  one = jax.jit(reference)
  assert_close(batched, jnp.stack([one(xi, kernel) for xi in x]))
  per_example = jax.jit(jax.vmap(jax.grad(
      lambda x, k: jnp.sum(jnp.sin(sub_pixel(x[None], k))), 1), in_axes=(0, None)))(x[0], kernel)
  one_grad = jax.jit(jax.grad(lambda xi, k: jnp.sum(jnp.sin(reference(xi[None], k))), 1))
  expected = jnp.stack([one_grad(xi, kernel) for xi in x[0]])
  assert_close(per_example, expected)


def test_apply_uses_the_layer_parameters_and_falls_back():
  layer = nnx.Conv(4, 3, (3, 3), rngs=nnx.Rngs(0), conv_general_dilated=fast_conv.conv_general_dilated)
  x = normal((2, 5, 5, 4), seed=6)
  assert upsample_conv.supported(layer, x)
  assert_close(upsample_conv.apply(layer, x), layer(upsample_conv.upsample_nearest_2x(x)))
  strided = nnx.Conv(4, 3, (3, 3), strides=2, rngs=nnx.Rngs(0))
  assert not upsample_conv.supported(strided, x)
  np.testing.assert_array_equal(upsample_conv.apply(strided, x),
                                strided(upsample_conv.upsample_nearest_2x(x)))
  assert not upsample_conv.supported(layer, x.astype(jnp.float16))


def _composed_call(self, z, *, train=False):
  """The DAFL generator's forward pass with upsampling and convolutions composed (the
  reference the sub-pixel form replaces)."""
  running = not train
  up = upsample_conv.upsample_nearest_2x
  x = self.project(z).reshape(z.shape[0], *self.init_shape)
  x = up(self.project_norm(x, use_running_average=running))
  x = nnx.leaky_relu(self.norm1(self.conv1(x), use_running_average=running), 0.2)
  x = nnx.leaky_relu(self.norm2(self.conv2(up(x)), use_running_average=running), 0.2)
  return self.output_norm(jnp.tanh(self.conv_out(x)), use_running_average=running)


def _generator_outputs(parts, z, cotangent):
  """(images, new batch statistics, parameter gradient of <images, cotangent>)."""
  def run(params):
    images, stats = core.apply(parts.graphdef, params, parts.batch_stats, z, train=True)
    return jnp.sum(jnp.sin(images) * cotangent), (images, stats)
  grads, (images, stats) = jax.jit(jax.grad(run, has_aux=True))(parts.params)
  return images, stats, grads


@pytest.mark.parametrize("image_shape", [(28, 28, 1), (8, 12, 3)])
def test_generator_matches_composed_layers(monkeypatch, image_shape, cpu_kernels):
  """Images, BatchNorm running statistics and parameter gradients of the DAFL generator equal
  those of the composed layers, in float64 (where the generator's own rounding, amplified by
  its BatchNorms, does not hide a real difference). The biases of the convolutions before a
  BatchNorm have a zero gradient in exact arithmetic (about 1e-14 here): the floor keeps their
  rounding from counting as a relative error."""
  parts = core.split(generators.DAFLGenerator(latent_dim=10, image_shape=image_shape,
                                              rngs=nnx.Rngs(0), base_channels=8))
  with jax.enable_x64(True):
    to64 = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), tree)  # noqa: E731
    parts64 = core.ModelParts(parts.graphdef, to64(parts.params), to64(parts.batch_stats))
    z = jnp.asarray(normal((6, 10), seed=7), jnp.float64)
    cotangent = jnp.asarray(normal((6, *image_shape), seed=8), jnp.float64)
    new = _generator_outputs(parts64, z, cotangent)
    monkeypatch.setattr(generators.DAFLGenerator, "__call__", _composed_call)
    old = _generator_outputs(parts64, z, cotangent)
  assert_close(new, old, tolerance=1e-10, floor=1e-3)
