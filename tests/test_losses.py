"""Tests for dpkd_jax.losses: closed forms, the DKD paper formula, stability, jit/vmap."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import losses

# float32 losses against float64 NumPy references on O(1)-O(10) values.
RTOL = 1e-5
ATOL = 1e-5


def _random_logits(seed: int, shape: tuple[int, ...], scale: float = 3.0) -> jax.Array:
  # Host-side NumPy draws: eager jax.random ops would each compile on the shared CPU.
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _random_labels(seed: int, batch_size: int, num_classes: int) -> jax.Array:
  return jnp.asarray(np.random.default_rng(seed).integers(0, num_classes, batch_size), jnp.int32)


# Jitted entry points (hyper-parameters static): one XLA program per shape instead of one
# compilation per primitive in eager mode, which dominates the runtime on a loaded CPU.
_soft_cross_entropy = jax.jit(losses.soft_cross_entropy)
_kd_kl = jax.jit(losses.kd_kl, static_argnames=("temperature",))
_dkd = jax.jit(losses.dkd, static_argnames=("alpha", "beta", "temperature"))
_argmax_cross_entropy = jax.jit(losses.argmax_cross_entropy)
_information_entropy = jax.jit(losses.information_entropy)
_feature_norm = jax.jit(losses.feature_norm)
_hint_l2 = jax.jit(losses.hint_l2)


def _np_log_softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=-1, keepdims=True)
  return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _np_softmax(z: np.ndarray) -> np.ndarray:
  return np.exp(_np_log_softmax(z))


def _np_kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
  return np.sum(p * (np.log(p) - np.log(q)), axis=-1)


def _np_dkd_paper(student, teacher, labels, alpha, beta, temperature):
  """DKD written directly from the paper (Zhao et al. 2022, Eqs. 1-7), float64, per row."""
  student, teacher = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
  rows = []
  for s_row, t_row, y in zip(student, teacher, np.asarray(labels)):
    p_s, p_t = _np_softmax(s_row / temperature), _np_softmax(t_row / temperature)
    b_s = np.array([p_s[y], 1.0 - p_s[y]])
    b_t = np.array([p_t[y], 1.0 - p_t[y]])
    rest = np.arange(len(s_row)) != y
    hat_s = p_s[rest] / (1.0 - p_s[y])
    hat_t = p_t[rest] / (1.0 - p_t[y])
    rows.append(alpha * _np_kl(b_t, b_s) + beta * _np_kl(hat_t, hat_s))
  return np.array(rows) * temperature**2


def _np_dkd_official_batch_mean(student, teacher, labels, alpha, beta, temperature):
  """NumPy transcription of mdistiller's dkd_loss (batch mean, -1000 target mask)."""
  student, teacher = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
  gt_mask = np.eye(student.shape[1])[np.asarray(labels)]
  p_s, p_t = _np_softmax(student / temperature), _np_softmax(teacher / temperature)
  cat = lambda p: np.stack([(p * gt_mask).sum(1), (p * (1 - gt_mask)).sum(1)], axis=1)
  tckd = np.sum(cat(p_t) * (np.log(cat(p_t)) - np.log(cat(p_s))))
  log_p_t2 = _np_log_softmax(teacher / temperature - 1000.0 * gt_mask)
  log_p_s2 = _np_log_softmax(student / temperature - 1000.0 * gt_mask)
  # F.kl_div(input, target) sums target * (log target - input).
  nckd = np.sum(np.exp(log_p_t2) * (log_p_t2 - log_p_s2))
  batch_size = student.shape[0]
  return (alpha * tckd + beta * nckd) * temperature**2 / batch_size


# ---------------------------------------------------------------------------- soft CE
# Most tests share (B, K) = (8, 10) so the jitted programs are compiled once and reused.
B, K = 8, 10


def test_soft_cross_entropy_of_one_hot_is_cross_entropy():
  logits, labels = _random_logits(0, (B, K)), _random_labels(1, B, K)
  got = _soft_cross_entropy(logits, jnp.asarray(np.eye(K)[np.asarray(labels)], jnp.float32))
  chex.assert_shape(got, (B,))
  expected = -_np_log_softmax(np.asarray(logits, np.float64))[np.arange(B), np.asarray(labels)]
  np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_soft_cross_entropy_uniform_logits_is_log_k_for_any_target():
  targets = jnp.asarray(_np_softmax(np.asarray(_random_logits(2, (B, K)))), jnp.float32)
  got = _soft_cross_entropy(jnp.zeros((B, K)), targets)
  np.testing.assert_allclose(got, np.full(B, math.log(K)), rtol=RTOL)


