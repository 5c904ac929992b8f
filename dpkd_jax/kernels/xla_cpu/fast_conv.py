"""A drop-in `lax.conv_general_dilated` whose kernel gradient is fast on XLA CPU.

XLA CPU used to compute the kernel gradient (dW) of a 2-D convolution several times slower than
the forward pass: it lowered dW to a convolution whose window is the whole output
map, which its convolution kernels handled badly. This module keeps XLA's forward pass and input gradient and,
on CPU, computes dW with matrix products instead:

  dW[i, j, c, o] = Σ_{b, y, x} x_pad[b, s·y + i, s·x + j, c] · dy[b, y, x, o].

A stride s is removed by splitting the padded input into s×s phases (space-to-depth); within a
phase every kernel tap is a plain shift. Each phase is laid out on a flat grid of Hg×Wg pixels
per example, with dy in the top-left Ho×Wo corner and zeros elsewhere, so a tap (di, dj) becomes
a shift of di·Wg + dj along the flat pixel axis: the zeros absorb what wraps into the next row or
example. The operand with more channels is transposed once to (channels, pixels); the other one
is sliced once per tap; each tap (or all taps of a phase, stacked, when the sliced operand has few
channels) is one GEMM. The batch is walked in chunks of about `_CHUNK_PIXELS` grid pixels by a
`lax.scan`, so the copies stay in cache.

Each pass (forward, input gradient, kernel gradient) takes one exact form by a static rule of
its shape (`_route`): XLA's own convolution; this GEMM kernel gradient when C·O ≥
`_MIN_CHANNEL_PRODUCT` (not for a single input channel); or one product with a banded matrix
(`banded_conv`) for the forward pass of a very narrow layer (C·O ≤ `_BANDED_FORWARD_MAX`, LeNet-5's
1 → 6) and the input gradient of a narrow one (C·O ≤ `_BANDED_INPUT_GRAD_MAX`). The rule is
the one the idle perf table measures (docs/PERFORMANCE.md); no timing happens while tracing, so
a program is the same on every machine.

A form other than XLA's is taken with `lax.platform_dependent`, only when lowering for CPU: GPU
and TPU keep XLA's (cuDNN's) convolutions. Cases it does not cover (not 2-D NHWC/HWIO, dilation,
grouped convolutions, non-float dtypes, `preferred_element_type`, `out_sharding`) call
plain `lax.conv_general_dilated`. Being a `jax.custom_vjp`, the covered case supports reverse
mode (grad, vjp, vmap of grad, grad of grad) but not forward mode (`jax.jvp`, `jax.jacfwd`).
Use it as

  nnx.Conv(..., conv_general_dilated=fast_conv.conv_general_dilated)
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dpkd_jax.kernels.xla_cpu import banded_conv

_NHWC_SPECS = ("NHWC", "HWIO", "NHWC")
# What `lax.conv_dimension_numbers` makes of `_NHWC_SPECS` (and what nnx.Conv passes for 2-D).
_NHWC_DIMENSION_NUMBERS = lax.ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1),
                                                   out_spec=(0, 3, 1, 2))
# Examples are processed in chunks of about this many grid pixels inside a `lax.scan`, so that
# the shifted copies of a chunk stay in cache: on a 2-core CPU this was 2-5x faster than doing
# the whole batch at once (28x28 maps: 2 examples per chunk; 14x14: 8).
_CHUNK_PIXELS = 2048
# Below this many channels the shifted copies are stacked into one GEMM (T separate GEMMs with
# a few output columns are slow); above it the concatenation costs more than it saves.
_STACK_BELOW_CHANNELS = 16
# With a single input channel XLA's own dW measured as fast or faster (batch and vmapped).
_MIN_IN_CHANNELS = 2
# Since XLA CPU runs its convolutions through YNNPACK (jax 0.10), its own dW wins inside whole
# steps unless the kernel is wide: the GEMM form is kept for C·O >= 64·128 (the DAFL generator
# at width 128), XLA's dW is used below it (small_cnn, LeNet-5, the generator at width 64).
_MIN_CHANNEL_PRODUCT = 64 * 128
# The banded form does Wp / kw times a direct convolution's FLOPs (the band's zeros) but runs as
# one GEMM: it won the forward pass of LeNet-5's 1 → 6 layer and the input gradients of the
# narrow layers (1 → 32, 6 → 16), and lost every wider pass.
_BANDED_FORWARD_MAX = 8
_BANDED_INPUT_GRAD_MAX = 96


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ConvSpec:
  """Static parameters of a supported convolution (hashable: a `custom_vjp` nondiff argument).

  Attributes:
    strides: (stride_h, stride_w).
    padding: explicit ((low_h, high_h), (low_w, high_w)), possibly negative (cropping).
    precision: as for `lax.conv_general_dilated`.
  """

  strides: tuple[int, int]
  padding: tuple[tuple[int, int], tuple[int, int]]
  precision: Any


def _xla_conv(lhs: jax.Array, rhs: jax.Array, spec: _ConvSpec) -> jax.Array:
  """XLA's own NHWC convolution, (B, H, W, C) * (kh, kw, C, O) → (B, Ho, Wo, O)."""
  return lax.conv_general_dilated(lhs, rhs, spec.strides, spec.padding,
                                  dimension_numbers=_NHWC_SPECS, precision=spec.precision)


