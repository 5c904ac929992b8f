"""DP-SGD's Gaussian mechanism: per-example clipping, the clipped sum, one N(0, z²C²) draw.

The mechanism is split in two so that it runs inside `jax.shard_map`: `dpsgd_clip_and_sum`
on each device's rows (its partial sums are then `psum`med by the caller), `dpsgd_add_noise`
once on the summed tree, from a key replicated on every device (the same noise everywhere,
independent of the device count). `dpsgd_gaussian_mechanism` is the two in a row on one
device.

Sensitivity of the clipped sum sum_i mask_i clip_C(g_i) (every clipped example has L2 norm
<= C, padding rows have mask 0):
* add or remove one record (the DP-SGD literature's relation): L2 sensitivity C;
* replace one record (the relation of the comparison tables): one example moves from g to
  g', ||clip(g) - clip(g')|| <= 2C.
The noise is N(0, z²C²) on every coordinate under both. The accounting event is
`accounting.dpsgd_event(noise_multiplier=z, sampling_rate=q, steps=T, relation=...)` with the
SAME z under both relations: with Poisson sampling the relation decides how dp_accounting
evaluates the sampled Gaussian (REPLACE_ONE: its own PLD of the mixture pair), not a
rescaled noise multiplier. So `DPSGDRelease.accounting_noise_multiplier` is std / C.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp

from dpkd_jax.privacy import validation

PyTree = Any


class DPSGDRelease(NamedTuple):
  """The noisy clipped sum of one DP-SGD step and the numbers an accountant needs.

  Attributes:
    noisy_sum: the gradients' pytree (no batch axis): clipped sum + N(0, z²C²) noise.
    noise_stddev: scalar, z C, the std of every coordinate's noise.
    add_remove_sensitivity: scalar, C (L2, add or remove one record).
    replace_one_sensitivity: scalar, 2C (L2, replace one record).
  """

  noisy_sum: PyTree
  noise_stddev: jax.Array
  add_remove_sensitivity: jax.Array
  replace_one_sensitivity: jax.Array

  @property
  def accounting_noise_multiplier(self) -> jax.Array:
    """z = std / C: the `noise_multiplier` of `dpsgd_event` under either relation."""
    return self.noise_stddev / self.add_remove_sensitivity


def clip_per_example_gradients(per_example_grads: PyTree,
                               l2_clip_norm: float) -> tuple[PyTree, jax.Array]:
  """Scales each example's gradient by min(1, C / ||g_i||), the norm over the whole pytree.

  Args:
    per_example_grads: pytree of (B, ...) arrays.
    l2_clip_norm: C > 0 (may be traced: not validated here).

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


def dpsgd_clip_and_sum(per_example_grads: PyTree, mask: jax.Array, *,
                       l2_clip_norm: float) -> tuple[PyTree, jax.Array]:
  """The noiseless half: sum over the rows with mask True of the clipped gradients.

  Runs per device inside `shard_map` (the caller `psum`s the partial sums), or on the whole
  batch. Every row contributes at most C in L2, padding rows nothing.

  Args:
    per_example_grads: pytree of (B, ...) arrays, one row per example.
    mask: (B,) bool, False for padding rows.
    l2_clip_norm: C > 0.

  Returns:
    (clipped_sum, norms): the pytree of the sums (no batch axis) and the (B,) pre-clip norms
    (noiseless functions of the private batch: diagnostics only, never released).
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  clipped, norms = clip_per_example_gradients(per_example_grads, l2_clip_norm)
  weight = mask.astype(jnp.float32)  # (B,): padding rows contribute zero
  return jax.tree.map(lambda g: jnp.tensordot(weight, g, axes=1), clipped), norms


def dpsgd_add_noise(key: jax.Array, clipped_sum: PyTree, *, l2_clip_norm: float,
                    noise_multiplier: float) -> DPSGDRelease:
  """The noisy half: one N(0, z²C²) draw per coordinate of the (summed) clipped gradients.

  A single flat draw of all D coordinates (one threefry per leaf made XLA CPU compile ~10x
  slower); on several devices `key` must be replicated, so every device adds the same noise.

  Args:
    key: a `jax.random.key`, used once.
    clipped_sum: the pytree of `dpsgd_clip_and_sum` (after the `psum` when sharded).
    l2_clip_norm: C > 0.
    noise_multiplier: z >= 0 (0 only for tests and clipping-only ablations: no privacy).

  Returns:
    `DPSGDRelease` with `noisy_sum` (the pytree of `clipped_sum`), std z C, sensitivities C
    (add/remove) and 2C (replace-one).
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  noise_stddev = noise_multiplier * l2_clip_norm
  flat_sum, unravel = jax.flatten_util.ravel_pytree(clipped_sum)  # (D,)
  noise = noise_stddev * jax.random.normal(key, flat_sum.shape, flat_sum.dtype)
  return DPSGDRelease(
      noisy_sum=unravel(flat_sum + noise),
      noise_stddev=jnp.asarray(noise_stddev, flat_sum.dtype),
      add_remove_sensitivity=jnp.asarray(l2_clip_norm, flat_sum.dtype),
      replace_one_sensitivity=jnp.asarray(2 * l2_clip_norm, flat_sum.dtype))


def dpsgd_gaussian_mechanism(key: jax.Array, per_example_grads: PyTree, mask: jax.Array, *,
                    l2_clip_norm: float, noise_multiplier: float) -> DPSGDRelease:
  """`dpsgd_clip_and_sum` then `dpsgd_add_noise`, on one device (module docstring).

  Args:
    key: a `jax.random.key`, used once.
    per_example_grads: pytree of (B, ...) arrays.
    mask: (B,) bool, False for padding rows.
    l2_clip_norm: C > 0.
    noise_multiplier: z >= 0.

  Returns:
    `DPSGDRelease`; account with `dpsgd_event(noise_multiplier=z, ...)`.
  """
  clipped_sum, _ = dpsgd_clip_and_sum(per_example_grads, mask, l2_clip_norm=l2_clip_norm)
  return dpsgd_add_noise(key, clipped_sum, l2_clip_norm=l2_clip_norm,
                         noise_multiplier=noise_multiplier)
