"""A DP query model for data-free PATE: DP-PCA + DP k-means mixture of the private images.

Procedural queries (`data.procedural`) know only the image shape; the student trained on
their answers stays far from the teachers' own accuracy (docs/RESULTS.md: 0.78 vs 0.93 on
MNIST). This module spends a small, accounted part of the budget on an *unlabelled* summary
of the private images and draws queries near their distribution instead:

1. DP second moment (Analyze Gauss). Each record x in [0, 1]^D is clipped to L2 norm R and
   extended by a constant coordinate c: x~ = [x, c]. One Gaussian release of the upper
   triangle of S = sum x~ x~^T gives both the sum of x (last column / c) and sum x x^T, hence
   the mean mu and covariance; the top-m eigenvectors V (D, m) are post-processing.
2. DP k-means in the centred projection y = clip_{R_y}(V^T (x - mu)): `kmeans_iterations`
   Lloyd steps, each releasing per-cluster sums of y and counts with Gaussian noise.
3. DP per-cluster variances: sums of clip_{R_v}(y - centroid)^2 per cluster, one release.

Queries are then y = centroid_c + sqrt(var_c) * N(0, I) for a cluster c drawn in proportion
to its noisy count, mapped back to pixels (mu + V y, clipped to [0, 1]): post-processing.

Privacy (unit: replace one record of the private training set): each of the three kinds of
release, with its clipping, noise and L2 sensitivity, is a mechanism of
`dpkd_jax.privacy.query_model_releases` (`second_moment_release`, `noisy_cluster_sums`,
`noisy_cluster_variances`); this module only projects, re-draws dead centroids and samples
(post-processing of earlier releases). The releases compose adaptively:
`query_model_event` = Gaussian(z_pca) + kmeans_iterations x Gaussian(z_km) + Gaussian(z_var),
each noise multiplier = noise std / L2 sensitivity. The data size n is treated as public
(replace-one relation).

Every function is pure and takes a `jax.random.key`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from dp_accounting import dp_event

from dpkd_jax import config_checks as checks
from dpkd_jax.privacy import query_model_releases as releases

# Streams of the fit key, stream i = fold_in(key, i) (= split(key, n)[i] for any n, so a
# stream appended here leaves the others unchanged). One purpose each: "redraw" feeds the
# data-independent re-draws of dead centroids, which must never share a key with the noise of
# the Lloyd releases ("kmeans"); they did when the re-draw took fold_in(key_t, 1), which IS
# split(key_t)[1], the key of the count noise.
_FIT_STREAMS = ("moment", "init", "kmeans", "variance", "redraw")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueryModelConfig:
  """The DP query model. Lengths are L2 norms of images with pixels in [0, 1].

  Attributes:
    num_components: m, principal axes kept.
    num_clusters: k, mixture components.
    kmeans_iterations: T, noisy Lloyd steps (each one Gaussian release).
    l2_clip_norm: R, clip of each flattened image before the second moment.
    constant: c, the appended coordinate that carries the sum of the images.
    projection_bound: R_y, clip of each centred projection in k-means.
    residual_bound: R_v, clip of each residual in the variance release.
    pca_noise_multiplier, kmeans_noise_multiplier, variance_noise_multiplier: z of the three
      kinds of release (noise std / L2 sensitivity); 0 = no noise (ε = ∞, a baseline).
    min_count: clusters whose noisy count is below this are re-drawn (k-means) and never
      sampled.
    temperature: scales the per-cluster standard deviation when sampling.
  """

  num_components: int = 20
  num_clusters: int = 40
  kmeans_iterations: int = 5
  l2_clip_norm: float = 12.0
  constant: float = 1.0
  projection_bound: float = 8.0
  residual_bound: float = 6.0
  pca_noise_multiplier: float = 2.0
  kmeans_noise_multiplier: float = 4.0
  variance_noise_multiplier: float = 3.0
  min_count: float = 20.0
  temperature: float = 1.0

  def __post_init__(self):
    checks.integers(self, "num_components", "num_clusters", "kmeans_iterations")
    checks.positive(self, "l2_clip_norm", "constant", "projection_bound", "residual_bound",
                    "temperature")
    checks.non_negative(self, "pca_noise_multiplier", "kmeans_noise_multiplier",
                        "variance_noise_multiplier", "min_count")

  @property
  def moment_sensitivity(self) -> float:
    return releases.second_moment_sensitivity(self.l2_clip_norm, self.constant)

  @property
  def kmeans_sensitivity(self) -> float:
    return releases.kmeans_sensitivity(self.projection_bound)

  @property
  def variance_sensitivity(self) -> float:
    return releases.variance_sensitivity(self.residual_bound)


class QueryModel(NamedTuple):
  """The released model (public once fitted: every field is a DP release or derived from one).

  Attributes:
    mean: (D,) pixel mean.
    components: (D, m) orthonormal principal axes.
    centroids: (k, m) cluster centres in the projection.
    counts: (k,) noisy cluster sizes (sampling weights; <= min_count means unused).
    variances: (k, m) per-cluster variances in the projection (>= 0).
  """

  mean: jax.Array
  components: jax.Array
  centroids: jax.Array
  counts: jax.Array
  variances: jax.Array


def query_model_event(config: QueryModelConfig) -> dp_event.DpEvent:
  """The composed Gaussian releases of `fit_query_model` (module docstring)."""
  zs = [config.pca_noise_multiplier]
  zs += [config.kmeans_noise_multiplier] * config.kmeans_iterations
  zs += [config.variance_noise_multiplier]
  if min(zs) == 0:
    return dp_event.NonPrivateDpEvent()
  return dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(z) for z in zs])


def fit_query_model(key: jax.Array, images: np.ndarray,
                    config: QueryModelConfig) -> QueryModel:
  """Fits the DP query model on private images (the only function here that sees them).

  Args:
    key: a `jax.random.key` (split into named streams inside).
    images: (N, H, W, C) uint8 private training images.
    config: the model and its noise (accounting: `query_model_event(config)`).

  Returns:
    The released `QueryModel`.
  """
  if images.ndim != 4 or images.dtype != np.uint8 or len(images) < 2:
    raise ValueError(f"images must be (N >= 2, H, W, C) uint8, got {images.shape} {images.dtype}")
  dim = int(np.prod(images.shape[1:]))
  m, k = config.num_components, config.num_clusters
  if m > dim:
    raise ValueError(f"num_components={m} exceeds the {dim} pixels of an image")
  keys = dict(zip(_FIT_STREAMS, jax.random.split(key, len(_FIT_STREAMS))))
  n = len(images)  # public under replace-one
  rows = jnp.asarray(images.reshape(n, dim), jnp.float32) / 255.0  # (N, D)
  moment = releases.second_moment_release(
      keys["moment"], rows, l2_clip_norm=config.l2_clip_norm, constant=config.constant,
      noise_multiplier=config.pca_noise_multiplier)  # (D + 1, D + 1)
  mean = moment[:dim, dim] / (n * config.constant)  # (D,)
  covariance = moment[:dim, :dim] / n - jnp.outer(mean, mean)
  eigvals, eigvecs = jnp.linalg.eigh(covariance)  # ascending
  components = eigvecs[:, ::-1][:, :m]  # (D, m)
  spread = jnp.sqrt(jnp.maximum(eigvals[::-1][:m], 1e-6))  # (m,) std along each axis
  # The release's own clip of the rows, repeated (same rows, same op: the same values).
  x = releases.clip_rows_to_norm(rows, config.l2_clip_norm)  # (N, D)
  y = (x - mean) @ components  # (N, m); the releases below clip it to projection_bound

  def draw(key, num):  # data-independent draws from the DP Gaussian fit (init / re-draw)
    return 0.7 * spread * jax.random.normal(key, (num, m))

  centroids = draw(keys["init"], k)
  counts = jnp.zeros((k,))
  for t in range(config.kmeans_iterations):
    key_t = jax.random.fold_in(keys["kmeans"], t)
    sums, counts = releases.noisy_cluster_sums(key_t, y, centroids,
                                               noise_multiplier=config.kmeans_noise_multiplier,
                                               bound=config.projection_bound)
    alive = counts >= max(config.min_count, 1.0)
    redraw = draw(jax.random.fold_in(keys["redraw"], t), k)
    centroids = jnp.where(alive[:, None], sums / jnp.maximum(counts, 1.0)[:, None], redraw)
  # Variances around the final centroids; clusters re-drawn in the last step get counts 0.
  counts = jnp.where(counts >= max(config.min_count, 1.0), counts, 0.0)
  squares = releases.noisy_cluster_variances(
      keys["variance"], y, centroids, noise_multiplier=config.variance_noise_multiplier,
      projection_bound=config.projection_bound, residual_bound=config.residual_bound)
  variances = jnp.maximum(squares / jnp.maximum(counts, 1.0)[:, None], 0.0)
  return QueryModel(mean, components, centroids, counts, variances)


def sample_queries(key: jax.Array, model: QueryModel, num: int, image_shape: tuple[int, ...],
                   *, temperature: float = 1.0) -> np.ndarray:
  """Draws query images from the released model (post-processing; costs no privacy).

  Args:
    key: a `jax.random.key`.
    model: a fitted `QueryModel` with at least one cluster of positive count.
    num: number of images.
    image_shape: (H, W, C).
    temperature: multiplies each cluster's standard deviation.

  Returns:
    (num, H, W, C) uint8 images.
  """
  weights = np.asarray(model.counts, np.float64)
  if not (weights > 0).any():
    raise ValueError("the query model has no cluster with a positive noisy count")
  key_c, key_z = jax.random.split(key)
  cluster = jax.random.choice(key_c, len(weights), (num,), p=jnp.asarray(weights / weights.sum()))
  y = model.centroids[cluster] + temperature * jnp.sqrt(model.variances[cluster]) * (
      jax.random.normal(key_z, (num, model.centroids.shape[-1])))  # (num, m)
  pixels = jnp.clip(model.mean + y @ model.components.T, 0.0, 1.0)  # (num, D)
  return np.asarray(jnp.round(pixels * 255.0), np.uint8).reshape(num, *image_shape)
