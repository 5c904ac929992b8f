"""dpkd_jax.importers.keras: randomly initialised Keras 3 twins of lenet5 / small_cnn give the
same logits once imported (eval-mode BatchNorm with Keras' eps, a final softmax, a leading
Rescaling); every layer is checked; the CLI end to end. Skipped without Keras."""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")  # Keras 3 on JAX: no TensorFlow needed
keras = pytest.importorskip("keras")
layers = keras.layers

# pylint: disable=wrong-import-position
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.importers import common
from dpkd_jax.importers import keras as keras_importer
from dpkd_jax.models import core
from dpkd_jax.train import evaluate
from experiments import teacher as teacher_cli

RTOL = 1e-4  # max |ours - keras| / max |keras| over the logits
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Keras on NumPy 2
DIGITS = data.DATASETS["digits"]


def twin(arch, batch_norm, *, input_shape=(28, 28, 1), softmax=False, rescale=False,
         relu_before_norm=False, pad=None):
  """Keras twins of classifiers.LeNet5 / SmallCNN, with random BatchNorm statistics."""
  def conv(filters, k, padding):
    if relu_before_norm:
      return [layers.Conv2D(filters, k, padding=padding, activation="relu"),
              layers.BatchNormalization()]
    if batch_norm:
      return [layers.Conv2D(filters, k, padding=padding), layers.BatchNormalization(),
              layers.ReLU()]
    return [layers.Conv2D(filters, k, padding=padding), layers.Activation("relu")]
  stack = [keras.Input(input_shape)] + ([layers.Rescaling(1 / 255.0)] if rescale else [])
  if arch == "lenet5":
    stack += conv(6, 5, pad or "same") + [layers.MaxPooling2D()] + conv(16, 5, "valid") + [
        layers.MaxPooling2D(), layers.Flatten(), layers.Dense(120, activation="relu"),
        layers.Dropout(0.3), layers.Dense(84, activation="relu")]
  else:
    stack += conv(32, 3, pad or "same") + [layers.MaxPooling2D()] + conv(64, 3, "same") + [
        layers.MaxPooling2D(), layers.Flatten(), layers.Dense(128, activation="relu")]
  stack.append(layers.Dense(10, activation="softmax" if softmax else None))
  model = keras.Sequential(stack)
  rng = np.random.default_rng(1)
  for layer in model.layers:
    if isinstance(layer, layers.BatchNormalization):
      n = layer.moving_mean.shape[0]
      layer.moving_mean.assign(rng.uniform(-0.5, 0.5, n))
      layer.moving_variance.assign(rng.uniform(0.5, 2.0, n))
      layer.gamma.assign(rng.uniform(0.5, 1.5, n))
      layer.beta.assign(rng.uniform(-0.3, 0.3, n))
  return model


def _logits(model, x):
  """Keras' output as logits (a softmax output, log-probabilities: equal up to a shift)."""
  out = np.array(model(x, training=False))
  if model.layers[-1].get_config()["activation"] == "softmax":
    out = np.log(out)
    out -= out.mean(-1, keepdims=True)
  return out


@pytest.mark.parametrize("softmax", [False, True], ids=["logits", "softmax"])
@pytest.mark.parametrize("batch_norm", [True, False], ids=["batch", "none"])
@pytest.mark.parametrize("arch", ["lenet5", "small_cnn"])
def test_twin_logits_equal(arch, batch_norm, softmax, tmp_path):
  model = twin(arch, batch_norm, softmax=softmax)
  model.save(tmp_path / "m.keras")
  converted = keras_importer.convert(str(tmp_path / "m.keras"), arch, DIGITS)
  assert converted.norm == ("batch" if batch_norm else "none")
  parts = common.assemble(converted, DIGITS)
  x = np.random.default_rng(0).standard_normal((2, 28, 28, 1)).astype(np.float32)
  got = np.array(core.apply(parts.graphdef, parts.params, parts.batch_stats, x,
                            train=False)[0].logits)
  if softmax:
    got -= got.mean(-1, keepdims=True)
  want = _logits(model, x)
  assert np.abs(got - want).max() < RTOL * np.abs(want).max()


