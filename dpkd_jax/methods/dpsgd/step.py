"""DP-SGD's step and state: per-example gradients, the mechanism, the optax update.

The clipping and the noise (and their sensitivity) live in `dpkd_jax.privacy`: the clipped sum
is one call of the drop-in `privacy.clipped_grad` (`vmap(grad)` + `dpsgd_clip_and_sum`), the
noise `dpsgd_mechanism.dpsgd_add_noise`; this module only gives the per-example loss, lays the
mechanism out over devices and applies the update. `clipping="ghost"` builds the same drop-in
by `models.ghost.clipped_grad` (`ghost_clipped_sum`): the same clipped sum and norms (to float
rounding) without a (B, num_params) array; the noise and its σ are unchanged. z, C and
the normaliser B come from the `DPSGDPlan` (the object whose `event` the ledger charges), never
from the config. `param_averaging` wraps the optimizer so that its state keeps an average of the
iterates (`param_averaging_decay`), which `released_parts` gives for evaluation and release.
Multi-device: auto-sharded `jit(vmap(grad))` over convolutions returned zero per-example
gradients off device 0 (fake CPU devices, JAX 0.10.2), so clipped sums are computed in
`jax.shard_map` over 'data' and `psum`med; the noise is drawn once, after, from a replicated
key.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from dpkd_jax import data
from dpkd_jax import kernels
from dpkd_jax import models
from dpkd_jax.models import core
from dpkd_jax.models import ghost
from dpkd_jax.privacy import clipped_sums
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.train import sharding
from dpkd_jax.train.averaging import param_averaging
from dpkd_jax.train.state import TrainState
from dpkd_jax.methods.dpsgd.config import DPSGDConfig
from dpkd_jax.methods.dpsgd.privacy import DPSGDPlan

PyTree = Any


def _cross_entropy(output: core.ClassifierOutput, label: jax.Array) -> jax.Array:
  """One example's loss from its (unbatched) output: logits (K,), label ()."""
  return optax.softmax_cross_entropy_with_integer_labels(output.logits, label)


def _example_loss(graphdef: nnx.GraphDef, batch_stats: PyTree, augmult: bool) -> Callable:
  """`loss(params, x_i, label_i) -> (loss, logits (K,))` of one example, x_i (H, W, C) run as a
  batch of one; with `augmult`, x_i is (V, H, W, C) and the loss the mean of its V views'
  (each a batch of one), so its gradient is the mean of theirs, before any clipping."""

  def view_loss(p: PyTree, xi: jax.Array, label: jax.Array):
    out, _ = core.apply(graphdef, p, batch_stats, xi[None], train=True)  # logits (1, K)
    logits = out.logits[0]
    return optax.softmax_cross_entropy_with_integer_labels(logits, label), logits

  def views_loss(p: PyTree, xi: jax.Array, label: jax.Array):
    losses, logits = jax.vmap(view_loss, in_axes=(None, 0, None))(p, xi, label)  # (V,), (V, K)
    return jnp.mean(losses), logits[0]

  return views_loss if augmult else view_loss


def per_example_gradients(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                          x: jax.Array, labels: jax.Array, *,
                          augmult: bool = False) -> tuple[jax.Array, jax.Array, PyTree]:
  """Cross-entropy gradients of each example on its own (a batch of one each).

  Args:
    graphdef, params, batch_stats: the model (no BatchNorm: examples must not interact).
    x, labels: (B, H, W, C) normalized float32 inputs and (B,) int labels; with `augmult`,
      x is (B, V, H, W, C): V views of each example (`augmult.py`).
    augmult: an example's loss is the mean of its V views' losses (each view a batch of one),
      so its gradient is the mean of the views' gradients, before any clipping.

  Returns:
    losses (B,), logits (B, K) (view 0's with `augmult`), and grads: `params`' pytree with a
    leading (B,) axis.
  """
  (losses, logits), grads = jax.vmap(
      jax.value_and_grad(_example_loss(graphdef, batch_stats, augmult), has_aux=True),
      in_axes=(None, 0, 0))(params, x, labels)
  return losses, logits, grads


