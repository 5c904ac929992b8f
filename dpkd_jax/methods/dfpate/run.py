"""Data-free PATE: a teacher ensemble on disjoint private shards, procedural queries, GNMax.

Pipeline (`train_dfpate(config, workdir)`):

1. Teachers. n teachers of one small architecture, trained at once (vmapped) on disjoint
   equal shards of the private training set (`dfpate_teachers`). They can be saved to and
   reused from `teachers_dir` (as secret as the data: never publish it).
2. Queries. No public data: round r draws procedural images (`data.procedural`) from public
   randomness, or (`query_source="dp_model"`) samples of a DP mixture model of the private
   images released once at the start (`dfpate_query_model`: DP-PCA + DP k-means, a few
   Gaussian releases of unlabelled statistics). Round 0 asks `queries_per_round` random ones;
   later rounds draw a pool of `pool_factor` times as many and let the current DP student pick
   a class-balanced set of confident ones (`dfpate_student.select_queries`, post-processing).
3. Private answers. Each query's vote histogram is released once with Gaussian noise σ
   (`privacy.aggregation.noisy_histogram`); noisy argmax and margin are post-processing.
4. Student. Trained on (query, noisy answer) pairs, hard GNMax labels filtered by the noisy
   margin or soft noisy mean votes (`dfpate_student`), continuing across rounds.

Privacy (docs/privacy.md, "Data-free PATE"). Unit: one record of the private training set,
replace-one. The record is in one shard, so it changes one teacher and each released
histogram by at most √2 in L2 (hard or soft votes). Queries are public randomness, samples of
the released DP query model, or chosen by the DP student from those; the student, the
selection and the sample grid only see released values. So the run is the query model's
releases (`dfpate_query_model.query_model_event`, if used) followed by Q = rounds ·
queries_per_round adaptively composed Gaussian mechanisms with noise multiplier σ/√2
(`accounting.pate_event(noise_std=σ, num_queries=Q)`). σ is calibrated for the whole
composition before anything is released (PLD). The teacher accuracies are noiseless functions
of the private models: results.json keeps them under "private_diagnostics" (not covered by ε;
as in every method here, the test split is used only to report accuracy). Noise keys derive from a secret OS-entropy seed unless `seed`
is given (`privacy.seeds`).

`train_dfpate` writes to `workdir`: checkpoints/<round>/ (student, answered queries, ledger,
seed), results.json, record.json, samples.png (the last round's queries), metrics.csv, tb/.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import numpy as np
import optax
import tqdm
from dp_accounting import dp_event
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.data import procedural
from dpkd_jax.methods.dfpate import query_model as dfpate_query_model
from dpkd_jax.methods.dfpate import student as dfpate_student
from dpkd_jax.methods.dfpate import teachers as dfpate_teachers
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import aggregation
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import samples
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState

# Named key streams split once from the root key (a stream is never used for two purposes).
_STREAMS = ("teacher_init", "teacher_train", "student_init", "queries", "noise", "student")
# The query model's key is fold_in(queries stream, this); rounds use fold_in(queries, round)
# with round < this, so no key serves two purposes (and older runs keep their streams).
_QUERY_MODEL_FOLD = 2 ** 31 - 1
# Likewise for the teachers' self-training pool (queries stream) and its training key
# (teacher_train stream, whose steps use fold_in(t) with small t).
_TEACHER_POOL_FOLD = 2 ** 31 - 2
_SELF_TRAIN_FOLD = 2 ** 31 - 1
# The student's self-training pools: fold_in(fold_in(queries, this), round).
_STUDENT_POOL_FOLD = 2 ** 31 - 3
QUERY_SOURCES = ("procedural", "dp_model")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFPATEConfig:
  """A data-free PATE run. Privacy fields first, then teachers, queries, student.

  Attributes:
    dataset, data_dir: the private dataset and the directory of `<dataset>.npz`.
    target_epsilon: ε budget for all Q queries; σ is calibrated to it when `noise_std` is None.
    noise_std: σ per histogram bin; None = calibrate; 0 = no noise (ε = ∞, a baseline).
    delta: δ.
    use_teachers: False replaces every vote histogram by zeros before the noise (a baseline
      that never touches the private data: ε = 0).
    num_teachers, teacher_model, teacher_epochs, teacher_batch_size, teacher_lr: the ensemble
      (`teacher_model`: a key of `dfpate_teachers.TEACHER_MODELS`, built with norm "none").
    shard_seed: public seed of the shard assignment.
    teacher_self_training_pool: P > 0 (needs query_source="dp_model"): after training, every
      teacher labels P samples of the released query model with its OWN confident
      predictions and trains on its shard plus those (`dfpate_teachers.self_train`; each
      teacher still depends on one shard only). 0 = off.
    teacher_self_training_epochs, teacher_pseudo_threshold: epochs of that training and the
      confidence a teacher needs to label a pool image.
    teachers_dir: save the trained ensemble there, or reuse it if it holds one of the same
      dataset, shards and training fields.
    votes: "hard" (one-hot argmax per teacher) or "soft" (probabilities).
    rounds, queries_per_round, pool_factor: Q = rounds · queries_per_round; rounds >= 1 pick
      from a pool `pool_factor` times larger with the student (1 = no selection).
    query_source: "procedural" (public randomness, no privacy cost) or "dp_model" (samples
      of a DP mixture of the private images, `dfpate_query_model`; its releases are charged).
    query_model_components, query_model_clusters: m and k of the DP query model.
    query_model_noise: multiplies the default noise multipliers of the query model's three
      kinds of release (`dfpate_query_model.QueryModelConfig`; larger = cheaper, noisier).
    query_temperature: scales the per-cluster standard deviation of the query samples.
    invert_probability: chance that a procedural image has inverted polarity.
    target, margin_threshold: student targets (`dfpate_student.targets_from_votes`).
    student_model, student_epochs, student_batch_size, student_lr: the student (epochs per
      round, over every query answered so far).
    student_pseudo_pool, student_pseudo_threshold: from round 1 on, the student also trains
      on this many fresh unanswered queries that it labels itself with confidence >= the
      threshold (self-training; post-processing, no privacy cost). 0 = off.
    seed: root seed; None (default) draws a secret one.
  """

  dataset: str
  data_dir: str | None = None
  target_epsilon: float | None = 10.0
  noise_std: float | None = None
  delta: float = 1e-5
  use_teachers: bool = True
  num_teachers: int = 250
  teacher_model: str = "mlp"
  teacher_epochs: int = 20
  teacher_batch_size: int = 32
  teacher_lr: float = 3e-3
  shard_seed: int = 0
  teachers_dir: str | None = None
  teacher_self_training_pool: int = 0
  teacher_self_training_epochs: int = 5
  teacher_pseudo_threshold: float = 0.9
  votes: str = "hard"
  rounds: int = 2
  queries_per_round: int = 1000
  pool_factor: int = 5
  query_source: str = "procedural"
  query_model_components: int = 20
  query_model_clusters: int = 40
  query_model_noise: float = 1.0
  query_temperature: float = 1.0
  invert_probability: float = 0.5
  target: str = "hard"
  margin_threshold: float = 0.0
  student_model: str = "lenet5"
  student_epochs: int = 20
  student_batch_size: int = 64
  student_lr: float = 1e-3
  student_pseudo_pool: int = 0
  student_pseudo_threshold: float = 0.95
  seed: int | None = None

  def __post_init__(self):
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    if self.teacher_model not in dfpate_teachers.TEACHER_MODELS:
      raise ValueError(f"unknown teacher_model {self.teacher_model!r}; known: "
                       f"{sorted(dfpate_teachers.TEACHER_MODELS)}")
    if self.student_model not in models.CLASSIFIERS:
      raise ValueError(f"unknown student_model {self.student_model!r}; known: "
                       f"{sorted(models.CLASSIFIERS)}")
    if self.votes not in aggregation.VOTE_KINDS:
      raise ValueError(f"votes must be one of {aggregation.VOTE_KINDS}, got {self.votes!r}")
    if self.query_source not in QUERY_SOURCES:
      raise ValueError(f"query_source must be one of {QUERY_SOURCES}, got "
                       f"{self.query_source!r}")
    if not (math.isfinite(self.query_model_noise) and self.query_model_noise > 0):
      raise ValueError(f"query_model_noise must be finite and > 0, got "
                       f"{self.query_model_noise!r}")
    self.query_model_config()  # validates the query model's fields
    if self.teacher_self_training_pool and self.query_source != "dp_model":
      raise ValueError("teacher_self_training_pool needs query_source='dp_model' (the pool "
                       "is drawn from the released query model)")
    if not 0 <= self.student_pseudo_threshold <= 1:
      raise ValueError(f"student_pseudo_threshold must be in [0, 1], got "
                       f"{self.student_pseudo_threshold!r}")
    if not 0 <= self.teacher_pseudo_threshold <= 1:
      raise ValueError(f"teacher_pseudo_threshold must be in [0, 1], got "
                       f"{self.teacher_pseudo_threshold!r}")
    if self.target not in dfpate_student.TARGET_KINDS:
      raise ValueError(f"target must be one of {dfpate_student.TARGET_KINDS}, got "
                       f"{self.target!r}")
    for name, minimum in (("num_teachers", 1), ("teacher_epochs", 1), ("teacher_batch_size", 1),
                          ("rounds", 1), ("queries_per_round", 1), ("pool_factor", 1),
                          ("student_epochs", 1), ("student_batch_size", 1), ("shard_seed", 0),
                          ("teacher_self_training_pool", 0), ("student_pseudo_pool", 0),
                          ("teacher_self_training_epochs", 1)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    for name in ("teacher_lr", "student_lr"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
    if not 0 <= self.margin_threshold <= 1:
      raise ValueError(f"margin_threshold must be in [0, 1], got {self.margin_threshold!r}")
    if self.noise_std is None and self.target_epsilon is None:
      raise ValueError("give target_epsilon (σ is calibrated) or noise_std")
    if self.target_epsilon is not None and not self.target_epsilon > 0:
      raise ValueError(f"target_epsilon must be > 0, got {self.target_epsilon!r}")
    if self.noise_std is not None and not (math.isfinite(self.noise_std)
                                           and self.noise_std >= 0):
      raise ValueError(f"noise_std must be finite and >= 0, got {self.noise_std!r}")
    if not 0 < self.delta < 1:
      raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
    self.procedural_config()  # validates invert_probability
    seeds.resolve_seed(0 if self.seed is None else self.seed)  # validates an explicit seed

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def num_queries(self) -> int:
    return self.rounds * self.queries_per_round

  def procedural_config(self) -> procedural.ProceduralConfig:
    return procedural.ProceduralConfig(image_shape=self.info.image_shape,
                                       invert_probability=self.invert_probability)

  def query_model_config(self) -> dfpate_query_model.QueryModelConfig:
    default = dfpate_query_model.QueryModelConfig
    scale = self.query_model_noise
    return default(num_components=self.query_model_components,
                   num_clusters=self.query_model_clusters,
                   pca_noise_multiplier=scale * default.pca_noise_multiplier,
                   kmeans_noise_multiplier=scale * default.kmeans_noise_multiplier,
                   variance_noise_multiplier=scale * default.variance_noise_multiplier,
                   temperature=self.query_temperature)

  def query_model_event(self):
    """The query model's releases (NoOp for procedural queries or without teachers)."""
    if self.query_source != "dp_model" or not self.use_teachers:
      return dp_event.NoOpDpEvent()
    return dfpate_query_model.query_model_event(self.query_model_config())

  def total_event(self, noise_std: float):
    """Everything the run releases: the query model, then Q noisy histograms."""
    return dp_event.ComposedDpEvent([
        self.query_model_event(),
        accounting.pate_event(noise_std=noise_std, num_queries=self.num_queries)])

  def resolved_noise_std(self) -> float:
    """σ: as given, else calibrated so that the whole run meets the target (PLD)."""
    if self.noise_std is not None:
      return float(self.noise_std)
    if self.query_source == "procedural":
      return aggregation.calibrate_noise_std(target_epsilon=self.target_epsilon,
                                             delta=self.delta, num_queries=self.num_queries)
    if accounting.epsilon(self.query_model_event(), delta=self.delta) >= self.target_epsilon:
      raise ValueError(f"the query model alone spends the target ε={self.target_epsilon}; "
                       f"raise query_model_noise")
    return calibration.calibrate_noise_multiplier(
        self.total_event, target_epsilon=self.target_epsilon, delta=self.delta)

  def teacher_identity(self) -> dict[str, Any]:
    """What a saved ensemble must have been trained with to be reused."""
    return {"dataset": self.dataset, **{name: getattr(self, name) for name in (
        "num_teachers", "teacher_model", "teacher_epochs", "teacher_batch_size", "teacher_lr",
        "shard_seed")}}


