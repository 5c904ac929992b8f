"""DPDFD's student update for a user's own models: the target, the loss, a whole private step.

A release g~ = A_{C,σ}(g) of the teacher-side output gradients (`output_gradient_mechanism`)
becomes the student's target y_s = stop_gradient(s − γ g~) (`dpdfd_student_target`); the student
fits it with L_S (`dpdfd_student_loss`: with "mse", 0.5||s − y_s||², whose gradient w.r.t. s is
exactly γ g~, the noisy rows pulled back through the student's VJP). Everything after the
release is post-processing, so ε is `dpdfd_event` of the rows released.

`dpdfd_step(...)` builds Algorithm 1 from three apply functions of the user's
(`generator_apply(params, z)`, `student_apply(params, x)`, `teacher_apply(params, x)`, each on a
batch) and two optax optimizers; σ, C, B and the bound come from a `DPDFDReleasePlan`
(`dpdfd_plan`), whose `event(n)` the user's `PlanAccountant` charges. The library's DPDFD method
(`methods/dpdfd/step.py`) builds its targets and student losses with the same functions.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from dp_accounting import dp_event

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import calibration
from dpkd_jax.privacy import mechanisms
from dpkd_jax.privacy import plan as plan_lib
from dpkd_jax.privacy import validation

PyTree = Any
STUDENT_LOSSES = ("mse", "ce", "l1")


def dpdfd_student_target(student_logits: jax.Array, noisy_rows: jax.Array,
                         gamma: float) -> jax.Array:
  """y_s = stop_gradient(s − γ g~): (B, K) student logits and (B, K) released rows -> (B, K)."""
  return jax.lax.stop_gradient(student_logits - gamma * noisy_rows)


def student_loss_rows(kind: str, logits: jax.Array, target: jax.Array) -> jax.Array:
  """L_S per row, (B,), of (B, K) logits to a (B, K) target: "mse" 0.5||s − y||², "ce"
  CE(s, softmax(y)), "l1" ||s − y||₁ (its gradient is the sign of the released row)."""
  if kind == "ce":
    return optax.softmax_cross_entropy(logits, jax.nn.softmax(target))
  if kind == "l1":
    return jnp.sum(jnp.abs(logits - target), axis=-1)
  if kind != "mse":
    raise ValueError(f"student loss must be one of {STUDENT_LOSSES}, got {kind!r}")
  return 0.5 * jnp.sum(jnp.square(logits - target), axis=-1)


def dpdfd_student_loss(student_logits: jax.Array, noisy_rows: jax.Array, gamma: float, *,
                       kind: str = "mse") -> jax.Array:
  """The batch mean of L_S(s, y_s) with y_s = `dpdfd_student_target` (a constant): its
  gradient w.r.t. the (B, K) logits s is γ g~ / B for "mse"."""
  target = dpdfd_student_target(student_logits, noisy_rows, gamma)
  return student_loss_rows(kind, student_logits, target).mean()


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPDFDReleasePlan(plan_lib.Plan):
  """T releases of B bounded rows with N(0, σ²C²) noise (replace-one, `dpdfd_event`).

  Attributes:
    noise_multiplier: σ. l2_clip_norm: C. batch_size: B, rows per release.
    bound_method: "normalize" (paper) or "clip". stability: e of `normalize_rows`.
  """

  noise_multiplier: float
  l2_clip_norm: float
  batch_size: int
  bound_method: str = "normalize"
  stability: float = 1e-6

  @property
  def steps(self) -> int:
    """T: the planned steps (= `releases`)."""
    return self.releases

  @property
  def l2_norm_bound(self) -> float:
    """The old name of `l2_clip_norm` (deprecated: a `DeprecationWarning`)."""
    warnings.warn("l2_norm_bound is deprecated, use l2_clip_norm (same meaning)",
                  DeprecationWarning, stacklevel=2)
    return self.l2_clip_norm

  def event(self, releases: int) -> dp_event.DpEvent:
    return accounting.dpdfd_event(noise_multiplier=self.noise_multiplier,
                                  batch_size=self.batch_size, steps=releases)


def dpdfd_plan(*, batch_size: int, steps: int, delta: float, l2_clip_norm: float | None = None,
               noise_multiplier: float | None = None, target_epsilon: float | None = None,
               bound_method: str = "normalize", stability: float = 1e-6,
               l2_norm_bound: float | None = None) -> DPDFDReleasePlan:
  """σ given, or calibrated for `target_epsilon` over T steps of B rows, in a frozen plan
  (`l2_clip_norm` C defaults to 1; `l2_norm_bound` is its deprecated old name)."""
  if l2_clip_norm is None and l2_norm_bound is None:
    l2_clip_norm = 1.0
  l2_clip_norm = validation.renamed_keyword(
      "dpdfd_plan", new="l2_clip_norm", new_value=l2_clip_norm, old="l2_norm_bound",
      old_value=l2_norm_bound)
  batch_size = validation.check_int("batch_size", batch_size, minimum=1)
  steps = validation.check_int("steps", steps, minimum=1)
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  if bound_method not in ("normalize", "clip"):
    raise ValueError(f"bound_method must be 'normalize' or 'clip', got {bound_method!r}")
  if (noise_multiplier is None) == (target_epsilon is None):
    raise ValueError("give exactly one of noise_multiplier and target_epsilon")
  if noise_multiplier is None:
    noise_multiplier = calibration.calibrate_dpdfd_noise_multiplier(
        target_epsilon=target_epsilon, delta=delta, batch_size=batch_size, steps=steps)
  sigma = validation.check_float("noise_multiplier", noise_multiplier, positive=False)
  sound = math.inf if sigma == 0 else accounting.epsilon(
      accounting.dpdfd_event(noise_multiplier=sigma, batch_size=batch_size, steps=steps),
      delta=delta)
  return DPDFDReleasePlan(
      releases=steps, delta=delta, sound_epsilon=sound,
      budget_epsilon=plan_lib.budget(target_epsilon=target_epsilon, accounting="sound",
                                     sound_epsilon=sound),
      noise_multiplier=sigma, l2_clip_norm=float(l2_clip_norm), batch_size=batch_size,
      bound_method=bound_method, stability=float(stability))


class DPDFDStepState(NamedTuple):
  """Student and generator parameters and their optimizer states (the teacher is not here)."""

  student_params: PyTree
  student_opt: PyTree
  generator_params: PyTree
  generator_opt: PyTree


def logit_gap(student_logits: jax.Array, teacher_logits: jax.Array) -> jax.Array:
  """g = ∂ 0.5||s − t||² / ∂s = s − t, (B, K): the default teacher-side output gradient."""
  return student_logits - teacher_logits


@dataclasses.dataclass(frozen=True)
class DPDFDStep:
  """`step(state, teacher_params, key) -> (state, metrics)`; `init(student, generator)`.

  One key per step (split it in the loop); the noise, the latents z ~ N(0, I) (B, latent_dim)
  and nothing else are drawn from it. Metrics are post-release values only.
  """

  plan: Any
  teacher_apply: Callable
  student_apply: Callable
  generator_apply: Callable
  student_tx: optax.GradientTransformation
  generator_tx: optax.GradientTransformation
  gamma: float
  latent_dim: int
  output_grad_fn: Callable = logit_gap
  student_loss: str = "mse"
  generator_loss: Callable | None = None

  def init(self, student_params: PyTree, generator_params: PyTree) -> DPDFDStepState:
    return DPDFDStepState(student_params, self.student_tx.init(student_params),
                          generator_params, self.generator_tx.init(generator_params))

  def _student_objective(self, params, images, target):
    """L_S of the student's (B, K) logits on `images` to the constant target, plus the user's
    teacher-free generator term (if any) on the same logits: the generator's objective."""
    logits = self.student_apply(params, images)
    loss = student_loss_rows(self.student_loss, logits, target).mean()
    return loss + (0.0 if self.generator_loss is None else self.generator_loss(logits))

  def __call__(self, state: DPDFDStepState, teacher_params: PyTree, key: jax.Array):
    plan = self.plan
    z_key, noise_key = jax.random.split(key)
    z = jax.random.normal(z_key, (plan.batch_size, self.latent_dim))  # public latents
    x, generator_vjp = jax.vjp(lambda p: self.generator_apply(p, z), state.generator_params)
    x_const = jax.lax.stop_gradient(x)
    s, student_vjp = jax.vjp(lambda p: self.student_apply(p, x_const), state.student_params)
    t = jax.lax.stop_gradient(self.teacher_apply(teacher_params, x_const))  # (B, K)
    release = mechanisms.output_gradient_mechanism(  # the only release: (B, K) noisy rows
        noise_key, self.output_grad_fn(s, t), l2_clip_norm=plan.l2_clip_norm,
        noise_multiplier=plan.noise_multiplier, stability=plan.stability,
        method=plan.bound_method)
    target = dpdfd_student_target(s, release.noisy, self.gamma)
    s_loss, d_logits = jax.value_and_grad(
        lambda logits: student_loss_rows(self.student_loss, logits, target).mean())(s)
    (s_grads,) = student_vjp(d_logits)
    updates, student_opt = self.student_tx.update(s_grads, state.student_opt,
                                                  state.student_params)
    student_params = optax.apply_updates(state.student_params, updates)
    # Generator: L_S (+ the user's term) through the updated student, y_s constant.
    g_loss, d_images = jax.value_and_grad(
        lambda images: self._student_objective(student_params, images, target))(x_const)
    (g_grads,) = generator_vjp(d_images)
    updates, generator_opt = self.generator_tx.update(g_grads, state.generator_opt,
                                                      state.generator_params)
    generator_params = optax.apply_updates(state.generator_params, updates)
    metrics = {"student_loss": s_loss, "generator_loss": g_loss,
               "noise_std": release.noise_stddev}
    return DPDFDStepState(student_params, student_opt, generator_params, generator_opt), metrics


