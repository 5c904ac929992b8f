"""Tests of privacy/dpsgd_mechanism.py: DP-SGD's clipped sum, its noise and sensitivities.

The clipping itself (norms, non-finite rows) and the sharded step are tested in
test_dpsgd_step.py; here small pytrees check the mechanism's contract.
"""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.privacy import dpsgd_mechanism as mech


def _grads(seed=0, batch=6):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(3.0 * rng.standard_normal((batch, 4, 3)), jnp.float32),
          "b": jnp.asarray(3.0 * rng.standard_normal((batch, 3)), jnp.float32)}


def _flat(tree):
  return np.asarray(jax.flatten_util.ravel_pytree(tree)[0])


def test_clip_and_sum_skips_padding_rows_and_bounds_each_row():
  grads, mask = _grads(), jnp.array([True, True, True, True, False, False])
  total, norms = mech.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=1.0)
  clipped, _ = mech.clip_per_example_gradients(grads, 1.0)
  expected = jax.tree.map(lambda g: g[:4].sum(0), clipped)
  np.testing.assert_allclose(_flat(total), _flat(expected), rtol=1e-6, atol=1e-6)
  assert norms.shape == (6,)
  # Replace-one and add/remove: changing or dropping one real row moves the sum by <= 2C / C.
  other = jax.tree.map(lambda g, h: g.at[0].set(h[0]), grads, _grads(seed=1))
  replaced, _ = mech.dpsgd_clip_and_sum(other, mask, l2_clip_norm=1.0)
  removed, _ = mech.dpsgd_clip_and_sum(grads, mask.at[0].set(False), l2_clip_norm=1.0)
  assert np.linalg.norm(_flat(replaced) - _flat(total)) <= 2.0 * (1 + 1e-5)
  assert np.linalg.norm(_flat(removed) - _flat(total)) <= 1.0 * (1 + 1e-5)


def test_mechanism_is_clip_and_sum_then_one_noise_draw_of_std_z_c():
  grads, mask = _grads(), jnp.ones((6,), bool)
  key, z, c = jax.random.key(4), 1.5, 0.5
  release = mech.dpsgd_gaussian_mechanism(key, grads, mask, l2_clip_norm=c, noise_multiplier=z)
  total, _ = mech.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=c)
  noise = z * c * jax.random.normal(key, _flat(total).shape)
  np.testing.assert_allclose(_flat(release.noisy_sum), _flat(total) + noise, rtol=1e-6)
  assert float(release.noise_stddev) == pytest.approx(z * c)
  assert float(release.add_remove_sensitivity) == c
  assert float(release.replace_one_sensitivity) == 2 * c
  # dpsgd_event takes z = std / C under both relations (the relation tag decides the rest).
  assert float(release.accounting_noise_multiplier) == pytest.approx(z)
  zero = mech.dpsgd_add_noise(key, total, l2_clip_norm=c, noise_multiplier=0.0)
  np.testing.assert_array_equal(_flat(zero.noisy_sum), _flat(total))


def test_noise_std_over_many_coordinates_and_parameter_errors():
  total = {"w": jnp.zeros((200, 100))}
  release = mech.dpsgd_add_noise(jax.random.key(0), total, l2_clip_norm=2.0,
                                 noise_multiplier=0.75)
  assert float(jnp.std(release.noisy_sum["w"])) == pytest.approx(1.5, rel=0.03)
  with pytest.raises(ValueError, match="noise_multiplier"):
    mech.dpsgd_add_noise(jax.random.key(0), total, l2_clip_norm=1.0, noise_multiplier=-1.0)
  with pytest.raises(ValueError, match="l2_clip_norm"):
    mech.dpsgd_clip_and_sum(_grads(), jnp.ones((6,), bool), l2_clip_norm=0.0)
