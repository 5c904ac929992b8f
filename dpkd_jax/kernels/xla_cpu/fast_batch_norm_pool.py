"""BatchNorm (batch statistics) → ReLU → 2×2 max-pool as one differentiable op: equal to the
three layers in turn, `nnx.BatchNorm` in training mode included.

The BatchNorm counterpart of `fast_norm_pool` (GroupNorm), built the same way and from its
pieces: the forward pass takes the per-channel sums of x and x² over the batch and the pixels,
then normalises, rectifies and pools the four strided (B, H/2, W/2, C) views of the 2×2
windows elementwise (`fast_norm_pool.window_pass`), keeping only the pooled map, the int8 code
of the position the gradient is routed to and x − μ there. The code and x − μ are written out
by a conditional of their own (`materialise_residuals`): here nothing else forces them out,
and XLA fused the whole window walk into the input gradient's full-map pass, recomputing it
for each of a window's four pixels, which made the op slower than the three layers. The
backward pass runs
BatchNorm's two gradient reductions (Σ dz and Σ dz·(x − μ) per channel) on the pooled map,
where the cotangents are, and the input gradient is one elementwise pass over the full map,
dx = m·dz + α + β·(x − μ), with α and β per channel here (per example and group there).

**Statistics.** The op also returns the batch mean and (clipped) variance, (C,), which
`nnx.BatchNorm` folds into its running averages; `apply` updates the layer's `mean` and `var`
exactly as flax does. Their cotangents (zero unless a caller differentiates the statistics)
enter α and β: ∂μ/∂x = 1/n and ∂σ²/∂x = 2·(x − μ)/n (n = B·H·W), clipped as σ² is.

**Equality.** Forward values use flax's one-pass variance, σ² = max(0, E[x²] − μ²), and its
`(x − μ)·(rsqrt(σ² + ε)·scale) + bias`; the sums are taken in another order than flax's
`mean` over three axes, so values and gradients agree to float32 rounding. The pool's routing
(ties, NaN) and the ReLU's derivative are `fast_norm_pool`'s, hence `fast_pool`'s.

**Batch coupling.** BatchNorm statistics mix the examples of a batch; under `vmap` each
mapped example is its own batch, as it is for `nnx.BatchNorm`.

Reverse mode only (a `jax.custom_vjp`), like `fast_norm_pool`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax.kernels.xla_cpu import fast_norm_pool


def _statistics(x: jax.Array, scale: jax.Array, epsilon: float):
  """Per-channel mean, raw variance E[x²] − μ², rsqrt(σ² + ε) and multiplier
  m = rsqrt(σ² + ε)·scale, each (C,), over the (B, H, W) axes of x."""
  count = x.size // x.shape[-1]  # n = B·H·W elements per channel
  mean = jnp.sum(x, axis=(0, 1, 2)) / count
  mean_sq = jnp.sum(jnp.square(x), axis=(0, 1, 2)) / count
  raw_var = mean_sq - jnp.square(mean)
  rstd = jax.lax.rsqrt(jnp.maximum(0.0, raw_var) + epsilon)
  return mean, raw_var, rstd, rstd * scale


def _forward(x, scale, bias, epsilon):
  """(pooled (B, Ho, Wo, C), batch mean (C,), batch variance (C,)) and `_backward`'s
  residuals."""
  mean, raw_var, rstd, multiplier = _statistics(x, scale, epsilon)
  pooled, code, centred_at = fast_norm_pool.window_pass(x, mean, multiplier, bias, scale[0],
                                                        materialise_residuals=True)
  outputs = (pooled, mean, jnp.maximum(0.0, raw_var))
  return outputs, (x, code, centred_at, mean, raw_var, rstd, multiplier, scale)


def _backward(epsilon, residuals, cotangents):
  del epsilon  # only through rstd
  x, code, centred_at, mean, raw_var, rstd, multiplier, scale = residuals
  g, g_mean, g_var = cotangents
  count = x.size // x.shape[-1]
  # Σ dz and Σ dz·(x − μ) per channel, (C,).
  dz, dz_sum, dz_centred_sum = fast_norm_pool.routed_sums(code, g, centred_at, (0, 1, 2))
  d_scale = rstd * dz_centred_sum
  # Through μ: (g_μ − m·Σ dz)/n. Through σ² (clipped at 0): dσ² = g_σ² − ½·rstd³·scale·Σ dz·(x − μ),
  # and ∂σ²/∂x = 2·(x − μ)/n.
  alpha = (g_mean - multiplier * dz_sum) / count
  d_var = g_var - 0.5 * rstd ** 3 * scale * dz_centred_sum
  beta = 2.0 * fast_norm_pool.variance_clip(raw_var) * d_var / count
  dx = fast_norm_pool.input_gradient(x, code, dz, mean, multiplier, alpha, beta)
  return dx, d_scale, dz_sum


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(x, scale, bias, epsilon):
  return _forward(x, scale, bias, epsilon)[0]


_fused.defvjp(_forward, _backward)


# Jitted (inlined by an enclosing jit) so that the op shows by name in jaxprs and profiles.
@functools.partial(jax.jit, static_argnames=("epsilon",))
def fast_batch_norm_relu_max_pool(x: jax.Array, scale: jax.Array, bias: jax.Array, *,
                                  epsilon: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`batch_norm_relu_max_pool` on a `fast_norm_pool.supported` input, without checks."""
  # Replicated parameters inside `shard_map` get per-device gradients (`vary_like`).
  return _fused(x, fast_norm_pool.vary_like(scale, x), fast_norm_pool.vary_like(bias, x),
                epsilon)


