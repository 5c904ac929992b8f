"""Tests of `dpkd_jax.kernels.xla_cpu.fast_conv`: same values and gradients as `lax.conv_general_dilated`.

Tolerance: the fast kernel gradient sums the same products in another order, so results agree
to float32 rounding; every comparison allows max |fast − lax| ≤ 1e-5 · max |lax| for single
convolutions (seen: ≤ 1e-6) and 1e-4 for whole models, where rounding differences propagate
through normalisation layers.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from dpkd_jax import kernels
from dpkd_jax.kernels.xla_cpu import fast_conv
from dpkd_jax.models import classifiers, core, generators, registry
# Shared with the classifier and generator tests: deterministic parameters, nothing compiled.
from test_classifiers import fill_surrogate

NHWC = ("NHWC", "HWIO", "NHWC")
CONV_TOLERANCE = 1e-5
MODEL_TOLERANCE = 1e-4
# The DAFL generator's float32 parameter gradients are themselves about 5e-3 (relative to the
# largest leaf) from its float64 ones: its BatchNorms amplify rounding. Two exact routes (e.g.
# banded vs lax for its 2×2 sub-pixel convolutions) may then differ by ~5e-4, a tenth of that.
GENERATOR_TOLERANCE = 2e-3
DEFAULT_MIN_CHANNEL_PRODUCT = fast_conv._MIN_CHANNEL_PRODUCT


@pytest.fixture(autouse=True)
def gemm_kernel_grad_for_every_width(monkeypatch):
  """The tests' kernels are narrow, so that they run fast: lower the width threshold so that
  they take the GEMM kernel gradient that wide kernels take by default."""
  monkeypatch.setattr(fast_conv, "_MIN_CHANNEL_PRODUCT", 1)


# Forced routes (each pass's form where the shape offers it, else the static rule): every exact
# form must give lax's values and gradients, whichever the static rule picks.
ROUTES = {
    "static": {},
    "banded": {"forward": "banded", "input_grad": "banded", "kernel_grad": "banded"},
    "gemm": {"kernel_grad": "gemm"},
    "xla": {"forward": "xla", "input_grad": "xla", "kernel_grad": "xla"},
}


def force_route(monkeypatch, name):
  """Makes every pass traced in the test take ROUTES[name]'s form where its shape offers it."""
  monkeypatch.setattr(fast_conv, "_FORCED_FORMS", dict(ROUTES[name]))


def assert_close(actual, expected, tolerance=CONV_TOLERANCE, tree_scale=False):
  """max |actual − expected| ≤ tolerance · max |expected|, leaf by leaf; with `tree_scale`,
  at least the largest leaf's scale (a leaf that is zero up to rounding, e.g. a bias before
  BatchNorm, holds only rounding noise, which another summation order changes)."""
  chex.assert_trees_all_equal_shapes_and_dtypes(actual, expected)
  largest = max(float(jnp.max(jnp.abs(e))) for e in jax.tree.leaves(expected))
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    scale = largest if tree_scale else float(jnp.max(jnp.abs(e)))
    error = float(jnp.max(jnp.abs(a - e)))
    assert error <= tolerance * scale, f"max error {error:.2e} vs scale {scale:.2e}"


def normal(shape, seed):
  """Standard normal float32 test data from NumPy's generator with a fixed seed.

  Made on the host: jax.random would compile a threefry kernel for every shape, which costs
  seconds per test on XLA CPU.
  """
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32))


def random_conv_inputs(batch, height, width, kernel_shape, seed=0):
  """Input (B, H, W, C) and kernel `kernel_shape`."""
  return normal((batch, height, width, kernel_shape[2]), seed), normal(kernel_shape, seed + 1)


def value_and_grads(conv, x, w, target, **conv_kwargs):
  """Output and the gradients of a non-linear scalar loss w.r.t. input and kernel."""
  def loss(x, w):
    y = conv(x, w, **conv_kwargs)
    return jnp.sum(jnp.tanh(y) * target), y
  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
  return y, grads


