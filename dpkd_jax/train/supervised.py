"""The one supervised step on labelled data: mean softmax cross-entropy on integer labels.

Shared by the (non-private) teacher (`dpkd_jax.teacher`, after augmentation) and RONA's self
learning on public labels (`methods/rona/step.py`): the caller normalises (and augments) the
batch, this function does the train-mode forward pass (BatchNorm statistics updated), the
gradient and the optimizer update. Pure and jittable; no randomness.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dpkd_jax.models import core
from dpkd_jax.train.state import TrainState


def cross_entropy_step(state: TrainState, x: jax.Array,
                       labels: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on the mean cross-entropy of `state`'s model on (x, labels).

  Args:
    state: the model and optimizer state.
    x: (B, H, W, C) float32 normalised images.
    labels: (B,) int class labels.

  Returns:
    (new state, {"loss": () mean cross-entropy, "accuracy": () of the pre-update logits}).
  """

  def loss_fn(params):
    out, new_stats = core.apply(state.graphdef, params, state.batch_stats, x, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()
    return loss, (out.logits, new_stats)  # logits (B, K)

  (loss, (logits, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  state = state.apply_gradients(grads, new_stats)
  return state, {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels)}
