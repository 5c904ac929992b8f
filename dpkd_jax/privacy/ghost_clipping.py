"""Per-example clipping without per-example gradients: ghost norms and book-keeping.

DP-SGD needs, for every example i, the norm ||∇θ loss_i|| over all parameters, then the sum
Σ_i w_i ∇θ loss_i with w_i = mask_i · min(1, C / ||∇θ loss_i||). `dpsgd_mechanism` gets both
from the (B, D) per-example gradients of `vmap(grad)`. For a layer z = a W (+ b) the gradient
of example i is a_i^T g_i, a function of the layer's input a_i (T, d) and of its output
gradient g_i = ∂loss_i/∂z_i (T, p) alone (T: positions sharing the weights: 1 for a dense
layer on (B, d), the output pixels of a convolution, a sequence). So one forward and backward
pass that records a and g per layer gives both quantities without any (B, D) array:

* norms (per layer, the cheapest exact form; Li et al. 2021, Bu et al. 2022):
  - rank-1 (T = 1): ||a_i^T g_i||² = ||a_i||² ||g_i||², O(d + p) per example;
  - ghost norm (Gram): ||a_i^T g_i||² = Σ_{t,s} (a_i a_i^T)_{ts} (g_i g_i^T)_{ts}, O(T²(d + p))
    time and a (B, T, T) array;
  - per-example: G_i = a_i^T g_i materialised, O(T d p) time and a (B, d, p) array.
  Mixed ghost clipping (Bu et al. 2022) takes the Gram form iff 2T² < d p, for each layer;
  the bias gradient is Σ_t g_it, always materialised ((B, p)).
* book-keeping (Bu et al. 2022): the clipped sum of a layer is Σ_i w_i a_i^T g_i = a^T (w ⊙ g),
  one matrix product over the batch, or Σ_i w_i G_i for the materialised layers: no second
  backward pass.

A convolution is a dense layer on its input patches (`conv_patches`, T = output pixels,
d = C/G · window). Grouped convolutions (G groups, depthwise: G = C) keep a group axis: a is
(B, T, G, d), g is (B, T, G, p), and every formula sums over the groups.

Non-finite examples follow `dpsgd_mechanism.clip_per_example_gradients`: an example whose
total squared norm is NaN or infinite (an entry is, or the sum overflows) gets weight 0 and its
rows of a and g are zeroed before the sums (NaN · 0 would still be NaN). A non-finite a_i or
g_i makes every form above non-finite (an infinite entry meets either a non-zero factor or a
zero one: inf or NaN), so such examples are always caught. The squared norms of the three forms
agree to float rounding; for magnitudes near float32's range an intermediate (e.g. ||a_i||²) may
overflow where the materialised sum would not: that example then counts as non-finite and
contributes 0, which only removes a contribution.

Rounding: the rank-1 and per-example forms add non-negative terms (relative error of order ε,
and a materialised G_i is both measured and summed, as on the vmap path). The Gram form adds
terms of both signs, and the sum a^T (w ⊙ g) is not the array whose norm was measured; its
relative error grows as an example's per-position contributions cancel, about
ε·T·(Σ_t ||a_it|| ||g_it||)² / ||a_i^T g_i||², so a contribution may exceed C by that relative
amount (ε: float32's 6e-8). Where that matters, exclude it (`kernel_method(allow_gram=False)`,
`models.ghost`'s `allow_gram=False`) at the memory cost of the per-example form.

Sensitivity: exactly that of `dpsgd_mechanism.dpsgd_clip_and_sum`, whose value this computes
(to float rounding): every example's contribution w_i ∇θ loss_i has L2 norm <= C, padding rows
(mask 0) and non-finite examples contribute 0; so C under add/remove-one and 2C under
replace-one. The norms are pure functions of one example's own a_i and g_i: the model must not
mix examples (no BatchNorm in training mode, no op across the batch), which the caller
(`models.ghost`, by `models.example_mixing` on the forward pass's jaxpr) checks: its a and g come
from one batched pass, where row i is example i's own only when nothing mixes the rows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

METHODS = ("rank1", "gram", "per_example")


class KernelNorms(NamedTuple):
  """Per-example squared norms of one layer's weight gradient.

  Attributes:
    sq_norms: (B,) ||a_i^T g_i||²_F summed over the groups.
    per_example: the per-example gradients when the method materialised them, else None
      (rank-1 and Gram layers): (B, G, d, p) from `kernel_sq_norms`, (B, *window, C/G, O) from
      `per_example_conv_kernel_grads`.
  """

  sq_norms: jax.Array
  per_example: jax.Array | None


def kernel_method(tokens: int, in_features: int, out_features: int, *,
                  allow_gram: bool = True) -> str:
  """The cheapest exact form for a layer with T positions, d inputs and p outputs per group.

  "rank1" when T = 1; else "gram" iff `allow_gram` and 2T² < d·p (the two Gram matrices are
  smaller than one per-example gradient: Bu et al. 2022's mixed ghost clipping), else
  "per_example".
  """
  if tokens == 1:
    return "rank1"
  if allow_gram and 2 * tokens * tokens < in_features * out_features:
    return "gram"
  return "per_example"


def _check_layer(a: jax.Array, g: jax.Array) -> None:
  if a.ndim != 4 or g.ndim != 4 or a.shape[:3] != g.shape[:3]:
    raise ValueError(f"a and g must be (B, T, G, d) and (B, T, G, p) with equal (B, T, G), got "
                     f"{a.shape} and {g.shape}")


def per_example_kernel_grads(a: jax.Array, g: jax.Array) -> jax.Array:
  """(B, T, G, d), (B, T, G, p) → (B, G, d, p): every example's weight gradient a_i^T g_i."""
  _check_layer(a, g)
  return jnp.einsum("btgd,btgp->bgdp", a, g)


def kernel_sq_norms(a: jax.Array, g: jax.Array, method: str | None = None) -> KernelNorms:
  """||a_i^T g_i||² for every example, without a (B, d, p) array unless it is the cheapest.

  Args:
    a: (B, T, G, d) layer inputs (for a convolution: `conv_patches` of its input).
    g: (B, T, G, p) gradients of each example's own loss w.r.t. the layer's outputs.
    method: one of `METHODS`; None picks `kernel_method(T, d, p)`.

  Returns:
    `KernelNorms`; `per_example` is set only by the "per_example" method.
  """
  _check_layer(a, g)
  _, tokens, _, in_features = a.shape
  method = kernel_method(tokens, in_features, g.shape[-1]) if method is None else method
  if method == "rank1":
    if tokens != 1:
      raise ValueError(f"the rank-1 form needs T = 1, got T = {tokens}")
    # ||a^T g||² = ||a||² ||g||² for one row each, per group.
    return KernelNorms(jnp.sum(jnp.sum(a * a, axis=(1, 3)) * jnp.sum(g * g, axis=(1, 3)), axis=1),
                       None)
  if method == "gram":
    gram_a = jnp.einsum("btgd,bsgd->bgts", a, a)  # (B, G, T, T)
    gram_g = jnp.einsum("btgp,bsgp->bgts", g, g)
    return KernelNorms(jnp.sum(gram_a * gram_g, axis=(1, 2, 3)), None)
  if method == "per_example":
    grads = per_example_kernel_grads(a, g)
    return KernelNorms(jnp.sum(jnp.square(grads), axis=(1, 2, 3)), grads)
  raise ValueError(f"method must be one of {METHODS} or None, got {method!r}")


def bias_grads(g: jax.Array) -> jax.Array:
  """(B, T, ..., p) → (B, ..., p): the per-example bias gradient Σ_t g_it."""
  return jnp.sum(g, axis=1)


def _dilated_padded_input(x: jax.Array, window: Sequence[int], *, strides: Sequence[int],
                          padding: str | Sequence[tuple[int, int]],
                          lhs_dilation: Sequence[int] | None, rhs_dilation: Sequence[int],
                          dimension_numbers: Any, user: str) -> tuple[jax.Array, list[int]]:
  """(x dilated and padded as the convolution reads it, (B, *spatial', C); the dilated
  window's reach per spatial axis). Refuses a layout other than channels-last, naming `user`."""
  rank = x.ndim - 2
  numbers = lax.conv_dimension_numbers(x.shape, (1,) * x.ndim, dimension_numbers)
  if tuple(numbers.lhs_spec) != (0, x.ndim - 1, *range(1, x.ndim - 1)):
    raise ValueError(f"{user} needs a channels-last input, got {numbers}")
  reach = [(k - 1) * r + 1 for k, r in zip(window, rhs_dilation)]  # the dilated window
  if isinstance(padding, str):  # as `lax.conv_general_dilated` resolves it
    padding = lax.padtype_to_pads(x.shape[1:-1], reach, strides, padding)
  # Dilate (interior zeros) and pad in one go; negative padding crops.
  x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] + [
      (lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation or (1,) * rank)] + [(0, 0, 0)])
  return x, reach


