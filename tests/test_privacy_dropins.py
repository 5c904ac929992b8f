"""The mechanisms as drop-ins for a user's JAX code: `clipped_grad`, the optax privatizer and
`PlanAccountant` from one plan, the DPDFD student update and step, explicit relations, quiet
calibration. Small models only: the whole file runs in seconds."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpkd_jax import privacy
from dpkd_jax.methods.dpdfd import step as dpdfd_method_step
from dpkd_jax.models import ghost
from dpkd_jax.privacy import dpdfd_update
from dpkd_jax.privacy import neighbouring


class _Net(nnx.Module):
  """A user's model: no `train` argument, a convolution, a GroupNorm and a dense layer."""

  def __init__(self, rngs):
    self.conv = nnx.Conv(1, 4, (3, 3), strides=2, rngs=rngs)
    self.norm = nnx.GroupNorm(4, num_groups=2, rngs=rngs)
    self.out = nnx.Linear(4 * 4 * 4, 3, rngs=rngs)

  def __call__(self, x):  # (B, 8, 8, 1) -> (B, 3)
    return self.out(nnx.relu(self.norm(self.conv(x))).reshape(x.shape[0], -1))


@pytest.fixture(scope="module")
def model():
  graphdef, param_state, rest = nnx.split(_Net(nnx.Rngs(0)), nnx.Param, ...)
  params = nnx.to_pure_dict(param_state)

  def loss_fn(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(
        nnx.merge(graphdef, p, rest)(x), y).mean()

  x = jax.random.normal(jax.random.key(1), (8, 8, 8, 1))
  return graphdef, params, loss_fn, x, jnp.arange(8) % 3


def _close(a, b, atol):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(u, v, atol=atol)


def test_clipped_grad_is_the_mechanisms_clipped_sum(model):
  graphdef, params, loss_fn, x, y = model
  mask = jnp.arange(8) < 5
  # Every path jitted (as a user's step runs it): eagerly, each op compiled on its own.
  @jax.jit
  def reference(params, x, y):
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(params, x[:, None], y[:, None])
    return privacy.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=0.1)
  expected, norms = reference(params, x, y)
  clipped = privacy.clipped_grad(loss_fn, l2_clip_norm=0.1, batch_argnums=(1, 2),
                                 return_norms=True)
  total, got_norms = jax.jit(clipped)(params, x, y, mask=mask)
  _close(total, expected, 1e-6)
  np.testing.assert_allclose(got_norms, norms, rtol=1e-5)
  chunked = privacy.clipped_grad(loss_fn, l2_clip_norm=0.1, batch_argnums=(1, 2),
                                 microbatch_size=2)
  _close(jax.jit(chunked)(params, x, y, mask=mask), expected, 1e-6)
  by_ghost = ghost.clipped_grad(graphdef, l2_clip_norm=0.1, has_aux=True, loss_fn=lambda out, t: (
      optax.softmax_cross_entropy_with_integer_labels(out, t)))
  ghost_total, (losses, outputs) = jax.jit(by_ghost)(params, x, y, mask=mask)
  _close(ghost_total, expected, 1e-5)
  assert losses.shape == (8,) and outputs.shape == (8, 3)
  # Padding rows contribute nothing: the sum over the 5 real rows alone.
  _close(jax.jit(clipped)(params, x[:5], y[:5])[0], expected, 1e-6)


