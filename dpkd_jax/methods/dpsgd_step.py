"""DP-SGD's step: per-example gradients, then the mechanism of `privacy.dpsgd_mechanism`.

Split from `dpsgd.py` (config, plan, loop). The clipping and the noise (and their
sensitivity) live in `dpkd_jax.privacy.dpsgd_mechanism`; this module only computes the
per-example gradients, lays the mechanism out over devices and applies the update.
Multi-device: auto-sharded `jit(vmap(grad))` over convolutions returned zero per-example
gradients off device 0 (fake CPU devices, JAX 0.10.2), so clipped sums are computed in
`jax.shard_map` over 'data' and `psum`med; the noise is drawn once, after, from a replicated
key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.privacy import validation
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState
from dpkd_jax.methods.dpsgd_config import DPSGDConfig

PyTree = Any


def per_example_gradients(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                          x: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array, PyTree]:
  """Cross-entropy gradients of each example on its own (a batch of one each).

  Args:
    graphdef, params, batch_stats: the model (no BatchNorm: examples must not interact).
    x, labels: (B, H, W, C) normalized float32 images and (B,) int labels.

  Returns:
    losses (B,), logits (B, K), and grads: `params`' pytree with a leading (B,) axis.
  """

  def example_loss(p: PyTree, xi: jax.Array, label: jax.Array):
    out, _ = core.apply(graphdef, p, batch_stats, xi[None], train=True)  # logits (1, K)
    logits = out.logits[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, label), logits

  (losses, logits), grads = jax.vmap(jax.value_and_grad(example_loss, has_aux=True),
                                     in_axes=(None, 0, 0))(params, x, labels)
  return losses, logits, grads


def train_step_fn(config: DPSGDConfig, mesh: Mesh, *, noise_multiplier: float) -> Callable:
  """The pure `train_step(state, images_uint8, labels, mask, noise_key) -> (state, metrics)`.

  `make_train_step` jits it; tests wrap it (`chex.assert_max_traces`) first.

  Args:
    config: gives C, the expected batch size and the dataset normalization.
    mesh: mesh with a 'data' axis; the (M,) batch rows are split over it.
    noise_multiplier: z >= 0 (0 only for tests and clipping-only ablations).

  Returns:
    The step: images (M, H, W, C) uint8, labels (M,) int32, mask (M,) bool (False: padding),
    noise_key a replicated key for this step only. Metrics: loss, accuracy, batch_size,
    clipped_fraction, grad_norm (pre-clip), all noiseless functions of the private batch, so
    NOT covered by ε: `train_dpsgd` writes them only to `private_diagnostics.csv`, and only
    with `log_private_diagnostics=True`.
  """
  noise_multiplier = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  info, clip_norm = config.info, float(config.l2_clip_norm)
  normalizer = float(config.expected_batch_size)
  axis = sharding.DATA_AXIS

  def train_step(state: TrainState, images_uint8: jax.Array, labels: jax.Array,
                 mask: jax.Array, noise_key: jax.Array):

    def device_sums(params, batch_stats, images, labels, mask):
      """Sums over this device's M / devices rows: clipped gradients and metric statistics."""
      # Params arrive invariant over 'data'; grad w.r.t. an invariant input would be psummed
      # implicitly. 'varying' keeps the gradients per device (and per example under vmap).
      params = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
      losses, logits, grads = per_example_gradients(
          state.graphdef, params, batch_stats, data.normalize(images, info), labels)
      grad_sum, norms = dpsgd_mechanism.dpsgd_clip_and_sum(
          grads, mask, l2_clip_norm=clip_norm)  # norms: (m,)
      stats = {"loss": losses, "accuracy": jnp.argmax(logits, -1) == labels,
               "batch_size": mask.astype(jnp.float32), "clipped_fraction": norms > clip_norm,
               "grad_norm": norms}
      stats = {k: jnp.sum(jnp.where(mask, v, 0.0)) for k, v in stats.items()}
      return jax.lax.psum((grad_sum, stats), axis)

    grad_sum, stats = jax.shard_map(
        device_sums, mesh=mesh, in_specs=(P(), P(), P(axis), P(axis), P(axis)),
        out_specs=P())(state.params, state.batch_stats, images_uint8, labels, mask)
    # One N(0, z²C²) draw per coordinate from the replicated key, after the psum: the same
    # noise on every device, independent of the device count.
    release = dpsgd_mechanism.dpsgd_add_noise(noise_key, grad_sum, l2_clip_norm=clip_norm,
                                              noise_multiplier=noise_multiplier)
    grads = jax.tree.map(lambda g: g / normalizer, release.noisy_sum)
    state = state.apply_gradients(grads)
    count = stats["batch_size"]
    return state, {k: v if k == "batch_size" else v / jnp.maximum(count, 1.0)
                   for k, v in stats.items()}

  return train_step


def make_train_step(config: DPSGDConfig, mesh: Mesh, *, noise_multiplier: float) -> Callable:
  """`train_step_fn` jitted: `state` donated, outputs replicated on `mesh` (the layout of the
  input state, so the loop compiles once). Cached per (config, mesh, z), the seed and the
  logging flag left out (keys are step inputs; logging happens outside the step): repeated
  runs in one process (resume, sweeps, tests) reuse the compiled step instead of recompiling
  it."""
  return _make_train_step(dataclasses.replace(config, seed=None, log_private_diagnostics=False),
                          mesh, noise_multiplier)


@functools.cache
def _make_train_step(config: DPSGDConfig, mesh: Mesh, noise_multiplier: float) -> Callable:
  replicated = sharding.replicated(mesh)
  return jax.jit(train_step_fn(config, mesh, noise_multiplier=noise_multiplier),
                 donate_argnums=0, out_shardings=(replicated, replicated))
