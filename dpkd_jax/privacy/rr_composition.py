"""Exact (ε, δ) of n composed randomized-response queries with one common ε0.

Why not PLD: dp_accounting rounds every privacy loss *up* to its grid
(pessimistic). RR has losses ±ε0 (and 0 for k > 2), so when ε0 is comparable to
the grid step each query is charged up to one extra step, and after n queries
the bias is ~n·step. With the default step 1e-3 and n = 25,600 queries of
ε0 = 1e-3, PLD reports ε ≈ 13.07 where the exact figure is 0.57; even a grid step
equal to ε0 does not help, because floating point puts ε0/step just above an
integer and the ceiling adds a step. Here the losses are integer multiples of
ε0, so the composed loss distribution lives on an exact lattice and can be
computed without any rounding.

Relation: REPLACE_ONE of the true label (each query is an ε0-DP mechanism); the
caller decides what one query is (see `accounting.srr_event`).

Dominating pair of one k-ary RR with noise parameter p (output uniform w.p. p,
else the true label): P = output distribution for label a, Q = for label b. The
privacy loss log(P(o)/Q(o)) is +ε0 on o = a (probability 1 − p + p/k under P),
−ε0 on o = b (p/k) and 0 elsewhere ((k − 2)·p/k), with ε0 = log(1 + k(1 − p)/p).
The pair is symmetric, so one loss distribution serves both directions. For n
queries the loss is ε0·j with j the sum of n i.i.d. steps in {−1, 0, +1}; then
δ(ε) = Σ_j P(j)·(1 − e^{ε − ε0 j})_+ (hockey-stick divergence), exactly.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize
from scipy import signal
from scipy import stats


def rr_epsilon0(noise_parameter: float, num_buckets: int) -> float:
  """ε0 of one k-ary RR query with noise parameter p: log(1 + k(1 − p)/p)."""
  return math.log1p(num_buckets * (1.0 - noise_parameter) / noise_parameter)


def _step_pmf(noise_parameter: float, num_buckets: int) -> np.ndarray:
  """(3,) probabilities of a loss step −1, 0, +1 (units of ε0) under P."""
  p, k = noise_parameter, num_buckets
  return np.array([p / k, (k - 2) * p / k, 1.0 - p + p / k])


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  # fftconvolve's round-off is ~1e-16 of the largest mass: far below the δ we
  # resolve (>= 1e-12); negative round-off is clipped.
  return np.clip(signal.fftconvolve(a, b), 0.0, None)


def loss_pmf(noise_parameter: float, num_buckets: int, num_queries: int) -> np.ndarray:
  """(2n + 1,) probabilities of the composed loss ε0·j, j = −n..n, under P.

  Args:
    noise_parameter: p in (0, 1).
    num_buckets: k >= 2.
    num_queries: n >= 1.

  Returns:
    pmf[j + n] = P(loss = ε0·j).
  """
  if num_buckets == 2:
    # Binomial: j = 2·(number of +1 steps) − n; no 0 steps when k = 2.
    plus = 1.0 - noise_parameter / 2.0
    pmf = np.zeros(2 * num_queries + 1)
    pmf[::2] = stats.binom.pmf(np.arange(num_queries + 1), num_queries, plus)
    return pmf
  # Exponentiation by squaring: O(n log n) with FFT convolutions.
  result, power, remaining = np.array([1.0]), _step_pmf(noise_parameter, num_buckets), num_queries
  while remaining:
    if remaining & 1:
      result = _convolve(result, power)
    remaining >>= 1
    if remaining:
      power = _convolve(power, power)
  return result / result.sum()


RRLeaf = tuple[float, int, int]  # (noise_parameter p, num_buckets k, num_queries n)


def common_epsilon0(leaves: list[RRLeaf]) -> float | None:
  """The ε0 shared by all leaves (relative tolerance 1e-12), else None."""
  eps0s = [rr_epsilon0(p, k) for p, k, _ in leaves]
  if all(math.isclose(e, eps0s[0], rel_tol=1e-12) for e in eps0s):
    return max(eps0s)  # The largest of (numerically) equal values: pessimistic.
  return None


def _composed_losses(leaves: list[RRLeaf]) -> tuple[np.ndarray, np.ndarray]:
  """Loss values (ε0·j) and their probabilities for all leaves composed."""
  eps0 = common_epsilon0(leaves)
  if eps0 is None:
    raise ValueError("RR leaves with different ε0 do not share a loss lattice")
  pmf = np.array([1.0])
  for p, k, n in leaves:
    pmf = _convolve(pmf, loss_pmf(p, k, n)) if pmf.size > 1 else loss_pmf(p, k, n)
  total = (pmf.size - 1) // 2
  return eps0 * np.arange(-total, total + 1), pmf / pmf.sum()


def _hockey_stick(epsilon: float, losses: np.ndarray, pmf: np.ndarray) -> float:
  mask = losses > epsilon
  return float(np.sum(pmf[mask] * -np.expm1(epsilon - losses[mask])))


def composed_delta(epsilon: float, leaves: list[RRLeaf]) -> float:
  """Exact δ(ε) of the composition of RR queries that share one ε0.

  Args:
    epsilon: ε >= 0.
    leaves: (p, k, n) per group of n identical k-ary queries.

  Returns:
    δ in [0, 1].
  """
  losses, pmf = _composed_losses(leaves)
  return _hockey_stick(epsilon, losses, pmf)


def composed_epsilon(delta: float, leaves: list[RRLeaf]) -> float:
  """Smallest ε with δ(ε) <= `delta` (rounded up by the root finder's tolerance).

  Args:
    delta: target δ in (0, 1).
    leaves: (p, k, n) per group of n identical k-ary queries, one common ε0.

  Returns:
    ε >= 0 (at most N·ε0, the pure-DP bound of N queries).
  """
  losses, pmf = _composed_losses(leaves)
  upper = float(losses[-1])

  def excess(eps: float) -> float:
    return _hockey_stick(eps, losses, pmf) - delta

  if excess(0.0) <= 0.0:
    return 0.0
  tol = 1e-10 * max(1.0, upper)
  # brentq returns a point within `tol` of the root; adding `tol` keeps the
  # answer on the safe side (δ is decreasing in ε). δ(upper) = 0 < delta.
  return min(upper, optimize.brentq(excess, 0.0, upper, xtol=tol) + tol)
