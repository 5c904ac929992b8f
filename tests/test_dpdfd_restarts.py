"""dpkd_jax.methods.dpdfd.restarts: the generator-restart rule, and a run that restarts."""

import dataclasses
import json
import math
import os
import warnings

import chex
import jax
import numpy as np
import pytest
from dpdfd_fixtures import dpdfd_config

from resume_fixtures import assert_same_dpdfd_state, interrupted_dpdfd, resume_dpdfd

from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import restarts
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import checkpoint

RULE = restarts.RestartRule(ratio=1.5, patience=2, max_restarts=1)


def _feed(rule, means):
  state, fired = restarts.RestartState(), []
  for i, mean in enumerate(means):
    state, restart = restarts.observe(rule, state, mean, step=100 * (i + 1))
    fired.append(restart)
  return state, fired


def test_healthy_windows_never_restart():
  state, fired = _feed(RULE, [20.0, 6.0, 5.5, 7.0, 5.8, 8.0, 6.0])  # 8 < 1.5 * 5.5
  assert not any(fired) and state.best == 5.5 and state.restarts == 0
  assert [h[1] for h in state.history] == [20.0, 6.0, 5.5, 7.0, 5.8, 8.0, 6.0]


def test_the_grace_window_is_not_the_best():
  # A random generator's first window (here low) must not become the reference.
  state, fired = _feed(RULE, [1.0, 6.0, 6.5])
  assert not any(fired) and state.best == 6.0


def test_patience_high_windows_in_a_row_restart_once():
  state, fired = _feed(RULE, [9.0, 5.0, 8.0, 5.0, 8.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0])
  # 8.0 then 5.0 resets the strikes; 8.0, 9.0 restart; then a new grace window and a new
  # best (9.0), and max_restarts=1 stops any later restart.
  assert fired == [False, False, False, False, False, True] + [False] * 5
  assert state.restarts == 1 and state.best == 9.0
  assert [h[2] for h in state.history] == fired


def test_a_diverged_window_is_a_strike_never_the_best():
  state, fired = _feed(restarts.RestartRule(ratio=1.2, patience=1, max_restarts=3),
                       [5.0, 5.0, math.nan])
  assert fired == [False, False, True] and state.restarts == 1 and state.best == math.inf


def test_state_round_trips_through_json():
  state, _ = _feed(RULE, [9.0, 5.0, 8.0])
  again = restarts.RestartState.from_json(json.loads(json.dumps(state.to_json())))
  assert again == state
  assert restarts.RestartState.from_json(None) == restarts.RestartState()


@pytest.mark.parametrize("kw, match", [
    (dict(ratio=1.0, patience=1, max_restarts=1), "ratio"),
    (dict(ratio=math.inf, patience=1, max_restarts=1), "ratio"),
    (dict(ratio=2.0, patience=0, max_restarts=1), "patience"),
    (dict(ratio=2.0, patience=1, max_restarts=True), "max_restarts"),
])
def test_bad_rules_are_refused(kw, match):
  with pytest.raises(ValueError, match=match):
    restarts.RestartRule(**kw)


def test_restart_keys_are_distinct_from_the_init_keys():
  init = jax.random.key(7)
  used = [jax.random.split(init)[0], jax.random.split(init)[1], jax.random.fold_in(init, 2)]
  used += [restarts.restart_key(init, r) for r in (1, 2, 3)]
  raw = {tuple(np.asarray(jax.random.key_data(k)).ravel()) for k in used}
  assert len(raw) == len(used)


# ----------------------------------------------------------------------------- config


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=0.0, steps=6, batch_size=16, eval_every=2, latent_dim=8,
              generator_objective="disagreement", bound_method="clip", teacher_loss="logit",
              generator_channels=16, seed=3)
  base.update(kw)
  return dpdfd_config(**base)


def test_config_checks_the_rule(teacher_dir):
  with pytest.raises(ValueError, match="needs generator_objective='disagreement'"):
    _config(teacher_dir, generator_objective="paper", bound_method="normalize",
            generator_restart_ratio=1.5)
  with pytest.raises(ValueError, match="ratio"):
    _config(teacher_dir, generator_restart_ratio=0.5)
  assert _config(teacher_dir).engine.restart_rule is None
  assert _config(teacher_dir).to_json()["engine"]["generator_restart_ratio"] == 0.0
  on = _config(teacher_dir, generator_restart_ratio=1.5, generator_restart_patience=1)
  assert on.engine.restart_rule == restarts.RestartRule(ratio=1.5, patience=1, max_restarts=2)
  assert on.to_json()["engine"]["generator_restart_ratio"] == 1.5


