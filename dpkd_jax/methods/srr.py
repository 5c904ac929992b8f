"""DP-DFD with selective randomized response (Liu et al., "Privacy-Preserving Student Learning
with Differentially Private Data-Free Distillation", arXiv:2409.12384), end to end.

1. Generator prior. `generator_prior="teacher"` (the paper): the generator is pretrained
   data-free against the frozen teacher (`srr_generator`: CE + alpha IE + beta BN-statistics).
   `"none"`: no pretraining; the generator starts from public random weights.
2. Stages t = 1..S (`srr_stage.run_stage`): N synthetic queries, the student's prior, the
   teacher's argmax asked once per query, selective RR with threshold tau (default 1/K) and ε
   per query, E student epochs of KL on the noisy labels, generator fine-tuning on the same
   labels through the student.

`train_srr(config, workdir)` writes to `workdir`:
  generator_pretrain/  the pretrained generator (reusable: `pretrained_generator_dir`)
  checkpoints/<stage>/ Orbax: student + generator states; meta: config, ledger, plan, seed
  results.json         accuracy (per stage), the privacy figures below, config; record.json
  samples.png          synthetic samples of the final generator
  metrics.csv, tb/     per-stage curves (released quantities only; pretraining: private)

Privacy argument. Unit: one record of the teacher's private training set (replace one). The
teacher is not private: a neighbouring dataset may change it arbitrarily, hence every label.

* Per query (the paper's figure, "label-DP per query"): given the query x_i and the public
  prior p_i, selective RR is ε-DP w.r.t. that query's teacher label
  (`randomized_response.selective_randomized_response`). It protects one label, not a record.
* Labels, record level: if every query x_i and prior p_i depend on the private data only
  through earlier releases, the run is an adaptive composition of n = S*N ε-DP mechanisms,
  each a function of the data through the teacher: ε = PLD of n binary RR with ε
  (`accounting.srr_event`; binary RR dominates every ε-DP mechanism). `target_epsilon` acts on
  this figure. The student, generator fine-tuning and priors are post-processing.
* `generator_prior="teacher"` breaks that premise: the generator minimises a loss of
  teacher(G(z)) and the teacher's BatchNorm running statistics with no noise, so the queries
  (and the student trained on them, the sample grid and the generator) are a noiseless
  function of the teacher, hence of the private data. Nothing bounds how much a record moves
  them, so the run has no finite record-level guarantee: results report record-level ε = inf,
  and the RR composition only as "labels only, conditional on the generator".
* `generator_prior="none"` keeps the premise: the generator starts from public randomness and
  is updated only by CE(student(G(z)), noisy labels), the student only on (queries, noisy
  labels), the prior is the student's output; by induction every state is a function of
  public randomness and released labels, and the teacher is reached only inside
  `srr_stage.private_labels`. Record-level ε = the RR composition.

The test split is used only to report accuracy, as for every method here. Noise keys derive
from a secret OS-entropy seed unless `seed` is given (`privacy.seeds`); results then say so.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np
import tqdm
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods import srr_generator
from dpkd_jax.methods import srr_privacy
from dpkd_jax.methods import srr_stage
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import samples
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState

# Sample-grid key fold_in(init_key, 2): init_models' split(init_key) holds tags 0 and 1.
_GRID_TAG = 2

FIRST_PRIORS = ("uniform", "student")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SRRConfig:
  """A DP-DFD + selective RR run. Privacy fields first, then models, pretraining, stages.

  Attributes:
    epsilon: ε per query (label DP); None to calibrate from `target_epsilon`; inf: no noise.
    target_epsilon: bound on the record-level ε of all label queries composed (PLD).
    delta: δ of the record-level figures.
    threshold: tau of the candidate set; None = 1/K.
    first_prior: prior of the first stage: "uniform" (default; the untrained student's output
      is an arbitrary function of its random weights, and with tau <= 1/K the uniform prior
      makes every class a candidate) or "student".
    generator_prior: "teacher" (paper; record-level ε = inf) or "none" (sound).
    dataset, teacher_dir: the private dataset and the teacher trained on it.
    student_model, student_norm, generator_model, generator_channels, latent_dim: networks.
    pretrain_steps, pretrain_batch_size, pretrain_lr: generator pretraining ("teacher").
    generator_terms, entropy_weight, bn_weight: pretraining terms (ablation) and alpha, beta.
    pretrained_generator_dir: reuse a generator pretrained for the same dataset, teacher,
      architecture and pretraining fields (`<other run>/generator_pretrain`, or a
      `pretrain(...)` workdir), instead of pretraining again.
    stages, samples_per_stage, batch_size: S, N and B.
    student_epochs, generator_epochs: passes over each stage's labels (0: no fine-tuning).
    student_lr, generator_lr: Adam (student cosine-decayed over all its steps).
    seed: root seed; None (default) draws a secret one (`privacy.seeds`).
    data_dir: directory of `<dataset>.npz`.
  """

  epsilon: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  threshold: float | None = None
  first_prior: str = "uniform"
  generator_prior: str = "teacher"
  dataset: str
  teacher_dir: str
  student_model: str = "lenet5"
  student_norm: str = "batch"
  generator_model: str = "dafl"
  generator_channels: int = 128
  latent_dim: int = 100
  pretrain_steps: int = 1000
  pretrain_batch_size: int = 128
  pretrain_lr: float = 1e-3
  generator_terms: tuple[str, ...] = srr_generator.GENERATOR_TERMS
  entropy_weight: float = 5.0
  bn_weight: float = 10.0
  pretrained_generator_dir: str | None = None
  stages: int = 10
  samples_per_stage: int = 2560
  batch_size: int = 128
  student_epochs: int = 10
  generator_epochs: int = 1
  student_lr: float = 1e-3
  generator_lr: float = 1e-4
  seed: int | None = None
  data_dir: str | None = None

  def __post_init__(self):
    object.__setattr__(self, "generator_terms", tuple(self.generator_terms))
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    if self.student_model not in models.CLASSIFIERS:
      raise ValueError(f"unknown student_model {self.student_model!r}; known: {sorted(models.CLASSIFIERS)}")
    if self.generator_model not in models.GENERATORS:
      raise ValueError(f"unknown generator_model {self.generator_model!r}; known: {sorted(models.GENERATORS)}")
    if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
      raise ValueError(f"threshold (tau) must be in [0, 1], got {self.threshold}")
    if self.first_prior not in FIRST_PRIORS:
      raise ValueError(f"first_prior must be one of {FIRST_PRIORS}, got {self.first_prior!r}")
    if self.generator_channels < 2 or self.generator_channels % 2:
      raise ValueError(f"generator_channels must be an even integer >= 2, got {self.generator_channels}")
    for name in ("student_lr", "generator_lr"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
    if self.generator_prior == "none" and self.pretrained_generator_dir is not None:
      raise ValueError("generator_prior='none' never uses a teacher-pretrained generator;"
                       f" drop pretrained_generator_dir={self.pretrained_generator_dir!r}")
    srr_privacy.check_request(
        epsilon=self.epsilon, target_epsilon=self.target_epsilon, delta=self.delta,
        stages=self.stages, samples_per_stage=self.samples_per_stage,
        generator_prior=self.generator_prior)
    self.pretrain_config()  # validates the generator terms, weights and pretraining sizes
    self.stage_config(epsilon=1.0)  # validates N, B, epochs
    seeds.resolve_seed(0 if self.seed is None else self.seed)  # validates an explicit seed

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  @property
  def tau(self) -> float:
    return 1.0 / self.info.num_classes if self.threshold is None else self.threshold

  def pretrain_config(self) -> srr_generator.PretrainConfig:
    return srr_generator.PretrainConfig(
        terms=self.generator_terms, entropy_weight=self.entropy_weight, bn_weight=self.bn_weight,
        steps=self.pretrain_steps, batch_size=self.pretrain_batch_size,
        latent_dim=self.latent_dim, learning_rate=self.pretrain_lr)

  def stage_config(self, *, epsilon: float, stage: int = 1) -> srr_stage.StageConfig:
    return srr_stage.StageConfig(
        samples=self.samples_per_stage, batch_size=self.batch_size, latent_dim=self.latent_dim,
        epsilon=epsilon, threshold=self.tau, student_epochs=self.student_epochs,
        generator_epochs=self.generator_epochs,
        uniform_prior=stage == 0 and self.first_prior == "uniform")

  def plan(self) -> srr_privacy.SRRPrivacyPlan:
    return srr_privacy.plan(
        epsilon=self.epsilon, target_epsilon=self.target_epsilon, delta=self.delta,
        stages=self.stages, samples_per_stage=self.samples_per_stage,
        generator_prior=self.generator_prior)

  def generator_identity(self) -> dict[str, Any]:
    """What a pretrained generator must have been trained for to be reused by this run."""
    return {"dataset": self.dataset, "teacher_dir": os.path.abspath(self.teacher_dir),
            "generator_model": self.generator_model,
            "generator_channels": self.generator_channels, "latent_dim": self.latent_dim}


def _config_json(config: SRRConfig) -> dict[str, Any]:
  out = dataclasses.asdict(config)
  out["generator_terms"] = list(config.generator_terms)
  return out


def init_models(config: SRRConfig, key: jax.Array) -> tuple[core.ModelParts, core.ModelParts]:
  """(student, generator) initialised from `key` (split into one key per network)."""
  s_key, g_key = jax.random.split(key)
  info = config.info
  student = models.create_classifier(config.student_model, num_classes=info.num_classes,
                                     input_shape=info.image_shape, norm=config.student_norm,
                                     rngs=nnx.Rngs(s_key))
  generator = models.create_generator(config.generator_model, latent_dim=config.latent_dim,
                                      image_shape=info.image_shape, rngs=nnx.Rngs(g_key),
                                      base_channels=config.generator_channels)
  return models.split(student), models.split(generator)


def init_state(config: SRRConfig, student: core.ModelParts, generator: core.ModelParts, *,
               stages: int) -> srr_stage.SRRState:
  """Student and generator train states; the student's schedule spans all `stages`."""
  student_steps = stages * config.student_epochs * (config.samples_per_stage // config.batch_size)
  return srr_stage.SRRState(
      TrainState.create(student, srr_generator.adam(config.student_lr, max(student_steps, 1))),
      TrainState.create(generator, srr_generator.adam(config.generator_lr)))


def _generator_prior(config: SRRConfig, generator: core.ModelParts, teacher: core.ModelParts,
                     workdir: str, key: jax.Array, progress: bool,
                     mesh: jax.sharding.Mesh) -> core.ModelParts:
  """The generator the stages start from (pretrained against the teacher, or as given)."""
  if config.generator_prior == "none":
    return generator
  identity = config.generator_identity()
  if config.pretrained_generator_dir is not None:
    return srr_generator.load_pretrained(config.pretrained_generator_dir, generator,
                                         config=config.pretrain_config(), identity=identity)
  return srr_generator.pretrain_generator(
      config.pretrain_config(), generator, teacher, os.path.join(workdir, "generator_pretrain"),
      key, identity=identity, progress=progress, mesh=mesh)


def pretrain(config: SRRConfig, workdir: str, *, progress: bool = True,
             mesh: jax.sharding.Mesh | None = None) -> core.ModelParts:
  """Only the teacher-prior generator pretraining of `config`, into `workdir` (resumable),
  plus `workdir/samples.png`; runs reuse it with `pretrained_generator_dir=workdir`.

  The generator is a noiseless function of the teacher: every run that uses it reports
  record-level ε = inf (module docstring).
  """
  if config.generator_prior != "teacher":
    raise ValueError("only generator_prior='teacher' pretrains a generator")
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.pretrain_batch_size, mesh)
  info = config.info
  teacher = teacher_lib.load_teacher(config.teacher_dir, dataset=config.dataset,
                                     num_classes=info.num_classes, input_shape=info.image_shape)
  init_key, pretrain_key, _ = jax.random.split(
      seeds.root_key(seeds.resolve_seed(config.seed)), 3)
  _, generator = init_models(config, init_key)
  generator = srr_generator.pretrain_generator(
      config.pretrain_config(), generator, teacher.parts, workdir, pretrain_key,
      identity=config.generator_identity(), progress=progress, mesh=mesh)
  _save_grid(config, generator, jax.random.fold_in(init_key, _GRID_TAG), mesh,
             os.path.join(workdir, "samples.png"))
  return generator


