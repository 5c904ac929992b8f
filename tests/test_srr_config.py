"""SRR config: every bad field fails at construction with a message naming it; the CLI turns
it into one line and exit status 2. The CLI's defaults leave every recorded command as it ran."""

import dataclasses
import glob
import importlib
import json
import math
import os
import shlex

import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config as srr_config
from experiments import srr as srr_cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_ENGINE_FIELDS = {f.name for f in dataclasses.fields(srr.EngineOptions)}  # nested options

def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16,
              stages=2, samples_per_stage=32, batch_size=16, student_epochs=2)
  base.update(kw)
  engine = {name: base.pop(name) for name in list(base) if name in _ENGINE_FIELDS}
  return srr.SRRConfig(**base, engine=srr.EngineOptions(**engine))


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=None), "give epsilon"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=math.inf, target_epsilon=5.0), "needs noisy labels"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(threshold=1.5), "threshold"),
    (dict(generator_prior="public"), "generator_prior"),
    (dict(first_prior="teacher"), "first_prior"),
    (dict(generator_channels=7), "generator_channels"),
    (dict(generator_prior="none", pretrained_generator_dir="x"), "never uses"),
    (dict(generator_terms=("ce", "norm")), "generator terms"),
    (dict(bn_weight=-1.0), "bn_weight"),
    (dict(samples_per_stage=40), "multiple of batch_size"),
    (dict(stages=0), "stages"),
    (dict(student_epochs=0), "student_epochs"),
    (dict(student_learning_rate=0.0), "student_learning_rate"),
    (dict(student_loss="mse"), "student_loss"),
    (dict(student_shift=-1), "student_shift"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(student_model="gpt"), "unknown student_model"),
    (dict(seed=-1), "seed"),
])
def test_bad_config_fails_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config("unused", **kwargs)


@pytest.mark.parametrize("argv,match", [
    (["--dataset=digits"], "--teacher_dir"),
    (["--dataset=digits", "--teacher_dir=x", "--epsilon=1", "--generator_terms=ce,xx"], "generator terms"),
    (["--dataset=digits", "--teacher_dir=x", "--epsilon=inf", "--target_epsilon=3"], "noisy labels"),
    (["pretrain", "--dataset=digits", "--teacher_dir=x", "--generator_prior=none"], "only generator_prior"),
    (["pretrain", "--dataset=digits", "--teacher_dir=x", "--generator_terms="], "at least one"),
])
def test_cli_rejects_bad_flags(argv, match, capsys):
  with pytest.raises(SystemExit) as exit_info:
    srr_cli.main(argv)
  assert exit_info.value.code == 2
  assert match in capsys.readouterr().err


def test_config_round_trips_through_its_json():
  config = _config("t", generator_terms=("ce", "bn"), threshold=0.2)
  saved = config.to_json()
  assert saved["generator_terms"] == ["ce", "bn"]  # JSON: a list, as checkpoints hold it
  assert srr.SRRConfig.from_json(saved) == config
  # Every field and the format's version (older forms: tests/test_srr_config_migration.py).
  assert list(saved) == ["version"] + [f.name for f in dataclasses.fields(config)]


def test_the_config_holds_no_resolved_privacy():
  # Only make_plan resolves ε per query: a target-only config has none of its own.
  config = _config("t", epsilon=None, target_epsilon=5.0)
  assert config.epsilon is None and not hasattr(config, "plan")
  assert not hasattr(config, "stage_config")


@pytest.mark.parametrize("epsilon, classes, noisy", [
    (1.0, 10, True),                # RR keeps the label with p = 0.23
    (2.0, 10, True),                # p = 0.45
    (math.log(9), 10, False),       # p = 1/2 exactly: not below
    (2.5, 10, False), (10.0, 10, False),
    (1.0, 2, False),                # two classes: p = 0.73 already at ε = 1
    (None, 10, False),              # calibrated from a target: unknown here
    (math.inf, 10, False),          # no noise
])
def test_labels_mostly_noise(epsilon, classes, noisy):
  assert srr_config.labels_mostly_noise(epsilon, classes) == noisy


def test_the_cli_points_to_the_noisy_label_recipe_and_merges_nothing(capsys):
  base = ["--dataset=mnist", "--teacher_dir=t"]
  default, _ = srr_cli.parse_config(base + ["--epsilon=1"])  # configs/srr/mnist_eps10.py
  assert "configs/srr/mnist_eps1.py is the engine measured there" in capsys.readouterr().out
  engine, _ = srr_cli.parse_config(base + ["--epsilon=10"])
  assert capsys.readouterr().out == ""
  assert dataclasses.replace(default, epsilon=10.0) == engine  # the same recipe file
  noisy, _ = srr_cli.parse_config(["--config=configs/srr/mnist_eps1.py", *base])
  assert capsys.readouterr().out == ""
  assert (noisy.student_learning_rate, noisy.stages, noisy.samples_per_stage, noisy.student_epochs,
          noisy.generator_epochs) == (3e-4, 16, 25600, 5, 0)
  given, _ = srr_cli.parse_config(["--config=configs/srr/mnist_eps1.py", *base,
                                   "--student_lr=0.001", "--stages=4"])  # the old name
  assert (given.student_learning_rate, given.stages, given.samples_per_stage) == (1e-3, 4, 25600)
  target, _ = srr_cli.parse_config(base + ["--target_epsilon=10"])
  assert (target.epsilon, target.target_epsilon, target.stages) == (None, 10.0, 4)


def test_recorded_commands_name_every_flag_the_cli_defaults_changed():
  # experiments.srr's default recipe (configs/srr/mnist_eps10.py) is not the config's defaults:
  # a recorded run made before it changed writes out what it ran with, so its command still
  # runs that.
  recipe = importlib.import_module("configs.srr.mnist_eps10").get_config()
  changed = {f.name for f in dataclasses.fields(recipe) if f.name != "engine"
             and getattr(recipe, f.name) != getattr(srr.SRRConfig, f.name, None)}
  options = srr.EngineOptions()  # the engine's options are flat flags too
  changed |= {f.name for f in dataclasses.fields(options)
              if getattr(recipe.engine, f.name) != getattr(options, f.name)}
  changed -= {"dataset", "teacher_dir", "epsilon"}  # every recorded command names them
  checked = 0
  for path in sorted(glob.glob(os.path.join(_REPO, "docs", "results", "srr__*.json"))):
    argv = shlex.split(json.load(open(path, encoding="utf-8"))["command"])
    tail = argv[argv.index("experiments.srr") + 1:]
    pretrain = tail[:1] == ["pretrain"]
    given = {flag.split("=")[0].lstrip("-") for flag in tail}
    needed = {"generator_channels"} if pretrain else changed
    assert needed <= given, (path, needed - given)
    srr_cli.parse_config(tail[1:] if pretrain else tail, pretrain_only=pretrain)
    checked += 1
  assert checked >= 20


def test_validation_examples_is_checked_and_saved():
  assert _config("t").to_json()["validation_examples"] == 0
  assert _config("t", validation_examples=50).to_json()["validation_examples"] == 50
  with pytest.raises(ValueError, match="validation_examples"):
    _config("t", validation_examples=-1)
