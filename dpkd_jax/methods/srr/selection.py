"""Which synthetic queries a stage asks: N of a larger pool, balanced over the student's classes.

A teacher-pretrained generator makes some classes rarely (on MNIST few 8s), so a stage's N
queries hold few of them and the student learns them worst. A stage may instead draw
`pool` × N latents and keep N of them, at most N / K per class of the student's current
prediction, the rest filled uniformly at random:

    z ~ N(0, I)                          (pool N, latent)   public randomness
    p_s = softmax(student(G(z)))         (pool N, K)        a function of earlier releases
    keep = balanced_subset(key, p_s, N)  (N,)               indices into the pool

Neither the generator, the student nor the key reads the teacher anew (the student is a
function of earlier releases; the generator of the teacher only as it already was, which
the run's record-level ε accounts), so the choice is post-processing of public quantities:
the teacher is still asked once per kept query and each release keeps its ε. No teacher
label, not even a noisy one, picks a query.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def balanced_subset(key: jax.Array, probabilities: jax.Array, n: int) -> jax.Array:
  """Indices of n rows, at most ceil(n / K) per argmax class, the rest uniformly at random.

  Every class with at least q = ceil(n / K) rows in the pool gets q of them, chosen uniformly
  at random; a class with fewer gives all of its rows, and the free places go to rows drawn
  uniformly from the pool's remaining ones. So a pool whose classes are all frequent enough
  yields n / K per class (for K dividing n), and a pool of n rows is a permutation of itself.

  Args:
    key: public randomness of the choice.
    probabilities: (M, K) the student's class probabilities on the pool, M >= n.
    n: rows to keep.

  Returns:
    (n,) int32 distinct indices into the pool, quota rows first.
  """
  m, k = probabilities.shape
  if not 0 < n <= m:
    raise ValueError(f"cannot keep n={n} rows of a pool of {m}")
  quota = -(-n // k)
  order_key, fill_key = jax.random.split(key)
  perm = jax.random.permutation(order_key, m)  # (M,) random order within each class
  classes = jnp.argmax(probabilities[perm], axis=-1)  # (M,) in that order
  by_class = jnp.argsort(classes, stable=True)  # (M,) positions in perm, grouped by class
  counts = jnp.bincount(classes, length=k)  # (K,)
  starts = jnp.cumsum(counts) - counts  # (K,) first position of each class in by_class
  rank = jnp.zeros((m,), jnp.int32).at[by_class].set(
      jnp.arange(m, dtype=jnp.int32) - starts[classes[by_class]].astype(jnp.int32))
  # Quota rows sort first (keys 0..quota-1); others after, in a fresh random order.
  fill_order = jax.random.permutation(fill_key, m).astype(jnp.int32)
  sort_key = jnp.where(rank < quota, rank, quota + fill_order)
  # Up to K * quota >= n rows have rank < quota: lower ranks are kept first, so any class
  # short of n / K still gets all of its rows.
  chosen = jnp.argsort(sort_key, stable=True)[:n]
  return perm[chosen].astype(jnp.int32)
