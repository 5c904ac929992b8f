"""Gaussian mechanisms on teacher-side tensors: DPDFD output gradients and RONA sanitize.

Every mechanism here is a pure function `f(key, inputs, *, params)`: the key is the first
positional argument and is required (there is no default key and no NumPy fallback), the
non-noise part is differentiable, and the functions are safe under `jax.jit`, `jax.vmap`,
`jax.grad` and `lax.scan`. Scalar parameters are validated in Python when they are concrete
(Python numbers or concrete arrays); when they are traced (e.g. a `vmap` over
`noise_multiplier`) their value is unknown at trace time and validation is skipped.

Threat model shared by all three mechanisms (replace-one neighbouring private datasets): the
*teacher* was trained on the private data and is itself not private, so replacing one private
record may change the teacher and therefore every row of every teacher-side tensor computed
on the (public or synthetic) query batch. Sensitivities are therefore those of the whole
released tensor, and each result reports the noise standard deviation, the L2 sensitivity and
their ratio, the noise multiplier an accountant (e.g. `dp_accounting.GaussianDpEvent`) needs.

Non-finite inputs: a row (for `sanitize`, the whole tensor) that contains any NaN or +-inf is
replaced by zeros *before* bounding. Zeros satisfy every bound, so the sensitivity analysis is
unchanged and one broken row cannot poison the others (a NaN norm would otherwise spread to the
whole release). Norms are computed with max-abs rescaling, so rows with entries near the
float32 overflow (1e30) or underflow (1e-30) limits are still bounded correctly.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from dpkd_jax.privacy import secure_gaussian
from dpkd_jax.privacy import validation


class GaussianRelease(NamedTuple):
  """A noisy tensor and the numbers an accountant needs.

  Attributes:
    noisy: the released tensor (bounded input plus Gaussian noise), same shape as the input
      of the mechanism (for the multi-teacher mechanism: the mean over teachers, (B, K)).
    noise_stddev: scalar, standard deviation of the noise on each coordinate of `noisy`.
    l2_sensitivity: scalar, L2 sensitivity of `noisy`'s noiseless part under replace-one.
  """

  noisy: jax.Array
  noise_stddev: jax.Array
  l2_sensitivity: jax.Array

  @property
  def accounting_noise_multiplier(self) -> jax.Array:
    """Noise std / L2 sensitivity: the `noise_multiplier` of one `GaussianDpEvent`."""
    return self.noise_stddev / self.l2_sensitivity


def _zero_non_finite_rows(x: jax.Array) -> jax.Array:
  """(B, ...) -> (B, ...): rows with any NaN/inf replaced by zeros (others untouched)."""
  flat = x.reshape(x.shape[0], -1)  # (B, D)
  row_is_finite = jnp.all(jnp.isfinite(flat), axis=1)  # (B,)
  row_is_finite = row_is_finite.reshape((-1,) + (1,) * (x.ndim - 1))
  return jnp.where(row_is_finite, x, jnp.zeros_like(x))


def _row_l2_norms(x: jax.Array) -> jax.Array:
  """(B, ...) -> (B,): L2 norm of each flattened row; overflow-safe and grad-safe at 0.

  The sum of squares of a float32 row with entries ~1e20 overflows (and ~1e-23 underflows),
  so rows are first divided by their max-abs entry. Zero rows take the `where` branch with
  a substituted 1 so that neither the division nor sqrt'(0) = inf puts NaN in gradients.
  """
  flat = x.reshape(x.shape[0], -1)  # (B, D)
  max_abs = jnp.max(jnp.abs(flat), axis=1)  # (B,)
  is_nonzero = max_abs > 0
  safe_max = jnp.where(is_nonzero, max_abs, 1.0)
  scaled_sq_norm = jnp.sum(jnp.square(flat / safe_max[:, None]), axis=1)  # in [1, D] if nonzero
  safe_sq_norm = jnp.where(is_nonzero, scaled_sq_norm, 1.0)
  return jnp.where(is_nonzero, safe_max * jnp.sqrt(safe_sq_norm), 0.0)


def _scale_rows(x: jax.Array, row_scale: jax.Array) -> jax.Array:
  """(B, ...) * (B,) broadcast over the trailing axes."""
  return x * row_scale.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)


def normalize_rows(x: jax.Array, l2_clip_norm: float | None = None, stability: float = 1e-6,
                   *, l2_norm_bound: float | None = None) -> jax.Array:
  """Per-row normalization `C * x_i / (||x_i||_2 + e)`: every row ends with norm < C.

  Args:
    x: (B, ...) rows along the leading axis; trailing axes are flattened for the norm.
    l2_clip_norm: C > 0, the bound on every output row's L2 norm.
    stability: e >= 0 added to the norm. With e > 0 tiny rows are shrunk instead of blown up
      to norm C (and the map is smooth at 0); with e = 0 a zero row stays zero.
    l2_norm_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    (B, ...) rows with `||row||_2 <= C` (up to float32 rounding); non-finite rows -> zeros.
  """
  l2_clip_norm = validation.renamed_keyword(
      "normalize_rows", new="l2_clip_norm", new_value=l2_clip_norm, old="l2_norm_bound",
      old_value=l2_norm_bound)
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  validation.check_float("stability", stability, positive=False)
  chex.assert_rank(x, {1, 2, 3, 4, 5, 6})
  x = _zero_non_finite_rows(x)
  denominator = _row_l2_norms(x) + stability  # (B,)
  is_positive = denominator > 0  # False only for zero rows when stability == 0
  safe_denominator = jnp.where(is_positive, denominator, 1.0)
  row_scale = jnp.where(is_positive, l2_clip_norm / safe_denominator, 0.0)  # (B,)
  return _scale_rows(x, row_scale)


def clip_rows(x: jax.Array, l2_clip_norm: float) -> jax.Array:
  """Per-row clipping `x_i * min(1, C / ||x_i||_2)`: rows shorter than C are unchanged.

  Args:
    x: (B, ...) rows along the leading axis; trailing axes are flattened for the norm.
    l2_clip_norm: C > 0.

  Returns:
    (B, ...) rows with `||row||_2 <= C` (up to float32 rounding); non-finite rows -> zeros.
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  chex.assert_rank(x, {1, 2, 3, 4, 5, 6})
  x = _zero_non_finite_rows(x)
  norms = _row_l2_norms(x)  # (B,)
  needs_clip = norms > l2_clip_norm
  # Zero / short rows divide by a substituted 1 so C/0 = inf never enters the gradient.
  safe_norms = jnp.where(needs_clip, norms, 1.0)
  row_scale = jnp.where(needs_clip, l2_clip_norm / safe_norms, 1.0)
  return _scale_rows(x, row_scale)


