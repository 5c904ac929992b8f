"""DP-SGD's step (`methods/dpsgd/step.py`): clipping, noise, normaliser, 8 devices == 1, no
retracing. Fixtures in `dpsgd_fixtures.py`. Tolerances: float32 sums in another order agree to
~1e-6: atol 1e-5.
"""

import math

import chex
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpkd_jax import data
from dpkd_jax.methods import dpsgd
from dpkd_jax.methods.dpsgd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.train import averaging
from dpkd_jax.train import sharding
from dpsgd_fixtures import NUM_REAL, inputs, key, make_config, make_plan, make_step


def test_no_noise_huge_clip_is_sgd_on_summed_gradient_over_expected_batch(parts, batch):
  config = make_config(noise_multiplier=0.0, l2_clip_norm=1e6)
  step = make_step(config)
  new_state, metrics = step(*inputs(parts, config, batch), key(1))
  images, labels, mask = batch

  def summed_loss(params):  # plain batch forward; GroupNorm keeps examples independent
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats,
                        data.normalize(jnp.asarray(images), config.info), train=True)
    losses = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels)  # (M,)
    return jnp.sum(jnp.where(mask, losses, 0.0)) / config.expected_batch_size

  grads = jax.jit(jax.grad(summed_loss))(parts.params)
  expected = jax.tree.map(lambda p, g: p - 0.5 * g, parts.params, grads)
  chex.assert_trees_all_close(jax.device_get(new_state.params), expected, atol=1e-5, rtol=1e-5)
  assert float(metrics["batch_size"]) == NUM_REAL
  assert float(metrics["clipped_fraction"]) == 0.0
  assert int(new_state.step) == 1


def _norms(tree):
  """(B,) L2 norms over the whole pytree of each example (NumPy reference)."""
  return np.sqrt(sum(np.sum(np.square(np.asarray(g).reshape(g.shape[0], -1)), axis=1)
                     for g in jax.tree.leaves(tree)))


@pytest.fixture(scope="module")
def per_example(parts):
  """Gradient-like pytree: the model's parameter shapes with a leading axis of 8 examples,
  scaled so the example norms span 0.02..50 (clipped by some C values and not by others)."""
  # NumPy for test data: one eager jax.random draw per leaf shape compiles for seconds each.
  rng = np.random.default_rng(7)
  grads = jax.tree.map(lambda p: rng.standard_normal((8,) + p.shape, np.float32), parts.params)
  target = np.geomspace(0.02, 50.0, 8)
  scale = target / _norms(grads)
  return jax.tree.map(lambda g: g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), grads)


_clip = jax.jit(dpsgd_mechanism.clip_per_example_gradients)  # C traced: one compile, every C


@pytest.mark.parametrize("clip_norm", [0.1, 8.0, 1e4])
def test_every_clipped_per_example_norm_is_at_most_clip_norm(per_example, clip_norm):
  grads = per_example
  clipped, norms = _clip(grads, clip_norm)
  chex.assert_trees_all_equal_shapes(clipped, grads)
  np.testing.assert_allclose(norms, _norms(grads), rtol=1e-5)
  clipped_norms = _norms(clipped)
  assert np.all(clipped_norms <= clip_norm * (1 + 1e-5))
  # Short gradients are untouched; long ones keep their direction at norm C.
  scale = np.minimum(1.0, clip_norm / _norms(grads))  # (8,)
  chex.assert_trees_all_close(
      clipped, jax.tree.map(lambda g: g * scale.reshape((-1,) + (1,) * (g.ndim - 1)), grads),
      rtol=1e-5, atol=1e-7)
  if clip_norm == 8.0:  # norms span 0.02..50: this C clips some examples and not others
    assert 0 < np.sum(_norms(grads) > clip_norm) < 8


def test_non_finite_example_gradient_becomes_zero():
  grads = {"w": jnp.array([[3.0, 4.0], [jnp.nan, 1.0], [0.0, 0.0]]),
           "b": jnp.array([[0.0], [1.0], [0.0]])}
  clipped, norms = _clip(grads, 1.0)
  chex.assert_trees_all_close(clipped["w"], jnp.array([[0.6, 0.8], [0.0, 0.0], [0.0, 0.0]]),
                              atol=1e-7)
  chex.assert_trees_all_equal(clipped["b"], jnp.zeros((3, 1)))
  assert norms[0] == pytest.approx(5.0) and not np.isfinite(norms[1]) and norms[2] == 0.0


def test_noise_std_of_update_is_z_times_clip_over_expected_batch(parts, batch,
                                                                noisy_step_8_devices):
  config, step = noisy_step_8_devices
  new_a, _ = step(*inputs(parts, config, batch), key(1))
  new_b, _ = step(*inputs(parts, config, batch), key(2))
  # Same data and clipped sum, different noise: the first (plain SGD) step moves the params by
  # lr (G + n) / (q N), so new_a - new_b = lr (n_b - n_a) / (q N) has per-coordinate std
  # lr sqrt(2) z C / (q N) = 0.5 * sqrt(2) * 1 * 2 / 16.
  diff, _ = jax.flatten_util.ravel_pytree(
      jax.tree.map(lambda a, b: a - b, jax.device_get(new_a.params), jax.device_get(new_b.params)))
  expected_std = 0.5 * math.sqrt(2) * 1.0 * 2.0 / 16
  # ~15.8k coordinates: one sigma of the sample std is ~0.6%, so 3% is 5 sigma; same for the mean.
  assert diff.size > 15_000
  assert float(jnp.std(diff)) == pytest.approx(expected_std, rel=0.03)
  assert abs(float(jnp.mean(diff))) < 5 * expected_std / math.sqrt(diff.size)


