"""DP-SGD's config (`methods/dpsgd/config.py`): bad values fail at construction, flags make
the config."""

import dataclasses
import math
import os

import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.errors import UserError
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import config as config_lib
from dpkd_jax.models import core
from dpsgd_fixtures import make_config
from experiments import dpsgd as dpsgd_cli


@pytest.mark.parametrize("kwargs,match", [
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(noise_multiplier=None, target_epsilon=0.0), "target_epsilon"),
    (dict(noise_multiplier=None, target_epsilon=-1.0), "target_epsilon"),
    (dict(noise_multiplier=-0.5), "noise_multiplier"),
    (dict(target_epsilon=1.0), "exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=None), "exactly one of noise_multiplier and target_epsilon"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(l2_clip_norm=-1.0), "l2_clip_norm"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(model="gpt"), "unknown model"),
    (dict(norm="batch"), "BatchNorm mixes the examples"),
    (dict(norm="layer"), "norm must be one of"),
    (dict(steps=None), "exactly one of steps and epochs"),
    (dict(epochs=1.0), "exactly one of steps and epochs"),
    (dict(steps=0), "steps"),
    (dict(expected_batch_size=0), "expected_batch_size"),
    (dict(max_batch_size=8), "max_batch_size"),
    (dict(optimizer="lamb"), "optimizer"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(momentum=1.0), "momentum"),
    (dict(clipping="opacus"), "unknown clipping 'opacus'"),
    (dict(param_averaging_decay=1.0), r"param_averaging_decay must be in \[0, 1\)"),
    (dict(param_averaging_decay=-0.1), "param_averaging_decay"),
    (dict(param_averaging_decay=0.9, param_averaging_start_step=-1),
     "param_averaging_start_step"),
    (dict(param_averaging_start_step=10), "give param_averaging_decay > 0"),
])
def test_bad_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    make_config(**kwargs)


def test_cli_flags_make_the_config():
  config, args = dpsgd_cli.parse_config([
      "--dataset=digits", "--model=lenet5", "--target_epsilon=3", "--epochs=2",
      "--expected_batch_size=64", "--l2_clip_norm=0.5", "--resume", "--no-download"])
  assert config == dpsgd.DPSGDConfig(dataset="digits", model="lenet5", target_epsilon=3.0,
                                     epochs=2.0, expected_batch_size=64, l2_clip_norm=0.5)
  assert args.resume and args.workdir == os.path.join("runs", "dpsgd", "digits_lenet5")
  with pytest.raises(SystemExit):
    dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10", "--norm=batch"])


def test_cli_clipping_flag_makes_the_config(capsys):
  config, _ = dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10", "--clipping=ghost"])
  assert config.clipping == "ghost"
  assert dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10"])[0].clipping == "vmap"
  with pytest.raises(SystemExit):
    dpsgd_cli.parse_config(["--help"])
  assert "--clipping" in capsys.readouterr().out


def test_ghost_clipping_refuses_batch_norm_in_one_line():
  with pytest.raises(UserError, match="clipping='ghost' cannot train model='lenet5' with "
                     "norm='batch'.*nnx.BatchNorm conv1/norm: it mixes the examples") as err:
    config_lib.check_ghost_clipping("lenet5", norm="batch", info=data.DATASETS["mnist"])
  assert "\n" not in str(err.value)


class _OwnParam(nnx.Module):
  """A classifier with a parameter outside any Linear/Conv/norm layer: no ghost clipping."""

  def __init__(self, *, num_classes, input_shape, norm, rngs):
    del norm
    self.fc = nnx.Linear(math.prod(input_shape), num_classes, rngs=rngs)
    self.temperature = nnx.Param(jnp.ones(()))

  def __call__(self, x, *, train=False):
    y = self.fc(x.reshape(x.shape[0], -1)) * self.temperature
    return core.ClassifierOutput(y, y, y)


def test_unsupported_model_refused_at_construction_and_cli_exits_2(monkeypatch, capsys,
                                                                  tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setitem(models.CLASSIFIERS, "own_param", _OwnParam)
  vmap_config = make_config(model="own_param")  # the vmap path handles any model
  with pytest.raises(UserError, match="model='own_param'.*temperature of _OwnParam"):
    dataclasses.replace(vmap_config, clipping="ghost")
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_info:
    dpsgd_cli.main(["--model=own_param", "--clipping=ghost", "--noise_multiplier=1",
                    "--steps=1", "--workdir=never_created", "--no_progress"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
  assert err.startswith("error: clipping='ghost' cannot train model='own_param'")
  assert os.listdir(tmp_path) == []  # refused before the workdir or anything else


class _BatchCentred(_OwnParam):
  """Centres its inputs on the batch mean: example i's logits depend on every example."""

  def __init__(self, *, num_classes, input_shape, norm, rngs):
    del norm
    self.fc = nnx.Linear(math.prod(input_shape), num_classes, rngs=rngs)

  def __call__(self, x, *, train=False):
    h = x.reshape(x.shape[0], -1)
    y = self.fc(h - h.mean(axis=0))
    return core.ClassifierOutput(y, y, y)


def test_a_model_that_mixes_examples_is_refused_at_construction(monkeypatch):
  monkeypatch.setitem(models.CLASSIFIERS, "batch_centred", _BatchCentred)
  with pytest.raises(UserError, match="model='batch_centred'.*reduce_sum at .*"
                     "_BatchCentred.__call__.*reduces along the batch axis") as err:
    make_config(model="batch_centred", clipping="ghost")
  assert "\n" not in str(err.value)


def test_saved_json_of_a_default_config_is_unchanged():
  # `to_json` is what a workdir saves and compares on resume: a default (vmap) run saves the
  # dict of the configs saved before `clipping` (and `features`, `validation_examples`)
  # existed, so their workdirs keep resuming.
  config = make_config()
  later = ("clipping", "features", "validation_examples", "standardize_noise_multiplier",
           "standardize_mean_clip", "standardize_second_moment_clip", "lr_schedule",
           "param_averaging_decay", "param_averaging_start_step", "augmult",
           "augmult_max_shift", "secure_noise")
  saved_before = {k: v for k, v in dataclasses.asdict(config).items() if k not in later}
  assert config.to_json() == saved_before
  assert make_config(clipping="ghost").to_json() == {**saved_before, "clipping": "ghost"}
  assert make_config(param_averaging_decay=0.0).to_json() == saved_before
  assert make_config(param_averaging_decay=0.99, param_averaging_start_step=5).to_json() == {
      **saved_before, "param_averaging_decay": 0.99, "param_averaging_start_step": 5}
  assert make_config(augmult=0, augmult_max_shift=2).to_json() == saved_before


def test_cli_param_averaging_flags_make_the_config(capsys):
  config, _ = dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10",
                                      "--param_averaging_decay=0.99",
                                      "--param_averaging_start_step=3"])
  assert (config.param_averaging_decay, config.param_averaging_start_step) == (0.99, 3)
  default, _ = dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10"])
  assert default.param_averaging_decay == 0 and "param_averaging_decay" not in default.to_json()
  with pytest.raises(SystemExit):
    dpsgd_cli.parse_config(["--noise_multiplier=1", "--steps=10", "--param_averaging_decay=1"])
  with pytest.raises(SystemExit):
    dpsgd_cli.parse_config(["--help"])
  assert "bias-corrected" in capsys.readouterr().out