# (kernel (kh, kw, C, O), strides, padding, input (H, W)): both operand orders (C < O slices x,
# C ≥ O slices dy), stacked (< 16 channels) and per-tap GEMMs, a stride larger than the kernel,
# phases with unequal tap counts, string and explicit padding including a crop.
CASES = [
    ((3, 3, 3, 5), (1, 1), "SAME", (7, 6)),
    ((3, 3, 5, 2), (2, 2), "SAME", (7, 6)),
    ((1, 1, 4, 3), (2, 2), "VALID", (6, 6)),
    ((5, 5, 2, 3), (1, 1), ((2, 1), (0, 2)), (6, 7)),
    ((2, 3, 3, 2), (3, 1), ((-1, 1), (2, 0)), (7, 6)),
    ((4, 4, 3, 4), (2, 2), "SAME", (6, 6)),
    ((3, 3, 17, 18), (1, 1), "SAME", (5, 5)),
    ((3, 3, 18, 17), (2, 1), "SAME_LOWER", (6, 5)),
]


@pytest.mark.parametrize("route", ["static", "banded", "xla"])
@pytest.mark.parametrize("kernel_shape,strides,padding,input_hw", CASES)
def test_values_and_gradients_match_lax(monkeypatch, kernel_shape, strides, padding, input_hw,
                                        route):
  # "static" takes the GEMM kernel gradient here (the autouse fixture); "banded" is offered
  # for the stride-1 cases with at most 16 input channels, the others keep the static rule.
  force_route(monkeypatch, route)
  x, w = random_conv_inputs(3, *input_hw, kernel_shape)
  kwargs = dict(window_strides=strides, padding=padding, dimension_numbers=NHWC)
  target = normal(lax.conv_general_dilated(x, w, **kwargs).shape, seed=2)

  @jax.jit
  def both(x, w, target):
    return (value_and_grads(lax.conv_general_dilated, x, w, target, **kwargs),
            value_and_grads(fast_conv.conv_general_dilated, x, w, target, **kwargs))

  (y_lax, grads_lax), (y_fast, grads_fast) = both(x, w, target)
  spec = fast_conv._supported_spec(x, w, strides, padding, None, None, NHWC, 1, 1, None, None,
                                   None)
  if route == "banded" or (route == "static" and spec is not None and fast_conv._route(
      "forward", x.shape, w.shape, spec)[0] == "banded"):
    assert_close(y_fast, y_lax)  # one GEMM: the same products summed in another order
  else:
    chex.assert_trees_all_equal(y_fast, y_lax)  # the forward pass is XLA's own
  assert_close(grads_fast, grads_lax)


def test_kernel_grad_in_chunks_matches_xla():
  # Walks the batch of 4 with lax.scan, one example a step (other tests' batches fit in one
  # chunk), with a stride, so the scan carries one accumulator per phase.
  x, w = random_conv_inputs(4, 6, 5, (3, 3, 6, 4))
  spec = fast_conv._supported_spec(x, w, (2, 1), "SAME", None, None, NHWC, 1, 1, None, None,
                                   None)
  dy = normal(fast_conv._xla_conv(x, w, spec).shape, seed=2)  # (4, 3, 5, 4)

  @jax.jit
  def both(x, w, dy):
    return (fast_conv._cpu_kernel_grad(x, dy, w.shape, spec, examples_per_chunk=1),
            fast_conv._xla_kernel_grad(x, dy, w, spec))

  actual, expected = both(x, w, dy)
  assert_close(actual, expected)


def test_kernel_grad_rejects_chunks_that_do_not_divide_the_batch():
  x, w = random_conv_inputs(4, 5, 5, (3, 3, 2, 2))
  spec = fast_conv._supported_spec(x, w, (1, 1), "SAME", None, None, NHWC, 1, 1, None, None,
                                   None)
  with pytest.raises(ValueError, match="examples_per_chunk=3"):
    fast_conv._cpu_kernel_grad(x, jnp.zeros((4, 5, 5, 2)), w.shape, spec, examples_per_chunk=3)


def per_example_grads(conv, w, x, target):
  """DP-SGD's form: vmap over examples of the kernel gradient of one example's loss."""
  def loss(w, x, t):
    y = conv(x[None], w, (1, 1), "SAME", dimension_numbers=NHWC)
    return jnp.sum(jnp.tanh(y) * t[None])
  return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, x, target)


