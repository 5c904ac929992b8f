"""Tests for dpkd_jax.privacy.mechanisms: bounds, noise statistics, transforms, validation."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import mechanisms

C = 2.0  # l2 bound used throughout
SIGMA = 1.5

# Every Gaussian mechanism as `f(key, x)`, with the bounded (noise-free) part it must equal at
# sigma = 0, an input shape, and the expected noise std / sensitivity / accounting multiplier.
MECHANISMS = {
    "output_grad_normalize": dict(
        fn=functools.partial(mechanisms.output_gradient_mechanism, l2_clip_norm=C,
                             noise_multiplier=SIGMA, method="normalize"),
        bounded=lambda x: mechanisms.normalize_rows(x, C, 1e-6),
        shape=(6, 5), stddev=SIGMA * C, sensitivity=2 * C * math.sqrt(6),
        multiplier=SIGMA / (2 * math.sqrt(6))),
    "output_grad_clip": dict(
        fn=functools.partial(mechanisms.output_gradient_mechanism, l2_clip_norm=C,
                             noise_multiplier=SIGMA, method="clip"),
        bounded=lambda x: mechanisms.clip_rows(x, C),
        shape=(6, 5), stddev=SIGMA * C, sensitivity=2 * C * math.sqrt(6),
        multiplier=SIGMA / (2 * math.sqrt(6))),
    "multi_teacher": dict(
        fn=functools.partial(mechanisms.multi_teacher_output_gradients, l2_clip_norm=C,
                             noise_multiplier=SIGMA),
        bounded=lambda x: jnp.mean(jax.vmap(lambda g: mechanisms.normalize_rows(g, C))(x), 0),
        shape=(3, 6, 5), stddev=SIGMA * C / 3, sensitivity=2 * C * math.sqrt(6) / 3,
        multiplier=SIGMA / (2 * math.sqrt(6))),
    "sanitize": dict(
        fn=functools.partial(mechanisms.sanitize, l2_clip_norm=C, noise_multiplier=SIGMA),
        bounded=lambda x: mechanisms.clip_rows(x[None], C)[0],
        shape=(6, 5), stddev=SIGMA * C, sensitivity=2 * C, multiplier=SIGMA / 2),
}


def _input(shape, seed=1):
  return 3.0 * jax.random.normal(jax.random.key(seed), shape)


def _row_norms(x):
  return np.linalg.norm(np.asarray(x, np.float64).reshape(x.shape[0], -1), axis=1)


# Rows of very different scales: ordinary, huge (sum of squares overflows float32), tiny
# (sum of squares underflows), exactly zero, and a (B, 2, 3) trailing shape.
SCALED_ROWS = jnp.array([[3.0, 4.0, 0.0], [1e30, -1e30, 1e30], [1e-30, 2e-30, 0.0],
                         [0.0, 0.0, 0.0], [0.1, 0.2, 0.3], [-50.0, 0.0, 1.0]], jnp.float32)


@pytest.mark.parametrize("bound", [1e-3, 1.0, 1e4])
def test_normalize_rows_norms_are_bounded_and_scale_free(bound):
  out = mechanisms.normalize_rows(SCALED_ROWS, bound, 1e-6)
  norms = _row_norms(out)
  # float32 rounding may exceed the bound by a few ulps; relative tolerance 1e-6.
  assert np.all(norms <= bound * (1 + 1e-6))
  # Huge and ordinary rows are normalized to ~bound (|x| >> e), zero rows stay zero.
  np.testing.assert_allclose(norms[[0, 1, 5]], bound, rtol=1e-5)
  assert norms[3] == 0.0
  # Direction preserved: x_i / ||x_i|| (computed in float64).
  np.testing.assert_allclose(np.asarray(out[1]) / bound, np.array([1, -1, 1]) / math.sqrt(3),
                             rtol=1e-5)


@pytest.mark.parametrize("bound", [1e-3, 1.0, 1e4])
def test_clip_rows_norms_are_bounded_and_short_rows_unchanged(bound):
  out = mechanisms.clip_rows(SCALED_ROWS, bound)
  norms = _row_norms(out)
  input_norms = np.linalg.norm(np.asarray(SCALED_ROWS, np.float64), axis=1)
  assert np.all(norms <= bound * (1 + 1e-6))
  np.testing.assert_allclose(norms, np.minimum(input_norms, bound), rtol=1e-5)
  short = input_norms <= bound
  np.testing.assert_array_equal(np.asarray(out)[short], np.asarray(SCALED_ROWS)[short])


@pytest.mark.parametrize("bounder", ["normalize", "clip"])
def test_trailing_axes_are_flattened_for_the_norm(bounder):
  x = _input((4, 2, 3))
  fn = mechanisms.ROW_BOUNDERS[bounder]
  np.testing.assert_allclose(fn(x, 1.0, 0.0).reshape(4, 6), fn(x.reshape(4, 6), 1.0, 0.0),
                             rtol=1e-6)


@pytest.mark.parametrize("bounder", ["normalize", "clip"])
@pytest.mark.parametrize("bad_value", [jnp.nan, jnp.inf, -jnp.inf])
def test_non_finite_row_is_zeroed_without_poisoning_others(bounder, bad_value):
  fn = mechanisms.ROW_BOUNDERS[bounder]
  x = _input((5, 4))
  poisoned = x.at[2, 1].set(bad_value)
  out = fn(poisoned, C, 1e-6)
  chex.assert_tree_all_finite(out)
  np.testing.assert_array_equal(out[2], np.zeros(4))
  keep = np.array([0, 1, 3, 4])
  np.testing.assert_array_equal(out[keep], fn(x[keep], C, 1e-6))


def test_normalize_with_zero_stability_keeps_zero_rows_zero():
  out = mechanisms.normalize_rows(jnp.array([[0.0, 0.0], [3.0, 4.0]]), 1.0, 0.0)
  np.testing.assert_allclose(out, [[0.0, 0.0], [0.6, 0.8]], rtol=1e-6)


def test_gradients_are_finite_at_zero_rows_and_match_closed_form():
  x = jnp.array([[0.0, 0.0, 0.0], [0.3, 0.0, 0.4], [30.0, 0.0, 40.0]])
  weights = jnp.array([1.0, 2.0, 3.0])
  stability = 0.5
  # d/dx <w, C x/(|x|+e)> = C w/(|x|+e) - C <w,x> x / (|x| (|x|+e)^2); at x = 0: C w / e.
  grad_norm = jax.jit(jax.grad(
      lambda v: jnp.sum(mechanisms.normalize_rows(v, C, stability) @ weights)))(x)
  grad_clip = jax.jit(jax.grad(lambda v: jnp.sum(mechanisms.clip_rows(v, C) @ weights)))(x)
  chex.assert_tree_all_finite((grad_norm, grad_clip))

  def expected_normalize(row):
    norm = np.linalg.norm(row)
    if norm == 0:
      return C * np.asarray(weights) / stability
    return (C * np.asarray(weights) / (norm + stability)
            - C * (np.asarray(weights) @ row) * row / (norm * (norm + stability) ** 2))

  np.testing.assert_allclose(grad_norm, np.stack([expected_normalize(np.asarray(r))
                                                  for r in x]), rtol=1e-5)
  # Clip: identity for short rows (incl. zero), projection for the long row.
  np.testing.assert_allclose(grad_clip[:2], np.tile(weights, (2, 1)), rtol=1e-6)
  long_row = np.asarray(x[2])
  unit = long_row / np.linalg.norm(long_row)
  expected_long = C / np.linalg.norm(long_row) * (weights - (weights @ unit) * unit)
  np.testing.assert_allclose(grad_clip[2], expected_long, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_sigma_zero_equals_non_private_computation(name):
  spec = MECHANISMS[name]
  x = _input(spec["shape"]).at[0].multiply(100.0)  # one row far outside the bound
  fn = functools.partial(spec["fn"], noise_multiplier=0.0)
  release = jax.jit(fn)(jax.random.key(0), x)
  np.testing.assert_allclose(release.noisy, jax.jit(spec["bounded"])(x), rtol=1e-6, atol=0)
  assert float(release.noise_stddev) == 0.0


def test_sanitize_bounds_the_whole_batch_not_each_row():
  x = _input((8, 5)) * 100.0
  bounded = mechanisms.sanitize(jax.random.key(0), x, l2_clip_norm=C, noise_multiplier=0.0).noisy
  np.testing.assert_allclose(np.linalg.norm(np.asarray(bounded)), C, rtol=1e-5)
  # Same direction as the input (a scalar rescaling of the whole tensor).
  np.testing.assert_allclose(bounded, x * (C / np.linalg.norm(np.asarray(x))), rtol=1e-4)
  small = x * 1e-5  # Frobenius norm < C: unchanged
  np.testing.assert_array_equal(
      mechanisms.sanitize(jax.random.key(0), small, l2_clip_norm=C, noise_multiplier=0.0).noisy,
      small)
  nan_batch = x.at[3, 3].set(jnp.nan)
  np.testing.assert_array_equal(
      mechanisms.sanitize(jax.random.key(0), nan_batch, l2_clip_norm=C, noise_multiplier=0.0).noisy,
      jnp.zeros_like(x))


# 1e5 noise draws (a zero input is bounded to zero, so the output is pure noise). The
# standard error of a sample std on 1e5 draws is ~0.22%, so 3% is a > 10-sigma tolerance.
@pytest.mark.parametrize("name,shape,expected_std", [
    ("output_grad_normalize", (1000, 100), SIGMA * C),
    ("output_grad_clip", (1000, 100), SIGMA * C),
    ("multi_teacher", (4, 1000, 100), SIGMA * C / 4),
    ("sanitize", (1000, 100), SIGMA * C),
])
def test_measured_noise_std(name, shape, expected_std):
  noisy = np.asarray(MECHANISMS[name]["fn"](jax.random.key(3), jnp.zeros(shape)).noisy)
  assert noisy.size == 100_000
  np.testing.assert_allclose(noisy.std(), expected_std, rtol=0.03)
  assert abs(noisy.mean()) < 5 * expected_std / math.sqrt(noisy.size)


def test_noise_rows_are_uncorrelated_and_keys_matter():
  fn = MECHANISMS["output_grad_normalize"]["fn"]
  zeros = jnp.zeros((16, 20_000))
  noisy = np.asarray(fn(jax.random.key(4), zeros).noisy)
  corr = np.corrcoef(noisy)  # (16, 16) correlation between rows across coordinates
  off_diagonal = corr[~np.eye(16, dtype=bool)]
  # Null std of a correlation on 2e4 pairs is 1/sqrt(2e4) ~ 0.007; 0.04 is > 5 sigma.
  assert np.max(np.abs(off_diagonal)) < 0.04
  again = np.asarray(fn(jax.random.key(4), zeros).noisy)
  other = np.asarray(fn(jax.random.key(5), zeros).noisy)
  np.testing.assert_array_equal(noisy, again)
  assert np.abs(np.corrcoef(noisy.ravel(), other.ravel())[0, 1]) < 0.01


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_jit_vmap_scan_and_grad(name):
  spec = MECHANISMS[name]
  fn = spec["fn"]
  x = _input(spec["shape"])
  keys = jax.random.split(jax.random.key(7), 3)
  weights = jax.random.normal(jax.random.key(8), spec["shape"][-2:])

  # One jitted program exercising every transform, so the test compiles once.
  @jax.jit
  def transformed(keys, x):
    single = fn(keys[1], x).noisy
    batched = jax.vmap(fn, in_axes=(0, None))(keys, x)

    def step(total, step_key):
      release = fn(step_key, x)
      return total + release.noisy, release.noise_stddev

    total, stddevs = jax.lax.scan(step, jnp.zeros_like(single), keys)
    release = fn(keys[2], x)
    metadata = (release.l2_sensitivity, release.accounting_noise_multiplier)
    # The noise does not depend on x: d<noisy, w>/dx equals that of the bounded part.
    grad_noisy = jax.grad(lambda v: jnp.sum(fn(keys[0], v).noisy * weights))(x)
    grad_bounded = jax.grad(lambda v: jnp.sum(spec["bounded"](v) * weights))(x)
    return single, batched.noisy, total, stddevs, metadata, grad_noisy, grad_bounded

  single, batched, total, stddevs, metadata, grad_noisy, grad_bounded = transformed(keys, x)
  chex.assert_shape(batched, (3,) + single.shape)
  np.testing.assert_allclose(batched[1], single, rtol=1e-6, atol=1e-6)
  assert not np.allclose(batched[0], batched[1])  # split keys give different noise
  np.testing.assert_allclose(total, batched.sum(0), rtol=1e-5, atol=1e-5)
  # The release reports noise std, L2 sensitivity and the accountant's noise multiplier.
  np.testing.assert_allclose(stddevs, np.full(3, spec["stddev"]), rtol=1e-6)
  np.testing.assert_allclose(metadata, (spec["sensitivity"], spec["multiplier"]), rtol=1e-6)
  chex.assert_tree_all_finite(grad_noisy)
  np.testing.assert_allclose(grad_noisy, grad_bounded, rtol=1e-5, atol=1e-6)


def test_eager_and_jit_agree_for_the_same_key():
  fn = MECHANISMS["output_grad_normalize"]["fn"]
  x = _input((6, 5))
  np.testing.assert_allclose(jax.jit(fn)(jax.random.key(9), x).noisy,
                             fn(jax.random.key(9), x).noisy, rtol=1e-6, atol=1e-6)


def test_traced_noise_multiplier_is_accepted_under_vmap():
  x = _input((4, 3))
  sigmas = jnp.array([0.0, 1.0, 2.0])
  releases = jax.jit(jax.vmap(lambda s: mechanisms.output_gradient_mechanism(
      jax.random.key(0), x, l2_clip_norm=C, noise_multiplier=s)))(sigmas)
  np.testing.assert_allclose(releases.noise_stddev, C * np.asarray(sigmas), rtol=1e-6)
  np.testing.assert_array_equal(releases.noisy[0], mechanisms.normalize_rows(x, C))


@pytest.mark.parametrize("call,param", [
    (lambda: mechanisms.normalize_rows(jnp.ones((2, 2)), 0.0), "l2_clip_norm"),
    (lambda: mechanisms.normalize_rows(jnp.ones((2, 2)), 1.0, -1e-3), "stability"),
    (lambda: mechanisms.clip_rows(jnp.ones((2, 2)), -1.0), "l2_clip_norm"),
    (lambda: mechanisms.output_gradient_mechanism(
        jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=0.0, noise_multiplier=1.0),
     "l2_clip_norm"),
    (lambda: mechanisms.output_gradient_mechanism(
        jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=1.0, noise_multiplier=-0.1),
     "noise_multiplier"),
    (lambda: mechanisms.output_gradient_mechanism(
        jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=1.0, noise_multiplier=1.0,
        stability=-1.0), "stability"),
    (lambda: mechanisms.output_gradient_mechanism(
        jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=1.0, noise_multiplier=1.0,
        method="l2"), "method"),
    (lambda: mechanisms.multi_teacher_output_gradients(
        jax.random.key(0), jnp.ones((2, 2, 2)), l2_clip_norm=-2.0, noise_multiplier=1.0),
     "l2_clip_norm"),
    (lambda: mechanisms.sanitize(jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=0.0,
                                 noise_multiplier=1.0), "l2_clip_norm"),
    (lambda: mechanisms.sanitize(jax.random.key(0), jnp.ones((2, 2)), l2_clip_norm=1.0,
                                 noise_multiplier=math.nan), "noise_multiplier"),
])
def test_invalid_parameters_raise_value_error_naming_them(call, param):
  with pytest.raises(ValueError, match=param):
    call()


def test_key_is_required():
  with pytest.raises(TypeError):
    mechanisms.output_gradient_mechanism(  # pylint: disable=missing-kwoa
        jnp.ones((2, 2)), l2_clip_norm=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("method", ["normalize", "clip"])
def test_one_teacher_mechanism_is_the_multi_teacher_one_with_n_1(method):
  """`output_gradient_mechanism` is `multi_teacher_output_gradients` on one teacher: the same
  bits (bound, draw, std, sensitivity), zero and non-finite rows included."""
  x = _input((6, 5)).at[0].set(0.0).at[1, 2].set(jnp.nan)
  kwargs = dict(l2_clip_norm=C, noise_multiplier=SIGMA, method=method)
  one = jax.jit(functools.partial(mechanisms.output_gradient_mechanism, **kwargs))(
      jax.random.key(4), x)
  multi = jax.jit(functools.partial(mechanisms.multi_teacher_output_gradients, **kwargs))(
      jax.random.key(4), x[None])
  chex.assert_trees_all_equal(tuple(one), tuple(multi))
