"""SRR config: every bad field fails at construction with a message naming it; the CLI turns
it into one line and exit status 2. The CLI's defaults leave every recorded command as it ran."""

import glob
import json
import math
import os
import shlex

import pytest

from dpkd_jax.methods import srr
from dpkd_jax.methods.srr import config as srr_config
from experiments import srr as srr_cli

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(teacher_dir, **kw):
  base = dict(dataset="digits", teacher_dir=teacher_dir, epsilon=1.0, student_model="lenet5",
              generator_channels=8, latent_dim=8, pretrain_steps=2, pretrain_batch_size=16,
              stages=2, samples_per_stage=32, batch_size=16, student_epochs=2)
  base.update(kw)
  return srr.SRRConfig(**base)


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
    (dict(student_lr=0.0), "student_lr"),
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
def test_the_cli_changes_its_engine_where_most_first_stage_labels_are_noise(epsilon, classes,
                                                                           noisy):
  assert srr_config.labels_mostly_noise(epsilon, classes) == noisy
  expected = srr_config.NOISY_LABELS_CLI_DEFAULTS if noisy else {}
  assert srr_config.cli_noisy_label_defaults(epsilon, classes) == expected


def test_cli_picks_the_engine_by_epsilon_unless_given():
  base = ["--dataset=mnist", "--teacher_dir=t"]
  parse = lambda argv: srr_cli.parse_config(base + argv)[0]  # noqa: E731
  noisy = parse(["--epsilon=1"])
  for name, value in srr_config.NOISY_LABELS_CLI_DEFAULTS.items():
    assert getattr(noisy, name) == value, name
  clean = parse(["--epsilon=10"])
  assert clean.student_lr == srr.SRRConfig.student_lr
  for name in ("stages", "samples_per_stage", "student_epochs"):
    assert getattr(clean, name) == srr_config.CLI_DEFAULTS[name], name
  assert clean.generator_epochs == srr.SRRConfig.generator_epochs
  # A flag given at the config's or CLI's default still wins over the noisy-label engine.
  given = parse(["--epsilon=1", "--student_lr=0.001", "--stages=4"])
  assert (given.student_lr, given.stages, given.samples_per_stage) == (1e-3, 4, 25600)
  assert parse(["--epsilon=10", "--student_lr=0.0003"]).student_lr == 3e-4
  target = parse(["--target_epsilon=10"])
  assert (target.student_lr, target.stages) == (srr.SRRConfig.student_lr, 4)


def test_recorded_commands_name_every_flag_the_cli_defaults_changed():
  # experiments.srr's defaults (CLI_DEFAULTS) are not the config's: a recorded run made
  # before they changed writes out what it ran with, so its command still runs that.
  checked = 0
  for path in sorted(glob.glob(os.path.join(_REPO, "docs", "results", "srr__*.json"))):
    argv = shlex.split(json.load(open(path, encoding="utf-8"))["command"])
    tail = argv[argv.index("experiments.srr") + 1:]
    pretrain = tail[:1] == ["pretrain"]
    given = {flag.split("=")[0].lstrip("-") for flag in tail}
    needed = {"generator_channels"} if pretrain else set(srr_config.CLI_DEFAULTS)
    assert needed <= given, (path, needed - given)
    config, _ = srr_cli.parse_config(tail[1:] if pretrain else tail, pretrain_only=pretrain)
    # What the CLI picks by ε (cli_noisy_label_defaults) is written
    # out wherever it differs from what the run ran with.
    if not pretrain and config.student_lr != srr.SRRConfig.student_lr:
      assert "student_lr" in given, path
    if not pretrain:
      assert set(srr_config.NOISY_LABELS_CLI_DEFAULTS) - {"student_lr", "generator_epochs"} \
          <= given, path
      noisy = srr_config.cli_noisy_label_defaults(config.epsilon, config.info.num_classes)
      if noisy and "generator_epochs" not in given:  # ran before the default: fine-tuned
        raise AssertionError(f"{path}: add --generator_epochs=1, which it ran with")
    checked += 1
  assert checked >= 20


def test_validation_examples_is_checked_and_saved_only_when_set():
  assert "validation_examples" not in _config("t").to_json()
  assert _config("t", validation_examples=50).to_json()["validation_examples"] == 50
  with pytest.raises(ValueError, match="validation_examples"):
    _config("t", validation_examples=-1)
