"""DP-SGD on ScatterNet features and with a validation hold-out (`features`,
`validation_examples`): the data path, the results keys, the saved config."""

import dataclasses
import json
import os

import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import run as run_lib
from dpkd_jax.release import students
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs


def _config(**kw):
  base = dict(dataset="digits", model="scatter_linear", features="scatternet",
              expected_batch_size=64, l2_clip_norm=0.1, noise_multiplier=1.0, steps=6,
              learning_rate=4.0, momentum=0.9, seed=0, clipping="ghost",
              validation_examples=100)
  base.update(kw)
  return dpsgd.DPSGDConfig(**base)


def test_hold_out_is_a_fixed_disjoint_split():
  train = data.load("digits", "train")
  kept, held = run_lib.hold_out(train, 100)
  again, held_again = run_lib.hold_out(train, 100)
  assert len(kept) == len(train) - 100 and len(held) == 100
  np.testing.assert_array_equal(held.images, held_again.images)
  np.testing.assert_array_equal(kept.labels, again.labels)
  rows = {row.tobytes() for row in train.images.reshape(len(train), -1)}
  assert len(rows) == len(train)  # digits has no duplicate images: rows identify records
  kept_rows = {row.tobytes() for row in kept.images.reshape(len(kept), -1)}
  assert not kept_rows & {row.tobytes() for row in held.images.reshape(100, -1)}
  assert run_lib.hold_out(train, 0) == (train, None)
  with pytest.raises(errors.UserError, match="leaves no training records"):
    run_lib.hold_out(train, len(train))


def test_model_inputs_normalize_pixels_and_pass_features_through():
  info = data.DATASETS["digits"]
  pixels = np.full((2, 28, 28, 1), 255, np.uint8)
  np.testing.assert_allclose(data.model_inputs(pixels, info), data.normalize(pixels, info))
  features = np.ones((2, 7, 7, 81), np.float32)
  assert data.model_inputs(features, info) is features
  with pytest.raises(ValueError, match="uint8 pixels or float32 features"):
    data.model_inputs(features.astype(np.float64), info)
  with pytest.raises(ValueError, match="float32"):
    data.FeatureDataset(images=features.astype(np.float64), labels=np.zeros(2, np.int32),
                        info=info)


def test_config_input_shape_and_saved_config():
  config = _config()
  assert config.input_shape == (7, 7, 81)
  assert dpsgd.DPSGDConfig(dataset="digits", model="lenet5", noise_multiplier=1.0,
                           steps=1).input_shape == (28, 28, 1)
  plain = dpsgd.DPSGDConfig(dataset="digits", model="lenet5", noise_multiplier=1.0, steps=1)
  assert "features" not in plain.to_json() and "validation_examples" not in plain.to_json()
  assert config.to_json()["features"] == "scatternet"
  for bad in (dict(features="pixelz"), dict(validation_examples=-1)):
    with pytest.raises(ValueError):
      _config(**bad)


