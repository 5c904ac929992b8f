"""Tests of ResNet-18/34 and Wide-ResNet in `dpkd_jax.models.resnet`.

These models have millions of parameters and dozens of kernel shapes, so structure is checked
abstractly (`nnx.eval_shape` / `jax.eval_shape`, no compilation) and the real forward passes,
marked `slow`, use one example in eval mode with surrogate parameters.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from dpkd_jax.models import core, resnet
# Shared with the classifier tests; a candidate for a conftest.py fixture.
from test_classifiers import NUM_CLASSES, SHAPES, abstract_parts, apply_jit, surrogate_parts

# name: (constructor, feature size, hint shape at 28×28×1, hint shape at 32×32×3)
MODELS = {
    "resnet18": (resnet.ResNet18, 512, (14, 14, 128), (16, 16, 128)),
    "resnet34": (resnet.ResNet34, 512, (14, 14, 128), (16, 16, 128)),
    "wide_resnet": (resnet.WideResNet, 256, (14, 14, 128), (16, 16, 128)),
}


def expected_shapes(name, input_shape, batch):
  _, feature_size, hint_28, hint_32 = MODELS[name]
  hint = hint_28 if input_shape == SHAPES[0] else hint_32
  return (batch, NUM_CLASSES), (batch, feature_size), (batch, *hint)


@pytest.mark.parametrize("input_shape", SHAPES, ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", MODELS)
def test_output_shapes_abstractly(name, input_shape):
  parts = abstract_parts(MODELS[name][0], input_shape)
  x = jax.ShapeDtypeStruct((2, *input_shape), jnp.float32)
  for train in (False, True):
    forward = functools.partial(core.apply, parts.graphdef, train=train)
    out, stats = jax.eval_shape(forward, parts.params, parts.batch_stats, x)
    assert tuple(o.shape for o in out) == expected_shapes(name, input_shape, 2)
    assert jax.tree_util.tree_structure(stats) == jax.tree_util.tree_structure(
        parts.batch_stats)


@pytest.mark.parametrize("norm", ["group", "none"])
@pytest.mark.parametrize("name", MODELS)
def test_group_and_no_norm_have_no_batch_stats(name, norm):
  parts = abstract_parts(MODELS[name][0], SHAPES[1], norm)
  assert parts.batch_stats == {}
  forward = functools.partial(core.apply, parts.graphdef, train=True)
  out, _ = jax.eval_shape(forward, parts.params, parts.batch_stats,
                          jax.ShapeDtypeStruct((2, *SHAPES[1]), jnp.float32))
  assert tuple(o.shape for o in out) == expected_shapes(name, SHAPES[1], 2)


# Compiled forward passes of the two block layouts (ResNet's basic blocks, Wide-ResNet's);
# resnet34 is resnet18's block run more times per stage (its shapes, statistics and parameter
# count are checked abstractly here), so its compiled pass is left out.
@pytest.mark.slow
@pytest.mark.parametrize("input_shape", SHAPES, ids=["28x28x1", "32x32x3"])
@pytest.mark.parametrize("name", ["resnet18", "wide_resnet"])
def test_eval_forward_is_finite(name, input_shape):
  parts = surrogate_parts(MODELS[name][0], input_shape)
  x = jax.random.normal(jax.random.key(1), (1, *input_shape))
  out, stats = apply_jit(parts.graphdef, parts.params, parts.batch_stats, x, train=False)
  assert tuple(o.shape for o in out) == expected_shapes(name, input_shape, 1)
  chex.assert_tree_all_finite(out)
  chex.assert_trees_all_equal(stats, parts.batch_stats)
  head = parts.params["head"]
  chex.assert_trees_all_close(out.logits, out.features @ head["kernel"] + head["bias"],
                              atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name, expected", [
    # Known counts of the CIFAR-10 models (BatchNorm scale/bias included, running stats not).
    ("resnet18", 11_173_962),
    ("resnet34", 21_282_122),
    ("wide_resnet", 2_748_890),
])
def test_parameter_counts(name, expected):
  parts = abstract_parts(MODELS[name][0], SHAPES[1])
  assert sum(x.size for x in jax.tree_util.tree_leaves(parts.params)) == expected


def test_wide_resnet_depth_and_width_are_configurable():
  parts = core.split(nnx.eval_shape(lambda: resnet.WideResNet(
      num_classes=NUM_CLASSES, input_shape=SHAPES[0], depth=10, widen_factor=2,
      rngs=nnx.Rngs(jax.random.key(0)))))
  assert [len(stage) for stage in parts.params["stages"].values()] == [1, 1, 1]
  chex.assert_shape(parts.params["head"]["kernel"], (128, NUM_CLASSES))


@pytest.mark.parametrize("kwargs, match", [
    ({"depth": 15}, "depth"),
    ({"depth": 4}, "depth"),
    ({"widen_factor": 0}, "widen_factor"),
    ({"norm": "batchnorm"}, "norm"),
])
def test_wide_resnet_rejects_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    resnet.WideResNet(num_classes=NUM_CLASSES, input_shape=SHAPES[0],
                      rngs=nnx.Rngs(jax.random.key(0)), **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"stage_sizes": (2, 2, 2)}, "stage_sizes"),
    ({"stage_sizes": (2, 0, 2, 2)}, "stage_sizes"),
    ({"stage_sizes": (2, 2, 2, 2), "norm": "instance"}, "norm"),
    ({"stage_sizes": (2, 2, 2, 2), "input_shape": (32, 32)}, "input_shape"),
])
def test_resnet_rejects_bad_arguments(kwargs, match):
  kwargs = {"input_shape": SHAPES[0], **kwargs}
  with pytest.raises(ValueError, match=match):
    resnet.ResNet(num_classes=NUM_CLASSES, rngs=nnx.Rngs(jax.random.key(0)), **kwargs)
