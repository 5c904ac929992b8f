"""What choosing among private runs costs: the random-search bound of Papernot and Steinke.

Running several configurations on the private data and releasing the best one leaks more than
one run: the choice itself depends on the data. Papernot & Steinke, "Hyperparameter Tuning
with Renyi Differential Privacy" (ICLR 2022, arXiv:2110.03620v2) bound a search whose number of
runs K is random and whose candidates are each (λ, ε(λ))-RDP, when only the best run (by any
score, even one computed from the private data without noise) is released:

* Theorem 2, K from the truncated negative binomial distribution D_{η,γ} (η = 1: geometric,
  η = 0: logarithmic): the search is (λ, ε')-RDP with
      ε' = ε(λ) + (1 + η)(1 − 1/λ̂) ε(λ̂) + (1 + η) log(1/γ)/λ̂
           + log E[K] / (λ − 1)
  for every λ̂ >= 1;
* Theorem 6, K ~ Poisson(μ): ε' = ε(λ) + μ δ̂ + log μ / (λ − 1), where the run is also
  (ε̂, δ̂)-DP with e^ε̂ = 1 + 1/(λ − 1).

dp_accounting implements both (`RepeatAndSelectDpEvent`, RDP accountant); `search_epsilon`
composes a run's event into it and converts to (ε, δ). A fixed number of runs is NOT covered:
the bound needs K random, drawn before the search, and every run of the draw executed.
"""

from __future__ import annotations

import math

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import validation

# Rényi orders of the accountant: dense where the optima of small ε lie, up to 1024.
ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) +
               [64, 96, 128, 192, 256, 384, 512, 768, 1024])
# `shape` of the distribution of K (dp_accounting's convention).
POISSON, GEOMETRIC, LOGARITHMIC = math.inf, 1.0, 0.0


def search_event(run_event: dp_event.DpEvent, *, mean_trials: float,
                 shape: float) -> dp_event.DpEvent:
  """The event of a random search over runs of `run_event`, the best one released.

  Args:
    run_event: one candidate run's event (its whole training, as its ledger charges it).
    mean_trials: E[K] >= 1, the expected number of runs.
    shape: η of the truncated negative binomial (`GEOMETRIC` = 1, `LOGARITHMIC` = 0, any
      η > 0) or `POISSON` (inf).
  """
  mean = validation.check_float("mean_trials", mean_trials, positive=True)
  if mean < 1:
    raise ValueError(f"mean_trials must be >= 1, got {mean_trials!r}")
  if not (shape == POISSON or (isinstance(shape, (int, float)) and 0 <= shape < math.inf)):
    raise ValueError(f"shape must be >= 0 or inf (Poisson), got {shape!r}")
  return dp_event.RepeatAndSelectDpEvent(run_event, mean, float(shape))


def search_epsilon(run_event: dp_event.DpEvent, *, mean_trials: float, shape: float,
                   delta: float) -> float:
  """ε at `delta` of the random search (`search_event`), by RDP under replace-one (under
  add-remove for an event tagged add-remove only, e.g. DP-SGD's `relation="add-remove"`).

  The candidates' own ε (by PLD elsewhere in this library) is tighter than their RDP figure:
  compare `single_run_epsilon` (the same RDP path, K = 1) to see what the search adds.
  """
  return _rdp_epsilon(search_event(run_event, mean_trials=mean_trials, shape=shape), delta)


def single_run_epsilon(run_event: dp_event.DpEvent, *, delta: float) -> float:
  """ε at `delta` of one run by the same RDP accountant as `search_epsilon`."""
  return _rdp_epsilon(run_event, delta)


def _rdp_epsilon(event: dp_event.DpEvent, delta: float) -> float:
  # An event tagged add-remove only (DP-SGD's add-remove figure) is bounded under add-remove;
  # every other under replace-one, the library's relation.
  add_remove = _relations(event) == {neighbouring.ADD_REMOVE}
  accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS), (
      dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if add_remove
      else dp_accounting.NeighboringRelation.REPLACE_ONE))
  if len(_relations(event)) > 1 or not accountant.supports(event):
    raise ValueError("dp_accounting's RDP accountant cannot bound this event (mixed relations, "
                     f"or e.g. replace-one Poisson subsampling): {event!r}")
  accountant.compose(event)
  return float(accountant.get_epsilon(validation.check_delta(delta)))


def _relations(event: dp_event.DpEvent) -> set[str]:
  """The relations tagged anywhere in `event`'s tree (`neighbouring.TaggedDpEvent`)."""
  found = {event.relation} if isinstance(event, neighbouring.TaggedDpEvent) else set()
  children = getattr(event, "events", None) or [getattr(event, "event", None)]
  for child in children:
    if isinstance(child, dp_event.DpEvent):
      found |= _relations(child)
  return found
