"""SRR steps: generator pretraining and fine-tuning steps, and the stage step bound to a plan
(each query asked once, its labels reused by every epoch)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import models
from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import generator as generator_lib
from dpkd_jax.methods.srr import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

_SHAPE = (28, 28, 1)


class CountingTeacher:
  """Wraps a teacher label function and counts its calls and labelled rows."""

  def __init__(self, label_fn):
    self.label_fn, self.calls, self.rows = label_fn, 0, []

  def __call__(self, queries):
    self.calls += 1
    self.rows.append(int(queries.shape[0]))
    return self.label_fn(queries)


@pytest.fixture(scope="module")
def teacher():
  """A randomly initialised LeNet-5 with BatchNorm (running stats 0 / 1: far from any batch)."""
  return core.split(models.create_classifier("lenet5", num_classes=10, input_shape=_SHAPE, seed=0))


@pytest.fixture(scope="module")
def generator():
  return core.split(models.create_generator("dafl", latent_dim=8, image_shape=_SHAPE,
                                            rngs=nnx.Rngs(jax.random.key(2)), base_channels=8))


def test_pretrain_steps_lower_the_loss_and_are_deterministic(teacher, generator):
  config = generator_lib.PretrainConfig(batch_size=16, latent_dim=8, steps=25,
                                        learning_rate=1e-2)
  step = step_lib.make_pretrain_step(config, teacher.graphdef)
  assert step_lib.make_pretrain_step(config, teacher.graphdef) is step  # cached
  finals = []
  for _ in range(2):
    state = TrainState.create(jax.tree.map(jnp.copy, generator), step_lib.adam(1e-2))
    losses_seen = []
    for i in range(config.steps):
      state, metrics = step(state, teacher.params, teacher.batch_stats,
                            jax.random.fold_in(jax.random.key(4), i))
      losses_seen.append(float(metrics["loss"]))
    finals.append(state.params)
  assert np.mean(losses_seen[-5:]) < np.mean(losses_seen[:5])
  chex.assert_trees_all_equal(finals[0], finals[1])


def test_finetune_step_fits_the_labels_without_touching_the_student(teacher, generator):
  student = teacher  # any classifier serves as the frozen student here
  step = step_lib.make_finetune_step(student.graphdef)
  state = TrainState.create(jax.tree.map(jnp.copy, generator), step_lib.adam(1e-2))
  z = jax.random.normal(jax.random.key(6), (16, 8))
  labels = jnp.arange(16, dtype=jnp.int32) % 10
  frozen = jax.tree.map(jnp.copy, student.params)
  seen = []
  for _ in range(15):
    state, metrics = step(state, student.params, student.batch_stats, z, labels)
    seen.append(float(metrics["generator_loss"]))
  assert seen[-1] < seen[0]
  chex.assert_trees_all_equal(student.params, frozen)


def test_stage_loop_asks_each_query_once_and_reuses_the_labels():
  # The e2e run's sizes and schedules, so that the compiled steps are shared with it.
  config = srr.SRRConfig(
      dataset="digits", teacher_dir="unused", epsilon=1.0, student_model="lenet5",
      generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16, stages=2,
      samples_per_stage=32, batch_size=16, student_epochs=2, generator_epochs=2,
      generator_prior="none")
  mesh = sharding.data_mesh()
  student, generator = srr.init_models(config, jax.random.key(0))
  state = sharding.replicate(srr.init_state(config, student, generator, stages=2), mesh)
  teacher = CountingTeacher(lambda queries: jnp.arange(queries.shape[0], dtype=jnp.int32) % 10)
  train_step = srr.build_train_step(srr.make_plan(config), config, teacher, mesh=mesh)
  for stage in range(2):
    result = train_step(state, jax.random.key(stage), stage)
    state = result.state
    chex.assert_shape([result.noisy_labels, result.set_sizes], (32,))
    if stage == 0:  # the untrained student's prior is replaced by the uniform one: K-ary RR
      np.testing.assert_array_equal(result.set_sizes, 10)
  assert teacher.calls == 2 and teacher.rows == [32, 32]  # once per query, per stage
  steps_per_epoch = 32 // 16
  assert int(state.student.step) == 2 * 2 * steps_per_epoch  # 2 epochs on the same labels
  assert int(state.generator.step) == 2 * 2 * steps_per_epoch
  assert np.isfinite(result.metrics["student_loss"])


def test_stage_config_takes_epsilon_from_the_plan_and_the_rest_from_the_config():
  config = srr.SRRConfig(dataset="digits", teacher_dir="t", epsilon=None, target_epsilon=50.0,
                         stages=2, samples_per_stage=32, batch_size=16, threshold=0.3,
                         student_epochs=3, generator_epochs=0, generator_prior="none")
  plan = srr.make_plan(config)
  first = step_lib.stage_config(plan, config, first=True)
  later = step_lib.stage_config(plan, config, first=False)
  assert first.epsilon == later.epsilon == plan.epsilon_per_query  # calibrated, not a default
  assert (first.samples, first.batch_size, first.threshold, first.student_epochs,
          first.generator_epochs) == (32, 16, 0.3, 3, 0)
  assert first.uniform_prior and not later.uniform_prior
  student_first = srr.SRRConfig(**{**config.to_json(), "generator_terms": ("ce",),
                                   "first_prior": "student"})
  assert not step_lib.stage_config(plan, student_first, first=True).uniform_prior
