"""`train_rknn`: reverse k-NN labelling rounds, then the student, end to end.

Workdir: checkpoints/ (Orbax per round: student, public labels, PRNG key data; config, plan and
ledger as metadata), privacy_ledger.json, results.json, record.json, metrics.csv and tb/ (all
released values: the student and labels see only public data and the noisy counts). A run
cannot be resumed: a workdir holding one is refused.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

import jax
import numpy as np

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import representations
from dpkd_jax.methods.rknn import config as config_lib
from dpkd_jax.methods.rknn import privacy
from dpkd_jax.methods.rknn import step as step_lib
from dpkd_jax.methods.rknn import student as student_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import seeds
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import selection
from dpkd_jax.train import workdir as workdir_lib


class _Keys(NamedTuple):
  """Named streams of the root key, each used once or with fold_in(round): never reused."""
  representation: jax.Array
  kmeans: jax.Array
  noise: jax.Array
  student: jax.Array


class _Data(NamedTuple):
  """The three splits and the embeddings (from a representation fitted on public images)."""
  private: data.ArrayDataset
  public: data.ArrayDataset
  evaluation: data.ArrayDataset
  public_embeddings: np.ndarray  # (n_public, d)
  private_embeddings: np.ndarray  # (N, d)
  monitor: selection.Monitor  # the evaluation split, or a private hold-out during training


# fold_in tags of the self-training students' keys under the student stream: above every
# labelling round's index (round r's student uses fold_in(student key, r)).
_SELF_TRAINING_TAG = 1_000_000

def private_rows(config: config_lib.RKNNConfig, num_train: int) -> np.ndarray:
  """(R,) rows of the N = `num_train` training records in the private set that labels the
  public queries (all but the validation hold-out, `_load`): where a one-run audit's canaries
  go (`dpkd_jax.audit`)."""
  return selection.hold_out_indices(num_train, config.validation_examples)[0]


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


def _load(config: config_lib.RKNNConfig, key: jax.Array, progress: bool, workdir: str
          ) -> tuple[_Data, representations.Representation]:
  """Private = train split (less a validation hold-out, `train.selection`); public / evaluation
  = the seeded halves of the test split; the representation is fitted on the public images."""
  private, validation = selection.hold_out(data.load(
      config.dataset, "train", data_dir=config.data_dir, download=config.download),
      config.validation_examples)
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  num_public = config.num_public or len(test) // 2
  config.check_public_size(num_public)
  public_indices, eval_indices = public_evaluation_split(len(test), num_public,
                                                         seed=config.split_seed)
  public, evaluation = test.subset(public_indices), test.subset(eval_indices)
  representation = representations.fit(config.representation, public.images, key,
                                       config.representation_config, progress=progress)
  return _Data(private, public, evaluation, representation.embed(public.images),
               representation.embed(private.images),
               selection.Monitor(workdir, evaluation, validation)), representation


def _queried(config: config_lib.RKNNConfig, round_index: int, student: core.ModelParts | None,
             public: data.ArrayDataset) -> np.ndarray:
  """The public samples a round labels: all of them first, then the least confident ones of
  the current student (public data only)."""
  if round_index == 0:
    return np.arange(len(public))
  student_confidence = student_lib.confidence(student, public.images, public.info)
  least_confident = np.argsort(student_confidence, kind="stable")
  return np.sort(least_confident[:config.num_relabelled(len(public))])


def _label_round(run: workdir_lib.Run, plan: privacy.RKNNPlan, config: config_lib.RKNNConfig,
                 train_step: step_lib.RoundStep, splits: _Data, public_labels: np.ndarray,
                 student: core.ModelParts | None, round_index: int
                 ) -> tuple[np.ndarray, dict[str, Any], float]:
  """Queries, charge, the round's release (`train_step`), labels.

  Returns:
    (the public labels after the round; the round's record so far: round, queried samples,
    cluster purity, label accuracy; the ledger's ε after the charge).
  """
  queried = _queried(config, round_index, student, splits.public)
  # Before the release: raises BudgetExceededError if over budget.
  spent = run.charge(plan.event(1), step=round_index + 1, note=f"rknn {plan.mode} round")
  public_labels, assignments = train_step(public_labels, queried, round_index)
  return public_labels, {
      "round": round_index + 1, "num_queried_public": int(len(queried)),
      "cluster_purity": _cluster_purity(splits.public.labels[queried], assignments),
      "label_accuracy": float(np.mean(public_labels == splits.public.labels))}, spent


def _results(config: config_lib.RKNNConfig, plan: privacy.RKNNPlan, ledger: Any,
             representation: representations.Representation, splits: _Data,
             per_round: list[dict[str, Any]], seed: seeds.ResolvedSeed,
             started: tuple[float, float], workdir: str,
             final: dict[str, float]) -> dict[str, Any]:
  """results.json: the last round's accuracies, the privacy figures and the run's facts."""
  # The released student: the last labelling or self-training round, its figures from the
  # evaluation split read once at the end with a hold-out (`final`).
  last = {**per_round[-1], **final}
  labelled = [r for r in per_round if "self_training_round" not in r][-1]
  return {
      "method": "rknn", "dataset": config.dataset, "mode": config.mode,
      "representation": representation.description, "representation_dim": representation.dim,
      "num_queries": config.num_queries, "k": config.k, "rounds": config.rounds,
      "label_accuracy": labelled["label_accuracy"],  # Acc_pl, of the DP labels
      "self_training_rounds": config.student.self_training_rounds,
      "student_accuracy": last["student_accuracy"],  # Acc_pc
      "student_loss": last["student_loss"],
      "epsilon": plan.paper_epsilon, "delta": 0.0, "epsilon_per_round": plan.epsilon_per_round,
      "privacy_unit": plan.privacy_unit,
      "ledger_epsilon": ledger.spent_epsilon(), "ledger_delta": plan.delta,
      "accountant": ledger.accountant, "seed": seed.public_description(),
      "num_private": len(splits.private), "num_public": len(splits.public),
      "num_evaluation": len(splits.evaluation), "per_round": per_round,
      "train_seconds": round(time.time() - started[0], 1),
      # CPU seconds of this process, all threads: the load-independent cost figure.
      "train_cpu_seconds": round(time.process_time() - started[1], 1),
      "config": selection.config_json(config), "ledger": json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      outputs.PRIVATE_KEY: outputs.private_section(splits.monitor.private_values(),
                                                   workdir=workdir),
  }


def _student_metrics(monitor: selection.Monitor, student: core.ModelParts,
                     step: int) -> dict[str, float]:
  """{student_accuracy, student_loss} on the evaluation split, or {} with a hold-out (its
  figures go to the private diagnostics)."""
  metrics = monitor.during(lambda split: evaluate_lib.evaluate(student, split), step, None)
  return {} if metrics is None else {"student_accuracy": metrics["accuracy"],
                                     "student_loss": metrics["loss"]}


def _self_training_round(run: workdir_lib.Run, config: config_lib.RKNNConfig,
                         plan: privacy.RKNNPlan, keys: Any, splits: Any,
                         student: core.ModelParts, extra_round: int, *,
                         writer: metrics_lib.MetricsWriter, progress: bool,
                         per_round: list[dict[str, Any]], arrays_meta: tuple[Any, ...],
                         step_offset: int) -> core.ModelParts:
  """One self-training round: `student`'s predictions relabel the public images, a fresh
  student learns them; evaluated, appended to `per_round`, checkpointed. Returns it."""
  public_labels, root_key, config_json, ledger = arrays_meta
  labels = np.argmax(evaluate_lib.predict_logits(student, splits.public.images, config.info),
                     axis=-1).astype(np.int32)
  student = student_lib.train_student(
      config, jax.random.fold_in(keys.student, _SELF_TRAINING_TAG + extra_round),
      splits.public.images, labels, progress=progress, writer=writer, step_offset=step_offset,
      desc=f"rknn self-training {extra_round + 1}/{config.student.self_training_rounds}")
  student_metrics = _student_metrics(splits.monitor, student, plan.releases + extra_round + 1)
  per_round.append({"self_training_round": extra_round + 1,
                    "label_accuracy": float(np.mean(labels == splits.public.labels)),
                    **student_metrics, "ledger_epsilon": ledger.spent_epsilon()})
  writer.write(plan.releases + extra_round + 1, {
      k: v for k, v in student_metrics.items() if k == "student_accuracy"},
      prefix="self_training/")
  arrays = run.seal({"student": {"params": student.params, "batch_stats": student.batch_stats},
                     "public_labels": public_labels, "rng": jax.random.key_data(root_key)})
  run.save(plan.releases + extra_round + 1, arrays, {
      "config": config_json, "round": plan.releases, "self_training_round": extra_round + 1,
      "plan": plan.to_json(), "ledger": ledger.to_json()})
  return student


@workdir_lib.run_scope
def train_rknn(config: config_lib.RKNNConfig, workdir: str, *, resume: bool = False,
               progress: bool = True) -> dict[str, Any]:
  """Runs reverse k-NN labelling and trains the student (package docstring).

  Args:
    config: the validated configuration.
    workdir: output directory (created); one holding a checkpoint is refused.
    resume: must be False: a reverse k-NN run cannot be resumed (`train.workdir.open_run`
      refuses True in one line).
    progress: show tqdm progress bars (SimCLR fit, student training).

  Returns:
    The results (also `<workdir>/results.json`).
  """
  # 1. Workdir: lock, refuse an existing run (not resumable), root seed
  clock = outputs.RunClock()
  config_json = selection.config_json(config)
  run = workdir_lib.open_run(workdir, kind="reverse k-NN", config=config_json, resume=resume,
                             resumable=False)
  started = time.time(), time.process_time()
  seed = run.root_seed(config.seed)
  root_key = seeds.root_key(seed)
  keys = _Keys(*jax.random.split(root_key, 4))
  # 2. Data and representation (fitted on the public images only)
  splits, representation = _load(config, keys.representation, progress, workdir)
  # 3. Plan and ledger
  plan = privacy.make_plan(config)
  ledger = run.ledger(plan.new_ledger())
  # 4. State: the public labels; a fresh student each round
  writer = metrics_lib.MetricsWriter(workdir, resume_step=0)
  num_public = len(splits.public)
  steps_per_round = num_public // min(config.student.batch_size, num_public) * (
      config.student.epochs)
  public_labels = np.zeros(num_public, np.int32)
  per_round, student = [], None
  train_step = step_lib.make_train_step(
      plan, config, public_embeddings=splits.public_embeddings,
      private_embeddings=splits.private_embeddings, private_labels=splits.private.labels,
      kmeans_key=keys.kmeans, noise_key=keys.noise)
  # 5. Train: charge -> release -> student -> seal -> save, one release per round
  for round_index in range(plan.releases):
    public_labels, record, spent = _label_round(run, plan, config, train_step, splits,
                                                public_labels, student, round_index)
    student = student_lib.train_student(
        config, jax.random.fold_in(keys.student, round_index), splits.public.images,
        public_labels, progress=progress, writer=writer,
        step_offset=round_index * steps_per_round,
        desc=f"rknn round {round_index + 1}/{config.rounds} student")
    arrays = run.seal({"student": {"params": student.params, "batch_stats": student.batch_stats},
                       "public_labels": public_labels, "rng": jax.random.key_data(root_key)})
    student_metrics = _student_metrics(splits.monitor, student, round_index + 1)
    per_round.append({**record, **student_metrics, "ledger_epsilon": spent})
    writer.write(round_index + 1, {"label_accuracy": record["label_accuracy"],
                                   **{k: v for k, v in student_metrics.items()
                                      if k == "student_accuracy"},
                                   "epsilon": spent}, prefix="round/")
    run.save(round_index + 1, arrays, {"config": config_json, "round": round_index + 1,
                                       "plan": plan.to_json(), "ledger": ledger.to_json()})
  # 6. Self-training: the student relabels the public set, a fresh student learns it (no
  #    release, no charge: public images and the released labels only)
  for extra_round in range(config.student.self_training_rounds):
    student = _self_training_round(run, config, plan, keys, splits, student, extra_round,
                                   writer=writer, progress=progress, per_round=per_round,
                                   arrays_meta=(public_labels, root_key, config_json, ledger),
                                   step_offset=(plan.releases + extra_round) * steps_per_round)
  writer.close()
  splits.monitor.close()
  final = {} if splits.monitor.validation is None else {  # the evaluation split, once
      f"student_{k}": v for k, v in evaluate_lib.evaluate(student, splits.evaluation).items()}
  # 7. Results record: the ledger's ε (dp_accounting, at δ), the paper's pure ε (δ = 0) beside
  results = _results(config, plan, ledger, representation, splits, per_round, seed, started,
                     workdir, final)
  return outputs.finish_run(
      workdir, results, run=run, clock=clock, dataset=config.dataset,
      test_accuracy=results["student_accuracy"], sound_epsilon=results["ledger_epsilon"],
      delta=plan.delta, paper_epsilon=plan.paper_epsilon, neighbouring=plan.relation,
      extra={"pure_epsilon": plan.paper_epsilon, "pure_delta": 0.0})
