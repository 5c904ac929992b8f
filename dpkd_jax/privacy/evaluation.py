"""ε and δ of an event tree: closed form, exact RR lattice, bounded PLD, or RDP.

`accounting.epsilon` / `accounting.delta_for_epsilon` (re-exported there) route a tree by
what it holds, after `neighbouring.flatten` has merged identical leaves and checked that the
whole tree is under ONE neighbouring relation:

1. Only (non-subsampled) Gaussians: they compose to one Gaussian with
   z = 1/sqrt(Σ count/z²), evaluated exactly in closed form (`gaussian_exact`); no grid, so
   no memory blow-up and no rounding, whatever σ.
2. Only randomized response sharing one ε0: exact loss lattice (`rr_composition`; PLD's
   pessimistic grid would charge small ε0 up to one step per query).
3. Anything else (Laplace, discrete Laplace, RR of several ε0 or beside other events,
   Poisson-subsampled Gaussians): PLD on a grid that is sized before it is built and refined
   until stable (`pld_grid`), capped by the closed-form bound of `_loose_bound` (the pure ε of
   the Laplace, discrete Laplace and RR parts added to the exact ε of the Gaussians,
   subsampling ignored): both bounds are sound, and the cap makes a pure-DP-only tree cost
   exactly its pure ε. A Poisson-subsampled Gaussian is analysed under the tree's relation
   (dp_accounting's REPLACE_ONE or ADD_OR_REMOVE_ONE PLD); the Gaussians of case 1 are merged
   into one Gaussian part first.

A tree with a `ZCDpEvent` (secure-noise releases, `secure_gaussian`: ρ-zCDP, i.e. RDP
ε(α) = ξ + ρα at every order) always goes to the RDP route below, whatever `accountant`.

`accountant="rdp"` uses dp_accounting's RdpAccountant on the same merged parts (REPLACE_ONE
if the tree holds RR). dp-accounting 0.6.0 has no RDP of Poisson sampling under replace-one:
such trees raise ValueError under "rdp".

Conventions for non-subsampled Gaussian / Laplace leaves: noise multiplier = std (Laplace
scale) ÷ the distance of the released values under the tree's relation; the unit-shift
analysis is then exact under either relation. For a Poisson-subsampled Gaussian, z = std ÷
the bound C on one record's contribution (as in dp_accounting): add/remove shifts one mixture
component by C, replace-one moves it from −C to +C.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

from dp_accounting import dp_event
from dp_accounting import privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpkd_jax.privacy import gaussian_exact
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import pld_grid
from dpkd_jax.privacy import rr_composition
from dpkd_jax.privacy import validation

AccountantName = Literal["pld", "rdp"]
# Where the automatic grid starts (it is then refined towards 1e-4 until ε is stable, see
# pld_grid). Passing an explicit value_discretization_interval uses that grid as given.
DEFAULT_VALUE_DISCRETIZATION_INTERVAL = pld_grid.START_INTERVAL
NeighborRel = privacy_accountant.NeighboringRelation
_RELATIONS = {neighbouring.REPLACE_ONE: NeighborRel.REPLACE_ONE,
              neighbouring.ADD_REMOVE: NeighborRel.ADD_OR_REMOVE_ONE, None: None}


def check_accountant(accountant: str, interval: float | None) -> None:
  if accountant not in ("pld", "rdp"):
    raise ValueError(f"accountant must be 'pld' or 'rdp', got {accountant!r}")
  if interval is not None:
    validation.check_float("value_discretization_interval", interval, positive=True)


class _NoGuarantee(Exception):
  """A leaf releases without noise: ε = ∞."""


def _poisson_part(leaf: dp_event.PoissonSampledDpEvent, count: int, relation):
  """Part of one Poisson-sampled leaf (None: releases nothing)."""
  q, inner = float(leaf.sampling_probability), leaf.event
  if isinstance(inner, dp_event.GaussianDpEvent):
    if q == 0 or inner.noise_multiplier == math.inf:
      return None
    if inner.noise_multiplier == 0:
      raise _NoGuarantee()
    if q == 1:  # No sampling: a plain Gaussian; replace-one moves the mean by 2C.
      scale = 2.0 if relation == NeighborRel.REPLACE_ONE else 1.0
      return ("gaussian", inner.noise_multiplier / scale, count)
    return ("poisson_gaussian", q, inner.noise_multiplier, count, relation)
  if isinstance(inner, dp_event.LaplaceDpEvent) and relation != NeighborRel.REPLACE_ONE:
    if q == 0:
      return None
    if inner.noise_multiplier == 0:
      raise _NoGuarantee()
    return ("poisson_laplace", q, inner.noise_multiplier, count)
  raise ValueError(f"cannot account for {leaf}: a Poisson sample of a Gaussian, or of a "
                   "Laplace under add/remove, is supported")


def _leaf_part(leaf: dp_event.DpEvent, count: int, relation):
  """Part of one merged leaf (None: releases nothing); raises _NoGuarantee if noiseless."""
  if isinstance(leaf, dp_event.NonPrivateDpEvent):
    raise _NoGuarantee()
  if isinstance(leaf, dp_event.RandomizedResponseDpEvent):
    if leaf.num_buckets == 1 or leaf.noise_parameter == 1:
      return None  # The output does not depend on the input.
    if leaf.noise_parameter == 0:
      raise _NoGuarantee()
    return ("rr", float(leaf.noise_parameter), int(leaf.num_buckets), count)
  if isinstance(leaf, (dp_event.GaussianDpEvent, dp_event.LaplaceDpEvent)):
    if leaf.noise_multiplier == math.inf:
      return None
    if leaf.noise_multiplier == 0:
      raise _NoGuarantee()
    kind = "gaussian" if isinstance(leaf, dp_event.GaussianDpEvent) else "laplace"
    return (kind, float(leaf.noise_multiplier), count)
  if isinstance(leaf, dp_event.DiscreteLaplaceDpEvent):
    if leaf.noise_parameter == 0:
      raise _NoGuarantee()
    return ("discrete_laplace", float(leaf.noise_parameter), int(leaf.sensitivity), count)
  if isinstance(leaf, dp_event.PoissonSampledDpEvent):
    return _poisson_part(leaf, count, relation)
  if isinstance(leaf, dp_event.ZCDpEvent):
    if leaf.rho < 0 or leaf.xi < 0:
      raise ValueError(f"a zCDP event needs rho, xi >= 0, got {leaf}")
    if leaf.rho == leaf.xi == 0:
      return None
    if math.isinf(leaf.rho) or math.isinf(leaf.xi):
      raise _NoGuarantee()
    return ("zcdp", float(leaf.rho), float(leaf.xi), count)
  raise ValueError(f"cannot account for {type(leaf).__name__}: supported are Gaussian, "
                   "Laplace, DiscreteLaplace, RandomizedResponse, PoissonSampled(Gaussian or "
                   "Laplace), NoOp, "
                   "NonPrivate and Composed / SelfComposed / Tagged trees of them")


def _parts(event: dp_event.DpEvent) -> list[tuple]:
  """Merged parts of a tree; all unsampled Gaussians become one ("gaussian", z)."""
  leaves, relation = neighbouring.flatten(event)
  relation = _RELATIONS[relation]
  parts, precision = [], 0.0  # precision: Σ count / z² of the unsampled Gaussians.
  for leaf, count in leaves:
    part = _leaf_part(leaf, count, relation)
    if part is None:
      continue
    if part[0] == "gaussian":
      precision += part[2] / part[1] ** 2
    else:
      parts.append(part)
  if precision > 0:
    parts.insert(0, ("gaussian", 1.0 / math.sqrt(precision)))
  return parts


def _exact_rr(parts: list[tuple], *, delta: float | None,
              target_epsilon: float | None) -> float | None:
  """ε (or δ) of an RR-only tree whose queries share one ε0; None otherwise."""
  if not all(part[0] == "rr" for part in parts):
    return None
  rr_leaves = [part[1:] for part in parts]
  if rr_composition.common_epsilon0(rr_leaves) is None:
    return None
  if delta is not None:
    return rr_composition.composed_epsilon(delta, rr_leaves)
  return rr_composition.composed_delta(target_epsilon, rr_leaves)


def _rdp(parts: list[tuple], *, delta: float | None, target_epsilon: float | None) -> float:
  """ε or δ from dp_accounting's RdpAccountant on the merged parts."""
  events = []
  for part in parts:
    if part[0] == "poisson_gaussian" and part[4] == NeighborRel.REPLACE_ONE:
      raise ValueError("dp-accounting 0.6.0 has no RDP analysis of Poisson sampling under "
                       "replace-one; use accountant='pld'")
    events.append({
        "gaussian": lambda p: dp_event.GaussianDpEvent(p[1]),
        "laplace": lambda p: dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(p[1]), p[2]),
        "rr": lambda p: dp_event.SelfComposedDpEvent(
            dp_event.RandomizedResponseDpEvent(noise_parameter=p[1], num_buckets=p[2]), p[3]),
        # dp-accounting 0.6.0 has no RDP of the discrete Laplace: its pure ε = a·Δ is charged
        # as binary RR of that ε, which dominates every pure ε-DP mechanism (Kairouz et al.).
        "discrete_laplace": lambda p: dp_event.SelfComposedDpEvent(
            dp_event.RandomizedResponseDpEvent(
                noise_parameter=2.0 / (1.0 + math.exp(p[1] * p[2])), num_buckets=2), p[3]),
        "poisson_gaussian": lambda p: dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(p[1], dp_event.GaussianDpEvent(p[2])), p[3]),
        "poisson_laplace": lambda p: dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(p[1], dp_event.LaplaceDpEvent(p[2])), p[3]),
        "zcdp": lambda p: dp_event.SelfComposedDpEvent(
            dp_event.ZCDpEvent(rho=p[1], xi=p[2]), p[3]),
    }[part[0]](part))
  has_rr = any(part[0] in ("rr", "discrete_laplace") for part in parts)
  acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=(
      NeighborRel.REPLACE_ONE if has_rr else NeighborRel.ADD_OR_REMOVE_ONE))
  try:
    acc.compose(dp_event.ComposedDpEvent(events))
  except privacy_accountant.UnsupportedEventError as err:
    raise ValueError(f"cannot account for this event with RDP: {err}") from err
  if delta is not None:
    return float(acc.get_epsilon(delta))
  return float(acc.get_delta(target_epsilon))