def batch_grad(conv, w, x, target):
  """The kernel gradient of the whole batch's loss (no vmap: ghost clipping's backward pass)."""
  return jax.grad(lambda w: jnp.sum(jnp.tanh(conv(x, w, (1, 1), "SAME",
                                                  dimension_numbers=NHWC)) * target))(w)


def sharded(conv, grads=per_example_grads):
  """jit(shard_map) of `grads` over the 8 fake CPU devices, the kernel replicated and cast to
  'varying' so that its gradients stay per device (as DP-SGD takes them)."""
  mesh = Mesh(np.asarray(jax.devices()), ("data",))

  def device_grads(w, x, target):
    return grads(conv, lax.pcast(w, "data", to="varying"), x, target)
  return jax.jit(jax.shard_map(device_grads, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                               out_specs=P("data")))


@pytest.mark.parametrize("route", ["static", "banded"])
def test_per_example_grads_inside_shard_map(monkeypatch, route):
  force_route(monkeypatch, route)
  # As DP-SGD takes them, jitted: vmap(grad) over the examples of each of the 8 fake CPU
  # devices, the kernel replicated and cast to 'varying' so its gradients stay per device.
  x, w = random_conv_inputs(2 * len(jax.devices()), 5, 5, (3, 3, 3, 4))
  target = normal((x.shape[0], 5, 5, 4), seed=2)
  assert_close(sharded(fast_conv.conv_general_dilated)(w, x, target),
               sharded(lax.conv_general_dilated)(w, x, target))


def test_chunked_gemm_kernel_grad_of_a_batch_inside_shard_map(monkeypatch):
  # A batch gradient (not vmapped) per device, walked in chunks by lax.scan (ghost clipping's
  # backward pass through its tapped convolutions): the scan's carry must vary over the mesh.
  force_route(monkeypatch, "gemm")
  monkeypatch.setattr(fast_conv, "_CHUNK_PIXELS", 25)  # one example per chunk
  x, w = random_conv_inputs(3 * len(jax.devices()), 5, 5, (3, 3, 3, 4))
  target = normal((x.shape[0], 5, 5, 4), seed=2)
  assert_close(sharded(fast_conv.conv_general_dilated, batch_grad)(w, x, target),
               sharded(lax.conv_general_dilated, batch_grad)(w, x, target))


@pytest.mark.parametrize("route", ["static", "banded"])
def test_gradient_of_gradient_matches_lax(monkeypatch, route):
  force_route(monkeypatch, route)
  # Reverse over reverse (e.g. a gradient penalty) differentiates the custom backward pass.
  x, w = random_conv_inputs(2, 5, 5, (3, 3, 3, 2))

  def penalty(conv, w):
    def output_sum(x):
      return jnp.sum(jnp.tanh(conv(x, w, (1, 1), "SAME", dimension_numbers=NHWC)))
    return jnp.sum(jax.grad(output_sum)(x) ** 2)

  grad_grad = jax.jit(jax.grad(penalty, argnums=1), static_argnums=0)
  assert_close(grad_grad(fast_conv.conv_general_dilated, w),
               grad_grad(lax.conv_general_dilated, w))


def test_banded_forms_only_on_cpu(monkeypatch):
  # The banded forward pass, input and kernel gradient are one dot_general each on CPU; CUDA
  # keeps XLA's three convolutions.
  force_route(monkeypatch, "banded")
  x, w = random_conv_inputs(2, 6, 6, (3, 3, 2, 4))
  grad = jax.jit(jax.grad(lambda x, w: jnp.sum(fast_conv.conv_general_dilated(
      x, w, (1, 1), "SAME", dimension_numbers=NHWC) ** 2), argnums=(0, 1)))
  cpu = jax.export.export(grad, platforms=["cpu"])(x, w).mlir_module()
  cuda = jax.export.export(grad, platforms=["cuda"])(x, w).mlir_module()
  assert "dot_general" in cpu and "dot_general" not in cuda
  assert cuda.count("stablehlo.convolution") == 3


