"""The generator prior of DP-DFD with selective randomized response: data-free pretraining
against the frozen teacher (resumable, reusable by later runs), or none.

`generator_prior="teacher"`: the generator is pretrained with `step.make_pretrain_step` (the
`generator` losses) in `<workdir>/generator_pretrain`, or loaded from
`pretrained_generator_dir`, checked to be pretrained for the same dataset, teacher (by the
hash of its weights, not its directory), architecture and pretraining config. Such a generator is a noiseless function of the teacher:
record-level ε = inf (`privacy`). `"none"`: the generator starts from its public random
initialisation.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dpkd_jax import errors
from dpkd_jax import models
from dpkd_jax.methods.srr import config as config_lib
from dpkd_jax.methods.srr import generator as generator_lib
from dpkd_jax.methods.srr import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.train import checkpoint
from dpkd_jax.train import outputs
from dpkd_jax.train import sharding
from dpkd_jax.train import workdir as workdir_lib
from dpkd_jax.train.state import TrainState
from dpkd_jax.train.progress import StepBar


def starting_generator(config: config_lib.SRRConfig, generator: core.ModelParts,
                       teacher: core.ModelParts, workdir: str, key: jax.Array, progress: bool,
                       mesh: jax.sharding.Mesh) -> core.ModelParts:
  """The generator the stages start from (pretrained against the teacher, or as given)."""
  if config.generator_prior == "none":
    return generator
  identity = config.generator_identity(teacher)
  if config.pretrained_generator_dir is not None:
    return load_pretrained(config.pretrained_generator_dir, generator,
                           config=config.pretrain_config(), identity=identity,
                           teacher_dir=config.teacher_dir)
  return pretrain_generator(
      config.pretrain_config(), generator, teacher, os.path.join(workdir, "generator_pretrain"),
      key, identity=identity, progress=progress, mesh=mesh)


def pretrain_generator(config: generator_lib.PretrainConfig, generator: core.ModelParts,
                       teacher: core.ModelParts, workdir: str, key: jax.Array, *,
                       identity: dict[str, Any], checkpoint_every: int = 250,
                       progress: bool = True, mesh: jax.sharding.Mesh | None = None,
                       run: workdir_lib.Run | None = None) -> core.ModelParts:
  """Pretrains `generator` against the frozen `teacher`, resumable from `workdir`.

  `workdir/checkpoints/<step>` holds the generator state and, in its metadata, the config,
  `identity` (what the generator is for: dataset, teacher by its weights, architecture;
  `models.generator_identity`; compared on resume and by `load_pretrained`) and the key data of `key`, so a resumed run continues the same
  stream. `key` must be derived from the caller's root key (never the root key itself).

  Args:
    config: the pretraining hyper-parameters.
    generator: the initial generator.
    teacher: the frozen teacher.
    workdir: output directory.
    key: this phase's key (a restored run uses its saved key instead).
    identity: JSON-able description of the generator's purpose.
    checkpoint_every: steps between checkpoints.
    progress: show a tqdm bar.
    mesh: devices (default: all, replicated state).
    run: the locked `workdir` of a standalone pretraining (`open_run(workdir, config=
      config_json(config))`): checkpoints go through it, so its clock counts them.

  Returns:
    The pretrained generator (params and BatchNorm running statistics).
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  state = TrainState.create(generator, _optimizer(config))
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = {"config": config_json(config), "identity": identity, "step": 0,
          "key_data": jax.random.key_data(key).tolist()}
  start = 0
  if checkpoint.latest_step(ckpt_dir) is not None:
    saved = checkpoint.restore_metadata(ckpt_dir)
    if saved.get("config") != meta["config"] or saved.get("identity") != identity:
      raise errors.UserError(f"{workdir!r} holds a generator pretrained for another run"
                             " (another teacher, dataset or architecture); use a fresh directory")
    arrays, meta = checkpoint.restore(ckpt_dir, state.arrays())
    state, start = state.with_arrays(arrays), int(meta["step"])
    key = jax.random.wrap_key_data(jnp.asarray(meta["key_data"], jnp.uint32))
  state = sharding.replicate(state, mesh)
  teacher = sharding.replicate(teacher, mesh)
  step_fn = step_lib.make_pretrain_step(config, teacher.graphdef)
  # Losses of teacher(G(z)): noiseless functions of the teacher, so private diagnostics.
  writer = outputs.PrivateDiagnosticsWriter(workdir, resume_step=start if start else None)
  bar = StepBar(total=config.steps, initial=start, disable=not progress, desc="generator")
  step = start
  while step < config.steps:
    for _ in range(min(checkpoint_every, config.steps - step)):
      state, step_metrics = step_fn(state, teacher.params, teacher.batch_stats,
                                    jax.random.fold_in(key, step))
      step += 1
      bar.update(1)
    step_metrics = jax.device_get(step_metrics)
    writer.write(step, step_metrics, prefix="pretrain/")
    bar.set_postfix(loss=f"{step_metrics['loss']:.3f}")
    step_meta = {**meta, "step": step,
                 "final_metrics": {k: float(v) for k, v in step_metrics.items()}}
    if run is None:
      checkpoint.save(ckpt_dir, step, jax.device_get(state.arrays()), step_meta)
    else:  # through the run, whose clock counts the checkpoint
      run.save(step, state.arrays(), step_meta)
  bar.close()
  writer.close()
  return jax.device_get(state.parts)


