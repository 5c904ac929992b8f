"""DPDFD end to end: config, training loop, outputs, synthetic-data release.

`train_dpdfd(config, workdir)` writes to `workdir`:
  checkpoints/<step>/  Orbax: student + generator states, step; meta: config, privacy ledger, plan
  results.json         test accuracy, sound ε (dp_accounting), paper ε (if any), δ, σ, steps,
                       config; the teachers' accuracy under "private_diagnostics" (not covered)
  record.json          the results record (`train.records`)
  samples.png          grid of synthetic samples from the generator
  metrics.csv, tb/     curves (only teacher-free, post-mechanism quantities)
`sample(workdir, num)` releases a synthetic labelled dataset (post-processing, same ε).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import numpy as np
import optax
import tqdm
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax import teacher as teacher_lib
from dpkd_jax import teacher_partition
from dpkd_jax.methods import dpdfd_privacy
from dpkd_jax.methods import dpdfd_step
from dpkd_jax.models import core
from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import ledger as ledger_lib
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import distributed
from dpkd_jax.train import evaluate
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import samples
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPDFDConfig:
  """A DPDFD run. Privacy fields first, then model/optimization, then bookkeeping.

  Attributes:
    noise_multiplier: sigma (noise std sigma*C per output coordinate), or None to calibrate.
    target_epsilon: stop/calibrate at this ε (None: report only).
    delta: δ.
    accounting: "sound" (default) or "paper" (Theorem 3 reconstruction; warned, sound ε beside).
    l2_norm_bound, stability, bound_method: C, e and "normalize"/"clip" of A_{C,sigma}.
    dataset: the private dataset (its test split evaluates the student).
    teacher_dirs: one workdir per teacher (`experiments.teacher`); n > 1 = an ensemble, whose
      accounting uses the most teachers one record can reach (`teacher_partition`).
    student_model, student_norm, generator_model, generator_channels, latent_dim: networks
      (`generator_channels` is DAFL's width, 128 in the paper; 64 quarters the CPU cost).
    steps, batch_size: DPDFD iterations (upper bound when a target ε is given) and B.
    gamma, student_loss, dkd_alpha, dkd_beta, temperature, entropy_weight, feature_weight,
      one_hot_weight: see `dpdfd_step.StepConfig`.
    student_lr, generator_lr: Adam learning rates (cosine-decayed over the steps).
    seed: root seed of init, latents and noise; None (default) draws a secret one from OS
      entropy, stored only in the checkpoint (`privacy.seeds`); an integer makes the noise
      reproducible by anyone who knows it (research runs).
    eval_every, data_dir: bookkeeping.
  """

  noise_multiplier: float | None = None
  target_epsilon: float | None = None
  delta: float = 1e-5
  accounting: str = "sound"
  l2_norm_bound: float = 1.0
  stability: float = 1e-6
  bound_method: str = "normalize"
  dataset: str
  teacher_dirs: tuple[str, ...]
  student_model: str = "datalens_cnn"
  student_norm: str = "batch"
  generator_model: str = "dafl"
  generator_channels: int = 128
  latent_dim: int = 100
  steps: int = 2000
  batch_size: int = 256
  gamma: float = 1.0
  student_loss: str = "mse"
  dkd_alpha: float = 1.0
  dkd_beta: float = 8.0
  temperature: float = 4.0
  entropy_weight: float = 5.0
  feature_weight: float = 0.1
  one_hot_weight: float = 1.0
  student_lr: float = 1e-3
  generator_lr: float = 1e-3
  seed: int | None = None
  eval_every: int = 200
  data_dir: str | None = None

  def __post_init__(self):
    if self.dataset not in data.DATASETS:
      raise ValueError(f"unknown dataset {self.dataset!r}; known: {sorted(data.DATASETS)}")
    if not self.teacher_dirs:
      raise ValueError("teacher_dirs must name at least one teacher workdir")
    object.__setattr__(self, "teacher_dirs", tuple(self.teacher_dirs))
    if self.student_model not in models.CLASSIFIERS:
      raise ValueError(f"unknown student_model {self.student_model!r}; known: {sorted(models.CLASSIFIERS)}")
    if self.generator_model not in models.GENERATORS:
      raise ValueError(f"unknown generator_model {self.generator_model!r}; known: {sorted(models.GENERATORS)}")
    if self.seed is not None and (isinstance(self.seed, bool) or self.seed < 0):
      raise ValueError(f"seed must be a non-negative integer or None, got {self.seed!r}")
    for name in ("eval_every", "generator_channels"):  # steps: check_request below
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    for name in ("student_lr", "generator_lr"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
    self.step_config()  # validates sigma (if given), C, e, gamma, losses, B
    dpdfd_privacy.check_request(  # the plan's own checks, without its costly calibration
        noise_multiplier=self.noise_multiplier, target_epsilon=self.target_epsilon,
        delta=self.delta, steps=self.steps, accounting_mode=self.accounting)

  @property
  def info(self) -> data.DatasetInfo:
    return data.DATASETS[self.dataset]

  def step_config(self, noise_multiplier: float | None = None) -> dpdfd_step.StepConfig:
    sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
    return dpdfd_step.StepConfig(
        noise_multiplier=1.0 if sigma is None else sigma, l2_norm_bound=self.l2_norm_bound,
        stability=self.stability, bound_method=self.bound_method, gamma=self.gamma,
        student_loss=self.student_loss, dkd_alpha=self.dkd_alpha, dkd_beta=self.dkd_beta,
        temperature=self.temperature, entropy_weight=self.entropy_weight,
        feature_weight=self.feature_weight, one_hot_weight=self.one_hot_weight,
        batch_size=self.batch_size, latent_dim=self.latent_dim)

  def plan(self, teachers_per_record: int | None = None) -> dpdfd_privacy.PrivacyPlan:
    """The privacy plan; `teachers_per_record` m defaults to every teacher (worst case):
    pass `teacher_partition.teachers_per_record(cards)` for what the cards prove."""
    return dpdfd_privacy.plan(
        noise_multiplier=self.noise_multiplier, target_epsilon=self.target_epsilon,
        delta=self.delta, steps=self.steps, batch_size=self.batch_size,
        l2_norm_bound=self.l2_norm_bound, num_teachers=len(self.teacher_dirs),
        teachers_per_record=(len(self.teacher_dirs) if teachers_per_record is None
                             else teachers_per_record),
        accounting_mode=self.accounting)


def load_teachers(config: DPDFDConfig) -> tuple[dpdfd_step.TeacherEnsemble, list[dict[str, Any]]]:
  """Loads and checks every teacher against the dataset; all must share one architecture,
  and none may appear twice (`teacher_partition.check_distinct`: a UserError)."""
  info = config.info
  loaded = [teacher_lib.load_teacher(d, dataset=config.dataset, num_classes=info.num_classes,
                                     input_shape=info.image_shape) for d in config.teacher_dirs]
  teacher_partition.check_distinct(config.teacher_dirs, [t.card for t in loaded])
  archs = {(t.card["model"], t.card["norm"]) for t in loaded}
  if len(archs) > 1:
    raise ValueError(f"all teachers must share one architecture, got {sorted(archs)}")
  return dpdfd_step.TeacherEnsemble.stack([t.parts for t in loaded]), [t.card for t in loaded]


def init_state(config: DPDFDConfig, key: jax.Array) -> dpdfd_step.DPDFDState:
  s_key, g_key = jax.random.split(key)
  info = config.info
  student = models.create_classifier(config.student_model, num_classes=info.num_classes,
                                     input_shape=info.image_shape, norm=config.student_norm,
                                     rngs=nnx.Rngs(s_key))
  generator = models.create_generator(config.generator_model, latent_dim=config.latent_dim,
                                      image_shape=info.image_shape, rngs=nnx.Rngs(g_key),
                                      base_channels=config.generator_channels)
  adam = lambda lr: optax.adam(optax.cosine_decay_schedule(lr, config.steps))  # noqa: E731
  return dpdfd_step.DPDFDState(TrainState.create(core.split(student), adam(config.student_lr)),
                               TrainState.create(core.split(generator), adam(config.generator_lr)))


def _config_json(config: DPDFDConfig) -> dict[str, Any]:
  out = dataclasses.asdict(config)
  out["teacher_dirs"] = list(config.teacher_dirs)
  return out


@workdir_lib.run_scope
def train_dpdfd(config: DPDFDConfig, workdir: str, *, progress: bool = True,
                mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Runs DPDFD (resuming from `workdir` if it holds a checkpoint of the same config).

  The workdir is locked for the whole run (`train.workdir`); each chunk of steps is charged to
  the ledger (and privacy_ledger.json) before it runs.

  Returns:
    The results dict (also written to `<workdir>/results.json`).

  Raises:
    ValueError / CheckpointMismatchError: bad config or teachers, before any training.
    BudgetExceededError: the ledger restored from `workdir` has no budget left for a step.
  """
  clock = outputs.RunClock()
  run = workdir_lib.open_run(workdir, kind="DPDFD", config=_config_json(config))
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.batch_size, mesh)
  ensemble, cards = load_teachers(config)
  overlap = teacher_partition.teachers_per_record(cards)
  if overlap.teachers_per_record > 1 and distributed.is_coordinator():
    print(f"DPDFD accounting: {overlap.reason}", flush=True)
  test = data.load(config.dataset, "test", data_dir=config.data_dir)
  privacy_plan = config.plan(overlap.teachers_per_record)
  nonprivate = privacy_plan.noise_multiplier == 0
  step_config = config.step_config(privacy_plan.noise_multiplier)
  event_of = lambda n: accounting.dpdfd_event(  # noqa: E731
      noise_multiplier=privacy_plan.noise_multiplier, batch_size=config.batch_size, steps=n,
      num_teachers=len(cards), teachers_per_record=privacy_plan.teachers_per_record)

  # The root seed is secret unless the user chose it; a resumed run continues with its own.
  root_seed = run.root_seed(config.seed)
  init_key, train_key = jax.random.split(seeds.root_key(root_seed))
  state = init_state(config, init_key)
  # The ledger's budget: the target in sound mode; in paper mode (or without a target) the
  # sound ε of the planned run, so that the ledger still refuses anything beyond the plan.
  budget = (config.target_epsilon if config.accounting == "sound" and config.target_epsilon
            else privacy_plan.sound_epsilon)
  ledger = run.ledger(
      None if nonprivate else ledger_lib.PrivacyLedger(target_epsilon=budget, delta=config.delta))
  start = 0
  if run.resuming:
    arrays, meta = run.restore(state.arrays())
    state = state.with_arrays(arrays)
    start = int(meta["step"])

  state = sharding.replicate(state, mesh)
  ensemble = sharding.replicate(ensemble, mesh)
  replicated_train_key = sharding.replicate(train_key, mesh)  # one key for all hosts
  train_step = dpdfd_step.make_train_step(step_config, ensemble.graphdef)
  writer = metrics_lib.MetricsWriter(workdir, resume_step=start)
  bar = tqdm.tqdm(total=privacy_plan.steps, initial=start, disable=not progress,
                  desc=f"DPDFD {config.dataset}")
  accuracy = math.nan
  step = start
  while step < privacy_plan.steps:
    chunk = min(config.eval_every - step % config.eval_every, privacy_plan.steps - step)
    if ledger is not None:  # account before releasing: a crash never under-counts
      run.charge(event_of(chunk), step=step, note=f"steps {step}..{step + chunk - 1}")
    for _ in range(chunk):
      state, step_metrics = train_step(state, ensemble.params, ensemble.batch_stats,
                                       jax.random.fold_in(replicated_train_key, step))
      step += 1
      bar.update(1)
    host_arrays = run.seal(state.arrays())  # before any output of these releases
    step_metrics = jax.device_get(step_metrics)
    accuracy = evaluate.evaluate(state.student.parts, test)["accuracy"]
    spent = math.inf if ledger is None else ledger.spent_epsilon()
    # A non-private run (sigma = 0) has no finite epsilon to plot; results.json says inf.
    privacy_metrics = {"epsilon": spent} if math.isfinite(spent) else {}
    writer.write(step, {**step_metrics, **privacy_metrics}, prefix="train/")
    writer.write(step, {"accuracy": accuracy}, prefix="test/")
    bar.set_postfix(loss=f"{step_metrics['student_loss']:.3f}", acc=f"{accuracy:.4f}", eps=f"{spent:.3g}")
    run.save(step, host_arrays,
             {"config": _config_json(config), "step": step,
              "ledger": None if ledger is None else ledger.to_json(),
              "plan": dataclasses.asdict(privacy_plan),
              "root_seed": list(root_seed)})
  bar.close()
  writer.close()
  if start == step and step > 0:
    accuracy = evaluate.evaluate(state.student.parts, test)["accuracy"]

  # A stream of its own: init_state takes split(init_key) = fold_in(init_key, 0 and 1) (1 is
  # the generator's init), so the grid takes tag 2; key(seed + 1) would be another run's root.
  grid_key = jax.random.fold_in(init_key, 2)
  samples.save_sample_grid(samples.generate(state.generator, grid_key, 64, config.latent_dim),
                           config.info, os.path.join(workdir, "samples.png"))
  epsilon = math.inf if ledger is None else ledger.spent_epsilon()
  results = {
      "method": "dpdfd",
      "test_accuracy": accuracy,
      "epsilon": epsilon,
      "epsilon_accountant": "dp_accounting PLD, teacher not private (sensitivity 2C*m*sqrt(B),"
                            f" m = {privacy_plan.teachers_per_record} teachers per record)",
      "paper_epsilon": privacy_plan.paper_epsilon,
      "paper_epsilon_warning": "DPDFD Theorem 3 (reconstruction): NOT a valid guarantee",
      "delta": config.delta,
      "noise_multiplier": privacy_plan.noise_multiplier,
      "steps": step,
      "accounting_used_for_budget": config.accounting,
      "seed": root_seed.public_description(),
      "num_teachers": len(cards),
      "teachers_per_record": privacy_plan.teachers_per_record,
      "teacher_partition": overlap.reason,
      "student_params": models.count_params(state.student.params),
      "config": _config_json(config),
      # The teachers' test accuracy is a noiseless function of their private training data
      # (and `--train_teacher` puts the teacher itself in <workdir>/teacher).
      outputs.PRIVATE_KEY: outputs.private_section(
          {"teacher_test_accuracy": [c["test_accuracy"] for c in cards]}, workdir=workdir,
          files=("teacher",)),
  }
  outputs.finish_run(workdir, results, clock=clock, dataset=config.dataset,
                     test_accuracy=accuracy, sound_epsilon=epsilon, delta=config.delta,
                     accounting=config.accounting, paper_epsilon=privacy_plan.paper_epsilon,
                     target_epsilon=config.target_epsilon)
  return results


