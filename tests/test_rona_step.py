"""RONA steps: the student learns only from sanitized teacher knowledge, with σ and B taken
from the plan; the adaptive bound; self learning; BatchNorm re-estimation.

Teachers, auxiliary teacher and student are all compact_5k (hint (7, 7, 16), so a 1×1-conv
adapter; one architecture keeps XLA's initialiser compilations to one set). Reference steps
are written out here with plain SGD (Adam's first step is a sign and would hide gradient
differences). One-device mesh (the 8-device path is exercised end to end in
test_rona_run.py). Tolerances: the same float32 computations in another jit agree to 1e-6
(atol).
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax import losses
from dpkd_jax.methods import rona
from dpkd_jax.methods.rona import sanitize
from dpkd_jax.methods.rona import step
from dpkd_jax.methods.rona import student
from dpkd_jax.models import compact
from dpkd_jax.models import core
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

INFO = data.DATASETS["digits"]
TEMPERATURE = 4.0
NUM_ROWS, NUM_REAL = 16, 13
MESH = sharding.data_mesh(jax.devices()[:1])
SGD = optax.sgd(0.1)


def _teacher(seed):
  parts = core.split(compact.compact_5k(num_classes=10, input_shape=(28, 28, 1),
                                        rngs=nnx.Rngs(seed)))
  return parts.graphdef, step.FrozenModel(parts.params, parts.batch_stats)


@pytest.fixture(scope="module")
def setup():
  graphdef, teacher = _teacher(0)
  _, other_teacher = _teacher(1)
  _, aux = _teacher(2)
  bare = compact.compact_5k(num_classes=10, input_shape=(28, 28, 1), rngs=nnx.Rngs(3))
  hinted = core.split(student.create_hinted_student(
      bare, input_shape=(28, 28, 1), teacher_hint_shape=(7, 7, 16), rngs=nnx.Rngs(4)))
  train = data.load("digits", "train")
  batch = (train.images[:NUM_ROWS], np.arange(NUM_ROWS) < NUM_REAL)
  return dict(graphdef=graphdef, teacher=teacher, other_teacher=other_teacher, aux=aux,
              hinted=hinted, batch=batch, labels=train.labels[:NUM_ROWS])


def _state(setup):
  # Fresh copies (jnp.array copies): the steps donate the state.
  params, batch_stats = jax.tree.map(jnp.array, (setup["hinted"].params,
                                                 setup["hinted"].batch_stats))
  return TrainState.create(core.ModelParts(setup["hinted"].graphdef, params, batch_stats), SGD)


def _plan(config):
  """A plan executing `config`'s σ and bound (the step reads nothing else of it)."""
  return rona.RONAPlan(
      releases=1, queries_per_epoch=1, noise_multiplier=config.noise_multiplier,
      bound_mode=config.bound_mode, hint_l2_clip_norm=config.l2_bound,
      distill_l2_clip_norm=config.l2_bound, delta=1e-5, budget_epsilon=None,
      sound_epsilon=math.inf)


def _step(setup, kind, config):
  return step.make_train_step(_plan(config), kind, temperature=TEMPERATURE, info=INFO,
                              teacher_graphdef=setup["graphdef"],
                              aux_graphdef=setup["graphdef"], mesh=MESH)


def _knowledge(setup, model, kind):
  """Masked teacher knowledge computed directly (hint or softened probabilities)."""
  images, mask = setup["batch"]
  out, _ = core.apply(setup["graphdef"], model.params, model.batch_stats,
                      data.normalize(jnp.asarray(images), INFO), train=False)
  value = out.hint if kind == "hint" else jax.nn.softmax(out.logits / TEMPERATURE)
  return value * mask.reshape((-1,) + (1,) * (value.ndim - 1))