def _normalize_bounder(x: jax.Array, bound: float, stability: float) -> jax.Array:
  return normalize_rows(x, bound, stability)


def _clip_bounder(x: jax.Array, bound: float, stability: float) -> jax.Array:
  del stability  # clipping leaves short rows untouched, no denominator to stabilise
  return clip_rows(x, bound)


# Explicit registry of per-row bounding methods (no string dispatch via getattr).
ROW_BOUNDERS: dict[str, Callable[[jax.Array, float, float], jax.Array]] = {
    "normalize": _normalize_bounder,
    "clip": _clip_bounder,
}


def _row_bounder(method: str) -> Callable[[jax.Array, float, float], jax.Array]:
  if method not in ROW_BOUNDERS:
    raise ValueError(f"method must be one of {sorted(ROW_BOUNDERS)}, got {method!r}")
  return ROW_BOUNDERS[method]


def output_gradient_mechanism(
    key: jax.Array,
    per_sample_grads: jax.Array,
    *,
    l2_clip_norm: float | None = None,
    noise_multiplier: float,
    stability: float = 1e-6,
    method: str = "normalize",
    secure_noise: bool = False,
    grid_bits: int | None = None,
    l2_norm_bound: float | None = None,
) -> GaussianRelease:
  """DPDFD's output-gradient mechanism A_{C,sigma} (Algorithm 1).

  Each row g_i (the teacher-side gradient of the distillation loss w.r.t. the i-th query's
  output, shape (K,)) is normalized (`C g_i / (||g_i|| + e)`) or clipped to L2 norm <= C,
  and an independent N(0, sigma^2 C^2) draw is added to every coordinate of every row.

  Sensitivity (replace-one): the teacher is not private, so one private record can change
  every one of the B rows, each (bounded to norm <= C) by at most 2C in L2. Concatenating the
  B rows into one vector of length B*K, the L2 sensitivity is sqrt(sum_i (2C)^2) = 2 C sqrt(B).
  The noise std is sigma C per coordinate, so the accountant's Gaussian noise multiplier for
  one release is sigma C / (2 C sqrt(B)) = sigma / (2 sqrt(B)) (see
  `GaussianRelease.accounting_noise_multiplier`). sigma = 0 returns exactly the bounded rows.

  Args:
    key: a `jax.random.key`, used once for the (B, K) noise draw.
    per_sample_grads: (B, K) one row per query.
    l2_clip_norm: C > 0.
    noise_multiplier: sigma >= 0 (noise std in units of C).
    stability: e >= 0 of `normalize_rows` (ignored by "clip").
    method: "normalize" or "clip" (see `ROW_BOUNDERS`).
    secure_noise: False (default): float32 Gaussian noise. True: the bounded rows on an
      integer grid plus exact discrete Gaussian noise of the same std sigma C
      (`secure_gaussian`; sigma > 0 and concrete); account with `dpdfd_event(...,
      secure_noise=True)`, whose rounding-aware sensitivity is larger than 2 C sqrt(B).
    grid_bits: k of the secure grid (step about C / 2^k); None: the largest that fits int32.
    l2_norm_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    GaussianRelease with `noisy` (B, K) (what the student fits), `noise_stddev` = sigma C and
    `l2_sensitivity` = 2 C sqrt(B).
  """
  # One teacher is the n = 1 case of `multi_teacher_output_gradients`: the same bound, draw
  # and sensitivity (the sum over one teacher and the division by 1 are exact).
  chex.assert_rank(per_sample_grads, 2)
  l2_clip_norm = validation.renamed_keyword(
      "output_gradient_mechanism", new="l2_clip_norm", new_value=l2_clip_norm,
      old="l2_norm_bound", old_value=l2_norm_bound)
  return multi_teacher_output_gradients(
      key, per_sample_grads[None], l2_clip_norm=l2_clip_norm,
      noise_multiplier=noise_multiplier, stability=stability, method=method,
      secure_noise=secure_noise, grid_bits=grid_bits)