def _epsilon(config: DFPATEConfig, noise_std: float) -> float:
  if not config.use_teachers:
    return 0.0
  return accounting.epsilon(config.total_event(noise_std), delta=config.delta)


def get_teachers(config: DFPATEConfig, train: data.ArrayDataset, test: data.ArrayDataset,
                 keys: dict[str, jax.Array],
                 ) -> tuple[dfpate_teachers.Ensemble, float, dict[str, float]]:
  """(ensemble, training seconds, test report): restored from `teachers_dir` if it matches,
  else trained (and saved there). The test report (`ensemble_accuracy`, n forward passes per
  test image: minutes on CPU) is computed once and stored beside the ensemble."""
  info = config.info
  ensemble = dfpate_teachers.init_ensemble(config.teacher_model, config.num_teachers, info,
                                           keys["teacher_init"])
  saved_dir = config.teachers_dir
  if saved_dir and checkpoint.latest_step(saved_dir) is not None:
    meta = checkpoint.restore_metadata(saved_dir)
    if meta.get("identity") != config.teacher_identity():
      raise ValueError(f"{saved_dir!r} holds an ensemble trained for {meta.get('identity')},"
                       f" not {config.teacher_identity()}; use another teachers_dir")
    params, meta = checkpoint.restore(saved_dir, ensemble.params)
    ensemble = dfpate_teachers.Ensemble(ensemble.graphdef, params)
    if "report" not in meta:  # an ensemble saved without its report: add it once
      meta["report"] = dfpate_teachers.ensemble_accuracy(ensemble, test)
      checkpoint.save(saved_dir, checkpoint.latest_step(saved_dir) + 1,
                      jax.device_get(ensemble.params), meta)
    return ensemble, float(meta["train_seconds"]), meta["report"]
  images, labels = dfpate_teachers.equal_shards(train, config.num_teachers,
                                                seed=config.shard_seed)
  start = time.perf_counter()
  ensemble, _ = dfpate_teachers.train_ensemble(
      ensemble, images, labels, info, keys["teacher_train"], epochs=config.teacher_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_lr)
  seconds = time.perf_counter() - start
  report = dfpate_teachers.ensemble_accuracy(ensemble, test)
  if saved_dir:
    checkpoint.save(saved_dir, 0, jax.device_get(ensemble.params),
                    {"identity": config.teacher_identity(), "train_seconds": seconds,
                     "report": report})
  return ensemble, seconds, report