@pytest.mark.parametrize("kwargs, arch, match", [
    ({"relu_before_norm": True}, "small_cnn", "must come right after a convolution"),
    ({"pad": "valid"}, "small_cnn", "padding 'same'"),
    ({}, "lenet5", "not the lenet5 twin"),
    ({}, "resnet18", "--arch: unknown 'resnet18'"),
    ({"input_shape": (32, 32, 3)}, "small_cnn", r"inputs of shape \(32, 32, 3\)"),
], ids=["relu_before_norm", "padding", "other_twin", "unknown_arch", "input_shape"])
def test_one_line_user_errors(kwargs, arch, match, tmp_path):
  twin("small_cnn", True, **kwargs).save(tmp_path / "m.keras")
  with pytest.raises(errors.UserError, match=match) as caught:
    keras_importer.convert(str(tmp_path / "m.keras"), arch, DIGITS)
  assert "\n" not in str(caught.value)


def test_unsupported_layer(tmp_path):
  model = keras.Sequential([keras.Input((28, 28, 1)), layers.Conv2D(6, 5, padding="same"),
                            layers.AveragePooling2D(2), layers.Flatten(), layers.Dense(10)])
  model.save(tmp_path / "m.keras")
  with pytest.raises(errors.UserError, match="unsupported layer.*AveragePooling2D"):
    keras_importer.convert(str(tmp_path / "m.keras"), "lenet5", DIGITS)
  (tmp_path / "junk.keras").write_bytes(b"not a model")
  with pytest.raises(errors.UserError, match="not a Keras 3 model file"):
    keras_importer.convert(str(tmp_path / "junk.keras"), "lenet5", DIGITS)


def test_cli_end_to_end_with_rescaling(tmp_path, capsys):
  """A model taking raw pixels (Rescaling(1/255) inside), imported with --input_norm=raw."""
  model = twin("lenet5", True, rescale=True)
  model.save(tmp_path / "lenet.keras")
  workdir = str(tmp_path / "teacher")
  teacher_cli.main(["import", "--from=keras", "--arch=lenet5", "--dataset=digits",
                    f"--checkpoint={tmp_path / 'lenet.keras'}", "--input_norm=raw",
                    f"--workdir={workdir}"])
  assert "imported keras lenet5 as lenet5" in capsys.readouterr().out
  with open(os.path.join(workdir, "card.json")) as f:
    card = json.load(f)
  assert card["import"]["framework_version"] == keras.__version__ and card["input_adapter"]
  assert any("Rescaling" in note for note in card["import"]["notes"])
  assert card["import"]["check"]["verified"] and card["import"]["check"]["source"] == "Keras model"
  assert card["import"]["check"]["max_relative_logit_difference"] < 1e-5
  loaded = teacher_lib.load_teacher(workdir, dataset="digits", num_classes=10)
  pixels = data.load("digits", "test").images[:8]
  want = _logits(model, pixels.astype(np.float32))
  got = evaluate.predict_logits(loaded.parts, pixels, DIGITS, batch_size=8)
  assert np.abs(got - want).max() < RTOL * np.abs(want).max()


def test_reference_is_the_logits_of_a_softmax_model(tmp_path):
  """The check compares logits: a final softmax is switched off while the Keras model runs."""
  model = twin("small_cnn", True, softmax=True)
  model.save(tmp_path / "m.keras")
  reference = keras_importer.convert(str(tmp_path / "m.keras"), "small_cnn", DIGITS).reference
  x = np.random.default_rng(0).standard_normal((2, 28, 28, 1)).astype(np.float32)
  logits = reference.logits(x)
  probabilities = np.array(model(x, training=False))
  np.testing.assert_allclose(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True),
                             probabilities, rtol=1e-5)
  assert model.layers[-1].get_config()["activation"] == "softmax"  # restored