def load_run(workdir: str) -> tuple[DPDFDConfig, dpdfd_step.DPDFDState, dict[str, Any]]:
  """Restores (config, state, metadata) of a DPDFD workdir (latest checkpoint)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  config = DPDFDConfig(**{**meta["config"], "teacher_dirs": tuple(meta["config"]["teacher_dirs"])})
  template = init_state(config, jax.random.key(0))
  arrays, meta = checkpoint.restore(ckpt_dir, template.arrays())
  return config, template.with_arrays(arrays), meta


def sample(workdir: str, num: int, *, seed: int, out_path: str | None = None) -> str:
  """Releases `num` synthetic images labelled by the student as `<workdir>/synthetic.npz`.

  Post-processing of the trained generator and student: the same (ε, δ) as the run.
  Keys: x (num, H, W, C) uint8, y (num,) int32 student labels.
  """
  if num < 1:
    raise ValueError(f"num must be >= 1, got {num}")
  config, state, _ = load_run(workdir)
  images = samples.generate(state.generator, seeds.root_key(seed), num, config.latent_dim)
  logits = jax.jit(lambda x: core.apply(state.student.graphdef, state.student.params,
                                        state.student.batch_stats, x, train=False)[0].logits)
  labels = np.concatenate([np.argmax(np.asarray(logits(images[i:i + 500])), -1)
                           for i in range(0, num, 500)]).astype(np.int32)
  pixels = np.asarray(data.denormalize(images, config.info))
  out_path = out_path or os.path.join(workdir, "synthetic.npz")
  if distributed.is_coordinator():
    np.savez_compressed(out_path, x=np.round(pixels * 255).astype(np.uint8), y=labels)
  return out_path