# ----------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def restarted_run(teacher_dir, tmp_path_factory):
  """A run whose rule is forced to fire at step 4 (of 6, windows of 2)."""
  real = restarts.observe

  def fire_at_4(rule, state, window_mean, *, step):
    new, _ = real(rule, state, window_mean, step=step)
    if step != 4:
      return new, False
    return dataclasses.replace(restarts.RestartState(restarts=state.restarts + 1),
                               history=new.history[:-1] + ((4, window_mean, True),)), True

  root = tmp_path_factory.mktemp("restarts")
  with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
    patch.setattr(restarts, "observe", fire_at_4)
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    results = dpdfd.train_dpdfd(_config(teacher_dir, **RESTARTING), str(root / "restarting"),
                                progress=False)
  return results, str(root / "restarting")


RESTARTING = dict(noise_multiplier=2.0, generator_restart_ratio=1.5,
                  generator_restart_patience=1, generator_max_restarts=2)


def test_a_restart_replaces_the_generator_and_keeps_the_epsilon(teacher_dir, restarted_run):
  results, workdir = restarted_run
  # The same releases: charged what the plan of the same run with restarts off charges.
  plain = dpdfd.make_plan(_config(teacher_dir, noise_multiplier=2.0))
  assert dpdfd.make_plan(_config(teacher_dir, **RESTARTING)) == plain
  assert results["epsilon"] == pytest.approx(plain.sound_epsilon, rel=1e-12)
  saved = results["generator_restarts"]
  assert [h[0] for h in saved["history"]] == [2, 4, 6] and saved["restarts"] == 1
  assert [h[2] for h in saved["history"]] == [False, True, False]
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  assert meta["generator_restarts"] == saved
  # The generator is a fresh one since step 4: its own step count restarted there (the
  # student's did not).
  _, a, _ = dpdfd.load_run(workdir)
  assert (int(a.generator.step), int(a.student.step)) == (2, 6)
  with open(os.path.join(workdir, "metrics.csv")) as f:
    logged = f.read()  # long format: step,name,value
  assert ",train/window_disagreement," in logged and ",train/generator_restarts," in logged


def test_a_run_resumed_after_a_restart_is_bit_identical(restarted_run, teacher_dir, tmp_path):
  full, workdir = restarted_run
  config = _config(teacher_dir, **RESTARTING)
  resumed_dir = str(tmp_path / "resumed")
  _, meta = interrupted_dpdfd(config, workdir, 4, resumed_dir)
  assert meta["generator_restarts"]["restarts"] == 1
  resumed = resume_dpdfd(config, resumed_dir)
  assert resumed["generator_restarts"] == full["generator_restarts"]
  assert_same_dpdfd_state(resumed_dir, workdir)


def test_restart_generator_is_fresh_and_keeps_the_student(teacher_dir):
  config = _config(teacher_dir, generator_restart_ratio=1.5)
  state = dpdfd.init_state(config, jax.random.key(0))
  moved = jax.tree.map(lambda p: p + 1.0, state.generator.params)
  state = state.replace(generator=state.generator.replace(params=moved))
  new = dpdfd.restart_generator(config, state, restarts.restart_key(jax.random.key(0), 1))
  chex.assert_trees_all_equal(new.student.params, state.student.params)
  assert int(new.generator.step) == 0
  before, after = jax.tree.leaves(moved), jax.tree.leaves(new.generator.params)
  assert all(a.shape == b.shape for a, b in zip(before, after))
  assert not any(np.array_equal(a, b) for a, b in zip(before, after) if a.size > 1)


def test_restart_generator_is_the_generator_half_of_the_pair_init(teacher_dir):
  """The restarted runs on record drew their generator from `create_student_and_generator`'s
  fold 1: building the generator alone gives the same weights."""
  config = _config(teacher_dir, generator_restart_ratio=1.5)
  state = dpdfd.init_state(config, jax.random.key(0))
  key = restarts.restart_key(jax.random.key(0), 1)
  _, pair_generator = models.create_student_and_generator(config, key)
  new = dpdfd.restart_generator(config, state, key)
  chex.assert_trees_all_equal(new.generator.params, pair_generator.params)
