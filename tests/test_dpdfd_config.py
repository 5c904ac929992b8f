"""dpkd_jax.methods.dpdfd.config: both modes' configs are validated once and invent nothing."""

import dataclasses

import pytest
from dpdfd_fixtures import dpdfd_config

from dpkd_jax import errors
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import config as config_lib


def _config(**kw):
  base = dict(dataset="digits", teacher_dirs=("unused",), student_model="lenet5_half",
              noise_multiplier=10.0, steps=4, batch_size=16, eval_every=2, latent_dim=8)
  return dpdfd_config(**{**base, **kw})  # the engine's options to `engine`, as the CLI


def _direct(**kw):
  base = dict(dataset="digits", model="lenet5_half", noise_multiplier=0.0,
              expected_batch_size=16, max_batch_size=24, steps=3, eval_every=3, seed=0)
  return dpdfd.DirectConfig(**{**base, **kw})


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0, target_epsilon=1.0), "needs noise"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(stability=-1e-3), "stability"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(accounting="moments"), "accounting"),
    (dict(bound_method="scale"), "bound_method"),
    (dict(student_loss="l2"), "student_loss"),
    (dict(one_hot_weight=-1.0), "one_hot_weight"),
    (dict(entropy_weight=-0.5), "entropy_weight"),
    (dict(dataset="imagenet"), "unknown dataset"),
    (dict(student_model="gpt"), "unknown student_model"),
    (dict(teacher_dirs=()), "teacher_dirs"),
    (dict(noise_multiplier=None, target_epsilon=None), "noise_multiplier, target_epsilon"),
    (dict(steps=0), "steps"),
    (dict(gamma=0.0), "gamma"),
    (dict(seed=-1), "seed"),
    (dict(teacher_loss="kl"), "teacher_loss"),
    (dict(generator_objective="dfad"), "generator_objective"),
    (dict(generator_objective="disagreement"), "bound_method='clip'"),  # normalised rows
    (dict(generator_objective="disagreement", bound_method="clip", probe_directions=0),
     "probe_directions"),
    (dict(probe_step=0.0), "probe_step"),
    (dict(diversity_weight=1.0), "entropy_weight"),  # the paper generator has its own term
    (dict(generator_objective="disagreement", bound_method="clip", diversity_weight=-1.0),
     "diversity_weight"),
    (dict(teacher_loss_scale=0.0), "teacher_loss_scale"),
])
def test_bad_config_fails_at_construction(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _config(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(l2_clip_norm=0.0), "l2_clip_norm"),
    (dict(norm="batch"), "norm"),
    (dict(dataset="nope"), "unknown dataset"),
    (dict(max_batch_size=8), "max_batch_size"),
    (dict(delta=1.0), "delta"),
    (dict(student_loss="l2"), "student_loss"),
    (dict(bound_method="scale"), "bound_method"),
])
def test_bad_direct_config_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _direct(**kwargs)


def test_the_config_never_invents_a_sigma():
  # DPDFDConfig.step_config() used to put sigma = 1.0 in a step when only a target epsilon was
  # given; sigma now exists only in the plan, resolved by make_plan.
  config = _config(noise_multiplier=None, target_epsilon=5.0)
  assert config.noise_multiplier is None
  assert not any(hasattr(config, name) for name in ("step_config", "plan"))
  assert dpdfd.make_plan(config).noise_multiplier > 1.0


def test_both_modes_check_the_shared_mechanism_fields_in_one_place(monkeypatch):
  seen = []
  monkeypatch.setattr(config_lib, "check_output_gradient_fields", seen.append)
  _config()
  _direct()
  assert [type(c).__name__ for c in seen] == ["DPDFDConfig", "DirectConfig"]


def test_to_json_is_the_saved_config():
  config = _config(teacher_dirs=["a", "b"])
  assert config.teacher_dirs == ("a", "b")
  out = config.to_json()
  assert out["teacher_dirs"] == ["a", "b"]
  # Every field, the engine's options nested, and the format's version (older forms:
  # tests/test_dpdfd_config_migration.py).
  assert list(out) == ["version"] + [f.name for f in dataclasses.fields(config)]
  assert out["engine"] == dataclasses.asdict(dpdfd.EngineOptions())
  assert dpdfd.DPDFDConfig.from_json(out) == config
  stacked = _config(teacher_dirs=(), teacher_ensemble_dir="ens")
  assert stacked.to_json()["teacher_ensemble_dir"] == "ens"
  assert dpdfd.DPDFDConfig.from_json(stacked.to_json()) == stacked


def test_the_engine_options_are_one_nested_object():
  config = _config(generator_objective="disagreement", bound_method="clip", replay_size=32)
  assert config.engine == dpdfd.EngineOptions(generator_objective="disagreement",
                                              replay_size=32)
  assert config.probes_per_sample == config.engine.probes_per_sample == 1
  assert _config().engine == dpdfd.EngineOptions()  # off: the paper's Algorithm 1
  with pytest.raises(ValueError, match="engine must be an EngineOptions"):
    dpdfd.DPDFDConfig(dataset="digits", teacher_dirs=("t",), noise_multiplier=1.0,
                      engine={"replay_size": 32})


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(teacher_ensemble_dir="ens"), errors.UserError,
     "give --teacher_dirs or --teacher_ensemble_dir, not both"),
    (dict(teacher_dirs=(), teacher_ensemble_dir=""), errors.UserError, "is empty"),
    (dict(teacher_dirs=(), teacher_ensemble_dir="ens", pretrained_generator_dir="g"),
     ValueError, "exactly one teacher"),
])
def test_the_teachers_come_from_one_source(kwargs, error, match):
  with pytest.raises(error, match=match):
    _config(**kwargs)


def test_validation_examples_is_checked_and_saved():
  assert _config().to_json()["validation_examples"] == 0
  assert _config(validation_examples=300).to_json()["validation_examples"] == 300
  with pytest.raises(ValueError, match="validation_examples"):
    _config(validation_examples=-1)