def test_clipped_grad_arguments_and_sensitivity(model):
  _, params, loss_fn, x, y = model
  clipped = privacy.clipped_grad(loss_fn, l2_clip_norm=0.5, batch_argnums=(1, 2))
  assert clipped.sensitivity("replace-one") == 1.0
  assert clipped.sensitivity("add-remove") == 0.5
  with pytest.raises(ValueError, match="neighbouring relation"):
    clipped.sensitivity("replace-special")
  with pytest.raises(TypeError):
    clipped.sensitivity()  # pylint: disable=no-value-for-parameter
  with pytest.raises(ValueError, match="batch_argnums"):
    privacy.clipped_grad(loss_fn, l2_clip_norm=0.5, batch_argnums=0)
  with pytest.raises(ValueError, match="divisible"):
    privacy.clipped_grad(loss_fn, l2_clip_norm=0.5, batch_argnums=(1, 2),
                         microbatch_size=3)(params, x, y)
  with pytest.raises(ValueError, match="mask"):
    clipped(params, x, y, mask=jnp.ones(3, bool))
  # has_aux: per-example aux rows beside the sum, also through microbatches and ghost.
  def with_aux(p, xi, yi):
    return loss_fn(p, xi, yi), yi * 10
  for micro in (None, 4):
    total, aux, norms = privacy.clipped_grad(
        with_aux, l2_clip_norm=0.5, batch_argnums=(1, 2), has_aux=True, return_norms=True,
        microbatch_size=micro)(params, x, y)
    _close(total, clipped(params, x, y), 1e-6)
    np.testing.assert_array_equal(aux[:, 0], y * 10)
    assert norms.shape == (8,)
  # keep_batch_dim=False hands the loss one unbatched example; a shared argument stays whole.
  def unbatched(p, xi, scale):
    return scale * jnp.sum(p["w"] * xi)
  plain = privacy.clipped_grad(unbatched, l2_clip_norm=100.0, keep_batch_dim=False)
  rows = jnp.arange(6.0).reshape(3, 2)
  np.testing.assert_allclose(plain({"w": jnp.ones(2)}, rows, 2.0)["w"], 2 * rows.sum(0))


def _plan(**overrides):
  args = dict(num_examples=1000, expected_batch_size=50, steps=20, l2_clip_norm=2.0,
              delta=1e-5, noise_multiplier=1.5)
  return privacy.dpsgd_plan(**{**args, **overrides})


def test_privatizer_takes_z_c_and_b_from_the_plan():
  zeros = {"w": jnp.zeros(20_000)}
  quiet = privacy.dpsgd_privatizer(_plan(noise_multiplier=0.0), key=jax.random.key(0))
  ones = {"w": jnp.ones(4)}
  out, _ = quiet.update(ones, quiet.init(ones))
  np.testing.assert_allclose(out["w"], 1 / 50, rtol=1e-6)  # the sum / the expected batch
  plan = _plan()
  tx = privacy.dpsgd_privatizer(plan, key=jax.random.key(0))
  state = tx.init(zeros)
  first, state = jax.jit(tx.update)(zeros, state)
  second, _ = jax.jit(tx.update)(zeros, state)
  assert abs(float(jnp.std(first["w"])) - 1.5 * 2.0 / 50) < 0.002  # z C / B
  assert not np.allclose(first["w"], second["w"])  # a fresh draw at every update
  louder = privacy.dpsgd_privatizer(dataclasses.replace(plan, noise_multiplier=3.0),
                                    key=jax.random.key(0))
  noisy, _ = louder.update(zeros, louder.init(zeros))
  np.testing.assert_allclose(noisy["w"], 2 * first["w"], rtol=1e-5)  # σ has one source


def test_accountant_charges_the_plan_event_and_stops_at_its_steps():
  plan = _plan(noise_multiplier=None, target_epsilon=3.0)
  assert plan.relation == "replace-one" and plan.sound_epsilon <= 3.0
  accountant = privacy.PlanAccountant(plan)
  assert accountant.epsilon() == 0.0
  accountant.step(plan.steps)
  assert accountant.epsilon() == pytest.approx(plan.sound_epsilon)
  assert accountant.epsilon(relation="add-remove") < accountant.epsilon()
  with pytest.raises(privacy.BudgetExceededError):
    accountant.step()
  noisier = privacy.PlanAccountant(dataclasses.replace(plan, noise_multiplier=5.0))
  noisier.step(plan.steps)
  assert noisier.epsilon() < plan.sound_epsilon
  with pytest.raises(ValueError, match="exactly one"):
    _plan(target_epsilon=3.0)


def test_event_builders_ask_for_the_relation():
  with pytest.raises(TypeError):  # pylint: disable-next=missing-kwoa
    privacy.dpsgd_event(noise_multiplier=1.0, sampling_rate=0.1, steps=1)
  assert neighbouring.relation_of(_plan().event(3)) == "replace-one"
  assert neighbouring.relation_of(privacy.dpdfd_event(
      noise_multiplier=1.0, batch_size=4, steps=2)) == "replace-one"