# ---------------------------------------------------------------------------- KD KL


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_kd_kl_zero_iff_equal_distributions(temperature):
  logits = _random_logits(3, (B, K))
  same = _kd_kl(logits, logits, temperature=temperature)
  shifted = _kd_kl(logits + 7.0, logits, temperature=temperature)  # same softmax
  different = _kd_kl(_random_logits(4, (B, K)), logits, temperature=temperature)
  chex.assert_shape(same, (B,))
  np.testing.assert_allclose(same, 0.0, atol=1e-6)
  np.testing.assert_allclose(shifted, 0.0, atol=1e-5)
  assert np.all(np.asarray(different) > 1e-3)


@pytest.mark.parametrize("temperature", [0.5, 3.0])
def test_kd_kl_matches_numpy_and_scales_with_t_squared(temperature):
  student, teacher = _random_logits(5, (B, K)), _random_logits(6, (B, K))
  got = _kd_kl(student, teacher, temperature=temperature)
  s, t = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
  expected = _np_kl(_np_softmax(t / temperature), _np_softmax(s / temperature)) * temperature**2
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=ATOL)
  # Scaling the logits by T cancels the division: the loss is exactly T^2 times the T=1 loss.
  rescaled = _kd_kl(student * temperature, teacher * temperature, temperature=temperature)
  unit = _kd_kl(student, teacher, temperature=1.0)
  np.testing.assert_allclose(rescaled, temperature**2 * np.asarray(unit), rtol=1e-4, atol=ATOL)


