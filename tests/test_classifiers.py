"""Tests of the small classifiers in `dpkd_jax.models.classifiers`.

Random initialisation on CPU compiles one XLA program per kernel shape (about a second each on
the shared machine), so forward-pass tests build models abstractly (`nnx.eval_shape`, which runs
the real constructors) and fill the parameters with deterministic host values; real initialisation is exercised by
`test_registry.py`.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpkd_jax.models import classifiers, core, mobilenet

NUM_CLASSES = 10
SHAPES = ((28, 28, 1), (32, 32, 3))
# name: (constructor, feature size, hint shape at 28×28×1, hint shape at 32×32×3)
MODELS = {
    "lenet5": (classifiers.LeNet5, 84, (5, 5, 16), (5, 5, 16)),
    "lenet5_half": (classifiers.LeNet5Half, 42, (5, 5, 8), (5, 5, 8)),
    "datalens_cnn": (classifiers.DataLensCNN, 64, (11, 11, 64), (13, 13, 64)),
    "small_cnn": (classifiers.SmallCNN, 128, (7, 7, 64), (8, 8, 64)),
    "vgg": (classifiers.VGG, 128, (7, 7, 64), (8, 8, 64)),
    "mobilenet": (mobilenet.MobileNet, 256, (7, 7, 32), (8, 8, 32)),
}

# One compiled forward per (graphdef, input shape, mode), shared by all tests of this file.
apply_jit = jax.jit(core.apply, static_argnums=0, static_argnames="train")


def abstract_parts(constructor, input_shape, norm="batch"):
  """Runs the constructor without allocating: params/batch_stats are ShapeDtypeStructs."""
  return core.split(nnx.eval_shape(lambda: constructor(
      num_classes=NUM_CLASSES, input_shape=input_shape, norm=norm,
      rngs=nnx.Rngs(jax.random.key(0)))))


def fill_surrogate(abstract: core.ModelParts) -> core.ModelParts:
  """Deterministic LeCun-scaled parameters (var ≈ 1/fan_in) and fresh BatchNorm statistics.

  Built with NumPy on the host: no randomness is involved and nothing needs compiling.
  """

  def fill_param(leaf):
    fan_in = math.prod(leaf.shape[:-1])  # 1 for biases and norm scales
    wave = np.sin(np.arange(leaf.size, dtype=np.float32) * 0.7 + 0.3)  # var ≈ 1/2
    return jnp.asarray((wave * math.sqrt(2.0 / fan_in)).reshape(leaf.shape))

  def fill_stat(path, leaf):
    return jnp.full(leaf.shape, 1.0 if path[-1].key == "var" else 0.0, jnp.float32)

  return core.ModelParts(abstract.graphdef,
                         jax.tree_util.tree_map(fill_param, abstract.params),
                         jax.tree_util.tree_map_with_path(fill_stat, abstract.batch_stats))


@functools.lru_cache(maxsize=None)  # tests only read the arrays: build each model once
def surrogate_parts(constructor, input_shape, norm="batch"):
  return fill_surrogate(abstract_parts(constructor, input_shape, norm))


def images(input_shape, batch=2, seed=1):
  return jax.random.normal(jax.random.key(seed), (batch, *input_shape), jnp.float32)


@pytest.mark.parametrize("input_shape", SHAPES, ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", MODELS)
def test_forward_shapes_finite_and_features_feed_head(name, input_shape):
  constructor, feature_size, hint_28, hint_32 = MODELS[name]
  parts = surrogate_parts(constructor, input_shape)
  out, _ = apply_jit(parts.graphdef, parts.params, parts.batch_stats, images(input_shape),
                     train=False)
  assert isinstance(out, core.ClassifierOutput)
  hint_shape = hint_28 if input_shape == SHAPES[0] else hint_32
  chex.assert_shape(out.logits, (2, NUM_CLASSES))
  chex.assert_shape(out.features, (2, feature_size))
  chex.assert_shape(out.hint, (2, *hint_shape))
  chex.assert_tree_all_finite(out)
  # `features` is by contract the input of the last dense layer.
  head = parts.params["head"]
  chex.assert_trees_all_close(out.logits, out.features @ head["kernel"] + head["bias"],
                              atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_train_mode_updates_batch_stats_and_eval_mode_keeps_them(name):
  constructor = MODELS[name][0]
  parts = surrogate_parts(constructor, SHAPES[0])
  x = images(SHAPES[0])  # the batch of the forward test, so the eval pass is already compiled
  train_out, train_stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, x,
                                     train=True)
  eval_out, eval_stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, x,
                                   train=False)
  chex.assert_trees_all_equal_structs(train_stats, parts.batch_stats)
  # Every BatchNorm's running mean moves towards a (non-zero) batch mean.
  for old, new in zip(jax.tree_util.tree_leaves(parts.batch_stats),
                      jax.tree_util.tree_leaves(train_stats)):
    assert not jnp.allclose(old, new), f"{name}: a BatchNorm statistic was not updated"
  chex.assert_trees_all_equal(eval_stats, parts.batch_stats)
  # Batch statistics and (initial) running statistics normalise differently.
  assert not jnp.allclose(train_out.logits, eval_out.logits)


@pytest.mark.parametrize("norm", ["group", "none"])
@pytest.mark.parametrize("name", MODELS)
def test_group_and_no_norm_have_no_batch_stats(name, norm):
  parts = abstract_parts(MODELS[name][0], SHAPES[1], norm)
  assert parts.batch_stats == {}
  paths = [jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_leaves_with_path(parts.params)]
  has_norm_params = any("'norm'" in path for path in paths)
  assert has_norm_params == (norm == "group")


def test_group_norm_and_no_norm_forward_pass():
  for norm in ("group", "none"):
    parts = surrogate_parts(classifiers.SmallCNN, SHAPES[0], norm)
    out, stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, images(SHAPES[0]),
                           train=True)
    chex.assert_shape(out.logits, (2, NUM_CLASSES))
    chex.assert_tree_all_finite(out)
    assert stats == {}


@pytest.mark.parametrize("name", MODELS)
def test_unknown_norm_raises(name):
  with pytest.raises(ValueError, match="layer"):
    MODELS[name][0](num_classes=NUM_CLASSES, input_shape=SHAPES[0], norm="layer",
                    rngs=nnx.Rngs(jax.random.key(0)))


@pytest.mark.parametrize("kwargs, match", [
    ({"num_classes": 1, "input_shape": (28, 28, 1)}, "num_classes"),
    ({"num_classes": 10, "input_shape": (28, 28)}, "input_shape"),
    ({"num_classes": 10, "input_shape": (28, 0, 1)}, "input_shape"),
])
def test_bad_classifier_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    classifiers.SmallCNN(**kwargs, rngs=nnx.Rngs(jax.random.key(0)))


def test_models_reject_inputs_too_small_for_their_pooling():
  rngs = nnx.Rngs(jax.random.key(0))
  with pytest.raises(ValueError, match="input_shape"):
    classifiers.DataLensCNN(num_classes=10, input_shape=(6, 6, 1), rngs=rngs)
  with pytest.raises(ValueError, match="input_shape"):
    classifiers.VGG(num_classes=10, input_shape=(4, 4, 1), rngs=rngs)
  with pytest.raises(ValueError, match="stage_widths"):
    classifiers.VGG(num_classes=10, input_shape=(28, 28, 1), rngs=rngs, stage_widths=())
  with pytest.raises(ValueError, match="block_settings"):
    mobilenet.MobileNet(num_classes=10, input_shape=(28, 28, 1), rngs=rngs,
                          block_settings=((6, 24, 0, 2),))


def test_lenet5_parameter_counts():
  counts = {}
  for constructor in (classifiers.LeNet5, classifiers.LeNet5Half):
    parts = abstract_parts(constructor, SHAPES[0], norm="none")
    counts[constructor] = sum(x.size for x in jax.tree_util.tree_leaves(parts.params))
  # The classic LeNet-5 count on 28×28 (padded) MNIST and DAFL's LeNet-5-Half.
  assert counts[classifiers.LeNet5] == 61_706
  assert counts[classifiers.LeNet5Half] == 15_738
  assert 55_000 <= counts[classifiers.LeNet5] <= 65_000
  assert counts[classifiers.LeNet5Half] < counts[classifiers.LeNet5] / 2


@pytest.mark.parametrize("channels, groups", [(3, 3), (6, 6), (16, 16), (24, 12), (32, 16),
                                              (96, 16), (17, 1)])
def test_group_count_divides_channels(channels, groups):
  assert classifiers.group_count(channels) == groups
  assert channels % groups == 0


def test_per_example_gradients_with_jit_and_vmap():
  """DP-SGD's pattern on a GroupNorm student: jit(vmap(grad)) over examples as batches of one.

  The head's per-example gradients are checked against their closed form: for cross-entropy,
  d loss / d bias = softmax(logits) - onehot(label) and d loss / d kernel = features ⊗ that.
  """
  graphdef, params, batch_stats = surrogate_parts(classifiers.LeNet5Half, SHAPES[0], "group")
  x = images(SHAPES[0], batch=3, seed=2)
  labels = jnp.array([0, 3, 7])

  def loss(params, x, label):  # x: (1, H, W, C), label: () — one example as a batch of one
    out, _ = core.apply(graphdef, params, batch_stats, x, train=True)
    return -jax.nn.log_softmax(out.logits)[0, label], out

  grads, out = jax.jit(jax.vmap(jax.grad(loss, has_aux=True), in_axes=(None, 0, 0)))(
      params, x[:, None], labels)
  chex.assert_trees_all_equal_structs(grads, params)
  chex.assert_tree_shape_prefix(grads, (3,))
  chex.assert_tree_all_finite(grads)
  logits, features = out.logits[:, 0], out.features[:, 0]  # (3, 10), (3, 42)
  output_grad = jax.nn.softmax(logits) - jax.nn.one_hot(labels, NUM_CLASSES)  # (3, 10)
  chex.assert_trees_all_close(grads["head"]["bias"], output_grad, atol=1e-6)
  chex.assert_trees_all_close(grads["head"]["kernel"],
                              features[:, :, None] * output_grad[:, None, :], atol=1e-6)
  # Per-example, not a broadcast batch gradient: the first layer's gradients differ by example.
  first_kernel = grads["conv1"]["conv"]["kernel"]
  assert not jnp.allclose(first_kernel[0], first_kernel[1])