def multi_teacher_output_gradients(
    key: jax.Array,
    per_teacher_grads: jax.Array,
    *,
    l2_clip_norm: float | None = None,
    noise_multiplier: float,
    stability: float = 1e-6,
    method: str = "normalize",
    secure_noise: bool = False,
    grid_bits: int | None = None,
    l2_norm_bound: float | None = None,
) -> GaussianRelease:
  """Output-gradient mechanism for n teachers trained on disjoint shards of the private data.

  Each teacher's row is bounded to norm <= C, the n bounded rows are **summed over
  teachers**, one N(0, sigma^2 C^2) draw is added to each coordinate of each summed row, and
  the result is divided by n (the student fits the noisy mean).

  Sensitivity: one private record lives in exactly one shard, hence affects one teacher,
  which changes each of the B summed rows by at most 2C: the sum (B, K) has L2 sensitivity
  2 C sqrt(B), noise std sigma C, so the accountant's noise multiplier is again
  sigma / (2 sqrt(B)). Dividing by n scales both: on the returned mean the noise std is
  sigma C / n and the L2 sensitivity 2 C sqrt(B) / n (ratio unchanged). If one record can
  reach m teachers (shards not proven disjoint), each summed row moves by <= 2Cm: account
  with `dpdfd_event(..., teachers_per_record=m)` (noise multiplier sigma / (2m sqrt(B))).

  Args:
    key: a `jax.random.key`, used once for the (B, K) noise draw.
    per_teacher_grads: (n, B, K) teacher t's output gradient for query i at [t, i].
    l2_clip_norm: C > 0, bound on each teacher's row.
    noise_multiplier: sigma >= 0.
    stability: e >= 0 of `normalize_rows` (ignored by "clip").
    method: "normalize" or "clip".
    secure_noise: the summed rows (|coordinate| <= n C) on an integer grid plus exact
      discrete Gaussian noise of std sigma C (`output_gradient_mechanism`).
    grid_bits: k of the secure grid; None: automatic.
    l2_norm_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    GaussianRelease with `noisy` (B, K) the noisy mean over teachers, `noise_stddev` =
    sigma C / n and `l2_sensitivity` = 2 C sqrt(B) / n.
  """
  bounder = _row_bounder(method)
  l2_clip_norm = validation.renamed_keyword(
      "multi_teacher_output_gradients", new="l2_clip_norm", new_value=l2_clip_norm,
      old="l2_norm_bound", old_value=l2_norm_bound)
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  validation.check_float("stability", stability, positive=False)
  chex.assert_rank(per_teacher_grads, 3)
  chex.assert_type(per_teacher_grads, float)
  num_teachers, batch_size, _ = per_teacher_grads.shape
  bounded = jax.vmap(lambda g: bounder(g, l2_clip_norm, stability))(per_teacher_grads)
  summed = jnp.sum(bounded, axis=0)  # (B, K)
  noise_stddev_of_sum = noise_multiplier * l2_clip_norm
  if secure_noise:
    grid = secure_gaussian.choose_grid(noise_multiplier=noise_multiplier, bound=l2_clip_norm,
                                       max_abs=float(num_teachers), grid_bits=grid_bits)
    noisy_mean = secure_gaussian.add_grid_noise(key, summed, grid) / num_teachers
  else:
    noise = jax.random.normal(key, summed.shape, summed.dtype)  # (B, K)
    noisy_mean = (summed + noise_stddev_of_sum * noise) / num_teachers
  chex.assert_shape(noisy_mean, per_teacher_grads.shape[1:])
  return GaussianRelease(
      noisy=noisy_mean,
      noise_stddev=jnp.asarray(noise_stddev_of_sum / num_teachers, noisy_mean.dtype),
      l2_sensitivity=jnp.asarray(
          2.0 * l2_clip_norm * math.sqrt(batch_size) / num_teachers, noisy_mean.dtype),
  )