@jax.jit
def _reference_update(state, images, mask, target, kd_teacher_logits):
  """One SGD step on the masked hint loss (target given) or Hinton's KD-KL (logits given)."""
  x = data.normalize(images, INFO)

  def loss_fn(params):
    out, stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
    if kd_teacher_logits is None:
      per_example = losses.hint_l2(out.hint, target)
    else:
      per_example = losses.kd_kl(out.logits, kd_teacher_logits, temperature=TEMPERATURE)
    return jnp.sum(per_example * mask) / jnp.sum(mask), stats

  (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  return state.apply_gradients(grads, stats)


def _run(setup, kind, config, *, teacher="teacher", aux="aux", bound=None, seed=0):
  images, mask = setup["batch"]
  train_step = _step(setup, kind, config)
  return train_step(_state(setup), setup[teacher], setup[aux],
                    bound or sanitize.BoundState.zeros(), images, mask, jax.random.key(seed))


def test_distill_step_without_noise_or_bound_is_hinton_kd(setup):
  config = sanitize.SanitizeConfig(noise_multiplier=0.0, bound_mode="fixed", l2_bound=1e6)
  state, _, _ = _run(setup, "distill", config)
  images, mask = setup["batch"]
  teacher_logits = core.apply(setup["graphdef"], setup["teacher"].params,
                              setup["teacher"].batch_stats,
                              data.normalize(jnp.asarray(images), INFO), train=False)[0].logits
  # Soft CE to the target and KL differ by the target entropy, a constant: same gradient.
  expected = _reference_update(_state(setup), images, mask, None, teacher_logits)
  chex.assert_trees_all_close(state.params, expected.params, atol=1e-6)


def test_hint_step_learns_exactly_from_the_sanitized_release(setup):
  config = sanitize.SanitizeConfig(noise_multiplier=1.0)
  state, _, metrics = _run(setup, "hint", config, seed=7)
  noisy, _, l2_bound, noise_stddev = sanitize.release_knowledge(
      config, jax.random.key(7), _knowledge(setup, setup["teacher"], "hint"),
      _knowledge(setup, setup["aux"], "hint"), sanitize.BoundState.zeros())
  images, mask = setup["batch"]
  expected = _reference_update(_state(setup), images, mask, noisy, None)
  chex.assert_trees_all_close(state.params, expected.params, atol=1e-6)
  np.testing.assert_allclose(metrics["l2_bound"], l2_bound, rtol=1e-6)
  np.testing.assert_allclose(metrics["noise_stddev"], noise_stddev, rtol=1e-6)
  # The noise is really there: the clean-target update is different.
  clean = _reference_update(_state(setup), images, mask,
                            _knowledge(setup, setup["teacher"], "hint"), None)
  assert not np.allclose(state.params["adapter"]["layer"]["kernel"],
                         clean.params["adapter"]["layer"]["kernel"], atol=1e-3)
  chex.assert_trees_all_close(state.batch_stats, expected.batch_stats, atol=1e-6)
  assert not np.allclose(state.batch_stats["student"]["conv1"]["norm"]["mean"],
                         setup["hinted"].batch_stats["student"]["conv1"]["norm"]["mean"])
  # The adapted student hint and the teacher hint have one shape: a 1×1 convolution.
  assert state.params["adapter"]["layer"]["kernel"].shape == (1, 1, 16, 16)


def test_adaptive_bound_is_the_running_mean_of_aux_norms_only(setup):
  config = sanitize.SanitizeConfig(noise_multiplier=1.0)
  aux_norm = float(jnp.linalg.norm(_knowledge(setup, setup["aux"], "hint")))
  _, bound, metrics = _run(setup, "hint", config)
  np.testing.assert_allclose(metrics["l2_bound"], aux_norm, rtol=1e-5)
  # Another teacher, same auxiliary teacher: the very same bound.
  _, bound_other, metrics_other = _run(setup, "hint", config, teacher="other_teacher")
  assert float(metrics_other["l2_bound"]) == float(metrics["l2_bound"])
  chex.assert_trees_all_equal(bound_other, bound)
  # Another auxiliary teacher: another bound.
  _, _, metrics_swapped = _run(setup, "hint", config, aux="other_teacher")
  assert float(metrics_swapped["l2_bound"]) != float(metrics["l2_bound"])
  # Running mean: a second batch with a previous norm of 10 gives (10 + ||aux||) / 2.
  previous = sanitize.BoundState(jnp.float32(10.0), jnp.float32(1.0))
  _, bound2, metrics2 = _run(setup, "hint", config, bound=previous)
  np.testing.assert_allclose(metrics2["l2_bound"], (10.0 + aux_norm) / 2, rtol=1e-5)
  np.testing.assert_allclose(bound2.count, 2.0)


def test_batch_stats_step_moves_only_the_running_statistics(setup):
  images, _ = setup["batch"]
  state = step.make_batch_stats_step(INFO, MESH)(_state(setup), images)
  chex.assert_trees_all_equal(state.params, setup["hinted"].params)
  chex.assert_trees_all_equal(state.opt_state, SGD.init(setup["hinted"].params))
  # BatchNorm momentum 0.9: running mean <- 0.9 * 0 + 0.1 * (batch mean of conv1's output).
  x = data.normalize(jnp.asarray(images), INFO)
  student = setup["hinted"].params["student"]["conv1"]["conv"]
  pre_norm = jax.lax.conv_general_dilated(x, student["kernel"], (1, 1), "SAME",
                                          dimension_numbers=("NHWC", "HWIO", "NHWC"))
  np.testing.assert_allclose(state.batch_stats["student"]["conv1"]["norm"]["mean"],
                             0.1 * jnp.mean(pre_norm, axis=(0, 1, 2)), atol=1e-5)


def test_self_learning_step_is_cross_entropy_on_public_labels(setup):
  images, _ = setup["batch"]
  labels = setup["labels"]
  state, metrics = step.make_self_learning_step(INFO, MESH)(_state(setup), images, labels)

  @jax.jit
  def reference(state):
    def loss_fn(params):
      out, stats = core.apply(state.graphdef, params, state.batch_stats,
                              data.normalize(jnp.asarray(images), INFO), train=True)
      return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean(), stats
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads, stats), loss

  expected, loss = reference(_state(setup))
  chex.assert_trees_all_close(state.params, expected.params, atol=1e-6)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)




def test_augmented_self_learning_step_is_the_same_step_on_shifted_images(setup):
  images, _ = setup["batch"]
  labels, key = setup["labels"], jax.random.key(5)
  state, _ = step.make_self_learning_step(INFO, MESH, True)(_state(setup), images, labels, key)
  shifted = data.augment(key, jnp.asarray(images), pad=2, flip=False, pad_mode="constant")
  assert not np.array_equal(np.asarray(shifted), np.asarray(images))
  expected, _ = step.make_self_learning_step(INFO, MESH)(_state(setup), shifted, labels)
  chex.assert_trees_all_close(state.params, expected.params, atol=1e-6)