def test_static_rule_takes_the_banded_form_only_for_narrow_layers(monkeypatch):
  # LeNet-5's conv1 (1 → 6): banded forward and input gradient; small_cnn's conv2 (32 → 64):
  # XLA's forward and input gradient, the GEMM kernel gradient; no form is timed.
  monkeypatch.setattr(fast_conv, "_MIN_CHANNEL_PRODUCT", DEFAULT_MIN_CHANNEL_PRODUCT)
  spec = fast_conv._ConvSpec(strides=(1, 1), padding=((2, 2), (2, 2)), precision=None)
  lenet = [fast_conv._route(kind, (256, 28, 28, 1), (5, 5, 1, 6), spec)[0]
           for kind in ("forward", "input_grad", "kernel_grad")]
  assert lenet == ["banded", "banded", "xla"]
  spec = fast_conv._ConvSpec(strides=(1, 1), padding=((1, 1), (1, 1)), precision=None)
  wide = [fast_conv._route(kind, (256, 14, 14, 64), (3, 3, 64, 128), spec)[0]
          for kind in ("forward", "input_grad", "kernel_grad")]
  assert wide == ["xla", "xla", "gemm"]


def all_convs(model):
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Conv)]


@pytest.mark.parametrize("name", sorted(registry.CLASSIFIERS))
def test_every_classifier_conv_goes_through_the_seam(name):
  model = nnx.eval_shape(lambda: registry.create_classifier(
      name, num_classes=10, input_shape=(32, 32, 3), norm="group",
      rngs=nnx.Rngs(jax.random.key(0))))
  convs = all_convs(model)
  assert convs or name == "scatter_linear"  # the one convolution-free classifier
  assert all(c.conv_general_dilated is kernels.conv_general_dilated for c in convs)


def test_generator_convs_go_through_the_seam():
  model = nnx.eval_shape(lambda: generators.DAFLGenerator(
      image_shape=(8, 8, 1), rngs=nnx.Rngs(jax.random.key(0)), base_channels=8))
  convs = all_convs(model)
  assert len(convs) == 3
  assert all(c.conv_general_dilated is kernels.conv_general_dilated for c in convs)


def twin_parts(build):
  """(fast, plain) splits of the same abstract model with the same deterministic parameters;
  the fast twin is traced through the CPU kernels, the plain one through the reference ops."""
  fast, plain = nnx.eval_shape(build), nnx.eval_shape(build)
  return fill_surrogate(core.split(fast)), fill_surrogate(core.split(plain))


MODELS = {
    # SAME 3×3 convs and max-pooling, GroupNorm (a DP-SGD teacher).
    "small_cnn": (lambda: classifiers.SmallCNN(num_classes=3, input_shape=(8, 8, 2), norm="group",
                                               rngs=nnx.Rngs(jax.random.key(0))), (4, 8, 8, 2)),
    # The DPDFD generator: BatchNorm in training mode, upsampling, 3 output channels.
    "dafl_generator": (lambda: generators.DAFLGenerator(
        latent_dim=6, image_shape=(8, 8, 3), rngs=nnx.Rngs(jax.random.key(0)), base_channels=8),
                       (4, 6)),
}


@pytest.mark.parametrize("route", ["static", "banded"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_loss_gradients_match_plain_convs(monkeypatch, name, route):
  force_route(monkeypatch, route)
  build, input_shape = MODELS[name]
  fast, plain = twin_parts(build)
  chex.assert_trees_all_equal(fast.params, plain.params)
  inputs = normal(input_shape, seed=3)

  def loss_grads(parts, params, ops):
    def loss(params):
      out, _ = core.apply(parts.graphdef, params, parts.batch_stats, inputs, train=True)
      out = out if isinstance(out, jax.Array) else out.logits
      return jnp.mean(jnp.sin(3.0 * out))
    with kernels.using(ops):
      return jax.grad(loss)(params)

  grads_fast, grads_plain = jax.jit(lambda pf, pp: (
      loss_grads(fast, pf, kernels.xla_cpu_ops()), loss_grads(plain, pp, kernels.REFERENCE)))(
          fast.params, plain.params)
  tolerance = GENERATOR_TOLERANCE if name == "dafl_generator" else MODEL_TOLERANCE
  # The generator's conv biases feed BatchNorms: their gradients are zero up to rounding, and
  # the fast twin computes its upsampling convolutions as sub-pixel ones (another rounding).
  assert_close(grads_fast, grads_plain, tolerance,
               tree_scale=route == "banded" or name == "dafl_generator")
  assert all(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads_fast))