def _loose_bound(parts: list[tuple], *, delta: float | None,
                 target_epsilon: float | None) -> float:
  """Closed-form upper bound when no PLD grid fits (ε of order 10⁶ or more).

  Subsampling is ignored (a Poisson sample of a Gaussian is at most as revealing as the
  Gaussian itself: multiplier z, or z/2 under replace-one) and Laplace / RR parts are charged
  their pure ε (δ = 0): every part then composes in closed form, and soundly.
  """
  precision, pure = 0.0, 0.0
  for part in parts:
    kind = part[0]
    if kind == "gaussian":
      precision += 1.0 / part[1] ** 2
    elif kind == "poisson_gaussian":
      z = part[2] / (2.0 if part[4] == NeighborRel.REPLACE_ONE else 1.0)
      precision += part[3] / z ** 2
    elif kind == "laplace":
      pure += part[2] / part[1]
    elif kind == "poisson_laplace":
      pure += part[3] / part[2]
    elif kind == "discrete_laplace":
      pure += part[3] * part[1] * part[2]  # count · a · Δ
    else:
      pure += part[3] * rr_composition.rr_epsilon0(part[1], part[2])
  z = 1.0 / math.sqrt(precision) if precision > 0 else math.inf
  if delta is not None:
    return gaussian_exact.epsilon_for_delta(delta, z) + pure
  if target_epsilon < pure:
    return 1.0
  return gaussian_exact.delta_for_epsilon(target_epsilon - pure, z)


