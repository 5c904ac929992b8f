"""dpkd_jax.methods.dpdfd.replay: the ring of released pairs, the step that replays it, a run."""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import replay
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train.state import TrainState
from resume_fixtures import assert_same_dpdfd_state, interrupted_dpdfd


def _rows(start, count):
  images = jnp.arange(start, start + count, dtype=jnp.float32).reshape(count, 1, 1, 1)
  return images, jnp.repeat(images.reshape(count, 1), 3, axis=1)


def test_the_ring_keeps_the_newest_rows_in_release_order():
  buffer = replay.ReplayBuffer.empty(5, (1, 1, 1), 3)
  for start in (0, 3, 6):  # 9 rows into 5 slots: rows 5..8 overwrite slots 0..3
    buffer = replay.write(buffer, *_rows(start, 3))
  assert int(buffer.written) == 9
  np.testing.assert_array_equal(buffer.images.ravel(), [5, 6, 7, 8, 4])
  np.testing.assert_array_equal(buffer.targets[:, 0], [5, 6, 7, 8, 4])
  held = replay.class_counts(replay.write(replay.ReplayBuffer.empty(5, (1, 1, 1), 3),
                                          *_rows(0, 2)))  # targets (0,0,0), (1,1,1)
  assert held == {"replay_rows_held_per_class": [2, 0, 0]}


def test_sampling_draws_only_written_rows_and_an_empty_buffer_weighs_nothing():
  buffer = replay.ReplayBuffer.empty(100, (1, 1, 1), 3)
  _, _, weight = replay.sample(buffer, jax.random.key(0), 8)
  assert float(weight) == 0.0
  buffer = replay.write(buffer, *_rows(10, 4))
  images, targets, weight = replay.sample(buffer, jax.random.key(1), 1000)
  assert float(weight) == 1.0
  assert set(np.unique(images)) == {10.0, 11.0, 12.0, 13.0}  # never the zero rows
  np.testing.assert_array_equal(targets[:, 1], images.ravel())


def test_class_balanced_sampling_draws_every_class_alike():
  # 90 rows of class 0, 10 of class 1, 0 of class 2, in a ring of 128 (28 slots unfilled).
  buffer = replay.ReplayBuffer.empty(128, (1, 1, 1), 3)
  targets = jnp.zeros((100, 3)).at[:90, 0].set(1.0).at[90:, 1].set(1.0)
  buffer = replay.write(buffer, jnp.arange(100.0).reshape(100, 1, 1, 1), targets)
  images, got, weight = replay.sample(buffer, jax.random.key(2), 20000,
                                      sampling="class_balanced")
  assert float(weight) == 1.0 and float(images.max()) < 100  # never an unfilled slot
  share = np.bincount(np.argmax(np.asarray(got), -1), minlength=3) / 20000
  np.testing.assert_allclose(share, [0.5, 0.5, 0.0], atol=0.02)
  uniform = replay.sample(buffer, jax.random.key(2), 20000)[1]
  assert np.mean(np.argmax(np.asarray(uniform), -1) == 1) < 0.15
  _, _, empty_weight = replay.sample(replay.ReplayBuffer.empty(8, (1, 1, 1), 3),
                                     jax.random.key(0), 4, sampling="class_balanced")
  assert float(empty_weight) == 0.0
  with pytest.raises(ValueError, match="sampling"):
    replay.sample(buffer, jax.random.key(0), 4, sampling="newest")


def _labelled(start, labels, num_classes=3):
  """Rows valued start, start+1, ... whose targets name `labels` (one-hot)."""
  images = jnp.arange(start, start + len(labels), dtype=jnp.float32).reshape(-1, 1, 1, 1)
  return images, jax.nn.one_hot(jnp.asarray(labels), num_classes)


