"""The key streams of a data-free PATE run: one purpose per key, all in one place.

The root key is split once into named streams; a stream is never used for two purposes.
Within a stream, round r uses fold_in(stream, r) (r < `rounds`), so the one-off keys below
take tags near 2**31 that no round reaches (and older runs keep their streams).
"""

from __future__ import annotations

import jax

from dpkd_jax.privacy import seeds

STREAMS = ("teacher_init", "teacher_train", "student_init", "queries", "noise", "student")
# fold_in(queries, this): the key of the DP query model's fit.
QUERY_MODEL_FOLD = 2 ** 31 - 1
# fold_in(queries, this): the teachers' self-training pool; fold_in(teacher_train, this): its
# training (the teachers' steps use fold_in(teacher_train, t) with small t).
TEACHER_POOL_FOLD = 2 ** 31 - 2
SELF_TRAIN_FOLD = 2 ** 31 - 1
# fold_in(fold_in(queries, this), round): the student's self-training pool of a round.
STUDENT_POOL_FOLD = 2 ** 31 - 3


def root_keys(root_seed: seeds.ResolvedSeed) -> dict[str, jax.Array]:
  """{stream name: key}, split once from the run's root key."""
  return dict(zip(STREAMS, jax.random.split(seeds.root_key(root_seed), len(STREAMS))))