def test_kd_kl_per_example_gradient_closed_form():
  # d/ds [T^2 KL(softmax(t/T) || softmax(s/T))] = T (softmax(s/T) - softmax(t/T)).
  temperature = 2.0
  student, teacher = _random_logits(7, (B, K)), _random_logits(8, (B, K))
  row_loss = lambda s, t: losses.kd_kl(s[None], t[None], temperature=temperature)[0]
  per_example_grads = jax.jit(jax.vmap(jax.grad(row_loss)))(student, teacher)  # (B, K)
  s, t = np.asarray(student, np.float64), np.asarray(teacher, np.float64)
  expected = temperature * (_np_softmax(s / temperature) - _np_softmax(t / temperature))
  np.testing.assert_allclose(per_example_grads, expected, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------- DKD


@pytest.mark.parametrize("alpha,beta,temperature", [(1.0, 8.0, 4.0), (1.0, 1.0, 1.0),
                                                    (0.5, 2.0, 2.0)])
def test_dkd_matches_paper_formula_and_official_batch_mean(alpha, beta, temperature):
  student, teacher = _random_logits(10, (B, K)), _random_logits(11, (B, K))
  labels = _random_labels(12, B, K)
  got = _dkd(student, teacher, labels, alpha=alpha, beta=beta, temperature=temperature)
  chex.assert_shape(got, (B,))
  expected = _np_dkd_paper(student, teacher, labels, alpha, beta, temperature)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
  official = _np_dkd_official_batch_mean(student, teacher, labels, alpha, beta, temperature)
  np.testing.assert_allclose(np.mean(got), official, rtol=1e-4)


def test_dkd_nonnegative_and_zero_for_identical_logits():
  for seed in range(4):  # 32 rows of large random logits
    student = _random_logits(13 + seed, (B, K), 5.0)
    teacher = _random_logits(23 + seed, (B, K), 5.0)
    labels = _random_labels(33 + seed, B, K)
    assert np.all(np.asarray(_dkd(student, teacher, labels)) > 0)  # distinct logits
    np.testing.assert_allclose(_dkd(teacher, teacher, labels), 0.0, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_dkd_decomposes_classical_kd(temperature):
  # Paper Eq. 7: KD = TCKD + (1 - p_target^teacher) NCKD (each times T^2 here).
  student, teacher = _random_logits(16, (B, K)), _random_logits(17, (B, K))
  labels = _random_labels(18, B, K)
  tckd = _dkd(student, teacher, labels, alpha=1.0, beta=0.0, temperature=temperature)
  nckd = _dkd(student, teacher, labels, alpha=0.0, beta=1.0, temperature=temperature)
  teacher_target_prob = _np_softmax(np.asarray(teacher, np.float64) / temperature)[
      np.arange(B), np.asarray(labels)]
  kd = _kd_kl(student, teacher, temperature=temperature)
  np.testing.assert_allclose(tckd + (1.0 - teacher_target_prob) * nckd, kd, rtol=1e-4,
                             atol=1e-5)
  # With alpha = beta = 1 DKD drops the (1 - p_t) factor, so it is never below KD.
  both = _dkd(student, teacher, labels, alpha=1.0, beta=1.0, temperature=temperature)
  np.testing.assert_allclose(both, tckd + nckd, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(both) >= np.asarray(kd) - 1e-5)


def test_dkd_two_classes_is_kd():
  # K = 2: a single non-target class, so NCKD = 0 and TCKD is the full KL.
  student, teacher = _random_logits(19, (B, 2)), _random_logits(20, (B, 2))
  labels = _random_labels(21, B, 2)
  got = _dkd(student, teacher, labels, alpha=1.0, beta=8.0, temperature=2.0)
  np.testing.assert_allclose(got, _kd_kl(student, teacher, temperature=2.0), rtol=1e-4,
                             atol=1e-6)


def test_dkd_rows_are_independent_under_vmap_and_permutation():
  student, teacher = _random_logits(22, (B, K)), _random_logits(23, (B, K))
  labels = _random_labels(24, B, K)
  batched = _dkd(student, teacher, labels)
  per_row = jax.jit(jax.vmap(lambda s, t, y: losses.dkd(s[None], t[None], y[None])[0]))(
      student, teacher, labels)
  np.testing.assert_allclose(per_row, batched, rtol=1e-5, atol=1e-6)
  permutation = np.random.default_rng(0).permutation(B)
  permuted = _dkd(student[permutation], teacher[permutation], labels[permutation])
  np.testing.assert_allclose(permuted, np.asarray(batched)[permutation], rtol=1e-5, atol=1e-6)


def test_dkd_per_example_gradients_wrt_student_outputs():
  # DPDFD's use: one gradient row per example w.r.t. the student logits. Row b of the loss
  # depends only on row b of the logits, and DKD is invariant to adding a constant to a row,
  # so each gradient row sums to zero.
  student, teacher = _random_logits(25, (B, K)), _random_logits(26, (B, K))
  labels = _random_labels(27, B, K)
  jacobian = jax.jit(jax.jacrev(losses.dkd))(student, teacher, labels)  # (B, B, K)
  chex.assert_shape(jacobian, (B, B, K))
  per_example_grads = np.einsum("bbk->bk", np.asarray(jacobian))
  np.testing.assert_array_equal(np.asarray(jacobian)[~np.eye(B, dtype=bool)], 0.0)
  np.testing.assert_allclose(per_example_grads.sum(axis=1), 0.0, atol=1e-5)
  assert np.all(np.abs(per_example_grads).max(axis=1) > 1e-3)


# ---------------------------------------------------------------------------- stability


def test_losses_finite_values_and_gradients_for_extreme_logits():
  rng = np.random.default_rng(30)
  student = 1e4 * rng.choice([-1.0, 1.0], (B, K)).astype(np.float32)
  teacher = 1e4 * rng.choice([-1.0, 1.0], (B, K)).astype(np.float32)
  labels = _random_labels(31, B, K)
  # Row 0: the target's student logit is -1e4 while the others are +1e4, so p_target
  # underflows to exactly 0 in float32 (the official code would take log(0) there), while the
  # teacher is sure of the target.
  student[0] = 1e4
  student[0, int(labels[0])] = -1e4
  teacher[0] = -1e4
  teacher[0, int(labels[0])] = 1e4
  student, teacher = jnp.asarray(student), jnp.asarray(teacher)
  targets = jnp.asarray(_np_softmax(np.asarray(teacher, np.float64)), jnp.float32)

  def total(s, t):
    terms = (losses.soft_cross_entropy(s, targets), losses.kd_kl(s, t, temperature=4.0),
             losses.dkd(s, t, labels), losses.dkd(s, t, labels, temperature=1.0),
             losses.argmax_cross_entropy(s), losses.information_entropy(s))
    return sum(jnp.sum(term) for term in terms)

  value, (student_grad, teacher_grad) = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(
      student, teacher)
  assert np.isfinite(value)
  assert np.all(np.isfinite(student_grad)) and np.all(np.isfinite(teacher_grad))
  dkd_values = np.asarray(_dkd(student, teacher, labels))
  assert np.all(np.isfinite(dkd_values))
  # Row 0 has a huge but finite TCKD: ~ T^2 * (2e4 / T) = 8e4 at T = 4.
  assert 1e4 < dkd_values[0] < 1e6


def test_norm_losses_have_zero_not_nan_gradient_at_zero():
  features = jnp.zeros((3, 4)).at[1].set(jnp.array([3.0, 4.0, 0.0, 0.0]))
  grad = jax.jit(jax.grad(losses.feature_norm))(features)
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[0], 0.0)
  np.testing.assert_allclose(grad[1], -np.array([3.0, 4.0, 0.0, 0.0]) / 5.0 / 3.0, rtol=1e-6)
  stats = [jnp.arange(3.0)]
  bn_grad = jax.jit(jax.grad(lambda m: losses.bn_statistics_loss([m], stats, stats, stats)))(
      stats[0])
  np.testing.assert_array_equal(bn_grad, 0.0)


# ---------------------------------------------------------------------------- generator terms


def test_argmax_cross_entropy_closed_form_and_gradient():
  logits = _random_logits(40, (B, K))
  z = np.asarray(logits, np.float64)
  value, grad = jax.jit(jax.value_and_grad(losses.argmax_cross_entropy))(logits)
  chex.assert_shape(value, ())
  np.testing.assert_allclose(value, np.mean(-_np_log_softmax(z).max(-1)), rtol=RTOL)
  # Pseudo-labels are constants: d/dz = (softmax(z) - one_hot(argmax z)) / B.
  expected_grad = (_np_softmax(z) - np.eye(K)[z.argmax(-1)]) / B
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=1e-6)