def test_the_per_class_memory_keeps_a_class_the_generator_left():
  buffer = replay.ReplayBuffer.empty(12, (1, 1, 1), 3, memory="per_class")  # 4 rows a class
  buffer = replay.write(buffer, *_labelled(0, [2, 0, 2]))
  for start in (10, 20, 30):  # then only class 0: 9 more rows into its ring of 4
    buffer = replay.write(buffer, *_labelled(start, [0, 0, 0]))
  np.testing.assert_array_equal(buffer.class_written, [10, 0, 2])
  assert int(buffer.written) == 12
  # Class 0's ring holds its newest 4 (rows 30, 31, 32 after 22 at slot 1); class 2 keeps both.
  np.testing.assert_array_equal(sorted(buffer.images[:4].ravel()), [22, 30, 31, 32])
  np.testing.assert_array_equal(buffer.images[8:10].ravel(), [0, 2])
  assert set(buffer.arrays()) == {"images", "targets", "written", "class_written"}
  assert replay.class_counts(buffer) == {"replay_rows_held_per_class": [4, 0, 2],
                                         "replay_rows_written_per_class": [10, 0, 2]}
  ring = replay.ReplayBuffer.empty(12, (1, 1, 1), 3)  # a ring keeps the layout it had
  assert set(ring.arrays()) == {"images", "targets", "written"}
  assert ring.with_arrays(ring.arrays()).class_written is None
  with pytest.raises(ValueError, match="memory"):
    replay.ReplayBuffer.empty(12, (1, 1, 1), 3, memory="fifo")


def test_per_class_sampling_draws_filled_rows_by_row_or_by_class():
  buffer = replay.ReplayBuffer.empty(300, (1, 1, 1), 3, memory="per_class")  # 100 a class
  _, _, empty_weight = replay.sample(buffer, jax.random.key(0), 4, sampling="class_balanced")
  assert float(empty_weight) == 0.0
  buffer = replay.write(buffer, *_labelled(0, [0] * 90 + [2] * 10))
  for sampling, expected in (("uniform", [0.9, 0.0, 0.1]), ("class_balanced", [0.5, 0.0, 0.5])):
    images, targets, weight = replay.sample(buffer, jax.random.key(3), 20000, sampling=sampling)
    assert float(weight) == 1.0 and float(images.max()) < 100  # never an unfilled slot
    share = np.bincount(np.argmax(np.asarray(targets), -1), minlength=3) / 20000
    np.testing.assert_allclose(share, expected, atol=0.02)
    # Within a class every filled row alike: class 2's ten rows 90..99.
    rows = np.asarray(images).ravel()[np.argmax(np.asarray(targets), -1) == 2]
    assert set(np.unique(rows)) == set(range(90, 100))


def test_the_replay_key_is_none_of_the_step_keys():
  key = jax.random.key(11)
  keys = list(jax.random.split(key, 3)) + [jax.random.fold_in(key, 3)]
  raw = {tuple(np.asarray(jax.random.key_data(k)).ravel()) for k in keys}
  assert len(raw) == 4


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              student_norm="group", noise_multiplier=0.0, steps=6, batch_size=8, eval_every=2,
              latent_dim=8, generator_objective="disagreement", bound_method="clip",
              teacher_loss="logit", generator_channels=16, seed=3)
  base.update(kw)
  return dpdfd_config(**base)


def test_config_checks_replay(teacher_dir):
  with pytest.raises(ValueError, match="replay_size must be 0 or >= batch_size"):
    _config(teacher_dir, replay_size=4)
  with pytest.raises(ValueError, match="replay_batch needs replay_size"):
    _config(teacher_dir, replay_batch=4)
  assert _config(teacher_dir).replay_rows == 0
  assert _config(teacher_dir, replay_size=64).replay_rows == 8
  assert _config(teacher_dir, replay_size=64, replay_batch=5).replay_rows == 5
  assert _config(teacher_dir).to_json()["engine"]["replay_size"] == 0
  with pytest.raises(ValueError, match="replay_sampling needs replay_size"):
    _config(teacher_dir, replay_sampling="class_balanced")
  with pytest.raises(ValueError, match="replay_sampling"):
    _config(teacher_dir, replay_size=64, replay_sampling="newest")
  with pytest.raises(ValueError, match="replay_memory"):
    _config(teacher_dir, replay_size=64, replay_memory="fifo")
  with pytest.raises(ValueError, match="replay_size must be >= 80"):
    _config(teacher_dir, replay_size=64, replay_memory="per_class")  # 6 rows a class < B = 8
  assert _config(teacher_dir, replay_size=80, replay_memory="per_class").to_json()["engine"][
      "replay_memory"] == "per_class"
  assert _config(teacher_dir, replay_size=64).to_json()["engine"]["replay_memory"] == "ring"


