"""A 2×2 (or k×k) non-overlapping max-pool whose gradient avoids XLA CPU's select-and-scatter.

`nnx.max_pool` is `lax.reduce_window(max)`. JAX differentiates it with select-and-gather for the
JVP and select-and-scatter for the VJP. XLA CPU runs select-and-scatter as a scalar loop, several
times slower than a reshape + `max` (docs/PERFORMANCE.md).

When the window equals the stride and there is no padding (VALID), the windows tile the
(cropped) map. The pool is then a reshape to (B, H/k, k, W/k, k, C) and a max over the two k
axes. Its JVP picks one tangent per window with an elementwise one-hot mask; transposed, it
scatters the cotangent with the same mask. Both are plain elementwise ops, which XLA fuses.

**Ties.** The mask is exactly the element select-and-scatter picks, so values *and gradients*
equal `nnx.max_pool`'s, ties and NaNs included. XLA walks a window in row-major order and keeps
the element selected so far while `selected >= candidate` (JAX's select uses `lax.ge`).
Therefore:

* among equal maxima, the first in row-major order gets the whole gradient;
* a NaN selected so far is replaced by the next candidate, since `NaN >= y` is false.

`_selected_index` finds the element that scan picks with one `argmax` (see there). A plain `jnp.max`
differs here: its JVP splits a tie's gradient evenly among the tied elements.

**Per-example gradients.** Each mask depends only on its own window of its own example. Under
`vmap(grad)` every example's gradient therefore depends only on its own input.

The function is a `jax.custom_jvp`, so forward mode (`jax.jvp`, `jax.jacfwd`), reverse mode and
`vmap` all work. It contains only reshapes, comparisons and selects, which are fast on every
backend, so it is used on GPU and TPU too (no `platform_dependent` switch).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


def _tiles(x: jax.Array, window: tuple[int, int]) -> jax.Array:
  """(B, H, W, C) → (B, H//kh, kh, W//kw, kw, C): the map cropped to whole windows (a view)."""
  batch, height, width, channels = x.shape
  kernel_h, kernel_w = window
  out_h, out_w = height // kernel_h, width // kernel_w
  x = x[:, :out_h * kernel_h, :out_w * kernel_w]  # VALID floors odd sizes
  return x.reshape(batch, out_h, kernel_h, out_w, kernel_w, channels)


def _key_dtype(dtype: jnp.dtype) -> jnp.dtype:
  """The signed integer type as wide as the float `dtype` (int32 for float32)."""
  return jnp.dtype(f"int{8 * jnp.dtype(dtype).itemsize}")


def _ordered_bits(values: jax.Array) -> jax.Array:
  """Integer keys, as wide as the floats, that order non-NaN `values` as `>=` does (-0
  equals +0)."""
  key_dtype = _key_dtype(values.dtype)
  bits = jax.lax.bitcast_convert_type(jnp.where(values == 0, 0, values), key_dtype)
  # Negative floats order backwards as integers: flip every bit but the sign.
  return jnp.where(bits < 0, bits ^ jnp.iinfo(key_dtype).max, bits)


def _selected_index(tiles: jax.Array) -> jax.Array:
  """Row-major window position of the element XLA's select-and-scatter picks, per window.

  Select-and-scatter walks a window in row-major order and keeps the element selected so far
  while `selected >= candidate`. Since `NaN >= y` and `y >= NaN` are both false, a NaN is taken
  and then replaced by the very next element. So it picks the first maximum among the elements
  after the window's last NaN, or that NaN if it is the window's last element. Here each
  element gets an integer key as wide as the floats (the lowest for elements that cannot be
  picked, the highest for a pickable NaN, else its value's order) and `argmax` takes the first
  largest key: one reduction, which XLA materialises, where the replayed scan (one select per
  window element) was fused into every consumer and recomputed there, four times per window in
  the backward pass.

  Args:
    tiles: (B, Ho, kh, Wo, kw, C) from `_tiles`.

  Returns:
    int32 (B, Ho, Wo, C), values in [0, kh·kw).
  """
  batch, out_h, kernel_h, out_w, kernel_w, channels = tiles.shape
  size = kernel_h * kernel_w
  window = tiles.transpose(0, 1, 3, 5, 2, 4).reshape(batch, out_h, out_w, channels, size)
  is_nan = jnp.isnan(window)
  # NaN at this position or after it, then strictly after it.
  nan_from_here = jax.lax.cummax(is_nan.astype(jnp.int8), axis=4, reverse=True) > 0
  nan_after = jnp.concatenate([nan_from_here[..., 1:], jnp.zeros_like(nan_from_here[..., :1])],
                              axis=4)
  is_last = jnp.arange(size) == size - 1
  pickable = ~nan_after & (~is_nan | is_last)
  limits = jnp.iinfo(_key_dtype(tiles.dtype))
  key = jnp.where(pickable, jnp.where(is_nan, limits.max, _ordered_bits(window)), limits.min)
  return jnp.argmax(key, axis=4).astype(jnp.int32)


def _first_max_mask(tiles: jax.Array) -> jax.Array:
  """One-hot mask of the element XLA's select-and-scatter picks in each window.

  Args:
    tiles: (B, Ho, kh, Wo, kw, C) from `_tiles`.

  Returns:
    Boolean (B, Ho, kh, Wo, kw, C), exactly one True per window and channel.
  """
  kernel_h, kernel_w = tiles.shape[2], tiles.shape[4]
  index = _selected_index(tiles)
  # Row-major position of every window element, (1, 1, kh, 1, kw, 1).
  position = (jnp.arange(kernel_h, dtype=jnp.int32)[:, None, None] * kernel_w
              + jnp.arange(kernel_w, dtype=jnp.int32)[None, None, :])[None, None, :, :, :, None]
  return index[:, :, None, :, None, :] == position


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _tiled_max_pool(x: jax.Array, window: tuple[int, int]) -> jax.Array:
  return jnp.max(_tiles(x, window), axis=(2, 4))


@_tiled_max_pool.defjvp
def _tiled_max_pool_jvp(window: tuple[int, int], primals: tuple[jax.Array],
                        tangents: tuple[jax.Array]) -> tuple[jax.Array, jax.Array]:
  (x,), (x_dot,) = primals, tangents
  tiles = _tiles(x, window)  # (B, Ho, kh, Wo, kw, C)
  pooled = jnp.max(tiles, axis=(2, 4))  # (B, Ho, Wo, C), the same reduction as the primal
  mask = _first_max_mask(tiles)
  # Linear in x_dot: JAX transposes it into a masked broadcast of the cotangent (the VJP).
  tangent = jnp.sum(jnp.where(mask, _tiles(x_dot, window), 0), axis=(2, 4))
  return pooled, tangent


def max_pool(x: jax.Array, window_shape: Sequence[int] = (2, 2),
             strides: Sequence[int] | None = None, padding: str = "VALID") -> jax.Array:
  """`nnx.max_pool` for NHWC maps, with a fast gradient when the windows tile the map.

  Args:
    x: (B, H, W, C) feature maps.
    window_shape: (kh, kw) pooling window.
    strides: (sh, sw); None means `window_shape`, as for `nnx.max_pool`'s usual use here.
    padding: "VALID", "SAME" or explicit pads, as for `nnx.max_pool`.

  Returns:
    (B, Ho, Wo, C), equal to `nnx.max_pool(x, window_shape, strides, padding)`. Its gradient is
    also equal, ties included: the first maximum in row-major order gets the gradient. The fast
    path needs a 4-D input, strides equal to the window and VALID padding. Any other case calls
    `nnx.max_pool` itself.
  """
  window = tuple(int(k) for k in window_shape)
  strides = window if strides is None else tuple(int(s) for s in strides)
  if (getattr(x, "ndim", None) != 4 or len(window) != 2 or strides != window
      or not isinstance(padding, str) or padding.upper() != "VALID" or min(window) < 1
      or x.shape[1] < window[0] or x.shape[2] < window[1]
      or not jnp.issubdtype(x.dtype, jnp.floating)):
    return nnx.max_pool(x, window_shape=tuple(window_shape), strides=strides, padding=padding)
  return _tiled_max_pool(x, window)
