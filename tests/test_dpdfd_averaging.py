"""DPDFD runs whose student keeps an average of its iterates (`param_averaging_decay`): the
average is evaluated, recorded and released; the iterates, the noise and ε are those of the
same run without it. The wrapper alone is tested in test_averaging.py.

Its own module: an averaged student has another optimizer state, so another compiled step.
"""

import dataclasses
import os
import warnings

import chex
import jax
import pytest
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import data
from dpkd_jax.methods import dpdfd
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.release import students
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib

DECAY = 0.5  # a short run: the average must differ visibly from the last iterate


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8,
              seed=3)
  return dpdfd_config(**{**base, **kw})


def _student_arrays(config, workdir):
  """The student's checkpointed arrays (params, batch_stats, opt_state) of the newest step."""
  template = dpdfd.init_state(config, jax.random.key(0)).arrays()
  arrays, _ = checkpoint.restore(os.path.join(workdir, "checkpoints"), template)
  return arrays["student"]


@pytest.fixture(scope="module")
def runs(teacher_dir, tmp_path_factory):
  """The same seeded run without and with averaging."""
  configs = {"plain": _config(teacher_dir),
             "averaged": _config(teacher_dir, param_averaging_decay=DECAY)}
  out = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    for name, config in configs.items():
      workdir = str(tmp_path_factory.mktemp(name))
      out[name] = (config, workdir, dpdfd.train_dpdfd(config, workdir, progress=False))
  return out


def test_averaging_changes_neither_the_iterates_nor_epsilon(runs):
  (plain_config, plain_dir, plain), (config, workdir, averaged) = runs["plain"], runs["averaged"]
  # Two programs (the averaging one has the EMA beside the update): the same iterates up to
  # float rounding, which depends on how XLA fuses each program (tests/conftest.py's codegen).
  chex.assert_trees_all_close(_student_arrays(config, workdir)["params"],
                              _student_arrays(plain_config, plain_dir)["params"], rtol=1e-5,
                              atol=1e-7)
  assert averaged["epsilon"] == plain["epsilon"]
  assert averaged["noise_multiplier"] == plain["noise_multiplier"]


def test_the_average_is_evaluated_logged_and_released(runs):
  config, workdir, results = runs["averaged"]
  student = _student_arrays(config, workdir)
  average = student["opt_state"].average  # ParamAveragingState, restored into the template
  with pytest.raises(AssertionError):  # the average is not the last iterate
    chex.assert_trees_all_close(average, student["params"])
  released = students.load_student(workdir)
  chex.assert_trees_all_equal(released.parts.params, average)
  test = data.load("digits", "test")
  assert results["test_accuracy"] == evaluate.evaluate(released.parts, test)["accuracy"]
  series = metrics_lib.read_metrics(workdir)
  assert [s for s, _ in series["test/accuracy_last_iterate"]] == [2, 4]
  assert series["test/accuracy"][-1][1] == results["test_accuracy"]
  assert "test/accuracy_last_iterate" not in metrics_lib.read_metrics(runs["plain"][1])


def test_the_config_saves_the_decay_with_the_engine_options(teacher_dir):
  assert _config(teacher_dir).to_json()["engine"]["param_averaging_decay"] == 0.0
  config = _config(teacher_dir, param_averaging_decay=0.99)
  assert config.to_json()["engine"]["param_averaging_decay"] == 0.99
  with pytest.raises(ValueError, match=r"param_averaging_decay must be in \[0, 1\)"):
    dataclasses.replace(config.engine, param_averaging_decay=1.0)
