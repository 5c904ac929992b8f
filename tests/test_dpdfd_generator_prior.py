"""dpkd_jax.methods.dpdfd.generator_prior: a teacher-pretrained generator as DPDFD's start is a
labelled variant whose record-level epsilon is inf (the release epsilon is kept beside)."""

import json
import math
import os
import re
import shutil

import chex
import jax
import pytest

from dpkd_jax import teacher as teacher_lib
from dpkd_jax.errors import UserError
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods import srr
from dpkd_jax.methods.dpdfd import generator_prior
from dpkd_jax.train import checkpoint
from dpkd_jax.train import records
from teacher_fixtures import retrain_in_place


def _config(teacher_dir, prior_dir=None, **kw):
  base = dict(dataset="digits", teacher_dirs=(teacher_dir,), student_model="lenet5_half",
              noise_multiplier=10.0, steps=2, batch_size=16, eval_every=2, latent_dim=8,
              generator_channels=8, pretrained_generator_dir=prior_dir)
  base.update(kw)
  return dpdfd.DPDFDConfig(**base)


def _teacher(config):
  """The run's one teacher as `train_dpdfd` hands it to `generator_prior` (no teacher axis)."""
  return dpdfd.load_teachers(config)[0].member(0)


def _save_prior(config, directory, *, steps=1, identity=None):
  """A pretraining checkpoint as `experiments.srr pretrain` writes it (params shifted by 1)."""
  generator = dpdfd.init_state(config, jax.random.key(7)).generator
  arrays = {"params": jax.tree.map(lambda v: v + 1.0, generator.params),
            "batch_stats": generator.batch_stats, "step": 0}
  identity = identity or generator_prior.identity(config, _teacher(config))
  meta = {"identity": identity, "config": {"steps": steps}, "step": 1}
  checkpoint.save(os.path.join(directory, "checkpoints"), 1, arrays, meta)
  return arrays


def _load(config):
  fresh = dpdfd.init_state(config, jax.random.key(0)).generator
  return generator_prior.load(config, fresh, _teacher(config))


def test_load_restores_the_pretrained_generator(teacher_dir, tmp_path):
  config = _config(teacher_dir, str(tmp_path))
  saved = _save_prior(config, str(tmp_path))
  loaded = _load(config)
  chex.assert_trees_all_close(loaded.params, saved["params"])
  assert int(loaded.step) == 0


@pytest.mark.parametrize("case, match", [
    ("missing", "holds no checkpoint"), ("other teacher", "other teacher weights than"),
    ("other architecture", "was pretrained for latent_dim=4, this run needs latent_dim=8"),
    ("path only", "before generators recorded their teacher's weights"),
    ("unfinished", "unfinished")])
def test_wrong_prior_is_one_user_error(teacher_dir, tmp_path, case, match):
  config = _config(teacher_dir, str(tmp_path))
  identity = generator_prior.identity(config, _teacher(config))
  if case == "other teacher":
    _save_prior(config, str(tmp_path), identity={**identity, "teacher_sha256": "0" * 64})
  elif case == "other architecture":
    _save_prior(config, str(tmp_path), identity={**identity, "latent_dim": 4})
  elif case == "path only":  # as saved before identities named the teacher by its weights
    old = {k: v for k, v in identity.items() if k != "teacher_sha256"}
    _save_prior(config, str(tmp_path),
                identity={**old, "teacher_dir": os.path.abspath(teacher_dir)})
  elif case == "unfinished":
    _save_prior(config, str(tmp_path), steps=5)
  with pytest.raises(UserError, match=match) as error:
    _load(config)
  assert "\n" not in str(error.value)
  if case == "path only":
    assert "pretrain the generator again" in str(error.value)


def test_the_teacher_is_known_by_its_weights_not_its_path(teacher_dir, tmp_path):
  prior = str(tmp_path / "prior")
  here = str(tmp_path / "teacher")
  shutil.copytree(teacher_dir, here)
  _save_prior(_config(here, prior), prior)
  # The same weights under another path: accepted.
  moved = str(tmp_path / "moved")
  shutil.copytree(here, moved)
  _load(_config(moved, prior))
  # The teacher retrained in place (same path, other weights): refused, naming the directory.
  retrain_in_place(here)
  with pytest.raises(UserError, match=re.escape(f"other teacher weights than {here!r}")) as error:
    _load(_config(here, prior))
  assert "\n" not in str(error.value) and "pretrain the generator again" in str(error.value)


def test_srr_and_dpdfd_name_the_same_teacher_alike(teacher_dir):
  """A generator pretrained by `experiments.srr pretrain` is the one DPDFD asks for."""
  config = _config(teacher_dir, "g")
  srr_config = srr.SRRConfig(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0,
                             latent_dim=config.latent_dim,
                             generator_channels=config.generator_channels)
  srr_identity = srr_config.generator_identity(teacher_lib.load_teacher(teacher_dir).parts)
  assert generator_prior.identity(config, _teacher(config)) == srr_identity
  assert "teacher_dir" not in srr_identity and len(srr_identity["teacher_sha256"]) == 64


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
