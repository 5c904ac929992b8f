"""Tests of `dpkd_jax.kernels.xla_cpu.fast_norm`: GroupNorm values and gradients equal `nnx.GroupNorm`'s.

Tolerance: fast_norm sums the same terms in another order (pixels first, then the channels of a
group), so results agree to float32 rounding. Every comparison allows
max |fast − nnx| ≤ 1e-5 · max |nnx| (seen ≤ 1e-6), and 1e-4 for whole models, where rounding
differences propagate through several layers.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax.kernels.xla_cpu import fast_norm
from dpkd_jax.models import classifiers, core

TOLERANCE = 1e-5
MODEL_TOLERANCE = 1e-4


def normal(shape, seed, scale=1.0, shift=0.0):
  """Fixed-seed float32 data made on the host (no threefry kernel to compile per shape)."""
  values = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
  return jnp.asarray(values * scale + shift)


def assert_close(actual, expected, tolerance=TOLERANCE):
  """max |actual − expected| ≤ tolerance · max |expected|, leaf by leaf."""
  chex.assert_trees_all_equal_shapes_and_dtypes(actual, expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    scale = float(jnp.max(jnp.abs(e)))
    error = float(jnp.max(jnp.abs(a - e)))
    assert error <= tolerance * scale, f"max error {error:.2e} vs scale {scale:.2e}"


def make_layer(channels, num_groups, seed=0):
  layer = nnx.GroupNorm(channels, num_groups=num_groups, rngs=nnx.Rngs(0))
  layer.scale[...] = normal((channels,), seed)
  layer.bias[...] = normal((channels,), seed + 1)
  return layer


def value_and_grads(norm, layer, x, target):
  """Output, and the gradients of a non-linear loss w.r.t. (scale, bias) and x."""
  def loss(scale, bias, x):
    y = norm(scale, bias, x)
    return jnp.sum(jnp.tanh(y) * target), y
  # Jitted: one compilation instead of one per primitive (eager mode), a few seconds on CPU.
  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      layer.scale[...], layer.bias[...], x)
  return y, grads


def reference(layer):
  """`layer(x)` as a pure function of (scale, bias, x): the nnx.GroupNorm under test."""
  graphdef, _ = nnx.split(layer)

  def norm(scale, bias, x):
    return nnx.merge(graphdef, nnx.State({"bias": nnx.Param(bias), "scale": nnx.Param(scale)}))(x)
  return norm


def fast(layer):
  return lambda scale, bias, x: fast_norm.group_norm(x, scale, bias, num_groups=layer.num_groups,
                                                     epsilon=layer.epsilon)


# (input shape, groups): one channel per group, several, a single group, a 3-D (B, L, C) input,
# a 2-D (B, C) input (statistics over the group's 4 channels only), and an offset, scaled input.
CASES = [((3, 5, 4, 6), 6, 1.0, 0.0), ((2, 6, 6, 8), 4, 1.0, 0.0), ((2, 4, 3, 6), 1, 1.0, 0.0),
         ((3, 7, 4), 2, 1.0, 0.0), ((4, 12), 3, 1.0, 0.0), ((2, 5, 5, 4), 2, 3.0, 2.0)]


@pytest.mark.parametrize("shape,num_groups,scale,shift", CASES)
def test_values_and_gradients_match_nnx_group_norm(shape, num_groups, scale, shift):
  layer = make_layer(shape[-1], num_groups)
  x = normal(shape, seed=2, scale=scale, shift=shift)
  target = normal(shape, seed=3)
  expected = value_and_grads(reference(layer), layer, x, target)
  actual = value_and_grads(fast(layer), layer, x, target)
  assert_close(actual, expected)


def test_constant_groups_match_autodiffs_clipped_variance():
  # Constant groups of 0.5: E[x²] − μ² = 0 exactly, the tie of `jnp.maximum(0, v)`; no NaN,
  # and the same gradients as autodiff.
  layer = make_layer(4, 2)
  x = jnp.concatenate([jnp.full((2, 3, 3, 2), 0.5), normal((2, 3, 3, 2), seed=4)], axis=-1)
  target = normal(x.shape, seed=5)
  assert_close(value_and_grads(fast(layer), layer, x, target),
               value_and_grads(reference(layer), layer, x, target))


def test_per_example_gradients_are_per_example():
  layer = make_layer(4, 2)
  x = normal((3, 4, 4, 4), seed=6)
  target = normal((4, 4, 4), seed=7)

  def loss(scale, bias, v):  # v (4, 4, 4): one example
    y = fast_norm.group_norm(v[None], scale, bias, num_groups=2)[0]
    return jnp.sum(jnp.tanh(y) * target)

  args = (layer.scale[...], layer.bias[...])
  per_example = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(None, None, 0)))(
      *args, x)
  one_example = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  for i in range(x.shape[0]):
    one = one_example(*args, x[i])
    assert_close(jax.tree.map(lambda g, i=i: g[i], per_example), one)
  # Against nnx: same per-example gradients.
  def nnx_loss(scale, bias, v):
    return jnp.sum(jnp.tanh(reference(layer)(scale, bias, v[None])[0]) * target)
  expected = jax.jit(jax.vmap(jax.grad(nnx_loss, argnums=(0, 1, 2)), in_axes=(None, None, 0)))(
      *args, x)
  assert_close(per_example, expected)


def test_apply_group_norm_uses_the_layers_parameters():
  layer = make_layer(6, 3)
  x = normal((2, 3, 3, 6), seed=8)
  assert_close(fast_norm.apply_group_norm(layer, x), layer(x))
  jaxpr = str(jax.make_jaxpr(lambda v: fast_norm.apply_group_norm(layer, v))(x))
  assert "fast_group_norm" in jaxpr


def test_other_configurations_fall_back_to_the_layer():
  layer = nnx.GroupNorm(4, num_groups=2, use_fast_variance=False, rngs=nnx.Rngs(0))
  x = normal((2, 3, 3, 4), seed=9)
  chex.assert_trees_all_equal(fast_norm.apply_group_norm(layer, x), layer(x))
  jaxpr = str(jax.make_jaxpr(lambda v: fast_norm.apply_group_norm(layer, v))(x))
  assert "fast_group_norm" not in jaxpr


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_groups=3), "num_groups=3"),
    (dict(num_groups=2, scale=jnp.ones(3)), "shape"),
])
def test_bad_arguments_raise(kwargs, message):
  scale = kwargs.pop("scale", jnp.ones(4))
  with pytest.raises(ValueError, match=message):
    fast_norm.group_norm(jnp.ones((2, 3, 4)), scale, jnp.zeros(4), **kwargs)


def test_small_cnn_loss_gradients_match_nnx_group_norm(cpu_kernels):
  # The same SmallCNN with its GroupNorms applied as plain nnx modules (layer(x)) and through
  # classifiers.apply_norm (fast_norm): same parameters, same gradients.
  model = classifiers.SmallCNN(num_classes=3, input_shape=(8, 8, 2), norm="group",
                               rngs=nnx.Rngs(jax.random.key(0)))
  x = normal((4, 8, 8, 2), seed=10)
  parts = core.split(model)

  def loss(params, plain):
    model = nnx.merge(parts.graphdef, params, parts.batch_stats)
    def stage(conv_norm, v):
      v = conv_norm.conv(v)
      v = conv_norm.norm(v) if plain else classifiers.apply_norm(conv_norm.norm, v, train=True)
      return classifiers.max_pool_2x2(nnx.relu(v))
    h = stage(model.conv2, stage(model.conv1, x))
    logits = model.head(nnx.relu(model.fc(h.reshape(h.shape[0], -1))))
    return jnp.mean(jnp.sin(3.0 * logits))

  grads = jax.jit(lambda p: (jax.grad(loss)(p, False), jax.grad(loss)(p, True)))(parts.params)
  assert_close(grads[0], grads[1], MODEL_TOLERANCE)
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads[0]))
  # And the model's own forward goes through fast_norm's formulation, fused with the ReLU and
  # the pool by fast_norm_pool (tests/test_fast_norm_pool.py).
  jaxpr = str(jax.make_jaxpr(lambda p: core.apply(parts.graphdef, p, parts.batch_stats, x,
                                                  train=True)[0].logits)(parts.params))
  assert jaxpr.count("name=fast_group_norm_relu_max_pool") == 2


def test_forward_mode_matches_nnx():
  layer = make_layer(4, 2)
  x, tangent = normal((2, 3, 3, 4), seed=11), normal((2, 3, 3, 4), seed=12)
  norm = jax.jit(lambda fn, v, t: jax.jvp(lambda u: fn(layer.scale[...], layer.bias[...], u),
                                          (v,), (t,)), static_argnums=0)
  assert_close(norm(fast(layer), x, tangent), norm(reference(layer), x, tangent))
