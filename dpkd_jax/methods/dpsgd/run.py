"""`train_dpsgd`: the DP-SGD run, from flags to results, reading top to bottom.

Each expected epoch (ceil(N/B) steps) is charged to the ledger (`plan.event(steps)`) before
it runs, then the state is sealed, evaluated on the public test split and checkpointed. The
noise derives from the run's root seed: without `seed` it is drawn from OS entropy and kept
only in the checkpoint (`privacy.seeds`), which is then as secret as the data; an explicit
`seed` makes the noise reproducible by anyone who knows it (research runs only). Only the
parameters are released (and their accuracy and loss on the public test split): with
`param_averaging_decay` > 0 the average of the iterates kept in the optimizer state
(`train.averaging.param_averaging`, post-processing), which is what is evaluated and
exported; the training metrics (loss, accuracy, batch size, fraction clipped, gradient
norm) are noiseless functions of private batches, written to `private_diagnostics.csv` only
with `log_private_diagnostics=True`.

A tuning run's accuracy on its validation hold-out (`validation_examples`: private training
records, evaluated without noise) is a private diagnostic too: results.json and record.json
keep it under "private_diagnostics", its curve is in `private_diagnostics.csv`.

Workdir: checkpoints/ (Orbax state + PRNG key data; config, plan, ledger JSON as metadata),
privacy_ledger.json, results.json, record.json, metrics.csv and tb/ (released values only).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh

import dpkd_jax
from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import feature_moments
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.representations import scatternet
from dpkd_jax import config_checks
from dpkd_jax.train import averaging
from dpkd_jax.train import evaluate as evaluate_lib
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.methods.dpsgd import augmult
from dpkd_jax.methods.dpsgd import step as step_lib
from dpkd_jax.methods.dpsgd import config as config_lib
from dpkd_jax.methods.dpsgd.config import DPSGDConfig
from dpkd_jax.methods.dpsgd.privacy import DPSGDPlan
from dpkd_jax.methods.dpsgd.privacy import make_plan
from dpkd_jax.train.progress import StepBar, readable

_LOG_EVERY_STEPS = 50
# The validation hold-out is data bookkeeping, fixed so that tuning runs share one split.
_VALIDATION_SEED = 0
# fold_in tag of the feature-moments release's key under the root key. Far above the 3 of
# `jax.random.split(root_key, 3)`, whose i-th child may equal fold_in(root_key, i).
MOMENTS_KEY_TAG = 0x6D6F6D


@workdir_lib.run_scope
def train_dpsgd(config: DPSGDConfig, workdir: str, *, resume: bool = False,
                stop_at_step: int | None = None, progress: bool = True,
                mesh: Mesh | None = None) -> dict[str, Any]:
  """Trains with DP-SGD, keeps the privacy ledger, evaluates on the test split.

  A run cut mid-epoch resumes from the last intact checkpoint and replays the same keys: the
  replayed releases equal the lost ones and reuse their charges (`train.ledger_file`). The
  workdir is locked for the whole run.

  Args:
    config: the validated configuration.
    workdir: output directory (created).
    resume: continue the checkpoint in `workdir` (same config required; none: start afresh).
      Without it a workdir holding a checkpoint is refused.
    stop_at_step: end this invocation (checkpointed) at this step, as if preempted.
    progress: show a tqdm progress bar (step, loss, ε).
    mesh: mesh with a 'data' axis (default: all devices).

  Returns:
    The results (also `<workdir>/results.json`). Raises `BudgetExceededError` before a
    release over budget (`workdir.Run.charge` writes privacy_ledger.json first).
  """
  clock = outputs.RunClock()
  if stop_at_step is not None:
    config_checks.integer("stop_at_step", stop_at_step, minimum=1)
  # 1. Workdir: lock, resume or refuse.
  config_json = config.to_json()
  run = workdir_lib.open_run(workdir, kind="DP-SGD", config=config_json, resume=resume)
  mesh = sharding.data_mesh() if mesh is None else mesh
  # 2. Data: the private training split (Poisson-sampled), the public test split and the
  #    optional validation hold-out, as pixels or as ScatterNet features (with augmult, the
  #    training records' V views, their shifts drawn from the root seed: resolved first).
  root_seed = run.root_seed(config.seed)  # a resumed run also restores its key data below
  train, test = (data.load(config.dataset, split, data_dir=config.data_dir,
                           download=config.download) for split in ("train", "test"))
  train, validation = hold_out(train, config.validation_examples)
  test, validation = (None if part is None else featurized(part, config.features)
                      for part in (test, validation))
  train = (augmult.augmented_features(train, views=config.augmult,
                                      max_shift=config.augmult_max_shift, seed=root_seed.value)
           if config.augmented else featurized(train, config.features))
  # 3. Plan and ledger: q, T, M and z resolved once (the step and the ledger both read it).
  plan = make_plan(config, num_examples=len(train), num_devices=mesh.shape[sharding.DATA_AXIS])
  ledger = run.ledger(plan.new_ledger())  # None without noise; a resumed run's own ledger
  # 4. State: root key, model and optimizer, or the resumed checkpoint's.
  state, root_key = _initial_state(run, config, seeds.root_key(root_seed), plan.steps)
  # 4b. Features standardized by their DP moments: one release, charged once before it is made
  #     (a resumed run recomputes the same release from the same key and data).
  train, test, validation = standardize(run, config, plan, root_key, (train, test, validation),
                                        first_release=int(state.step) == 0)
  # 5. Train: charge -> release -> seal -> evaluate -> save, one expected epoch at a time.
  loop = _Loop(run=run, config=config, plan=plan, mesh=mesh, train=train, test=test,
               validation=validation, root_key=root_key, root_seed=root_seed, ledger=ledger)
  stop = plan.steps if stop_at_step is None else min(stop_at_step, plan.steps)
  start_time = time.time()
  state, test_metrics = loop.train_until(sharding.replicate(state, mesh), stop=stop,
                                         progress=progress)
  # 6. Results record: the replace-one ε of the steps run, the add/remove ε beside it.
  results = _results(loop, state, test_metrics, workdir=workdir,
                     seconds=time.time() - start_time)
  outputs.finish_run(workdir, results, run=run, clock=clock, dataset=config.dataset,
                     test_accuracy=results["test_accuracy"], sound_epsilon=results["epsilon"],
                     delta=plan.delta, target_epsilon=config.target_epsilon,
                     neighbouring=plan.relation, extra=_record_extra(results))
  return results


def _record_extra(results: dict[str, Any]) -> dict[str, Any]:
  """What a DP-SGD record keeps beside the common fields: the settings its tables show (the
  averaging decay and augmult only when on: `to_json` omits them at their defaults), the
  add/remove ε, and the validation accuracy of a tuning run (NOT covered by ε: `make_record`
  keeps it in the record's private block, which the tuning table reads)."""
  config = results["config"]
  extra = {key: results[key] for key in ("model", "features", "noise_multiplier",
                                         "epsilon_add_remove", "steps", "expected_batch_size",
                                         "l2_clip_norm", "validation_examples") if key in results}
  private = results.get(outputs.PRIVATE_KEY, {})
  if "validation_accuracy" in private:
    extra["validation_accuracy"] = private["validation_accuracy"]
  extra.update({key: config[key] for key in ("learning_rate", "norm", "epochs",
                                            "lr_schedule", "standardize_noise_multiplier",
                                            "param_averaging_decay",
                                            "param_averaging_start_step", "augmult")
                if key in config})
  if "augmult" in config:  # its shift too, even at the default `to_json` leaves out
    extra["augmult_max_shift"] = config.get("augmult_max_shift", config_lib.AUGMULT_MAX_SHIFT)
  return extra


def hold_out(train: data.ArrayDataset, count: int
             ) -> tuple[data.ArrayDataset, data.ArrayDataset | None]:
  """(training records, validation records): `count` records held out by a fixed split (seed
  `_VALIDATION_SEED`, sorted indices); (train, None) for count = 0."""
  if count == 0:
    return train, None
  if count >= len(train):
    raise errors.UserError(f"validation_examples={count} leaves no training records out of "
                           f"{len(train)}")
  held = np.zeros(len(train), bool)
  held[np.random.default_rng(_VALIDATION_SEED).permutation(len(train))[:count]] = True
  return train.subset(np.flatnonzero(~held)), train.subset(np.flatnonzero(held))


def featurized(dataset: data.ArrayDataset, features: str
                 ) -> data.ArrayDataset | data.FeatureDataset:
  """The dataset as the model reads it: its pixels, or their ScatterNet features (computed
  once here rather than at every step: the transform is fixed)."""
  if features == "pixels":
    return dataset
  return data.FeatureDataset(
      images=scatternet.features(dataset.images, dataset.info, scatternet.ScatterNetConfig()),
      labels=dataset.labels, info=dataset.info)


def standardize(run: workdir_lib.Run, config: DPSGDConfig, plan: DPSGDPlan, root_key: jax.Array,
                parts: tuple[Any, ...], *, first_release: bool) -> tuple[Any, ...]:
  """(train, test, validation) features standardized per channel by the moments of the
  training features, released by `privacy.feature_moments` (unchanged without a setup event).

  `first_release`: charge the release to the ledger (a run resumed past step 0 charged it).
  """
  setup_event = plan.setup_event()
  if setup_event is None:
    return parts
  if first_release:
    run.charge(setup_event, step=0, note="dpsgd feature moments")
  train = parts[0]
  # With augmult, the moments of the records themselves (view 0, (N, h, w, F)): the release
  # of a run without views; standardizing every view by them is post-processing.
  records = train.images[:, 0] if config.augmented else train.images
  moments = feature_moments.dp_feature_moments(
      jax.random.fold_in(root_key, MOMENTS_KEY_TAG), records,
      mean_clip_norm=config.standardize_mean_clip,
      second_moment_clip_norm=config.standardize_second_moment_clip,
      noise_multiplier=plan.standardize_noise_multiplier)
  return tuple(None if part is None else data.FeatureDataset(
      images=moments.standardize(part.images), labels=part.labels, info=part.info)
      for part in parts)


def _initial_state(run: workdir_lib.Run, config: DPSGDConfig, root_key: jax.Array,
                   total_steps: int) -> tuple[TrainState, jax.Array]:
  """(state, root key): fresh from `root_key`, or the resumed checkpoint's (its key data
  included, so a secret seed's noise continues)."""
  state = step_lib.init_state(config, jax.random.split(root_key, 3)[0], total_steps=total_steps)
  if run.resuming:
    arrays, _ = run.restore({"state": state.arrays(), "rng": jax.random.key_data(root_key)})
    state = state.with_arrays(arrays["state"])
    root_key = jax.random.wrap_key_data(arrays["rng"])
  return state, root_key


@dataclasses.dataclass
class _Loop:
  """What the training loop reads: the run, its plan and ledger, the data and the root key."""

  run: workdir_lib.Run
  config: DPSGDConfig
  plan: DPSGDPlan
  mesh: Mesh
  train: data.ArrayDataset | data.FeatureDataset
  test: data.ArrayDataset | data.FeatureDataset
  validation: data.ArrayDataset | data.FeatureDataset | None
  root_key: jax.Array
  root_seed: seeds.ResolvedSeed
  ledger: ledger_lib.PrivacyLedger | None
  step: int = 0
  sample_key: jax.Array = dataclasses.field(init=False)
  noise_key: jax.Array = dataclasses.field(init=False)

  def __post_init__(self):
    # Named streams, each used with fold_in(step): a key is never reused.
    _, self.sample_key, self.noise_key = jax.random.split(self.root_key, 3)

  def spent(self) -> float:
    """The ledger's replace-one ε so far (inf for a run without noise: no ledger)."""
    return math.inf if self.ledger is None else self.ledger.spent_epsilon()

  def train_until(self, state: TrainState, *, stop: int,
                  progress: bool) -> tuple[TrainState, dict[str, float]]:
    """Steps up to `stop`, an expected epoch (or less) per charge; returns the state and its
    test metrics."""
    config, plan, workdir = self.config, self.plan, self.run.workdir
    train_step = step_lib.make_train_step(plan, config.info, self.mesh,
                                          clipping=config.clipping, augmult=config.augmented)
    writer = metrics_lib.MetricsWriter(workdir, resume_step=self.run.step)
    # The step's metrics come from private batches: written apart, and only if asked for.
    private_writer = (outputs.PrivateDiagnosticsWriter(workdir, resume_step=self.run.step)
                      if config.log_private_diagnostics else None)
    self.step = int(state.step)
    bar = StepBar(total=plan.steps, initial=self.step, disable=not progress,
                  desc=f"dpsgd {config.model}/{config.dataset}")
    test_metrics, postfix = None, {"eps": f"{self.spent():.3f}"}
    while self.step < stop:
      chunk = min(plan.steps_per_epoch - self.step % plan.steps_per_epoch, stop - self.step)
      # Before the releases: raises BudgetExceededError if over budget (inf without a ledger).
      self.run.charge(plan.event(chunk), step=self.step + chunk, note="dpsgd")
      for _ in range(chunk):
        state, step_metrics = self._release(train_step, state)
        bar.update(1)
        if private_writer is not None and (self.step % _LOG_EVERY_STEPS == 0 or self.step == stop):
          step_metrics = jax.device_get(step_metrics)
          private_writer.write(self.step, step_metrics, prefix="train/")
          postfix["loss"] = readable(step_metrics["loss"])
          bar.set_postfix(postfix)
      test_metrics = self._seal_evaluate_save(state, writer)
      postfix.update(eps=f"{self.spent():.3f}", test_acc=f"{test_metrics['accuracy']:.4f}")
      bar.set_postfix(postfix)
    for closing in (bar, writer, private_writer):
      if closing is not None:
        closing.close()
    if test_metrics is None:  # nothing ran in this invocation
      test_metrics = self.evaluate(state)
    return state, test_metrics

  def evaluate(self, state: TrainState) -> dict[str, float]:
    """Accuracy and loss of the released parameters (`train.averaging.released_parts`) on the test
    split, and on the validation hold-out if there is one (`validation_accuracy`, `_loss`)."""
    parts = averaging.released_parts(state)  # the average with param averaging
    metrics = evaluate_lib.evaluate(parts, self.test)
    if self.validation is not None:
      metrics.update({f"validation_{k}": v
                      for k, v in evaluate_lib.evaluate(parts, self.validation).items()})
    return metrics

  def _release(self, train_step: Callable, state: TrainState) -> tuple[TrainState, Any]:
    """One DP-SGD step (one release, charged already): Poisson batch, noisy clipped sum."""
    indices, mask = data.poisson_batch(
        jax.random.fold_in(self.sample_key, self.step), len(self.train), self.plan.sampling_rate,
        max_batch_size=self.plan.max_batch_size)
    batch = sharding.shard_batch(
        (self.train.images[indices], self.train.labels[indices], mask), self.mesh)
    step_noise_key = sharding.replicate(jax.random.fold_in(self.noise_key, self.step), self.mesh)
    state, step_metrics = train_step(state, *batch, step_noise_key)
    self.step += 1
    return state, step_metrics

  def _seal_evaluate_save(self, state: TrainState,
                          writer: metrics_lib.MetricsWriter) -> dict[str, float]:
    """After a chunk's releases: seal the state to its charges, evaluate it on the public test
    split, write the released metrics, checkpoint. Returns the test metrics."""
    host_arrays = self.run.seal({"state": state.arrays(),
                                 "rng": jax.random.key_data(self.root_key)})
    test_metrics = self.evaluate(state)
    released = {"accuracy": test_metrics["accuracy"], "loss": test_metrics["loss"]}
    # A non-private run has no finite ε to plot: results.json says inf.
    writer.write(self.step, {**released, **({"epsilon": self.spent()} if self.ledger else {})},
                 prefix="test/")
    if self.validation is not None:  # tuning runs only: a noiseless statistic of private
      # records, which the writer sends to private_diagnostics.csv (`released_fields`)
      writer.write(self.step, {"accuracy": test_metrics["validation_accuracy"]},
                   prefix="validation/")
    self.run.save(self.step, host_arrays, {
        "config": self.config.to_json(), "plan": self.plan.to_json(),
        "root_seed": list(self.root_seed),
        "ledger": None if self.ledger is None else self.ledger.to_json()})
    return test_metrics


def _results(loop: _Loop, state: TrainState, test_metrics: dict[str, float], *, workdir: str,
             seconds: float) -> dict[str, Any]:
  """The run's results.json: ε (replace-one, the tables' relation) of the steps run, the
  add/remove ε beside it, the plan's figures and the released test metrics."""
  config, plan, ledger, step = loop.config, loop.plan, loop.ledger, loop.step
  epsilon = loop.spent()
  return {
      "method": "dpsgd", "dataset": config.dataset, "model": config.model, "norm": config.norm,
      "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
      **({} if loop.validation is None else {"validation_examples": len(loop.validation)}),
      "features": config.features,
      "epsilon": epsilon, "neighbouring_relation": plan.relation,
      "epsilon_add_remove": epsilon if ledger is None else accounting.epsilon(
          plan.run_event(step, relation=accounting.ADD_REMOVE), delta=plan.delta),
      "delta": plan.delta, "accountant": "none" if ledger is None else ledger.accountant,
      "num_examples": plan.num_examples, "sampling_rate": plan.sampling_rate,
      "steps": step, "steps_per_epoch": plan.steps_per_epoch,
      "max_batch_size": plan.max_batch_size, "noise_multiplier": plan.noise_multiplier,
      "planned_epsilon": plan.sound_epsilon,
      "target_epsilon": plan.sound_epsilon if plan.budget_epsilon is None else plan.budget_epsilon,
      "planned_steps": plan.steps, "finished": step == plan.steps,
      "expected_batch_size": plan.expected_batch_size, "l2_clip_norm": config.l2_clip_norm,
      "param_count": models.count_params(state.params),
      "seed": loop.root_seed.public_description(),  # secret iff config.seed is None
      "train_seconds_this_run": round(seconds, 1),
      "config": config.to_json(),
      "ledger": None if ledger is None else json.loads(ledger.to_json()),
      "dpkd_jax_version": dpkd_jax.__version__,
      # The validation accuracy of a tuning run: a noiseless statistic of private records.
      outputs.PRIVATE_KEY: outputs.private_section(
          None if loop.validation is None else {
              "validation_accuracy": test_metrics["validation_accuracy"]}, workdir=workdir),
  }