def _evaluate(event: dp_event.DpEvent, accountant: str, interval: float | None, *,
              delta: float | None = None, target_epsilon: float | None = None) -> float:
  """ε at `delta`, or δ at `target_epsilon`, of an event tree."""
  if not isinstance(event, dp_event.DpEvent):
    raise TypeError(f"event must be a dp_accounting DpEvent, got {event!r}")
  check_accountant(accountant, interval)
  try:
    parts = _parts(event)
  except _NoGuarantee:
    return math.inf if delta is not None else 1.0
  if not parts:
    return 0.0
  return _evaluate_parts(tuple(parts), accountant, interval, delta, target_epsilon)


@functools.lru_cache(maxsize=1024)
def _evaluate_parts(parts: tuple[tuple, ...], accountant: str, interval: float | None,
                    delta: float | None, target_epsilon: float | None) -> float:
  """`_evaluate` of merged, non-empty parts; memoized, as the figure is a pure function of
  them and a run asks for the same one again: a calibration's bracket and bisection, a resumed
  run's plan, the ledger's charges, the report's ε curve. A key is a few numbers per part, so
  the cache holds at most a few hundred kB."""
  if accountant == "rdp" or any(part[0] == "zcdp" for part in parts):
    # zCDP (the secure-noise releases) is an RDP curve ε(α) = ξ + ρα: RDP prices it, and
    # every other part beside it, soundly (no PLD of a zCDP bound exists).
    return _rdp(parts, delta=delta, target_epsilon=target_epsilon)
  if len(parts) == 1 and parts[0][0] == "gaussian":
    z = parts[0][1]
    if delta is not None:
      return gaussian_exact.epsilon_for_delta(delta, z)
    return gaussian_exact.delta_for_epsilon(target_epsilon, z)
  exact = _exact_rr(parts, delta=delta, target_epsilon=target_epsilon)
  if exact is not None:
    return exact
  if delta is not None:
    read = lambda pld: float(pld.get_epsilon_for_delta(delta))  # noqa: E731
  else:
    read = lambda pld: float(pld.get_delta_for_epsilon(target_epsilon))  # noqa: E731
  # ε of the composition is at least ε of its Gaussian part (exact, cheap): a scale for the grid.
  scale = (gaussian_exact.epsilon_for_delta(delta, parts[0][1])
           if delta is not None and parts[0][0] == "gaussian" else 1.0)
  loose = _loose_bound(parts, delta=delta, target_epsilon=target_epsilon)
  try:
    grid = pld_grid.evaluate(parts, read, interval, epsilon_scale=scale)
  except pld_grid.GridTooCoarse:
    return loose
  # Both are upper bounds, so the smaller is sound. The closed form wins where the grid's
  # pessimistic rounding costs more than it saves: e.g. a pure Laplace release, whose grid ε
  # exceeds its exact pure ε by up to one grid step per composed release.
  return min(grid, loose)


