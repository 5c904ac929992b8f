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

Privacy (unit: replace one record of the private training set; records x, x' after clipping):
  * S: ||x~ x~^T - x~' x~'^T||_F^2 = ||x~||^4 + ||x~'||^4 - 2 (x~.x~')^2 <= 2 (R^2 + c^2)^2, and
    the released upper triangle has at most the Frobenius norm: L2 sensitivity
    sqrt(2) (R^2 + c^2). Noise std `pca_noise_multiplier` times that per entry.
  * k-means step: the released vector is (sums (k, m), R_y * counts (k,)). If x and x' fall in
    different clusters the change has squared norm <= R_y^2 + R_y^2 + 2 R_y^2; in the same
    cluster <= (2 R_y)^2. Sensitivity 2 R_y; noise std z_km * 2 R_y on sums, z_km * 2 on counts.
  * variances: per-cluster sums of squared clipped residuals r (entries >= 0, sum r_j^2 <= R_v^2):
    the change has squared norm <= sum a_j^2 + sum b_j^2 <= 2 R_v^4 in either case: sensitivity
    sqrt(2) R_v^2.
  The centroids used by a step are earlier releases (post-processing), so the releases compose
  adaptively: `query_model_event` = Gaussian(z_pca) + kmeans_iterations x Gaussian(z_km) +
  Gaussian(z_var), each noise multiplier = noise std / L2 sensitivity. The data size n is
  treated as public (replace-one relation).

Every function is pure and takes a `jax.random.key`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from dp_accounting import dp_event

from dpkd_jax.privacy import validation

