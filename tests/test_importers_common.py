"""dpkd_jax.importers.common: input normalisation, one layer's layout, assembling a zoo model
(no PyTorch or Keras needed)."""

import numpy as np
import pytest
from flax import traverse_util

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.importers import common
from dpkd_jax.importers import run
from dpkd_jax.models import adapter

DIGITS, CIFAR = data.DATASETS["digits"], data.DATASETS["cifar10"]


def test_input_norm_presets_and_custom():
  assert common.input_norm("dataset", DIGITS) == (DIGITS.mean, DIGITS.std)
  assert common.input_norm("unit", CIFAR) == ((0.0,) * 3, (1.0,) * 3)
  assert common.input_norm("imagenet", CIFAR)[0] == (0.485, 0.456, 0.406)
  assert common.input_norm("custom", DIGITS, [0.5], [0.25]) == ((0.5,), (0.25,))


@pytest.mark.parametrize("args, match", [
    (("imagenet", DIGITS), "need 1 values"),
    (("custom", DIGITS), "--input_mean and --input_std"),
    (("custom", DIGITS, [0.5], [0.0]), "std must be positive"),
    (("zscore", DIGITS), "unknown 'zscore'"),
    (("unit", DIGITS, [0.5], None), "need --input_norm=custom, not 'unit'"),
])
def test_input_norm_errors_are_user_errors(args, match):
  with pytest.raises(errors.UserError, match=match):
    common.input_norm(*args)


@pytest.mark.parametrize("preset", ["unit", "half", "imagenet", "raw"])
def test_input_affine_gives_what_the_teacher_was_trained_on(preset):
  mean, std = common.input_norm(preset, CIFAR)
  pixels = np.random.default_rng(0).integers(0, 256, (4, 5, 5, 3)).astype(np.uint8)
  scale, shift = run.input_affine(CIFAR, mean, std, None)
  ours = data.normalize(pixels, CIFAR) * scale + shift
  theirs = (pixels / 255.0 - np.asarray(mean)) / np.asarray(std)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-4)


def test_input_affine_identity_and_rescaling():
  assert run.input_affine(DIGITS, DIGITS.mean, DIGITS.std, None) is None
  # A Keras model taking raw pixels that starts with Rescaling(1/255): its body sees u / 255.
  mean, std = common.input_norm("raw", DIGITS)
  scale, shift = run.input_affine(DIGITS, mean, std, (np.float32(1 / 255), np.float32(0.0)))
  pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
  np.testing.assert_allclose(data.normalize(pixels, DIGITS) * scale + shift, pixels / 255.0,
                             atol=1e-6)


def test_affine_for_formula():
  scale, shift = adapter.affine_for([0.2], [0.3], [0.5], [0.25])
  np.testing.assert_allclose(scale, [0.3 / 0.25])
  np.testing.assert_allclose(shift, [(0.2 - 0.5) / 0.25])


def _bn(y, scale, bias, mean, var, eps):
  return scale * (y - mean) / np.sqrt(var + eps) + bias


def test_conv_norm_folds_conv_bias_and_eps_exactly():
  rng = np.random.default_rng(0)
  c = 4
  arrays = {k: rng.uniform(0.5, 1.5, c).astype(np.float32) for k in ("scale", "bias", "mean", "var")}
  conv_bias = rng.normal(size=c).astype(np.float32)
  bn = {k: common.source(v, k) for k, v in arrays.items()}
  bn["eps"] = 1e-3  # Keras' default
  kernel = common.source(np.zeros((3, 3, 2, c)), "k")
  out = common.conv_norm(("conv1",), "batch", kernel, common.source(conv_bias, "b"), bn)
  y = rng.normal(size=(10, c)).astype(np.float32)  # conv outputs without the bias
  want = _bn(y + conv_bias, arrays["scale"], arrays["bias"], arrays["mean"], arrays["var"], 1e-3)
  got = _bn(y, out[("params", "conv1", "norm", "scale")].value,
            out[("params", "conv1", "norm", "bias")].value,
            out[("batch_stats", "conv1", "norm", "mean")].value,
            out[("batch_stats", "conv1", "norm", "var")].value, common.FLAX_BN_EPS)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert ("params", "conv1", "conv", "bias") not in out


def _lenet_sources(num_classes=10):
  parts = models.split(models.create_classifier("lenet5", num_classes=num_classes,
                                                input_shape=(28, 28, 1), seed=3))
  sources = {}
  for kind, tree in (("params", parts.params), ("batch_stats", parts.batch_stats)):
    for path, value in traverse_util.flatten_dict(tree).items():
      sources[(kind, *path)] = common.source(value, "/".join(map(str, path)))
  return parts, sources


def test_assemble_round_trip_and_adapter():
  parts, sources = _lenet_sources()
  built = common.assemble(common.Converted("lenet5", "batch", sources), DIGITS)
  np.testing.assert_array_equal(built.params["head"]["kernel"], parts.params["head"]["kernel"])
  wrapped = common.assemble(common.Converted("lenet5", "batch", sources), DIGITS,
                            (np.full(1, 2.0), np.full(1, -1.0)))
  np.testing.assert_array_equal(wrapped.batch_stats["scale"], [2.0])
  assert set(wrapped.params) == {"model"}


def test_assemble_names_the_array_of_a_wrong_number_of_classes():
  _, sources = _lenet_sources(num_classes=7)
  with pytest.raises(errors.UserError, match=r"head/kernel has shape \(84, 7\).*10 classes"):
    common.assemble(common.Converted("lenet5", "batch", sources), DIGITS)


def test_assemble_rejects_arrays_the_model_lacks():
  _, sources = _lenet_sources()
  sources[("params", "extra", "kernel")] = common.source(np.zeros(3), "extra.weight")
  with pytest.raises(errors.UserError, match="extra.weight have no place"):
    common.assemble(common.Converted("lenet5", "batch", sources), DIGITS)
