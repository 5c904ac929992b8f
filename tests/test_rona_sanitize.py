"""RONA's release of teacher knowledge: bound modes, noise std σB, the config's checks.

Tolerances: B and σB recomputed in float32 agree to 1e-5 (relative); the empirical noise std
over 6,400 draws is within 5% (its standard error is ~1%).
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.methods.rona import sanitize


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_release_noise_std_is_sigma_times_bound(mode):
  sigma, bound = 0.5, 2.0
  config = sanitize.SanitizeConfig(noise_multiplier=sigma, bound_mode=mode,
                                   l2_bound=bound if mode == "fixed" else None)
  knowledge = jnp.zeros((64, 10, 10))
  aux = jnp.full((64, 10, 10), bound / 80.0)  # Frobenius norm = bound
  noisy, state, l2_bound, noise_stddev = sanitize.release_knowledge(
      config, jax.random.key(0), knowledge, aux, sanitize.BoundState.zeros())
  np.testing.assert_allclose([l2_bound, noise_stddev], [bound, sigma * bound], rtol=1e-5)
  np.testing.assert_allclose(jnp.std(noisy), sigma * bound, rtol=0.05)
  assert float(state.count) == (1.0 if mode == "adaptive" else 0.0)


def test_release_without_noise_inside_the_bound_is_the_raw_knowledge():
  # With test_rona_step.py (the student fits exactly the release), σ = 0 and an inactive bound
  # make the hint step the non-private one.
  config = sanitize.SanitizeConfig(noise_multiplier=0.0, bound_mode="fixed", l2_bound=1e6)
  knowledge = jax.random.normal(jax.random.key(1), (32, 7, 7, 16))
  noisy, _, _, noise_stddev = sanitize.release_knowledge(
      config, jax.random.key(0), knowledge, None, sanitize.BoundState.zeros())
  chex.assert_trees_all_equal(noisy, knowledge)
  assert float(noise_stddev) == 0.0


def test_release_without_bound_is_the_raw_knowledge():
  config = sanitize.SanitizeConfig(noise_multiplier=0.0, bound_mode="none")
  knowledge = jax.random.normal(jax.random.key(1), (32, 10)) * 5.0
  noisy, state, l2_bound, noise_stddev = sanitize.release_knowledge(
      config, jax.random.key(0), knowledge, knowledge, sanitize.BoundState.zeros())
  chex.assert_trees_all_equal(noisy, knowledge)
  assert float(l2_bound) == math.inf and float(noise_stddev) == 0 and float(state.count) == 0


def test_release_bounds_the_whole_batch_to_norm_b():
  config = sanitize.SanitizeConfig(noise_multiplier=0.0, bound_mode="fixed", l2_bound=3.0)
  knowledge = jax.random.normal(jax.random.key(1), (32, 10)) * 5.0
  noisy, *_ = sanitize.release_knowledge(config, jax.random.key(0), knowledge, knowledge,
                                         sanitize.BoundState.zeros())
  np.testing.assert_allclose(jnp.linalg.norm(noisy), 3.0, rtol=1e-5)
  np.testing.assert_allclose(noisy / jnp.linalg.norm(noisy),
                             knowledge / jnp.linalg.norm(knowledge), atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=1.0, bound_mode="median"), "bound_mode"),
    (dict(noise_multiplier=1.0, bound_mode="fixed"), "l2_bound exactly"),
    (dict(noise_multiplier=1.0, l2_bound=2.0), "l2_bound exactly"),
    (dict(noise_multiplier=1.0, bound_mode="fixed", l2_bound=0.0), "l2_bound must be"),
    (dict(noise_multiplier=1.0, bound_mode="none"), "needs noise_multiplier=0"),
])
def test_sanitize_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sanitize.SanitizeConfig(**kwargs)
