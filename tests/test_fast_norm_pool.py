"""Tests of `dpkd_jax.kernels.xla_cpu.fast_norm_pool`: GroupNorm → ReLU → 2×2 max-pool as one op.

The reference is the three layers in turn, `fast_pool.max_pool(jax.nn.relu(
fast_norm.group_norm(...)))` (themselves tested against nnx), and nnx's own layers. The fused op
sums the GroupNorm gradient's terms in another order (over the pooled map, in closed form), so
values and gradients agree to float32 rounding: max |fused − reference| ≤ 1e-5 · max |reference|,
1e-4 for whole models. The pool's routing is exact: `_select` is compared bit for bit with
`fast_pool`'s mask, and a wrongly routed cotangent would show as an O(1) gradient error.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dpkd_jax import kernels
from dpkd_jax.kernels.xla_cpu import fast_norm, fast_norm_pool, fast_pool
from dpkd_jax.models import classifiers, compact, core
from dpkd_jax.train import sharding

from test_fast_norm import MODEL_TOLERANCE, TOLERANCE, normal


def assert_close(actual, expected, tolerance=TOLERANCE):
  """max |actual − expected| ≤ tolerance · max |expected| over finite entries, leaf by leaf;
  NaN and ±inf must sit at the same places."""
  chex.assert_trees_all_equal_shapes_and_dtypes(actual, expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    a, e = np.asarray(a), np.asarray(e)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
    np.testing.assert_array_equal(np.where(np.isinf(e), e, 0), np.where(np.isinf(a), a, 0))
    finite = np.isfinite(e)
    scale = float(np.max(np.abs(e[finite]), initial=0.0))
    error = float(np.max(np.abs(a[finite] - e[finite]), initial=0.0))
    assert error <= tolerance * max(scale, 1e-30), f"max error {error:.2e} vs scale {scale:.2e}"


def fused(num_groups):
  return lambda x, scale, bias: fast_norm_pool.group_norm_relu_max_pool(
      x, scale, bias, num_groups=num_groups)


def composed(num_groups):
  return lambda x, scale, bias: fast_pool.max_pool(jax.nn.relu(fast_norm.group_norm(
      x, scale, bias, num_groups=num_groups)))


def nnx_layers(num_groups):
  def block(x, scale, bias):
    layer = nnx.GroupNorm(x.shape[-1], num_groups=num_groups, rngs=nnx.Rngs(0))
    layer.scale[...], layer.bias[...] = scale, bias
    return nnx.max_pool(nnx.relu(layer(x)), window_shape=(2, 2), strides=(2, 2))
  return block


def value_and_grads(block, x, scale, bias, cotangent):
  """Output and the VJP of `cotangent` w.r.t. (x, scale, bias), jitted (one compilation)."""
  def run(x, scale, bias):
    y, vjp = jax.vjp(block, x, scale, bias)
    return y, vjp(cotangent)
  return jax.jit(run)(x, scale, bias)


def check_against_references(x, scale, bias, num_groups, seed=0, tolerance=TOLERANCE):
  pooled_shape = (x.shape[0], x.shape[1] // 2, x.shape[2] // 2, x.shape[3])
  cotangent = normal(pooled_shape, seed + 100)
  actual = value_and_grads(fused(num_groups), x, scale, bias, cotangent)
  assert_close(actual, value_and_grads(composed(num_groups), x, scale, bias, cotangent),
               tolerance)
  return actual, cotangent


# (input shape, groups): even sides, odd sides (the last row/column is in no window but in the
# statistics), one channel per group, a single group, small_cnn's first stage at a small batch.
CASES = [((2, 6, 8, 4), 2), ((3, 7, 5, 6), 3), ((2, 4, 4, 3), 3), ((2, 5, 6, 4), 1),
         ((2, 28, 28, 32), 16)]


@pytest.mark.parametrize("shape,num_groups", CASES)
def test_values_and_gradients_match_the_three_layers(shape, num_groups):
  channels = shape[-1]
  x = normal(shape, seed=1, scale=2.0, shift=0.5)
  scale, bias = normal((channels,), seed=2), normal((channels,), seed=3)
  actual, cotangent = check_against_references(x, scale, bias, num_groups)
  assert_close(actual, value_and_grads(nnx_layers(num_groups), x, scale, bias, cotangent))
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(actual[1]))


def test_select_routes_exactly_as_fast_pool():
  # Small integers make ties in most windows, including all-equal ones; NaN, ±inf and -0
  # exercise the `>=` walk's corner cases. Same mask and same maxima, bit for bit.
  values = np.random.default_rng(4).integers(0, 3, size=(3, 8, 8, 5)).astype(np.float32)
  values[0, 0, 0, 0] = values[0, 1, 1, 1] = values[2, 3, 2, 4] = np.nan
  values[0, 2:4, 2:4, 2] = np.nan  # an all-NaN window
  values[1, :2, :2, 2] = np.inf
  values[1, 2:4, :2, 3] = -np.inf
  values[2, 4:6, 4:6, :] = -0.0
  values[2, 4, 5, :] = 0.0
  x = jnp.asarray(values)
  selected, position = fast_norm_pool._select(fast_norm_pool._views(x))
  tiles = fast_pool._tiles(x, (2, 2))
  expected_position = fast_pool._selected_index(tiles)
  np.testing.assert_array_equal(np.asarray(position), np.asarray(expected_position))
  view_index = np.asarray(position)[..., None]
  picked = np.take_along_axis(np.stack(fast_norm_pool._views(x), axis=-1), view_index, axis=-1)
  np.testing.assert_array_equal(np.asarray(selected), picked[..., 0])


def test_ties_after_the_relu_route_as_the_three_layers():
  # Integer inputs with an exactly representable mean: equal inputs normalise to equal
  # outputs, and every negative one rectifies to 0, so most windows hold ties.
  values = np.random.default_rng(5).integers(-2, 3, size=(2, 6, 6, 4)).astype(np.float32)
  x = jnp.asarray(values)
  check_against_references(x, normal((4,), seed=6), normal((4,), seed=7), num_groups=2)


def test_nan_stays_in_its_example_and_group_as_the_three_layers():
  x = np.asarray(normal((3, 6, 6, 4), seed=8)).copy()
  x[1, 2, 3, 0] = np.nan  # example 1, group 0 (channels 0 and 1)
  (_, (dx, _, _)), _ = check_against_references(jnp.asarray(x), normal((4,), seed=9),
                                                normal((4,), seed=10), num_groups=2)
  dx = np.asarray(dx)
  assert np.isnan(dx[1, ..., :2]).all() and np.isfinite(dx[[0, 2]]).all()
  assert np.isfinite(dx[1, ..., 2:]).all()


def test_constant_groups_match_autodiffs_clipped_variance():
  # E[x²] − μ² is exactly 0 for a constant group: autodiff of max(0, ·) passes half the
  # gradient there. Example 0 is constant; example 1 has one constant group.
  x = np.asarray(normal((2, 4, 6, 4), seed=11)).copy()
  x[0] = 1.5
  x[1, ..., 2:] = -0.25
  scale, bias = normal((4,), seed=12), jnp.asarray([0.3, -0.2, 0.1, 0.4], jnp.float32)
  # E[x²] − μ² cancels here, so its rounding (which depends on how XLA fuses the reductions of
  # each program) reaches the outputs at a few 1e-5 of their scale.
  check_against_references(jnp.asarray(x), scale, bias, num_groups=2, tolerance=1e-4)


def test_rounded_variances_at_and_below_zero_match_autodiff():
  # Near-constant groups far from 0: E[x²] − μ² cancels to a multiple of ulp(μ²), below, at or
  # above 0 while x − μ is not 0, so the clipped variance's gradient (none, half, full) shows.
  x = normal((8, 4, 4, 4), seed=20, scale=1e-4, shift=1000.0)
  scale, bias = normal((4,), seed=21), jnp.full((4,), 0.5)  # a positive bias: ReLU passes most
  raw_var = np.asarray(fast_norm_pool._statistics(x, scale, 2, 1e-6)[1])
  assert (raw_var < 0).any() and (raw_var == 0).any() and (raw_var > 0).any()
  # Autodiff's input gradient here is a difference of two terms ~1e3 times larger than it
  # (2x/n and 2μ/n, x ≈ 1000), the closed form's is not: they agree to 1e-3 of the largest
  # entry. The clipped variance's own share is of that rounding's size (x − μ is a few ulp of
  # x), so this checks agreement and finite values in that regime, not the factor itself.
  check_against_references(x, scale, bias, num_groups=2, tolerance=1e-3)


def test_a_nan_scale_takes_the_other_branch_to_the_same_values():
  # `_materialised`'s predicate is `scale[0] == scale[0]`: a NaN there picks the other
  # (identical) branch, and channel 0 turns NaN exactly as through the three layers.
  scale = jnp.asarray([np.nan, 1.0, -0.5, 2.0], jnp.float32)
  check_against_references(normal((2, 6, 6, 4), seed=23), scale, normal((4,), seed=24),
                           num_groups=2)


def test_per_example_gradients_are_per_example():
  x = normal((4, 6, 6, 4), seed=13)
  scale, bias = normal((4,), seed=14), normal((4,), seed=15)
  weights = normal((3, 3, 4), seed=16)

  def loss(params, v):  # v (6, 6, 4): one example
    pooled = fused(2)(v[None], *params)[0]
    return jnp.sum(jnp.sin(pooled) * weights)

  grad = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(None, 0)))
  per_example = grad((scale, bias), x)
  single = jax.jit(jax.grad(loss, argnums=(0, 1)))  # one compilation for the four examples
  one_by_one = [single((scale, bias), x[i]) for i in range(4)]
  assert_close(per_example, jax.tree.map(lambda *g: jnp.stack(g), *one_by_one))
  # Example 0's gradient does not change when the other examples do.
  changed = x.at[1:].set(normal((3, 6, 6, 4), seed=17))
  chex.assert_trees_all_equal(jax.tree.map(lambda g: g[0], grad((scale, bias), changed)),
                              jax.tree.map(lambda g: g[0], per_example))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_other_dtypes_take_the_three_layers(dtype):
  x = normal((2, 4, 4, 4), seed=18).astype(dtype)
  scale, bias = jnp.ones(4, dtype), jnp.zeros(4, dtype)
  assert not fast_norm_pool.supported(x, scale, bias)
  chex.assert_trees_all_equal(fused(2)(x, scale, bias), composed(2)(x, scale, bias))


@pytest.mark.parametrize("kwargs,message", [(dict(num_groups=3), "divisor"),
                                            (dict(num_groups=2, scale=jnp.ones(3)), "shape")])
def test_bad_arguments_raise(kwargs, message):
  scale = kwargs.pop("scale", jnp.ones(4))
  with pytest.raises(ValueError, match=message):
    fast_norm_pool.group_norm_relu_max_pool(jnp.ones((2, 4, 4, 4)), scale, jnp.zeros(4),
                                            **kwargs)


def model_loss(parts, x, params):
  logits = core.apply(parts.graphdef, params, parts.batch_stats, x, train=True)[0].logits
  return jnp.mean(jnp.sin(3.0 * logits))


@pytest.mark.parametrize("model_class,input_shape", [
    (classifiers.SmallCNN, (8, 8, 2)), (classifiers.LeNet5, (28, 28, 1)),
    (classifiers.DataLensCNN, (12, 12, 1)), (compact.CompactCNN, (9, 9, 1))])
def test_models_with_group_norm_fuse_their_stages_with_equal_gradients(model_class, input_shape,
                                                                      cpu_kernels):
  parts = core.split(model_class(num_classes=3, input_shape=input_shape, norm="group",
                                 rngs=nnx.Rngs(jax.random.key(0))))
  x = normal((3, *input_shape), seed=19)
  jaxpr = str(jax.make_jaxpr(lambda p: model_loss(parts, x, p))(parts.params))
  stages = 1 if model_class is classifiers.DataLensCNN else 2
  assert jaxpr.count("name=fast_group_norm_relu_max_pool") == stages
  fused_grads = jax.jit(jax.grad(lambda p: model_loss(parts, x, p)))(parts.params)
  with kernels.using(kernels.REFERENCE):  # the three layers in turn
    reference = jax.jit(jax.grad(lambda p: model_loss(parts, x, p)))(parts.params)
  assert_close(fused_grads, reference, MODEL_TOLERANCE)


# BatchNorm in training mode has its own fused op (tests/test_fast_batch_norm_pool.py).
@pytest.mark.parametrize("norm,train", [("batch", False), ("none", True)])
def test_other_norms_take_the_three_layers(norm, train):
  parts = core.split(classifiers.SmallCNN(num_classes=3, input_shape=(8, 8, 1), norm=norm,
                                          rngs=nnx.Rngs(0)))
  x = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)
  jaxpr = str(jax.make_jaxpr(lambda p, v: core.apply(parts.graphdef, p, parts.batch_stats, v,
                                                     train=train)[0].logits)(parts.params, x))
  assert "norm_relu_max_pool" not in jaxpr and "custom_jvp" in jaxpr


# The tapped op (ghost clipping): with a zero tap it is the fused op, and Σ tap-gradient·x̂ and
# Σ tap-gradient over the pooled map are each example's scale and bias gradients.


def tapped(num_groups):
  def block(x, scale, bias, tap):
    return fast_norm_pool.tapped_group_norm_relu_max_pool(x, scale, bias, tap,
                                                          num_groups=num_groups, epsilon=1e-6)
  return block


def per_example_from_taps(x, scale, bias, num_groups, weights):
  """(B, C) scale and bias gradients of Σ_i Σ weights·sin(pooled_i), from the tap."""
  def total(tap):
    out, xhat_at = tapped(num_groups)(x, scale, bias, tap)
    return jnp.sum(jnp.sin(out) * weights), xhat_at

  tap = jnp.zeros_like(weights)
  g, xhat_at = jax.grad(total, has_aux=True)(tap)
  return jnp.sum(g * xhat_at, axis=(1, 2)), jnp.sum(g, axis=(1, 2))


def per_example_by_vmap(x, scale, bias, num_groups, weights):
  def loss(params, v, w):  # one example through the three layers
    return jnp.sum(jnp.sin(composed(num_groups)(v[None], *params)[0]) * w)
  return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))((scale, bias), x, weights)


def check_taps(x, num_groups, seed):
  channels = x.shape[-1]
  scale, bias = normal((channels,), seed), normal((channels,), seed + 1)
  weights = normal((x.shape[0], x.shape[1] // 2, x.shape[2] // 2, channels), seed + 2)
  got = jax.jit(per_example_from_taps, static_argnums=3)(x, scale, bias, num_groups, weights)
  # Jitted too: eager vmap(grad) compiled each of the three layers' ops on its own.
  assert_close(got, jax.jit(per_example_by_vmap, static_argnums=3)(x, scale, bias, num_groups,
                                                                   weights))
  return got


@pytest.mark.parametrize("shape,num_groups", CASES)
def test_tapped_op_with_a_zero_tap_is_the_fused_op(shape, num_groups):
  channels = shape[-1]
  x, scale, bias = normal(shape, 30), normal((channels,), 31), normal((channels,), 32)
  tap = jnp.zeros((shape[0], shape[1] // 2, shape[2] // 2, channels))
  cotangent = normal(tap.shape, 33)
  run = jax.jit(lambda *a: jax.vjp(lambda *b: tapped(num_groups)(*b, tap)[0], *a))
  out, vjp = run(x, scale, bias)
  expected = value_and_grads(fused(num_groups), x, scale, bias, cotangent)
  # The same formulas, compiled in another program: XLA may sum the statistics in another
  # order, so equal to float32 rounding rather than bit for bit.
  assert_close((out, vjp(cotangent)), expected)


@pytest.mark.parametrize("shape,num_groups", CASES)
def test_taps_give_the_per_example_scale_and_bias_gradients(shape, num_groups):
  check_taps(normal(shape, 34), num_groups, seed=35)


def test_taps_with_ties_after_the_relu():
  values = np.random.default_rng(36).integers(-2, 3, size=(3, 6, 6, 4)).astype(np.float32)
  check_taps(jnp.asarray(values), 2, seed=37)


def test_taps_with_nan_stay_in_their_example_and_group():
  x = np.asarray(normal((3, 6, 6, 4), seed=38)).copy()
  x[1, 2, 3, 0] = np.nan  # example 1, group 0 (channels 0 and 1)
  d_scale, d_bias = (np.asarray(g) for g in check_taps(jnp.asarray(x), 2, seed=39))
  # The NaN group's pre-activations are NaN: the ReLU passes no gradient (bias: 0), and
  # Σ 0·x̂ over NaN x̂ is NaN (scale), as through the three layers (checked above).
  assert np.isnan(d_scale[1, :2]).all() and (d_bias[1, :2] == 0).all()
  assert np.isfinite(d_scale[[0, 2]]).all() and np.isfinite(d_scale[1, 2:]).all()
  assert np.isfinite(d_bias).all()


def test_tapped_op_under_vmap_is_the_op_on_each_slice():
  # Two stacked batches of (3, 6, 6, 4): vmap of the op (and of its vjp) equals a loop.
  x = normal((2, 3, 6, 6, 4), seed=40)
  scale, bias = normal((4,), 41), normal((4,), 42)
  weights = normal((2, 3, 3, 3, 4), seed=43)
  mapped = jax.jit(jax.vmap(per_example_from_taps, in_axes=(0, None, None, None, 0)),
                   static_argnums=3)(x, scale, bias, 2, weights)
  single = jax.jit(per_example_from_taps, static_argnums=3)
  looped = [single(x[k], scale, bias, 2, weights[k]) for k in range(2)]
  assert_close(mapped, jax.tree.map(lambda *g: jnp.stack(g), *looped))


@pytest.mark.parametrize("op", ["fused", "tapped"])
def test_inside_shard_map_with_replicated_parameters(op):
  # 8 fake devices, 2 examples each; scale and bias replicated (invariant). Their gradients,
  # computed from each device's rows, are summed over the devices (the transpose of the cast
  # to varying), and equal the three layers' on the whole batch.
  x, scale, bias = normal((16, 6, 6, 4), 44), normal((4,), 45), normal((4,), 46)
  cotangent = normal((16, 3, 3, 4), 47)

  def block(x, scale, bias):
    if op == "fused":
      return fused(2)(x, scale, bias)
    return tapped(2)(x, scale, bias, jnp.zeros_like(x, shape=(x.shape[0], 3, 3, 4)))[0]

  def device_grads(x, scale, bias, cotangent):
    y, vjp = jax.vjp(block, x, scale, bias)
    return y, vjp(cotangent)

  mesh, axis = sharding.data_mesh(), sharding.DATA_AXIS
  rows = P(axis)
  sharded = jax.jit(jax.shard_map(device_grads, mesh=mesh, in_specs=(rows, P(), P(), rows),
                                  out_specs=(rows, (rows, P(), P()))))
  actual = sharded(x, scale, bias, cotangent)
  assert_close(jax.device_get(actual),
               value_and_grads(composed(2), x, scale, bias, cotangent))
