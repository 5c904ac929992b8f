"""Taps on a zoo model's layers for ghost clipping: record each layer's input, add a zero tap
to its output, so that one batched backward pass gives every example's output gradients.

`Recorder.install` rewires one freshly merged module (the graphdef and params are unchanged):
  * `nnx.Linear` / `nnx.Conv`: their `dot_general` / `conv_general_dilated` is replaced by one
    that records the input a (B, ..., d) and the convolution's static arguments, and returns
    z + tap (the tap before the bias: the same gradient);
  * per-channel affine layers (`AFFINE_LAYERS`: GroupNorm, LayerNorm, RMSNorm, InstanceNorm,
    BatchNorm with running averages) get a subclass whose `__call__` computes the normalised
    input x̂ (the layer with scale 1 and bias 0: exact), records it and returns
    x̂ · scale + bias + tap. Their per-example gradients are then scale_i = Σ_t g_it x̂_it and
    bias_i = Σ_t g_it. With the CPU kernels on, GroupNorm keeps their fused formulation when
    the layer has its plain configuration;
  * with the CPU kernels on, a plain GroupNorm followed by ReLU and a 2×2 max-pool
    (`classifiers.conv_norm_relu_pool` calls the tapped layer's `fused_relu_max_pool`) runs as
    the kernels' one op, which registers its own tap: it
    records x̂ at each window's selected position and takes the tap at the routed
    pre-activations, both (B, H/2, W/2, C). The GroupNorm's output gradient is zero elsewhere,
    so the same sums Σ_t g_it x̂_it and Σ_t g_it, over the pooled map, are the per-example
    gradients.
A layer called twice (shared weights) is refused, as is BatchNorm computing batch statistics,
a layer with a mask, a custom dot/conv function, cross-device statistics or a feature axis
other than the last one; every refusal names the layer.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from dpkd_jax.errors import UserError
from dpkd_jax import kernels

Path = tuple
AFFINE_LAYERS = (nnx.GroupNorm, nnx.LayerNorm, nnx.RMSNorm, nnx.InstanceNorm, nnx.BatchNorm)
_CONV_FUNCTIONS = (lax.conv_general_dilated, kernels.conv_general_dilated)
_FALLBACK = "; use clipping='vmap' (per-example gradients by vmap)"


def name(path: Path) -> str:
  return "/".join(str(p) for p in path) or "<model>"


class ConvSpec(NamedTuple):
  """The static arguments `nnx.Conv` passed to its convolution."""

  window: tuple[int, ...]
  kernel_shape: tuple[int, ...]
  strides: Any
  padding: Any
  lhs_dilation: Any
  rhs_dilation: Any
  dimension_numbers: Any
  groups: int


def check_layer(path: Path, node: Any) -> None:
  """Raises UserError if a Linear/Conv is configured in a way the taps do not reproduce."""
  kind = f"nnx.{type(node).__name__} {name(path)}"
  if type(node) is nnx.Conv:
    if node.mask is not None:
      raise UserError(f"ghost clipping cannot handle {kind} with a kernel mask{_FALLBACK}")
    if node.conv_general_dilated not in _CONV_FUNCTIONS:
      raise UserError(f"ghost clipping cannot handle {kind} with a custom conv_general_dilated"
                      f"{_FALLBACK}")
  elif node.dot_general is not lax.dot_general:
    raise UserError(f"ghost clipping cannot handle {kind} with a custom dot_general{_FALLBACK}")


def _feature_axes(layer: Any) -> tuple[int, ...]:
  if isinstance(layer, nnx.GroupNorm):
    return (layer.feature_axis,)
  axes = layer.axis if isinstance(layer, nnx.BatchNorm) else layer.feature_axes
  return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


class Recorder:
  """Rewires the tapped layers of one merged module and collects what they saw.

  Attributes:
    taps: path → zeros shaped like the layer's output (added to it), or None: no taps.
    inputs: path → a (B, ..., d) for Linear/Conv, x̂ (B, ..., C) for affine layers (at the
      selected positions, (B, H/2, W/2, C), for a GroupNorm fused with its ReLU and pool).
    outputs: path → the layer's output (its shape is the tap's; before the tap is added,
      except in a fused GroupNorm, where the tap is zero when recorded without taps).
    conv_specs: path → `ConvSpec` of every convolution.
  """

  def __init__(self, taps: dict[Path, jax.Array] | None):
    self.taps = taps
    self.inputs: dict[Path, jax.Array] = {}
    self.outputs: dict[Path, jax.Array] = {}
    self.conv_specs: dict[Path, ConvSpec] = {}

  def install(self, module: nnx.Module, layers: set[Path], affine: set[Path]) -> None:
    for path, node in nnx.graph.iter_graph(module):
      path = tuple(path)
      if path in affine:
        object.__setattr__(node, "__class__", _tapped_class(type(node)))
        object.__setattr__(node, "_ghost_tap", (self, path))
      elif path in layers and type(node) is nnx.Conv:
        node.conv_general_dilated = functools.partial(self._conv, path)
      elif path in layers:
        node.dot_general = functools.partial(self._dot, path)

  def tap(self, path: Path, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """The tap of a layer that adds it itself (zeros while recording shapes only)."""
    return jnp.zeros(shape, dtype) if self.taps is None else self.taps[path]

  def record(self, path: Path, recorded: jax.Array, out: jax.Array, *,
             tap_added: bool = False) -> jax.Array:
    if path in self.inputs:
      raise UserError(f"ghost clipping cannot handle layer {name(path)}, called twice in one "
                      f"forward pass (shared weights){_FALLBACK}")
    self.inputs[path] = recorded
    self.outputs[path] = out
    return out if self.taps is None or tap_added else out + self.taps[path]

  def _dot(self, path, lhs, rhs, dimension_numbers, precision=None, **kwargs):
    return self.record(path, lhs, lax.dot_general(lhs, rhs, dimension_numbers,
                                                  precision=precision, **kwargs))

  def _conv(self, path, lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
            dimension_numbers=None, feature_group_count=1, precision=None, **kwargs):
    self.conv_specs[path] = ConvSpec(
        window=tuple(rhs.shape[:-2]), kernel_shape=tuple(rhs.shape), strides=window_strides,
        padding=padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, groups=feature_group_count)
    # Through the seam, as in the non-private step (the active kernels' convolution).
    out = kernels.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        precision=precision, **kwargs)
    return self.record(path, lhs, out)


def _check_affine(layer: Any, path: Path, x: jax.Array, args: tuple, kwargs: dict) -> None:
  kind = f"nnx.{type(layer).__mro__[1].__name__} {name(path)}"
  if kwargs.get("mask") is not None:
    raise UserError(f"ghost clipping cannot handle {kind} called with a mask{_FALLBACK}")
  if isinstance(layer, nnx.BatchNorm):
    use_running_average = args[0] if args else kwargs.get("use_running_average")
    if not (layer.use_running_average if use_running_average is None else use_running_average):
      raise UserError(f"ghost clipping cannot handle {kind}: it mixes the examples of a batch "
                      "in training mode (batch statistics); build the model with norm='group' "
                      "or 'none'")
  if getattr(layer, "axis_name", None) is not None:
    raise UserError(f"ghost clipping cannot handle {kind} with axis_name (statistics across "
                    f"devices mix examples){_FALLBACK}")
  shapes = {var.shape for var in _affine_params(layer).values()}
  if (tuple(a % x.ndim for a in _feature_axes(layer)) != (x.ndim - 1,)
      or shapes - {(x.shape[-1],)}):
    raise UserError(f"ghost clipping cannot handle {kind} whose features are not the last axis"
                    f"{_FALLBACK}")


def _affine_params(layer: Any) -> dict[str, nnx.Variable]:
  return {attr: getattr(layer, attr) for attr in ("scale", "bias")
          if isinstance(getattr(layer, attr, None), nnx.Variable)}


def _normalised(layer: Any, x: jax.Array, args: tuple, kwargs: dict) -> jax.Array:
  """The layer's output with scale 1 and bias 0: x̂, exactly (· 1 and + 0 round to nothing)."""
  params = _affine_params(layer)
  if isinstance(layer, nnx.GroupNorm):
    xhat = kernels.normalised_group_norm(layer, x)  # a kernel's closed form, if active
    if xhat is not None:
      return xhat
  saved = {attr: var[...] for attr, var in params.items()}
  for attr, var in params.items():
    var[...] = (jnp.ones_like if attr == "scale" else jnp.zeros_like)(saved[attr])
  try:
    return type(layer).__mro__[1].__call__(layer, x, *args, **kwargs)
  finally:
    for attr, var in params.items():
      var[...] = saved[attr]


