"""The `Representation` every kind returns: fitted parameters plus one jitted embed function.

A representation is fitted on public images only (`representations.fit`) and then embeds any
images, public or private, with the same frozen parameters. Private data never reaches the
fitting code, so the representation (and the k-means queries computed from it) is public.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
# (params, images (B, H, W, C) uint8) -> (B, d) float32; jitted by the kind that builds it.
EmbedFn = Callable[[PyTree, jax.Array], jax.Array]


def unit_rows(x: jax.Array) -> jax.Array:
  """(..., d) rows scaled to unit L2 norm (an all-zero row stays zero)."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Representation:
  """A fitted image representation.

  Attributes:
    kind: registry name ("pca", "simclr").
    dim: d, the embedding size.
    params: pytree of arrays fitted on the public images.
    embed_fn: jitted `(params, images_uint8) -> (B, d)` float32 embeddings.
    description: JSON-ready summary (kind, config, fit statistics) for results files.
  """

  kind: str
  dim: int
  params: PyTree
  embed_fn: EmbedFn
  description: dict[str, Any]

  def embed(self, images: np.ndarray, *, batch_size: int = 2048) -> np.ndarray:
    """Embeds uint8 images in fixed-size padded batches (one compilation).

    Args:
      images: (N, H, W, C) uint8 images.
      batch_size: rows per call; the last batch is zero-padded and the padding dropped.

    Returns:
      (N, dim) float32 NumPy embeddings.
    """
    if images.ndim != 4:
      raise ValueError(f"images must be (N, H, W, C), got shape {images.shape}")
    if len(images) == 0:
      return np.zeros((0, self.dim), np.float32)
    batch_size = min(batch_size, len(images))
    outputs = []
    for start in range(0, len(images), batch_size):
      chunk = np.asarray(images[start:start + batch_size])
      real = len(chunk)
      if real < batch_size:
        chunk = np.concatenate([chunk, np.zeros((batch_size - real,) + chunk.shape[1:],
                                                chunk.dtype)])
      outputs.append(np.asarray(self.embed_fn(self.params, chunk))[:real])
    return np.concatenate(outputs).astype(np.float32)
