"""Tests of dpkd_jax/models/example_mixing.py: the batch axis is followed through the ops that
keep examples apart and every op that mixes them is refused, naming the op and the line."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import lax

from dpkd_jax.models import example_mixing

_B = 3  # the batch size; no other axis of the test inputs has this size


def _axes(fn, *shapes, in_axes=None):
  closed = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
  in_axes = [0] * len(shapes) if in_axes is None else in_axes
  return example_mixing.batch_axes(closed.jaxpr, in_axes)


def _conv(x, k):
  return lax.conv_general_dilated(x, k, (2, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("fn,shapes,in_axes,expected", [
    (lambda x: jnp.tanh(x) * 2.0 + 1.0, [(_B, 4)], None, [0]),
    (lambda x, w: x @ w, [(_B, 4), (4, 5)], [0, None], [0]),
    (lambda w, x: w @ x.T, [(5, 4), (_B, 4)], [None, 0], [1]),  # batch in rhs free dims
    (lambda x, y: jnp.einsum("bij,bjk->bik", x, y), [(_B, 2, 4), (_B, 4, 5)], None, [0]),
    (lambda x: x.reshape(_B, -1), [(_B, 2, 5)], None, [0]),
    (lambda x: x.reshape(2, _B, 5), [(2, _B, 5)], [1], [1]),
    (lambda x: jnp.transpose(x, (1, 0, 2)), [(_B, 2, 5)], None, [1]),
    (lambda x: jnp.max(x, axis=(1, 2)) + jnp.sum(x, axis=1)[:, 0], [(_B, 2, 5)], None, [0]),
    (lambda x: jnp.cumsum(jnp.sort(x, axis=1), axis=1), [(_B, 4)], None, [0]),
    (lambda x: jnp.pad(x, ((0, 0), (1, 2)))[:, 1:3], [(_B, 4)], None, [0]),
    (lambda x: jnp.concatenate([x, jnp.ones((_B, 2))], axis=1), [(_B, 4)], None, [0]),
    (lambda x: nnx.relu(x) - jnp.mean(x, axis=-1, keepdims=True), [(_B, 4)], None, [0]),
    (lambda x, k: _conv(x, k), [(_B, 6, 5, 2), (3, 3, 2, 4)], [0, None], [0]),
    (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"),
     [(_B, 4, 4, 2)], None, [0]),
    (lambda x: jax.jit(lambda y: y * 2)(x), [(_B, 4)], None, [0]),
    (lambda x: lax.cond(True, lambda y: y + 1, lambda y: y * 2, x), [(_B, 4)], None, [0]),
    (lambda w: w * 2, [(4,)], [None], [None]),
])
def test_follows_the_batch_axis(fn, shapes, in_axes, expected):
  assert _axes(fn, *shapes, in_axes=in_axes) == expected


@pytest.mark.parametrize("fn,shapes,message", [
    (lambda x: x - jnp.mean(x, axis=0), [(_B, 4)], "reduce_sum at .*test_example_mixing.py"),
    (lambda x: x @ x.T, [(_B, 4)], "multiplies every example by every other one"),
    (lambda x, w: w @ x, [(_B, 4), (5, _B)], "contracts over the batch axis"),
    (lambda x: x.reshape(-1), [(_B, 4)], "merges or splits the batch axis"),
    (lambda x: jnp.cumsum(x, axis=0), [(_B, 4)], "cumsum .*along the batch axis"),
    (lambda x: jnp.sort(x, axis=0), [(_B, 4)], "sort .*along the batch axis"),
    (lambda x: x[1:], [(_B, 4)], "slices along the batch axis"),
    (lambda x: x[::-1], [(_B, 4)], "rev .*reverses"),
    (lambda x: jnp.roll(x, 1, axis=0), [(_B, 4)], "along the batch axis"),
    (lambda x: x + x.T, [(_B, _B)], "different axes"),
    (lambda x: x[jnp.array([0, 0, 1])], [(_B, 4)], "gather .*not an op whose batch axis"),
    (lambda x: lax.reduce_window(x, 0.0, lax.add, (2, 1), (1, 1), "VALID"), [(_B, 4)],
     "pools along the batch axis"),
    (lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                           dimension_numbers=("HWNC", "HWIO", "NHWC")),
     [(_B, 5, 6, 2), (3, 3, 2, 4)], "convolution's batch dimension"),
])
def test_refuses_what_mixes_examples(fn, shapes, message):
  with pytest.raises(example_mixing.MixingError, match=message):
    _axes(fn, *shapes, in_axes=[0] + [None] * (len(shapes) - 1))


def test_batch_statistics_of_batch_norm_are_refused():
  graphdef, state = nnx.split(nnx.BatchNorm(4, rngs=nnx.Rngs(0)))

  def axes(use_running_average):
    def run(state, x):
      return nnx.merge(graphdef, state)(x, use_running_average=use_running_average)
    closed = jax.make_jaxpr(run)(state, jax.ShapeDtypeStruct((_B, 4), jnp.float32))
    num_state = len(jax.tree.leaves(state))
    return example_mixing.batch_axes(closed.jaxpr, [None] * num_state + [0])

  assert axes(True) == [0]  # running averages: per example
  with pytest.raises(example_mixing.MixingError, match="reduce_sum .*along the batch axis"):
    axes(False)


def test_in_axes_must_match_the_inputs():
  with pytest.raises(ValueError, match="2 input axes for 1"):
    _axes(lambda x: x, (_B, 4), in_axes=[0, 0])


def test_input_uses_count_reads_inside_calls():
  def fn(w, v, x):
    inner = jax.jit(lambda w, x: x @ w + (x @ w).sum())(w, x)  # w read twice inside the jit
    return lax.cond(True, lambda y: y * v, lambda y: y, inner) + 1.0  # v: once, in one branch

  closed = jax.make_jaxpr(fn)(jnp.ones((4, 2)), jnp.ones(()), jnp.ones((_B, 4)))
  assert example_mixing.input_uses(closed.jaxpr) == [2, 1, 2]
