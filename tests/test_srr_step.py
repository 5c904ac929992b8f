"""SRR steps: generator pretraining and fine-tuning steps, and the stage step bound to a plan
(each query asked once, its labels reused by every epoch)."""

import dataclasses
import math

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
from dpkd_jax.privacy import randomized_response
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState

from teacher_fixtures import CountingTeacher

_SHAPE = (28, 28, 1)


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


# The shift and the query pool are separate branches of the stage (the student's view, stage
# 2's draw): one case runs both (they were two cases, each one compile of the stage).
@pytest.mark.parametrize("student_loss,student_shift,query_pool",
                         [("kl", 0, 1), ("rr_likelihood", 2, 3)])
def test_stage_loop_asks_each_query_once_and_reuses_the_labels(student_loss, student_shift,
                                                               query_pool):
  # The e2e run's sizes and schedules, so that the compiled steps are shared with it. With a
  # query pool (`srr.selection`) stage 2 draws 3 N latents and still asks about N of them.
  config = srr.SRRConfig(
      dataset="digits", teacher_dir="unused", epsilon=1.0, student_model="lenet5",
      generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16, stages=2,
      samples_per_stage=32, batch_size=16, student_epochs=2, generator_epochs=2,
      generator_prior="none", engine=srr.EngineOptions(
          student_loss=student_loss, student_shift=student_shift, query_pool=query_pool))
  mesh = sharding.data_mesh()
  state = sharding.replicate(srr.init_state(config, jax.random.key(0), stages=2), mesh)
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


def _two_stages(student_replay):
  """Two stages of the e2e run's sizes; returns (final state, stage results, stage 0's student
  parameters as host copies (stage 1 donates the state), teacher)."""
  config = srr.SRRConfig(
      dataset="digits", teacher_dir="unused", epsilon=1.0, student_model="lenet5",
      generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16, stages=2,
      samples_per_stage=32, batch_size=16, student_epochs=2, generator_epochs=2,
      generator_prior="none",
      engine=srr.EngineOptions(student_loss="rr_likelihood", student_replay=student_replay))
  mesh = sharding.data_mesh()
  state = sharding.replicate(srr.init_state(config, jax.random.key(0), stages=2), mesh)
  teacher = CountingTeacher(lambda queries: jnp.arange(queries.shape[0], dtype=jnp.int32) % 10)
  train_step = srr.build_train_step(srr.make_plan(config), config, teacher, mesh=mesh)
  results, first_student = [], None
  for stage in range(2):
    results.append(train_step(state, jax.random.key(stage), stage))
    state = results[-1].state
    if stage == 0:
      first_student = jax.tree.map(np.asarray, state.student.params)
  return state, results, first_student, teacher


def test_replay_keeps_every_release_and_trains_on_them_without_asking_again():
  state, results, first_student, teacher = _two_stages(student_replay=True)
  assert teacher.calls == 2 and teacher.rows == [32, 32]  # replay asks the teacher nothing
  released = state.released
  chex.assert_shape(released.queries, (64, 28, 28, 1))
  for stage, result in enumerate(results):  # stage t's release sits in rows [32 t, 32 t + 32)
    np.testing.assert_array_equal(released.labels[32 * stage:32 * (stage + 1)],
                                  result.noisy_labels)
    np.testing.assert_array_equal(released.candidate_mask[32 * stage:32 * (stage + 1)].sum(-1),
                                  result.set_sizes)
  assert int(state.student.step) == 2 * 2 * 2  # the same student steps as without replay
  plain, _, plain_first_student, _ = _two_stages(student_replay=False)
  assert plain.released is None and "released" not in plain.arrays()
  # Stage 0 has nothing to replay (the same student); stage 1 also reads stage 0's rows.
  chex.assert_trees_all_equal(first_student, plain_first_student)
  assert not np.allclose(jax.tree.leaves(state.student.params)[0],
                         jax.tree.leaves(plain.student.params)[0])
  restored = jax.tree.map(jnp.zeros_like, state).with_arrays(state.arrays())  # checkpoint form
  chex.assert_trees_all_equal(restored.released, released)


def test_replay_flag_is_left_out_of_saved_configs_at_its_default():
  base = dict(dataset="digits", teacher_dir="t", epsilon=1.0)
  assert srr.SRRConfig(**base).to_json()["engine"]["student_replay"] is False  # as migrated
  saved = srr.SRRConfig(**base, engine=srr.EngineOptions(student_replay=True)).to_json()
  assert saved["engine"]["student_replay"] is True
  assert srr.SRRConfig.from_json(saved).engine.student_replay
  with pytest.raises(ValueError, match="student_replay"):
    srr.EngineOptions(student_replay="yes")


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
  student_first = dataclasses.replace(config, generator_terms=("ce",), first_prior="student")
  assert not step_lib.stage_config(plan, student_first, first=True).uniform_prior


def _channel_reference(logits, labels, mask, epsilon):
  """-mean log sum_y p_y T(y, y~), T written out entry by entry (numpy)."""
  p = np.asarray(jax.nn.softmax(logits))
  out = []
  for row in range(p.shape[0]):
    members = np.flatnonzero(mask[row])
    k, e = len(members), math.exp(epsilon)
    q = 0.0
    for y in range(p.shape[1]):
      if y in members:
        q += p[row, y] * ((e if y == labels[row] else 1.0) / (e + k - 1))
      else:
        q += p[row, y] / k
    out.append(-math.log(q))
  return float(np.mean(out))


