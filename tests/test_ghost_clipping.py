"""Tests of dpkd_jax/privacy/ghost_clipping.py: every norm form, patches and book-keeping sums
against per-example gradients computed directly, and the clip rule against dpsgd_mechanism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dpkd_jax.privacy import dpsgd_mechanism, ghost_clipping

# Jitted: one compilation per call shape instead of one per eager operation.
_sq_norms = jax.jit(ghost_clipping.kernel_sq_norms, static_argnums=2)

_NHWC = ("NHWC", "HWIO", "NHWC")


def _operands(batch=5, tokens=7, groups=2, d=4, p=3, seed=0):
  ka, kg = jax.random.split(jax.random.key(seed))
  return (jax.random.normal(ka, (batch, tokens, groups, d)),
          jax.random.normal(kg, (batch, tokens, groups, p)))


def _direct_sq_norms(a, g):
  grads = np.einsum("btgd,btgp->bgdp", np.asarray(a, np.float64), np.asarray(g, np.float64))
  return (grads ** 2).sum(axis=(1, 2, 3))


@pytest.mark.parametrize("method", ["gram", "per_example", None])
def test_kernel_sq_norms_equal_the_materialised_norms(method):
  a, g = _operands()
  norms = _sq_norms(a, g, method)
  np.testing.assert_allclose(norms.sq_norms, _direct_sq_norms(a, g), rtol=1e-5)
  chosen = method or ghost_clipping.kernel_method(7, 4, 3)  # None: per_example (2·49 > 12)
  assert (norms.per_example is not None) == (chosen == "per_example")


def test_rank1_form_needs_one_position_and_is_exact():
  a, g = _operands(tokens=1)
  norms = _sq_norms(a, g, None)  # T = 1 picks rank-1
  np.testing.assert_allclose(norms.sq_norms, _direct_sq_norms(a, g), rtol=1e-5)
  assert norms.per_example is None
  with pytest.raises(ValueError, match="T = 1"):
    ghost_clipping.kernel_sq_norms(*_operands(tokens=2), "rank1")
  with pytest.raises(ValueError, match="method"):
    ghost_clipping.kernel_sq_norms(a, g, "bogus")
  with pytest.raises(ValueError, match="equal"):
    ghost_clipping.kernel_sq_norms(a, g[:, :, :1])


def test_kernel_method_is_mixed_ghost_clipping():
  assert ghost_clipping.kernel_method(1, 400, 120) == "rank1"
  assert ghost_clipping.kernel_method(4, 288, 64) == "gram"  # 2·16 < 18432
  assert ghost_clipping.kernel_method(196, 288, 64) == "per_example"  # 2·196² > 18432
  assert ghost_clipping.kernel_method(784, 9, 32) == "per_example"
  assert ghost_clipping.kernel_method(4, 288, 64, allow_gram=False) == "per_example"
  assert ghost_clipping.kernel_method(1, 400, 120, allow_gram=False) == "rank1"


@pytest.mark.parametrize("groups,strides,padding,rhs_dilation", [
    (2, (1, 2), "VALID", (2, 1)),
    (4, (2, 1), ((1, 2), (0, 1)), (1, 1)),  # depthwise: one input channel per group
])
def test_conv_patches_give_the_per_example_kernel_gradients(groups, strides, padding,
                                                            rhs_dilation):
  kx, kk, kg = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(kx, (3, 9, 8, 4))
  kernel = jax.random.normal(kk, (3, 2, 4 // groups, 8))
  numbers = lax.conv_dimension_numbers(x.shape, kernel.shape, _NHWC)

  def conv(xs, k):
    return lax.conv_general_dilated(xs, k, strides, padding, rhs_dilation=rhs_dilation,
                                    dimension_numbers=numbers, feature_group_count=groups)

  @jax.jit
  def both(x, kernel, g):
    # Direct: each example's own kernel VJP.
    direct = jax.vmap(lambda xi, gi: jax.vjp(lambda k: conv(xi[None], k), kernel)[1](gi[None])[0])(
        x, g)
    patches = ghost_clipping.conv_patches(
        x, kernel.shape[:2], strides=strides, padding=padding, lhs_dilation=None,
        rhs_dilation=rhs_dilation, dimension_numbers=numbers, groups=groups)
    g_grouped = g.reshape(3, -1, groups, g.shape[-1] // groups)
    per_example = ghost_clipping.per_example_kernel_grads(patches, g_grouped)
    return (direct, ghost_clipping.conv_kernel_from_patches(per_example, kernel.shape),
            ghost_clipping.conv_kernel_from_patches(per_example.sum(0), kernel.shape),
            ghost_clipping.kernel_sq_norms(patches, g_grouped, "gram").sq_norms,
            ghost_clipping.kernel_sq_norms(patches, g_grouped, "per_example").sq_norms)

  g = jax.random.normal(kg, jax.eval_shape(conv, x, kernel).shape)
  direct, got, summed, gram, materialised = both(x, kernel, g)
  np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-4)
  # The summed (G, d, p) form maps to the kernel the same way.
  np.testing.assert_allclose(summed, direct.sum(0), rtol=1e-4, atol=1e-4)
  expected = jnp.sum(direct ** 2, axis=(1, 2, 3, 4))
  np.testing.assert_allclose(gram, expected, rtol=1e-4)
  np.testing.assert_allclose(materialised, expected, rtol=1e-4)


@pytest.mark.parametrize("form", ghost_clipping.CONV_GRAD_FORMS)
@pytest.mark.parametrize("groups,strides,padding,lhs_dilation,rhs_dilation", [
    (1, (1, 1), "SAME", None, None),
    (1, (2, 1), ((2, 1), (0, 2)), (1, 2), (2, 1)),
    (2, (1, 2), "VALID", None, (2, 1)),  # grouped: "taps" takes the patches
    (4, (1, 1), "SAME", None, None),  # depthwise
])
def test_every_conv_grad_form_gives_each_examples_kernel_gradient(form, groups, strides, padding,
                                                                  lhs_dilation, rhs_dilation):
  kx, kk, kg = jax.random.split(jax.random.key(2), 3)
  x = jax.random.normal(kx, (3, 9, 8, 4))
  kernel = jax.random.normal(kk, (3, 2, 4 // groups, 8))

  def conv(xs, k):
    return lax.conv_general_dilated(xs, k, strides, padding, lhs_dilation, rhs_dilation,
                                    dimension_numbers=_NHWC, feature_group_count=groups)

  g = jax.random.normal(kg, jax.eval_shape(conv, x, kernel).shape)
  direct = jax.jit(jax.vmap(lambda xi, gi: jax.vjp(lambda k: conv(xi[None], k), kernel)[1](
      gi[None])[0]))(x, g)
  got = jax.jit(lambda x, g: ghost_clipping.per_example_conv_kernel_grads(
      x, g, window=kernel.shape[:2], strides=strides, padding=padding, lhs_dilation=lhs_dilation,
      rhs_dilation=rhs_dilation, dimension_numbers=_NHWC, groups=groups, form=form))(x, g)
  assert got.shape == (3, *kernel.shape)
  np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-4)


def test_conv_grad_form_names_a_form_and_unknown_forms_are_refused():
  for shape in [((5, 5), 1, 6), ((5, 5), 6, 16), ((3, 3), 1, 32), ((3, 3), 32, 64),
                ((3, 3), 64, 64)]:
    assert ghost_clipping.conv_grad_form(*shape, groups=1) in ghost_clipping.CONV_GRAD_FORMS
  x, g = jnp.zeros((1, 4, 4, 1)), jnp.zeros((1, 4, 4, 1))
  with pytest.raises(ValueError, match="form must be one of"):
    ghost_clipping.per_example_conv_kernel_grads(
        x, g, window=(1, 1), strides=(1, 1), padding="SAME", lhs_dilation=None,
        rhs_dilation=None, dimension_numbers=_NHWC, groups=1, form="im2col")


@pytest.mark.parametrize("shape,window,strides,padding,lhs_dilation,rhs_dilation,groups", [
    ((2, 7, 6, 4), (3, 2), (2, 1), "SAME", None, (1, 2), 2),
    ((2, 7, 6, 3), (2, 3), (1, 2), ((2, -1), (0, 3)), (2, 1), None, 1),  # crop, dilate input
    ((3, 9, 2), (4,), (3,), "VALID", None, (2,), 1),  # 1-D
    ((1, 4, 5, 3, 2), (2, 1, 2), (1, 2, 1), "SAME", None, None, 2),  # 3-D
])
def test_conv_patches_equal_lax_patches(shape, window, strides, padding, lhs_dilation,
                                        rhs_dilation, groups):
  # The sliced patches are laid out exactly as XLA's one-hot-kernel patches.
  x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
  rank = len(shape) - 2
  spatial = "DHW"[-rank:]
  specs = (f"N{spatial}C", f"{spatial}IO", f"N{spatial}C")
  numbers = lax.conv_dimension_numbers(shape, (1,) * len(shape), specs)
  expected = lax.conv_general_dilated_patches(
      x, window, strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
      dimension_numbers=numbers)
  got = jax.jit(lambda x: ghost_clipping.conv_patches(
      x, window, strides=strides, padding=padding, lhs_dilation=lhs_dilation,
      rhs_dilation=rhs_dilation, dimension_numbers=numbers, groups=groups))(x)
  assert got.shape == (shape[0], int(np.prod(expected.shape[1:-1])), groups,
                       expected.shape[-1] // groups)
  np.testing.assert_array_equal(got, np.asarray(expected).reshape(got.shape))


def test_conv_patches_need_a_channels_last_input():
  with pytest.raises(ValueError, match="channels-last"):
    ghost_clipping.conv_patches(jnp.zeros((1, 2, 5, 5)), (3, 3), strides=(1, 1), padding="SAME",
                                lhs_dilation=None, rhs_dilation=None,
                                dimension_numbers=("NCHW", "OIHW", "NCHW"), groups=1)


def test_clip_weights_follow_the_vmap_mechanism_rule():
  grads = jnp.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [jnp.nan, 1.0], [jnp.inf, 0.0],
                     [3e30, 4e30], [6.0, 8.0]])  # norms 5, 0.5, 0, NaN, inf, overflow, 10
  mask = jnp.array([True, True, True, True, True, True, False])
  clipped, expected_norms = dpsgd_mechanism.clip_per_example_gradients({"w": grads}, 1.0)
  weights, norms, keep = ghost_clipping.clip_weights(jnp.sum(grads ** 2, axis=1), mask, 1.0)
  np.testing.assert_allclose(norms, expected_norms, rtol=1e-6)
  np.testing.assert_array_equal(keep, [True, True, True, False, False, False, True])
  # Same per-row scale where kept (mask aside), 0 elsewhere.
  safe = jnp.where(keep[:, None], grads, 0.0)
  np.testing.assert_allclose(weights[:, None] * safe, clipped["w"] * mask[:, None], rtol=1e-6)
  np.testing.assert_allclose(weights, [0.2, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("method", ["gram", "per_example"])
def test_weighted_kernel_sum_is_the_clipped_sum_and_drops_non_finite_rows(method):
  a, g = _operands(batch=4)
  a = a.at[1, 3, 0, 2].set(jnp.nan)  # example 1 not finite
  g = g.at[2].set(0.0).at[2, 0, 0, 0].set(jnp.inf)  # example 2 not finite

  @jax.jit
  def clipped_sum(a, g):
    norms = ghost_clipping.kernel_sq_norms(a, g, method)
    weights, _, keep = ghost_clipping.clip_weights(norms.sq_norms, jnp.ones(4, bool), 2.0)
    return ghost_clipping.weighted_kernel_sum(a, g, norms, weights, keep), weights, keep

  got, weights, keep = clipped_sum(a, g)
  np.testing.assert_array_equal(keep, [True, False, False, True])
  kept = np.asarray(keep)
  direct = np.einsum("btgd,btgp->bgdp", np.asarray(a)[kept], np.asarray(g)[kept])
  expected = np.tensordot(np.asarray(weights)[kept], direct, axes=1)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_an_infinite_input_with_zero_output_gradient_is_not_finite_in_every_form():
  a, g = _operands(batch=2, tokens=3, groups=1)
  a = a.at[0, 1, 0, 0].set(jnp.inf)
  g = g.at[0].set(0.0)
  for method in ("gram", "per_example"):
    sq = _sq_norms(a, g, method).sq_norms
    assert not np.isfinite(sq[0]) and np.isfinite(sq[1])
  a1, g1 = a[:, :1], g[:, :1].at[0].set(0.0)
  a1 = a1.at[0, 0, 0, 0].set(jnp.inf)
  sq = _sq_norms(a1, g1, "rank1").sq_norms
  assert not np.isfinite(sq[0]) and np.isfinite(sq[1])


def test_bias_grads_and_tree_sq_norms():
  g = jnp.arange(24.0).reshape(2, 3, 4)
  np.testing.assert_allclose(ghost_clipping.bias_grads(g), g.sum(axis=1))
  tree = {"s": jnp.ones((2, 3)), "b": 2 * jnp.ones((2, 1))}
  np.testing.assert_allclose(ghost_clipping.tree_sq_norms(tree), [7.0, 7.0])
  assert float(ghost_clipping.tree_sq_norms({})) == 0.0