def dpdfd_step(plan: Any, *, teacher_apply: Callable, student_apply: Callable,
               generator_apply: Callable, student_tx: optax.GradientTransformation,
               generator_tx: optax.GradientTransformation, gamma: float, latent_dim: int,
               output_grad_fn: Callable = logit_gap, student_loss: str = "mse",
               generator_loss: Callable | None = None) -> DPDFDStep:
  """A private DPDFD step (Algorithm 1) from the user's apply functions (module docstring).

  Args:
    plan: a `DPDFDReleasePlan` (`dpdfd_plan`): σ, C, B, the bound and its event.
    teacher_apply, student_apply: (params, (B, ...) images) -> (B, K) logits.
    generator_apply: (params, (B, latent_dim) latents) -> (B, ...) images.
    student_tx, generator_tx: optax optimizers of the two updates.
    gamma: γ of y_s = s − γ g~. latent_dim: the generator's input width.
    output_grad_fn: (s, t) -> (B, K) per-row gradient of the teacher loss w.r.t. s (default
      `logit_gap`, the gradient of 0.5||s − t||²); it sees the teacher's logits, so only its
      release leaves the step.
    student_loss: "mse", "ce" or "l1" (`student_loss_rows`).
    generator_loss: optional teacher-free term on the student's (B, K) logits of x (e.g. an
      entropy prior), added to the generator's objective.

  Returns:
    A `DPDFDStep`; wrap it in `jax.jit`. Charge each call with `PlanAccountant(plan).step()`.
  """
  if student_loss not in STUDENT_LOSSES:
    raise ValueError(f"student_loss must be one of {STUDENT_LOSSES}, got {student_loss!r}")
  validation.check_int("latent_dim", latent_dim, minimum=1)
  return DPDFDStep(plan, teacher_apply, student_apply, generator_apply, student_tx,
                   generator_tx, float(gamma), latent_dim, output_grad_fn, student_loss,
                   generator_loss)