@pytest.mark.parametrize("epsilon", [0.01, 0.5, 3.0, 20.0])
def test_rr_likelihood_loss_is_the_released_labels_likelihood(epsilon):
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
  mask = np.zeros((6, 5), bool)
  for row, size in enumerate([2, 3, 5, 2, 4, 5]):
    mask[row, rng.choice(5, size, replace=False)] = True
  labels = np.array([rng.choice(np.flatnonzero(m)) for m in mask], np.int32)  # members of C
  # Jitted (ε static, as the stage step binds it): eagerly, each op compiled on its own.
  loss = jax.jit(step_lib.rr_likelihood_loss, static_argnums=3)
  got = loss(logits, jnp.asarray(labels), jnp.asarray(mask), epsilon)
  np.testing.assert_allclose(float(got), _channel_reference(logits, labels, mask, epsilon),
                             rtol=1e-5)


@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_rr_likelihood_loss_uses_the_mechanisms_keep_probability(epsilon):
  # A student sure of the released label y~ explains it by T(y~, y~), the mechanism's own
  # keep probability; sure of another member, by keep * e^-eps.
  mask = jnp.zeros((2, 10), bool).at[:, jnp.array([1, 4, 6])].set(True)  # k = 3
  sure = jnp.full((2, 10), -60.0).at[0, 4].set(60.0).at[1, 6].set(60.0)
  keep = float(randomized_response.keep_probability(epsilon, 3))
  for row, expected in ((0, keep), (1, keep * math.exp(-epsilon))):
    got = step_lib.rr_likelihood_loss(sure[row:row + 1], jnp.array([4]), mask[row:row + 1],
                                      epsilon)
    np.testing.assert_allclose(float(got), -math.log(expected), rtol=1e-5)


def test_rr_likelihood_loss_without_noise_and_with_the_full_set_is_the_cross_entropy():
  # eps = inf and C = all classes: the channel is the identity, the loss the plain CE.
  logits = jax.random.normal(jax.random.key(1), (4, 10))
  labels = jnp.array([0, 3, 9, 5], jnp.int32)
  got = step_lib.rr_likelihood_loss(logits, labels, jnp.ones((4, 10), bool), math.inf)
  np.testing.assert_allclose(float(got), float(step_lib.student_kl_loss(logits, labels)),
                             rtol=1e-5)
  # eps = inf, C = {label, other}: a student sure of a class outside C still explains y~ by 1/k.
  mask = jnp.zeros((1, 10), bool).at[0, jnp.array([0, 1])].set(True)
  sure_outside = jnp.full((1, 10), -30.0).at[0, 7].set(30.0)
  got = step_lib.rr_likelihood_loss(sure_outside, jnp.array([0]), mask, math.inf)
  np.testing.assert_allclose(float(got), math.log(2.0), rtol=1e-4)


@pytest.mark.parametrize("loss", ["kl", "rr_likelihood"])
def test_student_step_shift_is_keyed_and_deterministic(teacher, loss):
  step = step_lib.make_student_step(loss, 1.0, 2)
  assert step_lib.make_student_step(loss, 1.0, 2) is step  # cached
  x = jax.random.normal(jax.random.key(3), (8, 28, 28, 1))
  labels = jnp.arange(8, dtype=jnp.int32) % 10
  mask = jnp.ones((8, 10), bool)
  params = []
  for key in (jax.random.key(0), jax.random.key(0), jax.random.key(1)):
    state = TrainState.create(jax.tree.map(jnp.copy, teacher), step_lib.adam(1e-2))
    state, metrics = step(state, x, labels, mask, key)
    assert np.isfinite(float(metrics["student_loss"]))
    params.append(state.params)
  chex.assert_trees_all_equal(params[0], params[1])  # same key: same shifts
  with pytest.raises(AssertionError):
    chex.assert_trees_all_equal(params[0], params[2])  # another key moves the queries


def test_the_student_schedule_is_cosine_over_all_stages_or_constant():
  base = dict(dataset="digits", teacher_dir="t", epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, stages=3, samples_per_stage=32, batch_size=16,
              student_epochs=2)
  cosine = srr.init_state(srr.SRRConfig(**base), jax.random.key(0), stages=3)
  assert cosine.student.tx is step_lib.adam(1e-3, 3 * 2 * 2)  # decays to 0 at the last step
  constant_config = srr.SRRConfig(**base, engine=srr.EngineOptions(student_schedule="constant"))
  constant = srr.init_state(constant_config, jax.random.key(0), stages=3)
  assert constant.student.tx is step_lib.adam(1e-3, None)
  assert srr.SRRConfig(**base).to_json()["engine"]["student_schedule"] == "cosine"
  assert srr.SRRConfig.from_json(constant_config.to_json()).engine.student_schedule == "constant"
  with pytest.raises(ValueError, match="student_schedule"):
    srr.EngineOptions(student_schedule="linear")
