"""Reverse k-NN votes (`rknn/votes.py`): exact counts, per-record footprint, noise scale from
the plan, k-means, local DP.

Small random data (n <= 500 records, s <= 8 queries). Brute-force references use float64
NumPy distances; the JAX path computes float32 distances with HIGHEST precision, which on
these continuous random draws gives the same neighbour sets (no near-ties).
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.methods.rknn import privacy as rknn_privacy
from dpkd_jax.methods.rknn import votes

NUM_CLASSES = 3


def _plan(mode: str, *, k: int, epsilon: float) -> rknn_privacy.RKNNPlan:
  """A one-round plan of ε_r = epsilon (the mechanisms read mode, k and ε_r only)."""
  return rknn_privacy.RKNNPlan(releases=1, delta=1e-5, budget_epsilon=epsilon,
                               sound_epsilon=epsilon, mode=mode, k=k, epsilon_per_round=epsilon)


def _data(seed: int, n: int = 53, s: int = 6, d: int = 4):
  rng = np.random.default_rng(seed)
  embeddings = rng.normal(size=(n, d)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
  queries = rng.normal(size=(s, d)).astype(np.float32)
  return embeddings, labels, queries


def _brute_force_counts(embeddings, labels, queries, k):
  """Loop over records: +1 at (each of the k nearest queries, label)."""
  distances = ((embeddings[:, None, :].astype(np.float64) - queries[None]) ** 2).sum(-1)
  counts = np.zeros((len(queries), NUM_CLASSES), np.int64)
  for row, label in zip(np.argsort(distances, axis=1)[:, :k], labels):
    for query in row:
      counts[query, label] += 1
  return counts


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("chunk_size", [7, 64, 2048])  # padding, one chunk, chunk > n
def test_counts_equal_brute_force(k, chunk_size):
  embeddings, labels, queries = _data(seed=k)
  counts = votes.reverse_knn_counts(embeddings, labels, queries, k=k,
                                    num_classes=NUM_CLASSES, chunk_size=chunk_size)
  chex.assert_shape(counts, (len(queries), NUM_CLASSES))
  chex.assert_type(counts, jnp.int32)
  np.testing.assert_array_equal(counts, _brute_force_counts(embeddings, labels, queries, k))
  assert int(counts.sum()) == len(labels) * k


@pytest.mark.parametrize("k", [1, 3])
def test_each_record_touches_at_most_k_queries_and_replace_one_moves_at_most_2k(k):
  embeddings, labels, queries = _data(seed=10 + k)
  count = functools.partial(votes.reverse_knn_counts, k=k, num_classes=NUM_CLASSES,
                            chunk_size=16)
  for i in range(5):
    single = np.asarray(count(embeddings[i:i + 1], labels[i:i + 1], queries))
    touched_rows = np.flatnonzero(single.sum(1))
    assert len(touched_rows) <= k and single.sum() == k
    np.testing.assert_array_equal(single[:, labels[i]].sum(), k)  # only its label's column
    assert single.max() == 1  # distinct queries: one vote each
  # Replace record 0 by a far-away record of another label: L1 change <= 2k = Delta_1.
  base = np.asarray(count(embeddings, labels, queries))
  replaced_embeddings, replaced_labels = embeddings.copy(), labels.copy()
  replaced_embeddings[0] = 100.0
  replaced_labels[0] = (labels[0] + 1) % NUM_CLASSES
  replaced = np.asarray(count(replaced_embeddings, replaced_labels, queries))
  assert 0 < np.abs(replaced - base).sum() <= 2 * k


@pytest.mark.parametrize("k,epsilon", [(1, 0.1), (3, 0.5)])
def test_central_noise_scale_matches_sensitivity_2k(k, epsilon):
  plan = _plan("central", k=k, epsilon=epsilon)
  scale = plan.laplace_scale  # discrete Laplace t >= Delta_1 / eps with Delta_1 = 2k
  assert 2 * k / epsilon <= scale <= 2 * k / epsilon + 1 / 1024
  exact = jnp.zeros((200, 250), jnp.int32)  # 5e4 cells
  noisy = votes.central_noisy_counts(jax.random.key(0), exact, plan)
  chex.assert_type(noisy, jnp.int32)
  noise = np.asarray(noisy, np.float64)
  # DLap(t), q = e^(-1/t): Var = 2q / (1 - q)^2; 5e4 draws: 4% is more than 8 standard errors.
  q = math.exp(-1.0 / float(scale))
  np.testing.assert_allclose(np.var(noise), 2 * q / (1 - q) ** 2, rtol=0.04)
  np.testing.assert_allclose(np.mean(np.abs(noise)), 2 * q / (1 - q * q), rtol=0.04)


def test_central_noise_keys_differ_and_repeat():
  exact = jnp.ones((4, 3), jnp.int32)
  plan = _plan("central", k=1, epsilon=1.0)
  a = votes.central_noisy_counts(jax.random.key(1), exact, plan)
  b = votes.central_noisy_counts(jax.random.key(2), exact, plan)
  again = votes.central_noisy_counts(jax.random.key(1), exact, plan)
  np.testing.assert_array_equal(a, again)
  assert not np.allclose(a, b)


@pytest.mark.parametrize("num_restarts", [1, 3])
def test_kmeans_finds_separated_blobs(num_restarts):
  rng = np.random.default_rng(0)
  means = np.array([[0, 0], [20, 0], [0, 20], [20, 20]], np.float32)
  blob = np.repeat(np.arange(4), 50)  # (200,) true blob of each point
  points = means[blob] + rng.normal(scale=0.5, size=(200, 2)).astype(np.float32)
  result = votes.kmeans(jax.random.key(3), points, 4, num_iterations=20,
                        num_restarts=num_restarts)
  chex.assert_shape([result.centres, result.assignments], [(4, 2), (200,)])
  assignments = np.asarray(result.assignments)
  # Each blob falls in exactly one cluster and each cluster holds exactly one blob.
  mapping = {b: set(assignments[blob == b]) for b in range(4)}
  assert all(len(clusters) == 1 for clusters in mapping.values())
  assert len(set().union(*mapping.values())) == 4
  found = np.asarray(result.centres)[[next(iter(mapping[b])) for b in range(4)]]
  np.testing.assert_allclose(found, means, atol=0.2)  # sd of a 50-point mean: 0.07
  np.testing.assert_allclose(result.inertia, ((points - found[blob])**2).sum(), rtol=1e-4)


def test_kmeans_plus_plus_init_picks_distinct_data_points():
  points = np.random.default_rng(1).normal(size=(30, 3)).astype(np.float32)
  centres = np.asarray(votes.kmeans_plus_plus_init(jax.random.key(0), points, 5))
  matches = [np.flatnonzero(np.all(points == c, axis=1)) for c in centres]
  assert all(len(m) == 1 for m in matches)
  assert len({int(m[0]) for m in matches}) == 5  # D^2 sampling never re-picks a centre


def test_local_counts_exact_at_huge_epsilon_and_unbiased_at_moderate_epsilon():
  embeddings, labels, queries = _data(seed=5, n=500, s=4)
  exact = _brute_force_counts(embeddings, labels, queries, k=2)

  def local(key, epsilon):
    return votes.local_noisy_counts(key, embeddings, labels, queries,
                                    _plan("local", k=2, epsilon=epsilon),
                                    num_classes=NUM_CLASSES, chunk_size=128)

  # eps = 200: p = sigmoid(-50) ~ 2e-22, no bit flips: the estimate is the exact count.
  np.testing.assert_allclose(local(jax.random.key(0), epsilon=200.0), exact, atol=1e-3)
  epsilon, k, n = 2.0, 2, 500
  p = 1.0 / (math.exp(epsilon / (2 * k)) + 1.0)
  cell_sd = math.sqrt(n * p * (1 - p)) / (1 - 2 * p)  # sd of one debiased cell
  errors = np.stack([np.asarray(local(jax.random.key(i), epsilon=epsilon)) - exact
                     for i in range(30)])  # (30, s, C)
  # Mean over 360 independent cells: 5 standard errors; spread within 15% of the formula.
  assert abs(errors.mean()) < 5 * cell_sd / math.sqrt(errors.size)
  np.testing.assert_allclose(errors.std(), cell_sd, rtol=0.15)


def test_local_padding_records_send_no_reports():
  # n = 3 records in one chunk of 64: 61 padded rows would add ~61 p ones per cell if kept.
  embeddings, labels, queries = _data(seed=6, n=3, s=4)
  plan = _plan("local", k=1, epsilon=1.0)
  estimates = np.stack([np.asarray(votes.local_noisy_counts(
      jax.random.key(i), embeddings, labels, queries, plan, num_classes=NUM_CLASSES,
      chunk_size=64)) for i in range(200)])
  exact = _brute_force_counts(embeddings, labels, queries, k=1)
  p = 1.0 / (math.exp(0.5) + 1.0)
  cell_sd = math.sqrt(3 * p * (1 - p)) / (1 - 2 * p)
  assert abs((estimates - exact).mean()) < 5 * cell_sd / math.sqrt(estimates.size)


def test_propagate_labels_copies_query_argmax_to_cluster_members():
  noisy = jnp.array([[0.0, 5.0, 1.0], [9.0, -2.0, 3.0]])  # query labels 1, 0
  labels = votes.propagate_labels(noisy, jnp.array([1, 0, 0, 1]))
  np.testing.assert_array_equal(labels, [0, 1, 1, 0])


@pytest.mark.parametrize("call,match", [
    (lambda e, l, q: votes.reverse_knn_counts(e, l, q, k=7, num_classes=3), "exceeds"),
    (lambda e, l, q: votes.reverse_knn_counts(e, l, q, k=0, num_classes=3), "k must"),
    (lambda e, l, q: votes.local_noisy_counts(jax.random.key(0), e, l, q,
                                              _plan("local", k=1, epsilon=0.0),
                                              num_classes=3), "epsilon"),
    (lambda e, l, q: votes.local_noisy_counts(jax.random.key(0), e, l, q,
                                              _plan("local", k=7, epsilon=1.0),
                                              num_classes=3), "exceeds"),
    (lambda e, l, q: votes.local_noisy_counts(jax.random.key(0), e, l, q,
                                              _plan("central", k=1, epsilon=1.0),
                                              num_classes=3), "needs a local plan"),
    (lambda e, l, q: votes.central_noisy_counts(jax.random.key(0),
                                                jnp.zeros((6, 3), jnp.int32),
                                                _plan("local", k=1, epsilon=1.0)),
     "needs a central plan"),
    (lambda e, l, q: votes.kmeans(jax.random.key(0), q, 7), "exceeds"),
])
def test_bad_arguments_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call(*_data(seed=0))


@pytest.mark.parametrize("mode", ["central", "local"])
def test_release_counts_runs_the_plans_mechanism_with_the_plans_k(mode):
  embeddings, labels, queries = _data(seed=7, n=40, s=5)
  plan = _plan(mode, k=2, epsilon=3.0)
  key = jax.random.key(4)
  released = votes.release_counts(plan, key, embeddings, labels, queries,
                                  num_classes=NUM_CLASSES, chunk_size=16)
  if mode == "central":
    exact = votes.reverse_knn_counts(embeddings, labels, queries, k=2,
                                     num_classes=NUM_CLASSES, chunk_size=16)
    expected = votes.central_noisy_counts(key, exact, plan)
  else:
    expected = votes.local_noisy_counts(key, embeddings, labels, queries, plan,
                                        num_classes=NUM_CLASSES, chunk_size=16)
  np.testing.assert_array_equal(released, expected)
