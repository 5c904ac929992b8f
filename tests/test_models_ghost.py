"""Tests of dpkd_jax/models/ghost.py (and its taps, ghost_taps.py): the clipped sum of the one
batched forward + backward pass equals the vmap path's (`vmap(grad)` +
`dpsgd_mechanism.dpsgd_clip_and_sum`) on the zoo and on every supported layer kind, holds no
(B, num_params) array, and refuses the models it cannot handle (mixing ops, BatchNorm in
training mode, shared or tied weights), naming the layer or the op."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dpkd_jax.errors import UserError
from dpkd_jax import kernels
from dpkd_jax.models import classifiers, core, ghost, mobilenet, registry
from dpkd_jax.privacy import dpsgd_mechanism, ghost_clipping
from dpkd_jax.train import sharding
# Forces every convolution pass to one exact form (no timing), as in the fast_conv tests.
from test_fast_conv import force_route

_BATCH = 6
_MASK = np.array([True, True, True, True, False, True])  # row 4: padding


def _loss(out, target):
  """Weighted cross-entropy: a weight of 0 gives an exactly zero gradient."""
  label, weight = target
  return weight * optax.softmax_cross_entropy_with_integer_labels(out.logits, label)


def _batch(input_shape, num_classes):
  # NumPy inputs: eager JAX ops would each compile (seconds in all).
  x = np.random.default_rng(7).standard_normal((_BATCH,) + input_shape).astype(np.float32)
  x[3] = np.nan  # a non-finite example: contributes 0
  labels = np.arange(_BATCH, dtype=np.int32) % num_classes
  weights = np.ones(_BATCH, np.float32)
  weights[2] = 0.0  # example 2: zero gradient
  return x, (labels, weights), _MASK


def _vmap_path(parts):
  """The reference: per-example gradients by vmap(grad), then the mechanism's clipped sum."""

  @jax.jit
  def reference(params, x, targets, mask, clip):
    def example(p, xi, ti):
      out, _ = core.apply(parts.graphdef, p, parts.batch_stats, xi[None], train=True)
      return _loss(jax.tree.map(lambda v: v[0], out), ti)

    losses, grads = jax.vmap(jax.value_and_grad(example), in_axes=(None, 0, 0))(params, x, targets)
    clipped_sum, norms = dpsgd_mechanism.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=clip)
    return clipped_sum, norms, losses

  return reference


def _ghost_path(parts, traces):
  @jax.jit
  def run(params, x, targets, mask, clip):
    traces.append(1)  # C is traced: one compilation serves every clip norm
    return ghost.ghost_clipped_sum(parts.graphdef, params, parts.batch_stats, x, targets, mask,
                                   loss_fn=_loss, l2_clip_norm=clip)

  return run


def _assert_tree_close(got, expected, *, atol_of_scale=1e-5):
  assert jax.tree.structure(got) == jax.tree.structure(expected)
  for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    g, e = np.asarray(g), np.asarray(e)
    assert g.shape == e.shape and np.all(np.isfinite(g))
    scale = float(np.max(np.abs(e)))
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=atol_of_scale * scale + 1e-30)


