"""Query selection: greedy k-center (vs a NumPy reference), never repeating; baselines; registry.

Tolerances: divergences in float32 vs float64 NumPy agree to 1e-5 (atol); selections are
compared exactly on data without near-ties.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax.methods.rona import query_selection as qs
from dpkd_jax.models import compact
from dpkd_jax.models import core


def _dirichlet_log_probs(seed: int, num: int, classes: int) -> jax.Array:
  probs = np.random.default_rng(seed).dirichlet(np.full(classes, 0.5), size=num)
  return jnp.log(jnp.asarray(np.clip(probs, 1e-6, None), jnp.float32))


def _reference_k_center(log_probs: np.ndarray, centers: list[int], num_select: int) -> list[int]:
  """Farthest-first traversal in float64 NumPy, starting from `centers` (returned picks only)."""
  log_probs = np.asarray(log_probs, np.float64)
  probs = np.exp(log_probs)
  divergence = lambda c: 0.5 * np.sum((probs - probs[c]) * (log_probs - log_probs[c]), -1)
  min_div = np.min([divergence(c) for c in centers], axis=0)
  min_div[centers] = -np.inf
  picks = []
  for _ in range(num_select):
    pick = int(np.argmax(min_div))
    picks.append(pick)
    min_div = np.minimum(min_div, divergence(pick))
    min_div[picks + centers] = -np.inf
  return picks


def test_symmetric_kl_is_half_the_two_kls():
  log_probs = _dirichlet_log_probs(0, 6, 5)
  p, q = np.exp(np.asarray(log_probs, np.float64)), np.exp(np.asarray(log_probs[2], np.float64))
  kl = lambda a, b: np.sum(a * (np.log(a) - np.log(b)), -1)
  expected = 0.5 * (kl(p, q) + kl(q, p))
  got = qs.symmetric_kl(log_probs, log_probs[2])
  np.testing.assert_allclose(got, expected, atol=1e-5)
  assert float(got[2]) == 0.0 and np.all(np.asarray(got) >= 0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_k_center_picks_one_point_per_far_apart_cluster(seed):
  # Three tight clusters of 5 distributions each, concentrated on classes 0, 1 and 2.
  rng = np.random.default_rng(10)
  probs = np.full((15, 4), 0.02) + rng.uniform(0, 0.01, (15, 4))
  for cluster in range(3):
    probs[5 * cluster:5 * cluster + 5, cluster] = 1.0
  log_probs = jnp.log(jnp.asarray(probs / probs.sum(1, keepdims=True), jnp.float32))
  picked = np.asarray(qs.k_center_greedy(jax.random.key(seed), log_probs, 3))
  assert sorted(picked // 5) == [0, 1, 2]


def test_k_center_matches_reference_greedy():
  log_probs = _dirichlet_log_probs(1, 200, 10)
  picked = np.asarray(qs.k_center_greedy(jax.random.key(0), log_probs, 25))
  chex.assert_shape(picked, (25,))
  assert picked.dtype == np.int32
  assert picked[1:].tolist() == _reference_k_center(log_probs, [int(picked[0])], 24)


@pytest.mark.parametrize("duplicates", [False, True])
def test_k_center_never_repeats_even_when_every_point_is_taken(duplicates):
  log_probs = _dirichlet_log_probs(2, 40, 3)
  if duplicates:  # all distances 0: argmax ties everywhere
    log_probs = jnp.broadcast_to(log_probs[:1], log_probs.shape)
  picked = np.asarray(qs.k_center_greedy(jax.random.key(5), log_probs, 40))
  assert sorted(picked.tolist()) == list(range(40))


def test_k_center_first_center_follows_the_key():
  log_probs = _dirichlet_log_probs(3, 100, 10)
  firsts = {int(qs.k_center_greedy(jax.random.key(s), log_probs, 2)[0]) for s in range(6)}
  assert len(firsts) > 1
  again = qs.k_center_greedy(jax.random.key(4), log_probs, 5)
  np.testing.assert_array_equal(again, qs.k_center_greedy(jax.random.key(4), log_probs, 5))


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_k_center_with_initial_centers_chunked(chunk_size):
  log_probs = _dirichlet_log_probs(4, 120, 10)
  initial = [3, 50, 77, 101, 9, 64, 12]
  picked = np.asarray(qs.k_center_greedy(jax.random.key(0), log_probs, 10,
                                         initial_centers=np.array(initial),
                                         chunk_size=chunk_size))
  assert not set(picked.tolist()) & set(initial)
  assert picked.tolist() == _reference_k_center(log_probs, initial, 10)


def test_margin_selects_least_certain_first():
  probs = np.array([[0.9, 0.1], [0.55, 0.45], [0.7, 0.3], [0.5, 0.5], [0.8, 0.2]])
  picked = qs.margin_selection(jax.random.key(0), jnp.log(jnp.asarray(probs, jnp.float32)), 3)
  np.testing.assert_array_equal(picked, [3, 1, 2])


def test_random_selection_is_distinct_and_keyed():
  log_probs = _dirichlet_log_probs(5, 300, 4)
  a = np.asarray(qs.random_selection(jax.random.key(0), log_probs, 100))
  b = np.asarray(qs.random_selection(jax.random.key(1), log_probs, 100))
  assert len(set(a.tolist())) == 100 and a.min() >= 0 and a.max() < 300
  np.testing.assert_array_equal(a, qs.random_selection(jax.random.key(0), log_probs, 100))
  assert not np.array_equal(a, b)


@pytest.mark.parametrize("name", sorted(qs.SELECTORS))
def test_registry_selectors_return_distinct_int32_indices(name):
  log_probs = _dirichlet_log_probs(6, 64, 10)
  picked = qs.select_queries(name, jax.random.key(0), log_probs, 16)
  assert picked.dtype == np.int32 and picked.shape == (16,)
  assert len(set(picked.tolist())) == 16


@pytest.mark.parametrize("call,match", [
    (lambda lp: qs.select_queries("entropy", jax.random.key(0), lp, 2), "unknown query"),
    (lambda lp: qs.k_center_greedy(jax.random.key(0), lp, 11), "num_select=11 exceeds"),
    (lambda lp: qs.k_center_greedy(jax.random.key(0), lp, 0), "num_select must be >= 1"),
    (lambda lp: qs.k_center_greedy(jax.random.key(0), lp, 9, initial_centers=[0, 1]),
     "exceeds the 8"),
    (lambda lp: qs.k_center_greedy(jax.random.key(0), lp, 2, initial_centers=[10]),
     "initial_centers"),
    (lambda lp: qs.random_selection(jax.random.key(0), lp, 20), "exceeds"),
])
def test_bad_arguments_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call(_dirichlet_log_probs(7, 10, 3))


def test_student_log_probs_in_padded_chunks_equal_one_forward_pass():
  info = data.DATASETS["digits"]
  parts = core.split(compact.compact_5k(num_classes=10, input_shape=(28, 28, 1), norm="none",
                                        rngs=nnx.Rngs(0)))
  images = data.load("digits", "test").images[:7]
  got = qs.student_log_probs(parts, images, info, chunk_size=3)  # chunks of 3, 3, 1 (+2 pad)
  out, _ = core.apply(parts.graphdef, parts.params, parts.batch_stats,
                      data.normalize(jnp.asarray(images), info), train=False)
  chex.assert_shape(got, (7, 10))
  np.testing.assert_allclose(got, jax.nn.log_softmax(out.logits), atol=1e-5)
