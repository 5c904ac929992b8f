"""ScatterNet features: a fixed wavelet scattering transform (Mallat 2012; Oyallon & Mallat 2015).

Tramèr & Boneh (2021, "Differentially private learning needs better features") train DP-SGD
on these features instead of pixels: the transform has no parameters and reads no data, so it
costs no privacy, and a linear model or a small CNN on top learns from far fewer noisy steps
than an end-to-end CNN. Here the transform is kymatio's (its JAX frontend), not a copy of it.

For an (H, W, C) image, scales J and L orientations, the features are (H / 2^J, W / 2^J, C K)
with K = 1 + J L + L² J (J − 1) / 2 coefficients per channel (K = 81 for J = 2, L = 8): the
low-pass average, the first-order wavelet moduli and the second-order ones, each averaged over
2^J × 2^J pixels. Inputs are the normalized images (`data.normalize`), as in the paper's code.
Channel layout: channel c's K coefficients are contiguous (index c K + k), so a GroupNorm with
groups of whole coefficient families is what the paper's normalization does.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import config_checks
from dpkd_jax.data import arrays
from dpkd_jax.data import pipeline
from dpkd_jax.representations import base
from dpkd_jax.train import evaluate


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScatterNetConfig:
  """The scattering transform's settings.

  Attributes:
    scales: J, the number of dyadic scales; the image sides must be multiples of 2^J.
    orientations: L, the number of wavelet orientations.
  """

  scales: int = 2
  orientations: int = 8

  def __post_init__(self):
    config_checks.integer("scales", self.scales, minimum=1)
    config_checks.integer("orientations", self.orientations, minimum=1)

  @property
  def coefficients(self) -> int:
    """K, the coefficients per input channel."""
    j, l = self.scales, self.orientations
    return 1 + j * l + l * l * j * (j - 1) // 2

  def output_shape(self, image_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(H / 2^J, W / 2^J, C K) for an (H, W, C) image; ValueError if 2^J does not divide H, W."""
    height, width, channels = image_shape
    step = 2 ** self.scales
    if height % step or width % step:
      raise ValueError(f"the scattering transform with scales={self.scales} needs image sides "
                       f"that are multiples of {step}, got {height}x{width}")
    return height // step, width // step, channels * self.coefficients


@functools.cache
def _transform(config: ScatterNetConfig, height: int, width: int):
  """kymatio's jitted JAX scattering for (B, H, W) images -> (B, K, H / 2^J, W / 2^J)."""
  # kymatio.jax also imports its 3-D frontend, which needs scipy's removed `sph_harm`: import
  # the 2-D JAX frontend directly.
  from kymatio.scattering2d.frontend.jax_frontend import ScatteringJax2D  # pylint: disable=g-import-not-at-top
  scattering = ScatteringJax2D(J=config.scales, shape=(height, width), L=config.orientations)
  return jax.jit(scattering.scattering)


def transform(x: jax.Array, config: ScatterNetConfig) -> jax.Array:
  """ScatterNet features of normalized images.

  Args:
    x: (B, H, W, C) float32 normalized images.
    config: J and L.

  Returns:
    (B, H / 2^J, W / 2^J, C K) float32 features; channel c's coefficients at c K ... c K + K − 1.
  """
  batch, height, width, channels = x.shape
  out_h, out_w, features = config.output_shape((height, width, channels))
  planes = jnp.moveaxis(x, -1, 1).reshape(batch * channels, height, width)  # (B C, H, W)
  coefficients = _transform(config, height, width)(planes)  # (B C, K, h, w)
  coefficients = coefficients.reshape(batch, features, out_h, out_w)
  return jnp.moveaxis(coefficients, 1, -1)


# Features already computed in this process, by (content hash of the images, info, config):
# the transform reads no data and has no parameters, so the same images always give the same
# features, and a sweep of runs over one dataset (a notebook, the tests) computes them once.
# Least recently used entries go first past `_MEMO_BYTES`; an array larger than it is not kept.
_MEMO_BYTES = 1 << 30
_memo: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()


