"""GroupNorm → ReLU → 2×2 max-pool as one differentiable op: equal to the three layers in turn.

Composed from `fast_norm.group_norm`, `jax.nn.relu` and `fast_pool.max_pool`, this block is
the costliest part of a small CNN's train step on XLA CPU, although it does little arithmetic.
XLA runs it as a dozen memory-bound passes over the full (B, H, W, C) map: the normalised and
rectified map is materialised, the pool's argmax keys and NaN scan take passes of their own, and
the backward pass materialises the cotangent of the full map and several broadcasts of
per-channel statistics, recomputing the normalisation in most of them (docs/PERFORMANCE.md).

This module computes the same function with few passes over the full map:

* forward: the per-(example, channel) pixel sums of x and x² (as `fast_norm`), then, for each
  of the four 2×2 window positions, the strided (B, H/2, W/2, C) view of x, normalised and
  rectified elementwise. The pooled maximum (`_materialised`), the position the pool's
  gradient goes to (`_select`) and the centred value x − μ there are elementwise functions of
  those four views; only they are kept, at a quarter of the map's size;
* backward: only one element per window gets a cotangent, so GroupNorm's two gradient
  reductions (Σ dz and Σ dz·(x − μ) per example and channel) run over the pooled map. The input
  gradient is then one elementwise pass over the full map, in closed form:
  dx = m·dz + α + β·(x − μ), with m = scale·rsqrt(σ² + ε) and α, β per (example, group).

**Equality.** Forward values use `fast_norm`'s formula, `(x − μ)·m + bias` with flax's one-pass
variance, then `max(·, 0)`. The gradient is the closed form of what autodiff computes through
the three layers, so values and gradients agree to float32 rounding. It includes flax's clipped
variance: σ² = max(0, E[x²] − μ²), whose gradient is passed fully above zero, halved at exactly
zero and dropped below (`jnp.maximum`'s rule). The pool sends a window's cotangent where XLA's
select-and-scatter does (see `_select`), ties and NaN included, so the routing is exactly
`fast_pool`'s; the ReLU passes it only where the selected pre-activation is > 0, as
`jax.nn.relu`'s derivative does.

**Per-example gradients.** Every statistic and every window belongs to one example, so under
`vmap(grad)` each example's gradient depends on its own input only.

Reverse mode only (a `jax.custom_vjp`), like `fast_conv`'s convolutions in the same models.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dpkd_jax.kernels.xla_cpu import fast_norm, fast_pool

WINDOW = 2  # a 2×2 window with stride 2, VALID: odd sides are floored, as `nnx.max_pool`
POSITIONS = WINDOW * WINDOW  # window positions in row-major order; this value means "none"


def _views(a: jax.Array) -> list[jax.Array]:
  """(B, H, W, C) → the four (B, H//2, W//2, C) strided views, window positions in row-major
  order (the rows and columns that no whole window covers are left out)."""
  batch, height, width, channels = a.shape
  out_h, out_w = height // WINDOW, width // WINDOW
  tiles = a[:, :out_h * WINDOW, :out_w * WINDOW].reshape(batch, out_h, WINDOW, out_w, WINDOW,
                                                        channels)
  return [tiles[:, :, i, :, j, :] for i in range(WINDOW) for j in range(WINDOW)]


def _select(views: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
  """The window position XLA's select-and-scatter picks, replayed on the four views.

  Select-and-scatter walks a window in row-major order and keeps the element selected so far
  while `selected >= candidate`, so among equal maxima the first wins and a NaN is replaced by
  the next element (`NaN >= y` is false); this is that walk, elementwise on (B, Ho, Wo, C).

  Returns:
    (selected value, int8 position in [0, 4)), both (B, Ho, Wo, C).
  """
  selected, position = views[0], jnp.zeros(views[0].shape, jnp.int8)
  for index, candidate in enumerate(views[1:], start=1):
    take = ~(selected >= candidate)
    selected = jnp.where(take, candidate, selected)
    position = jnp.where(take, jnp.int8(index), position)
  return selected, position


def _materialised(fn, args, anchor: jax.Array):
  """fn(args) (elementwise ops on (B, Ho, Wo, C) arrays) as arrays XLA writes out once.

  Left as elementwise ops, XLA fuses the whole window computation (normalisation included)
  into every consumer of the result. That is cheap for a matrix product, which reads it
  once, but a per-example outer product under `vmap` (a dense layer's per-example kernel
  gradient) reads each element once per output unit and recomputed it that often. A
  conditional is a fusion boundary, so its result is materialised; both branches are the
  same function, so the value never depends on the predicate (`anchor == anchor`, a runtime
  value XLA cannot fold). An `optimization_barrier` does not do this on XLA CPU (removed before
  fusion), nor does a reduction over the stacked views (simplified back into maxima).
  """
  return jax.lax.cond(anchor == anchor, fn, fn, args)


def _statistics(x: jax.Array, scale: jax.Array, num_groups: int, epsilon: float):
  """`fast_norm`'s statistics: mean (B, 1, 1, C), raw variance E[x²] − μ² and rsqrt(σ² + ε)
  (B, G), and the multiplier m = rsqrt(σ² + ε)·scale (B, 1, 1, C)."""
  channels = x.shape[-1]
  count = x.size // (x.shape[0] * num_groups)  # elements per group of one example
  mean = fast_norm._group_sums(fast_norm._channel_sums(x), num_groups) / count  # (B, G)
  mean_sq = fast_norm._group_sums(fast_norm._channel_sums(jnp.square(x)), num_groups) / count
  raw_var = mean_sq - jnp.square(mean)
  rstd = jax.lax.rsqrt(jnp.maximum(0.0, raw_var) + epsilon)
  multiplier = fast_norm._per_channel(rstd, channels, 4) * scale
  return fast_norm._per_channel(mean, channels, 4), raw_var, rstd, multiplier


def window_pass(x: jax.Array, mean: jax.Array, multiplier: jax.Array, bias: jax.Array,
                anchor: jax.Array, *, materialise_residuals: bool = False
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """relu((x − μ)·m + bias) max-pooled 2×2, and what the backward pass keeps of the windows.

  Shared by every norm whose forward pass is that affine map with per-channel bias: mean and
  multiplier broadcast against (B, 1, 1, C) (per example and channel for GroupNorm, per
  channel for BatchNorm); anchor is a runtime scalar for `_materialised`. With
  `materialise_residuals` the code and x − μ are computed inside a conditional of their own
  too: XLA otherwise fuses the whole window walk into the input gradient's pass over the full
  map, recomputing it for each of a window's four pixels (seen with BatchNorm, whose backward
  reductions do not force them out as GroupNorm's do).

  Returns:
    (pooled, code, centred_at), each (B, H//2, W//2, C): the pooled output; the int8 position
    the pool's gradient is routed to, or `POSITIONS` where the ReLU blocks it; x − μ there.
  """
  def residuals(views):
    centred = [view - mean for view in views]  # x − μ at each window position
    rectified = [jnp.maximum(c * multiplier + bias, 0.0) for c in centred]  # relu(norm(x))
    selected, position = _select(rectified)
    centred_at = centred[0]
    for index in range(1, POSITIONS):
      centred_at = jnp.where(position == index, centred[index], centred_at)
    # The ReLU's derivative is 0 unless the selected pre-activation is > 0, i.e. selected > 0.
    code = jnp.where(selected > 0, position, jnp.int8(POSITIONS))  # int8 (B, Ho, Wo, C)
    return rectified, code, centred_at

  views = _views(x)
  rectified, code, centred_at = residuals(views)
  pooled = _materialised(lambda r: functools.reduce(jnp.maximum, r), rectified, anchor)
  if materialise_residuals:
    code, centred_at = _materialised(lambda v: residuals(v)[1:], views, anchor)
  return pooled, code, centred_at


def _forward(x, scale, bias, num_groups, epsilon):
  """Pooled (B, Ho, Wo, C) output and the residuals of `_backward`."""
  mean, raw_var, rstd, multiplier = _statistics(x, scale, num_groups, epsilon)
  pooled, code, centred_at = window_pass(x, mean, multiplier, bias, scale[0])
  return pooled, (x, code, centred_at, mean, raw_var, rstd, multiplier, scale)


def input_gradient(x, code, cotangent, mean, multiplier, alpha, beta):
  """dx = m·dz + α + β·(x − μ) on the full (B, H, W, C) map; dz is the cotangent at each
  window's routed position (`code`), zero elsewhere and on uncovered rows and columns. mean,
  multiplier, α and β broadcast against (B, 1, 1, C)."""
  batch, height, width, channels = x.shape
  out_h, out_w = code.shape[1], code.shape[2]
  position = jnp.arange(POSITIONS, dtype=jnp.int8).reshape(1, 1, WINDOW, 1, WINDOW, 1)
  dz = jnp.where(code[:, :, None, :, None, :] == position, cotangent[:, :, None, :, None, :], 0.0)
  dz = dz.reshape(batch, out_h * WINDOW, out_w * WINDOW, channels)
  dz = jnp.pad(dz, ((0, 0), (0, height - out_h * WINDOW), (0, width - out_w * WINDOW), (0, 0)))
  return multiplier * dz + alpha + beta * (x - mean)


def routed_sums(code, g, centred_at, axes):
  """The pool's and ReLU's backward on the pooled map: dz (B, Ho, Wo, C), the cotangent of the
  routed pre-activations, and its sums Σ dz and Σ dz·(x − μ) over `axes`."""
  dz = jnp.where(code < POSITIONS, g, 0.0)
  return dz, jnp.sum(dz, axis=axes), jnp.sum(dz * centred_at, axis=axes)


def variance_clip(raw_var):
  """How much of σ²'s gradient passes `max(0, raw σ²)`: 1 above zero, ½ at zero (`jnp.maximum`'s
  rule), 0 below."""
  return jnp.where(raw_var > 0, 1.0, jnp.where(raw_var == 0, 0.5, 0.0))


def _backward(num_groups, epsilon, residuals, g):
  del epsilon  # only through rstd
  x, code, centred_at, mean, raw_var, rstd, multiplier, scale = residuals
  batch, channels = x.shape[0], x.shape[-1]
  count = x.size // (batch * num_groups)
  # Σ dz and Σ dz·(x − μ) per (example, channel), (B, C).
  dz, dz_sum, dz_centred_sum = routed_sums(code, g, centred_at, (1, 2))
  rstd_c = jnp.repeat(rstd, channels // num_groups, axis=1)  # (B, C)
  d_bias = jnp.sum(dz_sum, axis=0)
  d_scale = jnp.sum(rstd_c * dz_centred_sum, axis=0)
  # Through μ: −(1/n)·Σ_c m_c·Σ dz. Through σ² (clipped at 0, `jnp.maximum`'s rule):
  # dσ² = −½·rstd³·Σ_c scale_c·Σ dz·(x − μ), and ∂σ²/∂x = 2·(x − μ)/n.
  alpha = -fast_norm._group_sums(multiplier.reshape(batch, channels) * dz_sum, num_groups) / count
  beta = (-variance_clip(raw_var) * rstd ** 3
          * fast_norm._group_sums(scale * dz_centred_sum, num_groups) / count)
  dx = input_gradient(x, code, dz, mean, multiplier, fast_norm._per_channel(alpha, channels, 4),
                      fast_norm._per_channel(beta, channels, 4))
  return dx, d_scale, d_bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused(x, scale, bias, num_groups, epsilon):
  return _forward(x, scale, bias, num_groups, epsilon)[0]


_fused.defvjp(_forward, _backward)


def _varying_axes(v: jax.Array) -> frozenset:
  """The `shard_map` mesh axes `v` varies over (none outside `shard_map`)."""
  return frozenset(getattr(getattr(jax.typeof(v), "manual_axis_type", None), "varying", ()))


def vary_like(param: jax.Array, x: jax.Array) -> jax.Array:
  """`param` made to vary over the mesh axes x varies over, inside `shard_map`.

  The backward pass computes the (C,) parameter gradients from x, so they vary as x does; a
  custom VJP must return each gradient with its input's type. An invariant (replicated)
  parameter is cast first, and the cast's transpose sums its gradient over those axes, as
  autodiff through the three layers would."""
  axes = _varying_axes(x) - _varying_axes(param)
  return jax.lax.pcast(param, tuple(sorted(axes)), to="varying") if axes else param


# Jitted (inlined by an enclosing jit) so that the op shows by name in jaxprs and profiles.
@functools.partial(jax.jit, static_argnames=("num_groups", "epsilon"))
def fast_group_norm_relu_max_pool(x: jax.Array, scale: jax.Array, bias: jax.Array, *,
                                  num_groups: int, epsilon: float) -> jax.Array:
  """`group_norm_relu_max_pool` on a `supported` input, without argument checks."""
  return _fused(x, vary_like(scale, x), vary_like(bias, x), num_groups, epsilon)


def _tapped_forward(x, scale, bias, tap, num_groups, epsilon):
  """`_forward` with ghost clipping's tap: ((pooled + tap at routed windows, x̂ at each
  window's selected position), `_backward`'s residuals); all (B, Ho, Wo, C)."""
  pooled, residuals = _forward(x, scale, bias, num_groups, epsilon)
  code, centred_at, rstd = residuals[1], residuals[2], residuals[5]
  # x̂ = (x − μ)·rstd: `fast_norm.group_norm` with scale 1 and bias 0, at the selected position.
  xhat_at = centred_at * fast_norm._per_channel(rstd, x.shape[-1], 4)
  return (pooled + jnp.where(code < POSITIONS, tap, 0.0), xhat_at), residuals


def _tapped_backward(num_groups, epsilon, residuals, cotangents):
  g, _ = cotangents  # x̂'s cotangent is zero: the public function stops its gradient
  dx, d_scale, d_bias = _backward(num_groups, epsilon, residuals, g)
  return dx, d_scale, d_bias, jnp.where(residuals[1] < POSITIONS, g, 0.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _tapped(x, scale, bias, tap, num_groups, epsilon):
  return _tapped_forward(x, scale, bias, tap, num_groups, epsilon)[0]


_tapped.defvjp(_tapped_forward, _tapped_backward)


@functools.partial(jax.jit, static_argnames=("num_groups", "epsilon"))
def tapped_group_norm_relu_max_pool(x: jax.Array, scale: jax.Array, bias: jax.Array,
                                    tap: jax.Array, *, num_groups: int, epsilon: float
                                    ) -> tuple[jax.Array, jax.Array]:
  """The fused op with a tap for ghost clipping's per-example scale and bias gradients.

  The GroupNorm's output z gets a cotangent dz at one position per window at most (where the
  pool routes and the ReLU passes), so its per-example gradients Σ_t dz_t·x̂_t (scale) and
  Σ_t dz_t (bias) are sums over the pooled map. `tap` is added at those routed pre-activations
  (linearly: out = pooled + [routed]·tap), so its gradient is dz, at pooled size; the second
  output is x̂ at each window's selected position (gradient stopped: a recorded value).

  Args:
    x, scale, bias, num_groups, epsilon: as `group_norm_relu_max_pool`, on a `supported` input.
    tap: (B, H//2, W//2, C), zeros in use.

  Returns:
    (pooled + tap at the routed windows, x̂ at the selected positions), both (B, Ho, Wo, C).
    With a zero tap, the output and the gradients w.r.t. x, scale and bias are those of
    `group_norm_relu_max_pool` (same formulas, to float32 rounding); the tap's gradient is
    0 at windows whose selected pre-activation is not > 0 (the ReLU's derivative, NaN too).
  """
  out, xhat_at = _tapped(x, vary_like(scale, x), vary_like(bias, x), vary_like(tap, x),
                         num_groups, epsilon)
  return out, jax.lax.stop_gradient(xhat_at)


def supported(x: jax.Array, scale: jax.Array, bias: jax.Array) -> bool:
  """Whether `group_norm_relu_max_pool` takes the fused path: a float32 (B, H, W, C) map of
  at least 2×2 pixels with float32 (C,) scale and bias."""
  f32 = jnp.dtype(jnp.float32)
  return (getattr(x, "ndim", None) == 4 and x.dtype == f32 and scale.dtype == f32
          and bias.dtype == f32 and x.shape[1] >= WINDOW and x.shape[2] >= WINDOW)


def group_norm_relu_max_pool(x: jax.Array, scale: jax.Array, bias: jax.Array, *,
                             num_groups: int, epsilon: float = 1e-6) -> jax.Array:
  """`fast_pool.max_pool(jax.nn.relu(fast_norm.group_norm(x, ...)))` with a 2×2 window.

  Args:
    x: (B, H, W, C) input; GroupNorm statistics per example and group of C/G channels.
    scale, bias: (C,) GroupNorm parameters.
    num_groups: G, a divisor of C.
    epsilon: added to the variance.

  Returns:
    (B, H//2, W//2, C). Values and gradients (w.r.t. x, scale and bias) equal the three layers'
    to float32 rounding, with the pool's gradient routed as `fast_pool`'s (ties, NaN). Inputs
    `supported` rejects (other dtypes, other ranks, maps under 2×2) go through the three
    layers themselves.

  Raises:
    ValueError: as `fast_norm.group_norm` for bad scale, bias or num_groups.
  """
  fast_norm.check_arguments(x.shape[-1], scale, bias, num_groups)
  if not supported(x, scale, bias):
    normalised = fast_norm.group_norm(x, scale, bias, num_groups=num_groups, epsilon=epsilon)
    return fast_pool.max_pool(jax.nn.relu(normalised), (WINDOW, WINDOW))
  return fast_group_norm_relu_max_pool(x, scale, bias, num_groups=int(num_groups),
                                       epsilon=float(epsilon))