def batch_norm_relu_max_pool(x: jax.Array, scale: jax.Array, bias: jax.Array, *,
                             epsilon: float = 1e-5) -> tuple[jax.Array, jax.Array, jax.Array]:
  """BatchNorm with batch statistics, ReLU and a 2×2 stride-2 VALID max-pool.

  Args:
    x: (B, H, W, C) input; statistics per channel over the batch and the pixels.
    scale, bias: (C,) BatchNorm parameters.
    epsilon: added to the variance.

  Returns:
    (pooled (B, H//2, W//2, C), batch mean (C,), batch variance (C,)): values and gradients
    equal the three layers' (and flax's statistics) to float32 rounding, the pool's gradient
    routed as `fast_pool`'s.

  Raises:
    ValueError: scale or bias not (C,), or an input `fast_norm_pool.supported` rejects (other
      dtypes, ranks, maps under 2×2: callers take flax's layers for those, see `is_plain`).
  """
  if scale.shape != (x.shape[-1],) or bias.shape != (x.shape[-1],):
    raise ValueError(f"scale and bias must have shape ({x.shape[-1]},), got {scale.shape} and "
                     f"{bias.shape}")
  if not fast_norm_pool.supported(x, scale, bias):
    raise ValueError(f"need a float32 (B, H, W, C) map of at least 2×2 pixels and float32 "
                     f"parameters, got {x.dtype}{x.shape}")
  return fast_batch_norm_relu_max_pool(x, scale, bias, epsilon=float(epsilon))


def is_plain(layer: object, x: jax.Array) -> bool:
  """Whether `layer` is an `nnx.BatchNorm` (not a subclass) configured as
  `classifiers.make_norm` builds it, on a float32 map (the
  case this op covers: scale and bias, last-axis features, one-pass variance, no mapped axis,
  no dtype)."""
  return (type(layer) is nnx.BatchNorm and layer.use_scale and layer.use_bias
          and layer.axis in (-1, x.ndim - 1) and layer.axis_name is None
          and layer.axis_index_groups is None and layer.use_fast_variance
          and layer.dtype is None and layer.mean[...].dtype == jnp.float32
          and layer.var[...].dtype == jnp.float32
          and fast_norm_pool.supported(x, layer.scale[...], layer.bias[...]))


def apply(layer: nnx.BatchNorm, x: jax.Array) -> jax.Array:
  """`max_pool_2x2(relu(layer(x, use_running_average=False)))` for an `is_plain` layer,
  updating `layer.mean` and `layer.var` as that call does.

  Args:
    layer: the BatchNorm, in training mode (batch statistics).
    x: (B, H, W, C) float32 input.

  Returns:
    (B, H//2, W//2, C).
  """
  pooled, mean, var = batch_norm_relu_max_pool(x, layer.scale[...], layer.bias[...],
                                               epsilon=layer.epsilon)
  # flax's update, with its stop_gradient under the same condition as flax's.
  stop = (jax.lax.stop_gradient if layer.mean._can_update or layer.var._can_update
          else lambda v: v)
  layer.mean[...] = stop(layer.momentum * layer.mean[...] + (1 - layer.momentum) * mean)
  layer.var[...] = stop(layer.momentum * layer.var[...] + (1 - layer.momentum) * var)
  return pooled