def _affine_call(self, x, *args, **kwargs):
  recorder, path = self.__dict__["_ghost_tap"]
  _check_affine(self, path, x, args, kwargs)
  xhat = _normalised(self, x, args, kwargs)  # (B, ..., C)
  params = _affine_params(self)
  y = xhat
  if "scale" in params:
    y = y * params["scale"][...].astype(y.dtype)
  if "bias" in params:
    y = y + params["bias"][...].astype(y.dtype)
  return recorder.record(path, xhat, y)


def _fused_relu_max_pool(self, x):
  """`max_pool_2x2(relu(self(x)))` for a tapped GroupNorm as one op when the active kernels
  have one (`kernels.tapped_group_norm_relu_max_pool`, which registers its own tap): it records
  x̂ at the selected positions and taps the routed pre-activations, all (B, H/2, W/2, C).
  None otherwise (the caller then runs the layers in turn, through the tapped `__call__`)."""
  recorder, path = self.__dict__["_ghost_tap"]

  def tap(shape: tuple[int, ...], dtype) -> jax.Array:
    _check_affine(self, path, x, (), {})
    return recorder.tap(path, shape, dtype)

  fused = kernels.tapped_group_norm_relu_max_pool(self, x, tap)
  if fused is None:
    return None
  out, xhat_at = fused
  return recorder.record(path, xhat_at, out, tap_added=True)


@functools.cache
def _tapped_class(base: type) -> type:
  """`base` with a tapped `__call__` (one subclass per layer type, made once); a GroupNorm
  also fuses itself with a following ReLU and 2×2 max-pool (`fused_relu_max_pool`)."""
  methods = {"__call__": _affine_call}
  if issubclass(base, nnx.GroupNorm):
    methods["fused_relu_max_pool"] = _fused_relu_max_pool
  return type(f"GhostTapped{base.__name__}", (base,), methods)
