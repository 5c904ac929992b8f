"""Noisy vote counts for reverse k-NN labelling: central discrete Laplace and local-DP reports.

Reverse k-NN labelling (Li et al., "Fine-grained private knowledge distillation",
arXiv:2207.13253): every private record votes, with a one-hot vector of its label, for each of
its k nearest public queries, in each of r rounds (r is the per-query vote weight / number of
rounds, as the caller defines it). The (num_queries, num_classes) count matrix is then released
with noise, and each query is labelled by its noisy arg-max.

* Central model, `laplace_counts`: the curator adds i.i.d. exact discrete Laplace noise of
  scale t >= Delta_1 / eps (an exact rational, `discrete_laplace`) to every integer cell; the
  released counts are integers. Under replace-one, a record's k r one-hot votes are removed
  and another record's k r votes are added, so Delta_1 = 2 k r (k r under add/remove-one).
  The value is left to the caller, who knows the adjacency and r.
* Local model, `ldp_flip_bits` + `ldp_unbiased_counts`: each record flips every bit of its own
  (num_queries * num_classes) vote vector independently with p = 1 / (e^{eps/(2kr)} + 1).
  Two records' vectors have at most k r ones each, hence differ in at most 2 k r positions;
  each differing bit contributes a likelihood ratio <= (1 - p) / p = e^{eps/(2kr)}, so a report
  is eps-LDP. The server debiases the sums of the n reports.
* Local model, collision mechanism (`collision_report`, `collision_support_counts`,
  `collision_unbiased_counts`; the mechanism used in the paper's code). A record's votes form
  a set of at most D = k r items (item = query * num_classes + label). The record draws a
  public hash key, independent of its data, defining a random function h: items -> [0, l),
  l = floor(2D - 1 + D e^eps). With C = h(set) (c = |C| <= D distinct buckets) and
  Omega = D e^eps + l - D, it reports z in [0, l) with P(z = b) = e^eps / Omega for b in C
  and (Omega - c e^eps) / ((l - c) Omega) otherwise.
  Soundness (derived here, checked in the tests): the latter equals
  ((D - c) e^eps + (l - D)) / ((l - c) Omega), a convex combination of e^eps / Omega and
  1 / Omega, so for every fixed hash all output probabilities lie in [1/Omega, e^eps/Omega]
  and any two sets of size <= D give ratio <= e^eps (eps-LDP). The hash is data-independent,
  so releasing it costs nothing. Decoding: an item in the set is supported (h(item) = z) with
  probability tpr = e^eps / Omega, any other item with fpr = 1 / l (its bucket is uniform and
  independent of z), which gives the unbiased estimator (support - n fpr) / (tpr - fpr).

All functions are pure; the key is the first positional argument and is never reused.
"""

from __future__ import annotations

import fractions
import math

import chex
import jax
import jax.numpy as jnp

from dpkd_jax.privacy import discrete_laplace
from dpkd_jax.privacy import validation


def laplace_counts(
    key: jax.Array,
    counts: jax.Array,
    *,
    l1_sensitivity: float,
    epsilon: float,
) -> jax.Array:
  """Adds i.i.d. exact discrete Laplace noise DLap(t) to every cell of an integer count matrix.

  t = `discrete_laplace.rational_scale(Δ₁, ε)` >= Δ₁/ε, an exact rational, so the release is
  pure (Δ₁/t <= ε)-DP for any neighbouring datasets whose count matrices differ by at most
  Δ₁ in L1 norm; its event is `accounting.discrete_laplace_counts_event(scale=t, ...)`. The
  noise is drawn in integer arithmetic and the released counts are integers: a float
  Laplace on integer counts leaks them through float rounding (`discrete_laplace`). For
  reverse k-NN votes Δ₁ = 2 k r under replace-one (module doc).

  Args:
    key: a `jax.random.key`, used once.
    counts: (...) integer counts, e.g. (num_queries, num_classes); a float dtype is refused.
    l1_sensitivity: Δ₁ >= 1, a whole number.
    epsilon: ε > 0.

  Returns:
    int32 noisy counts of the same shape.
  """
  return discrete_laplace_counts(
      key, counts, scale=discrete_laplace.rational_scale(l1_sensitivity, epsilon))