def clipped_sum(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree, x: jax.Array,
                labels: jax.Array, mask: jax.Array, *, l2_clip_norm: float, clipping: str,
                augmult: bool = False) -> tuple[PyTree, jax.Array, jax.Array, jax.Array]:
  """Σ_i mask_i clip_C(∇ loss_i) over a batch: one call of the drop-in `privacy.clipped_grad`,
  by per-example gradients or by ghost clipping.

  Args:
    graphdef, params, batch_stats: the model (no BatchNorm).
    x, labels, mask: (B, H, W, C) normalized images, (B,) int labels, (B,) bool (False: padding).
    l2_clip_norm: C.
    clipping: "vmap" (`vmap(grad)` + `dpsgd_mechanism.dpsgd_clip_and_sum`) or "ghost"
      (`models.ghost.clipped_grad`: `ghost_clipped_sum` without the Gram form, equal to float
      rounding); both are a `privacy.ClippedGrad` of the same sensitivity.
    augmult: x is (B, V, H, W, C) and each example's gradient is the mean over its V views
      (`_example_loss`), clipped as one: "vmap" only.

  Returns:
    (clipped sum: `params`' pytree, norms (B,) pre-clip, losses (B,), logits (B, K)).
  """
  if clipping == "ghost" and augmult:
    raise ValueError("augmult averages the views' gradients before clipping: clipping='vmap' only")
  if clipping == "ghost":
    # No Gram (ghost-norm) form: its rounding grows with cancellation inside an example, so a
    # clipped contribution could exceed C by more than float rounding (`privacy.ghost_clipping`);
    # the rank-1 and per-layer forms keep every contribution <= C as on the vmap path.
    clipped = ghost.clipped_grad(graphdef, loss_fn=_cross_entropy, l2_clip_norm=l2_clip_norm,
                                 batch_stats=batch_stats, train=True, has_aux=True,
                                 return_norms=True)
  elif clipping == "vmap":
    example_loss = _example_loss(graphdef, batch_stats, augmult)

    def loss_with_aux(p: PyTree, xi: jax.Array, label: jax.Array):
      loss, logits = example_loss(p, xi, label)
      return loss, (loss, logits)  # aux per example: (loss, logits), as the ghost path's

    clipped = clipped_sums.clipped_grad(loss_with_aux, l2_clip_norm=l2_clip_norm,
                                        batch_argnums=(1, 2), keep_batch_dim=False,
                                        has_aux=True, return_norms=True)
  else:
    raise ValueError(f"clipping must be 'vmap' or 'ghost', got {clipping!r}")
  grad_sum, (losses, outputs), norms = clipped(params, x, labels, mask=mask)
  return grad_sum, norms, losses, outputs.logits if clipping == "ghost" else outputs


def build_train_step(plan: DPSGDPlan, info: data.DatasetInfo, mesh: Mesh, *,
                     clipping: str = "vmap", augmult: bool = False) -> Callable:
  """The pure `train_step(state, inputs, labels, mask, noise_key) -> (state, metrics)`.

  `make_train_step` jits it; tests wrap it (`chex.assert_max_traces`) first.

  Args:
    plan: gives z (>= 0; 0 only for tests and clipping-only ablations), C and the expected
      batch size B (the normaliser of the noisy sum).
    info: the dataset, for the normalization of the uint8 images.
    mesh: mesh with a 'data' axis; the (M,) batch rows are split over it.
    clipping: "vmap" or "ghost" (`DPSGDConfig.clipping`): how each device's clipped sum is
      computed (`clipped_sum`); the noise is the same.
    augmult: the inputs hold V views of each example, whose gradients are averaged before
      clipping (`DPSGDConfig.augmented`); the noise is the same.

  Returns:
    The step: inputs (M, H, W, C) uint8 images or float32 features (`data.model_inputs`),
    (M, V, H, W, C) float32 features with `augmult`,
    labels (M,) int32, mask (M,) bool (False: padding),
    noise_key a replicated key for this step only. Metrics: loss, accuracy, batch_size,
    clipped_fraction, grad_norm (pre-clip), all noiseless functions of the private batch, so
    NOT covered by ε: `train_dpsgd` writes them only to `private_diagnostics.csv`, and only
    with `log_private_diagnostics=True`.
  """
  noise_multiplier, clip_norm = plan.noise_multiplier, plan.l2_clip_norm
  normalizer = float(plan.expected_batch_size)
  axis = sharding.DATA_AXIS

  def train_step(state: TrainState, images_uint8: jax.Array, labels: jax.Array,
                 mask: jax.Array, noise_key: jax.Array):

    def device_sums(params, batch_stats, images, labels, mask):
      """Sums over this device's M / devices rows: clipped gradients and metric statistics."""
      # Params arrive invariant over 'data'; grad w.r.t. an invariant input would be psummed
      # implicitly. 'varying' keeps the gradients per device (and per example under vmap).
      params = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
      grad_sum, norms, losses, logits = clipped_sum(  # norms, losses: (m,)
          state.graphdef, params, batch_stats, data.model_inputs(images, info), labels, mask,
          l2_clip_norm=clip_norm, clipping=clipping, augmult=augmult)
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


