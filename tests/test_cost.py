"""Tests of `dpkd_jax.models.cost`: parameter counts and XLA FLOP counts."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax.models import classifiers, core, cost


class OneDense(nnx.Module):
  """A single dense layer with the model calling convention."""

  def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
    self.dense = nnx.Linear(in_features, out_features, rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    del train  # no BatchNorm
    return self.dense(x)


class OneConv(nnx.Module):
  """A single 3×3 VALID convolution without bias."""

  def __init__(self, in_channels: int, out_channels: int, *, rngs: nnx.Rngs):
    self.conv = nnx.Conv(in_channels, out_channels, (3, 3), padding="VALID", use_bias=False,
                         rngs=rngs)

  def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
    del train
    return self.conv(x)


def abstract(module_fn):
  return core.split(nnx.eval_shape(lambda: module_fn(nnx.Rngs(jax.random.key(0)))))


def test_count_params_of_arrays_and_shapes():
  tree = {"a": jnp.zeros((2, 3)), "b": {"c": jnp.zeros((4,)), "d": jnp.zeros(())}}
  assert cost.count_params(tree) == 11
  assert cost.count_params(jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)) == 11
  assert cost.count_params({}) == 0


def test_count_params_of_a_dense_layer():
  parts = abstract(lambda rngs: OneDense(256, 64, rngs=rngs))
  assert cost.count_params(parts.params) == 256 * 64 + 64


@pytest.mark.parametrize("batch_size", [1, 8])
def test_flops_of_a_dense_layer_are_two_per_multiply_add(batch_size):
  parts = abstract(lambda rngs: OneDense(256, 64, rngs=rngs))
  flops = cost.flops_per_example(parts, (256,), batch_size=batch_size)
  # 2·in·out for the matmul, plus `out` bias additions (0.2% of it): 1% covers the bias.
  chex.assert_trees_all_close(flops, 2.0 * 256 * 64, rtol=0.01)


def test_flops_of_a_convolution():
  parts = abstract(lambda rngs: OneConv(4, 8, rngs=rngs))
  flops = cost.flops_per_example(parts, (8, 8, 4))
  # VALID 3×3 on 8×8 → 6×6 outputs, each 3·3·4 multiply-adds per output channel.
  chex.assert_trees_all_close(flops, 2.0 * 6 * 6 * 8 * 3 * 3 * 4, rtol=0.01)


def test_flops_of_lenet5_are_dominated_by_its_multiply_adds():
  parts = core.split(nnx.eval_shape(lambda: classifiers.LeNet5(
      num_classes=10, input_shape=(28, 28, 1), norm="none", rngs=nnx.Rngs(jax.random.key(0)))))
  multiply_adds = (28 * 28 * 6 * 5 * 5 * 1 + 10 * 10 * 16 * 5 * 5 * 6  # the two convolutions
                   + 400 * 120 + 120 * 84 + 84 * 10)  # the three dense layers
  flops = cost.flops_per_example(parts, (28, 28, 1))
  # Padding-aware counts remove a little of conv1; biases, ReLU and pooling add a few percent.
  assert 0.9 * 2 * multiply_adds < flops < 1.15 * 2 * multiply_adds


def test_flops_rejects_bad_batch_size():
  parts = abstract(lambda rngs: OneDense(4, 2, rngs=rngs))
  with pytest.raises(ValueError, match="batch_size"):
    cost.flops_per_example(parts, (4,), batch_size=0)


@pytest.mark.parametrize("analysis, expected", [
    ({"flops": 12.0, "bytes accessed": 3.0}, 12.0),
    ([{"flops": 5.0}], 5.0),  # the list form of older JAX releases
    ({"bytes accessed": 3.0}, None),
    ({"flops": -1.0}, None),
    (None, None),
    ([], None),
])
def test_flops_from_analysis(analysis, expected):
  assert cost._flops_from_analysis(analysis) == expected
