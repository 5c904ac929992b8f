"""dpkd_jax.methods.dpdfd.release: a finished run's synthetic data, and wrong workdirs."""

import json
import os

import jax
import numpy as np
import pytest

from dpkd_jax import errors
from dpkd_jax.methods import dpdfd
from dpkd_jax.train import checkpoint


def _saved_run(workdir):
  """A DPDFD workdir holding one checkpoint (the initial state: no teacher needed)."""
  config = dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=("unused",),
                             student_model="lenet5_half", noise_multiplier=10.0, steps=2,
                             batch_size=16, latent_dim=8, generator_channels=8)
  state = dpdfd.init_state(config, jax.random.key(0))
  checkpoint.save(os.path.join(workdir, "checkpoints"), 0, state.arrays(),
                  {"config": config.to_json(), "step": 0})
  return config


def test_sample_release(tmp_path):
  config = _saved_run(str(tmp_path))
  dpdfd.check_run(str(tmp_path))
  restored, _, meta = dpdfd.load_run(str(tmp_path))
  assert restored == config and meta["step"] == 0
  path = dpdfd.sample(str(tmp_path), 37, seed=0, out_path=str(tmp_path / "syn.npz"))
  with np.load(path) as d:
    assert d["x"].shape == (37, 28, 28, 1) and d["x"].dtype == np.uint8
    assert d["y"].shape == (37,) and d["y"].min() >= 0 and d["y"].max() < 10
  with pytest.raises(ValueError, match="num must be >= 1"):
    dpdfd.sample(str(tmp_path), 0, seed=0)


def test_check_run_refuses_what_is_not_a_dpdfd_run(tmp_path):
  with pytest.raises(errors.UserError, match="does not exist"):
    dpdfd.check_run(str(tmp_path / "typo"))
  (tmp_path / "card.json").write_text(json.dumps({"model": "lenet5"}))
  with pytest.raises(errors.UserError, match="teacher's workdir"):
    dpdfd.check_run(str(tmp_path))
  os.remove(tmp_path / "card.json")
  with pytest.raises(errors.UserError, match="holds no checkpoint"):
    dpdfd.check_run(str(tmp_path))
  checkpoint.save(str(tmp_path / "checkpoints"), 0, {"w": np.zeros(2)}, {"step": 0})
  with pytest.raises(errors.UserError, match="not a DPDFD run"):
    dpdfd.check_run(str(tmp_path))
