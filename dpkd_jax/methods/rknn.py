"""Reverse k-NN private labelling (Li et al., arXiv:2207.13253) end to end.

Splits (MNIST as the paper): private = the training split (60k), public = `num_public`
images of the test split chosen by `split_seed`, evaluation = the rest of the test split.
One labelling round:

1. a representation is fitted on the public images only (`representations.fit`);
2. k-means++ (`rknn_votes.kmeans`) clusters the public embeddings into s clusters whose
   centres are the queries (public: computed from public data only);
3. every private record votes with its one-hot label for its k nearest queries; the (s, C)
   counts are released with Laplace(2k/eps) noise (central) or built from per-record
   bit-flipped reports (local), see `rknn_votes`;
4. each query's noisy arg-max label goes to every public sample of its cluster (Acc_pl =
   label accuracy on the public set);
5. a student is trained on the labelled public set (`rknn_student`) and evaluated on the
   evaluation split (Acc_pc).

Rounds t > 1 (optional): the `uncertain_fraction` public samples on which the current student
is least confident are clustered again into s new queries, voted on, and relabelled.

Privacy: `epsilon` is the whole run's budget, eps / T per round. Central: each round is pure
(eps/T)-DP under replace-one (Laplace event, `accounting.laplace_counts_event`); local: each
record's reports are (eps/T)-LDP per round, eps per record in total, accounted with the binary
randomized-response event that dominates every pure eps-DP mechanism
(`accounting.srr_event(num_classes=None)`). Rounds compose: the run is eps-DP (δ = 0);
the ledger also reports its PLD ε at `delta`. The noise derives from the seed: a None seed
is drawn from OS entropy and stored only in the checkpoint.

Workdir: checkpoints/ (Orbax per round: student, public labels, PRNG key data; config and
ledger as metadata), privacy_ledger.json, results.json, record.json, metrics.csv and tb/ (all
released values: the student and labels see only public data and the noisy counts).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import jax
import numpy as np
from dp_accounting import dp_event

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import representations
from dpkd_jax.methods import rknn_student
from dpkd_jax.methods import rknn_votes
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.privacy import validation
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import workdir as workdir_lib

MODES = ("central", "local")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RKNNConfig:
  """A reverse k-NN labelling run, validated at construction.

  Attributes:
    dataset: a name in `data.DATASETS` (train split = private, test split = public + eval).
    representation: a key of `representations.REPRESENTATIONS` ("pca", "simclr").
    representation_config: that kind's config (None: its defaults).
    num_queries: s >= 2, k-means clusters (queries) per round.
    k: nearest queries each private record votes for, 1 <= k <= s.
    epsilon: total ε of the run (ε / rounds per round); per record in local mode.
    mode: "central" (Laplace counts) or "local" (per-record bit flipping).
    rounds: T >= 1 labelling rounds.
    uncertain_fraction: rounds > 1: share of the public set relabelled each later round.
    kmeans_iterations, kmeans_restarts: Lloyd iterations and k-means++ restarts.
    num_public: public images taken from the test split (the rest evaluates); None: half
      of the test split (5,000 for MNIST, as the paper).
    split_seed: seed of the public/evaluation partition (public bookkeeping, not noise).
    student: `rknn_student.StudentConfig`.
    delta: δ at which the ledger also reports its PLD ε (the run itself is pure ε-DP).
    chunk_size: private records per vote-counting step (memory O(chunk_size · s)).
    seed: root seed of representation, k-means, noise and student; None: secret OS entropy.
    data_dir, download: as for `data.load`.
  """

  dataset: str
  representation: str = "pca"
  representation_config: Any = None
  num_queries: int = 40
  k: int = 1
  epsilon: float = 0.1
  mode: str = "central"
  rounds: int = 1
  uncertain_fraction: float = 0.2
  kmeans_iterations: int = 50
  kmeans_restarts: int = 3
  num_public: int | None = None
  split_seed: int = 0
  student: rknn_student.StudentConfig = rknn_student.StudentConfig()
  delta: float = 1e-5
  chunk_size: int = rknn_votes.DEFAULT_CHUNK_SIZE
  seed: int | None = None
  data_dir: str | None = None
  download: bool = False

  def __post_init__(self):
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    default_rep = representations.default_config(self.representation)  # unknown kind raises
    if self.representation_config is None:
      object.__setattr__(self, "representation_config", default_rep)
    elif not isinstance(self.representation_config, type(default_rep)):
      raise ValueError(f"representation {self.representation!r} needs a "
                       f"{type(default_rep).__name__}, got {self.representation_config!r}")
    if self.mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
    validation.check_int("num_queries", self.num_queries, minimum=2)
    validation.check_int("k", self.k, minimum=1)
    if self.k > self.num_queries:
      raise ValueError(f"k={self.k} exceeds num_queries={self.num_queries}")
    validation.check_float("epsilon", self.epsilon, positive=True)
    validation.check_int("rounds", self.rounds, minimum=1)
    if not 0.0 < self.uncertain_fraction <= 1.0:
      raise ValueError(f"uncertain_fraction must be in (0, 1], got {self.uncertain_fraction!r}")
    validation.check_int("kmeans_iterations", self.kmeans_iterations, minimum=1)
    validation.check_int("kmeans_restarts", self.kmeans_restarts, minimum=1)
    if self.num_public is not None:
      validation.check_int("num_public", self.num_public, minimum=self.num_queries)
      self.check_public_size(self.num_public)
    validation.check_int("split_seed", self.split_seed, minimum=0)
    if not isinstance(self.student, rknn_student.StudentConfig):
      raise ValueError(f"student must be a StudentConfig, got {self.student!r}")
    validation.check_delta(self.delta)
    validation.check_int("chunk_size", self.chunk_size, minimum=1)
    if self.seed is not None:
      validation.check_int("seed", self.seed, minimum=0)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def epsilon_per_round(self) -> float:
    return self.epsilon / self.rounds

  def num_relabelled(self, num_public: int) -> int:
    """Public samples queried again in each round after the first."""
    return math.ceil(self.uncertain_fraction * num_public)

  def check_public_size(self, num_public: int) -> None:
    """Raises ValueError if a public set of this size cannot hold the run's queries."""
    if num_public < self.num_queries:
      raise errors.UserError(f"{num_public} public images < num_queries={self.num_queries}")
    if self.rounds > 1 and self.num_relabelled(num_public) < self.num_queries:
      raise errors.UserError(f"uncertain_fraction={self.uncertain_fraction} of {num_public} "
                             f"public images gives {self.num_relabelled(num_public)} samples per "
                             f"later round, fewer than num_queries={self.num_queries}")