def make_train_step(plan: DPSGDPlan, info: data.DatasetInfo, mesh: Mesh, *,
                    clipping: str = "vmap", augmult: bool = False) -> Callable:
  """`build_train_step` jitted: `state` donated, outputs replicated on `mesh` (the layout of
  the input state, so the loop compiles once). Cached per (plan, dataset, mesh, clipping,
  augmult): keys
  are step inputs and logging happens outside the step, so repeated runs in one process
  (resume, sweeps, tests) reuse the compiled step instead of recompiling it."""
  return _jitted_train_step(plan, info, mesh, clipping, augmult)


@kernels.cache_per_ops
def _jitted_train_step(plan: DPSGDPlan, info: data.DatasetInfo, mesh: Mesh,
                       clipping: str, augmult: bool) -> Callable:
  # Positional `clipping`, `augmult`: a call with and one without clipping="vmap" (or
  # augmult=False) share the cache entry.
  replicated = sharding.replicated(mesh)
  return jax.jit(build_train_step(plan, info, mesh, clipping=clipping, augmult=augmult),
                 donate_argnums=0, out_shardings=(replicated, replicated))


make_train_step.cache_clear = _jitted_train_step.cache_clear  # type: ignore[attr-defined]


def make_optimizer(config: DPSGDConfig, total_steps: int | None = None
                   ) -> optax.GradientTransformation:
  """SGD (optional momentum) or Adam at `learning_rate`, constant or cosine-decayed to 0 over
  `total_steps` (`lr_schedule`), wrapped in `param_averaging` when `param_averaging_decay` > 0:
  all post-processing of the noisy gradient."""
  if config.lr_schedule == "cosine" and total_steps is None:
    raise ValueError("lr_schedule='cosine' decays over the run: give total_steps (the plan's T)")
  tx = _optimizer(config.optimizer, config.learning_rate, config.momentum, config.lr_schedule,
                  total_steps if config.lr_schedule == "cosine" else None)
  if not config.param_averaging_decay:
    return tx  # no wrapper: the state, the checkpoint and the step of a run without averaging
  return _averaged(tx, config.param_averaging_decay, config.param_averaging_start_step)


@functools.cache
def _optimizer(name: str, learning_rate: float, momentum: float, schedule: str = "constant",
               total_steps: int | None = None) -> optax.GradientTransformation:
  # One object per setting: TrainState's static `tx` is compared by identity under jit, so
  # repeated runs in one process (resume, sweeps, tests) then reuse the compiled step.
  rate = (learning_rate if schedule == "constant"
          else optax.cosine_decay_schedule(learning_rate, decay_steps=max(total_steps, 1)))
  if name == "adam":
    return optax.adam(rate)
  return optax.sgd(rate, momentum=momentum or None)


@functools.cache
def _averaged(inner: optax.GradientTransformation, decay: float,
              start_step: int) -> optax.GradientTransformation:
  return param_averaging(inner, decay, start_step=start_step)  # one object, as `_optimizer`


def init_model(config: DPSGDConfig, key: jax.Array) -> core.ModelParts:
  """The config's classifier, initialised from `key` and split."""
  return core.split(models.create_classifier(
      config.model, num_classes=config.info.num_classes, input_shape=config.input_shape,
      norm=config.norm, rngs=nnx.Rngs(key)))


def init_state(config: DPSGDConfig, key: jax.Array, *,
               total_steps: int | None = None) -> TrainState:
  """A fresh training state: the model initialised from `key` and the config's optimizer
  (`total_steps`, the plan's T, is needed by a cosine schedule)."""
  return TrainState.create(init_model(config, key), make_optimizer(config, total_steps))
