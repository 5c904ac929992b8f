"""`train_rknn`: reverse k-NN labelling rounds, then the student, end to end.

Workdir: checkpoints/ (Orbax per round: student, public labels, PRNG key data; config, plan,
ledger, root seed and the rounds' figures as metadata), privacy_ledger.json, results.json,
record.json, metrics.csv and tb/ (all released values: the student and labels see only public
data and the noisy counts).

`resume=True` continues from the newest intact checkpoint: the representation is fitted again
from the same key (public images only), the round after the checkpoint is replayed with the
same keys, and the ledger continues the most-spent one on disk. Metrics share one step axis,
the student's optimizer steps (a round or self-training round ends at `steps_per_round` times
its number), so a resumed log drops exactly the rows of the replayed rounds.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

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
from dpkd_jax.train import sharding
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


def _load(config: config_lib.RKNNConfig, key: jax.Array, progress: bool, workdir: str,
          completed: int) -> tuple[_Data, representations.Representation]:
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
  monitor = selection.Monitor(workdir, evaluation, validation,
                              resume_step=completed * student_lib.steps(config, len(public)))
  return _Data(private, public, evaluation, representation.embed(public.images),
               representation.embed(private.images), monitor), representation


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


class _Progress(NamedTuple):
  """What the rounds share: the checkpoints' metadata besides the arrays (root seed, config,
  the rounds' figures so far), the metrics' step unit and log, progress bars, the mesh."""
  root_seed: seeds.ResolvedSeed
  config_json: dict[str, Any]
  per_round: list[dict[str, Any]]
  steps_per_round: int
  writer: metrics_lib.MetricsWriter
  show: bool
  mesh: Mesh | None


def _student_mesh(mesh: Mesh | None, batch_size: int) -> Mesh | None:
  """The mesh the students' batches are split over: `mesh` (its size must divide the batch), by
  default all devices if the batch splits evenly over them, else None (one device, warned)."""
  if mesh is not None:
    sharding.check_divisible(batch_size, mesh)
    return mesh
  mesh = sharding.data_mesh()
  if batch_size % mesh.size == 0:
    return mesh
  warnings.warn(f"the student batch of {batch_size} does not split over the {mesh.size} "
                f"devices: the students train on one device (a batch size divisible by "
                f"{mesh.size} uses them all)", stacklevel=3)
  return None


def _stop(stop_after_rounds: int | None, completed: int, total: int) -> int:
  """The number of rounds done when this invocation ends (`train_rknn`'s stop_after_rounds)."""
  if not (stop_after_rounds is None or type(stop_after_rounds) is int and stop_after_rounds > 0):
    raise ValueError(f"stop_after_rounds must be a positive integer or None, got "
                     f"{stop_after_rounds!r}")
  return total if stop_after_rounds is None else min(total, completed + stop_after_rounds)


def _save(run: workdir_lib.Run, plan: privacy.RKNNPlan, ledger: Any, ctx: _Progress,
          root_key: jax.Array, student: core.ModelParts, public_labels: np.ndarray, *,
          labelled: int, self_trained: int) -> None:
  """Seals and checkpoints the state after `labelled` rounds and `self_trained` self-training
  rounds (step: their sum)."""
  arrays = run.seal({"student": {"params": student.params, "batch_stats": student.batch_stats},
                     "public_labels": public_labels, "rng": jax.random.key_data(root_key)})
  run.save(labelled + self_trained, arrays, {
      "config": ctx.config_json, "round": labelled, "self_training_round": self_trained,
      "plan": plan.to_json(), "ledger": ledger.to_json(), "root_seed": list(ctx.root_seed),
      "per_round": ctx.per_round})


def _restore(run: workdir_lib.Run, config: config_lib.RKNNConfig, root_key: jax.Array,
             num_public: int, monitor: selection.Monitor
             ) -> tuple[core.ModelParts, np.ndarray, list[dict[str, Any]]]:
  """(student, public labels, the rounds' figures) of the checkpoint resumed."""
  template = step_lib.init_state(config, jax.random.key(0), total_steps=1).parts  # shapes only
  arrays, meta = run.restore({
      "student": {"params": template.params, "batch_stats": template.batch_stats},
      "public_labels": np.zeros(num_public, np.int32), "rng": jax.random.key_data(root_key)})
  if "per_round" not in meta:
    raise errors.UserError(f"checkpoint step {run.step} of {run.workdir!r} holds no per-round "
                           "figures, so it cannot be resumed: start again in a fresh workdir")
  student = core.ModelParts(template.graphdef, arrays["student"]["params"],
                            arrays["student"]["batch_stats"])
  if monitor.validation is not None:  # the hold-out's figures (private: kept out of checkpoints)
    monitor.last = dict(evaluate_lib.evaluate(student, monitor.validation))
  return student, np.asarray(arrays["public_labels"], np.int32), list(meta["per_round"])


def _labelling_round(run: workdir_lib.Run, config: config_lib.RKNNConfig,
                     plan: privacy.RKNNPlan, train_step: step_lib.RoundStep, keys: Any,
                     splits: Any, student: core.ModelParts | None, public_labels: np.ndarray,
                     round_index: int, ctx: _Progress) -> tuple[core.ModelParts, np.ndarray]:
  """One labelling round (`_label_round`'s release), then a fresh student on its labels;
  evaluated and appended to `per_round`. Returns (the student, the public labels)."""
  public_labels, record, spent = _label_round(run, plan, config, train_step, splits,
                                              public_labels, student, round_index)
  student = student_lib.train_student(
      config, jax.random.fold_in(keys.student, round_index), splits.public.images,
      public_labels, progress=ctx.show, writer=ctx.writer, mesh=ctx.mesh,
      step_offset=round_index * ctx.steps_per_round,
      desc=f"rknn round {round_index + 1}/{config.rounds} student")
  end_step = (round_index + 1) * ctx.steps_per_round
  student_metrics = _student_metrics(splits.monitor, student, end_step)
  ctx.per_round.append({**record, **student_metrics, "ledger_epsilon": spent})
  ctx.writer.write(end_step, {
      "label_accuracy": record["label_accuracy"],
      **{k: v for k, v in student_metrics.items() if k == "student_accuracy"},
      "epsilon": spent}, prefix="round/")
  return student, public_labels


def _self_training_round(config: config_lib.RKNNConfig, plan: privacy.RKNNPlan, keys: Any,
                         splits: Any, student: core.ModelParts, extra_round: int,
                         ledger: Any, ctx: _Progress) -> core.ModelParts:
  """One self-training round: `student`'s predictions relabel the public images, a fresh
  student learns them; evaluated and appended to `per_round`. Returns it."""
  labels = np.argmax(evaluate_lib.predict_logits(student, splits.public.images, config.info),
                     axis=-1).astype(np.int32)
  done = plan.releases + extra_round + 1  # rounds of either kind once this one ends
  student = student_lib.train_student(
      config, jax.random.fold_in(keys.student, _SELF_TRAINING_TAG + extra_round),
      splits.public.images, labels, progress=ctx.show, writer=ctx.writer, mesh=ctx.mesh,
      step_offset=(done - 1) * ctx.steps_per_round,
      desc=f"rknn self-training {extra_round + 1}/{config.student.self_training_rounds}")
  student_metrics = _student_metrics(splits.monitor, student, done * ctx.steps_per_round)
  ctx.per_round.append({"self_training_round": extra_round + 1,
                        "label_accuracy": float(np.mean(labels == splits.public.labels)),
                        **student_metrics, "ledger_epsilon": ledger.spent_epsilon()})
  ctx.writer.write(done * ctx.steps_per_round, {
      k: v for k, v in student_metrics.items() if k == "student_accuracy"},
      prefix="self_training/")
  return student


@workdir_lib.run_scope
def train_rknn(config: config_lib.RKNNConfig, workdir: str, *, resume: bool = False,
               stop_after_rounds: int | None = None, progress: bool = True,
               mesh: Mesh | None = None) -> dict[str, Any] | None:
  """Runs reverse k-NN labelling and trains the student (package docstring).

  Args:
    config: the validated configuration.
    workdir: output directory (created); one holding a checkpoint is refused unless `resume`.
    resume: continue the checkpoint in `workdir` (same config required; module docstring).
    stop_after_rounds: end this invocation, checkpointed, after this many more rounds
      (labelling and self-training rounds alike); None runs to the end.
    progress: show tqdm progress bars (SimCLR fit, student training).
    mesh: a mesh with a 'data' axis over which the students' batches are split, whose size
      must divide the student batch (default: all devices if it divides, else one device).

  Returns:
    The results (also `<workdir>/results.json`), or None if stopped before the end (nothing
    evaluated on the evaluation split, no results written: `resume` continues).
  """
  _stop(stop_after_rounds, 0, 0)  # a bad value is refused before anything is written
  # 1. Workdir: lock, resume or refuse, root seed
  clock = outputs.RunClock()
  config_json = selection.config_json(config)
  run = workdir_lib.open_run(workdir, kind="reverse k-NN", config=config_json, resume=resume)
  started = time.time(), time.process_time()
  seed = run.root_seed(config.seed)
  root_key = seeds.root_key(seed)
  keys = _Keys(*jax.random.split(root_key, 4))
  completed = (int(run.saved["round"]) + int(run.saved.get("self_training_round", 0))
               if run.resuming else 0)  # rounds of either kind in the checkpoint resumed
  # 2. Data and representation (fitted on the public images only; again alike on resume)
  splits, representation = _load(config, keys.representation, progress, workdir, completed)
  # 3. Plan and ledger
  plan = privacy.make_plan(config)
  ledger = run.ledger(plan.new_ledger())
  # 4. State: the public labels and the rounds' figures; a fresh student each round
  num_public = len(splits.public)
  mesh = _student_mesh(mesh, min(config.student.batch_size, num_public))
  steps_per_round = student_lib.steps(config, num_public)
  public_labels, per_round, student = np.zeros(num_public, np.int32), [], None
  if run.resuming:
    student, public_labels, per_round = _restore(run, config, root_key, num_public,
                                                 splits.monitor)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=completed * steps_per_round)
  ctx = _Progress(seed, config_json, per_round, steps_per_round, writer, progress, mesh)
  total = plan.releases + config.student.self_training_rounds
  stop = _stop(stop_after_rounds, completed, total)
  train_step = step_lib.make_train_step(
      plan, config, public_embeddings=splits.public_embeddings,
      private_embeddings=splits.private_embeddings, private_labels=splits.private.labels,
      kmeans_key=keys.kmeans, noise_key=keys.noise)
  # 5. Train: charge -> release -> student -> seal -> save, one release per round
  for round_index in range(completed, min(plan.releases, stop)):
    student, public_labels = _labelling_round(run, config, plan, train_step, keys, splits,
                                              student, public_labels, round_index, ctx)
    _save(run, plan, ledger, ctx, root_key, student, public_labels,
          labelled=round_index + 1, self_trained=0)
  # 6. Self-training: the student relabels the public set, a fresh student learns it (no
  #    release, no charge: public images and the released labels only)
  for extra_round in range(max(completed, plan.releases) - plan.releases,
                           stop - plan.releases):
    student = _self_training_round(config, plan, keys, splits, student, extra_round, ledger,
                                   ctx)
    _save(run, plan, ledger, ctx, root_key, student, public_labels,
          labelled=plan.releases, self_trained=extra_round + 1)
  writer.close()
  splits.monitor.close()
  if stop < total:
    return None
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
