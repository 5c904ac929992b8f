"""`train_srr(config, workdir)`: a DP-DFD + selective RR run end to end, resumable per stage;
`pretrain(config, workdir)`: only its generator pretraining, for later runs to reuse.

`train_srr` writes to `workdir`:
  generator_pretrain/  the pretrained generator (reusable: `pretrained_generator_dir`)
  checkpoints/<stage>/ Orbax: student + generator states (+ every release so far with
                       `student_replay`); meta: config, ledger, plan, seed
  privacy_ledger.json  one entry per stage: the stage's RR queries, charged before they run
  results.json         accuracy (per stage), both privacy figures (`privacy.report`), config;
                       record.json
  samples.png          synthetic samples of the final generator
  metrics.csv, tb/     per-stage curves (released quantities only; pretraining: private)

The test split is used only to report accuracy, as for every method here. Noise keys derive
from a secret OS-entropy seed unless `seed` is given (`privacy.seeds`); results then say so.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods.srr import config as config_lib
from dpkd_jax.methods.srr import config_migration
from dpkd_jax.methods.srr import pretraining
from dpkd_jax.methods.srr import privacy
from dpkd_jax.methods.srr import stage as stage_lib
from dpkd_jax.methods.srr import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import samples
from dpkd_jax.train import selection
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.progress import StepBar

# Sample-grid key fold_in(init_key, 2): init_models' split(init_key) holds tags 0 and 1.
_GRID_TAG = 2


class _Keys(NamedTuple):
  """The run's three streams: split(root key, 3)."""

  init: jax.Array  # network initialisation (tags 0, 1) and the sample grid (_GRID_TAG)
  pretrain: jax.Array  # generator pretraining
  stages: jax.Array  # fold_in(stages, stage): the stage's latents, RR, orders


def _keys(root_seed: seeds.ResolvedSeed) -> _Keys:
  return _Keys(*jax.random.split(seeds.root_key(root_seed), 3))


def _load_teacher(config: config_lib.SRRConfig) -> teacher_lib.Teacher:
  info = config.info
  return teacher_lib.load_teacher(config.teacher_dir, dataset=config.dataset,
                                  num_classes=info.num_classes, input_shape=info.image_shape)