def round_event(config: RKNNConfig) -> dp_event.DpEvent:
  """The DpEvent of one labelling round (module docstring for the argument)."""
  if config.mode == "central":
    return accounting.laplace_counts_event(epsilon_per_round=config.epsilon_per_round,
                                           rounds=1)
  return accounting.srr_event(epsilon_per_query=config.epsilon_per_round, num_queries=1)


def public_evaluation_split(num_examples: int, num_public: int, *,
                            seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Sorted (public, evaluation) indices: `num_public` of a seeded permutation, then the rest.

  Args:
    num_examples: size of the test split.
    num_public: public images, 1 <= num_public < num_examples.
    seed: non-negative split seed (NumPy PCG64, as `data.splits`).

  Returns:
    (public, evaluation) sorted int64 index arrays, disjoint, covering the split.
  """
  if not 1 <= num_public < num_examples:
    raise errors.UserError(f"num_public={num_public} must be in [1, {num_examples}) for a "
                           f"test split of {num_examples} images (the rest evaluates the student)")
  permutation = np.random.default_rng(seed).permutation(num_examples)
  return np.sort(permutation[:num_public]), np.sort(permutation[num_public:])


def _cluster_purity(true_labels: np.ndarray, assignments: np.ndarray) -> float:
  """Share of samples in their cluster's majority true class (public diagnostic)."""
  total = sum(np.bincount(true_labels[assignments == c]).max()
              for c in np.unique(assignments))
  return float(total / len(true_labels))


def _noisy_counts(config: RKNNConfig, key: jax.Array, private_embeddings: np.ndarray,
                  private_labels: np.ndarray, queries: jax.Array) -> jax.Array:
  """The round's released (s, C) counts; the exact counts never leave this function."""
  common = dict(k=config.k, num_classes=config.info.num_classes, chunk_size=config.chunk_size)
  if config.mode == "central":
    exact = rknn_votes.reverse_knn_counts(private_embeddings, private_labels, queries, **common)
    return rknn_votes.central_noisy_counts(key, exact, k=config.k,
                                           epsilon=config.epsilon_per_round)
  return rknn_votes.local_noisy_counts(key, private_embeddings, private_labels, queries,
                                       epsilon=config.epsilon_per_round, **common)


@workdir_lib.run_scope
def train_rknn(config: RKNNConfig, workdir: str, *, progress: bool = True) -> dict[str, Any]:
  """Runs reverse k-NN labelling and trains the student (module docstring).

  Args:
    config: the validated configuration.
    workdir: output directory (created); one holding a checkpoint is refused.
    progress: show tqdm progress bars (SimCLR fit, student training).

  Returns:
    The results (also `<workdir>/results.json`).
  """
  clock = outputs.RunClock()
  config_json = dataclasses.asdict(config)
  run = workdir_lib.open_run(workdir, kind="reverse k-NN", config=config_json, resumable=False)
  start_time, start_cpu = time.time(), time.process_time()
  seed = seeds.resolve_seed(config.seed)
  root_key = seeds.root_key(seed)
  # Named streams, each used once or with fold_in(round): a key is never reused.
  rep_key, kmeans_key, noise_key, student_key = jax.random.split(root_key, 4)

  private = data.load(config.dataset, "train", data_dir=config.data_dir,
                      download=config.download)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  num_public = config.num_public or len(test) // 2
  config.check_public_size(num_public)
  public_indices, eval_indices = public_evaluation_split(len(test), num_public,
                                                         seed=config.split_seed)
  public, evaluation = test.subset(public_indices), test.subset(eval_indices)

  representation = representations.fit(config.representation, public.images, rep_key,
                                       config.representation_config, progress=progress)
  public_embeddings = representation.embed(public.images)  # (n_public, d)
  private_embeddings = representation.embed(private.images)  # (N, d)

  planned_event = dp_event.SelfComposedDpEvent(round_event(config), config.rounds)
  ledger = run.ledger(ledger_lib.PrivacyLedger(
      target_epsilon=accounting.epsilon(planned_event, delta=config.delta), delta=config.delta))
  writer = metrics_lib.MetricsWriter(workdir, resume_step=0)
  steps_per_round = num_public // min(config.student.batch_size, num_public) * (
      config.student.epochs)

  public_labels = np.zeros(num_public, np.int32)
  per_round, student, test_metrics = [], None, None
  for round_index in range(config.rounds):
    if round_index == 0:
      queried = np.arange(num_public)
    else:  # The least confident public samples of the current student (public data only).
      student_confidence = rknn_student.confidence(student, public.images, public.info)
      least_confident = np.argsort(student_confidence, kind="stable")
      queried = np.sort(least_confident[:config.num_relabelled(num_public)])
    clusters = rknn_votes.kmeans(jax.random.fold_in(kmeans_key, round_index),
                                 public_embeddings[queried], config.num_queries,
                                 num_iterations=config.kmeans_iterations,
                                 num_restarts=config.kmeans_restarts)
    event = round_event(config)
    # Before the release: raises BudgetExceededError if over budget.
    spent = run.charge(event, step=round_index + 1, note=f"rknn {config.mode} round")
    noisy_counts = _noisy_counts(config, jax.random.fold_in(noise_key, round_index),
                                 private_embeddings, private.labels, clusters.centres)
    assignments = np.asarray(clusters.assignments)
    public_labels[queried] = np.asarray(rknn_votes.propagate_labels(noisy_counts,
                                                                    assignments))
    label_accuracy = float(np.mean(public_labels == public.labels))
    student = rknn_student.train_student(
        jax.random.fold_in(student_key, round_index), public.images, public_labels,
        info=config.info, config=config.student, progress=progress, writer=writer,
        step_offset=round_index * steps_per_round,
        desc=f"rknn round {round_index + 1}/{config.rounds} student")
    test_metrics = evaluate_lib.evaluate(student, evaluation)
    per_round.append({
        "round": round_index + 1, "num_queried_public": int(len(queried)),
        "cluster_purity": _cluster_purity(public.labels[queried], assignments),
        "label_accuracy": label_accuracy, "student_accuracy": test_metrics["accuracy"],
        "student_loss": test_metrics["loss"], "ledger_epsilon": spent})
    writer.write(round_index + 1, {"label_accuracy": label_accuracy,
                                   "student_accuracy": test_metrics["accuracy"],
                                   "epsilon": spent}, prefix="round/")
    run.save(round_index + 1, jax.device_get(
        {"student": {"params": student.params, "batch_stats": student.batch_stats},
         "public_labels": public_labels, "rng": jax.random.key_data(root_key)}),
        {"config": config_json, "round": round_index + 1, "ledger": ledger.to_json()})
  writer.close()

  results = {
      "method": "rknn", "dataset": config.dataset, "mode": config.mode,
      "representation": representation.description, "representation_dim": representation.dim,
      "num_queries": config.num_queries, "k": config.k, "rounds": config.rounds,
      "label_accuracy": per_round[-1]["label_accuracy"],  # Acc_pl
      "student_accuracy": test_metrics["accuracy"],  # Acc_pc
      "student_loss": test_metrics["loss"],
      "epsilon": config.epsilon, "delta": 0.0, "epsilon_per_round": config.epsilon_per_round,
      "privacy_unit": ("one private record, replace-one (central ε-DP of the released counts)"
                       if config.mode == "central" else
                       "one private record's own reports (local ε-DP, per record)"),
      "ledger_epsilon": ledger.spent_epsilon(), "ledger_delta": config.delta,
      "accountant": ledger.accountant, "seed": seed.public_description(),
      "num_private": len(private), "num_public": len(public), "num_evaluation": len(evaluation),
      "per_round": per_round,
      "train_seconds": round(time.time() - start_time, 1),
      # CPU seconds of this process, all threads: the load-independent cost figure.
      "train_cpu_seconds": round(time.process_time() - start_cpu, 1),
      "config": config_json, "ledger": json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      outputs.PRIVATE_KEY: outputs.private_section(workdir=workdir),  # none: all is released
  }
  # The record's ε is the ledger's (dp_accounting, at δ); the paper's pure ε (δ = 0) beside.
  return outputs.finish_run(
      workdir, results, clock=clock, dataset=config.dataset,
      test_accuracy=test_metrics["accuracy"], sound_epsilon=results["ledger_epsilon"],
      delta=config.delta, paper_epsilon=config.epsilon,
      extra={"pure_epsilon": config.epsilon, "pure_delta": 0.0})
