"""The disagreement generator's probes: random directions and forward-difference ascents.

The disagreement generator never differentiates through the teacher. It queries the probes
x + δu beside each sample x, with u uniform on the unit sphere, in the same release as the
samples, and estimates the gradient of a function of the released rows from their
differences (DFME's estimator, Truong et al. 2021): ∇F(x) ≈ d/m Σ_j (F(x + δu_j) - F(x))/δ·u_j.
Three such functions: the released disagreement D = γ‖g̃‖₁ (`disagreement_ascent`), the
class balance of the released targets y_s (`released_balance_ascent`) and their distance to the
classes a class-conditional generator was asked for (`released_class_descent`). Both read released
rows and the student only: post-processing of the release (docs/privacy.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dpkd_jax import losses
from dpkd_jax.models import core
from dpkd_jax.train.state import TrainState


def unit_directions(key: jax.Array, x: jax.Array, count: int) -> jax.Array:
  """(count, B, ...) directions uniform on the unit sphere of one sample's space (x: (B, ...))."""
  u = jax.random.normal(key, (count,) + x.shape, x.dtype)
  norms = jnp.sqrt(jnp.sum(jnp.square(u.reshape(count, x.shape[0], -1)), axis=-1))
  return u / norms.reshape(norms.shape + (1,) * (x.ndim - 1))


def disagreement_ascent(gamma: float, noisy: jax.Array, directions: jax.Array,
                        *, step: float) -> tuple[jax.Array, dict[str, jax.Array], jax.Array]:
  """The disagreement generator's gradient, from released rows only (DFME's estimator).

  D(x) = ||s(x) - y_s(x)||_1 = γ||g~(x)||_1 is read off the released rows; with u_j uniform on
  the unit sphere of the d-dimensional sample space, ∇D(x) ≈ d/m Σ_j (D(x + δu_j) - D(x))/δ·u_j
  (forward differences). The generator ascends D: its loss is -Σ_i <∇D(x_i), x_i>/B.

  Args:
    gamma: γ of y_s = s - γ·g̃.
    noisy: (B·(1 + m), K) the release: the B samples' rows, then the m·B probes' (direction
      major, as the step stacks them).
    directions: (m, B, ...) the unit directions u of the probes.
    step: δ.

  Returns:
    (loss, terms, d loss / d x): the mean disagreement negated, {"disagreement": mean D}, and
    the (B, ...) gradient the generator's vjp pulls back.
  """
  batch = directions.shape[1]
  sizes = gamma * jnp.sum(jnp.abs(noisy), axis=-1)  # (B·(1 + m),): D of every query
  grad = _forward_difference_gradient(sizes, directions, step)
  return -jnp.mean(sizes[:batch]), {"disagreement": jnp.mean(sizes[:batch])}, -grad / batch


def released_balance_ascent(targets: jax.Array, directions: jax.Array, *,
                            step: float) -> tuple[jax.Array, jax.Array]:
  """The class balance of the released targets and its gradient, from released rows only.

  H(p̄), p̄ = mean_b softmax(y_s(x_b)), is DAFL's information entropy of the batch as the
  release shows it. Moving x_i moves only p_i, by ∂H/∂p_i = -(log p̄ + 1)/B, so with the
  probes' targets ∇_{x_i} H ≈ d/m Σ_j (F_i(x_i + δu_j) - F_i(x_i))/δ·u_j for
  F_i(x) = -<log p̄, softmax(y_s(x))>/B (the +1 cancels: softmax rows sum to 1).

  Args:
    targets: (B·(1 + m), K) released targets y_s = s - γ·g̃ of the samples, then the probes
      (direction major, as the step stacks them).
    directions: (m, B, ...) the probes' unit directions u.
    step: δ.

  Returns:
    (H, dH/dx (B, ...)).
  """
  batch = directions.shape[1]
  p = jax.nn.softmax(targets, axis=-1)  # (B·(1 + m), K)
  mean = jnp.mean(p[:batch], axis=0)  # (K,)
  log_mean = jnp.log(jnp.maximum(mean, 1e-12))
  entropy = -jnp.sum(mean * log_mean)
  scores = -(p @ log_mean) / batch  # (B·(1 + m),): F of every query
  return entropy, _forward_difference_gradient(scores, directions, step)


def released_class_descent(targets: jax.Array, classes: jax.Array, directions: jax.Array, *,
                           step: float) -> tuple[jax.Array, jax.Array]:
  """How far the released targets are from the classes a class-conditional generator was
  asked for, and its gradient, from released rows only.

  CE_i = -log softmax(y_s(x_i))[c_i], the cross-entropy of the released target of sample i to
  its requested class c_i (`generators.class_coded_latents`). A probe x_i + δu_j asks for c_i
  too, so ∇_{x_i} CE_i ≈ d/m Σ_j (CE_i(x_i + δu_j) - CE_i(x_i))/δ·u_j.

  Args:
    targets: (B·(1 + m), K) released targets y_s of the samples, then the probes (direction
      major, as the step stacks them).
    classes: (B,) int requested classes of the samples.
    directions: (m, B, ...) the probes' unit directions u.
    step: δ.

  Returns:
    (mean CE over the B samples, d mean CE / dx (B, ...)).
  """
  count, batch = directions.shape[:2]
  requested = jnp.tile(classes, 1 + count)  # (B·(1 + m),): a probe asks for its sample's class
  log_p = jax.nn.log_softmax(targets, axis=-1)
  ce = -jnp.take_along_axis(log_p, requested[:, None], axis=-1)[:, 0]  # (B·(1 + m),)
  return jnp.mean(ce[:batch]), _forward_difference_gradient(ce / batch, directions, step)


def _forward_difference_gradient(values: jax.Array, directions: jax.Array,
                                 step: float) -> jax.Array:
  """d/m Σ_j (F(x_b + δu_j) - F(x_b))/δ·u_j, (B, ...), from F of every query: `values`
  (B·(1 + m),), the B samples' then the m·B probes' (direction major); `directions` (m, B, ...)."""
  count, batch = directions.shape[:2]
  dim = directions[0, 0].size
  base, probes = values[:batch], values[batch:].reshape(count, batch)
  slopes = (probes - base[None]) / step  # (m, B)
  return dim / count * jnp.einsum("mb,mb...->b...", slopes, directions)


def diversity_ascent(weight: float, stu: TrainState, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(weight × DAFL information entropy of the student's predictions on x, its gradient
  w.r.t. x (B, ...)): the disagreement generator's class-balance term, teacher-free."""
  def loss_fn(images):
    out, _ = core.apply(stu.graphdef, stu.params, stu.batch_stats, images, train=True)
    return weight * losses.information_entropy(out.logits)

  return jax.value_and_grad(loss_fn)(x)