def sanitize(
    key: jax.Array,
    knowledge: jax.Array,
    *,
    l2_clip_norm: float | None = None,
    noise_multiplier: float,
    l2_bound: float | None = None,
) -> GaussianRelease:
  """RONA's sanitizer: bound the whole batch tensor, then add Gaussian noise.

  The **whole** tensor (all rows together) is scaled to Frobenius norm <= B by
  `x * min(1, B / ||x||_F)`, then N(0, sigma^2 B^2) is added to every coordinate.
  Replace-one sensitivity: the teacher is not private, so the whole tensor can change, from
  one point of the norm-B ball to another: 2B. Noise std sigma B, so the accountant's noise
  multiplier is sigma / 2. A tensor containing any NaN/inf is replaced by zeros.

  Sanitize the teacher-side quantity the student learns from (soft labels, hint features),
  not a scalar loss value: noise added to a loss value is a constant shift that changes no
  gradient, so it gives no privacy to what the student actually receives.

  Args:
    key: a `jax.random.key`, used once for the noise draw.
    knowledge: (B, ...) teacher-side tensor for the query batch.
    l2_clip_norm: B > 0, the Frobenius-norm bound of the whole tensor.
    noise_multiplier: sigma >= 0.
    l2_bound: the old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`).

  Returns:
    GaussianRelease with `noisy` (same shape as `knowledge`), `noise_stddev` = sigma B and
    `l2_sensitivity` = 2B.
  """
  l2_clip_norm = validation.renamed_keyword(
      "sanitize", new="l2_clip_norm", new_value=l2_clip_norm, old="l2_bound",
      old_value=l2_bound)
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  chex.assert_rank(knowledge, {1, 2, 3, 4, 5})
  chex.assert_type(knowledge, float)
  # Treat the whole tensor as one row so the row helpers bound the Frobenius norm.
  as_one_row = knowledge[None]  # (1, B, ...)
  bounded = clip_rows(as_one_row, l2_clip_norm)[0]  # (B, ...)
  noise_stddev = noise_multiplier * l2_clip_norm
  noise = jax.random.normal(key, bounded.shape, bounded.dtype)
  noisy = bounded + noise_stddev * noise
  chex.assert_equal_shape((noisy, knowledge))
  return GaussianRelease(
      noisy=noisy,
      noise_stddev=jnp.asarray(noise_stddev, noisy.dtype),
      l2_sensitivity=jnp.asarray(2.0 * l2_clip_norm, noisy.dtype),
  )