def _self_train_teachers(config: DFPATEConfig, ensemble: dfpate_teachers.Ensemble,
                         train: data.ArrayDataset, query_model: dfpate_query_model.QueryModel,
                         keys: dict[str, jax.Array]
                         ) -> tuple[dfpate_teachers.Ensemble, float]:
  """Per-teacher self-training on samples of the released query model (not cached: the pool
  depends on the run's secret seed). Returns (ensemble, seconds)."""
  start = time.perf_counter()
  pool = dfpate_query_model.sample_queries(
      jax.random.fold_in(keys["queries"], _TEACHER_POOL_FOLD), query_model,
      config.teacher_self_training_pool, config.info.image_shape,
      temperature=config.query_temperature)
  images, labels = dfpate_teachers.equal_shards(train, config.num_teachers,
                                                seed=config.shard_seed)
  ensemble, _ = dfpate_teachers.self_train(
      ensemble, images, labels, pool, config.info,
      jax.random.fold_in(keys["teacher_train"], _SELF_TRAIN_FOLD),
      epochs=config.teacher_self_training_epochs,
      batch_size=min(config.teacher_batch_size, labels.shape[1]),
      learning_rate=config.teacher_lr, threshold=config.teacher_pseudo_threshold)
  return ensemble, time.perf_counter() - start


