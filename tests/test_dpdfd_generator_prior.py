"""dpkd_jax.methods.dpdfd.generator_prior: a teacher-pretrained generator as DPDFD's start is a
labelled variant whose record-level epsilon is inf (the release epsilon is kept beside)."""

import json
import math
import os

import chex
import jax
import pytest

from dpkd_jax.errors import UserError
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import generator_prior
from dpkd_jax.train import checkpoint
from dpkd_jax.train import records


def _config(teacher_dir, prior_dir=None, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2, latent_dim=8,
              generator_channels=8, pretrained_generator_dir=prior_dir)
  base.update(kw)
  return dpdfd.DPDFDConfig(**base)


def _save_prior(config, directory, *, steps=1, identity=None):
  """A pretraining checkpoint as `experiments.srr pretrain` writes it (params shifted by 1)."""
  generator = dpdfd.init_state(config, jax.random.key(7)).generator
  arrays = {"params": jax.tree.map(lambda v: v + 1.0, generator.params),
            "batch_stats": generator.batch_stats, "step": 0}
  meta = {"identity": identity or generator_prior.identity(config), "config": {"steps": steps},
          "step": 1}
  checkpoint.save(os.path.join(directory, "checkpoints"), 1, arrays, meta)
  return arrays


def test_load_restores_the_pretrained_generator(teacher_dir, tmp_path):
  config = _config(teacher_dir, str(tmp_path))
  saved = _save_prior(config, str(tmp_path))
  fresh = dpdfd.init_state(config, jax.random.key(0)).generator
  loaded = generator_prior.load(config, fresh)
  chex.assert_trees_all_close(loaded.params, saved["params"])
  assert int(loaded.step) == 0


@pytest.mark.parametrize("case, match", [
    ("missing", "holds no checkpoint"), ("other teacher", "was pretrained for"),
    ("unfinished", "unfinished")])
def test_wrong_prior_is_one_user_error(teacher_dir, tmp_path, case, match):
  config = _config(teacher_dir, str(tmp_path))
  if case == "other teacher":
    _save_prior(config, str(tmp_path), identity={**generator_prior.identity(config),
                                                 "teacher_dir": "/elsewhere"})
  elif case == "unfinished":
    _save_prior(config, str(tmp_path), steps=5)
  fresh = dpdfd.init_state(config, jax.random.key(0)).generator
  with pytest.raises(UserError, match=match):
    generator_prior.load(config, fresh)


def test_prior_needs_one_teacher(teacher_dir):
  with pytest.raises(ValueError, match="exactly one teacher"):
    _config(teacher_dir, "x", teacher_dirs=(teacher_dir, teacher_dir))


def test_a_run_from_a_prior_has_record_epsilon_inf(teacher_dir, tmp_path):
  prior = str(tmp_path / "prior")
  config = _config(teacher_dir, prior)
  _save_prior(config, prior)
  results = dpdfd.train_dpdfd(config, str(tmp_path / "run"), progress=False)
  assert math.isinf(results["epsilon"])
  assert 0 < results["release_epsilon_given_generator"] < math.inf
  record = records.read_record(str(tmp_path / "run" / "record.json"))
  assert record["sound_epsilon"] == "inf"
  assert record["release_epsilon_given_generator"] == pytest.approx(
      results["release_epsilon_given_generator"])
  with open(tmp_path / "run" / "results.json") as f:
    assert "record-level epsilon inf" in json.load(f)["epsilon_note"]