def test_calibration_on_a_poisson_event_logs_no_warning(caplog):
  caplog.set_level(logging.WARNING)
  z = privacy.calibrate_noise_multiplier(
      lambda z: privacy.dpsgd_event(noise_multiplier=z, sampling_rate=256 / 1437, steps=300,
                                    relation="add-remove"),
      target_epsilon=8.0, delta=1e-5)
  assert z > 0
  assert not [r for r in caplog.records if "converge" in r.getMessage()]
  absl_logger = logging.getLogger("absl")
  assert not absl_logger.filters  # the filter is scoped to the search


def test_student_target_and_loss_are_the_methods():
  s = jax.random.normal(jax.random.key(0), (4, 5))
  noisy = jax.random.normal(jax.random.key(1), (4, 5))
  target = privacy.dpdfd_student_target(s, noisy, 0.3)
  np.testing.assert_allclose(target, s - 0.3 * noisy, rtol=1e-6)
  grad = jax.grad(privacy.dpdfd_student_loss)(s, noisy, 0.3)
  np.testing.assert_allclose(grad, 0.3 * noisy / 4, rtol=1e-5)  # γ g~ / B
  for kind in ("mse", "ce", "l1"):
    np.testing.assert_array_equal(dpdfd_method_step.student_loss_rows(kind, s, target),
                                  dpdfd_update.student_loss_rows(kind, s, target))
  with pytest.raises(ValueError, match="student loss"):
    dpdfd_update.student_loss_rows("kl", s, target)


def test_dpdfd_step_with_user_apply_functions():
  def linear(p, x):  # (B, 6) -> (B, 3)
    return x.reshape(x.shape[0], -1) @ p["w"]

  def generate(p, z):  # (B, 2) -> (B, 6)
    return jnp.tanh(z @ p["w"])

  plan = privacy.dpdfd_plan(batch_size=4, steps=3, delta=1e-5, noise_multiplier=2.0,
                            l2_clip_norm=0.5)
  step = privacy.dpdfd_step(plan, teacher_apply=linear, student_apply=linear,
                            generator_apply=generate, student_tx=optax.sgd(0.1),
                            generator_tx=optax.sgd(0.1), gamma=1.0, latent_dim=2)
  init = lambda key, shape: {"w": jax.random.normal(key, shape)}  # noqa: E731
  state = step.init(init(jax.random.key(0), (6, 3)), init(jax.random.key(1), (2, 6)))
  teacher = init(jax.random.key(2), (6, 3))
  new_state, metrics = jax.jit(step)(state, teacher, jax.random.key(3))
  assert float(metrics["noise_std"]) == pytest.approx(2.0 * 0.5)  # σ C from the plan
  assert not np.allclose(new_state.student_params["w"], state.student_params["w"])
  assert not np.allclose(new_state.generator_params["w"], state.generator_params["w"])
  accountant = privacy.PlanAccountant(plan)
  accountant.step()
  assert accountant.epsilon() == pytest.approx(privacy.epsilon(
      privacy.dpdfd_event(noise_multiplier=2.0, batch_size=4, steps=1), delta=1e-5))
  with pytest.raises(ValueError, match="student_loss"):
    privacy.dpdfd_step(plan, teacher_apply=linear, student_apply=linear,
                       generator_apply=generate, student_tx=optax.sgd(0.1),
                       generator_tx=optax.sgd(0.1), gamma=1.0, latent_dim=2,
                       student_loss="kl")


def test_the_clis_plan_drives_the_privatizer_and_the_accountant():
  from dpkd_jax.methods import dpsgd  # pylint: disable=import-outside-toplevel
  config = dpsgd.DPSGDConfig(dataset="digits", model="small_cnn", norm="group",
                             expected_batch_size=64, l2_clip_norm=0.5, noise_multiplier=0.0,
                             steps=4)
  plan = dpsgd.make_plan(config, num_examples=1000, num_devices=1)
  tx = privacy.dpsgd_privatizer(plan, key=jax.random.key(0))
  ones = {"w": jnp.ones(3)}
  out, _ = tx.update(ones, tx.init(ones))
  np.testing.assert_allclose(out["w"], 1 / 64, rtol=1e-6)  # z = 0: the sum / B
  accountant = privacy.PlanAccountant(plan)
  accountant.step(plan.steps)
  assert accountant.event() == plan.event(plan.steps)
