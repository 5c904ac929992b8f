"""Nearest ×2 upsampling followed by a 3×3 SAME convolution, as four 2×2 convolutions on the
low-resolution map (the sub-pixel form): equal to the two layers in turn.

The DAFL generator upsamples a (B, H, W, C) map to (B, 2H, 2W, C) by repeating every pixel
2×2 and convolves the result with a 3×3 kernel. Done in that order, the convolution's three
passes (forward, input gradient, kernel gradient) each run over the 4× larger map, and XLA
CPU fuses the upsampling (and the BatchNorm and LeakyReLU before it) into their operands,
re-reading and recomputing it per pass (docs/PERFORMANCE.md).

Every output pixel (2p + a, 2q + b) of the upsampled convolution reads only the low-resolution
rows p − 1 + a .. p + a and columns q − 1 + b .. q + b, because the 3×3 window over the
repeated pixels covers at most two distinct source rows and columns. Along one axis, with
w₀, w₁, w₂ the kernel's taps:

  phase 0 (even output rows):  source row p − 1 gets w₀,       source row p     gets w₁ + w₂
  phase 1 (odd output rows):   source row p     gets w₀ + w₁,  source row p + 1 gets w₂

(the SAME padding row of the upsampled map is the zero row p = −1 or p = H of the source,
so the boundary needs no special case). Each of the four phases (a, b) is thus a 2×2
convolution of the (B, H, W, C) map with kernel taps summed from the 3×3 ones, padded by one
row / column on the side it reaches past: 16·H·W·C·O multiply-adds instead of 36·H·W·C·O,
and no (B, 2H, 2W, C) map at all. The four (B, H, W, O) outputs are interleaved into
(B, 2H, 2W, O).

**Equality.** The only change in arithmetic is that taps reading the same source pixel are
summed before the product (w₁ + w₂ instead of two products), so values agree to float32
rounding; gradients are autodiff of this form (the kernel's through the tap sums), equal to
the two layers' to float32 rounding. Every output pixel depends on its own example only, so
per-example (vmap) behaviour is unchanged.

Each 2×2 convolution goes through the convolution the layer names (with the CPU kernels on,
`fast_conv`, by its static rule like any other convolution).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax.kernels import reference
from dpkd_jax.kernels.xla_cpu import fast_conv

_NHWC_SPECS = ("NHWC", "HWIO", "NHWC")
ConvFn = Callable[..., jax.Array]


upsample_nearest_2x = reference.upsample_nearest_2x


def _axis_phases(kernel: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
  """The 2-tap kernels of the even and odd output phases along `axis` (0: rows, 1: columns)
  of a 3-tap kernel: (w₀, w₁ + w₂) and (w₀ + w₁, w₂), taps in source order."""
  w0, w1, w2 = (jnp.take(kernel, i, axis=axis) for i in range(3))
  return jnp.stack([w0, w1 + w2], axis=axis), jnp.stack([w0 + w1, w2], axis=axis)


def phase_kernels(kernel: jax.Array) -> list[list[jax.Array]]:
  """(3, 3, C, O) → [[K₀₀, K₀₁], [K₁₀, K₁₁]], K_ab (2, 2, C, O): the kernel of output phase
  (row parity a, column parity b) on the low-resolution map."""
  rows = _axis_phases(kernel, 0)
  return [list(_axis_phases(rows[a], 1)) for a in range(2)]


def upsample_conv(x: jax.Array, kernel: jax.Array, *, precision=None,
                  conv_general_dilated: ConvFn = fast_conv.conv_general_dilated) -> jax.Array:
  """`conv3×3_SAME(upsample_nearest_2x(x), kernel)` without the upsampled map.

  Args:
    x: (B, H, W, C) low-resolution map.
    kernel: (3, 3, C, O) HWIO kernel of the stride-1 SAME convolution.
    precision: passed to the convolutions.
    conv_general_dilated: the convolution to use (`lax.conv_general_dilated`'s signature).

  Returns:
    (B, 2H, 2W, O), no bias.
  """
  if x.ndim != 4 or kernel.shape[:2] != (3, 3) or kernel.shape[2] != x.shape[-1]:
    raise ValueError(f"need (B, H, W, C) and (3, 3, C, O), got {x.shape} and {kernel.shape}")
  batch, height, width, _ = x.shape
  kernels = phase_kernels(kernel)
  # Phase a reads source rows p − 1 + a .. p + a: one zero row above for a = 0, below for 1.
  outputs = [[conv_general_dilated(x, kernels[a][b], (1, 1), ((1 - a, a), (1 - b, b)),
                                   dimension_numbers=_NHWC_SPECS, precision=precision)
              for b in range(2)] for a in range(2)]  # each (B, H, W, O)
  # (B, H, 2, W, 2, O): output row 2p + a, column 2q + b.
  interleaved = jnp.stack([jnp.stack(row, axis=3) for row in outputs], axis=2)
  return interleaved.reshape(batch, 2 * height, 2 * width, kernel.shape[3])


def supported(conv: nnx.Conv, x: jax.Array) -> bool:
  """Whether `conv` is a plain 3×3 stride-1 SAME convolution on NHWC input of the kernel's
  float dtype (the configuration `upsample_conv` computes; others take the two layers in
  turn)."""
  strides = conv.strides if isinstance(conv.strides, tuple) else (conv.strides,) * 2
  ones = lambda v: v is None or all(d == 1 for d in (v if isinstance(v, tuple) else (v,)))  # noqa: E731
  return (type(conv) is nnx.Conv and tuple(conv.kernel_size) == (3, 3) and strides == (1, 1)
          and conv.padding == "SAME" and ones(conv.input_dilation)
          and ones(conv.kernel_dilation) and conv.feature_group_count == 1
          and conv.mask is None and conv.dtype is None and conv.preferred_element_type is None
          and x.ndim == 4 and jnp.issubdtype(x.dtype, jnp.floating)
          and x.dtype == conv.kernel[...].dtype)


def apply(conv: nnx.Conv, x: jax.Array) -> jax.Array:
  """`conv(upsample_nearest_2x(x))` with the layer's own kernel and bias (checkpoints and
  parameter trees unchanged): through `upsample_conv` when `supported`, else the two layers.

  Args:
    conv: the 3×3 convolution layer that follows the upsampling.
    x: (B, H, W, C) map before upsampling.

  Returns:
    (B, 2H, 2W, O).
  """
  if not supported(conv, x):
    return conv(upsample_nearest_2x(x))
  y = upsample_conv(x, conv.kernel[...], precision=conv.precision,
                    conv_general_dilated=conv.conv_general_dilated)
  return y + conv.bias[...] if conv.use_bias else y