def _examples_per_chunk(batch: int, grid_pixels: int) -> int:
  """Largest divisor of `batch` whose chunk holds at most `_CHUNK_PIXELS` grid pixels (≥ 1)."""
  target = max(1, _CHUNK_PIXELS // grid_pixels)
  return max(k for k in range(1, min(target, batch) + 1) if batch % k == 0)


def _phase_kernel_grad(x_flat: jax.Array, dy_flat: jax.Array, shifts: Sequence[int], *,
                       move_cotangent: bool, stack: bool, precision: Any) -> jax.Array:
  """Σ_p x[p + shift] · dy[p] over a flat grid, for every shift of one phase.

  Args:
    x_flat: (P, C) one input phase of a chunk, P = examples · Hg · Wg flat grid pixels.
    dy_flat: (P, O) output cotangent on the same grid (zero outside each Ho×Wo corner).
    shifts: the T flat shifts di·Wg + dj of this phase's kernel taps.
    move_cotangent: shift dy (with more input than output channels) rather than x: only the
      operand with fewer channels is copied once per tap.
    stack: concatenate the T shifted copies into one GEMM instead of T GEMMs.
    precision: passed to `lax.dot_general`.

  Returns:
    (T, C, O) float32 (or wider) kernel gradient of the taps, in the order of `shifts`.
  """
  max_shift = max(shifts)
  if move_cotangent:
    # dW[t] = Σ_q x[q] · dy[q − shift_t]; zeros in front keep every slice in range.
    fixed = x_flat  # (P, C)
    padded = jnp.pad(dy_flat, ((max_shift, 0), (0, 0)))  # (S + P, O)
    moved = [padded[max_shift - s:max_shift - s + x_flat.shape[0]] for s in shifts]  # T × (P, O)
  else:
    # dW[t] = Σ_p x[p + shift_t] · dy[p]; dy is zero from P − S on (see the module docstring).
    length = x_flat.shape[0] - max_shift
    fixed = dy_flat[:length]  # (L, O)
    moved = [x_flat[s:s + length] for s in shifts]  # T × (L, C)
  # XLA CPU multiplies (M, K)·(K, N) 2-3x faster than (K, M)ᵀ·(K, N), so the fixed operand is
  # transposed once, to (Cf, P). Written as a batch-1 transpose + batched dot_general, because
  # XLA folds a plain 2-D transpose back into the dot (and takes the slow kernel).
  fixed = jnp.swapaxes(fixed[None], 1, 2)  # (1, Cf, P)
  accumulate = jnp.promote_types(x_flat.dtype, jnp.float32)

  def matmul(rhs: jax.Array) -> jax.Array:  # (P, N) → (Cf, N)
    return lax.dot_general(fixed, rhs[None], (((2,), (1,)), ((0,), (0,))), precision=precision,
                           preferred_element_type=accumulate)[0]

  fixed_channels, moved_channels = fixed.shape[1], moved[0].shape[1]
  if stack:
    grads = matmul(jnp.concatenate(moved, axis=1))  # (Cf, T·Cm)
    grads = grads.reshape(fixed_channels, len(shifts), moved_channels).transpose(1, 0, 2)
  else:
    grads = jnp.stack([matmul(m) for m in moved])  # (T, Cf, Cm)
  return grads if move_cotangent else grads.transpose(0, 2, 1)  # (T, C, O)


def _cpu_kernel_grad(lhs: jax.Array, cotangent: jax.Array, kernel_shape: Sequence[int],
                     spec: _ConvSpec, examples_per_chunk: int | None = None) -> jax.Array:
  """Kernel gradient of a NHWC/HWIO convolution from shifted GEMMs (the fast CPU path).

  Args:
    lhs: (B, H, W, C) convolution input.
    cotangent: (B, Ho, Wo, O) cotangent of the convolution output.
    kernel_shape: (kh, kw, C, O).
    spec: strides, explicit padding and precision of the convolution.
    examples_per_chunk: examples per `lax.scan` step (must divide B); None picks it from the
      map size.

  Returns:
    (kh, kw, C, O) kernel gradient, equal to XLA's up to float rounding.
  """
  batch, height, width, in_channels = lhs.shape
  _, out_h, out_w, out_channels = cotangent.shape
  kernel_h, kernel_w = kernel_shape[0], kernel_shape[1]
  stride_h, stride_w = spec.strides
  (low_h, _), (low_w, _) = spec.padding
  # Phase (pi, pj) holds the taps i = pi + s·di, j = pj + s·dj; all phases share one Hg×Wg grid.
  taps_h, taps_w = -(-kernel_h // stride_h), -(-kernel_w // stride_w)
  grid_h, grid_w = out_h + taps_h - 1, out_w + taps_w - 1
  phases = []
  for phase_h in range(min(stride_h, kernel_h)):
    for phase_w in range(min(stride_w, kernel_w)):
      rows = -(-(kernel_h - phase_h) // stride_h)
      cols = -(-(kernel_w - phase_w) // stride_w)
      shifts = [di * grid_w + dj for di in range(rows) for dj in range(cols)]
      phases.append((phase_h, phase_w, rows, cols, shifts))
  if examples_per_chunk is None:
    examples_per_chunk = _examples_per_chunk(batch, grid_h * grid_w)
  if examples_per_chunk < 1 or batch % examples_per_chunk:
    raise ValueError(f"examples_per_chunk={examples_per_chunk} must divide the batch size {batch}")
  move_cotangent = in_channels >= out_channels
  stack = min(in_channels, out_channels) < _STACK_BELOW_CHANNELS
  pixels = examples_per_chunk * grid_h * grid_w

  def chunk_grads(x: jax.Array, dy: jax.Array) -> tuple[jax.Array, ...]:
    """(k, H, W, C), (k, Ho, Wo, O) → per phase (T, C, O)."""
    # Pad (or crop) to exactly s·Hg rows and s·Wg columns: rows past the last one the
    # convolution reads only ever meet zeros of dy_flat.
    padded = lax.pad(x, jnp.zeros((), x.dtype),
                     ((0, 0, 0), (low_h, stride_h * grid_h - height - low_h, 0),
                      (low_w, stride_w * grid_w - width - low_w, 0), (0, 0, 0)))
    padded = padded.reshape(-1, grid_h, stride_h, grid_w, stride_w, in_channels)
    dy_flat = jnp.pad(dy, ((0, 0), (0, grid_h - out_h), (0, grid_w - out_w), (0, 0)))
    dy_flat = dy_flat.reshape(pixels, out_channels)  # (P, O), dy in each grid's corner
    return tuple(
        _phase_kernel_grad(padded[:, :, phase_h, :, phase_w].reshape(pixels, in_channels),
                           dy_flat, shifts, move_cotangent=move_cotangent, stack=stack,
                           precision=spec.precision)
        for phase_h, phase_w, _, _, shifts in phases)

  num_chunks = batch // examples_per_chunk
  if num_chunks == 1:
    phase_grads = chunk_grads(lhs, cotangent)
  else:
    def accumulate(totals, chunk):
      return tuple(t + g for t, g in zip(totals, chunk_grads(*chunk))), None

    chunks = (lhs.reshape(num_chunks, examples_per_chunk, height, width, in_channels),
              cotangent.reshape(num_chunks, examples_per_chunk, out_h, out_w, out_channels))
    # The first chunk's gradients start the sum (not zeros): inside shard_map the carry then
    # has the inputs' varying type, which constant zeros would not.
    init = chunk_grads(chunks[0][0], chunks[1][0])
    phase_grads, _ = lax.scan(accumulate, init, (chunks[0][1:], chunks[1][1:]))
  grad = jnp.zeros(kernel_shape, phase_grads[0].dtype)
  for (phase_h, phase_w, rows, cols, _), phase_grad in zip(phases, phase_grads):
    grad = grad.at[phase_h::stride_h, phase_w::stride_w].set(
        phase_grad.reshape(rows, cols, in_channels, out_channels))
  return grad.astype(jnp.result_type(lhs, cotangent))


def _xla_kernel_grad(lhs: jax.Array, cotangent: jax.Array, rhs: jax.Array,
                     spec: _ConvSpec) -> jax.Array:
  """XLA's own kernel gradient (kept on GPU/TPU, where cuDNN's is fast), (kh, kw, C, O)."""
  return _vjp(functools.partial(_xla_conv, spec=spec), lhs, rhs, cotangent, 1)


def _vjp(conv: Callable, lhs: jax.Array, rhs: jax.Array, cotangent: jax.Array,
         argnum: int) -> jax.Array:
  """Gradient of `conv(lhs, rhs)` w.r.t. argument `argnum` (linear: only its type matters).

  The vjp is taken at the argument itself, not at zeros of its shape: inside shard_map a
  replicated primal would make the transpose sum the gradients over devices."""
  primals = (lhs, rhs)
  _, vjp = jax.vjp(lambda p: conv(*(p if i == argnum else a for i, a in enumerate(primals))),
                   primals[argnum])
  return vjp(cotangent)[0]


def _route(kind: str, lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...],
           spec: _ConvSpec) -> tuple[str, dict[str, Callable]]:
  """The static rule's form for one pass, and the exact forms by name, each a function of
  (x, w, dy): the input, the kernel and the output's cotangent (the forward pass ignores dy)."""
  in_channels, out_channels = rhs_shape[2], rhs_shape[3]
  xla = functools.partial(_xla_conv, spec=spec)
  forms = {"forward": {"xla": lambda x, w, dy: xla(x, w)},
           "input_grad": {"xla": lambda x, w, dy: _vjp(xla, x, w, dy, 0)},
           "kernel_grad": {"xla": lambda x, w, dy: _xla_kernel_grad(x, dy, w, spec),
                           "gemm": lambda x, w, dy: _cpu_kernel_grad(x, dy, w.shape, spec)}}[kind]
  channel_product = in_channels * out_channels
  if banded_conv.supported(lhs_shape, rhs_shape, spec.strides, spec.padding):
    banded = functools.partial(banded_conv.conv, padding=spec.padding, precision=spec.precision)
    forms["banded"] = {"forward": lambda x, w, dy: banded(x, w),
                       "input_grad": lambda x, w, dy: _vjp(banded, x, w, dy, 0),
                       "kernel_grad": lambda x, w, dy: _vjp(banded, x, w, dy, 1)}[kind]
    if ((kind == "forward" and channel_product <= _BANDED_FORWARD_MAX)
        or (kind == "input_grad" and channel_product <= _BANDED_INPUT_GRAD_MAX)):
      return "banded", forms
  wide = in_channels >= _MIN_IN_CHANNELS and channel_product >= _MIN_CHANNEL_PRODUCT
  return ("gemm" if kind == "kernel_grad" and wide else "xla"), forms


def _run(kind: str, spec: _ConvSpec, lhs: jax.Array, rhs: jax.Array,
         cotangent: jax.Array | None = None) -> jax.Array:
  """One pass by the static rule (or by `_FORCED_FORMS`, where the shape offers that form). A
  form other than XLA's is taken only when lowering for CPU (`lax.platform_dependent`): GPU and
  TPU keep XLA's (cuDNN's) convolutions."""
  static, forms = _route(kind, lhs.shape, rhs.shape, spec)
  form = _FORCED_FORMS.get(kind, static)
  form = form if form in forms else static
  out_shape = _output_shape(lhs.shape, rhs.shape, spec)
  dtype = {"forward": jnp.result_type(lhs, rhs), "input_grad": lhs.dtype,
           "kernel_grad": rhs.dtype}[kind]
  if cotangent is None:
    cotangent = jnp.zeros(out_shape, dtype)  # unused by the forward pass
  if form == "xla":
    return forms["xla"](lhs, rhs, cotangent).astype(dtype)
  return lax.platform_dependent(
      lhs, rhs, cotangent, cpu=lambda *a: forms[form](*a).astype(dtype),
      default=lambda *a: forms["xla"](*a).astype(dtype))


def _output_shape(lhs_shape: Sequence[int], rhs_shape: Sequence[int],
                  spec: _ConvSpec) -> tuple[int, ...]:
  (low_h, high_h), (low_w, high_w) = spec.padding
  out_h = (lhs_shape[1] + low_h + high_h - rhs_shape[0]) // spec.strides[0] + 1
  out_w = (lhs_shape[2] + low_w + high_w - rhs_shape[1]) // spec.strides[1] + 1
  return (lhs_shape[0], out_h, out_w, rhs_shape[3])


# pass -> form name: the tests set it (monkeypatch) to run every exact form, not only the rule's.
_FORCED_FORMS: dict[str, str] = {}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(lhs: jax.Array, rhs: jax.Array, spec: _ConvSpec) -> jax.Array:
  return _run("forward", spec, lhs, rhs)


def _conv_fwd(lhs: jax.Array, rhs: jax.Array,
              spec: _ConvSpec) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  return _run("forward", spec, lhs, rhs), (lhs, rhs)


def _conv_bwd(spec: _ConvSpec, residuals: tuple[jax.Array, jax.Array],
              cotangent: jax.Array) -> tuple[jax.Array, jax.Array]:
  lhs, rhs = residuals
  return (_run("input_grad", spec, lhs, rhs, cotangent),
          _run("kernel_grad", spec, lhs, rhs, cotangent))


_conv.defvjp(_conv_fwd, _conv_bwd)


def _is_ones(values: Sequence[int] | None) -> bool:
  return values is None or all(v == 1 for v in values)


def _supported_spec(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
                    padding: str | Sequence[tuple[int, int]], lhs_dilation: Sequence[int] | None,
                    rhs_dilation: Sequence[int] | None, dimension_numbers: Any,
                    feature_group_count: int, batch_group_count: int, precision: Any,
                    preferred_element_type: Any, out_sharding: Any) -> _ConvSpec | None:
  """The `_ConvSpec` of a convolution the fast path covers, or None to fall back to `lax`.

  Anything unusual (including arguments `lax` would reject) falls back, so that `lax` reports
  its own errors.
  """
  if (getattr(lhs, "ndim", None) != 4 or getattr(rhs, "ndim", None) != 4
      or not _is_ones(lhs_dilation) or not _is_ones(rhs_dilation)
      or feature_group_count != 1 or batch_group_count != 1
      or preferred_element_type is not None or out_sharding is not None
      or lhs.dtype != rhs.dtype or not jnp.issubdtype(lhs.dtype, jnp.floating)):
    return None
  try:
    hash(precision)  # a custom_vjp static argument must be hashable
    if (lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
        != _NHWC_DIMENSION_NUMBERS or lhs.shape[-1] != rhs.shape[2]):
      return None
    strides = tuple(int(s) for s in window_strides)
    if isinstance(padding, str):
      padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], strides, padding)
    pads = tuple((int(low), int(high)) for low, high in padding)
  except (TypeError, ValueError, KeyError, RuntimeError):
    return None
  if len(strides) != 2 or len(pads) != 2 or min(strides) < 1:
    return None
  for size, kernel, (low, high) in zip(lhs.shape[1:3], rhs.shape[:2], pads):
    if size + low < 0 or size + low + high < kernel:
      return None  # an empty output, or a crop beyond the input: left to lax
  return _ConvSpec(strides=strides, padding=pads, precision=precision)


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int],
                         padding: str | Sequence[tuple[int, int]],
                         lhs_dilation: Sequence[int] | None = None,
                         rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1,
                         batch_group_count: int = 1, precision: Any = None,
                         preferred_element_type: Any = None,
                         out_sharding: Any = None) -> jax.Array:
  """`lax.conv_general_dilated` with a fast kernel gradient on CPU (same signature and values).

  Args:
    lhs: input, e.g. (B, H, W, C) with NHWC dimension numbers.
    rhs: kernel, e.g. (kh, kw, C, O) with HWIO dimension numbers.
    window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
    batch_group_count, precision, preferred_element_type, out_sharding: as for
      `lax.conv_general_dilated`.

  Returns:
    The convolution, identical to `lax.conv_general_dilated`'s. For 2-D NHWC/HWIO convolutions
    without dilation or groups, of one floating dtype, the kernel gradient on CPU comes from
    batched GEMMs (equal to XLA's up to float32 rounding); everything else is plain `lax`.
  """
  spec = _supported_spec(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                         dimension_numbers, feature_group_count, batch_group_count, precision,
                         preferred_element_type, out_sharding)
  if spec is None:
    return lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, precision=precision,
        preferred_element_type=preferred_element_type, out_sharding=out_sharding)
  return _conv(lhs, rhs, spec)
