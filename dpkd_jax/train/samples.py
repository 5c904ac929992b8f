"""Synthetic samples of a trained generator: batched generation and a PNG grid (process 0).

Shared by the data-free methods (DPDFD, SRR, DF-PATE): post-processing of released models or
public queries, so nothing here touches private data.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax.models import generators
from dpkd_jax.train import distributed
from dpkd_jax.train.state import TrainState


def generate(gen: TrainState, key: jax.Array, num: int, latent_dim: int,
             *, batch_size: int = 500, class_codes: int = 0) -> np.ndarray:
  """(num, H, W, C) normalized synthetic images from the generator (eval-mode BatchNorm).

  `class_codes` = K > 0: a class-conditional generator (`generators.class_coded_latents`);
  image i is asked for class i mod K. Each chunk draws min(batch_size, num) latents: with JAX's
  partitionable threefry a shorter draw is the prefix of the longer one, and eval-mode images do
  not depend on their batch, so a small `num` gets the same images without generating a full
  batch to throw most of it away (equal up to float rounding, which may depend on the batch)."""
  batch_size = min(batch_size, num)
  fn = jax.jit(lambda p, s, z: core.apply(gen.graphdef, p, s, z, train=False)[0])
  # Host copies: each process evaluates locally (multi-host: the trained params are global).
  params, batch_stats = distributed.to_host((gen.params, gen.batch_stats))
  out = []
  for i, start in enumerate(range(0, num, batch_size)):
    z = jax.random.normal(jax.random.fold_in(key, i), (batch_size, latent_dim))
    if class_codes:
      z = generators.class_coded_latents(z, (start + np.arange(batch_size)) % class_codes,
                                         class_codes)
    out.append(np.asarray(fn(params, batch_stats, z))[:num - start])
  return np.concatenate(out)


def save_sample_grid(images: np.ndarray, info: data.DatasetInfo, path: str, *, cols: int = 8) -> None:
  """Writes a PNG grid of normalized images (rows of `cols`); process 0 only."""
  if not distributed.is_coordinator():
    return
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  pixels = np.asarray(data.denormalize(images, info))  # (N, H, W, C) in [0, 1]
  n, h, w, c = pixels.shape
  rows = math.ceil(n / cols)
  grid = np.ones((rows * (h + 2), cols * (w + 2), c), np.float32)
  for i in range(n):
    r, q = divmod(i, cols)
    grid[r * (h + 2) + 1:r * (h + 2) + 1 + h, q * (w + 2) + 1:q * (w + 2) + 1 + w] = pixels[i]
  plt.imsave(path, grid[..., 0] if c == 1 else grid, cmap="gray" if c == 1 else None)
