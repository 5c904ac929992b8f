"""Tests of the DAFL generator in `dpkd_jax.models.generators`."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax.models import core, generators
# Shared with the classifier tests; a candidate for a conftest.py fixture.
from test_classifiers import apply_jit, fill_surrogate

LATENT_DIM = 16
BATCH = 8

def abstract_generator(image_shape, **kwargs):
  return core.split(nnx.eval_shape(lambda: generators.DAFLGenerator(
      image_shape=image_shape, rngs=nnx.Rngs(jax.random.key(0)), **kwargs)))


@functools.lru_cache(maxsize=None)  # tests only read the arrays: build each model once
def generator_parts(image_shape):
  """A small generator (c = 16) with deterministic surrogate parameters."""
  return fill_surrogate(abstract_generator(image_shape, latent_dim=LATENT_DIM, base_channels=16))


def latents(batch=BATCH, seed=1):
  return jax.random.normal(jax.random.key(seed), (batch, LATENT_DIM))


@pytest.mark.parametrize("image_shape", [(28, 28, 1), (32, 32, 3), (8, 12, 2)])
@pytest.mark.parametrize("train", [False, True])
def test_output_shape_and_finite(image_shape, train):
  parts = generator_parts(image_shape)
  images, _ = apply_jit(parts.graphdef, parts.params, parts.batch_stats, latents(), train=train)
  chex.assert_shape(images, (BATCH, *image_shape))
  chex.assert_tree_all_finite(images)


def test_train_output_is_batch_standardised_tanh():
  """In training the last, affine-free BatchNorm standardises each channel of the batch."""
  parts = generator_parts((32, 32, 3))
  images, _ = apply_jit(parts.graphdef, parts.params, parts.batch_stats, latents(), train=True)
  mean = images.mean(axis=(0, 1, 2))
  var = images.var(axis=(0, 1, 2))
  chex.assert_trees_all_close(mean, jnp.zeros(3), atol=1e-4)
  # var / (var + 1e-5) of the tanh output: within 1% of 1 unless tanh's variance is < 1e-3.
  chex.assert_trees_all_close(var, jnp.ones(3), atol=1e-2)


def test_eval_output_at_init_stays_in_tanh_range():
  """Fresh running stats (mean 0, var 1) leave tanh's (-1, 1) range intact in eval mode."""
  parts = generator_parts((28, 28, 1))
  images, _ = apply_jit(parts.graphdef, parts.params, parts.batch_stats, latents(), train=False)
  assert float(jnp.abs(images).max()) < 1.0


def test_output_norm_has_statistics_but_no_parameters():
  parts = generator_parts((28, 28, 1))
  assert "output_norm" not in parts.params
  chex.assert_shape([parts.batch_stats["output_norm"]["mean"],
                     parts.batch_stats["output_norm"]["var"]], (1,))
  # The DAFL structure: dense to (H/4·W/4·c), then c, c/2 and C output channels.
  chex.assert_shape(parts.params["project"]["kernel"], (LATENT_DIM, 7 * 7 * 16))
  chex.assert_shape(parts.params["conv1"]["kernel"], (3, 3, 16, 16))
  chex.assert_shape(parts.params["conv2"]["kernel"], (3, 3, 16, 8))
  chex.assert_shape(parts.params["conv_out"]["kernel"], (3, 3, 8, 1))


def test_train_updates_batch_stats_and_eval_keeps_them():
  parts = generator_parts((28, 28, 1))
  _, train_stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, latents(),
                             train=True)
  _, eval_stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, latents(),
                            train=False)
  chex.assert_trees_all_equal_structs(train_stats, parts.batch_stats)
  for old, new in zip(jax.tree_util.tree_leaves(parts.batch_stats),
                      jax.tree_util.tree_leaves(train_stats)):
    assert not jnp.allclose(old, new)
  chex.assert_trees_all_equal(eval_stats, parts.batch_stats)


def test_default_width_is_dafls():
  params = abstract_generator((32, 32, 3)).params
  chex.assert_shape(params["project"]["kernel"], (100, 8 * 8 * 128))
  chex.assert_shape(params["conv2"]["kernel"], (3, 3, 128, 64))


@pytest.mark.parametrize("kwargs, match", [
    ({"image_shape": (30, 30, 1)}, "divisible by 4"),
    ({"image_shape": (28, 28)}, "image_shape"),
    ({"image_shape": (28, 28, 1), "latent_dim": 0}, "latent_dim"),
    ({"image_shape": (28, 28, 1), "base_channels": 15}, "base_channels"),
])
def test_bad_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    generators.DAFLGenerator(rngs=nnx.Rngs(jax.random.key(0)), **kwargs)


def test_wrong_latent_size_raises():
  parts = generator_parts((28, 28, 1))
  with pytest.raises(ValueError, match="z must have shape"):
    core.apply(parts.graphdef, parts.params, parts.batch_stats,
               jnp.zeros((2, LATENT_DIM + 1)), train=False)


def test_class_coded_latents_put_a_scaled_one_hot_first():
  z = jax.random.normal(jax.random.key(0), (3, 12))
  coded = generators.class_coded_latents(z, jnp.array([0, 2, 1]), 3)
  np.testing.assert_allclose(coded[:, :3], np.sqrt(3) * np.eye(3)[[0, 2, 1]])
  np.testing.assert_array_equal(coded[:, 3:], z[:, 3:])
  with pytest.raises(ValueError, match="must exceed num_classes 3"):
    generators.class_coded_latents(z[:, :3], jnp.array([0, 1, 2]), 3)