def _save_grid(config: SRRConfig, generator: core.ModelParts, key: jax.Array, mesh,
               path: str) -> None:
  """64 samples in whole batches (the compiled generator is reused); `key` is its own stream."""
  z = jax.random.normal(key, (-(-64 // config.batch_size) * config.batch_size, config.latent_dim))
  images = srr_stage.generate_images(generator, z, config.batch_size, mesh)
  samples.save_sample_grid(np.asarray(images[:64]), config.info, path)


@workdir_lib.run_scope
def train_srr(config: SRRConfig, workdir: str, *, resume: bool = False, progress: bool = True,
              mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Runs DP-DFD with selective RR (module docstring).

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
    ValueError / CheckpointMismatchError: bad config, teacher or workdir, before any query.
    BudgetExceededError: the restored ledger has no budget for another stage.
  """
  clock = outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="SRR", config=_config_json(config), resume=resume)
  mesh = sharding.data_mesh() if mesh is None else mesh
  for size in (config.batch_size, config.pretrain_batch_size):
    sharding.check_divisible(size, mesh)
  info = config.info
  teacher = teacher_lib.load_teacher(config.teacher_dir, dataset=config.dataset,
                                     num_classes=info.num_classes, input_shape=info.image_shape)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  privacy_plan = config.plan()

  root_seed = run.root_seed(config.seed)
  init_key, pretrain_key, stage_key = jax.random.split(seeds.root_key(root_seed), 3)
  student, generator = init_models(config, init_key)
  if not run.resuming:  # a resumed run restores its (fine-tuned) generator below
    generator = _generator_prior(config, generator, teacher.parts, workdir, pretrain_key,
                                 progress, mesh)
  state = init_state(config, student, generator, stages=privacy_plan.stages)
  noisy = math.isfinite(privacy_plan.epsilon_per_query)
  budget = config.target_epsilon or privacy_plan.labels_epsilon
  ledger = run.ledger(
      ledger_lib.PrivacyLedger(target_epsilon=budget, delta=config.delta) if noisy else None)
  start, history = 0, []
  if run.resuming:
    arrays, meta = run.restore(state.arrays())
    state, start, history = state.with_arrays(arrays), int(meta["stage"]), list(meta["accuracy"])

  state = sharding.replicate(state, mesh)
  teacher_label_fn = srr_stage.make_teacher_label_fn(
      sharding.replicate(teacher.parts, mesh), config.batch_size, mesh)
  generator_step = srr_generator.make_finetune_step(state.student.graphdef)
  event = (accounting.srr_event(epsilon_per_query=privacy_plan.epsilon_per_query,
                                num_queries=config.samples_per_stage) if noisy else None)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  bar = tqdm.tqdm(total=privacy_plan.stages, initial=start, disable=not progress,
                  desc=f"SRR {config.dataset} stages")
  for stage in range(start, privacy_plan.stages):
    if ledger is not None:  # account before releasing: a crash never under-counts
      run.charge(event, step=stage, note=f"stage {stage}: {config.samples_per_stage} SRR labels")
    stage_config = config.stage_config(epsilon=privacy_plan.epsilon_per_query, stage=stage)
    result = srr_stage.run_stage(state, jax.random.fold_in(stage_key, stage), stage_config,
                                 teacher_label_fn, generator_step=generator_step, mesh=mesh)
    state = result.state
    host_arrays = run.seal(state.arrays())  # before any output of this stage's release
    history.append(evaluate.evaluate(state.student.parts, test)["accuracy"])
    spent = math.inf if ledger is None else ledger.spent_epsilon()
    writer.write(stage + 1, {**result.metrics, **({"labels_epsilon": spent} if noisy else {})},
                 prefix="train/")
    writer.write(stage + 1, {"accuracy": history[-1]}, prefix="test/")
    bar.update(1)
    bar.set_postfix(acc=f"{history[-1]:.4f}", eps=f"{spent:.4g}")
    run.save(stage + 1, host_arrays,
             {"config": _config_json(config), "stage": stage + 1, "accuracy": history,
              "ledger": None if ledger is None else ledger.to_json(),
              "plan": dataclasses.asdict(privacy_plan), "root_seed": list(root_seed)})
  bar.close()
  writer.close()

  _save_grid(config, state.generator.parts, jax.random.fold_in(init_key, _GRID_TAG), mesh,
             os.path.join(workdir, "samples.png"))
  results = _results(config, privacy_plan, ledger, history, root_seed, teacher.card, state,
                     workdir)
  return outputs.finish_run(
      workdir, results, clock=clock, dataset=config.dataset,
      test_accuracy=results["test_accuracy"], sound_epsilon=results["record_level_epsilon"],
      delta=config.delta, paper_epsilon=results["paper_label_epsilon_per_query"],
      target_epsilon=config.target_epsilon, extra={"paper_epsilon_scope": "label-DP per query"})


def _results(config, privacy_plan, ledger, history, root_seed, card, state, workdir) -> dict:
  labels = math.inf if ledger is None else ledger.spent_epsilon()
  return {
      "method": "srr",
      "test_accuracy": history[-1] if history else math.nan,
      "accuracy_per_stage": history,
      **srr_privacy.report(privacy_plan, labels_epsilon=labels),
      "threshold": config.tau,
      "stages": len(history),
      "num_queries": len(history) * config.samples_per_stage,
      "seed": root_seed.public_description(),
      "student_params": models.count_params(state.student.params),
      "config": _config_json(config),
      outputs.PRIVATE_KEY: outputs.private_section(  # + the generator's teacher losses
          {"teacher_test_accuracy": card["test_accuracy"]}, workdir=workdir,
          files=(os.path.join("generator_pretrain", outputs.PRIVATE_CSV),)),
  }


def load_run(workdir: str) -> tuple[SRRConfig, srr_stage.SRRState, dict[str, Any]]:
  """Restores (config, state, metadata) of an SRR workdir (latest stage checkpoint)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  config = SRRConfig(**{**meta["config"],
                        "generator_terms": tuple(meta["config"]["generator_terms"])})
  student, generator = init_models(config, jax.random.key(0))  # shapes only
  template = init_state(config, student, generator, stages=meta["plan"]["stages"])
  arrays, meta = checkpoint.restore(ckpt_dir, template.arrays())
  return config, template.with_arrays(arrays), meta
