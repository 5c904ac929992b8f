"""TrainState: creation, a donated jitted update, and BatchNorm statistics through core.apply."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dpkd_jax.models import core
from dpkd_jax.train.state import StudentGeneratorState, TrainState


class _Tiny(nnx.Module):
  """Linear + BatchNorm classifier small enough for unit tests."""

  def __init__(self, rngs):
    self.dense = nnx.Linear(4, 3, rngs=rngs)
    self.bn = nnx.BatchNorm(3, rngs=rngs)

  def __call__(self, x, *, train=False):
    h = self.bn(self.dense(x), use_running_average=not train)
    return core.ClassifierOutput(logits=h, features=x, hint=h)


# One model definition and one optimizer object: the jitted step is keyed on these static
# fields, so a new optax closure per state would (correctly) retrace.
_PARTS = core.split(_Tiny(nnx.Rngs(0)))
_TX = optax.sgd(0.1)


def _state():
  # Fresh copies: the jitted step donates (deletes) the buffers of the state it receives.
  return TrainState.create(jax.tree.map(jnp.copy, _PARTS), _TX)


def test_create_and_parts():
  state = _state()
  assert int(state.step) == 0
  assert set(state.params) == {"dense", "bn"}
  assert set(state.batch_stats) == {"bn"}
  assert state.parts.graphdef is state.graphdef


def test_jitted_donated_step_matches_manual_sgd():
  x = jax.random.normal(jax.random.key(1), (8, 4))
  labels = jnp.arange(8) % 3

  def loss_fn(params, stats):
    out, new_stats = core.apply(_state().graphdef, params, stats, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean(), new_stats

  @chex.assert_max_traces(n=1)
  def step(state):
    (_, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, state.batch_stats)
    return state.apply_gradients(grads, new_stats)

  jit_step = jax.jit(step, donate_argnums=0)
  reference = _state()
  (_, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(reference.params, reference.batch_stats)
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, reference.params, grads)
  state = jit_step(_state())
  state = jit_step(state)  # second call must not retrace (assert_max_traces)
  assert int(state.step) == 2
  once = jit_step(_state())
  chex.assert_trees_all_close(once.params, expected, rtol=1e-5, atol=1e-6)
  # BatchNorm running statistics moved away from their init (mean 0).
  assert not np.allclose(once.batch_stats["bn"]["mean"], 0.0)


def test_eval_mode_leaves_batch_stats_untouched():
  state = _state()
  x = jnp.ones((2, 4))
  _, stats = core.apply(state.graphdef, state.params, state.batch_stats, x, train=False)
  chex.assert_trees_all_equal(stats, state.batch_stats)


def test_arrays_round_trip():
  state = _state()
  arrays = jax.tree.map(lambda a: a + 1 if a.dtype != jnp.int32 else a, state.arrays())
  restored = state.with_arrays(arrays)
  chex.assert_trees_all_equal(restored.params, arrays["params"])
  assert restored.tx is state.tx and restored.graphdef is state.graphdef


def test_student_generator_state_round_trips_per_network():
  pair = StudentGeneratorState(_state(), _state().apply_gradients(
      jax.tree.map(jnp.ones_like, _PARTS.params)))
  arrays = pair.arrays()
  assert set(arrays) == {"student", "generator"} and int(arrays["generator"]["step"]) == 1
  restored = pair.with_arrays(jax.tree.map(jnp.copy, arrays))
  assert type(restored) is StudentGeneratorState and restored.student.tx is _TX
  chex.assert_trees_all_equal(restored.arrays(), arrays)