def test_eight_devices_equal_one_device(parts, batch, noisy_step_8_devices):
  config, step8 = noisy_step_8_devices
  new8, metrics8 = step8(*inputs(parts, config, batch), key(3))
  mesh1 = sharding.data_mesh(jax.devices()[:1])
  step1 = make_step(config, mesh1)
  new1, metrics1 = step1(*inputs(parts, config, batch, mesh1), key(3, mesh1))
  chex.assert_trees_all_close(jax.device_get(new8.params), jax.device_get(new1.params),
                              atol=1e-5)
  chex.assert_trees_all_close(jax.device_get(metrics8), jax.device_get(metrics1), rtol=1e-5)
  # One device sees every row, so equality also shows that devices 1..7 contributed (each
  # example moves the update by up to lr C / (q N) = 0.06, far above the tolerance).
  assert float(metrics8["batch_size"]) == NUM_REAL
  assert 0.0 < float(metrics8["clipped_fraction"]) <= 1.0


def test_trace_guard_catches_a_retrace(parts, batch):
  """The guard of `noisy_step_8_devices` (and `runs`) is live: a new batch shape fails.

  No `chex.clear_trace_counter()` here: it would also reset the count of the guarded step.
  """
  config = make_config()
  step = jax.jit(chex.assert_max_traces(
      step_lib.build_train_step(make_plan(config), config.info, sharding.data_mesh()), n=1))
  state, *rows = inputs(parts, config, batch)
  step.trace(state, *rows, key(0))
  with pytest.raises(AssertionError, match="traced > 1 times"):
    step.trace(state, *(a[:16] for a in rows), key(0))


def _run_steps(step, parts, config, batch, num_steps, mesh=None):
  """(params, metrics) after `num_steps` steps on `batch` with the keys 10, 11, ..."""
  state, *rows = inputs(parts, config, batch, mesh)
  params, metrics = [], []
  for i in range(num_steps):
    state, step_metrics = step(state, *rows, key(10 + i, mesh))
    params.append(jax.device_get(state.params))
    metrics.append(jax.device_get(step_metrics))
  return params, metrics


def _ghost_test_config(model, **kw):
  """C between the smallest and largest per-example gradient norms of the test batch at the
  initial parameters (28..40 for small_cnn, 12..16 for lenet5 on the digits): some examples
  clipped. Small z and learning rate keep 3 steps well-conditioned (no amplification)."""
  return make_config(model=model, l2_clip_norm={"small_cnn": 33.0, "lenet5": 13.5}[model],
                     noise_multiplier=0.1, learning_rate=0.05, **kw)


# One model for the step's plumbing (the same code for every model): small_cnn ran the same step
# with another network, whose ghost sums equal the vmap path's in test_models_ghost.py (the zoo,
# lenet5 and small_cnn with and without GroupNorm, and every layer kind).
GHOST_STEP_MODELS = ["lenet5"]


@pytest.mark.parametrize("model", GHOST_STEP_MODELS)
def test_ghost_clipping_step_equals_the_vmap_step(batch, model):
  # The noise (same keys) is the same draw on both paths: only the clipped sums' rounding
  # differs. 8 devices: each computes its rows' clipped sum (`shard_map`).
  config, ghost_config = _ghost_test_config(model), _ghost_test_config(model, clipping="ghost")
  model_parts = dpsgd.init_model(config, jax.random.key(0))
  plan = make_plan(config)
  assert make_plan(ghost_config) == plan  # the clipping method is not part of the plan
  results = [_run_steps(make_step(c, plan=plan), model_parts, c, batch, 3)
             for c in (config, ghost_config)]
  (vmap_params, vmap_metrics), (ghost_params, ghost_metrics) = results
  assert 0.0 < vmap_metrics[0]["clipped_fraction"] < 1.0
  for after in (0, 2):  # after one step, after three
    chex.assert_trees_all_close(ghost_params[after], vmap_params[after], atol=1e-5, rtol=1e-4)
    chex.assert_trees_all_close(ghost_metrics[after], vmap_metrics[after], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("model", GHOST_STEP_MODELS)
def test_ghost_clipping_step_eight_devices_equal_one_device(batch, model):
  config = _ghost_test_config(model, clipping="ghost")  # 8 devices: compiled above
  model_parts = dpsgd.init_model(config, jax.random.key(0))
  mesh1 = sharding.data_mesh(jax.devices()[:1])
  steps = {mesh: make_step(config, mesh) for mesh in (sharding.data_mesh(), mesh1)}
  (params8, metrics8), (params1, metrics1) = (
      _run_steps(step, model_parts, config, batch, 1, mesh) for mesh, step in steps.items())
  chex.assert_trees_all_close(params8, params1, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(metrics8, metrics1, rtol=1e-5)
  assert float(metrics8[0]["batch_size"]) == NUM_REAL  # every device's rows counted


def test_param_averaging_off_is_the_plain_optimizer():
  # decay 0: the very optimizer (and so the step, state and checkpoint) of a run without it.
  plain, off = make_config(), make_config(param_averaging_decay=0.0)
  assert step_lib.make_optimizer(off) is step_lib.make_optimizer(plain)
  state = dpsgd.init_state(off, jax.random.key(0))
  assert averaging.averaged_params(state) is state.params
  averaged = make_config(param_averaging_decay=0.9, param_averaging_start_step=1)
  tx = step_lib.make_optimizer(averaged)
  assert tx is step_lib.make_optimizer(averaged)  # cached: one compiled step per setting
  state = dpsgd.init_state(averaged, jax.random.key(0))
  assert isinstance(state.opt_state, averaging.ParamAveragingState)
  chex.assert_trees_all_equal(state.opt_state.inner, step_lib.make_optimizer(plain).init(
      state.params))
  chex.assert_trees_all_equal(dpsgd.released_parts(state).params, state.params)