def discrete_laplace_counts(key: jax.Array, counts: jax.Array, *,
                            scale: fractions.Fraction) -> jax.Array:
  """Integer counts + i.i.d. DLap(scale) per cell: `laplace_counts` at a given exact scale.

  For a caller whose plan holds the executed scale t (pure Δ₁/t-DP on L1 sensitivity Δ₁).

  Args:
    key: a `jax.random.key`, used once.
    counts: (...) integer counts; a float dtype is refused.
    scale: t, an exact rational (`discrete_laplace.rational_scale`).

  Returns:
    int32 noisy counts of the same shape.
  """
  counts = jnp.asarray(counts)
  if not jnp.issubdtype(counts.dtype, jnp.integer):
    raise ValueError(f"counts must have an integer dtype (exact integer noise), got "
                     f"{counts.dtype}")
  noisy = counts.astype(jnp.int32) + discrete_laplace.sample(key, counts.shape, scale)
  chex.assert_equal_shape((noisy, counts))
  return noisy


def ldp_flip_probability(epsilon: float, k: int, r: int) -> jax.Array:
  """p = 1 / (e^{eps/(2kr)} + 1), written as sigmoid(-eps/(2kr)) so large eps gives 0."""
  return jax.nn.sigmoid(-jnp.asarray(epsilon, jnp.float32) / (2.0 * k * r))


def ldp_flip_bits(
    key: jax.Array,
    bits: jax.Array,
    *,
    epsilon: float,
    k: int,
    r: int,
) -> jax.Array:
  """Local-DP bit flipping of reverse k-NN vote vectors: every bit flipped w.p. p.

  p = 1 / (e^{eps/(2kr)} + 1). Each record's vote vector must contain at most k r ones
  (module doc), then each record's report is eps-LDP.

  Args:
    key: a `jax.random.key`, used once for a draw of `bits.shape`.
    bits: (...) 0/1 values (bool or integer), e.g. (num_records, num_queries * num_classes).
    epsilon: eps > 0, per-record budget.
    k: neighbours per record (>= 1).
    r: rounds / vote weight per record (>= 1).

  Returns:
    Noisy bits with the shape and dtype of `bits`.
  """
  validation.check_float("epsilon", epsilon, positive=True)
  validation.check_int("k", k, minimum=1)
  validation.check_int("r", r, minimum=1)
  flip = jax.random.bernoulli(key, ldp_flip_probability(epsilon, k, r), bits.shape)
  noisy = jnp.where(flip, 1 - bits.astype(jnp.int32), bits.astype(jnp.int32)).astype(bits.dtype)
  chex.assert_equal_shape((noisy, bits))
  return noisy


def _debiased(observed: jax.Array, num_reports: int | jax.Array, *, false_rate: float | jax.Array,
              rate_gap: float | jax.Array) -> jax.Array:
  """(observed - n fpr) / (tpr - fpr): the unbiased count of both local mechanisms.

  A cell's observed sum over n reports is v tpr + (n - v) fpr in expectation for a true count
  v (tpr: a true item is reported, fpr: another one is), hence the estimator. The caller
  passes `rate_gap` = tpr - fpr written as its mechanism computes it (float32 `1 - 2p` for
  bit flipping), so that the estimates stay the same to the bit.
  """
  observed = jnp.asarray(observed, jnp.float32)
  return (observed - jnp.asarray(num_reports, jnp.float32) * false_rate) / rate_gap