def load_pretrained(workdir: str, template: core.ModelParts, *, config: generator_lib.PretrainConfig,
                    identity: dict[str, Any], teacher_dir: str) -> core.ModelParts:
  """The finished generator of `pretrain_generator(config, ..., workdir, identity=identity)`.

  Both must match, so that a run reusing the generator reports its true pretraining; the
  teacher is compared by its weights (`models.generator_identity`), so a copy of the teacher
  elsewhere is accepted and a teacher retrained in place is not. `teacher_dir` (this run's
  teacher) only names it in the error.

  Raises:
    FileNotFoundError: no checkpoint in `workdir`.
    UserError: it was pretrained for another dataset/teacher/architecture, or saved before
      identities named the teacher by its weights (`models.check_generator_identity`).
    ValueError: it was pretrained with another config, or is unfinished.
  """
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  models.check_generator_identity(meta.get("identity"), identity,
                                  where=f"the generator in {workdir!r}", teacher_dir=teacher_dir)
  if meta.get("config") != config_json(config):
    raise ValueError(f"the generator in {workdir!r} was pretrained with {meta.get('config')},"
                     f" this run asks for {config_json(config)}")
  if meta["step"] < config.steps:
    raise ValueError(f"the generator in {workdir!r} is unfinished ({meta['step']} of"
                     f" {config.steps} steps)")
  arrays, _ = checkpoint.restore(ckpt_dir, TrainState.create(template, _optimizer(config)).arrays())
  return core.ModelParts(template.graphdef, arrays["params"], arrays["batch_stats"])


def _optimizer(config: generator_lib.PretrainConfig) -> optax.GradientTransformation:
  return step_lib.adam(config.learning_rate, config.steps)


def config_json(config: generator_lib.PretrainConfig) -> dict[str, Any]:
  """The pretraining config as its checkpoints store it (compared on resume and reuse)."""
  out = dataclasses.asdict(config)
  out["terms"] = list(config.terms)
  return out


def write_record(workdir: str, *, dataset: str, run: workdir_lib.Run,
                 clock: outputs.RunClock) -> None:
  """`<workdir>/record.json` of a finished standalone pretraining (process 0 only): its cost
  (seconds summed over resumed processes) and final losses. No test accuracy (a generator is
  not a classifier) and sound ε "inf": the generator is a noiseless function of the teacher."""
  if jax.process_index() != 0 or run.clock is None:
    return
  meta = checkpoint.restore_metadata(os.path.join(workdir, "checkpoints"))
  outputs.write_non_private_record(
      workdir, run=run, clock=clock, method="srr_generator", dataset=dataset, test_accuracy=None,
      extra={"pretrain_steps": meta["step"], "final_metrics": meta.get("final_metrics", {})})
