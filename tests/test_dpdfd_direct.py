"""dpkd_jax.methods.dpdfd.direct: paper Table 4's direct mode (not DP)."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpkd_jax import data
from dpkd_jax import models
from dpkd_jax.methods import dpdfd
from dpkd_jax.methods.dpdfd import step as step_lib
from dpkd_jax.models import core
from dpkd_jax.privacy import paper_accounting
from dpkd_jax.train import metrics as metrics_lib
from dpkd_jax.train import outputs
from dpkd_jax.train import records
from dpkd_jax.train.state import TrainState


def _config(**kw):
  base = dict(dataset="digits", model="lenet5_half", noise_multiplier=0.0, expected_batch_size=16,
              max_batch_size=24, steps=3, eval_every=3, seed=0, learning_rate=1e-2)
  base.update(kw)
  return dpdfd.DirectConfig(**base)


def _state(config):
  info = data.DATASETS[config.dataset]
  model = models.create_classifier(config.model, num_classes=info.num_classes,
                                   input_shape=info.image_shape, norm=config.norm,
                                   rngs=nnx.Rngs(0))
  return TrainState.create(core.split(model), optax.sgd(config.learning_rate))


def test_sigma_zero_mse_step_is_sgd_on_normalized_output_gradients():
  """σ = 0, MSE: the update is SGD with d loss/d s_i = γ C g_i/||g_i|| on real rows only."""
  config = _config()
  train = data.load("digits", "train")
  images = data.normalize(train.images[:24], data.DATASETS["digits"])
  labels = jnp.asarray(train.labels[:24])
  mask = jnp.arange(24) < 16  # 8 padded rows must not count
  state = _state(config)
  params0 = state.params
  new_state, _ = jax.jit(dpdfd.build_direct_step(dpdfd.make_direct_plan(config), config))(
      state, images, labels, mask, jax.random.key(0))

  def reference_loss(params):
    out, _ = core.apply(state.graphdef, params, state.batch_stats, images[:16], train=True)
    s = out.logits
    g = jax.nn.softmax(s) - jax.nn.one_hot(labels[:16], 10)
    g = g / (jnp.linalg.norm(g, axis=-1, keepdims=True) + 1e-6)
    return jnp.mean(jnp.sum(jax.lax.stop_gradient(g) * s, axis=-1))  # d/ds = g / 16 per row

  grads = jax.grad(reference_loss)(params0)
  expected = jax.tree.map(lambda p, g: p - config.learning_rate * g, params0, grads)
  for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)


def test_ce_step_equals_value_and_grad_through_a_second_forward_pass():
  """The one-forward VJP step equals differentiating the paper's CE loss end to end."""
  config = _config(student_loss="ce")
  train = data.load("digits", "train")
  images = data.normalize(train.images[:24], data.DATASETS["digits"])
  labels = jnp.asarray(train.labels[:24])
  mask = jnp.arange(24) < 16
  state = _state(config)
  params0 = state.params
  new_state, metrics = jax.jit(dpdfd.build_direct_step(dpdfd.make_direct_plan(config), config))(
      state, images, labels, mask, jax.random.key(0))

  def forward(params):
    return core.apply(state.graphdef, params, state.batch_stats, images[:16], train=True)[0].logits

  s0 = forward(params0)
  g = jax.nn.softmax(s0) - jax.nn.one_hot(labels[:16], 10)
  target = s0 - g / (jnp.linalg.norm(g, axis=-1, keepdims=True) + 1e-6)  # σ = 0, γ = C = 1

  def reference_loss(params):
    s = forward(params)
    return jnp.mean(-jnp.sum(jax.nn.softmax(target) * jax.nn.log_softmax(s), axis=-1))

  loss, grads = jax.value_and_grad(reference_loss)(params0)
  np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
  expected = jax.tree.map(lambda p, g: p - config.learning_rate * g, params0, grads)
  for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)


def test_end_to_end_reports_not_dp(tmp_path):
  config = _config(noise_multiplier=5.0)
  with pytest.warns(paper_accounting.PaperAccountingWarning, match="not DP"):
    results = dpdfd.train_direct(config, str(tmp_path), progress=False)
  assert math.isinf(results["epsilon"]) and "Jacobian" in results["epsilon_reason"]
  assert results["paper_epsilon"] is not None and results["paper_epsilon"] > 0
  assert 0.0 <= results["test_accuracy"] <= 1.0
  with open(os.path.join(tmp_path, "results.json")) as f:
    saved = json.load(f)
  assert saved["epsilon"] == math.inf and saved["seed"] == 0
  assert saved["warnings"] == [outputs.NOT_PRIVATE]
  # The loss of private batches is a private diagnostic; only the test accuracy is released.
  assert set(metrics_lib.read_metrics(str(tmp_path))) == {"test/accuracy"}
  assert "private_diagnostics/train/loss" in outputs.read_private_diagnostics(str(tmp_path))
  assert saved[outputs.PRIVATE_KEY]["files"] == [outputs.PRIVATE_CSV]
  record = records.read_record(os.path.join(tmp_path, "record.json"))
  assert record["method"] == "dpdfd_direct" and record["sound_epsilon"] == "inf"
  assert record["paper_epsilon"] == pytest.approx(results["paper_epsilon"])
  # Every privacy figure of the results is the plan's (one source).
  plan = dpdfd.make_direct_plan(config)
  assert (results["noise_multiplier"], results["paper_epsilon"], results["steps"]) == (
      plan.noise_multiplier, plan.paper_epsilon, plan.releases)
  assert not os.path.exists(os.path.join(tmp_path, "privacy_ledger.json"))  # nothing finite


def test_the_direct_step_takes_its_noise_from_the_plan(monkeypatch):
  # The step built from the plan and from copies with another sigma: with the same key, the
  # released rows move by exactly the plan's sigma times one noise draw.
  config = _config(noise_multiplier=5.0)
  plan = dpdfd.make_direct_plan(config)
  train = data.load("digits", "train")
  images = data.normalize(train.images[:24], data.DATASETS["digits"])
  labels, mask = jnp.asarray(train.labels[:24]), jnp.arange(24) < 16
  released = []
  real = step_lib.release_rows

  def spy(plan, key, rows):
    out = real(plan, key, rows)
    jax.debug.callback(lambda noisy: released.append(np.asarray(noisy)), out.noisy)
    return out

  monkeypatch.setattr(step_lib, "release_rows", spy)
  for sigma in (0.0, 5.0, 10.0):
    step = jax.jit(dpdfd.build_direct_step(dataclasses.replace(plan, noise_multiplier=sigma),
                                           config))
    step(_state(config), images, labels, mask, jax.random.key(0))
  jax.effects_barrier()
  bounded, once, twice = released
  assert np.abs(once - bounded).max() > 1.0
  np.testing.assert_allclose(twice - bounded, 2 * (once - bounded), rtol=1e-4, atol=1e-4)
