"""Tests of `dfpate.config.DFPATEConfig`: every field is validated with one clear message."""

import pytest

from dpkd_jax.methods import dfpate

_TINY = dict(dataset="digits", num_teachers=4, teacher_epochs=1, teacher_batch_size=32,
             rounds=2, queries_per_round=16, pool_factor=2, student_model="lenet5_half",
             student_epochs=1, student_batch_size=16, seed=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"dataset": "nope"}, "dataset"),
    ({"teacher_model": "nope"}, "teacher_model"),
    ({"student_model": "nope"}, "student_model"),
    ({"votes": "mean"}, "votes"),
    ({"target": "kl"}, "target"),
    ({"num_teachers": 0}, "num_teachers"),
    ({"rounds": 0}, "rounds"),
    ({"margin_threshold": 2.0}, "margin_threshold"),
    ({"target_epsilon": None, "noise_std": None}, "target_epsilon"),
    ({"target_epsilon": -1.0}, "target_epsilon"),
    ({"noise_std": -1.0}, "noise_std"),
    ({"delta": 1.0}, "delta"),
    ({"invert_probability": 2.0}, "invert_probability"),
    ({"seed": -1}, "seed"),
    ({"query_source": "web"}, "query_source"),
    ({"query_model_noise": 0.0}, "query_model_noise"),
    ({"query_model_components": 0}, "query_model_components"),
    ({"student_pseudo_threshold": 1.5}, "student_pseudo_threshold"),
    ({"teacher_learning_rate": 0.0}, "teacher_learning_rate"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    dfpate.DFPATEConfig(**{**_TINY, **kwargs})


def test_validation_examples_is_checked_and_keys_the_saved_teachers():
  # A hold-out changes what the teachers trained on: a saved ensemble is reused only by runs
  # holding out the same records.
  plain = dfpate.DFPATEConfig(**_TINY)
  held = dfpate.DFPATEConfig(**{**_TINY, "validation_examples": 20})
  assert "validation_examples" not in plain.teacher_identity()
  assert held.teacher_identity()["validation_examples"] == 20
  with pytest.raises(ValueError, match="validation_examples"):
    dfpate.DFPATEConfig(**{**_TINY, "validation_examples": -1})
