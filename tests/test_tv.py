"""dpkd_jax.models.tv: the exact torchvision twins (no PyTorch needed here; the logit equality
with torchvision itself is in tests/test_importers_torch.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import models
from dpkd_jax.models import tv

# torchvision's parameter counts at 1000 classes, 224×224×3 (torchvision's model docs).
TORCHVISION_PARAMS = {"tv_resnet18": 11_689_512, "tv_resnet34": 21_797_672,
                      "tv_mobilenet_v2": 3_504_872,
                      # VGG-BN without the conv biases (folded into the BatchNorm mean on import):
                      # 132,868,840 - 2,752 and 138,365,992 - 4,224.
                      "tv_vgg11_bn": 132_866_088, "tv_vgg16_bn": 138_361_768}


def _abstract(name, num_classes=1000, input_shape=(224, 224, 3)):
  return models.split(nnx.eval_shape(lambda: models.create_classifier(
      name, num_classes=num_classes, input_shape=input_shape, seed=0)))


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_are_torchvision_s(name):
  assert models.count_params(_abstract(name).params) == TORCHVISION_PARAMS[name]


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
@pytest.mark.parametrize("shape", [(32, 32, 3), (40, 36, 1)])
def test_shapes_at_small_inputs(name, shape):
  def forward():
    model = models.create_classifier(name, num_classes=10, input_shape=shape, seed=0)
    return model(jnp.zeros((2, *shape)), train=False)
  out = nnx.eval_shape(forward)
  assert out.logits.shape == (2, 10)
  width = {"tv_resnet18": 512, "tv_resnet34": 512, "tv_mobilenet_v2": 1280}.get(name, 4096)
  assert out.features.shape == (2, width)
  # Same classifier whatever the input size (adaptive pooling), as in torchvision.
  assert _abstract(name, 10, shape).params["head"]["kernel"].shape == (width, 10)


def test_vgg_needs_32_pixels():
  with pytest.raises(ValueError, match="empty feature map.*larger inputs"):
    nnx.eval_shape(lambda: models.create_classifier(  # shapes only: no weights drawn
        "tv_vgg11_bn", num_classes=10, input_shape=(28, 28, 1), seed=0))


def _adaptive_reference(x, out):
  """PyTorch's definition, one output cell at a time."""
  b, h, w, c = x.shape
  result = np.zeros((b, out[0], out[1], c), np.float32)
  for i in range(out[0]):
    for j in range(out[1]):
      rows = slice(i * h // out[0], -(-(i + 1) * h // out[0]))
      cols = slice(j * w // out[1], -(-(j + 1) * w // out[1]))
      result[:, i, j] = x[:, rows, cols].mean(axis=(1, 2))
  return result


@pytest.mark.parametrize("size", [(1, 1), (5, 3), (7, 7), (10, 14)])
def test_adaptive_avg_pool_matches_pytorch_definition(size):
  # Host data and one jitted call per size (eagerly, each cell's slice and mean compiled alone).
  x = np.random.default_rng(0).standard_normal((2, *size, 3), dtype=np.float32)
  pool = jax.jit(tv.adaptive_avg_pool, static_argnums=1)
  np.testing.assert_allclose(pool(jnp.asarray(x), (7, 7)),
                             _adaptive_reference(x, (7, 7)), rtol=1e-6, atol=1e-6)


def test_strided_convs_pad_symmetrically_like_pytorch():
  """torchvision's 3×3 stride-2 conv pads 1 on both sides; Flax's "SAME" would pad only after."""
  model = nnx.eval_shape(lambda: models.create_classifier(  # the layers' settings, no weights
      "tv_resnet18", num_classes=10, input_shape=(32, 32, 3), seed=0))
  assert model.stem.conv.padding == ((3, 3), (3, 3))
  assert model.stages[1][0].conv1.conv.padding == ((1, 1), (1, 1))
  assert model.stages[1][0].downsample.conv.padding == "VALID"
