"""Reverse k-NN labelling votes: k-means++ queries, vote counting, the central and local release.

Reverse k-NN labelling (Li et al., "Fine-grained private knowledge distillation",
arXiv:2207.13253): s public *queries* (k-means centres of the public representations) are
shown to the private data. Every private record adds the one-hot vector of its label to each
of its k nearest queries, giving an (s, C) count matrix; each query is labelled by the arg-max
of its noisy counts, and that label is propagated to the public samples of its cluster.

Privacy of one labelling round (r = 1 label per record; relation: replace one private record;
`privacy.RKNNPlan` holds its noise parameters and `release_counts(plan, ...)` executes them):

* Central DP (`central_noisy_counts`). A record contributes exactly k ones, one in each of k
  distinct rows of the count matrix (its k nearest queries, in the column of its label).
  Replacing it by another record removes those k ones and adds at most k others, so the two
  count matrices differ by at most 2 k in L1 norm: Delta_1 = 2 k r with r = 1. Exact
  discrete Laplace noise of scale t >= Delta_1 / eps on every integer cell
  (`privacy.counts.discrete_laplace_counts`, t = `plan.laplace_scale`) makes the released
  integer matrix eps-DP, and arg-max labels (ties to the lowest class) and their propagation
  are post-processing. The queries
  depend on public data only, so they cost nothing.
* Local DP (`local_noisy_counts`). Each record computes its own (s * C) vote bit vector
  (at most k r = k ones) and flips every bit with p = 1 / (e^{eps/(2k)} + 1)
  (`privacy.counts.ldp_flip_bits`): its report is eps-LDP (two vectors differ in at most 2 k
  bits), so eps is per record, whatever the curator does. The curator sums the reports and
  debiases them (`privacy.counts.ldp_unbiased_counts`).

Vote counting is chunked over private records with `jax.lax.scan`, so the (N, s) distance
matrix is never materialised: memory is O(chunk_size * s) for 60k x s. All functions are pure,
jitted where the shapes allow, and use each key once.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.methods.rknn import privacy as privacy_lib
from dpkd_jax.privacy import counts as counts_lib
from dpkd_jax import config_checks

DEFAULT_CHUNK_SIZE = config_lib.DEFAULT_CHUNK_SIZE


class KMeansResult(NamedTuple):
  """k-means output.

  Attributes:
    centres: (s, d) float32 cluster centres (the queries).
    assignments: (n,) int32 index of each point's nearest centre.
    inertia: () float32 sum of squared distances of the points to their centres.
  """

  centres: jax.Array
  assignments: jax.Array
  inertia: jax.Array


def squared_distances(points: jax.Array, centres: jax.Array) -> jax.Array:
  """(n, s) squared Euclidean distances ||x||^2 - 2 x.c + ||c||^2, clamped at 0.

  Args:
    points: (n, d) float array.
    centres: (s, d) float array.

  Returns:
    (n, s) float32 squared distances.
  """
  points = points.astype(jnp.float32)
  centres = centres.astype(jnp.float32)
  cross = jnp.matmul(points, centres.T, precision=jax.lax.Precision.HIGHEST)  # (n, s)
  sq = (jnp.sum(points**2, -1)[:, None] - 2.0 * cross + jnp.sum(centres**2, -1)[None, :])
  return jnp.maximum(sq, 0.0)


@functools.partial(jax.jit, static_argnames=("num_clusters",))
def kmeans_plus_plus_init(key: jax.Array, points: jax.Array, num_clusters: int) -> jax.Array:
  """k-means++ seeding (Arthur & Vassilvitskii 2007): D^2-weighted sampling of s centres.

  Args:
    key: a `jax.random.key`, split into one key per centre.
    points: (n, d) points, n >= num_clusters.
    num_clusters: s (static).

  Returns:
    (s, d) float32 initial centres (rows of `points`).
  """
  points = points.astype(jnp.float32)
  keys = jax.random.split(key, num_clusters)  # (s,) one draw per centre
  first = points[jax.random.randint(keys[0], (), 0, points.shape[0])]
  centres = jnp.zeros((num_clusters, points.shape[1]), jnp.float32).at[0].set(first)
  min_sq = jnp.sum((points - first)**2, -1)  # (n,) squared distance to the nearest centre

  def add_centre(i, carry):
    centres, min_sq = carry
    # P(point) proportional to D^2; all-zero D^2 (duplicated points) falls back to uniform.
    logits = jnp.where(jnp.sum(min_sq) > 0, jnp.log(min_sq), 0.0)
    new = points[jax.random.categorical(keys[i], logits)]
    return centres.at[i].set(new), jnp.minimum(min_sq, jnp.sum((points - new)**2, -1))

  centres, _ = jax.lax.fori_loop(1, num_clusters, add_centre, (centres, min_sq))
  return centres


@functools.partial(jax.jit, static_argnames=("num_clusters", "num_iterations"))
def _kmeans_once(key: jax.Array, points: jax.Array, num_clusters: int,
                 num_iterations: int) -> KMeansResult:
  points = points.astype(jnp.float32)
  centres = kmeans_plus_plus_init(key, points, num_clusters)

  def lloyd_step(_, centres):
    assignments = jnp.argmin(squared_distances(points, centres), -1)  # (n,)
    sums = jax.ops.segment_sum(points, assignments, num_segments=num_clusters)  # (s, d)
    sizes = jax.ops.segment_sum(jnp.ones_like(assignments, jnp.float32), assignments,
                                num_segments=num_clusters)  # (s,)
    # An emptied cluster keeps its previous centre rather than becoming NaN.
    return jnp.where(sizes[:, None] > 0, sums / jnp.maximum(sizes, 1.0)[:, None], centres)

  centres = jax.lax.fori_loop(0, num_iterations, lloyd_step, centres)
  distances = squared_distances(points, centres)
  assignments = jnp.argmin(distances, -1).astype(jnp.int32)
  inertia = jnp.sum(jnp.min(distances, -1))
  return KMeansResult(centres, assignments, inertia)


def kmeans(key: jax.Array, points: jax.Array, num_clusters: int, *,
           num_iterations: int = 50, num_restarts: int = 1) -> KMeansResult:
  """k-means++ initialisation then Lloyd iterations, best of `num_restarts` (jitted).

  Args:
    key: a `jax.random.key`, split into one key per restart.
    points: (n, d) points (public representations only: the result is released).
    num_clusters: s, 1 <= s <= n.
    num_iterations: Lloyd iterations per restart (fixed count: no data-dependent stop).
    num_restarts: independent seedings; the one with the lowest inertia is returned.

  Returns:
    `KMeansResult` of the best restart.
  """
  config_checks.integer("num_clusters", num_clusters, minimum=1)
  config_checks.integer("num_iterations", num_iterations, minimum=0)
  config_checks.integer("num_restarts", num_restarts, minimum=1)
  chex.assert_rank(points, 2)
  if num_clusters > points.shape[0]:
    raise ValueError(f"num_clusters={num_clusters} exceeds the {points.shape[0]} points")
  runs = [_kmeans_once(restart_key, points, num_clusters, num_iterations)
          for restart_key in jax.random.split(key, num_restarts)]
  return min(runs, key=lambda run: float(run.inertia))


def nearest_queries(embeddings: jax.Array, queries: jax.Array, k: int) -> jax.Array:
  """(n, k) int32 indices of the k nearest queries of each row (distinct, nearest first)."""
  _, indices = jax.lax.top_k(-squared_distances(embeddings, queries), k)
  return indices.astype(jnp.int32)


def _chunked(embeddings: jax.Array, labels: jax.Array, chunk_size: int):
  """Pads N to a multiple of the chunk size; returns (num_chunks, chunk, ...) arrays + mask."""
  n = embeddings.shape[0]
  chunk_size = min(chunk_size, n)
  num_chunks = -(-n // chunk_size)
  pad = num_chunks * chunk_size - n
  embeddings = jnp.pad(embeddings.astype(jnp.float32), ((0, pad), (0, 0)))
  labels = jnp.pad(labels.astype(jnp.int32), (0, pad))
  mask = jnp.arange(num_chunks * chunk_size) < n  # (N_padded,) real rows
  return (embeddings.reshape(num_chunks, chunk_size, -1),
          labels.reshape(num_chunks, chunk_size), mask.reshape(num_chunks, chunk_size))


def _check_vote_args(queries: jax.Array, k: int, num_classes: int, chunk_size: int) -> None:
  config_checks.integer("k", k, minimum=1)
  config_checks.integer("num_classes", num_classes, minimum=2)
  config_checks.integer("chunk_size", chunk_size, minimum=1)
  if k > queries.shape[0]:
    raise ValueError(f"k={k} exceeds the number of queries s={queries.shape[0]}")


@functools.partial(jax.jit, static_argnames=("k", "num_classes", "chunk_size"))
def _reverse_knn_counts(embeddings, labels, queries, *, k, num_classes, chunk_size):
  chunks = _chunked(embeddings, labels, chunk_size)

  def add_chunk(votes, chunk):
    chunk_embeddings, chunk_labels, chunk_mask = chunk  # (B, d), (B,), (B,)
    neighbours = nearest_queries(chunk_embeddings, queries, k)  # (B, k)
    weights = jnp.broadcast_to(chunk_mask[:, None], neighbours.shape).astype(jnp.int32)
    return votes.at[neighbours, chunk_labels[:, None]].add(weights), None

  votes = jnp.zeros((queries.shape[0], num_classes), jnp.int32)  # (s, C)
  votes, _ = jax.lax.scan(add_chunk, votes, chunks)
  return votes


def reverse_knn_counts(embeddings: jax.Array, labels: jax.Array, queries: jax.Array, *,
                       k: int, num_classes: int,
                       chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
  """Exact (noiseless) reverse k-NN vote counts; never release them without noise.

  Args:
    embeddings: (N, d) private representations.
    labels: (N,) int private labels in [0, num_classes).
    queries: (s, d) query representations.
    k: nearest queries each record votes for, 1 <= k <= s.
    num_classes: C.
    chunk_size: private records per scan step (memory O(chunk_size * s)).

  Returns:
    (s, C) int32 counts; counts[q, c] = number of records of label c among whose k nearest
    queries q is. They sum to N k.
  """
  _check_vote_args(queries, k, num_classes, chunk_size)
  chex.assert_rank([embeddings, labels, queries], [2, 1, 2])
  return _reverse_knn_counts(embeddings, labels, queries, k=k, num_classes=num_classes,
                             chunk_size=chunk_size)


def central_noisy_counts(key: jax.Array, counts: jax.Array,
                         plan: privacy_lib.RKNNPlan) -> jax.Array:
  """Central eps-DP release of reverse k-NN counts: exact discrete Laplace on every cell.

  Sensitivity `plan.l1_sensitivity` = 2 k under replace-one with r = 1 label per record
  (module docstring); the scale is `plan.laplace_scale` = t >= 2k / eps, eps =
  `plan.epsilon_per_round`, drawn in integer arithmetic (`privacy.discrete_laplace`).

  Args:
    key: a `jax.random.key`, used once.
    counts: (s, C) integer counts from `reverse_knn_counts` (with k = `plan.k`).
    plan: the run's `RKNNPlan` (central mode).

  Returns:
    (s, C) int32 noisy counts.
  """
  if plan.mode != "central":
    raise ValueError(f"central_noisy_counts needs a central plan, got mode {plan.mode!r}")
  return counts_lib.discrete_laplace_counts(key, counts, scale=plan.laplace_scale)


@functools.partial(jax.jit, static_argnames=("k", "num_classes", "epsilon", "chunk_size"))
def _local_bit_sums(key, embeddings, labels, queries, *, k, num_classes, epsilon, chunk_size):
  chunks = _chunked(embeddings, labels, chunk_size)
  num_queries = queries.shape[0]

  def add_chunk(sums, chunk):
    chunk_index, (chunk_embeddings, chunk_labels, chunk_mask) = chunk
    neighbours = nearest_queries(chunk_embeddings, queries, k)  # (B, k)
    rows = jnp.arange(neighbours.shape[0])[:, None]  # (B, 1)
    bits = jnp.zeros((neighbours.shape[0], num_queries, num_classes), jnp.int32)
    bits = bits.at[rows, neighbours, chunk_labels[:, None]].set(1)  # (B, s, C), k ones a row
    # Each record's report is flipped on its own; the chunk's key is used once.
    reports = counts_lib.ldp_flip_bits(jax.random.fold_in(key, chunk_index),
                                       bits.reshape(bits.shape[0], -1),
                                       epsilon=epsilon, k=k, r=1)  # (B, s C)
    return sums + jnp.sum(reports * chunk_mask[:, None], axis=0), None

  sums = jnp.zeros((num_queries * num_classes,), jnp.int32)
  sums, _ = jax.lax.scan(add_chunk, sums, (jnp.arange(chunks[0].shape[0]), chunks))
  return sums.reshape(num_queries, num_classes)


def local_noisy_counts(key: jax.Array, embeddings: jax.Array, labels: jax.Array,
                       queries: jax.Array, plan: privacy_lib.RKNNPlan, *, num_classes: int,
                       chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
  """Local eps-DP reverse k-NN counts: per-record bit flipping, summed and debiased.

  Every record flips each bit of its (s * C) vote vector (k = `plan.k` ones) with
  p = 1 / (e^{eps/(2k)} + 1) (`plan.flip_probability`), eps = `plan.epsilon_per_round`: a
  per-record (local) guarantee.

  Args:
    key: a `jax.random.key`; chunk i uses `fold_in(key, i)` once.
    embeddings: (N, d) private representations.
    labels: (N,) int private labels.
    queries: (s, d) query representations.
    plan: the run's `RKNNPlan` (local mode; 1 <= k <= s).
    num_classes: C.
    chunk_size: records per scan step (memory O(chunk_size * s * C)).

  Returns:
    (s, C) float32 unbiased estimates of the counts (can be negative).
  """
  if plan.mode != "local":
    raise ValueError(f"local_noisy_counts needs a local plan, got mode {plan.mode!r}")
  k, epsilon = plan.k, plan.epsilon_per_round
  _check_vote_args(queries, k, num_classes, chunk_size)
  chex.assert_rank([embeddings, labels, queries], [2, 1, 2])
  sums = _local_bit_sums(key, embeddings, labels, queries, k=k, num_classes=num_classes,
                         epsilon=float(epsilon), chunk_size=chunk_size)
  return counts_lib.ldp_unbiased_counts(sums, embeddings.shape[0], epsilon=epsilon, k=k, r=1)


def release_counts(plan: privacy_lib.RKNNPlan, key: jax.Array, embeddings: jax.Array,
                   labels: jax.Array, queries: jax.Array, *, num_classes: int,
                   chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
  """One round's released (s, C) counts, with the plan's mode, k and ε_r (the only release).

  The exact counts never leave this function; k is taken from the plan for the votes counted
  as well as for the noise, so the sensitivity 2 k the plan accounts is the one executed.

  Args:
    plan: the run's `RKNNPlan`.
    key: a `jax.random.key`, used once by the mechanism.
    embeddings: (N, d) private representations; labels: (N,) their int labels.
    queries: (s, d) the round's public queries.
    num_classes: C.
    chunk_size: private records per scan step.

  Returns:
    (s, C) int32 noisy counts (central) or float32 unbiased estimates (local).
  """
  if plan.mode == "central":
    exact = reverse_knn_counts(embeddings, labels, queries, k=plan.k, num_classes=num_classes,
                               chunk_size=chunk_size)
    return central_noisy_counts(key, exact, plan)
  return local_noisy_counts(key, embeddings, labels, queries, plan, num_classes=num_classes,
                            chunk_size=chunk_size)


def propagate_labels(noisy_counts: jax.Array, assignments: jax.Array) -> jax.Array:
  """Public labels: arg-max of each query's noisy counts, copied to its cluster members.

  Args:
    noisy_counts: (s, C) released counts.
    assignments: (n,) int cluster (query) index of every public sample.

  Returns:
    (n,) int32 labels.
  """
  query_labels = jnp.argmax(noisy_counts, axis=-1).astype(jnp.int32)  # (s,)
  return query_labels[assignments]