def epsilon(event: dp_event.DpEvent, *, delta: float, accountant: AccountantName = "pld",
            value_discretization_interval: float | None = None) -> float:
  """ε spent by `event` at `delta`; `math.inf` if some part has no noise.

  Args:
    event: any tree of the events built in `accounting`, under one neighbouring relation.
    delta: δ in (0, 1).
    accountant: "pld" (exact for Gaussians and RR of one ε0, else a pessimistic grid) or
      "rdp" (looser; dp_accounting's RR RDP under REPLACE_ONE is exact and used as is).
    value_discretization_interval: PLD grid step; None (default) refines the grid from 1e-3
      towards 1e-4 until ε is stable. Any grid is coarsened if it would not fit in memory.

  Returns:
    ε as a float.

  Raises:
    ValueError: parts of `event` are under different neighbouring relations, or an event
      type is not supported.
  """
  return _evaluate(event, accountant, value_discretization_interval,
                   delta=validation.check_delta(delta))


def delta_for_epsilon(event: dp_event.DpEvent, *, epsilon: float,
                      accountant: AccountantName = "pld",
                      value_discretization_interval: float | None = None) -> float:
  """δ of `event` at ε >= 0; 1.0 if some part has no noise.

  Args:
    event: any tree of the events built in `accounting`, under one neighbouring relation.
    epsilon: ε >= 0.
    accountant: "pld" or "rdp".
    value_discretization_interval: PLD grid step (None: automatic, see `epsilon`).

  Returns:
    δ as a float.
  """
  eps = validation.check_float("epsilon", epsilon, positive=False)
  return _evaluate(event, accountant, value_discretization_interval, target_epsilon=eps)