def test_a_run_on_features_reports_validation_and_resumes(tmp_path):
  config = _config()
  one_go = dpsgd.train_dpsgd(config, str(tmp_path / "a"), progress=False)
  assert one_go["features"] == "scatternet" and one_go["finished"]
  assert one_go["validation_examples"] == 100
  assert one_go["num_examples"] == 1442 - 100  # N of the plan: the records trained on
  # The validation accuracy is a noiseless statistic of private records: private diagnostics.
  validation = one_go[outputs.PRIVATE_KEY]["validation_accuracy"]
  assert "validation_accuracy" not in one_go and 0.0 <= validation <= 1.0
  assert one_go["test_accuracy"] > 0.5  # six noisy steps on ScatterNet features already learn
  assert "validation/accuracy" not in metrics_lib.read_metrics(str(tmp_path / "a"))
  private = outputs.read_private_diagnostics(str(tmp_path / "a"))
  assert private["private_diagnostics/validation/accuracy"][-1] == (6, validation)
  dpsgd.train_dpsgd(config, str(tmp_path / "b"), stop_at_step=3, progress=False)
  resumed = dpsgd.train_dpsgd(config, str(tmp_path / "b"), resume=True, progress=False)
  assert resumed["test_accuracy"] == one_go["test_accuracy"]
  assert resumed[outputs.PRIVATE_KEY] == one_go[outputs.PRIVATE_KEY]
  resumed_series = outputs.read_private_diagnostics(str(tmp_path / "b"))
  steps = [s for s, _ in resumed_series["private_diagnostics/validation/accuracy"]]
  assert steps == sorted(set(steps)) and steps[-1] == 6  # each step once after the resume
  with open(os.path.join(tmp_path, "a", "record.json")) as f:
    record = json.load(f)
  assert record["test_accuracy"] == one_go["test_accuracy"]
  assert "validation_accuracy" not in record  # the tuning table reads the private block
  assert record[outputs.PRIVATE_KEY]["validation_accuracy"] == validation
  assert (record["features"], record["model"], record["learning_rate"]) == (
      "scatternet", "scatter_linear", 4.0)
  with open(os.path.join(tmp_path, "a", "model_card.json")) as f:
    card_input = json.load(f)["io"]["input"]
  assert card_input["shape"] == ["batch", 28, 28, 1]  # the released student reads images
  assert "ScatterNet features" in card_input["normalisation"]
  # Released as a model of images: the transform in front of the trained head, the head's
  # parameters unchanged, the run's test accuracy on the test images.
  student = students.load_student(str(tmp_path / "a"))
  assert student.spec.features == "scatternet"
  from dpkd_jax.train import evaluate as evaluate_lib
  test = data.load("digits", "test")
  assert evaluate_lib.evaluate(student.parts, test)["accuracy"] == pytest.approx(
      one_go["test_accuracy"], abs=1e-9)
  from dpkd_jax.release import bundle
  out = bundle.export_run(str(tmp_path / "a"), str(tmp_path / "release"),
                          formats=("stablehlo",), measure_latency=False)
  assert [e["format"] for e in out["exports"]] == ["stablehlo"]
  pytest.importorskip("jax2onnx")
  with pytest.raises(errors.UserError, match="jax2onnx cannot convert this student") as err:
    bundle.export_run(str(tmp_path / "a"), str(tmp_path / "onnx"), formats=("onnx",),
                      measure_latency=False)  # its 2-D FFTs have no ONNX lowering
  assert "\n" not in str(err.value)


def test_pixels_and_features_share_the_plan():
  pixels = dataclasses.replace(_config(), features="pixels", model="lenet5", clipping="vmap")
  plans = [dpsgd.make_plan(c, num_examples=1342, num_devices=8) for c in (_config(), pixels)]
  assert plans[0].sound_epsilon == plans[1].sound_epsilon
  assert plans[0].noise_multiplier == plans[1].noise_multiplier


def test_cosine_schedule_decays_over_the_planned_steps():
  import jax
  import optax
  from dpkd_jax.methods.dpsgd import step as step_lib
  config = _config(lr_schedule="cosine", optimizer="sgd", momentum=0.0)
  with pytest.raises(ValueError, match="give total_steps"):
    step_lib.make_optimizer(config)
  tx = step_lib.make_optimizer(config, total_steps=10)
  assert tx is step_lib.make_optimizer(config, total_steps=10)  # cached: one compiled step
  params = {"w": jax.numpy.zeros(())}
  state = tx.init(params)
  rates = []
  for _ in range(11):
    updates, state = tx.update({"w": jax.numpy.ones(())}, state, params)
    rates.append(-float(updates["w"]))
  np.testing.assert_allclose(rates[0], 4.0)
  np.testing.assert_allclose(rates[5], 2.0, rtol=1e-5)
  np.testing.assert_allclose(rates[10], 0.0, atol=1e-6)
  assert optax.tree_utils.tree_get(state, "count") is not None
  run = dpsgd.DPSGDConfig(**{**dataclasses.asdict(config), "lr_schedule": "cosine"})
  assert run.to_json()["lr_schedule"] == "cosine"
