"""A small SimCLR encoder (Chen et al. 2020) trained in JAX on public images only.

Two random views of each public image (dm-pix affine + photometric jitter, `augment.py`) go
through a small strided CNN encoder and an MLP projection head; the NT-Xent loss pulls the two
views of an image together and pushes the other 2B - 2 views of the batch away. The embedding
is the encoder output (before the head), L2-normalised, as SimCLR evaluates it. The default
is tiny (two conv layers, a few hundred Adam steps) so that it trains in a few CPU minutes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from dpkd_jax import config_checks
from dpkd_jax import kernels
from dpkd_jax.representations import augment
from dpkd_jax.representations import base

PyTree = Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimCLRConfig:
  """SimCLR settings (defaults: CPU-minutes on 5,000 28x28 images).

  Attributes:
    conv_widths: channels of the stride-2 3x3 conv layers of the encoder.
    embedding_dim: d, width of the encoder output (the representation).
    projection_dim: width of the projection head output (the loss space).
    steps: Adam steps; batch_size: images per step (2 views each).
    learning_rate: Adam learning rate (cosine-decayed); temperature: NT-Xent tau.
    rotation_degrees, translate_fraction, scale_range: affine view augmentation.
    photometric: add brightness/contrast/noise jitter to the views.
    flip: mirror views at random (only for flip-invariant classes).
  """

  conv_widths: tuple[int, ...] = (32, 64)
  embedding_dim: int = 128
  projection_dim: int = 64
  steps: int = 400
  batch_size: int = 256
  learning_rate: float = 2e-3
  temperature: float = 0.2
  rotation_degrees: float = 15.0
  translate_fraction: float = 0.12
  scale_range: tuple[float, float] = (0.8, 1.2)
  photometric: bool = True
  flip: bool = False

  def __post_init__(self):
    if not isinstance(self.conv_widths, tuple) or not self.conv_widths:
      raise ValueError(f"conv_widths must be a non-empty tuple, got {self.conv_widths!r}")
    for width in self.conv_widths:
      config_checks.integer("conv_widths entry", width, minimum=1)
    for name in ("embedding_dim", "projection_dim", "steps"):
      config_checks.integer(name, getattr(self, name), minimum=1)
    config_checks.integer("batch_size", self.batch_size, minimum=2)
    for name in ("learning_rate", "temperature"):
      config_checks.number(name, getattr(self, name), positive=True)
    config_checks.number("rotation_degrees", self.rotation_degrees, positive=False)
    config_checks.number("translate_fraction", self.translate_fraction, positive=False)
    low, high = self.scale_range
    if not 0 < low <= high:
      raise ValueError(f"scale_range must satisfy 0 < low <= high, got {self.scale_range!r}")


class SimCLRNetwork(nnx.Module):
  """Strided conv encoder (3x3, stride 2, ReLU) -> dense embedding; MLP projection head."""

  def __init__(self, *, image_shape: tuple[int, int, int], config: SimCLRConfig,
               rngs: nnx.Rngs):
    height, width, channels = image_shape
    widths = (channels,) + config.conv_widths
    self.convs = nnx.List([nnx.Conv(c_in, c_out, (3, 3), strides=2, padding="SAME", rngs=rngs)
                           for c_in, c_out in zip(widths[:-1], widths[1:])])
    for _ in config.conv_widths:  # SAME padding, stride 2: ceil(x / 2) per layer.
      height, width = -(-height // 2), -(-width // 2)
    self.embed = nnx.Linear(height * width * widths[-1], config.embedding_dim, rngs=rngs)
    self.head_hidden = nnx.Linear(config.embedding_dim, config.embedding_dim, rngs=rngs)
    self.head_out = nnx.Linear(config.embedding_dim, config.projection_dim, rngs=rngs)

  def encode(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C) float images in [0, 1] -> (B, embedding_dim) encoder output."""
    x = x * 2.0 - 1.0  # Centred inputs.
    for conv in self.convs:
      x = jax.nn.relu(conv(x))
    return self.embed(x.reshape(x.shape[0], -1))

  def __call__(self, x: jax.Array) -> jax.Array:
    """(B, H, W, C) -> (B, projection_dim) projections (the NT-Xent space)."""
    return self.head_out(jax.nn.relu(self.head_hidden(jax.nn.relu(self.encode(x)))))