def _check_against_vmap(parts, input_shape, num_classes, *, mid_clip_checks=True, x=None):
  x_default, targets, mask = _batch(input_shape, num_classes)
  x = x_default if x is None else x
  traces = []
  reference, run = _vmap_path(parts), _ghost_path(parts, traces)
  _, ref_norms, ref_losses = reference(parts.params, x, targets, mask, 1.0)
  finite = np.isfinite(np.asarray(ref_norms))
  np.testing.assert_array_equal(finite, [True, True, True, False, True, True])
  assert float(ref_norms[2]) == 0.0  # the zero-gradient example
  positive = np.sort(np.asarray(ref_norms)[finite & (np.asarray(ref_norms) > 0)])
  mid = float(positive[len(positive) // 2 - 1] + positive[len(positive) // 2]) / 2
  for clip in (1e-6, mid, 1e6):  # all clipped, some clipped, none clipped
    expected_sum, expected_norms, _ = reference(parts.params, x, targets, mask, clip)
    out = run(parts.params, x, targets, mask, clip)
    _assert_tree_close(out.clipped_sum, expected_sum)
    np.testing.assert_allclose(out.norms, expected_norms, rtol=1e-5)  # NaN where NaN
    assert float(out.norms[2]) == 0.0
    np.testing.assert_allclose(np.asarray(out.losses)[finite], np.asarray(ref_losses)[finite],
                               rtol=1e-5)
    assert out.outputs.logits.shape == (_BATCH, num_classes)
    if mid_clip_checks and clip == mid:
      assert np.any(positive > clip) and np.any(positive < clip)
  assert len(traces) == 1


_ZOO = [("lenet5", (28, 28, 1)), ("small_cnn", (8, 8, 1)), ("datalens_cnn", (10, 10, 1)),
        ("scatter_linear", (7, 7, 81)), ("scatter_cnn", (7, 7, 81))]


# Every zoo model with GroupNorm (all its layers tapped, GroupNorm's scale and bias included);
# without a norm, the convolutions gain a bias (`ConvNorm`), the one tap the GroupNorm models
# lack: small_cnn runs it, and scatter_linear without its input GroupNorm (a bare dense head).
# lenet5, datalens_cnn and scatter_cnn without a norm ran the same conv-bias tap on other shapes.
@pytest.mark.parametrize("name,input_shape,norm", [
    *((name, shape, "group") for name, shape in _ZOO),
    ("small_cnn", (8, 8, 1), "none"), ("scatter_linear", (7, 7, 81), "none")])
def test_equals_the_vmap_path_on_the_zoo(name, input_shape, norm):
  model = registry.create_classifier(name, num_classes=4, input_shape=input_shape, norm=norm,
                                     seed=0)
  _check_against_vmap(core.split(model), input_shape, 4)


def _fused_stages(parts, input_shape) -> int:
  """How many of the tapped pass's norm stages run as `fast_norm_pool`'s tapped op."""
  x = jax.ShapeDtypeStruct((_BATCH,) + input_shape, jnp.float32)
  targets = (jax.ShapeDtypeStruct((_BATCH,), jnp.int32), jax.ShapeDtypeStruct((_BATCH,),
                                                                              jnp.float32))
  jaxpr = jax.make_jaxpr(lambda p, x, t: ghost.ghost_clipped_sum(
      parts.graphdef, p, parts.batch_stats, x, t, _MASK, loss_fn=_loss, l2_clip_norm=1.0))(
          parts.params, x, targets)
  # The pass's value_and_grad splits each call into a forward and a backward part, both
  # named after the function (the shape-only trace of `_structure` leaves none in the jaxpr).
  count = str(jaxpr).count("name=tapped_group_norm_relu_max_pool")
  assert count % 2 == 0
  return count // 2


@pytest.mark.parametrize("name,input_shape,stages", [
    ("lenet5", (28, 28, 1), 2), ("small_cnn", (8, 8, 1), 2), ("datalens_cnn", (10, 10, 1), 1)])
def test_group_norm_stages_run_fused_and_equal_the_vmap_path_with_ties(name, input_shape, stages,
                                                                        cpu_kernels):
  # Images constant on 8×8 blocks: conv1's outputs whose receptive field is inside one block
  # are equal, so a third to a half of its pooling windows hold equal positive maxima (the
  # pool's tie rule decides the routing). Example 3 is NaN, example 2 has a zero gradient.
  parts = core.split(registry.create_classifier(name, num_classes=4, input_shape=input_shape,
                                                norm="group", seed=0))
  assert _fused_stages(parts, input_shape) == stages
  x, _, _ = _batch(input_shape, 4)
  coarse = x[:, ::8, ::8]
  x = np.repeat(np.repeat(coarse, 8, axis=1), 8, axis=2)[:, :input_shape[0], :input_shape[1]]
  x[3] = np.nan
  _check_against_vmap(parts, input_shape, 4, x=np.ascontiguousarray(x))


def test_a_group_norm_the_fused_op_does_not_take_runs_its_layers_in_turn(cpu_kernels):
  # With the CPU kernels on, the two-pass variance is not `fast_norm.is_plain`: the tapped layer
  # declines to fuse, and
  # the stage is GroupNorm, ReLU and pool in turn, with the same sums.
  model = registry.create_classifier("small_cnn", num_classes=4, input_shape=(8, 8, 1),
                                     norm="group", seed=0)
  model.conv1.norm.use_fast_variance = False
  parts = core.split(model)
  assert _fused_stages(parts, (8, 8, 1)) == 1
  _check_against_vmap(parts, (8, 8, 1), 4)


def test_equals_the_vmap_path_with_banded_convolutions(monkeypatch, cpu_kernels):
  # Every LeNet-5 convolution pass as a banded-matrix product (the CPU kernels' form for narrow
  # layers): the tapped forward and its input gradient go through fast_conv too, and the batch
  # axis is never merged, so example_mixing still follows it.
  force_route(monkeypatch, "banded")
  model = registry.create_classifier("lenet5", num_classes=4, input_shape=(28, 28, 1),
                                     norm="group", seed=0)
  _check_against_vmap(core.split(model), (28, 28, 1), 4)


def test_equals_the_vmap_path_with_batch_channels_per_example_gradients(monkeypatch):
  # Every per-example kernel gradient by the grouped convolution over (example, channel) pairs
  # (the static rule's form for LeNet-5's conv1), NaN example included.
  monkeypatch.setattr(ghost_clipping, "conv_grad_form", lambda *a, **k: "batch_channels")
  model = registry.create_classifier("lenet5", num_classes=4, input_shape=(28, 28, 1),
                                     norm="group", seed=0)
  _check_against_vmap(core.split(model), (28, 28, 1), 4)


def test_equals_the_vmap_path_with_grouped_strided_convolutions():
  # MobileNet: depthwise (feature_group_count = channels) and strided 3×3 convolutions, 1×1
  # convolutions. (VGG, ResNet and WideResNet agreed too; left out for time.)
  model = mobilenet.MobileNet(num_classes=3, input_shape=(6, 6, 2), norm="none",
                                rngs=nnx.Rngs(0), stem_channels=4, head_channels=4,
                                block_settings=((2, 4, 1, 2),))
  _check_against_vmap(core.split(model), (6, 6, 2), 3, mid_clip_checks=False)


class _EveryKind(nnx.Module):
  """Every layer kind the taps support: convolutions (dilated, strided, grouped, 1×1 strided as
  ResNet's shortcuts, input-dilated, 1-D through a reshape), a dense layer on a sequence (T > 1), and the per-channel affine
  layers LayerNorm, RMSNorm, InstanceNorm and BatchNorm on its running averages."""

  def __init__(self, rngs):
    self.conv = nnx.Conv(2, 4, (3, 2), kernel_dilation=(1, 2), padding=((1, 0), (2, 1)),
                         rngs=rngs)
    self.grouped = nnx.Conv(4, 4, (2, 2), strides=2, feature_group_count=2, use_bias=False,
                            rngs=rngs)
    self.shortcut = nnx.Conv(2, 4, (1, 1), strides=2, use_bias=False, rngs=rngs)  # ResNet's
    # No bias: InstanceNorm would cancel it (a zero gradient is only rounding noise).
    self.upsample = nnx.Conv(4, 3, (2, 2), input_dilation=2, padding=((1, 1), (1, 1)),
                             use_bias=False, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(3, rngs=rngs)
    self.instance_norm = nnx.InstanceNorm(3, rngs=rngs)
    self.batch_norm = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)
    self.conv1d = nnx.Conv(3, 5, (3,), padding="CIRCULAR", rngs=rngs)
    self.rms_norm = nnx.RMSNorm(5, rngs=rngs)
    self.sequence = nnx.Linear(5, 6, rngs=rngs)
    self.head = nnx.Linear(6, 3, rngs=rngs)

  def __call__(self, x, *, train=False):
    y = nnx.relu(self.grouped(nnx.tanh(self.conv(x)))) + self.shortcut(x)
    y = self.upsample(y)
    y = self.batch_norm(self.layer_norm(self.instance_norm(y)))
    y = nnx.relu(self.conv1d(y.reshape(y.shape[0], -1, y.shape[-1])))  # (B, L, 3) → (B, L, 5)
    features = jnp.mean(nnx.tanh(self.sequence(self.rms_norm(y))), axis=1)  # T = L positions
    return core.ClassifierOutput(self.head(features), features, y)


def test_equals_the_vmap_path_for_every_layer_kind():
  model = _EveryKind(nnx.Rngs(0))
  # Running averages other than (0, 1), so that BatchNorm's x̂ is not its input.
  model.batch_norm.mean[...] = jnp.array([0.1, -0.2, 0.3])
  model.batch_norm.var[...] = jnp.array([0.5, 2.0, 1.5])
  parts = core.split(model)
  assert {type(m).__name__ for _, m in nnx.graph.iter_graph(model)} >= {
      "Conv", "Linear", "LayerNorm", "RMSNorm", "InstanceNorm", "BatchNorm"}
  _check_against_vmap(parts, (6, 5, 2), 3, mid_clip_checks=False)


def _sum_and_norms(parts, x, targets, mask, clip):
  return jax.jit(lambda p, x, m: ghost.ghost_clip_and_sum(
      parts.graphdef, p, parts.batch_stats, x, targets, m, loss_fn=_loss, l2_clip_norm=clip,
      allow_gram=False))(parts.params, x, mask)


def test_masked_rows_contribute_nothing_and_large_c_gives_the_batch_gradient():
  parts = core.split(registry.create_classifier("lenet5", num_classes=4, input_shape=(28, 28, 1),
                                                norm="group", seed=0))
  x, targets, mask = _batch((28, 28, 1), 4)
  x[3] = 0.5  # every example finite here
  got, norms = _sum_and_norms(parts, x, targets, mask, 1e6)
  # Whatever a padding row holds (here huge, then NaN), the sums do not change.
  for fill in (1e6, np.nan):
    other = x.copy()
    other[4] = fill
    again, _ = _sum_and_norms(parts, other, targets, mask, 1e6)
    _assert_tree_close(again, got)

  def masked_total(params):  # the plain (non-private) gradient of the real rows' summed loss
    out, _ = core.apply(parts.graphdef, params, parts.batch_stats, x, train=True)
    losses = jax.vmap(_loss)(out, targets)
    return jnp.sum(jnp.where(mask, losses, 0.0))

  assert float(np.nanmax(norms)) < 1e6  # C above every norm: nothing clipped
  # XLA's float32 kernel gradient of conv1 (one input channel, 784 positions × 4 examples in
  # one sum) is itself off by about 3e-5 of the leaf's largest entry against float64, ten times
  # the ghost sum's error: compare at that reference's precision.
  _assert_tree_close(got, jax.jit(jax.grad(masked_total))(parts.params), atol_of_scale=1e-4)


class _MixesExamples(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x, *, train=False):
    h = x.reshape(x.shape[0], -1)
    y = self.fc(h - jnp.mean(h, axis=0))  # centred on the batch: example i sees example j
    return core.ClassifierOutput(y, y, y)


def test_refuses_a_model_that_mixes_examples_naming_the_op_and_line():
  parts = core.split(_MixesExamples(nnx.Rngs(0)))
  with pytest.raises(UserError, match=r"reduce_sum at .*test_models_ghost.py:\d+ "
                                      r"\(_MixesExamples.__call__\) "
                                      r"reduces along the batch axis.*clipping='vmap'"):
    ghost.ghost_clip_and_sum(parts.graphdef, parts.params, parts.batch_stats,
                             jnp.zeros((3, 2, 2, 1)), (jnp.zeros(3, jnp.int32), jnp.ones(3)),
                             jnp.ones(3, bool), loss_fn=_loss, l2_clip_norm=1.0)


class _RowsAreNotExamples(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(4, 3, rngs=rngs)
    self.offset = nnx.Linear(2, 3, rngs=rngs)

  def __call__(self, x, *, train=False):
    rows = self.offset(jnp.ones((x.shape[0], 2)))  # B rows, but none of them is an example
    y = self.fc(x.reshape(x.shape[0], -1)) + jnp.sum(rows, axis=0)  # every loss sees every row
    return core.ClassifierOutput(y, y, y)


def test_refuses_a_tapped_layer_whose_rows_are_not_the_examples():
  parts = core.split(_RowsAreNotExamples(nnx.Rngs(0)))
  with pytest.raises(UserError, match="the input of offset must have the examples along axis 0 "
                                      "but does not depend on them"):
    ghost.ghost_clip_and_sum(parts.graphdef, parts.params, parts.batch_stats,
                             jnp.zeros((3, 2, 2, 1)), (jnp.zeros(3, jnp.int32), jnp.ones(3)),
                             jnp.ones(3, bool), loss_fn=_loss, l2_clip_norm=1.0)


def test_without_the_gram_form_the_sums_are_the_same():
  # small_cnn at 8×8: conv2 has T = 16 positions, so 2T² < 288·64 picks the Gram form.
  parts = core.split(registry.create_classifier("small_cnn", num_classes=4, input_shape=(8, 8, 1),
                                                norm="none", seed=0))
  x, targets, mask = _batch((8, 8, 1), 4)
  sums = [jax.jit(lambda p, allow_gram=allow_gram: ghost.ghost_clip_and_sum(
      parts.graphdef, p, parts.batch_stats, x, targets, mask, loss_fn=_loss, l2_clip_norm=0.5,
      allow_gram=allow_gram))(parts.params) for allow_gram in (True, False)]
  _assert_tree_close(sums[0][0], sums[1][0])
  np.testing.assert_allclose(sums[0][1], sums[1][1], rtol=1e-6)


def _largest_intermediate(jaxpr) -> int:
  """Elements of the largest value any equation of `jaxpr` (or a sub-jaxpr) produces."""
  largest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      largest = max(largest, int(np.prod(getattr(var.aval, "shape", ()))))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, "eqns"):
          largest = max(largest, _largest_intermediate(sub))
  return largest


def test_no_per_example_gradient_of_the_whole_model_is_materialised():
  batch, shape = 8, (28, 28, 1)
  parts = core.split(registry.create_classifier("small_cnn", num_classes=10, input_shape=shape,
                                                norm="group", seed=0))
  x = jnp.zeros((batch,) + shape)
  targets = (jnp.zeros(batch, jnp.int32), jnp.ones(batch))
  mask = jnp.ones(batch, bool)
  dense = parts.params["fc"]["kernel"].size  # 3136 × 128, the largest layer
  num_params = sum(p.size for p in jax.tree.leaves(parts.params))
  ghost_jaxpr = jax.make_jaxpr(lambda p: ghost.ghost_clip_and_sum(
      parts.graphdef, p, parts.batch_stats, x, targets, mask, loss_fn=_loss,
      l2_clip_norm=1.0))(parts.params)
  vmap_jaxpr = jax.make_jaxpr(lambda p: _vmap_path(parts)(p, x, targets, mask, 1.0))(parts.params)
  # The check can see a (B, layer) array: the vmap path has one.
  assert _largest_intermediate(vmap_jaxpr.jaxpr) >= batch * dense
  largest = _largest_intermediate(ghost_jaxpr.jaxpr)
  # Its largest array is conv2's input patches (B, 196, 288), far below (B, 421,642).
  assert largest < batch * dense // 4 and largest < batch * num_params // 4


class _SharedLayer(nnx.Module):
  def __init__(self, rngs, call_twice=True):
    self.fc = nnx.Linear(4, 4, rngs=rngs)
    self.unused = nnx.Linear(4, 4, rngs=rngs)
    self.call_twice = call_twice

  def __call__(self, x, *, train=False):
    y = self.fc(x.reshape(x.shape[0], -1))
    return core.ClassifierOutput(self.fc(y) if self.call_twice else y, y, y)


class _TiedWeights(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(4, 4, rngs=rngs)

  def __call__(self, x, *, train=False):
    y = self.fc(x.reshape(x.shape[0], -1)) @ self.fc.kernel[...].T  # the kernel read twice
    return core.ClassifierOutput(y, y, y)


class _OwnParam(nnx.Module):
  def __init__(self, rngs):
    self.fc = nnx.Linear(4, 4, rngs=rngs)
    self.temperature = nnx.Param(jnp.ones(()))

  def __call__(self, x, *, train=False):
    y = self.fc(x.reshape(x.shape[0], -1)) * self.temperature
    return core.ClassifierOutput(y, y, y)


@pytest.mark.parametrize("model,message", [
    (lambda: registry.create_classifier("lenet5", num_classes=4, input_shape=(28, 28, 1),
                                        norm="batch", seed=0), "nnx.BatchNorm conv1/norm"),
    (lambda: _OwnParam(nnx.Rngs(0)), "temperature of _OwnParam"),
    (lambda: _SharedLayer(nnx.Rngs(0)), "fc, called twice"),
    (lambda: _SharedLayer(nnx.Rngs(0), call_twice=False), "never called.*unused"),
    (lambda: _TiedWeights(nnx.Rngs(0)), "parameter fc/kernel: it is used 2 times"),
])
def test_refuses_what_it_cannot_handle_naming_the_layer(model, message):
  parts = core.split(model())
  x = jnp.zeros((2, 2, 2, 1)) if not isinstance(model(), classifiers.LeNet5) else jnp.zeros(
      (2, 28, 28, 1))
  with pytest.raises(UserError, match=message):
    ghost.ghost_clip_and_sum(parts.graphdef, parts.params, parts.batch_stats, x,
                             (jnp.zeros(2, jnp.int32), jnp.ones(2)), jnp.ones(2, bool),
                             loss_fn=_loss, l2_clip_norm=1.0)


@pytest.mark.parametrize("routes,vary_params", [("static", True), ("xla_cpu", True),
                                                ("static", False), ("batch_channels", True)])
def test_inside_shard_map_each_device_sums_its_own_rows(monkeypatch, tmp_path, routes,
                                                        vary_params):
  # "xla_cpu": the model traced through the opt-in CPU kernels (fused tapped GroupNorm stage,
  # fast_conv); the sums must not change. Without vary_params the parameters stay replicated
  # (invariant), as the ghost docstring allows. "batch_channels": every per-example kernel
  # gradient in that form.
  if routes == "batch_channels":
    monkeypatch.setattr(ghost_clipping, "conv_grad_form", lambda *a, **k: "batch_channels")
  ops = kernels.xla_cpu_ops() if routes == "xla_cpu" else kernels.REFERENCE
  monkeypatch.setattr(kernels, "_ACTIVE", [ops])  # restored by monkeypatch after the test
  # Per-device sums over 8 fake devices (2 rows each: the batched pass and its mixing check run
  # per device), psummed, equal the sum over the whole batch: the taps'
  # zero perturbations must vary over the mesh axis (invariant ones had their gradients, the
  # per-example output gradients, psummed over the devices).
  parts = core.split(registry.create_classifier("small_cnn", num_classes=4, input_shape=(8, 8, 1),
                                                norm="group", seed=0))
  rng = np.random.default_rng(3)
  x = rng.standard_normal((16, 8, 8, 1)).astype(np.float32)
  x[5] = np.nan  # a real non-finite example (device 2): weight 0, norm NaN
  x[14] = np.inf  # a padding row (device 7) holding garbage: contributes nothing
  targets = (np.arange(16, dtype=np.int32) % 4, np.ones(16, np.float32))
  mask = np.arange(16) < 13
  mesh = sharding.data_mesh()
  axis = sharding.DATA_AXIS

  def device_sum(params, x, targets, mask):
    if vary_params:
      params = jax.tree.map(lambda p: jax.lax.pcast(p, axis, to="varying"), params)
    out = ghost.ghost_clipped_sum(parts.graphdef, params, parts.batch_stats, x, targets, mask,
                                  loss_fn=_loss, l2_clip_norm=0.5)
    return jax.lax.psum(out.clipped_sum, axis), out.norms

  sharded = jax.jit(jax.shard_map(device_sum, mesh=mesh, out_specs=(P(), P(axis)),
                                  in_specs=(P(), P(axis), P(axis), P(axis))))
  got_sum, got_norms = sharded(parts.params, *sharding.shard_batch((x, targets, mask), mesh))
  expected = jax.jit(lambda p: ghost.ghost_clipped_sum(
      parts.graphdef, p, parts.batch_stats, x, targets, mask, loss_fn=_loss,
      l2_clip_norm=0.5))(parts.params)
  np.testing.assert_allclose(got_norms, expected.norms, rtol=1e-5)
  assert np.isnan(got_norms[5]) and np.isfinite(np.delete(np.asarray(got_norms), [5, 14])).all()
  _assert_tree_close(jax.device_get(got_sum), jax.device_get(expected.clipped_sum))
  # And both equal the vmap path's clipped sum over the whole batch.
  reference, _, _ = _vmap_path(parts)(parts.params, x, targets, mask, 0.5)
  _assert_tree_close(jax.device_get(got_sum), reference)
