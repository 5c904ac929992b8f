"""Privacy-loss-distribution (PLD) evaluation on a bounded, self-refining grid.

Two failure modes of a fixed grid step h, both fixed here:

* Memory and time: a PLD holds (loss range)/h probabilities. A Gaussian of std s has a loss
  range of order 1/s², a Poisson-subsampled one with small z about as much per step, and a
  T-fold composition up to T times that: DPDFD at σ = 1 (s = 1/320) asked for ~18 GB at
  h = 1e-3. dp_accounting also builds a subsampled mechanism's PLD point by point in Python
  (~30 µs a point). So the smallest admissible step is computed BEFORE anything is built
  (`_min_interval`): the single-step loss range from the mechanism's own tails, and a T-fold
  composition's width from dp_accounting's Chernoff truncation bound on a cheap coarse pilot.
  Each array then holds <= `MAX_POINTS` probabilities, a subsampled single step <=
  `MAX_BUILD_POINTS`. A coarser grid stays pessimistic: ε stays an upper bound (and is then
  large, so the relative rounding is small).
* Accuracy: pessimistic rounding costs up to one step per composed mechanism. DP-SGD with
  q = 0.0011, z = 2.72, T = 6089 came out 42% above its 1e-4 grid at h = 1e-3. With no
  explicit h, the grid is refined by √10 from 3.2e-3 down to `FINE_INTERVAL` (1e-4), and
  stops at 1e-3 or below as soon as two successive figures agree within
  `RELATIVE_TOLERANCE`; the last (finest) one is returned. Pessimistic rounding shrinks
  roughly in proportion to h, so the returned figure is then within about that tolerance of
  any finer grid.

If even the smallest admissible step exceeds `MAX_INTERVAL` (ε of order 10⁶ and more),
`GridTooCoarse` is raised and `evaluation` falls back to a closed-form upper bound.

Internals of dp-accounting 0.6.0 used (pinned): `PrivacyLossDistribution._pmf_remove`,
`._pmf_add`, `._symmetric`, and the dense PMF's `_probs`.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

from dp_accounting import privacy_accountant
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as loss_lib

NeighborRel = privacy_accountant.NeighboringRelation
MAX_POINTS = 1 << 20  # Probabilities per array (~200 MB peak while the largest is built).
MAX_BUILD_POINTS = 1 << 16  # Per subsampled single step, over its PMFs (~2 s to build).
START_INTERVAL = 1e-3
FINE_INTERVAL = 1e-4
MAX_INTERVAL = 10.0  # Coarser than this, dp_accounting's grid arithmetic stops being sane.
RELATIVE_TOLERANCE = 5e-3
_REFINE = math.sqrt(10.0)  # 1e-3 -> 3.2e-4 -> 1e-4.
_TAIL_MASS_TRUNCATION = 1e-15  # dp_accounting's default for compose / self_compose.
_PILOT_POINTS = 2048
_SAFETY = 1.1


class GridTooCoarse(Exception):
  """No grid step <= MAX_INTERVAL keeps the arrays within MAX_POINTS."""


def _losses(part: tuple) -> list[loss_lib.AdditiveNoisePrivacyLoss]:
  """The privacy-loss objects whose PMFs dp_accounting builds for one step of a part."""
  kind = part[0]
  if kind == "gaussian":
    return [loss_lib.GaussianPrivacyLoss(part[1])]
  if kind == "laplace":
    return [loss_lib.LaplacePrivacyLoss(part[1])]
  if kind == "discrete_laplace":
    return [loss_lib.DiscreteLaplacePrivacyLoss(part[1], sensitivity=part[2])]
  if kind == "poisson_gaussian":
    _, q, z, _, relation = part
    if relation == NeighborRel.REPLACE_ONE:
      return [loss_lib.GaussianPrivacyLoss(z, sampling_prob=q,
                                           adjacency_type=loss_lib.AdjacencyType.REPLACE)]
    return [loss_lib.GaussianPrivacyLoss(z, sampling_prob=q, adjacency_type=adjacency)
            for adjacency in (loss_lib.AdjacencyType.REMOVE, loss_lib.AdjacencyType.ADD)]
  if kind == "poisson_laplace":
    _, q, b, _ = part
    return [loss_lib.LaplacePrivacyLoss(b, sampling_prob=q, adjacency_type=adjacency)
            for adjacency in (loss_lib.AdjacencyType.REMOVE, loss_lib.AdjacencyType.ADD)]
  raise ValueError(f"unknown PLD part {part!r}")


def _loss_range(loss: loss_lib.AdditiveNoisePrivacyLoss) -> float:
  """Width (nats) of the truncated privacy-loss support that dp_accounting discretizes."""
  tail = loss.privacy_loss_tail()
  return abs(loss.privacy_loss(tail.lower_x_truncation)
             - loss.privacy_loss(tail.upper_x_truncation))


def _dense_probs(pld) -> list:
  # pylint: disable=protected-access
  pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
  return [pmf.to_dense_pmf()._probs for pmf in pmfs]


def single_pld(part: tuple, interval: float):
  """PLD of ONE step of a part (RR: one query).

  A Poisson-subsampled step is built point by point in Python (seconds), and a run asks for
  the same one again and again (calibration, then every ledger charge and report; a resumed
  run, a second target of the same shape): it is memoized on its parameters and the grid step,
  the step count left out (one step's PLD does not depend on it). At most `MAX_BUILD_POINTS`
  probabilities per PMF, so the cache holds at most about 32 MB. dp_accounting's composition
  and queries return new objects and never write into a PLD they are given
  (tests/test_pld_grid.py checks that a reused one is unchanged).
  """
  if part[0] == "poisson_gaussian":
    _, q, z, _, relation = part
    return _subsampled_pld(("poisson_gaussian", float(q), float(z), relation), float(interval))
  if part[0] == "poisson_laplace":
    _, q, b, _ = part
    return _subsampled_pld(("poisson_laplace", float(q), float(b)), float(interval))
  return _build_single_pld(part, interval)


@functools.lru_cache(maxsize=32)
def _subsampled_pld(key: tuple, interval: float):
  """`_build_single_pld` of a subsampled part without its step count (`single_pld`)."""
  return _build_single_pld((*key[:3], 1, *key[3:]), interval)


def _build_single_pld(part: tuple, interval: float):
  kind = part[0]
  if kind == "rr":
    return pld_lib.from_randomized_response(
        noise_parameter=part[1], num_buckets=part[2], value_discretization_interval=interval,
        neighboring_relation=NeighborRel.REPLACE_ONE)
  if kind == "gaussian":
    return pld_lib.from_gaussian_mechanism(standard_deviation=part[1],
                                           value_discretization_interval=interval)
  if kind == "laplace":
    return pld_lib.from_laplace_mechanism(parameter=part[1],
                                          value_discretization_interval=interval)
  if kind == "discrete_laplace":
    return pld_lib.from_discrete_laplace_mechanism(parameter=part[1], sensitivity=part[2],
                                                   value_discretization_interval=interval)
  if kind == "poisson_gaussian":
    _, q, z, _, relation = part
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=z, sampling_prob=q, value_discretization_interval=interval,
        neighboring_relation=relation)
  _, q, b, _ = part
  return pld_lib.from_laplace_mechanism(parameter=b, sampling_prob=q,
                                        value_discretization_interval=interval)


def _count(part: tuple) -> int:
  return 1 if part[0] == "gaussian" else part[-2 if part[0] == "poisson_gaussian" else -1]


def _widths(part: tuple) -> tuple[float, float]:
  """(single-step step floor, composed width in nats) of a part, from cheap computations."""
  if part[0] == "rr":
    single_range = 2.0 * math.log1p(part[2] * (1.0 - part[1]) / part[1])
    floor = 0.0  # Sparse: a few points whatever the step.
  elif part[0] == "discrete_laplace":
    # Losses a·(|x − Δ| − |x|) lie in [−aΔ, aΔ]; dp_accounting's tail object for it reports
    # an empty x range, so the width is written here.
    single_range = 2.0 * part[1] * part[2]
    floor = single_range / MAX_POINTS
  else:
    ranges = [_loss_range(loss) for loss in _losses(part)]
    single_range = max(ranges)
    budget = MAX_BUILD_POINTS if part[0].startswith("poisson") else MAX_POINTS
    floor = sum(ranges) / budget
  count = _count(part)
  if count == 1:
    return floor, single_range
  # Chernoff width of the count-fold composition on a coarse pilot grid (pessimistic rounding
  # only widens it, so the estimate errs towards a coarser grid).
  pilot = max(single_range / _PILOT_POINTS, 1e-9)
  width = 0.0
  for probs in _dense_probs(single_pld(part, pilot)):
    lower, upper = common.compute_self_convolve_bounds(probs, count, _TAIL_MASS_TRUNCATION)
    width = max(width, (upper - lower + 1 + probs.size) * pilot)
  return floor, width


def _min_interval(parts: list[tuple]) -> float:
  """Smallest grid step at which every array of the composition fits."""
  floors, widths = zip(*(_widths(part) for part in parts))
  return _SAFETY * max(max(floors), max(widths) / MAX_POINTS, sum(widths) / MAX_POINTS)


def composed_pld(parts: list[tuple], interval: float):
  """PLD of all parts composed on one grid."""
  total = None
  for part in parts:
    pld = single_pld(part, interval)
    if _count(part) > 1:
      pld = pld.self_compose(_count(part))
    total = pld if total is None else total.compose(pld)
  return total


def evaluate(parts: list[tuple], read: Callable[[object], float],
             interval: float | None, epsilon_scale: float = 1.0) -> float:
  """read(PLD of the parts) on a bounded grid; refined to FINE_INTERVAL if interval is None.

  Args:
    parts: non-empty list of ("gaussian", z) | ("laplace", b, n) | ("rr", p, k, n) |
      ("discrete_laplace", a, Δ, n) |
      ("poisson_gaussian", q, z, n, relation) | ("poisson_laplace", q, b, n).
    read: PLD -> ε at δ, or δ at ε (smaller on a finer pessimistic grid).
    interval: an explicit grid step (used as given unless the arrays would not fit, then
      coarsened), or None for the automatic refinement.
    epsilon_scale: a lower bound on ε (e.g. of one part): above 1, the automatic grid steps
      are multiplied by it (relative accuracy is what matters; ε of 10⁵ needs no 1e-3 grid).

  Returns:
    The figure of the finest grid reached.

  Raises:
    GridTooCoarse: the arrays fit only on a grid coarser than MAX_INTERVAL.
  """
  floor = _min_interval(parts)
  if floor > MAX_INTERVAL:
    raise GridTooCoarse()
  if interval is not None:
    return read(composed_pld(parts, max(float(interval), floor)))
  scale = max(1.0, float(epsilon_scale))
  start = min(START_INTERVAL * scale, MAX_INTERVAL)
  fine = max(min(FINE_INTERVAL * scale, MAX_INTERVAL), floor)
  # Refine from one step coarser than `start` (cheap) until two successive grids agree;
  # for most runs the `start` grid is then final and the expensive finer ones are skipped.
  step = max(min(start * _REFINE, MAX_INTERVAL), floor)
  value = read(composed_pld(parts, step))
  while step > fine * (1 + 1e-9):
    step = max(fine, step / _REFINE)
    finer = read(composed_pld(parts, step))
    converged = abs(value - finer) <= RELATIVE_TOLERANCE * abs(finer)
    value = finer
    if (converged and step <= start * (1 + 1e-9)) or not math.isfinite(finer):
      break
  return value