def ldp_unbiased_counts(noisy_bit_sums: jax.Array, num_reports: int | jax.Array, *,
                        epsilon: float, k: int, r: int) -> jax.Array:
  """Unbiased count estimate (c - n p) / (1 - 2p) from sums of n flipped reports.

  E[c] = v (1 - p) + (n - v) p = v (1 - 2p) + n p for a true count v: tpr = 1 - p, fpr = p.

  Args:
    noisy_bit_sums: (...) per-cell sums c of the n noisy reports.
    num_reports: n, the number of summed reports.
    epsilon: eps > 0, as passed to `ldp_flip_bits`.
    k: as passed to `ldp_flip_bits`.
    r: as passed to `ldp_flip_bits`.

  Returns:
    float32 estimates of the true counts, same shape as `noisy_bit_sums`.
  """
  validation.check_float("epsilon", epsilon, positive=True)
  validation.check_int("k", k, minimum=1)
  validation.check_int("r", r, minimum=1)
  p = ldp_flip_probability(epsilon, k, r)
  return _debiased(noisy_bit_sums, num_reports, false_rate=p, rate_gap=1.0 - 2.0 * p)


def collision_num_buckets(epsilon: float, max_set_size: int) -> int:
  """l = floor(2D - 1 + D e^eps): the static size of the collision mechanism's output range."""
  validation.check_float("epsilon", epsilon, positive=True)
  validation.check_int("max_set_size", max_set_size, minimum=1)
  buckets = 2 * max_set_size - 1 + max_set_size * math.exp(min(float(epsilon), 700.0))
  if buckets >= 2**31 - 1:
    raise ValueError(
        f"epsilon={epsilon!r} with max_set_size={max_set_size} needs {buckets:.3g} buckets "
        "(> int32); use a smaller epsilon")
  return int(math.floor(buckets))


def _collision_rates(epsilon: float, max_set_size: int) -> tuple[int, float, float]:
  """Returns (l, tpr = e^eps / Omega, fpr = 1 / l) in float64 Python arithmetic."""
  num_buckets = collision_num_buckets(epsilon, max_set_size)
  omega = max_set_size * math.exp(epsilon) + num_buckets - max_set_size
  return num_buckets, math.exp(epsilon) / omega, 1.0 / num_buckets


def collision_hash(hash_key: jax.Array, items: jax.Array, num_buckets: int) -> jax.Array:
  """h(items) for the public random function defined by `hash_key`.

  32 random bits per item reduced mod l: the hash is uniform up to a relative bias below
  l / 2^32. The hash is public and the eps-LDP argument holds for *every* fixed hash, so this
  bias only perturbs fpr (utility), never privacy; the private draws use `randint`.

  Args:
    hash_key: a record's public hash key (from `collision_report`).
    items: (m,) non-negative int item ids.
    num_buckets: l (see `collision_num_buckets`).

  Returns:
    (m,) int32 buckets in [0, l).
  """
  bits = jax.vmap(lambda item: jax.random.bits(jax.random.fold_in(hash_key, item)))(items)
  return (bits % jnp.uint32(num_buckets)).astype(jnp.int32)


def collision_report_for_hash(
    key: jax.Array,
    hash_key: jax.Array,
    items: jax.Array,
    *,
    epsilon: float,
    max_set_size: int,
) -> jax.Array:
  """The collision report z of one record for a given public hash (module doc).

  `collision_report` draws the hash key and calls this; it is public so the output
  distribution for a fixed hash, on which the eps-LDP argument rests, can be checked.

  Args:
    key: a `jax.random.key` for the private draws (split three ways), independent of
      `hash_key`.
    hash_key: the record's public hash key, defining h(item) in [0, l).
    items: (D,) int item ids of the record's set, padded with -1; repeated items count once.
    epsilon: eps > 0, per-record budget (static).
    max_set_size: D >= 1 (k r for reverse k-NN; static).

  Returns:
    () int32 report z in [0, l).
  """
  num_buckets, tpr, _ = _collision_rates(epsilon, max_set_size)
  chex.assert_shape(items, (max_set_size,))
  branch_key, member_key, outside_key = jax.random.split(key, 3)
  valid = items >= 0
  buckets = jnp.where(valid, collision_hash(hash_key, jnp.maximum(items, 0), num_buckets),
                      num_buckets)  # (D,), padding -> sentinel l (sorts last)
  buckets = jnp.sort(buckets)
  is_new = jnp.concatenate([jnp.array([True]), buckets[1:] != buckets[:-1]])
  distinct = is_new & (buckets < num_buckets)  # (D,) first copy of each real bucket
  num_distinct = jnp.sum(distinct, dtype=jnp.int32)  # c
  # P(z in C) = c * tpr; z is then uniform over the c distinct buckets of C.
  in_collision_set = jax.random.uniform(branch_key) < num_distinct * tpr
  rank = jax.random.randint(member_key, (), 0, jnp.maximum(num_distinct, 1))
  member = buckets[jnp.argmax(distinct & (jnp.cumsum(distinct) - 1 == rank))]
  # Otherwise z is uniform over the l - c buckets outside C: draw a rank u among them and
  # step over the sorted buckets of C that are <= the running value.
  outside = jax.random.randint(outside_key, (), 0, num_buckets - num_distinct)

  def skip_collisions(i, z):
    return jnp.where(distinct[i] & (buckets[i] <= z), z + 1, z)

  outside = jax.lax.fori_loop(0, max_set_size, skip_collisions, outside)
  return jnp.where(in_collision_set, member, outside).astype(jnp.int32)


