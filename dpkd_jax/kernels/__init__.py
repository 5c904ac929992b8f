"""Performance-only kernels behind one seam: the model zoo computes with plain JAX by default.

The model zoo calls the ops of this module (a convolution, a 2×2 max-pool, GroupNorm, a fused
norm → ReLU → pool stage, a 2× upsampling convolution, and ghost clipping's tap on that fused
stage). Each dispatches, when it is traced, to the active `Ops`:

  * `REFERENCE` (the default): `jax.lax` and Flax ops (`kernels.reference`). Every backend and
    every transformation takes them (jvp, export with symbolic shapes, lowering for TPU/GPU).
  * `XLA_CPU`: hand-written kernels that are faster on XLA CPU (`kernels.xla_cpu`), equal to the
    reference to float32 rounding; reverse mode only.

Choosing the kernels changes speed, never the mechanism (the noise, the clipping, the
accounting), as jax_privacy keeps its performance flags apart from mechanism behaviour. The
choice is read while a step is traced, so make it before building and calling steps:

    from dpkd_jax import kernels
    kernels.use_cpu_kernels()      # once, before JAX starts its CPU backend (XLA flag) and
                                   # before any step is traced

The command-line entry points turn the CPU kernels on when JAX's backend is the CPU
(`--cpu_kernels`, on by default; `--nocpu_kernels` keeps the reference ops). Importing
`dpkd_jax` changes no environment variable and writes no file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator

import jax

from dpkd_jax.kernels import reference


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ops:
  """One implementation of every op of the seam (signatures: `kernels.reference`)."""

  name: str
  conv_general_dilated: Callable
  max_pool_2x2: Callable
  group_norm: Callable
  norm_relu_max_pool: Callable
  upsample_conv: Callable
  normalised_group_norm: Callable
  tapped_group_norm_relu_max_pool: Callable


REFERENCE = Ops(name="reference", **{field.name: getattr(reference, field.name)
                                     for field in dataclasses.fields(Ops) if field.name != "name"})
_ACTIVE = [REFERENCE]


@functools.cache
def xla_cpu_ops() -> Ops:
  """The XLA CPU kernels as an `Ops` (imported and built on first use)."""
  from dpkd_jax.kernels import xla_cpu  # pylint: disable=g-import-not-at-top
  return Ops(name="xla_cpu", **xla_cpu.OPS)


def active() -> Ops:
  """The ops steps traced now compute with."""
  return _ACTIVE[0]


def use(ops: Ops) -> Ops:
  """Makes `ops` active for steps traced from now on; returns the ops that were active."""
  if not isinstance(ops, Ops):
    raise TypeError(f"expected kernels.Ops, got {type(ops).__name__}")
  previous, _ACTIVE[0] = _ACTIVE[0], ops
  return previous


@contextlib.contextmanager
def using(ops: Ops) -> Iterator[Ops]:
  """`use(ops)` for the steps traced inside the block (e.g. both implementations side by side
  in one benchmark)."""
  previous = use(ops)
  try:
    yield ops
  finally:
    use(previous)


def use_cpu_kernels() -> list[str]:
  """Turns on the CPU kernels and this library's XLA CPU options, the documented opt-in.

  The options are appended to `XLA_FLAGS` only if JAX has not started its backend yet (XLA reads
  the variable once) and the flag is not named there already; the kernels take effect for steps
  traced afterwards. Returns the XLA flags added ([] if none).
  """
  from dpkd_jax.kernels.xla_cpu import flags  # pylint: disable=g-import-not-at-top
  added = flags.apply_defaults()
  use(xla_cpu_ops())
  return added


def use_cpu_kernels_on_cpu_backend() -> bool:
  """The command-line default: the CPU kernels when JAX's default backend is the CPU (the XLA
  options are set first: they only concern the CPU backend). Returns whether they are on."""
  from dpkd_jax.kernels.xla_cpu import flags  # pylint: disable=g-import-not-at-top
  flags.apply_defaults()
  if jax.default_backend() != "cpu":
    return False
  use(xla_cpu_ops())
  return True


def cache_per_ops(build: Callable) -> Callable:
  """`functools.cache` for a builder of jitted functions, with one entry per active `Ops`.

  A jitted function keeps the trace of the ops that were active when it was first called, and
  jax's cache does not know about this seam: a memoized step built under the reference ops and
  reused under the CPU kernels would silently run the reference ops. Keyed by the ops too, each
  set of ops gets its own jitted function (call it with the ops it was built under).
  """
  cached = functools.cache(lambda ops, *args, **kwargs: build(*args, **kwargs))

  @functools.wraps(build)
  def wrapper(*args, **kwargs):
    return cached(_ACTIVE[0], *args, **kwargs)

  wrapper.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
  return wrapper


# The seam's ops, as the model zoo calls them: each runs the active implementation.


def conv_general_dilated(*args, **kwargs) -> jax.Array:
  """`lax.conv_general_dilated` (same signature and values): pass it to `nnx.Conv`."""
  return _ACTIVE[0].conv_general_dilated(*args, **kwargs)


def max_pool_2x2(x: jax.Array) -> jax.Array:
  """2×2 max-pool, stride 2, VALID (`nnx.max_pool`), (B, H, W, C) → (B, H/2, W/2, C)."""
  return _ACTIVE[0].max_pool_2x2(x)


def group_norm(layer, x: jax.Array) -> jax.Array:
  """`layer(x)` for an `nnx.GroupNorm` layer, (B, ..., C)."""
  return _ACTIVE[0].group_norm(layer, x)


def norm_relu_max_pool(norm, y: jax.Array, *, train: bool) -> jax.Array | None:
  """`max_pool_2x2(relu(norm(y)))` as one fused op, or None: apply the layers in turn."""
  return _ACTIVE[0].norm_relu_max_pool(norm, y, train=train)


def upsample_conv(conv, x: jax.Array) -> jax.Array:
  """`conv(upsample_nearest_2x(x))` with the layer's own parameters, (B, H, W, C) →
  (B, 2H, 2W, O)."""
  return _ACTIVE[0].upsample_conv(conv, x)


def normalised_group_norm(layer, x: jax.Array) -> jax.Array | None:
  """A GroupNorm's output with scale 1 and bias 0, or None: compute it through the layer."""
  return _ACTIVE[0].normalised_group_norm(layer, x)


def tapped_group_norm_relu_max_pool(layer, x: jax.Array, tap: Callable
                                    ) -> tuple[jax.Array, jax.Array] | None:
  """A fused kernel's own ghost-clipping tap (see `xla_cpu.tapped_group_norm_relu_max_pool`),
  or None: tap the layers in turn."""
  return _ACTIVE[0].tapped_group_norm_relu_max_pool(layer, x, tap)
