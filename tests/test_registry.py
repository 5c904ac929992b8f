"""Tests of the model registry `dpkd_jax.models.registry`."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax import errors
from dpkd_jax.models import classifiers, core, generators, registry

INPUT_SHAPE = (28, 28, 1)


def test_registered_names():
  assert set(registry.CLASSIFIERS) == {
      "lenet5", "lenet5_half", "datalens_cnn", "small_cnn", "vgg", "mobilenet", "resnet18",
      "resnet34", "wide_resnet", "scatter_linear", "scatter_cnn", "tv_resnet18", "tv_resnet34",
      "tv_vgg11_bn", "tv_vgg16_bn", "tv_mobilenet_v2"}
  assert set(registry.GENERATORS) == {"dafl"}


@pytest.mark.parametrize("name", sorted(registry.CLASSIFIERS))
def test_every_classifier_builds_with_the_requested_norm(name):
  # Abstract construction (no allocation or compilation) through the public entry point.
  # torchvision's VGG pools five times: it needs 32×32 inputs, as in torchvision.
  shape = (32, 32, 1) if name.startswith("tv_vgg") else INPUT_SHAPE
  model = nnx.eval_shape(lambda: registry.create_classifier(
      name, num_classes=7, input_shape=shape, norm="group", seed=0))
  assert isinstance(model, registry.CLASSIFIERS[name])
  parts = core.split(model)
  assert parts.batch_stats == {}
  chex.assert_shape(parts.params["head"]["kernel"], (None, 7))


def test_seed_gives_reproducible_parameters_and_matches_rngs():
  """Real initialisation: the same seed, or an Rngs of the same key, gives the same model."""
  def create(**kwargs):
    return core.split(registry.create_classifier(
        "lenet5_half", num_classes=10, input_shape=INPUT_SHAPE, **kwargs)).params

  first, again = create(seed=0), create(seed=0)
  from_rngs = create(rngs=nnx.Rngs(jax.random.key(0)))
  other = create(seed=1)
  chex.assert_trees_all_equal(first, again)
  chex.assert_trees_all_equal(first, from_rngs)
  assert not jnp.allclose(first["conv1"]["conv"]["kernel"],
                           other["conv1"]["conv"]["kernel"])
  assert isinstance(registry.create_classifier("lenet5_half", num_classes=10,
                                               input_shape=INPUT_SHAPE, seed=0),
                    classifiers.LeNet5Half)


def test_unknown_names_raise_and_list_the_choices():
  with pytest.raises(ValueError, match="unknown classifier 'resnet50'.*lenet5.*wide_resnet"):
    registry.create_classifier("resnet50", num_classes=10, input_shape=INPUT_SHAPE, seed=0)
  with pytest.raises(ValueError, match="unknown generator 'dcgan'.*dafl"):
    registry.create_generator("dcgan", latent_dim=8, image_shape=INPUT_SHAPE,
                              rngs=nnx.Rngs(jax.random.key(0)))


@pytest.mark.parametrize("kwargs", [{}, {"seed": 0, "rngs": nnx.Rngs(jax.random.key(0))}],
                         ids=["neither", "both"])
def test_exactly_one_of_seed_and_rngs(kwargs):
  with pytest.raises(ValueError, match="exactly one of seed and rngs"):
    registry.create_classifier("lenet5", num_classes=10, input_shape=INPUT_SHAPE, **kwargs)


def test_non_integer_seed_raises():
  with pytest.raises(ValueError, match="seed"):
    registry.create_classifier("lenet5", num_classes=10, input_shape=INPUT_SHAPE, seed=0.5)


def test_bad_norm_passes_through_to_the_model():
  with pytest.raises(ValueError, match="norm"):
    registry.create_classifier("small_cnn", num_classes=10, input_shape=INPUT_SHAPE,
                               norm="batchnorm", seed=0)


def test_create_generator():
  model = nnx.eval_shape(lambda: registry.create_generator(
      "dafl", latent_dim=8, image_shape=(32, 32, 3), rngs=nnx.Rngs(jax.random.key(0))))
  assert isinstance(model, generators.DAFLGenerator)
  chex.assert_shape(core.split(model).params["project"]["kernel"], (8, 8 * 8 * 128))


class _Config:  # what generator_identity reads of a method config
  dataset, generator_model, generator_channels, latent_dim = "digits", "dafl", 8, 16


def test_generator_identity_names_the_teacher_by_its_hash_only():
  identity = registry.generator_identity(_Config(), "ab" * 32)
  assert identity == {"dataset": "digits", "teacher_sha256": "ab" * 32, "generator_model": "dafl",
                      "generator_channels": 8, "latent_dim": 16}
  registry.check_generator_identity(dict(identity), identity, where="g", teacher_dir="t")


@pytest.mark.parametrize("saved, match", [
    (dict(teacher_sha256="cd" * 32), "g was pretrained against other teacher weights than 't'"),
    (dict(latent_dim=4), "g was pretrained for latent_dim=4, this run needs latent_dim=16"),
    (dict(teacher_sha256=None, teacher_dir="/old"),
     "before generators recorded their teacher's weights .*'/old'.*pretrain the generator again"),
])
def test_check_generator_identity_says_why_in_one_line(saved, match):
  wanted = registry.generator_identity(_Config(), "ab" * 32)
  saved = {k: v for k, v in {**wanted, **saved}.items() if v is not None}
  with pytest.raises(errors.UserError, match=match) as error:
    registry.check_generator_identity(saved, wanted, where="g", teacher_dir="t")
  assert "\n" not in str(error.value)
  with pytest.raises(errors.UserError, match="pretrain the generator again"):
    registry.check_generator_identity(None, wanted, where="g", teacher_dir="t")
