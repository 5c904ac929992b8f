"""Private aggregation of a teacher ensemble's votes (PATE's GNMax, noisy histograms).

DP statement (used by `methods.dfpate`; accounted by `accounting.pate_event`):

  Relation: replace one record of the private training set. The n teachers are trained on
  DISJOINT shards, so a neighbouring dataset changes at most one teacher, arbitrarily. For a
  query x the vote histogram h(x) = sum_i v_i(x) in R^K (v_i one-hot argmax, "hard", or the
  softmax probability vector, "soft") moves by at most √2 in L2 norm: hard, one bin −1 and
  another +1; soft, ||p − p'||₂² <= ||p||₂² + ||p'||₂² <= 2 for probability vectors.
  `noisy_histogram` releases h(x) + N(0, σ² I_K): a Gaussian mechanism with noise multiplier
  σ/√2. GNMax (Papernot et al., 2018) releases only argmax of the same noisy histogram; its
  data-independent bound is exactly this one, and since the whole noisy histogram costs the
  same, its argmax and its top-2 margin are free post-processing (we use the margin to filter
  queries). Q queries, chosen adaptively from public randomness and earlier releases, compose
  to `accounting.pate_event(noise_std=σ, num_queries=Q)`. No data-dependent (smooth
  sensitivity) ε is computed or released here.

Every mechanism is a pure, jittable function of a `jax.random.key`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import secure_gaussian
from dpkd_jax.privacy import validation

VoteKind = Literal["hard", "soft"]
VOTE_KINDS = ("hard", "soft")
# L2 distance of one teacher's vote vector on two neighbouring datasets (module docstring).
VOTE_L2_SENSITIVITY = 2.0 ** 0.5


class NoisyVotes(NamedTuple):
  """One Gaussian release of vote histograms and its free post-processing.

  Attributes:
    histogram: (Q, K) noisy vote histograms (the released quantity).
    labels: (Q,) int32 noisy argmax (GNMax labels).
    margin: (Q,) noisy top-1 minus noisy top-2 count (a confidence, in votes).
  """

  histogram: jax.Array
  labels: jax.Array
  margin: jax.Array


def vote_histogram(teacher_logits: jax.Array, *, votes: VoteKind = "hard") -> jax.Array:
  """Vote histogram of an ensemble (NOT private: release it only through a mechanism).

  Args:
    teacher_logits: (n, Q, K) logits of n teachers on Q queries.
    votes: "hard" (one-hot argmax per teacher) or "soft" (softmax probabilities).

  Returns:
    (Q, K) float32 histogram; each row sums to n.
  """
  if votes not in VOTE_KINDS:
    raise ValueError(f"votes must be one of {VOTE_KINDS}, got {votes!r}")
  if teacher_logits.ndim != 3:
    raise ValueError(f"teacher_logits must be (n, Q, K), got shape {teacher_logits.shape}")
  num_classes = teacher_logits.shape[-1]
  if votes == "hard":
    per_teacher = jax.nn.one_hot(jnp.argmax(teacher_logits, -1), num_classes)  # (n, Q, K)
  else:
    per_teacher = jax.nn.softmax(teacher_logits.astype(jnp.float32), -1)  # (n, Q, K)
  return jnp.sum(per_teacher, axis=0)


def _check_key(key: jax.Array) -> None:
  if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
          and key.shape == ()):
    raise ValueError(f"key must be one typed key from jax.random.key, got "
                     f"{getattr(key, 'dtype', type(key))} of shape {getattr(key, 'shape', None)}")


def _top2_margin(histogram: jax.Array) -> jax.Array:
  """(Q,) difference between the largest and the second largest entry of each row."""
  top2 = jax.lax.top_k(histogram, 2)[0]  # (Q, 2)
  return top2[:, 0] - top2[:, 1]


def noisy_histogram(key: jax.Array, histogram: jax.Array, noise_std: float | jax.Array, *,
                    secure_noise: bool = False, max_votes: int | None = None) -> NoisyVotes:
  """Gaussian mechanism on vote histograms: h + N(0, σ² I) per query (module docstring).

  Accounting: `accounting.pate_event(noise_std=σ, num_queries=Q)`; σ = 0 releases the
  exact histogram (no privacy, ε = ∞).

  Args:
    key: a `jax.random.key`, used once (split it before calling again).
    histogram: (Q, K) vote histograms from `vote_histogram`.
    noise_std: σ >= 0 (a traced value is accepted unchecked).
    secure_noise: the histogram on an integer grid plus exact discrete Gaussian noise of std
      σ (`secure_gaussian`; σ > 0 and concrete); account with `pate_event(...,
      secure_noise=True)`.
    max_votes: n, the teachers (every bin <= n); required with `secure_noise`.

  Returns:
    `NoisyVotes` with the noisy histogram, its argmax and its top-2 margin.
  """
  _check_key(key)
  validation.check_float("noise_std", noise_std, positive=False)
  if histogram.ndim != 2 or histogram.shape[-1] < 2:
    raise ValueError(f"histogram must be (Q, K) with K >= 2, got shape {histogram.shape}")
  histogram = histogram.astype(jnp.float32)
  if secure_noise:
    if max_votes is None:
      raise ValueError("secure_noise needs max_votes (the number of teachers)")
    grid = secure_gaussian.choose_grid(noise_multiplier=noise_std, bound=1.0,
                                       max_abs=float(max_votes))
    noisy = secure_gaussian.add_grid_noise(key, histogram, grid)
  else:
    noisy = histogram + noise_std * jax.random.normal(key, histogram.shape, jnp.float32)
  return NoisyVotes(noisy, jnp.argmax(noisy, -1).astype(jnp.int32), _top2_margin(noisy))


def gnmax(key: jax.Array, teacher_logits: jax.Array, noise_std: float | jax.Array, *,
          votes: VoteKind = "hard") -> NoisyVotes:
  """GNMax over an ensemble's logits: histogram, Gaussian noise, argmax and margin.

  Args:
    key: a `jax.random.key`, used once.
    teacher_logits: (n, Q, K) logits of n disjoint-shard teachers on Q queries.
    noise_std: σ >= 0, noise std per histogram bin.
    votes: "hard" or "soft" (`vote_histogram`).

  Returns:
    `NoisyVotes`; accounting: `accounting.pate_event(noise_std=σ, num_queries=Q)`.
  """
  return noisy_histogram(key, vote_histogram(teacher_logits, votes=votes), noise_std)


def calibrate_noise_std(*, target_epsilon: float, delta: float, num_queries: int,
                        accountant: accounting.AccountantName = "pld") -> float:
  """Smallest σ such that Q noisy histograms meet (target_epsilon, delta).

  Args:
    target_epsilon: ε target (> 0).
    delta: δ in (0, 1).
    num_queries: Q >= 1.
    accountant: "pld" (default) or "rdp".

  Returns:
    σ (noise std per histogram bin).
  """
  num_queries = validation.check_int("num_queries", num_queries, minimum=1)
  return calibration.calibrate_noise_multiplier(
      lambda std: accounting.pate_event(noise_std=std, num_queries=num_queries),
      target_epsilon=target_epsilon, delta=delta, accountant=accountant)


def max_queries(*, target_epsilon: float, delta: float, noise_std: float, limit: int,
                accountant: accounting.AccountantName = "pld") -> int:
  """Most queries Q <= limit answerable at σ within (target_epsilon, delta).

  Args:
    target_epsilon: ε target (> 0).
    delta: δ in (0, 1).
    noise_std: σ > 0.
    limit: largest Q considered (>= 1).
    accountant: "pld" (default) or "rdp".

  Returns:
    Q.
  """
  validation.check_float("noise_std", noise_std, positive=True)
  return calibration.calibrate_steps(
      lambda q: accounting.pate_event(noise_std=noise_std, num_queries=q),
      target_epsilon=target_epsilon, delta=delta, max_steps=limit, accountant=accountant)
