"""RONA's config: one-line errors for bad fields and flags; flags reach the config; the config
never invents a σ."""

import os

import pytest

from dpkd_jax.methods import rona
from experiments import rona as rona_cli


def _config(**kw):
  base = dict(noise_multiplier=2.0, dataset="digits", teacher_model="lenet5_half",
              student_model="lenet5_half", teacher_epochs=1, teacher_batch_size=64,
              hint_epochs=1, rounds=1, self_learning_epochs=1, distillation_epochs=1,
              num_query_samples=64, batch_size=32, self_learning_batch_size=64, seed=0)
  base.update(kw)
  return rona.RONAConfig(**base)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=None), "exactly one of noise_multiplier and target_epsilon"),
    (dict(target_epsilon=3.0), "exactly one of noise_multiplier and target_epsilon"),
    (dict(noise_multiplier=-1.0), "noise_multiplier must be"),
    (dict(bound_mode="none"), "needs noise_multiplier=0"),
    (dict(bound_mode="fixed", hint_l2_clip_norm=1.0), "l2_clip_norm exactly"),
    (dict(distill_l2_clip_norm=1.0), "l2_clip_norm exactly"),
    (dict(bound_mode="fixed", hint_l2_clip_norm=1.0, distill_l2_clip_norm=1.0, aux_teacher_dir="x"),
     "only used by the adaptive bound"),
    (dict(delta=1.5), "delta"),
    (dict(dataset="imagenet"), "unknown dataset 'imagenet'"),
    (dict(student_model="gpt"), "unknown student_model 'gpt'"),
    (dict(teacher_model="compact_5k"), "unknown teacher_model"),
    (dict(query_selection="entropy"), "unknown query_selection"),
    (dict(student_norm="layer"), "student_norm"),
    (dict(public_fraction=1.0), "public_fraction"),
    (dict(num_query_samples=0), "num_query_samples must be >= 1"),
    (dict(rounds=-1), "rounds must be >= 0"),
    (dict(rounds=0), "rounds must be >= 1: with rounds=0 the student's classifier is never"),
    (dict(self_learning_epochs=0, distillation_epochs=0), "would never be trained"),
    (dict(temperature=0.0), "temperature must be"),
    (dict(seed=-3), "seed must be >= 0"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config(**kwargs)


@pytest.mark.parametrize("argv,match", [
    (["--dataset=digits"], "exactly one of noise_multiplier"),
    (["--dataset=digits", "--noise_multiplier=1", "--rounds=0"], "rounds must be >= 1"),
    (["--dataset=digits", "--noise_multiplier=1", "--bound_mode=none"], "noise_multiplier=0"),
    (["--dataset=digits", "--target_epsilon=1", "--query_selection=x"], "unknown query_selection"),
])
def test_cli_rejects_bad_flags(argv, match, capsys):
  with pytest.raises(SystemExit) as exit_info:
    rona_cli.main(argv)
  assert exit_info.value.code == 2
  assert match in capsys.readouterr().err


def test_cli_flags_reach_the_config():
  config, args = rona_cli.parse_config(["--dataset=digits", "--target_epsilon=7.68",
                                        "--public_fraction=0.8", "--student_model=compact_10k",
                                        "--bound_mode=fixed", "--hint_l2_clip_norm=5",
                                        "--distill_l2_clip_norm=0.5", "--seed=3"])
  assert config == rona.RONAConfig(dataset="digits", target_epsilon=7.68, public_fraction=0.8,
                                   student_model="compact_10k", bound_mode="fixed",
                                   hint_l2_clip_norm=5.0, distill_l2_clip_norm=0.5, seed=3)
  assert args.workdir == os.path.join("runs", "rona", "digits_compact_10k")


def test_config_holds_no_sigma_of_its_own():
  config = _config(noise_multiplier=None, target_epsilon=3.0)
  assert config.noise_multiplier is None  # σ is resolved by make_plan only
  assert not any(name.startswith("sanitize") for name in dir(config))
  with pytest.raises(ValueError, match="needs noise_multiplier=0.*target_epsilon=3.0"):
    _config(noise_multiplier=None, target_epsilon=3.0, bound_mode="none")


def test_bound_errors_name_the_flag():
  with pytest.raises(ValueError, match="give distill_l2_clip_norm exactly with bound_mode='fixed'"):
    _config(bound_mode="fixed", hint_l2_clip_norm=1.0)
  with pytest.raises(ValueError, match="hint_l2_clip_norm must be"):
    _config(bound_mode="fixed", hint_l2_clip_norm=-1.0, distill_l2_clip_norm=1.0)


def test_cli_paper_accounting_without_target_is_one_line_exit_2(capsys):
  with pytest.raises(SystemExit) as exit_info:
    rona_cli.main(["--dataset=mnist", "--accounting=paper", "--noise_multiplier=1"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: accounting='paper' chooses sigma for target_epsilon: give "
                 "target_epsilon, not noise_multiplier"]


def test_validation_examples_is_checked():
  assert _config(validation_examples=10).validation_examples == 10
  with pytest.raises(ValueError, match="validation_examples"):
    _config(validation_examples=-1)
