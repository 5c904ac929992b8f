"""SRR generator: BN-input statistics, each pretraining loss term, teacher isolation (its
steps: test_srr_step)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax import losses
from dpkd_jax import models
from dpkd_jax.methods.srr import generator as generator_lib
from dpkd_jax.models import core

_SHAPE = (28, 28, 1)
# Jitted once: eager op-by-op dispatch would compile every primitive separately (slow on CPU).
_forward = jax.jit(generator_lib.teacher_forward_with_bn_statistics, static_argnums=0)


@pytest.fixture(scope="module")
def teacher():
  """A randomly initialised LeNet-5 with BatchNorm (running stats 0 / 1: far from any batch)."""
  return core.split(models.create_classifier("lenet5", num_classes=10, input_shape=_SHAPE, seed=0))


@pytest.fixture(scope="module")
def images():
  return jax.random.normal(jax.random.key(1), (16, *_SHAPE)) * 0.7 + 0.3


@pytest.fixture(scope="module")
def generator():
  return core.split(models.create_generator("dafl", latent_dim=8, image_shape=_SHAPE,
                                            rngs=nnx.Rngs(jax.random.key(2)), base_channels=8))


def test_bn_statistics_are_those_of_each_layer_input(teacher, images):
  _, stats = _forward(*teacher, images)
  assert [m.shape for m in stats.batch_means] == [(6,), (16,)]
  # The same eval-mode forward by hand: conv1 -> BN input 1; pool(relu(BN(.))) -> conv2 input.
  def by_hand(x):
    net = core.merge(teacher)
    first = net.conv1.conv(x)
    pooled = nnx.max_pool(nnx.relu(net.conv1(x, train=False)), (2, 2), (2, 2))
    return first, net.conv2.conv(pooled)

  first, second = jax.jit(by_hand)(images)
  for i, h in enumerate((first, second)):
    np.testing.assert_allclose(stats.batch_means[i], h.mean((0, 1, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.batch_vars[i], h.var((0, 1, 2)), rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(stats.running_means[1], teacher.batch_stats["conv2"]["norm"]["mean"])
  np.testing.assert_array_equal(stats.running_vars[0], teacher.batch_stats["conv1"]["norm"]["var"])


def test_bn_term_is_zero_when_batch_stats_equal_running_stats(teacher, images):
  config = generator_lib.PretrainConfig(terms=("bn",))
  _, stats = _forward(*teacher, images)
  before = generator_lib.generator_loss_terms(config, jnp.zeros((16, 10)), stats)["bn"]
  assert float(before) > 1.0
  # Set each layer's running stats to its batch input stats, in call order (layer 2's input
  # depends on layer 1's running stats in eval mode).
  batch_stats = jax.tree.map(jnp.asarray, teacher.batch_stats)
  for layer in ("conv1", "conv2"):
    _, stats = _forward(
        teacher.graphdef, teacher.params, batch_stats, images)
    index = ("conv1", "conv2").index(layer)
    batch_stats[layer]["norm"] = {"mean": stats.batch_means[index], "var": stats.batch_vars[index]}

  def bn_term(x):
    out, s = _forward(
        teacher.graphdef, teacher.params, batch_stats, x)
    return generator_lib.generator_loss_terms(config, out.logits, s)["bn"]

  value, grad = jax.jit(jax.value_and_grad(bn_term))(images)
  assert float(value) == pytest.approx(0.0, abs=1e-4)
  assert np.isfinite(np.asarray(grad)).all()


@pytest.mark.parametrize("terms", [("ce",), ("ie",), ("bn",), ("ce", "ie"), ("ce", "ie", "bn")])
def test_each_term_is_its_loss_times_its_weight(teacher, images, terms):
  config = generator_lib.PretrainConfig(terms=terms, entropy_weight=5.0, bn_weight=10.0)
  out, stats = _forward(*teacher, images)
  got = generator_lib.generator_loss_terms(config, out.logits, stats)
  expected = {"ce": losses.argmax_cross_entropy(out.logits),
              "ie": 5.0 * losses.information_entropy(out.logits),
              "bn": 10.0 * losses.bn_statistics_loss(*stats)}
  assert set(got) == set(terms)
  for name in terms:
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-6)


def test_ce_and_ie_terms_reward_confident_balanced_batches():
  config = generator_lib.PretrainConfig(terms=("ce", "ie"), entropy_weight=5.0)
  empty = generator_lib.BatchNormInputStats((), (), (), ())
  confident_balanced = 30.0 * jax.nn.one_hot(jnp.arange(20) % 10, 10)  # 2 per class
  terms = generator_lib.generator_loss_terms(config, confident_balanced, empty)
  assert float(terms["ce"]) == pytest.approx(0.0, abs=1e-6)
  assert float(terms["ie"]) == pytest.approx(-5.0 * math.log(10), rel=1e-5)
  collapsed = 30.0 * jax.nn.one_hot(jnp.zeros(20, jnp.int32), 10)  # all class 0
  assert float(generator_lib.generator_loss_terms(config, collapsed, empty)["ie"]) > -1e-3
  with pytest.raises(ValueError, match="BatchNorm"):
    generator_lib.generator_loss_terms(generator_lib.PretrainConfig(), collapsed, empty)


def test_pretraining_gradient_reaches_only_the_generator(teacher, generator):
  config = generator_lib.PretrainConfig(batch_size=8, latent_dim=8)
  gen = generator
  z = jax.random.normal(jax.random.key(3), (8, 8))

  def loss(gen_params, teacher_params):
    x, _ = core.apply(gen.graphdef, gen_params, gen.batch_stats, z, train=True)
    out, stats = _forward(
        teacher.graphdef, teacher_params, teacher.batch_stats, x)
    return sum(generator_lib.generator_loss_terms(config, out.logits, stats).values())

  g_gen, g_teacher = jax.jit(jax.grad(loss, argnums=(0, 1)))(gen.params, teacher.params)
  assert all(float(jnp.abs(leaf).max()) == 0.0 for leaf in jax.tree.leaves(g_teacher))
  assert float(jnp.abs(g_gen["project"]["kernel"]).max()) > 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(terms=()), "at least one"),
    (dict(terms=("ce", "norm")), "generator terms"),
    (dict(terms=("ce", "ce")), "distinct"),
    (dict(entropy_weight=-1.0), "entropy_weight"),
    (dict(bn_weight=-0.5), "bn_weight"),
    (dict(steps=0), "steps"),
    (dict(learning_rate=0.0), "learning_rate"),
])
def test_bad_pretrain_config(kwargs, match):
  with pytest.raises(ValueError, match=match):
    generator_lib.PretrainConfig(**kwargs)