def test_information_entropy_extremes_and_dafl_log10_relation():
  uniform_mean = _information_entropy(jnp.zeros((B, K)))
  np.testing.assert_allclose(uniform_mean, -math.log(K), rtol=1e-6)
  # Confident but balanced batch: one sharp prediction per class, the mean is uniform.
  balanced = _information_entropy(50.0 * jnp.eye(K))
  np.testing.assert_allclose(balanced, -math.log(K), rtol=1e-5)
  # Collapsed batch: every row predicts class 0, the entropy of the mean is ~0 (the maximum).
  collapsed = _information_entropy(jnp.asarray(50.0 * np.eye(K)[np.zeros(B, int)], jnp.float32))
  np.testing.assert_allclose(collapsed, 0.0, atol=1e-5)
  logits = _random_logits(41, (B, K))
  value = _information_entropy(logits)
  mean_probs = _np_softmax(np.asarray(logits, np.float64)).mean(0)
  dafl_value = np.sum(mean_probs * np.log10(mean_probs))
  np.testing.assert_allclose(value, math.log(10.0) * dafl_value, rtol=1e-5)
  assert -math.log(K) < float(value) < 0.0


def test_total_variation_is_zero_on_flat_images_and_counts_both_directions():
  flat = jnp.full((2, 4, 5, 3), 0.7)
  assert float(losses.total_variation(flat)) == 0.0
  ramp = jnp.broadcast_to(jnp.arange(5.0)[None, None, :, None], (2, 4, 5, 1))  # +1 a column
  assert float(losses.total_variation(ramp)) == pytest.approx(1.0)  # horizontal only
  assert float(losses.total_variation(jnp.swapaxes(ramp, 1, 2))) == pytest.approx(1.0)
  checker = (jnp.indices((4, 4)).sum(0) % 2).astype(jnp.float32)[None, :, :, None]
  assert float(losses.total_variation(checker)) == pytest.approx(2.0)
  with pytest.raises(AssertionError, match="rank"):  # chex: images are (B, H, W, C)
    losses.total_variation(jnp.zeros((4, 4)))


def test_feature_norm_value_and_sign():
  features = _random_logits(42, (B, K))
  expected = -np.mean(np.linalg.norm(np.asarray(features, np.float64), axis=1))
  value, grad = jax.jit(jax.value_and_grad(losses.feature_norm))(features)
  np.testing.assert_allclose(value, expected, rtol=RTOL)
  # A gradient-descent step on the loss must increase every feature norm (DAFL's direction).
  stepped = np.asarray(features) - 0.1 * np.asarray(grad)
  assert np.all(np.linalg.norm(stepped, axis=1) > np.linalg.norm(features, axis=1))
  # (B, H, W, C) inputs are flattened per example.
  np.testing.assert_allclose(_feature_norm(features.reshape(B, K, 1, 1)), value, rtol=1e-6)


