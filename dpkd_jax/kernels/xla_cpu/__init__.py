"""The opt-in XLA CPU kernels: the same functions as `kernels.reference`, faster on XLA CPU.

Each op below computes the reference op's values and gradients to float32 rounding
(tests/test_fast_*.py, tests/test_banded_conv.py, tests/test_upsample_conv.py) and falls back to
the reference for any configuration or input it does not cover. Their `custom_vjp`s give up
forward-mode differentiation (`jax.jvp`), which is one reason they are opt-in. The convolution's
non-XLA forms run only when lowering for CPU (`lax.platform_dependent`); the fused norm and
pool ops run on every backend. Which pays, and by how much, is measured by
`benchmarks/perf_table.py` (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dpkd_jax.kernels import reference
from dpkd_jax.kernels.xla_cpu import (fast_batch_norm_pool, fast_conv, fast_norm, fast_norm_pool,
                                      upsample_conv)


def norm_relu_max_pool(norm: object, y: jax.Array, *, train: bool) -> jax.Array | None:
  """`max_pool_2x2(relu(norm(y)))` as one op for a plain BatchNorm in training mode
  (`fast_batch_norm_pool`: batch statistics, running averages updated as flax does) or a plain
  GroupNorm (`fast_norm_pool`), (B, H, W, C) → (B, H/2, W/2, C); None for anything else."""
  if train and fast_batch_norm_pool.is_plain(norm, y):
    return fast_batch_norm_pool.apply(norm, y)
  if (type(norm) is nnx.GroupNorm and fast_norm.is_plain(norm, y)
      and fast_norm_pool.supported(y, norm.scale[...], norm.bias[...])):
    return fast_norm_pool.group_norm_relu_max_pool(y, norm.scale[...], norm.bias[...],
                                                   num_groups=norm.num_groups,
                                                   epsilon=norm.epsilon)
  return None


def tapped_group_norm_relu_max_pool(
    layer: nnx.GroupNorm, x: jax.Array,
    tap: Callable[[tuple[int, ...], jnp.dtype], jax.Array]
) -> tuple[jax.Array, jax.Array] | None:
  """Ghost clipping's tap on a plain GroupNorm → ReLU → 2×2 pool as one op (`fast_norm_pool`).

  Args:
    layer: the GroupNorm.
    x: (B, H, W, C) input.
    tap: called once with the tap's shape (B, H/2, W/2, C) and dtype; returns the zero tap
      (ghost clipping records and checks the layer there).

  Returns:
    (out, x̂ at each window's selected position), both (B, H/2, W/2, C); None (tap not called)
    for a configuration or input the op does not take.
  """
  if not (fast_norm.is_plain(layer, x)
          and fast_norm_pool.supported(x, layer.scale[...], layer.bias[...])):
    return None
  batch, height, width, channels = x.shape
  tapped = tap((batch, height // 2, width // 2, channels), x.dtype)
  # One read of each parameter, by a (2, C) stack: ghost's weight-tying check counts the
  # equations that read a parameter, inside called functions too, and the op reads its
  # scale and bias at several places.
  scale, bias = jnp.stack([layer.scale[...], layer.bias[...]])
  return fast_norm_pool.tapped_group_norm_relu_max_pool(
      x, scale, bias, tapped, num_groups=layer.num_groups, epsilon=layer.epsilon)


# The seam's ops (`kernels.Ops` fields) by name. The standalone max-pool and GroupNorm stay the
# reference ops: taken out one at a time from an idle table, neither made any step 5% faster
# (docs/PERFORMANCE.md, "which kernel pays"); `fast_pool` and `fast_norm` remain the parts of
# the fused norm → ReLU → pool ops that did pay.
OPS = {"conv_general_dilated": fast_conv.conv_general_dilated,
       "max_pool_2x2": reference.max_pool_2x2,
       "group_norm": reference.group_norm,
       "norm_relu_max_pool": norm_relu_max_pool,
       "upsample_conv": upsample_conv.apply,
       "normalised_group_norm": reference.normalised_group_norm,
       "tapped_group_norm_relu_max_pool": tapped_group_norm_relu_max_pool}
