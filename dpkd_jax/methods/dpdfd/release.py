"""Release of a trained DPDFD run: restore it, and sample a labelled synthetic dataset.

`sample(workdir, num)` is post-processing of the run's noisy releases (the generator and the
student), so the synthetic data carries the run's (ε, δ) and nothing more.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from dpkd_jax import data
from dpkd_jax import errors
from dpkd_jax.methods.dpdfd import config as config_lib
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import seeds
from dpkd_jax.train import checkpoint
from dpkd_jax.train import distributed
from dpkd_jax.train import samples


def check_run(workdir: str) -> None:
  """A `UserError` (one line naming --workdir) unless `workdir` holds a DPDFD run's checkpoint;
  nothing is created (the `sample` command calls it before anything else)."""
  run = "give the --workdir of a `python -m experiments.dpdfd` run"
  if not os.path.isdir(workdir):
    raise errors.UserError(f"--workdir: {workdir!r} does not exist; {run}")
  if os.path.exists(os.path.join(workdir, "card.json")):
    raise errors.UserError(f"--workdir: {workdir!r} is a teacher's workdir (card.json), not a "
                           f"DPDFD run; {run}")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if checkpoint.latest_step(ckpt_dir) is None:
    raise errors.UserError(f"--workdir: {workdir!r} holds no checkpoint; {run}")
  try:
    config = checkpoint.restore_metadata(ckpt_dir).get("config")
  except Exception as error:  # pylint: disable=broad-except
    # Orbax reports damaged metadata as JSONDecodeError, KeyError, ...
    raise errors.UserError(f"--workdir: cannot read the checkpoint metadata in {ckpt_dir!r} "
                           f"({type(error).__name__}: {error}); {run}") from error
  if not isinstance(config, dict) or "teacher_dirs" not in config:
    raise errors.UserError(f"--workdir: {workdir!r} is not a DPDFD run (its checkpoint holds "
                           f"no DPDFD config); {run}")


def load_run(workdir: str) -> tuple[config_lib.DPDFDConfig, step_lib.DPDFDState, dict[str, Any]]:
  """Restores (config, state, metadata) of a DPDFD workdir (latest checkpoint)."""
  ckpt_dir = os.path.join(workdir, "checkpoints")
  meta = checkpoint.restore_metadata(ckpt_dir)
  config = config_lib.DPDFDConfig.from_json(meta["config"])  # any saved format
  template = step_lib.init_state(config, jax.random.key(0))
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
  images = samples.generate(state.generator, seeds.root_key(seed), num, config.latent_dim,
                            class_codes=config.class_codes)
  logits = jax.jit(lambda x: core.apply(state.student.graphdef, state.student.params,
                                        state.student.batch_stats, x, train=False)[0].logits)
  labels = np.concatenate([np.argmax(np.asarray(logits(images[i:i + 500])), -1)
                           for i in range(0, num, 500)]).astype(np.int32)
  pixels = np.asarray(data.denormalize(images, config.info))
  out_path = out_path or os.path.join(workdir, "synthetic.npz")
  if distributed.is_coordinator():
    np.savez_compressed(out_path, x=np.round(pixels * 255).astype(np.uint8), y=labels)
  return out_path
