"""DP-SGD's step: per-example gradients, clipping, the sharded clipped sum, one noise draw.

Split from `dpsgd.py` (config, plan, loop). Multi-device: auto-sharded `jit(vmap(grad))` over
convolutions returned zero per-example gradients off device 0 (fake CPU devices, JAX 0.10.2),
so clipped sums are computed in `jax.shard_map` over 'data' and `psum`med; the noise is drawn
once, after, from a replicated key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.flatten_util
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from dpkd_jax import data
from dpkd_jax.models import core
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


def clip_per_example_gradients(per_example_grads: PyTree,
                               l2_clip_norm: float) -> tuple[PyTree, jax.Array]:
  """Scales each example's gradient by min(1, C / ||g_i||), the norm over the whole pytree.

  Args:
    per_example_grads: pytree of (B, ...) arrays.
    l2_clip_norm: C > 0.

  Returns:
    (clipped, norms): clipped grads with every example's norm <= C (float32 rounding aside),
    examples whose gradient is not finite (or whose squared norm overflows) set to zero; and
    the (B,) pre-clip norms.
  """
  leaves = jax.tree.leaves(per_example_grads)
  squared_norms = sum(jnp.sum(jnp.square(g.reshape(g.shape[0], -1)), axis=1) for g in leaves)
  norms = jnp.sqrt(squared_norms)  # (B,); NaN/inf if any entry is, or if the sum overflows
  is_finite = jnp.isfinite(norms)
  # C / max(||g||, C) is exactly 1 below the bound and needs no epsilon at ||g|| = 0.
  scale = jnp.where(is_finite, l2_clip_norm / jnp.maximum(norms, l2_clip_norm), 0.0)  # (B,)

  def clip(g: jax.Array) -> jax.Array:
    expand = (-1,) + (1,) * (g.ndim - 1)
    # `where` before scaling: NaN * 0 would still be NaN.
    return jnp.where(is_finite.reshape(expand), g, 0.0) * scale.reshape(expand).astype(g.dtype)

  return jax.tree.map(clip, per_example_grads), norms


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
  validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  info, clip_norm = config.info, float(config.l2_clip_norm)
  noise_stddev = float(noise_multiplier) * clip_norm
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
      clipped, norms = clip_per_example_gradients(grads, clip_norm)  # norms: (m,)
      weight = mask.astype(jnp.float32)  # (m,): padding rows contribute zero
      grad_sum = jax.tree.map(lambda g: jnp.tensordot(weight, g, axes=1), clipped)
      stats = {"loss": losses, "accuracy": jnp.argmax(logits, -1) == labels,
               "batch_size": weight, "clipped_fraction": norms > clip_norm, "grad_norm": norms}
      stats = {k: jnp.sum(jnp.where(mask, v, 0.0)) for k, v in stats.items()}
      return jax.lax.psum((grad_sum, stats), axis)

    grad_sum, stats = jax.shard_map(
        device_sums, mesh=mesh, in_specs=(P(), P(), P(axis), P(axis), P(axis)),
        out_specs=P())(state.params, state.batch_stats, images_uint8, labels, mask)
    # One N(0, z²C²) draw per coordinate from the replicated key, after the psum: the same
    # noise on every device, independent of the device count. A single flat draw of all D
    # coordinates: one threefry per leaf made XLA CPU compile ~10x slower.
    flat_sum, unravel = jax.flatten_util.ravel_pytree(grad_sum)  # (D,)
    noise = noise_stddev * jax.random.normal(noise_key, flat_sum.shape, flat_sum.dtype)
    grads = unravel((flat_sum + noise) / normalizer)
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
