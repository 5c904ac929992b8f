"""The queries of a data-free PATE round: public pools, picked by the DP student.

No function here sees private data or a teacher: pools are procedural images (public
randomness) or samples of the released DP query model, and the student that picks from them
or labels them is itself a function of released answers only (post-processing).
"""

from __future__ import annotations

import jax
import numpy as np

from dpkd_jax.data import procedural
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.methods.dfpate import student
from dpkd_jax.train.state import TrainState


def draw_pool(config: config_lib.DFPATEConfig, key: jax.Array, size: int,
              query_model: query_model_lib.QueryModel | None) -> np.ndarray:
  """(size, H, W, C) uint8 public images: procedural, or samples of the released model."""
  if query_model is None:
    return procedural.generate_chunked(key, size, config.procedural_config())
  return query_model_lib.sample_queries(key, query_model, size, config.info.image_shape,
                                        temperature=config.query_temperature)


def next_queries(config: config_lib.DFPATEConfig, state: TrainState, key: jax.Array,
                 round_index: int, query_model: query_model_lib.QueryModel | None
                 ) -> np.ndarray:
  """(queries_per_round, H, W, C) uint8 queries of one round (public randomness or samples of
  the released query model, picked by the DP student `state`)."""
  # Every round draws a pool of the same size (one compilation of the generator); round 0
  # has no student yet and takes the pool's first images, i.e. random queries.
  pool = draw_pool(config, key, config.pool_factor * config.queries_per_round, query_model)
  if round_index == 0 or config.pool_factor == 1:
    return pool[:config.queries_per_round]
  probs = student.predict_probs(state, pool, config.info)
  return pool[student.select_queries(probs, config.queries_per_round)]


def with_pseudo_labels(config: config_lib.DFPATEConfig, state: TrainState, key: jax.Array,
                       query_model: query_model_lib.QueryModel | None, images: np.ndarray,
                       targets: np.ndarray, weights: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Answered queries plus `student_pseudo_pool` fresh pool images the student labels itself.

  Args:
    config: the run.
    state: the current student.
    key: the pool's key.
    query_model: the released query model, or None for procedural pools.
    images, targets, weights: (Q, H, W, C), (Q, K), (Q,) answered queries and their targets.

  Returns:
    (images, targets, weights) with the pool appended (weight 0 where not confident).
  """
  pool = draw_pool(config, key, config.student_pseudo_pool, query_model)
  extra_targets, extra_weights = student.pseudo_label_targets(
      student.predict_probs(state, pool, config.info),
      threshold=config.student_pseudo_threshold)
  return (np.concatenate([images, pool]), np.concatenate([targets, extra_targets]),
          np.concatenate([weights, extra_weights]))