def nt_xent_loss(projections_a: jax.Array, projections_b: jax.Array,
                 temperature: float) -> jax.Array:
  """NT-Xent: mean cross-entropy of each view against its partner among the other 2B - 1.

  Args:
    projections_a: (B, p) projections of the first views.
    projections_b: (B, p) projections of the second views (row i pairs with row i of a).
    temperature: tau > 0.

  Returns:
    () float32 loss.
  """
  batch = projections_a.shape[0]
  z = jnp.concatenate([projections_a, projections_b]).astype(jnp.float32)  # (2B, p)
  z = base.unit_rows(z)
  logits = z @ z.T / temperature  # (2B, 2B) cosine similarities / tau
  logits = jnp.where(jnp.eye(2 * batch, dtype=bool), -jnp.inf, logits)  # no self-pairs
  partners = jnp.concatenate([jnp.arange(batch) + batch, jnp.arange(batch)])  # (2B,)
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, partners))


def _views(key: jax.Array, images: jax.Array, config: SimCLRConfig) -> jax.Array:
  """(B, H, W, C) [0, 1] images -> one random view of each."""
  affine_key, photo_key = jax.random.split(key)
  views = augment.random_affine(affine_key, images, rotation_degrees=config.rotation_degrees,
                                translate_fraction=config.translate_fraction,
                                scale_range=config.scale_range, flip=config.flip)
  if config.photometric:
    views = augment.random_photometric(photo_key, views)
  return views


@kernels.cache_per_ops
def _make_train_step(graphdef: nnx.GraphDef, config: SimCLRConfig):
  """(tx, jitted `(params, opt_state, images, key) -> (params, opt_state, loss)`, donated).

  Cached per (network, config): repeated fits in one process reuse one compilation.
  """
  tx = optax.adam(optax.cosine_decay_schedule(config.learning_rate, config.steps))

  def loss_fn(params: PyTree, batch: jax.Array, key: jax.Array) -> jax.Array:
    key_a, key_b = jax.random.split(key)
    network = nnx.merge(graphdef, params)
    return nt_xent_loss(network(_views(key_a, batch, config)),
                        network(_views(key_b, batch, config)), config.temperature)

  def train_step(params, opt_state, images, key):
    index_key, view_key = jax.random.split(key)
    indices = jax.random.choice(index_key, images.shape[0], (config.batch_size,),
                                replace=False)
    loss, grads = jax.value_and_grad(loss_fn)(params, images[indices], view_key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return tx, jax.jit(train_step, donate_argnums=(0, 1))


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _embed(graphdef: nnx.GraphDef, params: PyTree, images: jax.Array) -> jax.Array:
  """(B, H, W, C) uint8 -> (B, d) L2-normalised encoder outputs."""
  features = nnx.merge(graphdef, params).encode(images.astype(jnp.float32) / 255.0)
  return base.unit_rows(features)


def fit(public_images: np.ndarray, key: jax.Array, config: SimCLRConfig | None = None, *,
        progress: bool = False) -> base.Representation:
  """Trains the SimCLR encoder on public images.

  Args:
    public_images: (n, H, W, C) uint8 public images (the only data this function sees).
    key: a `jax.random.key`; split into the initialisation and training streams.
    config: `SimCLRConfig` (defaults if None).
    progress: show a tqdm bar with the loss.

  Returns:
    A `Representation` of dimension `embedding_dim`.
  """
  config = SimCLRConfig() if config is None else config
  if public_images.ndim != 4:
    raise ValueError(f"public_images must be (n, H, W, C), got shape {public_images.shape}")
  if len(public_images) < config.batch_size:
    raise ValueError(f"{len(public_images)} public images < batch_size={config.batch_size}")
  init_key, train_key = jax.random.split(key)
  network = SimCLRNetwork(image_shape=tuple(public_images.shape[1:]), config=config,
                          rngs=nnx.Rngs(init_key))
  graphdef, state = nnx.split(network, nnx.Param)
  params = nnx.to_pure_dict(state)
  tx, train_step = _make_train_step(graphdef, config)
  opt_state = tx.init(params)
  images = jnp.asarray(public_images, jnp.float32) / 255.0  # (n, H, W, C), on device once
  start, losses = time.time(), []
  bar = tqdm.trange(config.steps, disable=not progress, desc="simclr")
  for step in bar:
    params, opt_state, loss = train_step(params, opt_state, images,
                                         jax.random.fold_in(train_key, step))
    if step % 50 == 0 or step == config.steps - 1:
      losses.append(float(loss))
      bar.set_postfix(loss=f"{losses[-1]:.3f}")
  description = {"kind": "simclr", "config": dataclasses.asdict(config),
                 "num_fit_images": int(len(public_images)),
                 "final_loss": round(losses[-1], 4), "first_loss": round(losses[0], 4),
                 "fit_seconds": round(time.time() - start, 1)}
  return base.Representation(kind="simclr", dim=config.embedding_dim, params=params,
                             embed_fn=functools.partial(_embed, graphdef),
                             description=description)
