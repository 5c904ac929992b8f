"""Tests of `dpkd_jax.kernels.xla_cpu.fast_batch_norm_pool`: BatchNorm (batch statistics) → ReLU → 2×2
max-pool as one op.

The reference is flax's own layers: `nnx.BatchNorm(use_running_average=False)`, `nnx.relu` and
`nnx.max_pool`, whose running averages must come out equal too. The fused op sums BatchNorm's
gradient terms in another order (over the pooled map, in closed form), so float32 values and
gradients agree to rounding (`TOLERANCE` relative to the largest entry, `MODEL_TOLERANCE` for
whole models, as for `fast_norm_pool`); the float64 comparison checks the closed form itself
to 1e-12. The routing is `fast_norm_pool`'s (tested bit for bit there); a wrongly routed
cotangent would show here as an O(1) gradient error.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dpkd_jax import kernels
from dpkd_jax.kernels.xla_cpu import fast_batch_norm_pool
from dpkd_jax.models import classifiers, compact, core
from dpkd_jax.train import sharding

from test_fast_norm import MODEL_TOLERANCE, TOLERANCE, normal
from test_fast_norm_pool import assert_close

MOMENTUM = classifiers.BATCH_NORM_MOMENTUM


def layer_with(scale, bias, epsilon=1e-5):
  layer = nnx.BatchNorm(scale.shape[0], momentum=MOMENTUM, epsilon=epsilon, rngs=nnx.Rngs(0),
                        param_dtype=scale.dtype)
  layer.scale[...], layer.bias[...] = scale, bias
  # Running averages other than the initial ones, in the parameters' dtype (float64 included).
  layer.mean.set_value(jnp.linspace(-0.5, 0.5, scale.shape[0], dtype=scale.dtype))
  layer.var.set_value(jnp.linspace(0.5, 1.5, scale.shape[0], dtype=scale.dtype))
  return layer


def flax_layers(x, scale, bias):
  """The three flax layers: (pooled, new running mean, new running variance)."""
  layer = layer_with(scale, bias)
  y = nnx.max_pool(nnx.relu(layer(x, use_running_average=False)), (2, 2), strides=(2, 2))
  return y, layer.mean[...], layer.var[...]


def fused_layers(x, scale, bias):
  """`fast_batch_norm_pool.apply` on the same layer: (pooled, running mean, running var)."""
  layer = layer_with(scale, bias)
  return fast_batch_norm_pool.apply(layer, x), layer.mean[...], layer.var[...]


def fused_op(x, scale, bias):
  """The op itself, any float dtype (float64 included), no layer."""
  return fast_batch_norm_pool.fast_batch_norm_relu_max_pool(x, scale, bias, epsilon=1e-5)


def reference_op(x, scale, bias):
  """flax's layers for the pooled map, and the batch statistics as flax's `_compute_stats`
  takes them (one-pass variance, clipped at 0), differentiable: flax stops their gradient at
  the running averages, the op passes it, so this is the reference for their cotangents."""
  mean = jnp.mean(x, axis=(0, 1, 2))
  var = jnp.maximum(0.0, jnp.mean(jnp.square(x), axis=(0, 1, 2)) - jnp.square(mean))
  return flax_layers(x, scale, bias)[0], mean, var


def value_and_grads(block, x, scale, bias, cotangents):
  """Outputs and the VJP of `cotangents` (one per output) w.r.t. (x, scale, bias), jitted."""
  def run(x, scale, bias):
    outputs, vjp = jax.vjp(block, x, scale, bias)
    return outputs, vjp(cotangents)
  return jax.jit(run)(x, scale, bias)


def cotangents_for(x, seed, dtype=jnp.float32):
  channels = x.shape[-1]
  pooled = (x.shape[0], x.shape[1] // 2, x.shape[2] // 2, channels)
  return tuple(normal(s, seed + i).astype(dtype)
               for i, s in enumerate((pooled, (channels,), (channels,))))


def check(x, scale, bias, seed=0, tolerance=TOLERANCE):
  cotangents = cotangents_for(x, seed + 100)
  actual = value_and_grads(fused_layers, x, scale, bias, cotangents)
  assert_close(actual, value_and_grads(flax_layers, x, scale, bias, cotangents), tolerance)
  return actual


# Even sides, odd sides (the last row/column is in no window but in the statistics), one
# channel, the DPDFD student's first stage (datalens_cnn at B = 8).
CASES = [(2, 6, 8, 4), (3, 7, 5, 6), (4, 4, 4, 1), (8, 26, 26, 32)]


@pytest.mark.parametrize("shape", CASES)
def test_values_gradients_and_running_averages_match_flax(shape):
  x = normal(shape, seed=1, scale=2.0, shift=0.5)
  scale, bias = normal(shape[-1:], seed=2), normal(shape[-1:], seed=3)
  (outputs, grads) = check(x, scale, bias)
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads))
  assert outputs[0].shape == (shape[0], shape[1] // 2, shape[2] // 2, shape[3])


def test_float64_matches_flax_to_rounding():
  # In float64 the closed form and autodiff of flax's layers agree far below float32's
  # rounding, so a wrong term (e.g. a missing 1/n) cannot hide behind the tolerance.
  with jax.enable_x64(True):
    x = normal((3, 6, 6, 4), seed=4, scale=2.0, shift=0.5).astype(jnp.float64)
    scale = normal((4,), seed=5).astype(jnp.float64)
    bias = normal((4,), seed=6).astype(jnp.float64)
    cotangents = cotangents_for(x, 7, jnp.float64)
    actual = value_and_grads(fused_op, x, scale, bias, cotangents)
    expected = value_and_grads(reference_op, x, scale, bias, cotangents)
    assert actual[0][0].dtype == jnp.float64
    assert_close(actual, expected, 1e-12)


def test_ties_after_the_relu_route_as_flax():
  # Integers with an exactly representable per-channel mean: equal inputs normalise to equal
  # outputs and negatives rectify to 0, so most windows hold ties.
  values = np.random.default_rng(5).integers(-2, 3, size=(2, 6, 6, 4)).astype(np.float32)
  values[..., 0] = 1.0  # a constant channel: variance exactly 0 (half its gradient passes)
  check(jnp.asarray(values), normal((4,), seed=6), jnp.asarray([0.3, -0.2, 0.1, 0.4]))


def test_nan_spreads_over_its_channel_as_flax():
  # BatchNorm's statistics mix the batch: one NaN makes its channel NaN in every example.
  x = np.asarray(normal((3, 6, 6, 4), seed=8)).copy()
  x[1, 2, 3, 0] = np.nan
  (outputs, (dx, _, _)) = check(jnp.asarray(x), normal((4,), seed=9), normal((4,), seed=10))
  dx = np.asarray(dx)
  assert np.isnan(dx[..., 0]).all() and np.isfinite(dx[..., 1:]).all()
  assert np.isnan(np.asarray(outputs[1])[0])


def test_per_example_vmap_treats_each_example_as_its_own_batch():
  x = normal((4, 6, 6, 4), seed=13)
  scale, bias = normal((4,), seed=14), normal((4,), seed=15)
  weights = normal((3, 3, 4), seed=16)

  def loss(block, params, v):  # v (6, 6, 4): one example, a batch of one
    return jnp.sum(jnp.sin(block(v[None], *params)[0][0]) * weights)

  def per_example(block):
    return jax.jit(jax.vmap(jax.grad(lambda p, v: loss(block, p, v)), in_axes=(None, 0)))(
        (scale, bias), x)

  assert_close(per_example(fused_layers), per_example(flax_layers))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_other_dtypes_are_not_plain_and_the_op_refuses_them(dtype):
  x = normal((2, 4, 4, 4), seed=18).astype(dtype)
  layer = layer_with(jnp.ones(4, dtype), jnp.zeros(4, dtype))
  assert not fast_batch_norm_pool.is_plain(layer, x)
  with pytest.raises(ValueError, match="float32"):
    fast_batch_norm_pool.batch_norm_relu_max_pool(x, layer.scale[...], layer.bias[...])


def test_bad_parameter_shapes_raise():
  with pytest.raises(ValueError, match="shape"):
    fast_batch_norm_pool.batch_norm_relu_max_pool(jnp.ones((2, 4, 4, 4)), jnp.ones(3),
                                                  jnp.zeros(4))


def model_loss_and_stats(parts, x, params):
  out, stats = core.apply(parts.graphdef, params, parts.batch_stats, x, train=True)
  return jnp.mean(jnp.sin(3.0 * out.logits)), stats


@pytest.mark.parametrize("model_class,input_shape,stages", [
    (classifiers.DataLensCNN, (12, 12, 1), 1), (classifiers.SmallCNN, (8, 8, 2), 2),
    (classifiers.LeNet5, (28, 28, 1), 2), (compact.CompactCNN, (9, 9, 1), 2)])
def test_models_with_batch_norm_fuse_their_stages_in_training(model_class, input_shape, stages,
                                                             cpu_kernels):
  parts = core.split(model_class(num_classes=3, input_shape=input_shape, norm="batch",
                                 rngs=nnx.Rngs(jax.random.key(0))))
  x = normal((3, *input_shape), seed=19)
  run = jax.jit(jax.value_and_grad(lambda p: model_loss_and_stats(parts, x, p), has_aux=True))
  jaxpr = str(jax.make_jaxpr(lambda p: model_loss_and_stats(parts, x, p))(parts.params))
  assert jaxpr.count("name=fast_batch_norm_relu_max_pool") == stages
  fused = run(parts.params)
  with kernels.using(kernels.REFERENCE):  # the three layers in turn
    reference = jax.jit(jax.value_and_grad(lambda p: model_loss_and_stats(parts, x, p),
                                           has_aux=True))(parts.params)
  assert_close(fused, reference, MODEL_TOLERANCE)  # loss, running statistics, gradients
  eval_jaxpr = jax.make_jaxpr(lambda p: core.apply(parts.graphdef, p, parts.batch_stats, x,
                                                   train=False)[0].logits)(parts.params)
  assert "fast_batch_norm_relu_max_pool" not in str(eval_jaxpr)  # running averages: the layers


@pytest.mark.parametrize("block", [fused_op, fast_batch_norm_pool.batch_norm_relu_max_pool])
def test_inside_shard_map_with_replicated_parameters_as_flax(block):
  # 8 fake devices, 2 examples each, scale and bias replicated (invariant): each device's
  # batch statistics are its own rows', as for flax's layers without an axis name, and the
  # parameters' gradients are summed over the devices, as autodiff through flax's does.
  x, scale, bias = normal((16, 6, 6, 4), 61), normal((4,), 62), normal((4,), 63)
  cotangent = normal((16, 3, 3, 4), 64)

  def device_grads(op):
    def run(x, scale, bias, cotangent):
      y, vjp = jax.vjp(lambda *a: op(*a)[0], x, scale, bias)
      return y, vjp(cotangent)
    mesh, rows = sharding.data_mesh(), P(sharding.DATA_AXIS)
    return jax.jit(jax.shard_map(run, mesh=mesh, in_specs=(rows, P(), P(), rows),
                                 out_specs=(rows, (rows, P(), P()))))

  actual = device_grads(block)(x, scale, bias, cotangent)
  expected = device_grads(reference_op)(x, scale, bias, cotangent)
  assert_close(jax.device_get(actual), jax.device_get(expected))
