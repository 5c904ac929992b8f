"""DPDFD end to end: teachers, state, the training loop and its outputs.

`train_dpdfd(config, workdir)` writes to `workdir`:
  checkpoints/<step>/  Orbax: student + generator states, step; meta: config, privacy ledger,
                       plan (`DPDFDPlan.to_json`), root seed
  privacy_ledger.json  every charge, written before its release (`train.ledger_file`)
  results.json         test accuracy, sound ε (dp_accounting), paper ε (if any), δ, σ, steps,
                       config; the teachers' accuracy under "private_diagnostics" (not covered)
  record.json          the results record (`train.records`)
  samples.png          grid of synthetic samples from the generator
  metrics.csv, tb/     curves (only teacher-free, post-mechanism quantities)
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_ensemble
from dpkd_jax import teacher_partition
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import config_migration
from dpkd_jax.methods.dpdfd import generator_prior
from dpkd_jax.methods.dpdfd import privacy
from dpkd_jax.methods.dpdfd import replay as replay_lib
from dpkd_jax.methods.dpdfd import restarts
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import averaging
from dpkd_jax.train import checkpoint
from dpkd_jax.train import distributed
from dpkd_jax.train import evaluate
from dpkd_jax.train import memory
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train import samples
from dpkd_jax.train import selection
from dpkd_jax.train import sharding

# Checkpoint meta and results key: released targets per class (their argmax), summed over steps.
RELEASED_ROWS_KEY = "released_rows_per_class"
# ... and the step the sum starts from (0 unless first resumed from an older checkpoint).
RELEASED_ROWS_FROM_KEY = "released_rows_counted_from_step"
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.train.progress import StepBar, readable


class TeacherSource(NamedTuple):
  """What the run knows of its teachers besides their weights.

  Attributes:
    overlap: m, the most teachers one record reaches, and why (`teacher_partition`).
    diagnostics: PRIVATE noiseless functions of the teachers (their test accuracies), for
      results.json's "private_diagnostics".
  """

  overlap: teacher_partition.Overlap
  diagnostics: dict[str, Any]


def load_teachers(config: config_lib.DPDFDConfig
                  ) -> tuple[step_lib.TeacherEnsemble, TeacherSource]:
  """Loads and checks every teacher against the dataset, and proves m from what they record.

  With `teacher_dirs`: one card per teacher; all must share one architecture, and none may
  appear twice (`teacher_partition.check_distinct`: a UserError). With
  `teacher_ensemble_dir`: one stacked ensemble (`_load_stacked`).
  """
  if config.teacher_ensemble_dir is not None:
    return _load_stacked(config)
  info = config.info
  loaded = [teacher_lib.load_teacher(d, dataset=config.dataset, num_classes=info.num_classes,
                                     input_shape=info.image_shape) for d in config.teacher_dirs]
  cards = [t.card for t in loaded]
  teacher_partition.check_distinct(config.teacher_dirs, cards)
  # An imported teacher behind an input adapter has more arrays than the same bare model; graph
  # teachers share one architecture only if they share one program.
  archs = {(t.card["model"], t.card["norm"], bool(t.card.get("input_adapter")),
            (t.card.get("graph") or {}).get("sha256", "")) for t in loaded}
  if len(archs) > 1:
    raise ValueError(f"all teachers must share one architecture, got {sorted(archs)}")
  return step_lib.TeacherEnsemble.stack([t.parts for t in loaded]), TeacherSource(
      teacher_partition.teachers_per_record(cards),
      {"teacher_test_accuracy": [c["test_accuracy"] for c in cards]})


def _load_stacked(config: config_lib.DPDFDConfig
                  ) -> tuple[step_lib.TeacherEnsemble, TeacherSource]:
  """The ensemble of `teacher_ensemble_dir` as a `TeacherEnsemble`, m from its saved
  partition record (1 for disjoint equal shards of one split, else n).

  Its teachers (norm "none") keep no BatchNorm statistics: `batch_stats` is the empty pytree,
  which `teacher_logits` vmaps over as it does the stacked params (the same forward as
  `teacher_ensemble.ensemble_logits` on normalised images).

  Raises:
    UserError: no ensemble in the directory, or one of another dataset, classes or shape.
  """
  ensemble, meta = teacher_ensemble.load(
      config.teacher_ensemble_dir, flag="--teacher_ensemble_dir", dataset=config.dataset,
      info=config.info)
  stacked = step_lib.TeacherEnsemble(ensemble.graphdef, ensemble.params, {})
  return stacked, TeacherSource(teacher_ensemble.overlap(meta, ensemble.size),
                                {"teacher_ensemble": meta.get("report", {})})


def restart_generator(config: config_lib.DPDFDConfig, state: step_lib.DPDFDState,
                      key: jax.Array) -> step_lib.DPDFDState:
  """`state` with a fresh generator from `key`: new weights and a new Adam state, whose
  cosine schedule starts again at the full rate (a random generator must learn from the
  start); the student is kept. The optimizer is the one `step.init_state` builds, so a resumed
  run restores a restarted generator into the same structure."""
  # split(key)[1]: the generator half of `create_student_and_generator(config, key)`, which
  # the restarted runs on record were initialised with.
  generator = models.create_data_free_generator(config, jax.random.split(key)[1])
  return step_lib.DPDFDState(state.student, step_lib.generator_state(config, generator),
                             state.replay)


def _evaluate(student: TrainState, test: data.ArrayDataset) -> dict[str, float]:
  """Test accuracy of the released student (the average, if the run keeps one) and, beside
  it when they differ, of the last iterate."""
  out = {"accuracy": evaluate.evaluate(averaging.released_parts(student), test)["accuracy"]}
  if averaging.averaged_params(student) is not student.params:
    out["accuracy_last_iterate"] = evaluate.evaluate(student.parts, test)["accuracy"]
  return out


class _Restarter:
  """The generator-restart rule of a run, applied at the end of each evaluation window."""

  def __init__(self, config: config_lib.DPDFDConfig, rule: restarts.RestartRule,
               state: restarts.RestartState, init_key: jax.Array,
               mesh: jax.sharding.Mesh) -> None:
    self.config, self.rule, self.state = config, rule, state
    self.init_key, self.mesh = init_key, mesh

  def observe(self, dpdfd_state: step_lib.DPDFDState, window_mean: float, *,
              step: int) -> step_lib.DPDFDState:
    self.state, restart = restarts.observe(self.rule, self.state, window_mean, step=step)
    if not restart:
      return dpdfd_state
    if distributed.is_coordinator():
      print(f"DPDFD step {step}: the mean released disagreement stayed above "
            f"{self.rule.ratio} x its best for {self.rule.patience} windows; restarting the "
            f"generator ({self.state.restarts} of {self.rule.max_restarts})", flush=True)
    key = restarts.restart_key(self.init_key, self.state.restarts)
    return sharding.replicate(restart_generator(self.config, dpdfd_state, key), self.mesh)


def _train(run: workdir_lib.Run, plan: privacy.DPDFDPlan, config: config_lib.DPDFDConfig,
           state: step_lib.DPDFDState, ensemble: step_lib.TeacherEnsemble,
           monitor: selection.Monitor,
           train_key: jax.Array, *, start: int, ledger: ledger_lib.PrivacyLedger | None,
           meta: dict[str, Any], progress: bool, restarter: "_Restarter | None" = None,
           ) -> tuple[step_lib.DPDFDState, int, float]:
  """Steps `start`..plan.releases in chunks up to each evaluation: charge -> release ->
  (restart the generator?) -> seal -> evaluate (test, or the private hold-out) -> save. Returns
  (state, steps done, last test accuracy (nan with a hold-out), released targets per class
  (K,) counted since `meta`'s start step, or None)."""
  train_step = step_lib.make_train_step(plan, config, ensemble.graphdef)
  writer = metrics_lib.MetricsWriter(run.workdir, resume_step=start)
  bar = StepBar(total=plan.releases, initial=start, disable=not progress,
                desc=f"DPDFD {config.dataset}")
  accuracy = math.nan
  step = start
  # Released targets per class (argmax) since step 0, carried across resumes by the checkpoint
  # meta: the generator's class coverage as the release shows it (post-processing).
  class_counts = jnp.asarray(meta.get(RELEASED_ROWS_KEY, [0] * config.info.num_classes),
                             jnp.int32)
  while step < plan.releases:
    chunk = min(config.eval_every - step % config.eval_every, plan.releases - step)
    if ledger is not None:  # account before releasing: a crash never under-counts
      run.charge(plan.event(chunk), step=step, note=f"steps {step}..{step + chunk - 1}")
    window = 0.0  # the sum of the chunk's released disagreement, on device
    for _ in range(chunk):
      state, step_metrics = train_step(state, ensemble.params, ensemble.batch_stats,
                                       jax.random.fold_in(train_key, step))
      window = window + step_metrics.get("lg_disagreement", 0.0)
      class_counts = class_counts + step_metrics.pop(step_lib.RELEASED_CLASS_COUNTS)
      step += 1
      bar.update(1)
    step_metrics = jax.device_get(step_metrics)
    meta = {**meta, RELEASED_ROWS_KEY: [int(v) for v in jax.device_get(class_counts)]}
    if "lg_disagreement" in step_metrics:  # released rows only: post-processing
      step_metrics["window_disagreement"] = float(window) / chunk
      if restarter is not None:
        state = restarter.observe(state, step_metrics["window_disagreement"], step=step)
        step_metrics["generator_restarts"] = restarter.state.restarts
        meta = {**meta, "generator_restarts": restarter.state.to_json()}
    host_arrays = run.seal(state.arrays())  # before any output of these releases
    student = state.student
    test_metrics = monitor.during(lambda split: _evaluate(student, split), step, writer)
    accuracy = math.nan if test_metrics is None else test_metrics["accuracy"]
    spent = math.inf if ledger is None else ledger.spent_epsilon()
    # A non-private run (σ = 0) has no finite ε to plot; results.json says inf.
    privacy_metrics = {"epsilon": spent} if math.isfinite(spent) else {}
    writer.write(step, {**step_metrics, **privacy_metrics}, prefix="train/")
    bar.set_postfix(loss=readable(step_metrics["student_loss"]), acc=f"{accuracy:.4f}",
                    eps=f"{spent:.3g}")
    run.save(step, host_arrays, {**meta, "step": step,
                                 "ledger": None if ledger is None else ledger.to_json()})
  bar.close()
  writer.close()
  monitor.close()
  if (start == step and step > 0) or monitor.validation is not None:  # the test split, once
    accuracy = _evaluate(state.student, monitor.test)["accuracy"]
  return state, step, accuracy, meta.get(RELEASED_ROWS_KEY)


def _results(config: config_lib.DPDFDConfig, plan: privacy.DPDFDPlan, *, accuracy: float,
             epsilon: float, steps: int, root_seed: seeds.ResolvedSeed, source: TeacherSource,
             student: TrainState, test: data.ArrayDataset, workdir: str,
             private: dict[str, Any]) -> dict[str, Any]:
  """results.json: released figures at top level (the released student's test accuracy, also
  per true class), the teachers' accuracy kept apart."""
  return {
      "method": "dpdfd",
      "test_accuracy": accuracy,
      "epsilon": epsilon,
      "epsilon_accountant": "dp_accounting PLD, teacher not private (sensitivity 2C*m*sqrt(B),"
                            f" m = {plan.teachers_per_record} teachers per record)",
      "paper_epsilon": plan.paper_epsilon,
      "paper_epsilon_warning": "DPDFD Theorem 3 (reconstruction): NOT a valid guarantee",
      "delta": plan.delta,
      "noise_multiplier": plan.noise_multiplier,
      "steps": steps,
      "accounting_used_for_budget": plan.accounting,
      "seed": root_seed.public_description(),
      "num_teachers": plan.num_teachers,
      "teachers_per_record": plan.teachers_per_record,
      "teacher_partition": source.overlap.reason,
      evaluate.PER_CLASS_KEY: evaluate.accuracy_per_class(averaging.released_parts(student),
                                                          test),
      "student_params": models.count_params(student.params),
      "config": config.to_json(),
      # The teachers' test accuracy is a noiseless function of their private training data
      # (a teacher kept in <workdir>/teacher is listed as a private file too).
      outputs.PRIVATE_KEY: outputs.private_section({**source.diagnostics, **private},
                                                   workdir=workdir, files=("teacher",)),
  }


def _released_rows_meta(run: workdir_lib.Run, start: int) -> dict[str, Any]:
  """The released-targets-per-class count to continue from (none: from zero) and the step it
  counts from: 0, or the step of a resumed checkpoint written before runs counted."""
  if RELEASED_ROWS_KEY not in run.saved:
    return {RELEASED_ROWS_FROM_KEY: start}
  return {RELEASED_ROWS_KEY: run.saved[RELEASED_ROWS_KEY],
          RELEASED_ROWS_FROM_KEY: int(run.saved.get(RELEASED_ROWS_FROM_KEY, 0))}


def _teachers_sha256(ensemble: step_lib.TeacherEnsemble) -> str:
  """The loaded teachers by content: SHA-256 of their stacked params and BatchNorm statistics
  (`checkpoint.checksum`), the same wherever their directories lie."""
  return checkpoint.checksum({"params": ensemble.params, "batch_stats": ensemble.batch_stats})


def _check_same_teachers(run: workdir_lib.Run, plan: privacy.DPDFDPlan,
                         teachers_sha256: str) -> None:
  """A resumed run must account the same n and m as its checkpoint and query the same
  teachers: the config names the teachers' directories, not what they hold, so a directory
  retrained since is refused by its weights (checkpoints written before the weights' hash
  was kept are checked by n and m only)."""
  saved = run.saved.get("plan") if run.resuming else None
  if not isinstance(saved, dict):
    return
  now = {"num_teachers": plan.num_teachers, "teachers_per_record": plan.teachers_per_record}
  was = {k: saved.get(k, v) for k, v in now.items()}
  if was != now:
    raise errors.UserError(f"{run.workdir!r} was run with teachers {was}, its teacher "
                           f"directories now give {now}; use a fresh workdir")
  was_sha = run.saved.get("teachers_sha256", teachers_sha256)
  if was_sha != teachers_sha256:
    raise errors.UserError(f"{run.workdir!r} was run with other teachers: the weights in its "
                           "teacher directories changed since its checkpoint (retrained?); "
                           "use a fresh workdir")


def _prior_fields(release_epsilon: float) -> dict[str, Any]:
  """Record fields of a run from a teacher-pretrained generator (its record ε is inf)."""
  return {"release_epsilon_given_generator": records.epsilon_json(release_epsilon),
          "epsilon_note": generator_prior.RECORD_EPSILON_NOTE}


@workdir_lib.run_scope
def train_dpdfd(config: config_lib.DPDFDConfig, workdir: str, *, resume: bool = False,
                progress: bool = True, mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Runs DPDFD; `resume` continues the checkpoint of the same config in `workdir` (without it
  a workdir holding one is refused: `train.workdir.open_run`). Returns results.json's dict.

  Raises:
    ValueError / CheckpointMismatchError: bad config or teachers, before any training.
    BudgetExceededError: the ledger restored from `workdir` has no budget left for a step.
  """
  # 1. Workdir: lock, resume or refuse (for the whole run); the device mesh.
  memory.check_batch("--batch_size", config.batch_size, config.info.image_shape)  # fits?
  clock = outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="DPDFD", config=config.to_json(), resume=resume,
                             migrate=config_migration.migrate)
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.batch_size, mesh)
  # 2. Data, teachers (m from their cards), the hold-out (a bad count fails before a charge).
  ensemble, source = load_teachers(config)
  if source.overlap.teachers_per_record > 1 and distributed.is_coordinator():
    print(f"DPDFD accounting: {source.overlap.reason}", flush=True)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  monitor = selection.teachers_split_monitor(config, workdir, test, resume_step=run.step)
  # 3. Plan: σ and the steps, the only place they are resolved.
  plan = privacy.make_plan(config, source.overlap.teachers_per_record, num_teachers=ensemble.size)
  teachers_sha256 = _teachers_sha256(ensemble)
  _check_same_teachers(run, plan, teachers_sha256)
  # 4. Root seed (secret unless chosen; a resumed run continues with its own), state, ledger.
  root_seed = run.root_seed(config.seed)
  init_key, train_key = jax.random.split(seeds.root_key(root_seed))
  state = step_lib.init_state(config, init_key)
  if config.pretrained_generator_dir is not None:  # labelled variant: record-level ε = inf
    state = step_lib.DPDFDState(state.student, generator_prior.load(
        config, state.generator, ensemble.member(0)), state.replay)
  ledger = run.ledger(plan.new_ledger())
  start = 0
  if run.resuming:
    arrays, saved = run.restore(state.arrays())
    state, start = state.with_arrays(arrays), int(saved["step"])
  # 5. Train: charge -> release -> seal -> save, one chunk per evaluation.
  state, ensemble = sharding.replicate(state, mesh), sharding.replicate(ensemble, mesh)
  meta = {"config": config.to_json(), "plan": plan.to_json(), "root_seed": list(root_seed),
          "teachers_sha256": teachers_sha256}
  restarter = None
  if config.engine.restart_rule is not None:  # resumes the rule where the checkpoint left it
    saved_rule = run.saved.get("generator_restarts") if run.resuming else None
    restarter = _Restarter(config, config.engine.restart_rule,
                           restarts.RestartState.from_json(saved_rule), init_key, mesh)
  meta.update(_released_rows_meta(run, start))
  state, step, accuracy, released_rows = _train(
      run, plan, config, state, ensemble, monitor, sharding.replicate(train_key, mesh),
      start=start, ledger=ledger, meta=meta, progress=progress, restarter=restarter)
  # 6. Sample grid and results record. The grid takes fold_in(init_key, 2): init_state took
  # split(init_key) = fold_in(init_key, 0 and 1); key(seed + 1) would be another run's root.
  grid_key = jax.random.fold_in(init_key, 2)
  samples.save_sample_grid(samples.generate(state.generator, grid_key, 64, config.latent_dim,
                                            class_codes=config.class_codes),
                           config.info, os.path.join(workdir, "samples.png"))
  release_epsilon = math.inf if ledger is None else ledger.spent_epsilon()
  prior = config.pretrained_generator_dir is not None
  epsilon = math.inf if prior else release_epsilon
  results = _results(config, plan, accuracy=accuracy, epsilon=epsilon, steps=step,
                     root_seed=root_seed, source=source, student=state.student, test=test,
                     workdir=workdir, private=monitor.private_values())
  if restarter is not None:
    results["generator_restarts"] = restarter.state.to_json()
  if released_rows is not None:  # the generator's class coverage as the release shows it
    results[RELEASED_ROWS_KEY] = released_rows
    results[RELEASED_ROWS_FROM_KEY] = meta[RELEASED_ROWS_FROM_KEY]
  if state.replay is not None:
    results.update(replay_lib.class_counts(state.replay))
  if prior:
    results["epsilon_note"] = generator_prior.RECORD_EPSILON_NOTE
    results["release_epsilon_given_generator"] = release_epsilon
  outputs.finish_run(workdir, results, run=run, clock=clock, dataset=config.dataset,
                     test_accuracy=accuracy, sound_epsilon=epsilon, delta=plan.delta,
                     accounting=plan.accounting, paper_epsilon=plan.paper_epsilon,
                     target_epsilon=config.target_epsilon, neighbouring=plan.relation,
                     extra=_prior_fields(release_epsilon) if prior else None)
  return results