def test_an_empty_buffer_changes_nothing_then_the_step_writes_its_batch(teacher_dir):
  """With a GroupNorm student (no batch statistics across rows) the first step, whose buffer
  is empty, equals the step without replay; afterwards the buffer holds that step's pairs.
  The paper's generator objective: the disagreement's forward differences would magnify the
  two programs' float rounding (which depends on how XLA fuses each) in the generator."""
  plain = _config(teacher_dir, generator_objective="paper")
  replaying = _config(teacher_dir, generator_objective="paper", replay_size=32)
  ensemble, _ = dpdfd.load_teachers(plain)
  student, generator = models.create_student_and_generator(plain, jax.random.key(0))
  state = step_lib.DPDFDState(TrainState.create(student, optax.sgd(0.1)),
                              TrainState.create(generator, optax.sgd(0.1)))
  with_buffer = state.replace(replay=replay.ReplayBuffer.empty(32, (28, 28, 1), 10))
  key = jax.random.key(5)
  args = (ensemble.params, ensemble.batch_stats, key)
  # Jitted (not donated): compiling the whole step is faster than running it op by op.
  a, ma = jax.jit(dpdfd.build_train_step(dpdfd.make_plan(plain), plain, ensemble.graphdef))(
      state, *args)
  replaying_step = jax.jit(dpdfd.build_train_step(dpdfd.make_plan(replaying), replaying,
                                                  ensemble.graphdef))  # compiled once, run twice
  b, mb = replaying_step(with_buffer, *args)
  chex.assert_trees_all_close(a.student.params, b.student.params, atol=1e-6)
  chex.assert_trees_all_close(a.generator.params, b.generator.params, atol=1e-6)
  assert float(ma["student_loss"]) == pytest.approx(float(mb["student_loss"]), rel=1e-6)
  assert int(b.replay.written) == 8 and float(jnp.abs(b.replay.images[:8]).sum()) > 0
  assert float(jnp.abs(b.replay.images[8:]).sum()) == 0
  # The second step replays the first step's rows: its replay loss is theirs, not zero rows'.
  _, m2 = replaying_step(b, ensemble.params, ensemble.batch_stats, jax.random.key(6))
  assert float(m2["replay_loss"]) > 0


def test_a_replaying_run_keeps_its_epsilon_checkpoints_the_buffer_and_resumes(teacher_dir,
                                                                             tmp_path):
  kw = dict(noise_multiplier=2.0, steps=4)  # checkpoints at 2 and 4 (two are kept)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    # The per-class memory with class-balanced draws: its checkpoint adds the class counts.
    config = _config(teacher_dir, replay_size=80, replay_batch=4, replay_memory="per_class",
                     replay_sampling="class_balanced", **kw)
    workdir = str(tmp_path / "replay")
    full = dpdfd.train_dpdfd(config, workdir, progress=False)
    # Replay costs nothing: the ledger charged what the plan of the same run without replay
    # charges (a run is charged its plan's events, test_dpdfd_run).
    plain = dpdfd.make_plan(_config(teacher_dir, **kw))
    assert full["epsilon"] == pytest.approx(plain.sound_epsilon, rel=1e-12)
    assert dpdfd.make_plan(config) == plain
    resumed_dir = str(tmp_path / "resumed")
    arrays, _ = interrupted_dpdfd(config, workdir, 2, resumed_dir)
    assert int(arrays["replay"]["written"]) == 16 == int(arrays["replay"]["class_written"].sum())
    resumed = dpdfd.train_dpdfd(config, resumed_dir, resume=True, progress=False)
  assert resumed["test_accuracy"] == full["test_accuracy"]
  assert_same_dpdfd_state(resumed_dir, workdir)
  # The results say which classes the generator made: 4 steps of 8 rows, all held.
  assert sum(full["replay_rows_written_per_class"]) == 32
  assert full["replay_rows_held_per_class"] == full["replay_rows_written_per_class"]
