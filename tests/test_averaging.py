"""`train.averaging.param_averaging` alone: the bias-corrected EMA of the iterates, the
wrapped optimizer unchanged. Runs that average are tested in test_dpsgd_averaging.py and
test_dpdfd_averaging.py."""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest

from dpkd_jax.train import averaging
from dpsgd_fixtures import hand_ema


@pytest.mark.parametrize("decay,start_step", [(0.9, 0), (0.5, 2), (0.9999, 0), (0.9, 9)])
def test_param_averaging_is_the_bias_corrected_ema_of_the_iterates(decay, start_step):
  inner = optax.sgd(0.1, momentum=0.9)
  tx = averaging.param_averaging(inner, decay, start_step=start_step)
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones((3,))}
  state, inner_state = tx.init(params), inner.init(params)
  chex.assert_trees_all_equal(state.average, params)  # step 0: the initial parameters
  iterates = []
  for t in range(5):
    grads = jax.tree.map(lambda p: jnp.sin(p + t), params)
    updates, state = tx.update(grads, state, params)
    inner_updates, inner_state = inner.update(grads, inner_state, params)
    chex.assert_trees_all_equal(updates, inner_updates)  # the optimizer itself is unchanged
    params = optax.apply_updates(params, updates)
    iterates.append(params)
    chex.assert_trees_all_close(state.average, hand_ema(iterates, decay, start_step),
                                rtol=1e-6, atol=1e-6)
  chex.assert_trees_all_equal(state.inner, inner_state)
  assert int(state.count) == 5
  if start_step >= 4:  # not started, or its first iterate: exactly the iterate
    chex.assert_trees_all_equal(state.average, params)
  with pytest.raises(ValueError, match=r"in \(0, 1\)"):
    averaging.param_averaging(inner, 1.0)