def test_bn_statistics_loss_closed_form_and_weights():
  rng = np.random.default_rng(43)
  batch_means = [rng.standard_normal(3), rng.standard_normal(5)]
  batch_vars = [np.full(3, 2.0), np.full(5, 0.5)]
  running_means = [rng.standard_normal(3), rng.standard_normal(5)]
  running_vars = [np.ones(3), np.ones(5)]
  per_layer = [np.linalg.norm(m - r) + np.linalg.norm(v - rv)
               for m, v, r, rv in zip(batch_means, batch_vars, running_means, running_vars)]
  as_jax = lambda arrays: [jnp.asarray(a, jnp.float32) for a in arrays]
  inputs = tuple(map(as_jax, (batch_means, batch_vars, running_means, running_vars)))
  got = jax.jit(losses.bn_statistics_loss)(*inputs)
  chex.assert_shape(got, ())
  np.testing.assert_allclose(got, sum(per_layer), rtol=RTOL)
  # Plain L2 norms: layer 0's variance term is ||(1, 1, 1)||_2 = sqrt(3), not 3 or 1.
  np.testing.assert_allclose(per_layer[0] - np.linalg.norm(batch_means[0] - running_means[0]),
                             math.sqrt(3.0))
  weighted = jax.jit(functools.partial(losses.bn_statistics_loss, layer_weights=(10.0, 1.0)))(
      *inputs)
  np.testing.assert_allclose(weighted, 10.0 * per_layer[0] + per_layer[1], rtol=RTOL)
  matched = jax.jit(losses.bn_statistics_loss)(inputs[2], inputs[3], inputs[2], inputs[3])
  np.testing.assert_allclose(matched, 0.0)


def test_hint_l2_per_example_mean_squared_error():
  student, teacher = _random_logits(44, (B, 4, 4, 2)), _random_logits(45, (B, 4, 4, 2))
  got = _hint_l2(student, teacher)
  chex.assert_shape(got, (B,))
  diff = np.asarray(student, np.float64) - np.asarray(teacher, np.float64)
  np.testing.assert_allclose(got, np.mean(diff.reshape(B, -1) ** 2, axis=1), rtol=RTOL)
  np.testing.assert_array_equal(_hint_l2(student, student), 0.0)
  per_row = jax.jit(jax.vmap(lambda s, t: losses.hint_l2(s[None], t[None])[0]))(student, teacher)
  np.testing.assert_allclose(per_row, got, rtol=1e-6)


# ---------------------------------------------------------------------------- eager and validation


def test_eager_matches_jit():
  # One eager call per loss (slow on CPU: every primitive compiles), on the smallest inputs.
  student, teacher = _random_logits(50, (2, 3)), _random_logits(51, (2, 3))
  labels = jnp.array([0, 2])
  np.testing.assert_allclose(losses.dkd(student, teacher, labels),
                             _dkd(student, teacher, labels), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(losses.kd_kl(student, teacher, temperature=3.0),
                             _kd_kl(student, teacher, temperature=3.0), rtol=1e-6, atol=1e-6)


def test_traced_temperature_is_accepted():
  student, teacher = _random_logits(53, (B, K)), _random_logits(54, (B, K))
  traced = jax.jit(lambda t: losses.kd_kl(student, teacher, temperature=t))(jnp.float32(2.0))
  np.testing.assert_allclose(traced, _kd_kl(student, teacher, temperature=2.0), rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"alpha": -0.1}, "alpha"),
    ({"beta": -2.0}, "beta"),
])
def test_dkd_rejects_bad_hyperparameters(kwargs, match):
  logits = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match=match):
    losses.dkd(logits, logits, np.array([0, 1]), **kwargs)


def test_bad_shapes_and_types_are_rejected():
  logits = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match="temperature"):
    losses.kd_kl(logits, logits, temperature=0.0)
  with pytest.raises(ValueError, match="2 classes"):
    losses.kd_kl(logits[:, :1], logits[:, :1], temperature=1.0)
  with pytest.raises(AssertionError):
    losses.dkd(logits, logits, np.array([0.0, 1.0]))  # float labels
  with pytest.raises(AssertionError):
    losses.kd_kl(logits, logits[:1], temperature=1.0)
  one = [np.ones(2, np.float32)]
  with pytest.raises(ValueError, match="at least one"):
    losses.bn_statistics_loss([], [], [], [])
  with pytest.raises(ValueError, match="lengths"):
    losses.bn_statistics_loss(one, one, one, [])
  with pytest.raises(ValueError, match="layer_weights"):
    losses.bn_statistics_loss(one, one, one, one, layer_weights=(1.0, 2.0))
  with pytest.raises(ValueError, match="layer_weights"):
    losses.bn_statistics_loss(one, one, one, one, layer_weights=(-1.0,))
  with pytest.raises(AssertionError):
    losses.bn_statistics_loss(one, [np.ones(3, np.float32)], one, one)
