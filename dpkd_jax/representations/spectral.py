"""Laplacian eigenmaps of the public ScatterNet embeddings, extended to any image.

k-means on ScatterNet embeddings mixes classes whose strokes overlap (MNIST 4 / 9, 3 / 5):
the clusters' purity caps reverse k-NN's label accuracy. Clustering the *graph* of the public
images instead (spectral clustering: k-means on the bottom eigenvectors of the normalised
Laplacian of their k-nearest-neighbour graph; Ng, Jordan & Weiss 2001) follows the manifold
of each class and gives purer clusters at small s (docs/RESULTS.md, "Reverse k-NN private labelling").

A Laplacian eigenmap is defined only for the images it was fitted on. Any other image x
(a private record, or a public one) is embedded by the out-of-sample rule

    e(x) = normalise( mean_{j in N_m(x)} u_j ),

where N_m(x) are the m public images nearest to x in the ScatterNet embedding and u_j the
(row-normalised) eigenmap coordinates of public image j. **Privacy:** e(x) is a function of x
and of the public images alone, computed row by row, so replacing one private record changes
that record's embedding only and reverse k-NN's vote sensitivity (2 k) is unchanged. This is
why the eigenmap itself is never refitted on, or solved jointly with, the private records
(umap-style `transform`s couple the rows they embed together).

Eigen-solver: scikit-learn's `SpectralEmbedding` (symmetrised k-NN connectivity graph).
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
from dpkd_jax.representations import scatternet


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpectralConfig:
  """Settings of the spectral representation.

  Attributes:
    base: the ScatterNet embedding whose neighbour graph is embedded.
    components: d, eigenvectors kept (the embedding size).
    graph_neighbours: neighbours per public image in the graph (scikit-learn's n_neighbors).
    extension_neighbours: m, public neighbours averaged by the out-of-sample rule.
  """

  base: scatternet.ScatterNetEmbeddingConfig = scatternet.ScatterNetEmbeddingConfig()
  components: int = 20
  graph_neighbours: int = 10
  extension_neighbours: int = 5

  def __post_init__(self):
    if not isinstance(self.base, scatternet.ScatterNetEmbeddingConfig):
      raise ValueError(f"base must be a ScatterNetEmbeddingConfig, got {self.base!r}")
    config_checks.integer("components", self.components, minimum=1)
    config_checks.integer("graph_neighbours", self.graph_neighbours, minimum=2)
    config_checks.integer("extension_neighbours", self.extension_neighbours, minimum=1)


def _embed(params: dict, images: jax.Array, *, base_embed, neighbours: int) -> jax.Array:
  """(B, H, W, C) uint8 -> (B, d): each row from its own image and the public set only."""
  z = base_embed(params["base"], images)  # (B, D) unit rows
  public = params["public_base"]  # (n, D) unit rows
  # Unit rows: the nearest in Euclidean distance are those of largest inner product.
  _, nearest = jax.lax.top_k(z @ public.T, neighbours)  # (B, m)
  return base.unit_rows(jnp.mean(params["coordinates"][nearest], axis=1))  # (B, d)


def fit(public_images: np.ndarray, key: jax.Array,
        config: SpectralConfig | None = None, *, progress: bool = False) -> base.Representation:
  """Fits the eigenmap on the public images' ScatterNet graph.

  Args:
    public_images: (n, H, W, C) uint8 public images (n > components, n > graph_neighbours
      and n >= extension_neighbours).
    key: a `jax.random.key`; seeds the eigen-solver's start vector (public, no data).
    config: `SpectralConfig` (defaults if None).
    progress: unused (the fit takes seconds).

  Returns:
    A `Representation` of dimension `config.components`.
  """
  del progress
  config = SpectralConfig() if config is None else config
  n = len(public_images)
  if n <= max(config.components, config.graph_neighbours) or n < config.extension_neighbours:
    raise errors.UserError(f"{n} public images are too few for components={config.components}, "
                           f"graph_neighbours={config.graph_neighbours}, "
                           f"extension_neighbours={config.extension_neighbours}")
  scatter = scatternet.fit(public_images, config=config.base)
  public_base = scatter.embed(public_images)  # (n, D)
  seed = int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))
  # Deferred: scikit-learn's manifold module is slow to import and only this kind needs it.
  from sklearn import manifold  # pylint: disable=g-import-not-at-top
  coordinates = manifold.SpectralEmbedding(
      n_components=config.components, affinity="nearest_neighbors",
      n_neighbors=config.graph_neighbours, random_state=seed).fit_transform(public_base)
  params = {"base": scatter.params, "public_base": jnp.asarray(public_base),
            "coordinates": base.unit_rows(jnp.asarray(coordinates, jnp.float32))}
  embed = jax.jit(functools.partial(_embed, base_embed=scatter.embed_fn,
                                    neighbours=config.extension_neighbours))
  return base.Representation(
      kind="spectral", dim=config.components, params=params, embed_fn=embed,
      description={"kind": "spectral", "config": dataclasses.asdict(config),
                   "num_fit_images": n})
