"""Image representations fitted on public data only, behind one interface.

`fit(kind, public_images, key, config)` returns a `Representation` whose `.embed(images)` maps
any (N, H, W, C) uint8 images to (N, d) float32 embeddings. Kinds (explicit registry):

* "pca": PCA of the public pixels (fast, deterministic; `pca.PCAConfig`).
* "simclr": a small SimCLR encoder trained on the public images (`simclr.SimCLRConfig`).
* "scatternet": log-scaled ScatterNet features (`scatternet.ScatterNetEmbeddingConfig`); a
  fixed transform that reads no data at all.
* "spectral": a Laplacian eigenmap of the public images' ScatterNet neighbour graph, extended
  to any image by its nearest public neighbours (`spectral.SpectralConfig`).

Only public images are passed to `fit`, so the representation, and anything computed from it
and public data alone (e.g. the reverse k-NN queries), is public.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from dpkd_jax.representations import pca
from dpkd_jax.representations import scatternet
from dpkd_jax.representations import simclr
from dpkd_jax.representations import spectral
from dpkd_jax.representations.base import Representation


class RepresentationKind(NamedTuple):
  """A registry entry: the config class and the fitting function of one kind."""

  config_class: type
  fit: Callable[..., Representation]


REPRESENTATIONS: dict[str, RepresentationKind] = {
    "pca": RepresentationKind(pca.PCAConfig, pca.fit),
    "simclr": RepresentationKind(simclr.SimCLRConfig, simclr.fit),
    "scatternet": RepresentationKind(scatternet.ScatterNetEmbeddingConfig, scatternet.fit),
    "spectral": RepresentationKind(spectral.SpectralConfig, spectral.fit),
}


def default_config(kind: str) -> Any:
  """The default config of `kind` (ValueError for an unknown kind)."""
  return _lookup(kind).config_class()


def _lookup(kind: str) -> RepresentationKind:
  if kind not in REPRESENTATIONS:
    raise ValueError(f"unknown representation {kind!r}; known: {sorted(REPRESENTATIONS)}")
  return REPRESENTATIONS[kind]


def fit(kind: str, public_images: np.ndarray, key: jax.Array,
        config: Any | None = None, **kwargs) -> Representation:
  """Fits the representation `kind` on public images.

  Args:
    kind: a key of `REPRESENTATIONS`.
    public_images: (n, H, W, C) uint8 public images.
    key: a `jax.random.key` (unused by deterministic kinds).
    config: that kind's config instance, or None for its defaults.
    **kwargs: extra options of that kind's `fit` (e.g. `progress=True` for "simclr").

  Returns:
    The fitted `Representation`.
  """
  entry = _lookup(kind)
  config = entry.config_class() if config is None else config
  if not isinstance(config, entry.config_class):
    raise ValueError(f"representation {kind!r} needs a {entry.config_class.__name__}, got "
                     f"{type(config).__name__}")
  return entry.fit(public_images, key, config, **kwargs)


__all__ = ["REPRESENTATIONS", "Representation", "RepresentationKind", "default_config", "fit",
           "pca", "scatternet", "simclr", "spectral"]