def _save_grid(config: config_lib.SRRConfig, generator: core.ModelParts, key: jax.Array,
               mesh: jax.sharding.Mesh, path: str) -> None:
  """64 samples in whole batches (the compiled generator is reused); `key` is its own stream."""
  z = jax.random.normal(key, (-(-64 // config.batch_size) * config.batch_size, config.latent_dim))
  images = stage_lib.generate_images(generator, z, config.batch_size, mesh)
  samples.save_sample_grid(np.asarray(images[:64]), config.info, path)


@workdir_lib.run_scope
def pretrain(config: config_lib.SRRConfig, workdir: str, *, progress: bool = True,
             mesh: jax.sharding.Mesh | None = None) -> core.ModelParts:
  """Only the teacher-prior generator pretraining of `config`, into `workdir` (locked,
  resumable), plus `workdir/samples.png` and `workdir/record.json` (its cost); runs reuse it
  with `pretrained_generator_dir=workdir`.

  The generator is a noiseless function of the teacher: every run that uses it reports
  record-level ε = inf (`privacy`). Returns the pretrained generator.
  """
  if config.generator_prior != "teacher":
    raise ValueError("only generator_prior='teacher' pretrains a generator")
  clock = outputs.RunClock()
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.pretrain_batch_size, mesh)
  teacher = _load_teacher(config)
  run = workdir_lib.open_run(workdir, kind="SRR generator pretraining",
                             config=pretraining.config_json(config.pretrain_config()))
  keys = _keys(seeds.resolve_seed(config.seed))
  _, generator = step_lib.init_models(config, keys.init)
  generator = pretraining.pretrain_generator(
      config.pretrain_config(), generator, teacher.parts, workdir, keys.pretrain,
      identity=config.generator_identity(teacher.parts), progress=progress, mesh=mesh, run=run)
  _save_grid(config, generator, jax.random.fold_in(keys.init, _GRID_TAG), mesh,
             os.path.join(workdir, "samples.png"))
  pretraining.write_record(workdir, dataset=config.dataset, run=run, clock=clock)
  return generator


@workdir_lib.run_scope
def train_srr(config: config_lib.SRRConfig, workdir: str, *, resume: bool = False,
              progress: bool = True, mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Runs DP-DFD with selective RR (package docstring).

  Args:
    config: the validated run.
    workdir: output directory.
    resume: continue the stage checkpoint in `workdir` (same config required; none: start
      afresh); if False, a workdir holding one is refused (its ledger is never overwritten).
    progress: tqdm bars.
    mesh: devices (default all); batches are split over them.

  Returns:
    The results dict (also `<workdir>/results.json`).

  Raises:
    UserError / CheckpointMismatchError: bad config, plan, teacher or workdir, before any query.
    BudgetExceededError: the restored ledger has no budget for another stage.
  """
  clock = outputs.RunClock()
  # 1. Workdir: lock, resume or refuse; devices.
  run = workdir_lib.open_run(workdir, kind="SRR", config=config.to_json(), resume=resume,
                             migrate=config_migration.migrate)
  mesh = sharding.data_mesh() if mesh is None else mesh
  for size in (config.batch_size, config.pretrain_batch_size):
    sharding.check_divisible(size, mesh)
  # 2. Data and teacher.
  teacher = _load_teacher(config)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  # The hold-out is read here: a bad count fails before anything is charged.
  monitor = selection.teachers_split_monitor(config, workdir, test, resume_step=run.step)
  # 3. Plan and ledger: ε per query and stages resolved once; the ledger keeps the labels' ε.
  plan = privacy.make_plan(config)
  ledger = run.ledger(plan.new_ledger())
  # 4. State: root seed, networks, generator prior, or the checkpoint being resumed.
  root_seed = run.root_seed(config.seed)
  keys = _keys(root_seed)
  state, start, history = _initial_state(config, plan, run, teacher.parts, workdir, keys,
                                         progress=progress, mesh=mesh)
  # 5. Train: per stage, charge -> release -> seal -> evaluate -> save.
  state = sharding.replicate(state, mesh)
  train_step = step_lib.make_train_step(
      plan, config, stage_lib.make_teacher_label_fn(
          sharding.replicate(teacher.parts, mesh), config.batch_size, mesh), mesh=mesh)
  meta = {"config": config.to_json(), "plan": plan.to_json(), "root_seed": list(root_seed)}
  state = _train_stages(config, plan, run, ledger, state, train_step, keys.stages, monitor,
                        start=start, history=history, meta=meta, progress=progress)
  # 6. Results record.
  _save_grid(config, state.generator.parts, jax.random.fold_in(keys.init, _GRID_TAG), mesh,
             os.path.join(workdir, "samples.png"))
  results = _results(config, plan, ledger, history, root_seed, teacher.card, state, workdir)
  if monitor.validation is not None:  # the curve read the private hold-out: test once here
    results[outputs.PRIVATE_KEY].update(monitor.private_values(),
                                        validation_accuracy_per_stage=results.pop(
                                            "accuracy_per_stage"))
    results["test_accuracy"] = evaluate.evaluate(state.student.parts, test)["accuracy"]
  results[evaluate.PER_CLASS_KEY] = evaluate.accuracy_per_class(state.student.parts, test)
  return outputs.finish_run(
      workdir, results, run=run, clock=clock, dataset=config.dataset,
      test_accuracy=results["test_accuracy"], sound_epsilon=results["record_level_epsilon"],
      delta=config.delta, paper_epsilon=results["paper_label_epsilon_per_query"],
      target_epsilon=config.target_epsilon, extra={"paper_epsilon_scope": "label-DP per query"})


def _initial_state(config: config_lib.SRRConfig, plan: privacy.SRRPlan,
                   run: workdir_lib.Run, teacher, workdir: str, keys: _Keys, *,
                   progress: bool, mesh: jax.sharding.Mesh,
                   ) -> tuple[stage_lib.SRRState, int, list[float]]:
  """(state, first stage to run, accuracy per finished stage): fresh, or the resumed ones."""
  state = step_lib.init_state(config, keys.init, stages=plan.stages)
  if not run.resuming:  # a resumed run restores its (fine-tuned) generator below
    return step_lib.with_generator(config, state, pretraining.starting_generator(
        config, state.generator.parts, teacher, workdir, keys.pretrain, progress, mesh)), 0, []
  arrays, saved = run.restore(state.arrays())
  return state.with_arrays(arrays), int(saved["stage"]), list(saved["accuracy"])


def _train_stages(config: config_lib.SRRConfig, plan: privacy.SRRPlan, run: workdir_lib.Run,
                  ledger: ledger_lib.PrivacyLedger | None, state: stage_lib.SRRState,
                  train_step: step_lib.StageStep, stage_key: jax.Array,
                  monitor: selection.Monitor, *, start: int,
                  history: list[float], meta: dict[str, Any],
                  progress: bool) -> stage_lib.SRRState:
  """Stages `start`..plan.stages-1; appends each stage's accuracy to `history` (of the test
  split, or of the private validation hold-out: `selection.Monitor`)."""
  writer = metrics_lib.MetricsWriter(run.workdir, resume_step=start)
  bar = StepBar(total=plan.stages, initial=start, disable=not progress,
                desc=f"SRR {config.dataset} stages")
  for stage in range(start, plan.stages):
    if plan.private:  # account before releasing: a crash never under-counts
      run.charge(plan.event(plan.samples_per_stage), step=stage,
                 note=f"stage {stage}: {plan.samples_per_stage} SRR labels")
    result = train_step(state, jax.random.fold_in(stage_key, stage), stage)
    state = result.state
    host_arrays = run.seal(state.arrays())  # before any output of this stage's release
    parts = state.student.parts
    history.append(monitor.accuracy(
        lambda split: {"accuracy": evaluate.evaluate(parts, split)["accuracy"]}, stage + 1,
        writer))
    spent = math.inf if ledger is None else ledger.spent_epsilon()
    writer.write(stage + 1, {**result.metrics, **({"labels_epsilon": spent} if plan.private
                                                  else {})}, prefix="train/")
    bar.update(1)
    bar.set_postfix(acc=f"{history[-1]:.4f}", eps=f"{spent:.4g}")
    run.save(stage + 1, host_arrays,
             {**meta, "stage": stage + 1, "accuracy": history,
              "ledger": None if ledger is None else ledger.to_json()})
  bar.close()
  writer.close()
  monitor.close()
  return state


def _results(config, plan, ledger, history, root_seed, card, state, workdir) -> dict:
  labels = math.inf if ledger is None else ledger.spent_epsilon()
  return {
      "method": "srr",
      "test_accuracy": history[-1] if history else math.nan,
      "accuracy_per_stage": history,
      **privacy.report(plan, labels_epsilon=labels),
      "threshold": config.tau,
      "stages": len(history),
      "num_queries": len(history) * config.samples_per_stage,
      "seed": root_seed.public_description(),
      "student_params": models.count_params(state.student.params),
      "config": config.to_json(),
      outputs.PRIVATE_KEY: outputs.private_section(  # + the generator's teacher losses
          {"teacher_test_accuracy": card["test_accuracy"]}, workdir=workdir,
          files=(os.path.join("generator_pretrain", outputs.PRIVATE_CSV),)),
  }


def load_run(workdir: str) -> tuple[config_lib.SRRConfig, stage_lib.SRRState, dict[str, Any]]:
  """Restores (config, state, metadata) of an SRR workdir (latest stage checkpoint)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  config = config_lib.SRRConfig.from_json(meta["config"])
  template = step_lib.init_state(config, jax.random.key(0),  # shapes only
                                 stages=meta["plan"]["stages"])
  arrays, meta = checkpoint.restore(ckpt_dir, template.arrays())
  return config, template.with_arrays(arrays), meta
