"""One data-free PATE round: queries -> noisy vote histograms -> student (`build_train_step`).

`train_step(state, round_index) -> (state, metrics)` picks the round's public queries
(`queries.next_queries`), releases their vote histograms once through
`aggregation.noisy_histogram` with σ = `plan.noise_std` (`release_votes`: the round's only
release, `plan.event(1)`, charged by the caller BEFORE the step), and trains the student on
every answer so far. σ comes from the plan only. The round is host code (pools, selection and
epochs over a growing set); its jitted parts are the student's and the teachers' steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from flax import nnx

from dpkd_jax import models
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import privacy
from dpkd_jax.methods.dfpate import queries as queries_lib
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.methods.dfpate import streams
from dpkd_jax.methods.dfpate import student
from dpkd_jax.privacy import aggregation
from dpkd_jax.train.state import TrainState


class RoundState(NamedTuple):
  """What a round hands to the next (all public: the student and released answers).

  Attributes:
    student: the student's train state.
    images: (A, H, W, C) uint8 queries answered so far (A = rounds done · queries_per_round).
    released: (A, K) float32 their released noisy vote histograms.
  """

  student: TrainState
  images: np.ndarray
  released: np.ndarray


def init_state(config: config_lib.DFPATEConfig, key: jax.Array) -> RoundState:
  """A fresh student (Adam) and no answered query yet."""
  info = config.info
  model = models.create_classifier(config.student_model, num_classes=info.num_classes,
                                   input_shape=info.image_shape, rngs=nnx.Rngs(key))
  return RoundState(TrainState.create(models.split(model),
                                     optax.adam(config.student_learning_rate)),
                    np.zeros((0, *info.image_shape), np.uint8),
                    np.zeros((0, info.num_classes), np.float32))


def release_votes(plan: privacy.DFPATEPlan, key: jax.Array, histogram: jax.Array
                  ) -> aggregation.NoisyVotes:
  """The round's release: (Q, K) vote histograms + N(0, σ²) per bin, σ = `plan.noise_std`.

  Without teachers the histograms are zeros (nothing private) and the labels pure noise:
  σ >= 1 there so that they are not all class 0.
  """
  noise_std = plan.noise_std if plan.use_teachers else max(plan.noise_std, 1.0)
  if plan.secure_noise:  # the integer grid and exact discrete Gaussian (`secure_gaussian`)
    return aggregation.noisy_histogram(key, histogram, noise_std, secure_noise=True,
                                       max_votes=plan.num_teachers)
  return aggregation.noisy_histogram(key, histogram, noise_std)


def _histogram(ensemble: teacher_ensemble.Ensemble | None, queries: np.ndarray,
               config: config_lib.DFPATEConfig) -> jax.Array | np.ndarray:
  """(Q, K) vote histogram of the teachers (zeros without teachers). NOT private."""
  if ensemble is None:
    return np.zeros((len(queries), config.info.num_classes), np.float32)
  return aggregation.vote_histogram(
      teacher_ensemble.ensemble_logits(ensemble, queries, config.info), votes=config.votes)


def build_train_step(plan: privacy.DFPATEPlan, config: config_lib.DFPATEConfig, *,
                     ensemble: teacher_ensemble.Ensemble | None,
                     query_model: query_model_lib.QueryModel | None,
                     keys: dict[str, jax.Array]
                     ) -> Callable[[RoundState, int], tuple[RoundState, dict[str, Any]]]:
  """The round of a run: σ from `plan`, everything else from `config`.

  Args:
    plan: the run's plan (σ of the histograms).
    config: the run (queries, votes, student).
    ensemble: the teachers, or None (`use_teachers=False`).
    query_model: the released query model, or None for procedural queries.
    keys: the run's streams (`streams.root_keys`); round r uses fold_in(stream, r).

  Returns:
    `train_step(state, round_index) -> (state, {"loss", "answered"})`.
  """
  def train_step(state: RoundState, round_index: int) -> tuple[RoundState, dict[str, Any]]:
    queries = queries_lib.next_queries(
        config, state.student, jax.random.fold_in(keys["queries"], round_index), round_index,
        query_model)
    answer = release_votes(plan, jax.random.fold_in(keys["noise"], round_index),
                           _histogram(ensemble, queries, config))
    images = np.concatenate([state.images, queries])
    released = np.concatenate([state.released, np.asarray(answer.histogram)])
    targets, weights = student.targets_from_votes(
        released, config.num_teachers, target=config.target,
        margin_threshold=config.margin_threshold)
    training_set = (images, targets, weights)
    if config.student_pseudo_pool and round_index > 0:  # round 0 has no student to ask
      pool_key = jax.random.fold_in(
          jax.random.fold_in(keys["queries"], streams.STUDENT_POOL_FOLD), round_index)
      training_set = queries_lib.with_pseudo_labels(config, state.student, pool_key,
                                                    query_model, *training_set)
    trained, loss = student.train_student(
        state.student, *training_set, jax.random.fold_in(keys["student"], round_index),
        info=config.info, target=config.target, epochs=config.student_epochs,
        batch_size=config.student_batch_size)
    return RoundState(trained, images, released), {"loss": loss,
                                                    "answered": float(weights.sum())}

  return train_step


def make_train_step(plan: privacy.DFPATEPlan, config: config_lib.DFPATEConfig, *,
                    ensemble: teacher_ensemble.Ensemble | None,
                    query_model: query_model_lib.QueryModel | None,
                    keys: dict[str, jax.Array]
                    ) -> Callable[[RoundState, int], tuple[RoundState, dict[str, Any]]]:
  """The round as the run calls it: `build_train_step`'s, as built (host code: the student's
  and the teachers' steps are jitted and cached inside)."""
  return build_train_step(plan, config, ensemble=ensemble, query_model=query_model, keys=keys)