def collision_report(
    key: jax.Array,
    items: jax.Array,
    *,
    epsilon: float,
    max_set_size: int,
) -> tuple[jax.Array, jax.Array]:
  """One record's eps-LDP collision report of its item set (module doc for the analysis).

  Args:
    key: a `jax.random.key`; split into the public hash key and the private draws.
    items: (D,) int item ids of the record's set (e.g. query * num_classes + label for each
      of its k r votes), padded with -1; D = max_set_size. Repeated items count once.
    epsilon: eps > 0, per-record budget (static).
    max_set_size: D >= 1 (k r for reverse k-NN; static).

  Returns:
    (hash_key, z): the public hash key (new-style key array) and the int32 report in [0, l).
    Both are sent to the server. `vmap` over keys and item rows for many records.
  """
  hash_key, report_key = jax.random.split(key)
  report = collision_report_for_hash(
      report_key, hash_key, items, epsilon=epsilon, max_set_size=max_set_size)
  return hash_key, report


def collision_support_counts(
    hash_keys: jax.Array,
    reports: jax.Array,
    *,
    num_items: int,
    epsilon: float,
    max_set_size: int,
) -> jax.Array:
  """Per-item number of reports that support it: sum_r [h_r(item) == z_r].

  Costs O(n * num_items) hash evaluations (inherent to the mechanism); records are scanned one
  at a time so memory stays O(num_items).

  Args:
    hash_keys: (n,) public hash keys from `collision_report`.
    reports: (n,) int reports z_r.
    num_items: number of possible items (e.g. num_queries * num_classes).
    epsilon: eps > 0 as used for the reports.
    max_set_size: D as used for the reports.

  Returns:
    (num_items,) int32 support counts.
  """
  num_buckets, _, _ = _collision_rates(epsilon, max_set_size)
  validation.check_int("num_items", num_items, minimum=1)
  chex.assert_rank(reports, 1)
  all_items = jnp.arange(num_items)

  def add_record(support, record):
    hash_key, report = record
    return support + (collision_hash(hash_key, all_items, num_buckets) == report), None

  support, _ = jax.lax.scan(add_record, jnp.zeros(num_items, jnp.int32), (hash_keys, reports))
  return support


def collision_unbiased_counts(support_counts: jax.Array, num_reports: int | jax.Array, *,
                              epsilon: float, max_set_size: int) -> jax.Array:
  """Unbiased count estimate (support - n fpr) / (tpr - fpr) of the collision mechanism.

  Args:
    support_counts: (...) from `collision_support_counts`.
    num_reports: n, the number of reports.
    epsilon: eps > 0 as used for the reports.
    max_set_size: D as used for the reports.

  Returns:
    float32 estimates of the true counts, same shape as `support_counts`.
  """
  _, tpr, fpr = _collision_rates(epsilon, max_set_size)
  return _debiased(support_counts, num_reports, false_rate=fpr, rate_gap=tpr - fpr)
