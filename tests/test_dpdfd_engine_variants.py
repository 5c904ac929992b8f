"""The engine-variant harness (`benchmarks/dpdfd_engine_variants.py`): it runs each
variant and records epsilon = inf whenever a variant reads the teacher without noise."""

import importlib.util
import json
import math
import pathlib
import sys

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "dpdfd_engine_variants.py"


def _harness():
  spec = importlib.util.spec_from_file_location("dpdfd_engine_variants", _PATH)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("flags, finite", [
    (["--noise_multiplier=1"], True),
    (["--noise_multiplier=1", "--generator_objective=teacher"], False),  # reads the teacher
    (["--teacher_loss=logit", "--replay=2", "--replay_steps=1", "--ema=0.9", "--tv_weight=0.1",
      "--generator_every=2"], False),  # sigma = 0
    # The probes' rows are not in the harness's plan: never a finite (under-counted) epsilon.
    (["--noise_multiplier=1", "--generator_objective=zeroth_order", "--teacher_loss=logit",
      "--bound_method=clip", "--zo_directions=2", "--student_steps_loss=l1"], False),
])
def test_variants_run_and_record_their_epsilon(teacher_dir, tmp_path, flags, finite):
  out = tmp_path / "run"
  _harness().main([f"--teacher={teacher_dir}", "--steps=2", "--eval_every=1", "--batch_size=8",
                   "--generator_channels=4", f"--out={out}", *flags])
  record = json.loads((out / "record.json").read_text())
  assert (record["sound_epsilon"] != "inf") == finite
  assert record["sound_epsilon"] == "inf" or math.isfinite(record["sound_epsilon"])
  assert (out / "metrics.csv").read_text().count("test/accuracy") == 2


def test_unknown_variant_is_refused():
  with pytest.raises(ValueError, match="teacher_loss"):
    _harness().Variant(teacher_loss="hinge")


def test_zeroth_order_direction_estimates_the_gradient_of_a_known_disagreement():
  """With many directions the forward-difference estimate points along ∇D (cosine ≈ 1)."""
  import jax
  import jax.numpy as jnp
  harness = _harness()
  variant = harness.Variant(generator_objective="zeroth_order", teacher_loss="logit",
                            zo_directions=4096, zo_step=1e-3)
  x = jax.random.normal(jax.random.key(0), (2, 3, 3, 1))
  w = jax.random.normal(jax.random.key(1), (9, 4))
  teacher_logits = lambda v: v.reshape(v.shape[0], -1) @ w  # a linear "teacher", s = 0

  class _Plan:
    pass

  def fake_release(plan, key, rows):  # sigma = 0: the rows themselves
    del plan, key
    return type("R", (), {"noisy": rows})()

  def disagreement(v):
    return jnp.abs(teacher_logits(v)).sum()

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(harness.step_lib, "release_rows", fake_release)
    patch.setattr(harness.core, "apply", lambda *args, train: (
        type("O", (), {"logits": teacher_logits(args[-1]) if len(args) == 2
                       else jnp.zeros((args[-1].shape[0], 4))})(), None))
    config = type("C", (), {"gamma": 1.0})()
    student = type("S", (), {"graphdef": None, "params": None, "batch_stats": None})()
    rows_x = -teacher_logits(x)  # logit rows s - t with s = 0
    got = harness._disagreement_direction(variant, config, _Plan(), ("teacher",), student, x,
                                          rows_x, jax.random.key(2))
  want = jax.grad(disagreement)(x)
  for g, e in zip(got, want):
    cosine = jnp.vdot(g, e) / (jnp.linalg.norm(g) * jnp.linalg.norm(e))
    assert float(cosine) > 0.9
