"""DP-SGD runs with parameter averaging (`param_averaging_decay`, `step.param_averaging`): the
average of the run's iterates, across a resume, evaluated, recorded and released; the
iterates and ε of the run unchanged. The wrapper alone is tested in test_dpsgd_step.py.

Its own module: `test_dpsgd_run.py`'s runs share a step guarded against a second trace, and an
averaged state (another optimizer state) traces that step again.
"""

import dataclasses
import json
import os

import chex
import jax
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import run as run_lib
from dpkd_jax.release import students
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import outputs
from dpkd_jax.train.state import TrainState
from dpsgd_fixtures import hand_ema, make_config

DECAY = 0.9


def _restore(config, workdir):
  """(checkpoint arrays as `train_dpsgd` saved them, metadata) of the newest step."""
  template = TrainState.create(dpsgd.init_model(config, jax.random.key(0)),
                               dpsgd.make_optimizer(config)).arrays()
  target = {"state": template, "rng": jax.random.key_data(jax.random.key(0))}
  return checkpoint.restore(os.path.join(workdir, "checkpoints"), target)


@pytest.fixture(scope="module")
def averaged(tmp_path_factory):
  """Run `plain`: 4 steps without averaging; `one_go`: the same with averaging; `stepwise`:
  the averaged run stopped after every step and resumed (its checkpoints: p_1..p_4). A
  validation hold-out of 100 records, so that both evaluations are checked."""
  plain_config = make_config(validation_examples=100)
  config = dataclasses.replace(plain_config, param_averaging_decay=DECAY)
  dirs = {name: str(tmp_path_factory.mktemp(name)) for name in ("plain", "one_go", "stepwise")}
  results = {"plain": dpsgd.train_dpsgd(plain_config, dirs["plain"], progress=False),
             "one_go": dpsgd.train_dpsgd(config, dirs["one_go"], progress=False)}
  iterates = []
  for stop in (1, 2, 3, 4):
    results["stepwise"] = dpsgd.train_dpsgd(config, dirs["stepwise"], resume=stop > 1,
                                            stop_at_step=stop, progress=False)
    iterates.append(_restore(config, dirs["stepwise"])[0]["state"]["params"])
  arrays = {name: _restore(config if name != "plain" else plain_config, d)[0]
            for name, d in dirs.items()}
  return config, dirs, results, arrays, iterates


def test_the_average_is_the_ema_of_the_run_iterates(averaged):
  _, _, _, arrays, iterates = averaged
  state = arrays["one_go"]["state"]
  chex.assert_trees_all_equal(state["params"], iterates[-1])
  assert int(state["opt_state"].count) == 4
  chex.assert_trees_all_close(state["opt_state"].average, hand_ema(iterates, DECAY),
                              rtol=1e-5, atol=1e-6)


def test_a_resumed_run_has_the_uninterrupted_average(averaged):
  _, _, results, arrays, _ = averaged
  chex.assert_trees_all_equal(arrays["stepwise"], arrays["one_go"])  # average, count, key data
  for key in ("test_accuracy", "test_loss", "epsilon", outputs.PRIVATE_KEY):  # + validation
    assert results["stepwise"][key] == results["one_go"][key]


def test_averaging_changes_neither_the_iterates_nor_epsilon(averaged):
  _, _, results, arrays, _ = averaged
  plain, one_go = arrays["plain"]["state"], arrays["one_go"]["state"]
  # Two programs (the averaging one has the EMA beside the update): the same iterates up to
  # float rounding, which depends on how XLA fuses each program (tests/conftest.py's codegen).
  chex.assert_trees_all_close(one_go["params"], plain["params"], rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(one_go["opt_state"].inner, plain["opt_state"], rtol=1e-5,
                              atol=1e-7)
  for key in ("epsilon", "epsilon_add_remove", "noise_multiplier", "steps", "sampling_rate"):
    assert results["one_go"][key] == results["plain"][key]
  assert results["one_go"]["ledger"]["entries"] == results["plain"]["ledger"]["entries"]


def test_evaluation_record_and_release_use_the_average(averaged):
  config, dirs, results, arrays, _ = averaged
  state = arrays["one_go"]["state"]
  train = data.load("digits", "train")
  _, validation = run_lib.hold_out(train, 100)
  test = data.load("digits", "test")
  of_average = dpsgd.init_model(config, jax.random.key(0))._replace(
      params=state["opt_state"].average)
  of_iterate = of_average._replace(params=state["params"])
  one_go = results["one_go"]
  assert evaluate_lib.evaluate(of_average, test) == {"accuracy": one_go["test_accuracy"],
                                                     "loss": one_go["test_loss"]}
  assert evaluate_lib.evaluate(of_average, validation)["accuracy"] == (
      one_go[outputs.PRIVATE_KEY]["validation_accuracy"])
  assert evaluate_lib.evaluate(of_iterate, test)["loss"] != one_go["test_loss"]
  with open(os.path.join(dirs["one_go"], "record.json")) as f:
    record = json.load(f)
  assert record["param_averaging_decay"] == DECAY == one_go["config"]["param_averaging_decay"]
  assert "param_averaging_start_step" not in record  # at its default: omitted, as in to_json
  with open(os.path.join(dirs["plain"], "record.json")) as f:
    assert "param_averaging_decay" not in json.load(f)
  # The release (experiments.export, model cards) reads the average from the checkpoint.
  student = students.load_student(dirs["one_go"])
  chex.assert_trees_all_equal(student.parts.params, state["opt_state"].average)
  assert evaluate_lib.evaluate(student.parts, test)["accuracy"] == one_go["test_accuracy"]
  chex.assert_trees_all_equal(students.load_student(dirs["plain"]).parts.params,
                              arrays["plain"]["state"]["params"])
