"""Empirical lower bounds on epsilon by distinguishing two neighbouring inputs.

If a mechanism M is (eps, delta)-DP, then for any neighbouring inputs x, x' and any set S of
outputs, P[M(x') in S] <= e^eps P[M(x) in S] + delta and the same with x, x' swapped. Take
S = {T(M(.)) >= t} for a scalar test statistic T: with FPR = P[T(M(x)) >= t] ("guess x'" on
x) and FNR = P[T(M(x')) < t] this gives the two directions

  eps >= log((1 - delta - FNR) / FPR)    (set S)
  eps >= log((1 - delta - FPR) / FNR)    (its complement)

so any upper confidence bounds FPR_ub, FNR_ub turn into a lower bound on eps. `audit_mechanism`
runs M N times on each input (vmapped over split keys, jitted), chooses t on one half of the
samples and evaluates it on the other, independent half with one-sided Clopper-Pearson bounds
(each at level 1 - (1 - confidence)/2, so both hold jointly with probability >= confidence).
Consequently, if M really is (eps, delta)-DP, the reported `epsilon_lower_bound` exceeds eps with
probability at most 1 - confidence: a larger value is evidence of a privacy bug. A small value
proves nothing (the statistic or N may simply be too weak); the tests pair each audit with a
deliberately broken mechanism to show power.

The default statistic is the projection of the flattened output on the difference of the mean
outputs on x' and x, estimated on the threshold-selection half (optimal for Gaussian noise on
a mean shift). For discrete outputs (labels) pass e.g. `lambda y: (y == 1).astype(float)`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from scipy import stats

Mechanism = Callable[[jax.Array, Any], Any]
Statistic = Callable[[Any], jax.Array]


class AuditResult(NamedTuple):
  """Outcome of an audit.

  Attributes:
    epsilon_lower_bound: max over the two directions of the eps bound, clipped at 0.
    fpr_upper: Clopper-Pearson upper bound on P[T(M(x)) >= threshold] (evaluation half).
    fnr_upper: Clopper-Pearson upper bound on P[T(M(x')) < threshold] (evaluation half).
    threshold: the threshold t chosen on the selection half.
    num_samples: N, mechanism runs per input (N/2 select, N/2 evaluate).
    confidence: joint confidence of the two bounds.
  """

  epsilon_lower_bound: float
  fpr_upper: float
  fnr_upper: float
  threshold: float
  num_samples: int
  confidence: float


def clopper_pearson_upper(successes: np.ndarray, trials: int, alpha: float) -> np.ndarray:
  """One-sided (1 - alpha) Clopper-Pearson upper bound on a binomial rate.

  Args:
    successes: (...) observed counts in [0, trials].
    trials: number of trials n >= 1.
    alpha: error probability in (0, 1).

  Returns:
    (...) float64 upper bounds in (0, 1]; 1 where successes == trials.
  """
  successes = np.asarray(successes, np.float64)
  safe_failures = np.maximum(trials - successes, 1.0)  # beta needs b > 0; masked below
  upper = stats.beta.ppf(1.0 - alpha, successes + 1.0, safe_failures)
  return np.where(successes >= trials, 1.0, upper)


def epsilon_from_error_rates(fpr: np.ndarray, fnr: np.ndarray, delta: float) -> np.ndarray:
  """max(log((1-delta-FNR)/FPR), log((1-delta-FPR)/FNR)); -inf where both are vacuous.

  Args:
    fpr: (...) false-positive rates (upper bounds) in (0, 1].
    fnr: (...) false-negative rates (upper bounds) in (0, 1].
    delta: the delta of the claimed guarantee.

  Returns:
    (...) float64 epsilon lower bounds (may be negative or -inf).
  """
  fpr = np.asarray(fpr, np.float64)
  fnr = np.asarray(fnr, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    forward = np.where(1.0 - delta - fnr > 0, np.log((1.0 - delta - fnr) / fpr), -np.inf)
    backward = np.where(1.0 - delta - fpr > 0, np.log((1.0 - delta - fpr) / fnr), -np.inf)
  return np.maximum(forward, backward)


def _error_counts(scores_x: np.ndarray, scores_x_prime: np.ndarray,
                  thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """False positives #(T(M(x)) >= t) and false negatives #(T(M(x')) < t) for every t."""
  sorted_x = np.sort(scores_x)
  sorted_x_prime = np.sort(scores_x_prime)
  false_positives = sorted_x.size - np.searchsorted(sorted_x, thresholds, side="left")
  false_negatives = np.searchsorted(sorted_x_prime, thresholds, side="left")
  return false_positives, false_negatives


def _candidate_thresholds(scores: np.ndarray, max_thresholds: int) -> np.ndarray:
  """Every distinct score (each is a cut point of `>= t`), or evenly spaced quantiles."""
  distinct = np.unique(scores)
  if distinct.size <= max_thresholds:
    return distinct
  return np.unique(np.quantile(scores, np.linspace(0.0, 1.0, max_thresholds)))


def _sampler(mechanism: Mechanism, statistic: Statistic | None,
             batch_size: int | None) -> Callable[[jax.Array, Any], jax.Array]:
  """Jitted `(keys (N,), inputs) -> (N,)` statistics, or (N, D) flattened outputs.

  One jitted function serves both inputs of the pair, so it is compiled once.
  """

  def one_run(key: jax.Array, inputs: Any) -> jax.Array:
    output = mechanism(key, inputs)
    if statistic is not None:
      return jnp.asarray(statistic(output), jnp.float32).reshape(())
    flat, _ = ravel_pytree(output)
    return flat.astype(jnp.float32)

  @jax.jit
  def run_all(keys: jax.Array, inputs: Any) -> jax.Array:
    if batch_size is None:
      return jax.vmap(one_run, in_axes=(0, None))(keys, inputs)
    return jax.lax.map(lambda k: one_run(k, inputs), keys, batch_size=batch_size)

  return run_all


def audit_mechanism(
    key: jax.Array,
    mechanism: Mechanism,
    x: Any,
    x_prime: Any,
    *,
    num_samples: int,
    delta: float = 0.0,
    confidence: float = 0.95,
    statistic: Statistic | None = None,
    max_thresholds: int = 1000,
    batch_size: int | None = None,
) -> AuditResult:
  """Empirical eps lower bound of `mechanism` on the neighbouring pair (x, x').

  Args:
    key: a `jax.random.key`; split into N independent keys per input.
    mechanism: `m(key, inputs) -> output` (array or pytree of arrays), jit/vmap-safe.
    x: one input (array or pytree).
    x_prime: its neighbour.
    num_samples: N >= 100 (even) runs per input; half select t, half evaluate it.
    delta: delta in [0, 1) of the guarantee being audited.
    confidence: in (0, 1), joint confidence of the two Clopper-Pearson bounds.
    statistic: optional `T(output) -> scalar`; default: projection of the flattened output
      on the mean-output difference (memory N * output size).
    max_thresholds: number of candidate thresholds tried on the selection half.
    batch_size: None runs all N at once with `vmap`; an int runs that many at a time with
      `lax.map` (bounds memory for large outputs, compiles a little slower).

  Returns:
    AuditResult; `epsilon_lower_bound` >= 0.
  """
  if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 100:
    raise ValueError(f"num_samples must be an int >= 100, got {num_samples!r}")
  if num_samples % 2:
    raise ValueError(f"num_samples must be even (two equal halves), got {num_samples}")
  if not 0.0 <= delta < 1.0:
    raise ValueError(f"delta must be in [0, 1), got {delta!r}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
  if max_thresholds < 2:
    raise ValueError(f"max_thresholds must be >= 2, got {max_thresholds!r}")
  key_x, key_x_prime = jax.random.split(key)
  run_all = _sampler(mechanism, statistic, batch_size)
  samples_x = np.asarray(run_all(jax.random.split(key_x, num_samples), x), np.float64)
  samples_x_prime = np.asarray(
      run_all(jax.random.split(key_x_prime, num_samples), x_prime), np.float64)
  half = num_samples // 2
  select_x, eval_x = samples_x[:half], samples_x[half:]
  select_x_prime, eval_x_prime = samples_x_prime[:half], samples_x_prime[half:]
  if statistic is None:
    # Direction estimated on the selection half only, so the evaluation half stays unseen.
    direction = select_x_prime.mean(axis=0) - select_x.mean(axis=0)  # (D,)
    select_x, eval_x = select_x @ direction, eval_x @ direction
    select_x_prime, eval_x_prime = select_x_prime @ direction, eval_x_prime @ direction

  # Two bounds must hold jointly: split the error probability between them (union bound).
  alpha = (1.0 - confidence) / 2.0
  thresholds = _candidate_thresholds(np.concatenate([select_x, select_x_prime]), max_thresholds)
  false_pos, false_neg = _error_counts(select_x, select_x_prime, thresholds)
  select_eps = epsilon_from_error_rates(
      clopper_pearson_upper(false_pos, half, alpha),
      clopper_pearson_upper(false_neg, half, alpha), delta)
  threshold = float(thresholds[int(np.argmax(select_eps))])

  eval_false_pos, eval_false_neg = _error_counts(eval_x, eval_x_prime, np.array([threshold]))
  fpr_upper = float(clopper_pearson_upper(eval_false_pos, half, alpha)[0])
  fnr_upper = float(clopper_pearson_upper(eval_false_neg, half, alpha)[0])
  epsilon = float(epsilon_from_error_rates(fpr_upper, fnr_upper, delta))
  return AuditResult(
      epsilon_lower_bound=max(0.0, epsilon),  # -inf (vacuous) -> 0
      fpr_upper=fpr_upper,
      fnr_upper=fnr_upper,
      threshold=threshold,
      num_samples=num_samples,
      confidence=confidence,
  )
