"""Representations: PCA against a NumPy SVD, SimCLR (NT-Xent, a few steps), registry, augment.

Images are the embedded digits (28x28x1 uint8). Tolerances: float32 projections of [0, 1]
pixels agree with float64 NumPy to ~1e-4.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import data
from dpkd_jax import representations
from dpkd_jax.representations import augment
from dpkd_jax.representations import pca
from dpkd_jax.representations import simclr


@pytest.fixture(scope="module")
def digits():
  test = data.load("digits", "test")
  return test.images[:120], test.images[120:200]  # "public", "other" images


@pytest.mark.parametrize("whiten,l2_normalize", [(False, False), (True, False), (False, True)])
def test_pca_matches_numpy_svd(digits, whiten, l2_normalize):
  public, other = digits
  config = pca.PCAConfig(num_components=10, whiten=whiten, l2_normalize=l2_normalize)
  rep = representations.fit("pca", public, jax.random.key(0), config)
  x = public.reshape(len(public), -1).astype(np.float64) / 255.0
  mean = x.mean(0)
  _, singular, vt = np.linalg.svd(x - mean, full_matrices=False)
  expected = ((other.reshape(len(other), -1) / 255.0 - mean) @ vt[:10].T)  # (m, 10)
  if whiten:
    expected = expected / (singular[:10] / math.sqrt(len(public)))
  if l2_normalize:
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
  embedded = rep.embed(other)
  chex.assert_shape(embedded, (len(other), 10))
  # Principal axes are defined up to sign: compare column by column with the best sign.
  signs = np.sign(np.sum(embedded * expected, axis=0))
  np.testing.assert_allclose(embedded * signs, expected, atol=2e-3 if whiten else 2e-4)
  assert rep.kind == "pca" and rep.dim == 10 and rep.description["num_fit_images"] == 120


def test_pca_depends_only_on_the_images_it_is_fitted_on(digits):
  public, other = digits
  rep = pca.fit(public, None, pca.PCAConfig(num_components=8))
  again = pca.fit(public.copy(), jax.random.key(9), pca.PCAConfig(num_components=8))
  np.testing.assert_array_equal(rep.embed(other), again.embed(other))  # key unused
  # Embedding is per image: a row does not depend on the other rows or on the batch size.
  np.testing.assert_allclose(rep.embed(other[:7]), rep.embed(other, batch_size=32)[:7],
                             atol=1e-6)
  changed = pca.fit(other, None, pca.PCAConfig(num_components=8))
  assert not np.allclose(np.abs(changed.embed(other)), np.abs(rep.embed(other)), atol=1e-3)


def test_nt_xent_loss_extremes():
  rng = np.random.default_rng(0)
  z = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
  # Identical views far from the others at low temperature: loss -> 0.
  orthogonal = jnp.eye(8, 16)
  np.testing.assert_allclose(simclr.nt_xent_loss(orthogonal, orthogonal, 0.05), 0.0,
                             atol=1e-6)
  # All projections equal: every one of the 2B - 1 candidates is as likely: log(2B - 1).
  same = jnp.ones((8, 16))
  np.testing.assert_allclose(simclr.nt_xent_loss(same, same, 0.5), math.log(15), rtol=1e-5)
  assert np.isfinite(simclr.nt_xent_loss(z, z[::-1], 0.2))


def test_simclr_trains_and_embeds_unit_vectors(digits):
  public, other = digits
  config = simclr.SimCLRConfig(conv_widths=(4,), embedding_dim=8, projection_dim=4, steps=3,
                               batch_size=16)
  rep = representations.fit("simclr", public, jax.random.key(0), config)
  embedded = rep.embed(other, batch_size=64)
  chex.assert_shape(embedded, (len(other), 8))
  np.testing.assert_allclose(np.linalg.norm(embedded, axis=1), 1.0, atol=1e-5)
  assert np.isfinite(rep.description["final_loss"]) and rep.description["num_fit_images"] == 120
  again = representations.fit("simclr", public, jax.random.key(0), config)
  np.testing.assert_allclose(again.embed(other), embedded, atol=1e-5)  # same key, same fit
  other_key = representations.fit("simclr", public, jax.random.key(1), config)
  assert not np.allclose(other_key.embed(other), embedded, atol=1e-3)


def test_registry_rejects_unknown_kind_and_mismatched_config(digits):
  public, _ = digits
  with pytest.raises(ValueError, match="unknown representation 'hog'"):
    representations.fit("hog", public, jax.random.key(0))
  with pytest.raises(ValueError, match="needs a SimCLRConfig"):
    representations.fit("simclr", public, jax.random.key(0), pca.PCAConfig())
  assert set(representations.REPRESENTATIONS) == {"pca", "simclr", "scatternet", "spectral"}
  assert isinstance(representations.default_config("pca"), pca.PCAConfig)


@pytest.mark.parametrize("make", [
    lambda: pca.PCAConfig(num_components=0),
    lambda: pca.PCAConfig(whiten=1),
    lambda: simclr.SimCLRConfig(batch_size=1),
    lambda: simclr.SimCLRConfig(temperature=0.0),
    lambda: simclr.SimCLRConfig(scale_range=(1.2, 0.8)),
    lambda: simclr.SimCLRConfig(conv_widths=[8]),
])
def test_bad_configs_raise(make):
  with pytest.raises(ValueError):
    make()


def test_pca_rejects_more_components_than_images(digits):
  public, _ = digits
  with pytest.raises(ValueError, match="num_components=500 exceeds"):
    pca.fit(public, None, pca.PCAConfig(num_components=500))


def test_random_affine_identity_and_shapes(digits):
  public, _ = digits
  images = jnp.asarray(public[:6], jnp.float32)
  same = augment.random_affine(jax.random.key(0), images, rotation_degrees=0.0,
                               translate_fraction=0.0)
  np.testing.assert_allclose(same, images, atol=1e-3)
  moved = augment.random_affine(jax.random.key(0), images, rotation_degrees=30.0,
                                translate_fraction=0.2, flip=True)
  chex.assert_shape(moved, images.shape)
  chex.assert_type(moved, jnp.float32)
  assert not np.allclose(moved, images)
  photo = augment.random_photometric(jax.random.key(1), images / 255.0)
  assert float(photo.min()) >= 0.0 and float(photo.max()) <= 1.0


def test_scatternet_embeds_unit_vectors_without_fitting_anything(digits):
  from dpkd_jax.representations import scatternet
  public, other_images = digits
  rep = representations.fit("scatternet", public[:3], jax.random.key(0))
  assert rep.kind == "scatternet" and rep.params == {} and rep.dim == 7 * 7 * 81
  images = public[:5]
  emb = rep.embed(images, batch_size=2)
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  other = representations.fit("scatternet", other_images, jax.random.key(1))
  np.testing.assert_allclose(other.embed(images, batch_size=2), emb, rtol=1e-5,
                             atol=1e-6)  # reads no data
  x = jnp.asarray(images, jnp.float32) / 255.0
  # Jitted: eagerly, each of the transform's ops compiled on its own.
  transform = jax.jit(scatternet.transform, static_argnums=1)
  flat = np.log1p(3.0 * np.abs(np.asarray(
      transform(x, scatternet.ScatterNetConfig())))).reshape(5, -1)
  np.testing.assert_allclose(emb, flat / np.linalg.norm(flat, axis=1, keepdims=True),
                             rtol=1e-4, atol=1e-6)
  with pytest.raises(ValueError, match="log_scale"):
    scatternet.ScatterNetEmbeddingConfig(log_scale=0.0)


def test_spectral_embeds_each_image_from_itself_and_the_public_set(digits):
  from dpkd_jax.representations import spectral
  public, other = digits
  config = spectral.SpectralConfig(components=6, graph_neighbours=8, extension_neighbours=4)
  rep = representations.fit("spectral", public, jax.random.key(0), config)
  assert rep.kind == "spectral" and rep.dim == 6 and rep.description["num_fit_images"] == 120
  emb = rep.embed(other)
  chex.assert_shape(emb, (len(other), 6))
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  # The out-of-sample rule, by hand: the mean of the 4 nearest public images' coordinates.
  scatter = representations.fit("scatternet", public, jax.random.key(0))
  distances = ((scatter.embed(other)[:, None] - scatter.embed(public)[None]) ** 2).sum(-1)
  nearest = np.argsort(distances, axis=1)[:, :4]
  expected = np.asarray(rep.params["coordinates"])[nearest].mean(1)
  expected /= np.linalg.norm(expected, axis=1, keepdims=True)
  np.testing.assert_allclose(emb, expected, atol=1e-5)
  # Privacy: a row depends on its own image only (not on the other rows or the batch), so one
  # replaced private record moves one vote. Batches of 40 against the one batch of 80 above
  # (each batch size is one compilation of the ScatterNet program: two sizes, not three).
  np.testing.assert_allclose(rep.embed(other, batch_size=40), emb, atol=1e-6)
  changed = other.copy()
  changed[3:] = 255 - changed[3:]
  np.testing.assert_allclose(rep.embed(changed)[:3], emb[:3], atol=1e-6)
  # The eigenmap is fitted on the public images: different public images, different map.
  moved = representations.fit("spectral", other, jax.random.key(0), config)
  assert not np.allclose(np.abs(moved.embed(other)), np.abs(emb), atol=1e-3)


def test_spectral_rejects_bad_settings(digits):
  from dpkd_jax.representations import spectral
  public, _ = digits
  with pytest.raises(ValueError, match="components"):
    spectral.SpectralConfig(components=0)
  with pytest.raises(ValueError, match="too few"):
    representations.fit("spectral", public[:5], jax.random.key(0),
                        spectral.SpectralConfig(components=6))
