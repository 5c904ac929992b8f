"""A stride-1 2-D convolution as ONE matrix product with a banded matrix (narrow layers on CPU).

XLA CPU's convolution kernels vectorise along the channel axis of NHWC. With a handful of
channels (LeNet-5's 1 → 6 and 6 → 16, any first layer on grey images) most vector lanes idle,
and its forward pass, input gradient and kernel gradient run at a few GFLOP/s. This form moves
the work into one GEMM whose sizes are large whatever the channel count:

  out[b, y, :] = Σ_i x_pad[b, y + i, :] · T_i      (rows flattened to Wp·C and Wo·O values)

with T_i[(q + j)·C + c, q·O + o] = w[i, j, c, o] the banded (Toeplitz) matrix of kernel row i.
The kh shifted input rows are concatenated, so the whole convolution is
(B·Ho, kh·Wp·C) · (kh·Wp·C, Wo·O). It does Wp / kw times the FLOPs of a direct convolution (the
band's zeros), so it only pays where the direct kernels are slow: `fast_conv`'s static rule
takes it for the passes of narrow layers where it measured faster.

Every gradient comes from autodiff of this function, and each is again a GEMM: the input
gradient is (B·Ho, Wo·O) · T' followed by the overlap-add of the kh row blocks, the kernel
gradient is the (kh·Wp·C, Wo·O) product of the rows and the output gradient, contracted with the
constant band selector. Values equal XLA's convolution to float32 rounding (other summation
order; tests/test_banded_conv.py). One difference with non-finite inputs: the band's zeros
multiply every value of an input row, and 0 · inf = 0 · NaN = NaN, so a NaN or inf input makes
the whole output rows that read its row NaN or inf (within its own example), where a direct
convolution marks only the windows that contain it. Every output a direct convolution makes
non-finite is non-finite here too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Forms beyond these sizes are not offered: the band matrix (kh·Wp·C × Wo·O floats) and the
# stacked rows (kh × the padded input) grow with width and channels, and with many input
# channels XLA's own kernels are efficient anyway (benchmarks/conv_grads.py).
MAX_IN_CHANNELS = 16
MAX_BAND_VALUES = 1 << 22


@functools.lru_cache(maxsize=64)
def _band_selector(kernel_w: int, padded_w: int, out_w: int) -> np.ndarray:
  """(kw, Wp, Wo) 0/1 array: selector[j, q + j, q] = 1 (tap j of output column q)."""
  selector = np.zeros((kernel_w, padded_w, out_w), np.float32)
  for j in range(kernel_w):
    selector[j, np.arange(out_w) + j, np.arange(out_w)] = 1.0
  return selector


def band_matrix(kernel: jax.Array, padded_w: int) -> jax.Array:
  """(kh, kw, C, O) kernel → (kh·Wp·C, Wo·O) banded matrix of all kernel rows, Wo = Wp − kw + 1."""
  kernel_h, kernel_w, in_channels, out_channels = kernel.shape
  out_w = padded_w - kernel_w + 1
  selector = jnp.asarray(_band_selector(kernel_w, padded_w, out_w), kernel.dtype)
  band = jnp.einsum("jpq,ijco->ipcqo", selector, kernel)  # (kh, Wp, C, Wo, O)
  return band.reshape(kernel_h * padded_w * in_channels, out_w * out_channels)


def supported(lhs_shape: Sequence[int], rhs_shape: Sequence[int], strides: Sequence[int],
              padding: Sequence[tuple[int, int]]) -> bool:
  """Whether the banded form is offered for this NHWC/HWIO convolution (stride 1, narrow)."""
  _, height, width, in_channels = lhs_shape
  kernel_h, kernel_w, _, out_channels = rhs_shape
  (low_h, high_h), (low_w, high_w) = padding
  padded_h, padded_w = height + low_h + high_h, width + low_w + high_w
  if tuple(strides) != (1, 1) or padded_h < kernel_h or padded_w < kernel_w:
    return False
  out_w = padded_w - kernel_w + 1
  band_values = kernel_h * padded_w * in_channels * out_w * out_channels
  return in_channels <= MAX_IN_CHANNELS and band_values <= MAX_BAND_VALUES


def conv(lhs: jax.Array, rhs: jax.Array, padding: Sequence[tuple[int, int]],
         precision: Any = None) -> jax.Array:
  """Stride-1 NHWC/HWIO convolution (B, H, W, C) * (kh, kw, C, O) → (B, Ho, Wo, O).

  Args:
    lhs: input (B, H, W, C).
    rhs: kernel (kh, kw, C, O).
    padding: explicit ((low_h, high_h), (low_w, high_w)); negative values crop.
    precision: passed to the matrix product.
  """
  batch = lhs.shape[0]
  kernel_h, kernel_w, in_channels, out_channels = rhs.shape
  (low_h, high_h), (low_w, high_w) = padding
  padded = lax.pad(lhs, jnp.zeros((), lhs.dtype),
                   ((0, 0, 0), (low_h, high_h, 0), (low_w, high_w, 0), (0, 0, 0)))
  _, padded_h, padded_w, _ = padded.shape
  out_h, out_w = padded_h - kernel_h + 1, padded_w - kernel_w + 1
  rows = padded.reshape(batch, padded_h, padded_w * in_channels)  # (B, Hp, Wp·C)
  # (B, Ho, kh·Wp·C): output row y sees input rows y .. y + kh − 1, side by side.
  stacked = jnp.concatenate([rows[:, i:i + out_h] for i in range(kernel_h)], axis=-1)
  # (B, Ho, Wo·O); the batch axis stays apart (not merged with Ho), so that
  # `example_mixing` can follow it, and XLA makes it one (B·Ho, K)·(K, Wo·O) GEMM anyway.
  out = lax.dot_general(stacked, band_matrix(rhs, padded_w), (((2,), (0,)), ((), ())),
                        precision=precision)
  return out.reshape(batch, out_h, out_w, out_channels)