# Streams of the fit key, stream i = fold_in(key, i) (= split(key, n)[i] for any n, so a
# stream appended here leaves the others unchanged). One purpose each: "redraw" feeds the
# data-independent re-draws of dead centroids, which must never share a key with the noise of
# the Lloyd releases ("kmeans"); they did when the re-draw took fold_in(key_t, 1), which IS
# split(key_t)[1], the key of the count noise.
_FIT_STREAMS = ("moment", "init", "kmeans", "variance", "redraw")
# The two draws of one Lloyd release, `fold_in(key, tag)` (the values split(key) gave).
_SUMS_TAG, _COUNTS_TAG = 0, 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueryModelConfig:
  """The DP query model. Lengths are L2 norms of images with pixels in [0, 1].

  Attributes:
    num_components: m, principal axes kept.
    num_clusters: k, mixture components.
    kmeans_iterations: T, noisy Lloyd steps (each one Gaussian release).
    l2_norm_bound: R, clip of each flattened image before the second moment.
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
  l2_norm_bound: float = 12.0
  constant: float = 1.0
  projection_bound: float = 8.0
  residual_bound: float = 6.0
  pca_noise_multiplier: float = 2.0
  kmeans_noise_multiplier: float = 4.0
  variance_noise_multiplier: float = 3.0
  min_count: float = 20.0
  temperature: float = 1.0

  def __post_init__(self):
    for name in ("num_components", "num_clusters", "kmeans_iterations"):
      validation.check_int(name, getattr(self, name), minimum=1)
    for name in ("l2_norm_bound", "constant", "projection_bound", "residual_bound",
                 "temperature"):
      validation.check_float(name, getattr(self, name), positive=True)
    for name in ("pca_noise_multiplier", "kmeans_noise_multiplier",
                 "variance_noise_multiplier", "min_count"):
      validation.check_float(name, getattr(self, name), positive=False)

  @property
  def moment_sensitivity(self) -> float:
    return float(np.sqrt(2.0) * (self.l2_norm_bound ** 2 + self.constant ** 2))

  @property
  def kmeans_sensitivity(self) -> float:
    return 2.0 * self.projection_bound

  @property
  def variance_sensitivity(self) -> float:
    return float(np.sqrt(2.0) * self.residual_bound ** 2)


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


def _clip_rows(x: jax.Array, bound: float) -> jax.Array:
  """Scales each row of (N, d) x to L2 norm <= bound."""
  norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
  return x * jnp.minimum(1.0, bound / jnp.maximum(norms, 1e-12))


def noisy_second_moment(key: jax.Array, x: jax.Array, noise_std: float) -> jax.Array:
  """Analyze Gauss: sum_i x_i x_i^T + E with E symmetric, its upper triangle i.i.d. N(0, std²).

  Args:
    key: a `jax.random.key`, used once.
    x: (N, d) rows (already clipped by the caller).
    noise_std: std of each upper-triangle entry.

  Returns:
    (d, d) symmetric noisy second moment.
  """
  d = x.shape[-1]
  moment = jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST)  # (d, d)
  upper = jnp.triu(jax.random.normal(key, (d, d), jnp.float32))
  noise = upper + jnp.triu(upper, 1).T  # each unordered pair drawn once
  return moment + noise_std * noise


def _assign(y: jax.Array, centroids: jax.Array) -> jax.Array:
  """(N,) index of the nearest centroid of each row of y (N, m)."""
  d2 = (jnp.sum(y * y, -1, keepdims=True) - 2 * y @ centroids.T
        + jnp.sum(centroids * centroids, -1)[None])  # (N, k)
  return jnp.argmin(d2, axis=-1)


def noisy_cluster_sums(key: jax.Array, y: jax.Array, centroids: jax.Array, *,
                       noise_multiplier: float, bound: float) -> tuple[jax.Array, jax.Array]:
  """One DP Lloyd release: per-cluster sums of y (rows of norm <= bound) and counts, noised.

  Args:
    key: a `jax.random.key`; the sums' noise uses fold_in(key, 0), the counts' fold_in(key, 1).
    y: (N, m) rows clipped to L2 norm <= bound.
    centroids: (k, m) current (public) centroids.
    noise_multiplier: z; noise std z * 2 bound on sums, z * 2 on counts.
    bound: R_y.

  Returns:
    (noisy sums (k, m), noisy counts (k,)).
  """
  k = centroids.shape[0]
  onehot = jax.nn.one_hot(_assign(y, centroids), k, dtype=jnp.float32)  # (N, k)
  sums = onehot.T @ y  # (k, m)
  counts = onehot.sum(0)  # (k,)
  key_s, key_c = jax.random.fold_in(key, _SUMS_TAG), jax.random.fold_in(key, _COUNTS_TAG)
  sums = sums + noise_multiplier * 2 * bound * jax.random.normal(key_s, sums.shape)
  counts = counts + noise_multiplier * 2 * jax.random.normal(key_c, counts.shape)
  return sums, counts


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
  x = _clip_rows(jnp.asarray(images.reshape(n, dim), jnp.float32) / 255.0,
                 config.l2_norm_bound)  # (N, D)
  extended = jnp.concatenate([x, jnp.full((n, 1), config.constant, jnp.float32)], -1)
  moment = noisy_second_moment(keys["moment"], extended,
                               config.pca_noise_multiplier * config.moment_sensitivity)
  mean = moment[:dim, dim] / (n * config.constant)  # (D,)
  covariance = moment[:dim, :dim] / n - jnp.outer(mean, mean)
  eigvals, eigvecs = jnp.linalg.eigh(covariance)  # ascending
  components = eigvecs[:, ::-1][:, :m]  # (D, m)
  spread = jnp.sqrt(jnp.maximum(eigvals[::-1][:m], 1e-6))  # (m,) std along each axis
  y = _clip_rows((x - mean) @ components, config.projection_bound)  # (N, m)

  def draw(key, num):  # data-independent draws from the DP Gaussian fit (init / re-draw)
    return 0.7 * spread * jax.random.normal(key, (num, m))

  centroids = draw(keys["init"], k)
  counts = jnp.zeros((k,))
  for t in range(config.kmeans_iterations):
    key_t = jax.random.fold_in(keys["kmeans"], t)
    sums, counts = noisy_cluster_sums(key_t, y, centroids,
                                      noise_multiplier=config.kmeans_noise_multiplier,
                                      bound=config.projection_bound)
    alive = counts >= max(config.min_count, 1.0)
    redraw = draw(jax.random.fold_in(keys["redraw"], t), k)
    centroids = jnp.where(alive[:, None], sums / jnp.maximum(counts, 1.0)[:, None], redraw)
  # Variances around the final centroids; clusters re-drawn in the last step get counts 0.
  counts = jnp.where(counts >= max(config.min_count, 1.0), counts, 0.0)
  onehot = jax.nn.one_hot(_assign(y, centroids), k, dtype=jnp.float32)  # (N, k)
  residual = _clip_rows(y - onehot @ centroids, config.residual_bound)  # (N, m)
  squares = onehot.T @ (residual ** 2)  # (k, m)
  squares = squares + (config.variance_noise_multiplier * config.variance_sensitivity
                       * jax.random.normal(keys["variance"], squares.shape))
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