def init_student(config: DFPATEConfig, key: jax.Array) -> TrainState:
  info = config.info
  student = models.create_classifier(config.student_model, num_classes=info.num_classes,
                                     input_shape=info.image_shape, rngs=nnx.Rngs(key))
  return TrainState.create(models.split(student), optax.adam(config.student_lr))


def _config_json(config: DFPATEConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


def _draw_pool(config: DFPATEConfig, key: jax.Array, size: int,
               query_model: dfpate_query_model.QueryModel | None) -> np.ndarray:
  """(size, H, W, C) uint8 public images: procedural, or samples of the released model."""
  if query_model is None:
    return procedural.generate_chunked(key, size, config.procedural_config())
  return dfpate_query_model.sample_queries(key, query_model, size, config.info.image_shape,
                                           temperature=config.query_temperature)


def _with_pseudo_labels(config: DFPATEConfig, state: TrainState, key: jax.Array,
                        query_model: dfpate_query_model.QueryModel | None,
                        images: np.ndarray, targets: np.ndarray, weights: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Answered queries plus fresh pool images the current student labels itself."""
  pool = _draw_pool(config, key, config.student_pseudo_pool, query_model)
  extra_targets, extra_weights = dfpate_student.pseudo_label_targets(
      dfpate_student.predict_probs(state, pool, config.info),
      threshold=config.student_pseudo_threshold)
  return (np.concatenate([images, pool]), np.concatenate([targets, extra_targets]),
          np.concatenate([weights, extra_weights]))


def _next_queries(config: DFPATEConfig, state: TrainState, key: jax.Array, round_index: int,
                  query_model: dfpate_query_model.QueryModel | None) -> np.ndarray:
  """(queries_per_round, H, W, C) uint8 queries of one round (public randomness or samples of
  the released query model, picked by the DP student)."""
  # Every round draws a pool of the same size (one compilation of the generator); round 0
  # has no student yet and takes the pool's first images, i.e. random queries.
  pool = _draw_pool(config, key, config.pool_factor * config.queries_per_round, query_model)
  if round_index == 0 or config.pool_factor == 1:
    return pool[:config.queries_per_round]
  probs = dfpate_student.predict_probs(state, pool, config.info)
  return pool[dfpate_student.select_queries(probs, config.queries_per_round)]


@workdir_lib.run_scope
def train_dfpate(config: DFPATEConfig, workdir: str, *, resume: bool = False,
                 progress: bool = True) -> dict[str, Any]:
  """Runs data-free PATE (module docstring); returns and writes results.json.

  Args:
    config: the validated run.
    workdir: output directory.
    resume: continue the round checkpoint in `workdir` (same config); if False a workdir
      holding one is refused (its ledger is never overwritten).
    progress: tqdm bar over rounds.

  Returns:
    The results dict.
  """
  info, clock = config.info, outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="DF-PATE", config=_config_json(config), resume=resume)
  root_seed = run.root_seed(config.seed)
  keys = dict(zip(_STREAMS, jax.random.split(seeds.root_key(root_seed), len(_STREAMS))))
  noise_std = config.resolved_noise_std()
  total_epsilon = _epsilon(config, noise_std)
  if config.target_epsilon is not None and total_epsilon > config.target_epsilon:
    raise ValueError(f"noise_std={noise_std} over {config.num_queries} queries spends "
                     f"ε={total_epsilon:.4g} > target_epsilon={config.target_epsilon}")

  train = data.load(config.dataset, "train", data_dir=config.data_dir)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  query_model = None
  if config.query_source == "dp_model":
    # Refitting on resume repeats the same release (same key, same data): no new cost.
    query_model = dfpate_query_model.fit_query_model(
        jax.random.fold_in(keys["queries"], _QUERY_MODEL_FOLD),
        train.images if config.use_teachers else np.zeros_like(train.images),
        config.query_model_config())
  ensemble, teacher_seconds, teacher_report = None, 0.0, {}
  base_report = {}
  if config.use_teachers:
    ensemble, teacher_seconds, teacher_report = get_teachers(config, train, test, keys)
    if config.teacher_self_training_pool:
      base_report = teacher_report
      ensemble, seconds = _self_train_teachers(config, ensemble, train, query_model, keys)
      teacher_seconds += seconds
      teacher_report = dfpate_teachers.ensemble_accuracy(ensemble, test)
  del train  # nothing below reads the private data except through `ensemble`

  num_classes = info.num_classes
  state = init_student(config, keys["student_init"])
  images = np.zeros((0, *info.image_shape), np.uint8)
  released = np.zeros((0, num_classes), np.float32)  # noisy histograms (public)
  budget = config.target_epsilon if config.target_epsilon is not None else total_epsilon
  ledger = run.ledger(ledger_lib.PrivacyLedger(target_epsilon=budget, delta=config.delta)
                      if config.use_teachers and noise_std > 0 else None)
  start, history = 0, []
  if ledger is not None and not run.resuming and query_model is not None:
    run.charge(config.query_model_event(), step=0, note="DP query model: second moment, "
               f"{config.query_model_config().kmeans_iterations} k-means steps, variances")
  if run.resuming:
    template = {"student": state.arrays(), "images": images, "released": released}
    template["images"] = np.zeros((run.saved["answered"], *info.image_shape), np.uint8)
    template["released"] = np.zeros((run.saved["answered"], num_classes), np.float32)
    arrays, meta = run.restore(template)
    state = state.with_arrays(arrays["student"])
    images, released = np.asarray(arrays["images"]), np.asarray(arrays["released"])
    start, history = int(meta["round"]), list(meta["accuracy"])

  event = accounting.pate_event(noise_std=noise_std, num_queries=config.queries_per_round)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  bar = tqdm.tqdm(total=config.rounds, initial=start, disable=not progress,
                  desc=f"DF-PATE {config.dataset} rounds")
  queries = images[-config.queries_per_round:]
  for round_index in range(start, config.rounds):
    queries = _next_queries(config, state, jax.random.fold_in(keys["queries"], round_index),
                            round_index, query_model)
    if ledger is not None:  # account before releasing: a crash never under-counts
      run.charge(event, step=round_index, note=f"round {round_index}: "
                 f"{config.queries_per_round} noisy vote histograms, σ={noise_std:.4g}")
    if ensemble is not None:
      histogram = aggregation.vote_histogram(
          dfpate_teachers.ensemble_logits(ensemble, queries, info), votes=config.votes)
    else:
      histogram = np.zeros((len(queries), num_classes), np.float32)
    # Without teachers the labels are pure noise (σ >= 1 so that they are not all class 0).
    answer = aggregation.noisy_histogram(jax.random.fold_in(keys["noise"], round_index),
                                         histogram,
                                         noise_std if ensemble is not None else max(noise_std, 1.0))
    images = np.concatenate([images, queries])
    released = np.concatenate([released, np.asarray(answer.histogram)])
    targets, weights = dfpate_student.targets_from_votes(
        released, config.num_teachers, target=config.target,
        margin_threshold=config.margin_threshold)
    training_set = (images, targets, weights)
    if config.student_pseudo_pool and round_index > 0:  # round 0 has no student to ask
      pool_key = jax.random.fold_in(jax.random.fold_in(keys["queries"], _STUDENT_POOL_FOLD),
                                    round_index)
      training_set = _with_pseudo_labels(config, state, pool_key, query_model, *training_set)
    state, loss = dfpate_student.train_student(
        state, *training_set, jax.random.fold_in(keys["student"], round_index),
        info=info, target=config.target, epochs=config.student_epochs,
        batch_size=config.student_batch_size)
    host_arrays = run.seal({"student": state.arrays(), "images": images, "released": released})
    history.append(evaluate.evaluate(state.parts, test)["accuracy"])
    spent = total_epsilon if ledger is None else ledger.spent_epsilon()
    writer.write(round_index + 1, {"loss": loss, "answered": float(weights.sum()),
                                   "epsilon": spent}, prefix="train/")
    writer.write(round_index + 1, {"accuracy": history[-1]}, prefix="test/")
    bar.update(1)
    bar.set_postfix(acc=f"{history[-1]:.4f}", eps=f"{spent:.4g}")
    run.save(round_index + 1, host_arrays,
             {"config": _config_json(config), "round": round_index + 1,
              "accuracy": history, "answered": int(len(images)),
              "ledger": None if ledger is None else ledger.to_json(),
              "root_seed": list(root_seed)})
  bar.close()
  writer.close()
  samples.save_sample_grid(np.asarray(data.normalize(queries[:64], info)), info,
                         os.path.join(workdir, "samples.png"))
  spent = total_epsilon if ledger is None else ledger.spent_epsilon()
  results = {
      "method": "dfpate",
      "test_accuracy": history[-1] if history else math.nan,
      "accuracy_per_round": history,
      "epsilon": spent,  # inf when σ = 0 (no noise), 0 without teachers
      "delta": config.delta,
      "noise_std": noise_std,
      "noise_multiplier": noise_std / aggregation.VOTE_L2_SENSITIVITY,
      "num_queries": len(images),
      "answered_queries": int((dfpate_student.targets_from_votes(
          released, config.num_teachers, target=config.target,
          margin_threshold=config.margin_threshold)[1] > 0).sum()),
      "teacher_train_seconds": teacher_seconds,
      "seed": root_seed.public_description(),
      "student_params": models.count_params(state.params),
      "config": _config_json(config),
      outputs.PRIVATE_KEY: outputs.private_section(  # noiseless functions of the teachers
          {"teachers": teacher_report, "teachers_before_self_training": base_report}),
  }
  return outputs.finish_run(workdir, results, clock=clock, dataset=config.dataset,
                            test_accuracy=results["test_accuracy"], sound_epsilon=spent,
                            delta=config.delta, target_epsilon=config.target_epsilon)
