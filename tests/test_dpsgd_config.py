"""DP-SGD's config (`methods/dpsgd/config.py`): bad values fail at construction, flags make
the config."""

import os

import pytest

from dpkd_jax.methods import dpsgd
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
