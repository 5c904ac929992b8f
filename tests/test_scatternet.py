"""ScatterNet features (`representations/scatternet.py`) and their heads (`models/scatter_heads.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax.models import registry
from dpkd_jax.representations import scatternet


def test_coefficients_and_shapes_follow_j_and_l():
  assert scatternet.ScatterNetConfig().coefficients == 81  # 1 + 2*8 + 64 for J=2, L=8
  assert scatternet.ScatterNetConfig(scales=3, orientations=4).coefficients == 1 + 12 + 48
  assert scatternet.ScatterNetConfig().output_shape((28, 28, 1)) == (7, 7, 81)
  assert scatternet.ScatterNetConfig().output_shape((32, 32, 3)) == (8, 8, 243)
  with pytest.raises(ValueError, match="multiples of 4"):
    scatternet.ScatterNetConfig().output_shape((30, 28, 1))
  with pytest.raises(ValueError, match="scales"):
    scatternet.ScatterNetConfig(scales=0)


def test_features_are_kymatios_transform_of_the_normalized_images_per_channel():
  from kymatio.scattering2d.frontend.jax_frontend import ScatteringJax2D
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
  info = data.DATASETS["cifar10"]
  config = scatternet.ScatterNetConfig(scales=1, orientations=4)
  got = scatternet.features(images, info, config, chunk=2)  # a padded last chunk
  assert got.shape == (3, 4, 4, 3 * 5) and got.dtype == np.float32
  x = np.asarray(data.normalize(images, info))
  reference = ScatteringJax2D(J=1, shape=(8, 8), L=4)
  for c in range(3):  # channel c's coefficients are contiguous: c K ... c K + K - 1
    expected = np.moveaxis(np.asarray(reference(jnp.asarray(x[..., c]))), 1, -1)  # (3, 4, 4, 5)
    np.testing.assert_allclose(got[..., 5 * c:5 * (c + 1)], expected, rtol=1e-5, atol=1e-5)


def test_features_do_not_depend_on_the_chunking_or_the_other_images():
  images = data.load("digits", "test").images[:5]
  info = data.DATASETS["digits"]
  config = scatternet.ScatterNetConfig()
  whole = scatternet.features(images, info, config, chunk=5)
  np.testing.assert_allclose(scatternet.features(images, info, config, chunk=3), whole,
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(scatternet.features(images[2:3], info, config, chunk=4), whole[2:3],
                             rtol=1e-6, atol=1e-6)


def test_features_are_memoized_by_content_read_only_and_bounded(monkeypatch):
  images = data.load("digits", "test").images[:6]
  info = data.DATASETS["digits"]
  config = scatternet.ScatterNetConfig()
  scatternet.clear_memo()
  first = scatternet.features(images, info, config, chunk=4)
  assert not first.flags.writeable
  with pytest.raises(ValueError, match="read-only"):
    first[0, 0, 0, 0] = 1.0
  assert scatternet.features(images.copy(), info, config, chunk=4) is first  # same content
  other = images.copy()
  other[0, 0, 0, 0] ^= 1
  assert scatternet.features(other, info, config, chunk=4) is not first  # one pixel differs
  assert scatternet.features(images, info, config, chunk=3) is not first  # another program
  assert scatternet.features(images, info, scatternet.ScatterNetConfig(orientations=4),
                             chunk=4).shape[-1] == 1 + 2 * 4 + 16
  # A bounded memo: the least recently used entries go first, a larger array is never kept.
  monkeypatch.setattr(scatternet, "_MEMO_BYTES", first.nbytes)
  scatternet.clear_memo()
  scatternet.features(images, info, config, chunk=4)
  kept = scatternet.features(images[:3], info, config, chunk=4)
  assert scatternet.features(images[:3], info, config, chunk=4) is kept
  assert len(scatternet._memo) == 1  # the 6-image array was dropped for room
  monkeypatch.setattr(scatternet, "_MEMO_BYTES", 1)
  scatternet.clear_memo()
  scatternet.features(images, info, config, chunk=4)
  assert not scatternet._memo
  scatternet.clear_memo()


@pytest.mark.parametrize("name", ["scatter_linear", "scatter_cnn"])
def test_heads_take_feature_maps_and_refuse_batchnorm(name):
  model = registry.create_classifier(name, num_classes=10, input_shape=(7, 7, 81), norm="group",
                                     seed=0)
  parts = core.split(model)
  assert parts.batch_stats == {}  # the input GroupNorm has no parameters and no statistics
  assert not any("norm" in str(path) for path, _ in jax.tree_util.tree_leaves_with_path(
      parts.params))
  out, _ = core.apply(parts.graphdef, parts.params, parts.batch_stats,
                      jnp.ones((2, 7, 7, 81)), train=True)
  assert out.logits.shape == (2, 10)
  with pytest.raises(ValueError, match="BatchNorm"):
    registry.create_classifier(name, num_classes=10, input_shape=(7, 7, 81), norm="batch",
                               seed=0)


def test_input_groupnorm_normalizes_each_example_over_groups_of_three_channels():
  model = registry.create_classifier("scatter_linear", num_classes=3, input_shape=(2, 2, 6),
                                     norm="group", seed=0)
  x = jax.random.normal(jax.random.key(1), (4, 2, 2, 6)) * 5 + 3
  hint = np.asarray(model(x).hint).reshape(4, 2, 2, 2, 3)  # (B, h, w, groups, 3)
  np.testing.assert_allclose(hint.mean(axis=(1, 2, 4)), 0, atol=1e-5)
  np.testing.assert_allclose(hint.std(axis=(1, 2, 4)), 1, atol=1e-3)
  single = np.asarray(model(x[1:2]).hint)  # per example: the batch does not matter
  np.testing.assert_allclose(single[0], np.asarray(model(x).hint)[1], rtol=1e-5, atol=1e-6)
  assert isinstance(model.norm, nnx.GroupNorm) and model.norm.num_groups == 2
