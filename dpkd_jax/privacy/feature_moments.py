"""DP per-channel moments of private feature maps: the statistics of a frozen standardization.

Tramèr & Boneh (2021) standardize ScatterNet features per channel with the training set's mean
and variance, released with noise before DP-SGD starts ("DP batch normalization", frozen).
Here the release is two Gaussian sums:

* each example i gives m_i = its (C,) per-channel spatial mean and s_i = its (C,) per-channel
  spatial mean of squares, clipped to L2 norms C_m and C_s (`clip_to_norm`);
* released: Σ_i m_i + N(0, (z C_m)² I_C) and Σ_i s_i + N(0, (z C_s)² I_C), each divided by
  the public N.

Sensitivity of each sum: C (add/remove one record) or 2C (replace one: m_i moves to m_i',
||m_i − m_i'|| <= 2 C_m). `moments_event` is therefore two Gaussians of noise multiplier z
(add/remove) or z / 2 (replace-one), in the convention of `accounting` (std over the L2
distance of the released values). The mean and variance derived from the sums, the variance
floor and the standardization of any features (training, validation, test) are
post-processing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from dp_accounting import dp_event

from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import validation

# fold_in tags of the two draws (one key per draw).
_MEAN_TAG, _SECOND_MOMENT_TAG = 1, 2


class FeatureMoments(NamedTuple):
  """Released per-channel moments and what standardizing with them needs.

  Attributes:
    mean: (C,) noisy per-channel mean of the features.
    variance: (C,) noisy per-channel variance, floored at `variance_floor`.
    variance_floor: scalar: three noise stds of the second-moment estimate (3 z C_s / N), so
      that a channel whose variance the noise swamps is scaled down, not blown up.
  """

  mean: np.ndarray
  variance: np.ndarray
  variance_floor: float

  def standardize(self, features: np.ndarray) -> np.ndarray:
    """(x − mean) / sqrt(variance) per channel (last axis): post-processing of the release."""
    return ((features - self.mean) / np.sqrt(self.variance)).astype(np.float32)


def clip_to_norm(rows: np.ndarray, clip_norm: float) -> np.ndarray:
  """Each row of (N, C) scaled by min(1, clip_norm / ||row||) (zero rows stay zero)."""
  norms = np.linalg.norm(rows, axis=1, keepdims=True)
  return rows * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))


def dp_feature_moments(key: jax.Array, features: np.ndarray, *, mean_clip_norm: float,
                       second_moment_clip_norm: float,
                       noise_multiplier: float) -> FeatureMoments:
  """Releases the per-channel mean and variance of private features (two Gaussian sums).

  Args:
    key: this release's key (its two draws use fold_in tags 1 and 2).
    features: (N, ..., C) float32 private features (N public, > 0).
    mean_clip_norm, second_moment_clip_norm: C_m, C_s.
    noise_multiplier: z > 0: noise std z C on each coordinate of each sum.

  Returns:
    The released moments (noise std of the mean z C_m / N per channel).
  """
  c_m = validation.check_float("mean_clip_norm", mean_clip_norm, positive=True)
  c_s = validation.check_float("second_moment_clip_norm", second_moment_clip_norm, positive=True)
  z = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  n, channels = len(features), features.shape[-1]
  if n == 0:
    raise ValueError("cannot release the moments of an empty feature set")
  flat = np.asarray(features, np.float64).reshape(n, -1, channels)  # (N, positions, C)
  sums = [clip_to_norm(flat.mean(axis=1), c_m).sum(axis=0),
          clip_to_norm((flat ** 2).mean(axis=1), c_s).sum(axis=0)]
  noisy = [total + z * clip * np.asarray(jax.random.normal(jax.random.fold_in(key, tag),
                                                           (channels,)), np.float64)
           for total, clip, tag in zip(sums, (c_m, c_s), (_MEAN_TAG, _SECOND_MOMENT_TAG))]
  mean, second = noisy[0] / n, noisy[1] / n
  floor = 3.0 * z * c_s / n
  variance = np.maximum(second - mean ** 2, floor)
  return FeatureMoments(mean.astype(np.float32), variance.astype(np.float32), float(floor))


def moments_event(*, noise_multiplier: float, relation: str) -> dp_event.DpEvent:
  """The event of one `dp_feature_moments` release: two Gaussian sums of sensitivity C
  (add/remove: multiplier z) or 2C (replace-one: multiplier z / 2)."""
  z = validation.check_float("noise_multiplier", noise_multiplier, positive=True)
  neighbouring.check_relation(relation)
  per_sum = z if relation == neighbouring.ADD_REMOVE else z / 2.0
  return neighbouring.tag(dp_event.GaussianDpEvent(per_sum), relation, 2)
