"""GroupNorm written so that XLA CPU fuses its gradient: same values as `nnx.GroupNorm`.

`nnx.GroupNorm` reshapes (B, H, W, C) to (B, H, W, G, C/G) and takes its statistics over
(H, W, C/G). XLA CPU runs those strided reductions, their broadcasts back and the autodiff of
both slowly (measured in docs/PERFORMANCE.md's table, "which kernel pays").

This module computes the same function,

  y = (x − μ_bg) · (rsqrt(σ²_bg + ε) · scale_c) + bias_c,
  μ_bg = E[x],  σ²_bg = max(0, E[x²] − μ²)   (flax's one-pass "fast variance"),

with each expectation over one example's pixels and the C/G channels of group g. It first sums
over the pixels for each (example, channel), a contiguous (B, P, C) → (B, C) reduction. It then
adds the C/G channels of each group on the tiny (B, C) result. The order of operations is flax's,
so values agree to float32 rounding.

The gradient is plain autodiff of this formulation. Its transpose is again a pixel reduction to
(B, C) and a broadcast, and XLA fuses both; it measured faster than a `jax.custom_vjp` with the
closed-form GroupNorm gradient. Autodiff also keeps
forward mode, and it keeps flax's treatment of a clipped variance (no gradient below zero, half
at exactly zero, `jnp.maximum`'s rule).

Per-example gradients stay per-example: every statistic is per example, and under `vmap` each
example is its own batch of one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx


def _channel_sums(x: jax.Array) -> jax.Array:
  """(B, ..., C) → (B, C): the sum over every axis between batch and channels."""
  return jnp.sum(x, axis=tuple(range(1, x.ndim - 1)))


def _group_sums(per_channel: jax.Array, num_groups: int) -> jax.Array:
  """(B, C) → (B, G): sums of the C/G consecutive channels of each group."""
  batch, channels = per_channel.shape
  return per_channel.reshape(batch, num_groups, channels // num_groups).sum(-1)


def _per_channel(per_group: jax.Array, channels: int, ndim: int) -> jax.Array:
  """(B, G) → (B, 1, …, 1, C), broadcastable against a rank-`ndim` input."""
  batch, num_groups = per_group.shape
  expanded = jnp.repeat(per_group, channels // num_groups, axis=1)  # (B, C)
  return expanded.reshape((batch,) + (1,) * (ndim - 2) + (channels,))


# Jitted (inlined by an enclosing jit) so that the op shows as `fast_group_norm` in jaxprs and
# profiles.
@functools.partial(jax.jit, static_argnames=("num_groups", "epsilon"))
def fast_group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, *, num_groups: int,
                    epsilon: float) -> jax.Array:
  """`group_norm` without argument checks; x (B, ..., C), scale and bias (C,)."""
  out_dtype = jnp.result_type(x, scale, bias)
  # Statistics in at least float32, as flax's `_compute_stats`.
  stats_dtype = jnp.promote_types(out_dtype, jnp.float32)
  xs = x.astype(stats_dtype)
  channels, ndim = x.shape[-1], x.ndim
  count = x.size // (x.shape[0] * num_groups)  # elements per group of one example
  mean = _group_sums(_channel_sums(xs), num_groups) / count  # (B, G)
  mean_sq = _group_sums(_channel_sums(jnp.square(xs)), num_groups) / count  # (B, G)
  var = jnp.maximum(0.0, mean_sq - jnp.square(mean))
  # flax's `_normalize`: (x − μ) · (rsqrt(σ² + ε) · scale) + bias.
  multiplier = _per_channel(jax.lax.rsqrt(var + epsilon), channels, ndim) * scale.astype(
      stats_dtype)
  y = (xs - _per_channel(mean, channels, ndim)) * multiplier + bias.astype(stats_dtype)
  return y.astype(out_dtype)


def group_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, *, num_groups: int,
               epsilon: float = 1e-6) -> jax.Array:
  """Group normalisation over all axes but the batch (first) and channel (last) ones.

  Args:
    x: (B, ..., C) floating input; statistics per example and group of C/G channels.
    scale: (C,) multiplier.
    bias: (C,) shift.
    num_groups: G, a divisor of C.
    epsilon: added to the variance.

  Returns:
    (B, ..., C), equal to `nnx.GroupNorm(C, num_groups=G, epsilon=epsilon)` with these
    parameters, to float32 rounding; so are its gradients.

  Raises:
    ValueError: x has fewer than 2 axes, scale/bias do not have shape (C,), or G does not
      divide C.
  """
  if x.ndim < 2:
    raise ValueError(f"x must be (B, ..., C), got shape {x.shape}")
  check_arguments(x.shape[-1], scale, bias, num_groups)
  return fast_group_norm(x, scale, bias, num_groups=int(num_groups), epsilon=float(epsilon))


def check_arguments(channels: int, scale: jax.Array, bias: jax.Array, num_groups: int) -> None:
  """Raises ValueError unless scale and bias are (C,) and G divides C (C = `channels`)."""
  if scale.shape != (channels,) or bias.shape != (channels,):
    raise ValueError(f"scale and bias must have shape ({channels},), got {scale.shape} and "
                     f"{bias.shape}")
  if num_groups < 1 or channels % num_groups:
    raise ValueError(f"num_groups={num_groups} must be a positive divisor of {channels} channels")


def is_plain(layer: nnx.GroupNorm, x: jax.Array) -> bool:
  """Whether `layer` is configured as `classifiers.make_norm` builds it (the covered case)."""
  return (layer.use_scale and layer.use_bias and layer.reduction_axes is None
          and layer.axis_name is None and layer.axis_index_groups is None
          and layer.use_fast_variance and layer.dtype is None and layer.feature_axis == -1
          and x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating))


def apply_group_norm(layer: nnx.GroupNorm, x: jax.Array) -> jax.Array:
  """`layer(x)` through `group_norm` when the layer has the plain configuration.

  The parameters stay the layer's own `scale` and `bias`, so checkpoints are unchanged. Any
  other configuration (custom reduction axes, a mask, a dtype, a mapped axis name, no scale
  or bias, or the two-pass variance) calls `layer(x)` itself.

  Args:
    layer: an `nnx.GroupNorm`.
    x: (B, ..., C) input.

  Returns:
    The normalised (B, ..., C) input.
  """
  if type(layer) is not nnx.GroupNorm or not is_plain(layer, x):
    return layer(x)
  return group_norm(x, layer.scale[...], layer.bias[...], num_groups=layer.num_groups,
                    epsilon=layer.epsilon)
