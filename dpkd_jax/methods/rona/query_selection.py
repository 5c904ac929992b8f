"""Which public samples RONA queries the teacher on: greedy k-center, random, margin.

RONA (Wang et al., AAAI 2019, "query sample selection") spends its privacy budget only on
queries, so it asks the teacher about the public samples that cover the student's view of the
data best: a k-center set in the space of the *student's* output distributions, found with the
greedy 2-approximation ("2-OPT" heuristic, Gonzalez 1985): start from one sample, then
repeatedly add the sample farthest from every chosen one. The distance is the symmetrised
Kullback-Leibler divergence between two samples' student distributions p and q,

    d(p, q) = (KL(p || q) + KL(q || p)) / 2 = ½ Σ_k (p_k − q_k)(log p_k − log q_k),

symmetric so that the selection does not depend on which argument is the center (KL is not a
metric, so the factor-2 guarantee of the metric k-center problem is heuristic here, as in the
paper). Selection reads only student outputs on public data: it is post-processing of earlier
private releases and costs no privacy.

Every selector has the signature `select(key, log_probs, num_select) -> (num_select,) int32`:
`log_probs` is the (N, K) log-softmax of the student on the N candidate samples, and the indices
are distinct. The baselines are `random` (uniform without replacement) and `margin` (smallest gap
between the two most likely classes, i.e. the student's least certain samples). `SELECTORS` is
the explicit name -> function registry used by configs and flags. `student_log_probs` computes
the (N, K) input in fixed-size jitted chunks; the k-center loop is one jitted `fori_loop`, each
iteration an (N, K) pass, and distances to many initial centers are taken in chunks of centers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import data
from dpkd_jax.models import core
from dpkd_jax import config_checks

Selector = Callable[[jax.Array, jax.Array, int], jax.Array]


@functools.partial(jax.jit, static_argnames=("graphdef", "info"))
def _chunk_log_probs(graphdef, params, batch_stats, images_uint8: jax.Array,
                     info: data.DatasetInfo) -> jax.Array:
  x = data.normalize(images_uint8, info)  # (chunk, H, W, C)
  out, _ = core.apply(graphdef, params, batch_stats, x, train=False)
  return jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)  # (chunk, K)


def student_log_probs(parts: core.ModelParts, images_uint8: np.ndarray, info: data.DatasetInfo,
                      *, chunk_size: int = 1000) -> np.ndarray:
  """(N, K) eval-mode log-softmax of the student on N candidates, in fixed-size chunks.

  The last chunk is zero-padded (then cut off) so that one executable serves every chunk;
  the executable is cached per model definition and dataset.

  Args:
    parts: the student (without adaptation layer).
    images_uint8: (N, H, W, C) uint8 candidate images.
    info: the dataset (normalisation).
    chunk_size: images per forward pass.

  Returns:
    (N, K) float32 log-probabilities, on the host (the model may be replicated over a mesh,
    the selectors run on the default device).
  """
  chunk_size = config_checks.integer("chunk_size", chunk_size, minimum=1)
  outputs = []
  for start in range(0, len(images_uint8), chunk_size):
    chunk = images_uint8[start:start + chunk_size]  # (<= chunk, H, W, C)
    padded = np.zeros((chunk_size, *chunk.shape[1:]), chunk.dtype)
    padded[:len(chunk)] = chunk
    outputs.append(np.asarray(_chunk_log_probs(parts.graphdef, parts.params, parts.batch_stats,
                                               padded, info))[:len(chunk)])
  return np.concatenate(outputs)


def _check_inputs(log_probs: jax.Array, num_select: int, *, num_excluded: int = 0) -> int:
  """Validates (N, K) log-probabilities and 1 <= num_select <= N - num_excluded."""
  chex.assert_rank(log_probs, 2)
  chex.assert_type(log_probs, float)
  num_select = config_checks.integer("num_select", num_select, minimum=1)
  available = log_probs.shape[0] - num_excluded
  if num_select > available:
    raise ValueError(f"num_select={num_select} exceeds the {available} selectable samples "
                     f"({log_probs.shape[0]} candidates, {num_excluded} already centers)")
  return num_select


def symmetric_kl(log_probs: jax.Array, center_log_probs: jax.Array) -> jax.Array:
  """d(p_n, q) = ½ Σ_k (p_nk − q_k)(log p_nk − log q_k) of every row against one center.

  Args:
    log_probs: (N, K) log-probabilities of the candidates.
    center_log_probs: (K,) log-probabilities of the center.

  Returns:
    (N,) divergences, >= 0 (each term is a product of two differences of the same sign).
  """
  difference = jnp.exp(log_probs) - jnp.exp(center_log_probs)  # (N, K)
  return 0.5 * jnp.sum(difference * (log_probs - center_log_probs), axis=-1)


def _min_divergence_to_centers(log_probs: jax.Array, center_log_probs: jax.Array,
                               chunk_size: int) -> jax.Array:
  """min_c d(p_n, q_c) over M centers, M in chunks so memory stays (N, chunk) not (N, M).

  Expanding the product, d(p, q) = ½ (p·log p + q·log q − p·log q − q·log p): per chunk two
  (N, K) @ (K, chunk) matmuls.
  """
  probs = jnp.exp(log_probs)  # (N, K)
  self_terms = jnp.sum(probs * log_probs, axis=-1)  # (N,), p·log p
  num_centers = center_log_probs.shape[0]
  padded = -(-num_centers // chunk_size) * chunk_size
  # Padding centers repeat center 0, which cannot lower the minimum below a real center's.
  centers = jnp.concatenate([center_log_probs,
                             jnp.broadcast_to(center_log_probs[:1],
                                              (padded - num_centers, log_probs.shape[1]))])
  chunks = centers.reshape(padded // chunk_size, chunk_size, -1)  # (chunks, chunk, K)

  def chunk_min(running_min: jax.Array, chunk_log_probs: jax.Array):
    chunk_probs = jnp.exp(chunk_log_probs)  # (chunk, K)
    chunk_self = jnp.sum(chunk_probs * chunk_log_probs, axis=-1)  # (chunk,)
    divergence = 0.5 * (self_terms[:, None] + chunk_self[None, :]
                        - probs @ chunk_log_probs.T - log_probs @ chunk_probs.T)  # (N, chunk)
    return jnp.minimum(running_min, jnp.min(divergence, axis=1)), None

  start = jnp.full(log_probs.shape[:1], jnp.inf, log_probs.dtype)
  running_min, _ = jax.lax.scan(chunk_min, start, chunks)
  return jnp.maximum(running_min, 0.0)  # float32 cancellation can dip just below zero


@functools.partial(jax.jit, static_argnames=("num_select", "chunk_size"))
def _k_center(key: jax.Array, log_probs: jax.Array, initial_centers: jax.Array, *,
              num_select: int, chunk_size: int) -> jax.Array:
  num_candidates = log_probs.shape[0]
  selected = jnp.zeros((num_select,), jnp.int32)
  taken = jnp.zeros((num_candidates,), bool)
  if initial_centers.shape[0]:
    min_divergence = _min_divergence_to_centers(log_probs, log_probs[initial_centers],
                                                chunk_size)  # (N,)
    taken = taken.at[initial_centers].set(True)
    start = 0
  else:  # No centers yet: the first one is drawn uniformly at random.
    first = jax.random.randint(key, (), 0, num_candidates)
    min_divergence = symmetric_kl(log_probs, log_probs[first])  # (N,)
    selected, taken, start = selected.at[0].set(first), taken.at[first].set(True), 1

  def add_center(i: int, carry):
    selected, min_divergence, taken = carry
    # Taken samples score -inf, so a sample is never picked twice (even among duplicates).
    center = jnp.argmax(jnp.where(taken, -jnp.inf, min_divergence))
    min_divergence = jnp.minimum(min_divergence, symmetric_kl(log_probs, log_probs[center]))
    return selected.at[i].set(center), min_divergence, taken.at[center].set(True)

  selected, _, _ = jax.lax.fori_loop(start, num_select, add_center,
                                     (selected, min_divergence, taken))
  return selected


def k_center_greedy(key: jax.Array, log_probs: jax.Array, num_select: int, *,
                    initial_centers: np.ndarray | jax.Array | None = None,
                    chunk_size: int = 1024) -> jax.Array:
  """Greedy k-center (farthest-first traversal) under the symmetrised KL divergence.

  Args:
    key: typed PRNG key; picks the first center when there are no `initial_centers`.
    log_probs: (N, K) student log-softmax on the candidates.
    num_select: k, how many new centers to pick (<= N − number of initial centers).
    initial_centers: optional (M,) indices already chosen (e.g. earlier queries): new centers
      are far from them too and never repeat them.
    chunk_size: centers per chunk when measuring the distance to the M initial centers.

  Returns:
    (num_select,) int32 distinct indices into `log_probs`, in the order they were picked.
  """
  initial = jnp.zeros((0,), jnp.int32) if initial_centers is None else jnp.unique(
      jnp.asarray(initial_centers, jnp.int32))
  num_select = _check_inputs(log_probs, num_select, num_excluded=int(initial.shape[0]))
  if initial.shape[0] and not (0 <= int(initial.min()) and int(initial.max()) < len(log_probs)):
    raise ValueError(f"initial_centers must index the {len(log_probs)} candidates")
  chunk_size = config_checks.integer("chunk_size", chunk_size, minimum=1)
  return _k_center(key, log_probs, initial, num_select=num_select, chunk_size=chunk_size)


def random_selection(key: jax.Array, log_probs: jax.Array, num_select: int) -> jax.Array:
  """Baseline: `num_select` candidates uniformly at random without replacement.

  Args:
    key: typed PRNG key of the draw.
    log_probs: (N, K); only N is used.
    num_select: how many (<= N).

  Returns:
    (num_select,) int32 distinct indices.
  """
  num_select = _check_inputs(log_probs, num_select)
  return jax.random.choice(key, log_probs.shape[0], (num_select,), replace=False).astype(
      jnp.int32)


@functools.partial(jax.jit, static_argnames="num_select")
def _smallest_margins(log_probs: jax.Array, num_select: int) -> jax.Array:
  top_two = jax.lax.top_k(jnp.exp(log_probs), 2)[0]  # (N, 2), descending
  margin = top_two[:, 0] - top_two[:, 1]  # (N,)
  return jnp.argsort(margin, stable=True)[:num_select].astype(jnp.int32)  # ties: lower index


def margin_selection(key: jax.Array, log_probs: jax.Array, num_select: int) -> jax.Array:
  """Baseline: the candidates with the smallest top-1 minus top-2 student probability.

  Args:
    key: unused (the selection is deterministic); kept for the common signature.
    log_probs: (N, K) student log-softmax, K >= 2.
    num_select: how many (<= N).

  Returns:
    (num_select,) int32 distinct indices, least certain first, ties by index.
  """
  del key
  num_select = _check_inputs(log_probs, num_select)
  if log_probs.shape[1] < 2:
    raise ValueError(f"margin selection needs >= 2 classes, got log_probs {log_probs.shape}")
  return _smallest_margins(log_probs, num_select)


SELECTORS: dict[str, Selector] = {
    "k_center": k_center_greedy,
    "random": random_selection,
    "margin": margin_selection,
}


def select_queries(name: str, key: jax.Array, log_probs: jax.Array,
                   num_select: int) -> np.ndarray:
  """Runs the selector registered as `name`.

  Args:
    name: a key of `SELECTORS`.
    key, log_probs, num_select: as for the selectors.

  Returns:
    (num_select,) int32 NumPy indices.
  """
  if name not in SELECTORS:
    raise ValueError(f"unknown query selection {name!r}; known: {sorted(SELECTORS)}")
  return np.asarray(SELECTORS[name](key, log_probs, num_select))
