"""PCA (optionally whitened, optionally L2-normalised) fitted on public images only.

The fast representation for reverse k-NN labelling: pixels / 255, centred on the public mean,
projected on the top principal axes of the public images (one SVD, seconds on CPU). Whitening
divides each component by its public standard deviation; L2 normalisation then puts every
embedding on the unit sphere, so k-means compares directions (stroke shape) rather than ink.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import config_checks
from dpkd_jax import errors
from dpkd_jax.representations import base

# Added to the whitening std so a (near-)constant direction does not blow up.
_WHITEN_FLOOR = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class PCAConfig:
  """PCA settings.

  Attributes:
    num_components: d, principal axes kept (<= min(num public images, pixels)).
    whiten: divide each component by its standard deviation on the public images.
    l2_normalize: scale every embedding to unit L2 norm (after whitening).
  """

  num_components: int = 50
  whiten: bool = False
  l2_normalize: bool = True

  def __post_init__(self):
    config_checks.integer("num_components", self.num_components, minimum=1)
    for name in ("whiten", "l2_normalize"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


def _flatten(images: jax.Array) -> jax.Array:
  """(B, H, W, C) uint8 -> (B, H W C) float32 in [0, 1]."""
  return images.reshape(images.shape[0], -1).astype(jnp.float32) / 255.0


@functools.partial(jax.jit, static_argnames=("l2_normalize",))
def _embed(params: dict[str, jax.Array], images: jax.Array, *,
           l2_normalize: bool) -> jax.Array:
  """(B, H, W, C) uint8 -> (B, d) float32: centre, project, scale (params hold the whitening)."""
  projected = jnp.matmul(_flatten(images) - params["mean"], params["components"].T,
                         precision=jax.lax.Precision.HIGHEST) / params["scale"]  # (B, d)
  if l2_normalize:
    projected = base.unit_rows(projected)
  return projected


def fit(public_images: np.ndarray, key: jax.Array | None = None,
        config: PCAConfig | None = None, *, progress: bool = False) -> base.Representation:
  """Fits PCA on public images.

  Args:
    public_images: (n, H, W, C) uint8 public images (the only data this function sees).
    key: unused (PCA is deterministic); accepted so every kind has the same signature.
    config: `PCAConfig` (default settings if None).
    progress: unused (one SVD, seconds); accepted so every kind has the same signature.

  Returns:
    A `Representation` of dimension `num_components`.
  """
  del key, progress  # Deterministic and quick: one SVD of the public data.
  config = PCAConfig() if config is None else config
  if public_images.ndim != 4 or len(public_images) < 2:
    raise ValueError(f"need (n >= 2, H, W, C) public images, got shape {public_images.shape}")
  x = _flatten(jnp.asarray(public_images))  # (n, D)
  max_components = min(x.shape)
  if config.num_components > max_components:
    raise errors.UserError(f"num_components={config.num_components} exceeds min(n, pixels) = "
                           f"{max_components} (n = public images)")
  mean = jnp.mean(x, axis=0)  # (D,)
  _, singular_values, right_vectors = jnp.linalg.svd(x - mean, full_matrices=False)
  components = right_vectors[:config.num_components]  # (d, D), rows = principal axes
  stds = singular_values[:config.num_components] / jnp.sqrt(x.shape[0])  # (d,)
  scale = stds + _WHITEN_FLOOR if config.whiten else jnp.ones_like(stds)
  explained = float(jnp.sum(singular_values[:config.num_components]**2) /
                    jnp.sum(singular_values**2))
  params = {"mean": mean, "components": components, "scale": scale}
  description = {"kind": "pca", "config": dataclasses.asdict(config),
                 "num_fit_images": int(x.shape[0]),
                 "explained_variance_fraction": round(explained, 4)}
  return base.Representation(
      kind="pca", dim=config.num_components, params=params,
      embed_fn=functools.partial(_embed, l2_normalize=config.l2_normalize),
      description=description)
