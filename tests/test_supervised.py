"""train/supervised: the one cross-entropy step of the teacher and RONA's self learning."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dpkd_jax import data
from dpkd_jax.models import compact
from dpkd_jax.models import core
from dpkd_jax.train import supervised
from dpkd_jax.train.state import TrainState

INFO = data.DATASETS["digits"]


def _state():
  parts = core.split(compact.compact_5k(num_classes=10, input_shape=(28, 28, 1),
                                        rngs=nnx.Rngs(0)))
  return TrainState.create(parts, optax.sgd(0.1))


def test_step_is_mean_cross_entropy_with_a_batch_stats_update():
  train = data.load("digits", "train")
  x, labels = data.normalize(jnp.asarray(train.images[:16]), INFO), train.labels[:16]
  state, metrics = jax.jit(supervised.cross_entropy_step)(_state(), x, labels)

  start = _state()
  logits, stats = core.apply(start.graphdef, start.params, start.batch_stats, x, train=True)
  logits = logits.logits
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(metrics["accuracy"], np.mean(np.argmax(logits, -1) == labels))
  chex.assert_trees_all_close(state.batch_stats, stats, atol=1e-6)
  assert int(state.step) == 1
  assert not np.allclose(state.params["head"]["kernel"], start.params["head"]["kernel"])
