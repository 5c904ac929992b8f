"""Exact (ε, δ) of the Gaussian mechanism, in log space (no grid, no overflow).

k Gaussian releases with unit shift and noise multipliers z_i compose to ONE Gaussian with
z = 1/sqrt(Σ 1/z_i²) (their privacy-loss distributions are Gaussians whose means and
variances add), so a whole pure-Gaussian run costs one closed-form evaluation. For one
Gaussian, with a = 1/(2z) − εz and b = −1/(2z) − εz (Balle & Wang 2018, Theorem 8):

  δ(ε) = Φ(a) − e^ε Φ(b).

For tiny z (ε in the millions) e^ε overflows and Φ(b) underflows; with erfcx(x) =
e^{x²} erfc(x) and the identity ε − b²/2 = −a²/2,

  e^ε Φ(b) = e^{−a²/2} · erfcx(−b/√2) / 2,   Φ(a) = e^{−a²/2} · erfcx(−a/√2) / 2 (a < 0),

so log δ is a difference of two log terms of moderate size. ε(δ) is the root of the
decreasing log δ(ε) − log δ, bracketed by doubling and then moved up to the sound side.
"""

from __future__ import annotations

import math

from scipy import optimize
from scipy import special

_SQRT2 = math.sqrt(2.0)


def _log_half_erfcx(x: float) -> float:
  return math.log(0.5 * float(special.erfcx(x)))


def log_delta(epsilon: float, z: float) -> float:
  """log δ(ε) of one Gaussian with unit shift and std z > 0 (−inf for δ = 0).

  Args:
    epsilon: ε >= 0.
    z: noise multiplier.

  Returns:
    log δ.
  """
  a = 0.5 / z - epsilon * z
  b = -0.5 / z - epsilon * z  # < 0 for ε >= 0
  log_second = -0.5 * a * a + _log_half_erfcx(-b / _SQRT2)
  log_first = (float(special.log_ndtr(a)) if a >= 0
               else -0.5 * a * a + _log_half_erfcx(-a / _SQRT2))
  if log_second >= log_first:
    return -math.inf
  return log_first + math.log1p(-math.exp(log_second - log_first))


def delta_for_epsilon(epsilon: float, z: float) -> float:
  """δ at ε of one Gaussian with unit shift and std z (z = inf: 0)."""
  if z == math.inf:
    return 0.0
  return math.exp(log_delta(epsilon, z))


def epsilon_for_delta(delta: float, z: float) -> float:
  """Smallest ε (up to round-off, never below it) with δ(ε) <= delta; z > 0, delta in (0, 1).

  Args:
    delta: target δ.
    z: noise multiplier (std over the unit shift).

  Returns:
    ε >= 0.
  """
  if z == math.inf:
    return 0.0
  target = math.log(delta)
  if log_delta(0.0, z) <= target:
    return 0.0
  # ε is about μ²/2 + μ·sqrt(2 log(1/δ)) with μ = 1/z: start there and double.
  mu = 1.0 / z
  hi = max(1.0, 0.5 * mu * mu + mu * math.sqrt(2.0 * math.log(1.0 / delta)))
  lo = 0.0
  while log_delta(hi, z) > target:
    lo, hi = hi, 2.0 * hi
  eps = optimize.brentq(lambda e: log_delta(e, z) - target, lo, hi,
                        xtol=1e-12, rtol=1e-15, maxiter=500)
  # brentq may land a hair below the root: step up until δ(ε) <= target.
  step = max(1e-12, 1e-14 * eps)
  while log_delta(eps, z) > target:
    eps += step
    step *= 2.0
  return float(eps)
