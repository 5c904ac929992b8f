"""Interrupt-and-resume helpers shared by the run tests (DPDFD, its replay and restarts, SRR).

A finished run's checkpoint `step` copied alone into a fresh workdir is that run as if killed
right after saving it: arrays, ledger, plan and secret root seed. Resuming it must give the
finished run's result bit for bit (the key streams continue, nothing is drawn twice)."""

import os
import warnings

import chex
import jax

from dpkd_jax.methods import dpdfd
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import checkpoint


def interrupted_at(workdir: str, step: int, template, target: str):
  """Writes `workdir`'s checkpoint `step` alone into `target`; returns its (arrays, meta).

  `template`: the run state's `arrays()` (shapes and dtypes to restore into)."""
  arrays, meta = checkpoint.restore(os.path.join(workdir, "checkpoints"), template, step=step)
  checkpoint.save(os.path.join(target, "checkpoints"), step, arrays, meta)
  return arrays, meta


def interrupted_dpdfd(config, workdir: str, step: int, target: str):
  """`interrupted_at` for a DPDFD run of `config`."""
  return interrupted_at(workdir, step, dpdfd.init_state(config, jax.random.key(0)).arrays(),
                        target)


def resume_dpdfd(config, workdir: str):
  """Trains (resumes) `config` in `workdir`, quiet about paper accounting."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", paper_accounting.PaperAccountingWarning)
    return dpdfd.train_dpdfd(config, workdir, resume=True, progress=False)


def assert_same_dpdfd_state(workdir_a: str, workdir_b: str) -> None:
  """The two runs end with bit-identical student and generator weights and replay buffers."""
  _, a, _ = dpdfd.load_run(workdir_a)
  _, b, _ = dpdfd.load_run(workdir_b)
  chex.assert_trees_all_equal(a.student.params, b.student.params)
  chex.assert_trees_all_equal(a.generator.params, b.generator.params)
  assert (a.replay is None) == (b.replay is None)
  if a.replay is not None:
    chex.assert_trees_all_equal(a.replay.arrays(), b.replay.arrays())
