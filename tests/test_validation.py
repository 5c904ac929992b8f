"""Shared parameter checks of dpkd_jax.privacy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import validation


def test_check_int():
  assert validation.check_int("steps", np.int64(3), minimum=0) == 3
  for bad in (True, 2.5, "3", None):
    with pytest.raises(ValueError, match="steps must be an integer"):
      validation.check_int("steps", bad, minimum=0)
  with pytest.raises(ValueError, match="k must be >= 2, got 1"):
    validation.check_int("k", 1, minimum=2)


@pytest.mark.parametrize("value,positive,allow_inf,ok", [
    (1.0, True, False, True), (0.0, True, False, False), (0.0, False, False, True),
    (-1e-9, False, False, False), (math.nan, False, False, False),
    (math.inf, True, False, False), (math.inf, True, True, True), (-math.inf, True, True, False),
])
def test_check_float(value, positive, allow_inf, ok):
  if ok:
    assert validation.check_float("sigma", value, positive=positive, allow_inf=allow_inf) == value
  else:
    with pytest.raises(ValueError, match="sigma must be"):
      validation.check_float("sigma", value, positive=positive, allow_inf=allow_inf)


def test_check_float_rejects_non_numbers_and_skips_tracers():
  with pytest.raises(ValueError, match="must be a number"):
    validation.check_float("C", "big", positive=True)
  seen = []
  jax.jit(lambda c: seen.append(validation.check_float("C", c, positive=True)) or c)(jnp.float32(-1))
  assert seen == [None]  # traced: unknown at trace time, not checked


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 2.0, math.nan])
def test_check_delta_rejects_outside_open_unit_interval(delta):
  with pytest.raises(ValueError, match="delta must be"):
    validation.check_delta(delta)
  assert validation.check_delta(1e-5) == 1e-5


def _renamed_calls():
  """(name, call(**bound keyword)) of every public privacy function whose norm bound took the
  library's name `l2_clip_norm`, on fixed inputs (same key: same draws). `sanitize`'s old name
  was `l2_bound`: its call takes `l2_norm_bound` as that."""
  # pylint: disable=import-outside-toplevel
  from dpkd_jax.privacy import dpdfd_update
  from dpkd_jax.privacy import mechanisms
  from dpkd_jax.privacy import paper_accounting
  from dpkd_jax.privacy import query_model_releases
  key, rows = jax.random.key(0), jnp.arange(12.0).reshape(4, 3) / 10.0
  return [
      ("normalize_rows", lambda **kw: mechanisms.normalize_rows(rows, **kw)),
      ("output_gradient_mechanism", lambda **kw: mechanisms.output_gradient_mechanism(
          key, rows, noise_multiplier=1.0, **kw).noisy),
      ("multi_teacher_output_gradients", lambda **kw: (
          mechanisms.multi_teacher_output_gradients(key, rows[None], noise_multiplier=1.0,
                                                    **kw).noisy)),
      ("second_moment_release", lambda **kw: query_model_releases.second_moment_release(
          key, rows, constant=1.0, noise_multiplier=1.0, **kw)),
      ("paper_dpdfd_epsilon", lambda **kw: paper_accounting.paper_dpdfd_epsilon(
          noise_multiplier=5.0, steps=10, delta=1e-5, **kw)),
      ("dpdfd_plan", lambda **kw: dpdfd_update.dpdfd_plan(
          batch_size=4, steps=3, delta=1e-5, noise_multiplier=2.0, **kw)),
      ("sanitize", lambda **kw: mechanisms.sanitize(
          key, rows, noise_multiplier=1.0,
          **{("l2_bound" if k == "l2_norm_bound" else k): v for k, v in kw.items()}).noisy),
  ]


@pytest.mark.filterwarnings("ignore::dpkd_jax.privacy.paper_accounting.PaperAccountingWarning")
@pytest.mark.parametrize("index", range(7))
def test_the_old_bound_keyword_is_deprecated_and_computes_the_same(index):
  # As optax and jax_privacy deprecate an argument: the old name works for one release with a
  # DeprecationWarning naming the new one; both names at once are refused.
  name, call = _renamed_calls()[index]
  new = call(l2_clip_norm=0.5)
  old_name = "l2_bound" if name == "sanitize" else "l2_norm_bound"
  with pytest.warns(DeprecationWarning, match=f"{name}\\(\\): '{old_name}' is deprecated, "
                                              "use 'l2_clip_norm'"):
    old = call(l2_norm_bound=0.5)
  if isinstance(new, jax.Array):
    np.testing.assert_array_equal(np.asarray(old), np.asarray(new))
  else:
    assert old == new
  with pytest.raises(TypeError, match=f"deprecated name '{old_name}'"):
    call(l2_clip_norm=0.5, l2_norm_bound=0.5)


def test_a_plan_still_reads_its_old_bound_name():
  from dpkd_jax.privacy import dpdfd_update  # pylint: disable=import-outside-toplevel
  plan = dpdfd_update.dpdfd_plan(batch_size=4, steps=3, delta=1e-5, noise_multiplier=2.0,
                                 l2_clip_norm=0.5)
  assert "l2_norm_bound" not in plan.to_json() and plan.to_json()["l2_clip_norm"] == 0.5
  with pytest.warns(DeprecationWarning, match="use l2_clip_norm"):
    assert plan.l2_norm_bound == 0.5
  assert dpdfd_update.dpdfd_plan(batch_size=4, steps=3, delta=1e-5,
                                 noise_multiplier=2.0).l2_clip_norm == 1.0  # the default C