def clear_memo() -> None:
  """Forgets every memoized feature array (frees their memory)."""
  _memo.clear()


def features(images: np.ndarray, info: arrays.DatasetInfo, config: ScatterNetConfig, *,
             chunk: int = 1000) -> np.ndarray:
  """ScatterNet features of uint8 images, computed in fixed-size chunks on the host's device.

  Memoized per process (`clear_memo`): the same images, dataset and config return the same
  read-only array (copy it to write into it).

  Args:
    images: (N, H, W, C) uint8 images of the dataset `info`.
    info: the dataset (its normalization).
    config: J and L.
    chunk: images per call (the last chunk is zero-padded, so one shape compiles).

  Returns:
    (N, H / 2^J, W / 2^J, C K) float32 features, read-only.
  """
  shape = config.output_shape(tuple(images.shape[1:]))  # the divisibility check, first
  if len(images) == 0:
    return np.zeros((0, *shape), np.float32)
  images = np.ascontiguousarray(images)
  key = (hashlib.sha256(images.data).hexdigest(), images.shape, images.dtype.str, info, config,
         chunk)
  if key in _memo:
    _memo.move_to_end(key)
    return _memo[key]
  out = evaluate.map_padded(
      lambda part: transform(pipeline.normalize(jnp.asarray(part), info), config), images, chunk)
  out = np.asarray(out)
  out.setflags(write=False)
  if out.nbytes <= _MEMO_BYTES:
    _memo[key] = out
    while sum(a.nbytes for a in _memo.values()) > _MEMO_BYTES:
      _memo.popitem(last=False)
  return out


# --- As a representation for clustering (`representations.fit("scatternet", ...)`). ---


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScatterNetEmbeddingConfig:
  """ScatterNet features as a clustering representation (reverse k-NN queries).

  The embedding of an image is log(1 + c |S(x / 255)|), flattened and L2-normalised: the log
  compresses the heavy-tailed second-order coefficients so that k-means compares shapes, not
  ink. Nothing is fitted: the representation reads no data at all.

  Attributes:
    scales, orientations: J and L of the transform.
    log_scale: c.
  """

  scales: int = 2
  orientations: int = 8
  log_scale: float = 3.0

  def __post_init__(self):
    ScatterNetConfig(scales=self.scales, orientations=self.orientations)  # validates J, L
    config_checks.positive(self, "log_scale")


def _embed(params: dict, images: jax.Array, *, config: ScatterNetConfig,
           log_scale: float) -> jax.Array:
  """(B, H, W, C) uint8 -> (B, d) float32 L2-normalised log-scattering embeddings."""
  del params  # nothing fitted
  features = transform(images.astype(jnp.float32) / 255.0, config)  # (B, h, w, C K)
  flat = jnp.log1p(log_scale * jnp.abs(features)).reshape(images.shape[0], -1)
  return base.unit_rows(flat)


def fit(public_images: np.ndarray, key: jax.Array | None = None,
        config: ScatterNetEmbeddingConfig | None = None, *, progress: bool = False):
  """The ScatterNet representation: nothing is fitted (the images only fix the shape).

  Args:
    public_images: (n, H, W, C) uint8 images (only their shape is read).
    key, progress: unused; accepted so every kind has the same signature.
    config: `ScatterNetEmbeddingConfig` (defaults if None).

  Returns:
    A `Representation` of dimension (H / 2^J)(W / 2^J) C K.
  """
  del key, progress
  config = ScatterNetEmbeddingConfig() if config is None else config
  if public_images.ndim != 4:
    raise ValueError(f"need (n, H, W, C) images, got shape {public_images.shape}")
  transform_config = ScatterNetConfig(scales=config.scales, orientations=config.orientations)
  out_h, out_w, features = transform_config.output_shape(tuple(public_images.shape[1:]))
  embed = jax.jit(functools.partial(_embed, config=transform_config,
                                    log_scale=float(config.log_scale)))
  return base.Representation(
      kind="scatternet", dim=out_h * out_w * features, params={}, embed_fn=embed,
      description={"kind": "scatternet", "config": dataclasses.asdict(config),
                   "num_fit_images": 0})
