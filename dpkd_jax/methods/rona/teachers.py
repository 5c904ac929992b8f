"""RONA's two teachers: the cumbersome one (public + sensitive data) and the auxiliary one
(public data only), trained with `dpkd_jax.teacher`'s functions or loaded from their workdirs.

The auxiliary teacher is what makes RONA's adaptive bound free: B follows its knowledge norms,
so it must never have seen a sensitive record. `train_public_teacher` therefore writes the exact
public split it was trained on into its card (`public_split`), and `load_or_train_aux_teacher`
refuses a teacher whose card does not name the run's split. Its workdir has the layout of
`teacher.train_teacher` (checkpoints/ + card.json), so `teacher.load_teacher` reads it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax import teacher as teacher_lib
from dpkd_jax.methods.rona.config import RONAConfig
from dpkd_jax.models import core
from dpkd_jax.privacy import seeds
from dpkd_jax.data import splits
from dpkd_jax.train import checkpoint
from dpkd_jax.train import selection
from dpkd_jax.train import sharding
from dpkd_jax.train.state import TrainState
from dpkd_jax.train.progress import StepBar


def public_split_card(config: RONAConfig, num_public: int) -> dict[str, Any]:
  """What an auxiliary teacher's card must record to prove it saw only this public split."""
  return {"dataset": config.dataset, "public_fraction": config.public_fraction,
          "split_seed": config.split_seed, "num_examples": num_public}


def private_rows(config: RONAConfig, num_train: int) -> np.ndarray:
  """(R,) sorted rows of the N = `num_train` training records that are only private: the
  seeded sensitive part (`run._data`'s `private_public_split`) less its validation hold-out.
  The teacher trains on every row, the student on the public part's labels: a one-run audit
  puts its canaries here only (`dpkd_jax.audit`), where the run promises privacy."""
  fractions = {"private": 1.0 - config.public_fraction, "public": config.public_fraction}
  sensitive = splits.partition(num_train, fractions, seed=config.split_seed)["private"]
  kept, _ = selection.hold_out_indices(len(sensitive), config.validation_examples)
  return np.sort(sensitive[kept])


def hint_shape(parts: core.ModelParts, info: data.DatasetInfo) -> tuple[int, ...]:
  """One example's hint shape (no batch axis), from shapes only (nothing is computed)."""
  out = jax.eval_shape(lambda p, s: core.apply(parts.graphdef, p, s,
                                               jnp.zeros((1, *info.image_shape)), train=False)[0],
                       parts.params, parts.batch_stats)
  return tuple(out.hint.shape[1:])


