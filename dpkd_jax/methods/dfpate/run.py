"""`train_dfpate(config, workdir)`: a data-free PATE run, top to bottom (package docstring).

Writes to `workdir`: checkpoints/<round>/ (student, answered queries and their released
histograms, ledger, plan, seed), privacy_ledger.json, results.json, record.json, samples.png
(the last round's queries), metrics.csv, tb/.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher_ensemble
from dpkd_jax.methods.dfpate import config as config_lib
from dpkd_jax.methods.dfpate import config_migration
from dpkd_jax.methods.dfpate import privacy
from dpkd_jax.methods.dfpate import query_model as query_model_lib
from dpkd_jax.methods.dfpate import step as step_lib
from dpkd_jax.methods.dfpate import streams
from dpkd_jax.methods.dfpate import student
from dpkd_jax.methods.dfpate import teachers
from dpkd_jax.privacy import seeds
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import samples
from dpkd_jax.train import selection
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.progress import StepBar


@dataclasses.dataclass
class _Setup:
  """What the private data is turned into before the rounds (then the data is dropped)."""

  test: data.ArrayDataset
  validation: data.ArrayDataset | None = None  # private hold-out (`train.selection`)
  query_model: query_model_lib.QueryModel | None = None
  ensemble: teacher_ensemble.Ensemble | None = None
  teacher_seconds: float = 0.0
  teacher_report: dict[str, float] = dataclasses.field(default_factory=dict)
  base_report: dict[str, float] = dataclasses.field(default_factory=dict)
  final_test_accuracy: float = math.nan  # with a hold-out: read once after the rounds


def _prepare(config: config_lib.DFPATEConfig, plan: privacy.DFPATEPlan,
             keys: dict[str, jax.Array]) -> _Setup:
  """Loads the data, fits the query model (charged by the caller first) and the teachers."""
  train, validation = selection.hold_out(
      data.load(config.dataset, "train", data_dir=config.data_dir), config.validation_examples)
  setup = _Setup(test=data.load(config.dataset, "test", data_dir=config.data_dir),
                 validation=validation)
  if plan.query_model is not None:
    # Refitting on resume repeats the same release (same key, same data): no new cost.
    setup.query_model = query_model_lib.fit_query_model(
        jax.random.fold_in(keys["queries"], streams.QUERY_MODEL_FOLD),
        train.images if plan.use_teachers else np.zeros_like(train.images), plan.query_model)
  if not config.use_teachers:
    return setup
  setup.ensemble, setup.teacher_seconds, setup.teacher_report = teachers.get_teachers(
      config, train, setup.test, init_key=keys["teacher_init"],
      train_key=keys["teacher_train"])
  if config.teacher_self_training_pool:
    setup.base_report = setup.teacher_report
    setup.ensemble, seconds = teachers.self_train_teachers(
        config, setup.ensemble, train, setup.query_model,
        pool_key=jax.random.fold_in(keys["queries"], streams.TEACHER_POOL_FOLD),
        train_key=jax.random.fold_in(keys["teacher_train"], streams.SELF_TRAIN_FOLD))
    setup.teacher_seconds += seconds
    setup.teacher_report = teacher_ensemble.ensemble_accuracy(setup.ensemble, setup.test)
  return setup  # nothing after this reads the private data except through the ensemble


def _resume(run: workdir_lib.Run, state: step_lib.RoundState
            ) -> tuple[step_lib.RoundState, int, list[float]]:
  """(state, first round to run, accuracy history) of a fresh or resumed run."""
  if not run.resuming:
    return state, 0, []
  answered = run.saved["answered"]
  template = {"student": state.student.arrays(),
              "images": np.zeros((answered, *state.images.shape[1:]), np.uint8),
              "released": np.zeros((answered, state.released.shape[1]), np.float32)}
  arrays, meta = run.restore(template)
  state = step_lib.RoundState(state.student.with_arrays(arrays["student"]),
                              np.asarray(arrays["images"]), np.asarray(arrays["released"]))
  return state, int(meta["round"]), list(meta["accuracy"])


def _results(config: config_lib.DFPATEConfig, plan: privacy.DFPATEPlan,
             state: step_lib.RoundState, setup: _Setup, *, history: list[float],
             spent: float, root_seed: seeds.ResolvedSeed) -> dict[str, Any]:
  """results.json of the run (before `outputs.finish_run` adds times and warnings)."""
  _, weights = student.targets_from_votes(state.released, config.num_teachers,
                                          target=config.target,
                                          margin_threshold=config.margin_threshold)
  curve = {"accuracy_per_round": history}  # of the test split, or of the private hold-out
  return {
      "method": "dfpate",
      "test_accuracy": (history[-1] if history else math.nan) if setup.validation is None
                       else setup.final_test_accuracy,
      **(curve if setup.validation is None else {}),
      "epsilon": spent,  # inf when σ = 0 (no noise), 0 without teachers
      "delta": config.delta,
      "noise_std": plan.noise_std,
      "noise_multiplier": plan.noise_multiplier,
      "num_queries": len(state.images),
      "answered_queries": int((weights > 0).sum()),
      "teacher_train_seconds": setup.teacher_seconds,
      "seed": root_seed.public_description(),
      "student_params": models.count_params(state.student.params),
      "config": config.to_json(),
      outputs.PRIVATE_KEY: outputs.private_section(  # noiseless functions of the teachers
          {"teachers": setup.teacher_report,
           "teachers_before_self_training": setup.base_report,
           **({} if setup.validation is None else {"validation_accuracy_per_round": history,
                                                   "validation_examples": len(
                                                       setup.validation)})}),
  }


@workdir_lib.run_scope
def train_dfpate(config: config_lib.DFPATEConfig, workdir: str, *, resume: bool = False,
                 progress: bool = True) -> dict[str, Any]:
  """Runs data-free PATE (package docstring); returns and writes results.json.

  Args:
    config: the validated run.
    workdir: output directory.
    resume: continue the round checkpoint in `workdir` (same config); if False a workdir
      holding one is refused (its ledger is never overwritten).
    progress: tqdm bar over rounds.
  """
  # 1. Workdir: lock, resume or refuse, root seed, key streams
  clock = outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="DF-PATE", config=config.to_json(), resume=resume,
                             migrate=config_migration.migrate)
  root_seed = run.root_seed(config.seed)
  keys = streams.root_keys(root_seed)
  if config.validation_examples:  # a hold-out too large fails before anything is charged
    selection.hold_out(data.load(config.dataset, "train", data_dir=config.data_dir),
                       config.validation_examples)
  # 2. Plan and ledger (σ resolved before any release; the query model charged before its fit)
  plan = privacy.make_plan(config)
  ledger = run.ledger(plan.new_ledger())
  if ledger is not None and not run.resuming and plan.query_model is not None:
    run.charge(plan.query_model_event(), step=0, note="DP query model: second moment, "
               f"{plan.query_model.kmeans_iterations} k-means steps, variances")
  # 3. Data, query model and teachers
  setup = _prepare(config, plan, keys)
  # 4. State
  state, start, history = _resume(run, step_lib.init_state(config, keys["student_init"]))
  train_step = step_lib.make_train_step(plan, config, ensemble=setup.ensemble,
                                        query_model=setup.query_model, keys=keys)
  # 5. Train: charge -> release -> seal -> save, one round at a time
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  monitor = selection.Monitor(workdir, setup.test, setup.validation, resume_step=start)
  bar = StepBar(total=config.rounds, initial=start, disable=not progress,
                desc=f"DF-PATE {config.dataset} rounds")
  for round_index in range(start, config.rounds):
    if ledger is not None:  # account before releasing: a crash never under-counts
      run.charge(plan.event(1), step=round_index, note=f"round {round_index}: "
                 f"{plan.queries_per_round} noisy vote histograms, σ={plan.noise_std:.4g}")
    state, metrics = train_step(state, round_index)
    host_arrays = run.seal({"student": state.student.arrays(), "images": state.images,
                            "released": state.released})
    parts = state.student.parts
    history.append(monitor.accuracy(
        lambda split: {"accuracy": evaluate.evaluate(parts, split)["accuracy"]},
        round_index + 1, writer))
    spent = plan.sound_epsilon if ledger is None else ledger.spent_epsilon()
    writer.write(round_index + 1, {**metrics, "epsilon": spent}, prefix="train/")
    bar.update(1)
    bar.set_postfix(acc=f"{history[-1]:.4f}", eps=f"{spent:.4g}")
    run.save(round_index + 1, host_arrays,
             {"config": config.to_json(), "round": round_index + 1, "accuracy": history,
              "answered": int(len(state.images)), "plan": plan.to_json(),
              "ledger": None if ledger is None else ledger.to_json(),
              "root_seed": list(root_seed)})
  bar.close()
  writer.close()
  monitor.close()
  if setup.validation is not None:  # the rounds read the hold-out: the test split once, here
    setup.final_test_accuracy = evaluate.evaluate(state.student.parts, setup.test)["accuracy"]
  # 6. Results record
  samples.save_sample_grid(
      np.asarray(data.normalize(state.images[-config.queries_per_round:][:64], config.info)),
      config.info, os.path.join(workdir, "samples.png"))
  spent = plan.sound_epsilon if ledger is None else ledger.spent_epsilon()
  results = _results(config, plan, state, setup, history=history, spent=spent,
                     root_seed=root_seed)
  return outputs.finish_run(workdir, results, run=run, clock=clock, dataset=config.dataset,
                            test_accuracy=results["test_accuracy"], sound_epsilon=spent,
                            delta=config.delta, target_epsilon=config.target_epsilon)
