"""Secure noise: a real release mapped to an integer grid plus exact discrete Gaussian noise.

The default Gaussian releases add float32 `jax.random.normal` noise to a float32 value; the
low-order bits of such a sum can depend on the value in ways the Gaussian analysis does not
model (Mironov 2012 for Laplace; docs/privacy.md "Floating-point noise"). In secure mode the
bounded release x (float, L2 sensitivity Δ) is

  1. scaled to grid units and rounded: n = round(x / γ) (int32);
  2. given exact integer noise: n + Z, Z ~ N_Z(0, g²) per coordinate (`discrete_gaussian`,
     integer arithmetic only), g = σ_abs / γ an integer;
  3. mapped back: (n + Z)·γ (post-processing of the integer vector, which is what is private).

Grid. γ is the per-row bound C divided by about 2^k (`grid_bits` k, default up to 16, smaller
where int32 needs it): g = round(σ·2^k) >= 1 and γ = σ·C / g exactly, so the noise std is
still σ·C. Every grid value satisfies |n| <= max_abs·C/γ + 1 and |Z| <= 64·g
(`discrete_gaussian.max_abs_draw`); `choose_grid` keeps their sum below 2^31.

Sensitivity after rounding (two neighbouring inputs x, x' with ||x - x'|| <= Δ): each rounded
coordinate moves by at most 1/2 from its scaled value, so ||n - n'|| <= Δ/γ + √d (d
coordinates). The float32 scaling x·(1/γ) adds a relative error below 2^-22 to each scaled
coordinate, covered by the slack 2^-20·(Δ + 2·X)/γ (X the L2 bound of x itself). So

  Δ_grid = Δ/γ + √d + 2^-20·(Δ + 2X)/γ,

and by Canonne, Kamath, Steinke 2020 (their multivariate discrete Gaussian theorem: independent
N_Z(0, g²) on each coordinate of an integer query of L2 sensitivity Δ_grid) one release is
ρ-zCDP with ρ = Δ_grid² / (2g²): `dp_event.ZCDpEvent(ρ)`, priced by dp_accounting's RDP
accountant (`evaluation.py`). With γ = C/2^k the rounding term √d is a fraction
√d / (Δ·2^k / C) of Δ/γ (for DPDFD's rows: √K / (2m·2^k)).
"""

from __future__ import annotations

import fractions
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dpkd_jax.privacy import discrete_gaussian

DEFAULT_GRID_BITS = 16
MIN_GRID_BITS = 4
_FLOAT_SLACK = 2.0**-20
_INT32_MAX = 2**31 - 1


class Grid(NamedTuple):
  """The integer grid of one secure release.

  Attributes:
    grid_sigma: g, the integer std of the discrete Gaussian in grid units.
    step: γ = σ·C / g, the grid step in the release's units.
    bits: k, with γ about C / 2^k.
  """

  grid_sigma: int
  step: float
  bits: int


def _fits(sigma: float, bits: int, max_abs: float) -> bool:
  g = max(1, round(sigma * 2**bits))
  try:
    discrete_gaussian.check_sigma(g)
  except ValueError:
    return False
  values = max_abs * g / sigma + 1  # |round(x/γ)| for |x| <= max_abs·C
  return values + discrete_gaussian.max_abs_draw(g) < _INT32_MAX


def choose_grid(*, noise_multiplier: float, bound: float, max_abs: float = 1.0,
                grid_bits: int | None = None) -> Grid:
  """The grid of a release with noise std σ·C whose coordinates satisfy |x| <= max_abs·C.

  Args:
    noise_multiplier: σ > 0, the noise std in units of C.
    bound: C > 0, the release's norm bound (per row).
    max_abs: the largest |coordinate| in units of C (e.g. n for a sum over n teachers).
    grid_bits: k; None picks the largest k <= `DEFAULT_GRID_BITS` whose values fit int32.

  Raises:
    ValueError: σ <= 0, or no k >= `MIN_GRID_BITS` (or the given one) fits int32.
  """
  sigma, bound = float(noise_multiplier), float(bound)
  if not (sigma > 0 and math.isfinite(sigma)):
    raise ValueError(f"secure noise needs a finite noise multiplier > 0, got {sigma}")
  if not bound > 0:
    raise ValueError(f"bound must be > 0, got {bound}")
  if grid_bits is None:
    candidates = range(DEFAULT_GRID_BITS, MIN_GRID_BITS - 1, -1)
  else:
    if isinstance(grid_bits, bool) or not isinstance(grid_bits, int) or not 1 <= grid_bits <= 30:
      raise ValueError(f"grid_bits must be an integer in [1, 30], got {grid_bits!r}")
    candidates = (grid_bits,)
  for bits in candidates:
    if _fits(sigma, bits, max_abs):
      g = max(1, round(sigma * 2**bits))
      return Grid(grid_sigma=g, step=sigma * bound / g, bits=bits)
  raise ValueError(f"noise multiplier {sigma} with |x| <= {max_abs}·C leaves no int32 grid "
                   f"(grid_bits {grid_bits if grid_bits is not None else 'auto'})")


def grid_l2_sensitivity(*, l2_sensitivity: float, l2_bound: float, dims: int,
                        step: float) -> float:
  """Δ_grid = Δ/γ + √d + 2^-20·(Δ + 2X)/γ (module docstring), in grid units.

  Args:
    l2_sensitivity: Δ of the real release under the caller's relation.
    l2_bound: X, the largest L2 norm of the real release.
    dims: d, its number of coordinates.
    step: γ.
  """
  return (l2_sensitivity / step + math.sqrt(dims)
          + _FLOAT_SLACK * (l2_sensitivity + 2 * l2_bound) / step)


def zcdp_rho(*, grid_sensitivity: float, grid_sigma: int) -> float:
  """ρ = Δ_grid² / (2g²) of one release (CKS 2020, multivariate)."""
  return grid_sensitivity**2 / (2.0 * grid_sigma**2)


def release_rho(*, noise_multiplier: float, max_abs: float, l2_sensitivity: float,
                l2_bound: float, dims: int, grid_bits: int | None = None) -> float:
  """ρ of one secure release in units of C = 1 (C cancels): the grid `choose_grid` picks, its
  rounding-aware `grid_l2_sensitivity` and `zcdp_rho`. The arguments are those of the three."""
  grid = choose_grid(noise_multiplier=noise_multiplier, bound=1.0, max_abs=max_abs,
                     grid_bits=grid_bits)
  sensitivity = grid_l2_sensitivity(l2_sensitivity=l2_sensitivity, l2_bound=l2_bound,
                                    dims=dims, step=grid.step)
  return zcdp_rho(grid_sensitivity=sensitivity, grid_sigma=grid.grid_sigma)


def add_grid_noise(key: jax.Array, x: jax.Array, grid: Grid) -> jax.Array:
  """(n + Z)·γ with n = round(x/γ), Z ~ N_Z(0, g²) per coordinate: float, x's shape/dtype.

  The caller has bounded x (|x| within the grid's `max_abs`); non-finite x is not allowed.
  """
  scaled = jnp.round(x * jnp.asarray(1.0 / grid.step, x.dtype)).astype(jnp.int32)
  noise = discrete_gaussian.sample(key, x.shape, fractions.Fraction(grid.grid_sigma))
  return ((scaled + noise).astype(x.dtype) * jnp.asarray(grid.step, x.dtype))