def train_public_teacher(config: teacher_lib.TeacherConfig, public: data.ArrayDataset,
                         workdir: str, *, public_split: dict[str, Any], progress: bool = True,
                         mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
  """Trains a teacher on `public` only (the recipe of `teacher.train_teacher`), writes its card.

  Args:
    config: the recipe; its `num_shards`/`shard` are ignored (the data is `public`).
    public: the public split.
    workdir: output directory: checkpoints/ and card.json.
    public_split: the split's description, stored in the card as `public_split`.
    progress: show a tqdm progress bar.
    mesh: data-parallel mesh (default: all devices).

  Returns:
    The card.
  """
  mesh = sharding.data_mesh() if mesh is None else mesh
  sharding.check_divisible(config.batch_size, mesh)
  if len(public) < config.batch_size:
    raise errors.UserError(f"public split has {len(public)} examples < teacher "
                           f"batch_size={config.batch_size} (--teacher_batch_size)")
  test = data.load(config.dataset, "test", data_dir=config.data_dir, download=config.download)
  total_steps = len(public) // config.batch_size * config.epochs
  init_key, order_key, augment_key = jax.random.split(seeds.root_key(config.seed), 3)
  state = TrainState.create(teacher_lib.init_model(config, init_key),
                            teacher_lib.make_optimizer(config, total_steps))
  state = sharding.replicate(state, mesh)
  train_step = teacher_lib.make_train_step(config)
  start_time, start_cpu = time.time(), time.process_time()
  step = 0  # the augmentation key's tag: one per step
  with StepBar(total=total_steps, disable=not progress,
               desc=f"aux teacher {config.model}/{config.dataset} (public)") as bar:
    for epoch in range(config.epochs):
      for indices in data.epoch_batches(jax.random.fold_in(order_key, epoch), len(public),
                                        config.batch_size):
        images, labels = sharding.shard_batch((public.images[indices], public.labels[indices]),
                                              mesh)
        state, _ = train_step(state, images, labels, jax.random.fold_in(augment_key, step))
        step += 1
        bar.update(1)
  checkpoint.save(os.path.join(workdir, "checkpoints"), total_steps,
                  jax.device_get(state.arrays()),
                  {"epoch": config.epochs, "config": dataclasses.asdict(config)})
  split = {"num_shards": 1, "shard": 0, "shard_seed": config.shard_seed,
           "num_train_examples": len(public)}
  card = {**teacher_lib.make_card(config, state, test, split=split, seconds=(
      round(time.time() - start_time, 1), round(time.process_time() - start_cpu, 1))),
          "public_split": public_split}
  teacher_lib.write_card(workdir, card)
  return card


def _load(workdir: str, info: data.DatasetInfo) -> teacher_lib.Teacher:
  return teacher_lib.load_teacher(workdir, dataset=info.name, num_classes=info.num_classes,
                                  input_shape=info.image_shape)


def load_or_train_teacher(config: RONAConfig, workdir: str, *, progress: bool,
                          mesh: jax.sharding.Mesh) -> teacher_lib.Teacher:
  """The cumbersome teacher: `config.teacher_dir`, else trained on the whole training split
  (public + sensitive) in `<workdir>/teacher` (reused if its card exists).

  Args:
    config: the RONA run's config.
    workdir: the RONA workdir.
    progress, mesh: as for `teacher.train_teacher`.
  """
  if config.teacher_dir is not None:
    return _load(config.teacher_dir, config.info)
  teacher_dir = os.path.join(workdir, "teacher")
  if not os.path.exists(os.path.join(teacher_dir, "card.json")):
    teacher_lib.train_teacher(teacher_lib.TeacherConfig(
        dataset=config.dataset, model=config.teacher_model, epochs=config.teacher_epochs,
        batch_size=config.teacher_batch_size, seed=config.teacher_seed,
        data_dir=config.data_dir, download=config.download),
        teacher_dir, progress=progress, mesh=mesh)
  return _load(teacher_dir, config.info)


def load_or_train_aux_teacher(config: RONAConfig, public: data.ArrayDataset,
                              public_split: dict[str, Any], teacher: teacher_lib.Teacher,
                              workdir: str, *, progress: bool,
                              mesh: jax.sharding.Mesh) -> teacher_lib.Teacher:
  """The auxiliary teacher: `config.aux_teacher_dir`, else the teacher's recipe (model, norm,
  optimizer, augmentation) with `config.teacher_epochs`/`teacher_seed` on `public` only, in
  `<workdir>/aux_teacher` (reused if its card exists).

  Raises:
    ValueError: the auxiliary teacher's card does not record exactly `public_split` (it may
      have seen sensitive data, and the adaptive bound would then leak it).
  """
  aux_dir = config.aux_teacher_dir or os.path.join(workdir, "aux_teacher")
  if config.aux_teacher_dir is None and not os.path.exists(os.path.join(aux_dir, "card.json")):
    # The teacher's seed on purpose (its recipe): init and batch-order keys equal the teacher's.
    # Legitimate reuse: public, data-independent draws of two non-private models, never noise.
    recipe = dataclasses.replace(
        teacher_lib.TeacherConfig(**teacher.card["config"]), epochs=config.teacher_epochs,
        seed=config.teacher_seed, num_shards=1, shard=0, data_dir=config.data_dir,
        download=config.download)
    train_public_teacher(recipe, public, aux_dir, public_split=public_split, progress=progress,
                         mesh=mesh)
  aux = _load(aux_dir, config.info)
  if aux.card.get("public_split") != public_split:
    raise ValueError(
        f"auxiliary teacher in {aux_dir!r} records public_split={aux.card.get('public_split')!r},"
        f" not this run's {public_split!r}: it must be trained on this public split only "
        "(its norms set the bound B without privacy cost only if it never saw sensitive data)")
  return aux


def teachers(config: RONAConfig, public_split: dict[str, Any], public: data.ArrayDataset,
             workdir: str, *, progress: bool, mesh: jax.sharding.Mesh
             ) -> tuple[teacher_lib.Teacher, teacher_lib.Teacher | None]:
  """(teacher, auxiliary teacher); the auxiliary one only for the adaptive bound (the only use
  of it), checked to share the hint shape its norms stand in for."""
  teacher = load_or_train_teacher(config, workdir, progress=progress, mesh=mesh)
  if config.bound_mode != "adaptive":
    return teacher, None
  aux = load_or_train_aux_teacher(config, public, public_split, teacher, workdir,
                                  progress=progress, mesh=mesh)
  shapes = [hint_shape(t.parts, config.info) for t in (teacher, aux)]
  if shapes[0] != shapes[1]:
    raise ValueError(f"teacher hint {shapes[0]} and auxiliary teacher hint {shapes[1]} differ: "
                     "the adaptive bound needs the same hint layer (same architecture)")
  return teacher, aux