def _conv_taps(x: jax.Array, window: Sequence[int], *, strides: Sequence[int],
               padding: str | Sequence[tuple[int, int]], lhs_dilation: Sequence[int] | None,
               rhs_dilation: Sequence[int] | None, dimension_numbers: Any) -> list[jax.Array]:
  """The input each kernel tap sees: prod(window) arrays (B, *out, C), row-major taps.

  Strided slices of the dilated, padded input: pure data movement, no arithmetic.
  """
  window, strides = tuple(window), tuple(strides)
  rhs_dilation = tuple(rhs_dilation or (1,) * (x.ndim - 2))
  x, reach = _dilated_padded_input(x, window, strides=strides, padding=padding,
                                   lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                                   dimension_numbers=dimension_numbers, user="conv_patches")
  out = [(n - k) // s + 1 for n, k, s in zip(x.shape[1:-1], reach, strides)]
  taps = []
  for offset in itertools.product(*(range(k) for k in window)):  # row-major, as the kernel
    start = [o * r for o, r in zip(offset, rhs_dilation)]
    limit = [b + (n - 1) * s + 1 for b, n, s in zip(start, out, strides)]
    taps.append(lax.slice(x, (0, *start, 0), (x.shape[0], *limit, x.shape[-1]),
                          (1, *strides, 1)))  # (B, *out, C)
  return taps


def conv_patches(x: jax.Array, window: Sequence[int], *, strides: Sequence[int],
                 padding: str | Sequence[tuple[int, int]], lhs_dilation: Sequence[int] | None,
                 rhs_dilation: Sequence[int] | None, dimension_numbers: Any,
                 groups: int) -> jax.Array:
  """The input patches of a convolution, so that it is a dense layer on them.

  Equal to `lax.conv_general_dilated_patches` (same layout), built from strided slices of the
  padded input (one per kernel tap): pure data movement. `conv_general_dilated_patches` is a
  convolution with a one-hot kernel, C·prod(window) times the multiply-adds of the copy.

  Args:
    x: (B, *spatial, C) channels-last input of the convolution (the layout `nnx.Conv` uses).
    window: the kernel's spatial shape.
    strides, padding, lhs_dilation, rhs_dilation, dimension_numbers: as passed to
      `lax.conv_general_dilated`; `dimension_numbers` must put the input's batch first and its
      features last.
    groups: G, the convolution's `feature_group_count`.

  Returns:
    (B, T, G, C/G · prod(window)) with T the output positions in row-major order; the last axis
    is ordered (channel, *window), channel major, as `lax.conv_general_dilated_patches` lays it
    out.
  """
  taps = _conv_taps(x, window, strides=strides, padding=padding, lhs_dilation=lhs_dilation,
                    rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers)
  patches = jnp.stack(taps, axis=-1)  # (B, *out, C, prod(window)): channel major
  return patches.reshape(x.shape[0], -1, groups, patches.shape[-2] * len(taps) // groups)


CONV_GRAD_FORMS = ("patches", "taps", "vmap_dw", "batch_channels")
_MIN_TAPS_PATCH_DEPTH = 16  # C·prod(window); benchmarks/ghost_conv_forms.py
# "batch_channels" (one grouped convolution) won only for a one-channel input with few output
# channels (LeNet-5's conv1, 1 → 6; small_cnn's 1 → 32 lost to "patches").
_MAX_BATCH_CHANNELS_OUT = 8


def conv_grad_form(window: Sequence[int], in_channels: int, out_channels: int, *,
                   groups: int, batch_channels: bool = False) -> str:
  """The fastest measured form of `per_example_conv_kernel_grads` for a convolution's shape.

  Measured by `benchmarks/ghost_conv_forms.py` on XLA CPU (the table in
  docs/PERFORMANCE.md); every form is exact, so this only moves time. `batch_channels`: whether
  the caller can afford that form's (B·C·O·T) kernel operand.
  """
  if (batch_channels and groups == 1 and in_channels == 1
      and out_channels <= _MAX_BATCH_CHANNELS_OUT):
    return "batch_channels"
  # Tap by tap, each example's product is a sum of prod(window) thin (C, O) dots and no
  # (B, T, C·prod(window)) patch array is written; that copy only pays for itself when the
  # patch rows are short (a one-channel 3×3 input: 9 values per position).
  depth = in_channels // groups * math.prod(window)
  return "taps" if groups == 1 and depth >= _MIN_TAPS_PATCH_DEPTH else "patches"


def per_example_conv_kernel_grads(x: jax.Array, g: jax.Array, *, window: Sequence[int],
                                  strides: Sequence[int],
                                  padding: str | Sequence[tuple[int, int]],
                                  lhs_dilation: Sequence[int] | None,
                                  rhs_dilation: Sequence[int] | None, dimension_numbers: Any,
                                  groups: int, form: str) -> jax.Array:
  """Every example's kernel gradient G_i = a_i^T g_i of a convolution, in the kernel's layout.

  Three exact forms (equal to float rounding; `conv_grad_form` picks by shape):
    * "patches": the (B, T, prod(window)·C) patches, tap major, then one batched dot over T;
    * "taps": one batched dot over T per kernel tap, (B, T, C)ᵀ(B, T, O) → (B, C, O), no patch
      array (G = 1 only; grouped convolutions take "patches");
    * "vmap_dw": `vmap` over the examples of XLA's kernel gradient of a one-example
      convolution;
    * "batch_channels": ONE convolution whose input channels are the (example, channel)
      pairs and whose kernel is each example's output gradient (a feature group per pair,
      `_batch_channels_grads`; G = 1 only, grouped convolutions take "patches"). Its kernel
      operand holds B·C·O·T values: meant for narrow inputs.

  Args:
    x: (B, *spatial, C) channels-last input of the convolution.
    g: (B, *out, O) the gradient of each example's own loss w.r.t. the convolution's output.
    window, strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, groups: the
      convolution's arguments (as for `conv_patches`).
    form: one of `CONV_GRAD_FORMS`.

  Returns:
    (B, *window, C/G, O): row i is example i's gradient of the kernel (its HWIO layout).
  """
  batch, channels, out_channels = x.shape[0], x.shape[-1], g.shape[-1]
  kernel_shape = (*window, channels // groups, out_channels)
  conv = dict(strides=strides, padding=padding, lhs_dilation=lhs_dilation,
              rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers)
  if form == "vmap_dw":
    def one(x_i, g_i):  # (*spatial, C), (*out, O) → kernel_shape
      def apply(kernel):
        return lax.conv_general_dilated(
            x_i[None], kernel, strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
            feature_group_count=groups)
      return jax.vjp(apply, jnp.zeros(kernel_shape, x.dtype))[1](g_i[None])[0]
    return jax.vmap(one)(x, g)
  if form not in CONV_GRAD_FORMS:
    raise ValueError(f"form must be one of {CONV_GRAD_FORMS}, got {form!r}")
  if form == "batch_channels" and groups == 1:
    return _batch_channels_grads(x, g, window, **conv)
  g_rows = g.reshape(batch, -1, out_channels)  # (B, T, O)
  if form == "taps" and groups == 1:
    taps = _conv_taps(x, window, **conv)
    grads = [jnp.einsum("btc,bto->bco", tap.reshape(batch, -1, channels), g_rows)
             for tap in taps]
    return jnp.stack(grads, axis=1).reshape(batch, *kernel_shape)
  if groups == 1:  # tap-major patches: the product is already in the kernel's layout
    patches = jnp.stack(_conv_taps(x, window, **conv), axis=-2)  # (B, *out, taps, C)
    grads = jnp.einsum("btd,bto->bdo", patches.reshape(batch, g_rows.shape[1], -1), g_rows)
    return grads.reshape(batch, *kernel_shape)
  patches = conv_patches(x, window, groups=groups, **conv)  # (B, T, G, d)
  grads = per_example_kernel_grads(patches, g.reshape(batch, -1, groups, out_channels // groups))
  return conv_kernel_from_patches(grads, kernel_shape)


def _batch_channels_grads(x: jax.Array, g: jax.Array, window: Sequence[int], *,
                          strides: Sequence[int], padding: str | Sequence[tuple[int, int]],
                          lhs_dilation: Sequence[int] | None, rhs_dilation: Sequence[int] | None,
                          dimension_numbers: Any) -> jax.Array:
  """(B, *window, C, O) per-example kernel gradients as one grouped convolution.

  G_b[w, c, o] = Σ_y x_pad[b, s·y + r·w, c] · g[b, y, o] is, for each pair (b, c), a
  correlation of that channel of the padded (dilated) input with g_b, read at the window's
  taps: a convolution of a one-image input with B·C channels by a (*out, 1, B·C·O) kernel
  holding g_b for each of its C pairs, with `feature_group_count` = B·C, the convolution's
  strides s as the kernel's dilation and its kernel dilation r as the window strides.
  """
  batch, channels, out_channels = x.shape[0], x.shape[-1], g.shape[-1]
  rank = x.ndim - 2
  rhs_dilation = tuple(rhs_dilation or (1,) * rank)
  x, _ = _dilated_padded_input(x, window, strides=strides, padding=padding,
                               lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                               dimension_numbers=dimension_numbers, user="batch_channels")
  spatial = tuple(range(1, rank + 1))
  lhs = jnp.moveaxis(x, 0, -2).reshape(1, *x.shape[1:-1], batch * channels)  # channels (b, c)
  out_shape = g.shape[1:-1]
  rhs = jnp.broadcast_to(jnp.moveaxis(g, 0, -2)[..., None, :],  # (*out, B, C, O)
                         (*out_shape, batch, channels, out_channels))
  rhs = rhs.reshape(*out_shape, 1, batch * channels * out_channels)
  out = lax.conv_general_dilated(
      lhs, rhs, rhs_dilation, "VALID", rhs_dilation=tuple(strides),
      dimension_numbers=lax.ConvDimensionNumbers((0, rank + 1, *spatial),
                                                 (rank + 1, rank, *range(rank)),
                                                 (0, rank + 1, *spatial)),
      feature_group_count=batch * channels)  # (1, ≥ *window, B·C·O)
  out = out[(0, *(slice(0, k) for k in window))]  # past the window: taps the conv never uses
  out = out.reshape(*window, batch, channels, out_channels)
  return jnp.moveaxis(out, rank, 0)


def conv_kernel_from_patches(grad: jax.Array, kernel_shape: Sequence[int]) -> jax.Array:
  """(..., G, C/G · prod(window), O/G) in `conv_patches`' order → (..., *window, C/G, O).

  Output channel o of group k is kernel column k·O/G + o (XLA's grouped-convolution layout).
  """
  *window, group_in, out_channels = kernel_shape
  lead = grad.shape[:-3]
  groups, group_out = grad.shape[-3], grad.shape[-1]
  n = len(lead)
  grad = grad.reshape(*lead, groups, group_in, *window, group_out)
  # (..., G, C/G, *window, O/G) → (..., *window, C/G, G, O/G)
  spatial = tuple(range(n + 2, n + 2 + len(window)))
  order = tuple(range(n)) + spatial + (n + 1, n, n + 2 + len(window))
  return grad.transpose(order).reshape(*lead, *window, group_in, groups * group_out)


def clip_weights(sq_norms: jax.Array, mask: jax.Array,
                 l2_clip_norm: float | jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The book-keeping weights w_i = mask_i · min(1, C / ||∇θ loss_i||), 0 if non-finite.

  The rule of `dpsgd_mechanism.clip_per_example_gradients`: C / max(norm, C), exactly 1 below
  the bound and free of an epsilon at norm 0.

  Args:
    sq_norms: (B,) total squared gradient norm of each example (every layer summed).
    mask: (B,) bool, False for padding rows.
    l2_clip_norm: C > 0 (may be traced: not validated here).

  Returns:
    (weights, norms, keep): (B,) float32 weights, (B,) pre-clip norms (NaN/inf if not
    finite), (B,) bool, False for the examples whose rows must be zeroed before a sum.
  """
  norms = jnp.sqrt(sq_norms)
  keep = jnp.isfinite(norms)
  scale = jnp.where(keep, l2_clip_norm / jnp.maximum(norms, l2_clip_norm), 0.0)
  return scale * mask.astype(scale.dtype), norms, keep


def _rows(keep: jax.Array, x: jax.Array) -> jax.Array:
  """x with the rows of the dropped examples set to 0 (`where`: NaN · 0 would stay NaN)."""
  return jnp.where(keep.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0)


def weighted_sum(per_example: jax.Array, weights: jax.Array, keep: jax.Array) -> jax.Array:
  """Σ_i w_i x_i over materialised per-example gradients (B, ...) → (...)."""
  return jnp.tensordot(weights.astype(per_example.dtype), _rows(keep, per_example), axes=1)


def weighted_kernel_sum(a: jax.Array, g: jax.Array, norms: KernelNorms, weights: jax.Array,
                        keep: jax.Array) -> jax.Array:
  """Book-keeping: Σ_i w_i a_i^T g_i → (G, d, p), reusing the materialised gradients if any."""
  if norms.per_example is not None:
    return weighted_sum(norms.per_example, weights, keep)
  scaled = _rows(keep, g) * weights.astype(g.dtype).reshape(-1, 1, 1, 1)
  return jnp.einsum("btgd,btgp->gdp", _rows(keep, a), scaled)


def tree_sq_norms(per_example: Any) -> jax.Array:
  """(B,) squared norms over a pytree of (B, ...) per-example gradients (0 if it is empty)."""
  leaves = jax.tree.leaves(per_example)
  if not leaves:
    return jnp.zeros(())
  return sum(jnp.sum(jnp.square(x.reshape(x.shape[0], -1)), axis=1) for x in leaves)

