"""dpkd_jax.models.graph: its operations against PyTorch's on the same arrays (the pooling
variants, "same" padding, adaptive pooling, group norm), and the program's module contract."""

import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.models import graph

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _x(shape=(2, 3, 9, 11), seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _both(x, ours, theirs, rtol=1e-5):
  got = np.asarray(ours(jnp.asarray(x)))
  want = theirs(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil", [
    (3, 2, 1, 1, False), (3, 2, 1, 1, True), (2, 2, 0, 1, True), (3, 1, 1, 2, False)])
def test_max_pool_matches_torch(kernel, stride, padding, dilation, ceil):
  _both(_x(), lambda x: graph.max_pool2d("NCHW", x, kernel, stride, padding, dilation, ceil),
        lambda x: F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil))


@pytest.mark.parametrize("kernel, stride, padding, ceil, include, divisor", [
    (3, 2, 1, False, True, None), (3, 2, 1, True, True, None), (3, 2, 1, True, False, None),
    (2, 2, 0, True, True, None), (3, 1, 1, False, False, None), (3, 2, 1, False, True, 4)])
def test_avg_pool_matches_torch(kernel, stride, padding, ceil, include, divisor):
  _both(_x(), lambda x: graph.avg_pool2d("NCHW", x, kernel, stride, padding, ceil, include,
                                         divisor),
        lambda x: F.avg_pool2d(x, kernel, stride, padding, ceil, include, divisor))


@pytest.mark.parametrize("size", [1, 3, (4, 5), (9, 11), (2, None)])
def test_adaptive_avg_pool_matches_torch(size):
  _both(_x(), lambda x: graph.adaptive_avg_pool2d("NCHW", x, size),
        lambda x: F.adaptive_avg_pool2d(x, size))


@pytest.mark.parametrize("stride, dilation, groups", [(1, 1, 1), (2, 1, 3), (1, 2, 1), (3, 2, 3)])
def test_conv_same_and_explicit_padding_match_torch(stride, dilation, groups):
  x, w = _x((2, 6, 9, 11)), _x((6, 6 // groups, 3, 3), seed=1)
  for padding in ("same", 2) if stride == 1 else (2,):
    _both(x, lambda x, p=padding: graph.conv2d("NCHW", x, jnp.asarray(w), None, stride, p,
                                               dilation, groups),
          lambda x, p=padding: F.conv2d(x, torch.from_numpy(w), None, stride, p, dilation,
                                        groups))


def test_group_norm_matches_torch_in_both_layouts():
  x, w, b = _x((2, 6, 5, 4)), _x((6,), 1), _x((6,), 2)
  want = F.group_norm(torch.from_numpy(x), 3, torch.from_numpy(w), torch.from_numpy(b)).numpy()
  for layout, inputs in (("NCHW", x), ("NHWC", x.transpose(0, 2, 3, 1))):
    got = np.asarray(graph.group_norm(layout, jnp.asarray(inputs), 3, w, b))
    got = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nhwc_pools_with_explicit_pads_count_the_input_only():
  # Keras' "same" average pool: pads [[0, 1], [0, 1]], divisor = the window inside the input.
  x = np.ones((1, 3, 3, 1), np.float32)
  got = np.asarray(graph.avg_pool2d("NHWC", jnp.asarray(x), 2, 2, [[0, 1], [0, 1]]))
  np.testing.assert_allclose(got, np.ones((1, 2, 2, 1)))
  got = np.asarray(graph.max_pool2d("NHWC", jnp.asarray(-x), 2, 2, [[0, 1], [0, 1]]))
  np.testing.assert_allclose(got, -np.ones((1, 2, 2, 1)))


def test_program_format_is_checked():
  with pytest.raises(ValueError, match="format"):
    graph.GraphClassifier({"format": 0})
