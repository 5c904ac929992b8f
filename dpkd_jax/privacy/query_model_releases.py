"""The three Gaussian releases of data-free PATE's DP query model (DP-PCA + DP k-means).

`methods/dfpate/query_model.py` fits a mixture model of the private images for drawing
queries; every value it computes from the private rows and releases crosses one function
here, which clips the rows and adds the noise:

1. `second_moment_release` (Analyze Gauss): rows x clipped to L2 norm R, extended by a
   constant coordinate c; the noisy upper triangle of S = sum x~ x~^T (mirrored).
2. `noisy_cluster_sums` (one DP Lloyd step): projections y clipped to R_y; per-cluster sums
   of y and counts, noised.
3. `noisy_cluster_variances`: residuals y - centroid clipped to R_v; per-cluster sums of
   their squares, noised.

Sensitivity (replace one record of the private set, x -> x' after clipping; the data size n
is public). The centroids a release is given are earlier releases (post-processing), so the
releases compose adaptively; each one's accountant noise multiplier is std / L2 sensitivity:
  * S: ||x~ x~^T - x~' x~'^T||_F^2 = ||x~||^4 + ||x~'||^4 - 2 (x~.x~')^2 <= 2 (R^2 + c^2)^2,
    and the released upper triangle has at most the Frobenius norm: sqrt(2) (R^2 + c^2).
  * k-means step: the released vector is (sums (k, m), R_y * counts (k,)). In different
    clusters the change has squared norm <= R_y^2 + R_y^2 + 2 R_y^2, in the same cluster
    <= (2 R_y)^2: sensitivity 2 R_y; noise std z 2 R_y on sums, z 2 on counts.
  * variances: per-cluster sums of squared clipped residuals r (entries >= 0,
    sum r_j^2 <= R_v^2): the change has squared norm <= sum a_j^2 + sum b_j^2 <= 2 R_v^4 in
    either case: sensitivity sqrt(2) R_v^2.

Key tags: `noisy_cluster_sums` draws the sums' noise from fold_in(key, 0) and the counts'
from fold_in(key, 1) (the values split(key) gave); the two other releases use their key once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax.privacy import validation

# The two draws of one Lloyd release, `fold_in(key, tag)`.
_SUMS_TAG, _COUNTS_TAG = 0, 1


def _check(noise_multiplier: float, **bounds: float) -> None:
  validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  for name, value in bounds.items():
    validation.check_float(name, value, positive=True)


def second_moment_sensitivity(l2_clip_norm: float, constant: float) -> float:
  """sqrt(2) (R^2 + c^2): replace-one L2 sensitivity of `second_moment_release`."""
  return float(np.sqrt(2.0) * (l2_clip_norm ** 2 + constant ** 2))


def kmeans_sensitivity(projection_bound: float) -> float:
  """2 R_y: replace-one L2 sensitivity of (sums, R_y * counts) of `noisy_cluster_sums`."""
  return 2.0 * projection_bound


def variance_sensitivity(residual_bound: float) -> float:
  """sqrt(2) R_v^2: replace-one L2 sensitivity of `noisy_cluster_variances`."""
  return float(np.sqrt(2.0) * residual_bound ** 2)


def clip_rows_to_norm(x: jax.Array, bound: float) -> jax.Array:
  """Scales each row of (N, d) x to L2 norm <= bound (the clip of every release here).

  Public so that the query model can repeat a release's clip bit for bit on the same rows
  (the projection is computed from the clipped images); it releases nothing.
  """
  norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
  return x * jnp.minimum(1.0, bound / jnp.maximum(norms, 1e-12))


def assign_clusters(y: jax.Array, centroids: jax.Array) -> jax.Array:
  """(N,) index of the nearest centroid of each row of y (N, m); centroids (k, m)."""
  d2 = (jnp.sum(y * y, -1, keepdims=True) - 2 * y @ centroids.T
        + jnp.sum(centroids * centroids, -1)[None])  # (N, k)
  return jnp.argmin(d2, axis=-1)


def noisy_second_moment(key: jax.Array, x: jax.Array, noise_std: float) -> jax.Array:
  """Analyze Gauss on given rows: sum_i x_i x_i^T + E, E symmetric, upper triangle N(0, std²).

  The noise step of `second_moment_release`; it does not clip (the sensitivity is the
  caller's: use `second_moment_release` on private data).

  Args:
    key: a `jax.random.key`, used once.
    x: (N, d) rows.
    noise_std: std of each upper-triangle entry.

  Returns:
    (d, d) symmetric noisy second moment.
  """
  d = x.shape[-1]
  moment = jnp.matmul(x.T, x, precision=jax.lax.Precision.HIGHEST)  # (d, d)
  upper = jnp.triu(jax.random.normal(key, (d, d), jnp.float32))
  noise = upper + jnp.triu(upper, 1).T  # each unordered pair drawn once
  return moment + noise_std * noise


def second_moment_release(key: jax.Array, rows: jax.Array, *,
                          l2_clip_norm: float | None = None, constant: float,
                          noise_multiplier: float,
                          l2_norm_bound: float | None = None) -> jax.Array:
  """DP second moment of the rows clipped to norm R and extended by c (Analyze Gauss).

  Replace-one L2 sensitivity sqrt(2) (R^2 + c^2) (`second_moment_sensitivity`); noise std
  z times that on every upper-triangle entry: one `GaussianDpEvent(z)`.

  Args:
    key: a `jax.random.key`, used once.
    rows: (N, D) private rows (e.g. flattened images in [0, 1]).
    l2_clip_norm: R > 0.
    constant: c > 0; S[:D, D] / c is the noisy sum of the clipped rows.
    noise_multiplier: z >= 0.
    l2_norm_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    (D + 1, D + 1) symmetric noisy S = sum [x, c] [x, c]^T.
  """
  l2_clip_norm = validation.renamed_keyword(
      "second_moment_release", new="l2_clip_norm", new_value=l2_clip_norm, old="l2_norm_bound",
      old_value=l2_norm_bound)
  _check(noise_multiplier, l2_clip_norm=l2_clip_norm, constant=constant)
  n = rows.shape[0]
  x = clip_rows_to_norm(rows, l2_clip_norm)  # (N, D)
  extended = jnp.concatenate([x, jnp.full((n, 1), constant, jnp.float32)], -1)
  return noisy_second_moment(
      key, extended, noise_multiplier * second_moment_sensitivity(l2_clip_norm, constant))


def noisy_cluster_sums(key: jax.Array, y: jax.Array, centroids: jax.Array, *,
                       noise_multiplier: float, bound: float) -> tuple[jax.Array, jax.Array]:
  """One DP Lloyd release: per-cluster sums of y clipped to `bound` and counts, noised.

  Replace-one L2 sensitivity of (sums, bound * counts): 2 bound (`kmeans_sensitivity`);
  one `GaussianDpEvent(z)`.

  Args:
    key: a `jax.random.key`; the sums' noise uses fold_in(key, 0), the counts' fold_in(key, 1).
    y: (N, m) private rows, clipped here to L2 norm <= bound.
    centroids: (k, m) current (public) centroids.
    noise_multiplier: z; noise std z * 2 bound on sums, z * 2 on counts.
    bound: R_y > 0.

  Returns:
    (noisy sums (k, m), noisy counts (k,)).
  """
  _check(noise_multiplier, bound=bound)
  y = clip_rows_to_norm(y, bound)
  k = centroids.shape[0]
  onehot = jax.nn.one_hot(assign_clusters(y, centroids), k, dtype=jnp.float32)  # (N, k)
  sums = onehot.T @ y  # (k, m)
  counts = onehot.sum(0)  # (k,)
  key_s, key_c = jax.random.fold_in(key, _SUMS_TAG), jax.random.fold_in(key, _COUNTS_TAG)
  sums = sums + noise_multiplier * 2 * bound * jax.random.normal(key_s, sums.shape)
  counts = counts + noise_multiplier * 2 * jax.random.normal(key_c, counts.shape)
  return sums, counts


def noisy_cluster_variances(key: jax.Array, y: jax.Array, centroids: jax.Array, *,
                            noise_multiplier: float, projection_bound: float,
                            residual_bound: float) -> jax.Array:
  """DP per-cluster sums of squared residuals around the (public) centroids.

  Rows are clipped to `projection_bound` (as in `noisy_cluster_sums`) and assigned to their
  nearest centroid; each residual is clipped to `residual_bound` R_v. Replace-one L2
  sensitivity sqrt(2) R_v^2 (`variance_sensitivity`); one `GaussianDpEvent(z)`.

  Args:
    key: a `jax.random.key`, used once.
    y: (N, m) private rows.
    centroids: (k, m) released centroids.
    noise_multiplier: z >= 0.
    projection_bound: R_y > 0.
    residual_bound: R_v > 0.

  Returns:
    (k, m) noisy sums of squared clipped residuals (may be negative: noise).
  """
  _check(noise_multiplier, projection_bound=projection_bound, residual_bound=residual_bound)
  y = clip_rows_to_norm(y, projection_bound)
  onehot = jax.nn.one_hot(assign_clusters(y, centroids), centroids.shape[0],
                          dtype=jnp.float32)  # (N, k)
  residual = clip_rows_to_norm(y - onehot @ centroids, residual_bound)  # (N, m)
  squares = onehot.T @ (residual ** 2)  # (k, m)
  return squares + (noise_multiplier * variance_sensitivity(residual_bound)
                    * jax.random.normal(key, squares.shape))
