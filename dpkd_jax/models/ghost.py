"""DP-SGD's clipped sum of a zoo model without per-example gradients (ghost clipping).

`ghost_clip_and_sum` returns what `privacy.dpsgd_mechanism.dpsgd_clip_and_sum` returns for the
per-example gradients of `vmap(grad)`: the sum over the batch of the clipped gradients and the
(B,) pre-clip norms, equal to float rounding, without an array of shape (B, num_params). The
formulas (ghost norms, mixed per layer, and book-keeping) and the sensitivity (C add/remove,
2C replace-one, unchanged) are in `privacy.ghost_clipping`; this module is the plumbing.

One forward and backward pass, `vmap`ped over the examples like `vmap(grad)`, differentiates
each example's loss with respect to
  * a zero perturbation added to the output of every `nnx.Linear` and `nnx.Conv` (before its
    bias): its gradient is g_i = ∂loss_i/∂z_i, the layer's output gradient. The layer's input
    a_i is recorded on the way. The layers' own weights are NOT differentiated, so no
    per-example weight gradient exists anywhere in the program;
  * the remaining small parameters (GroupNorm, LayerNorm, RMSNorm scale and bias): their exact
    per-example gradients, (B, channels) each.
The taps replace the layers' `dot_general` / `conv_general_dilated` on a freshly merged module
(the graphdef and params are not changed). The tapped convolution calls
`lax.conv_general_dilated`, whose values `fast_conv.conv_general_dilated` shares (it only
changes the kernel gradient, which is not taken here).

Refused, with `UserError` naming the layer: BatchNorm (mixes examples), a parameter owned by any
other layer type, a Linear/Conv with a mask or a custom dot/conv function, a layer called twice
(shared weights) or never.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx, traverse_util
from jax import lax

from dpkd_jax.errors import UserError
from dpkd_jax.models import fast_conv
from dpkd_jax.privacy import ghost_clipping, validation

PyTree = Any
Path = tuple
# Parameter-owning layers whose per-example gradients are taken directly (small, per example).
SMALL_PARAM_LAYERS = (nnx.GroupNorm, nnx.LayerNorm, nnx.RMSNorm)
_CONV_FUNCTIONS = (lax.conv_general_dilated, fast_conv.conv_general_dilated)


class GhostOutputs(NamedTuple):
  """One batch's clipped sum and what a DP-SGD step reports with it.

  Attributes:
    clipped_sum: `params`' pytree, Σ_i mask_i clip_C(∇ loss_i) (no batch axis).
    norms: (B,) pre-clip gradient norms (NaN/inf for non-finite examples).
    losses: (B,) each example's loss.
    outputs: the model's output pytree, one (B, ...) row per example (e.g. logits).
  """

  clipped_sum: PyTree
  norms: jax.Array
  losses: jax.Array
  outputs: Any


class _ConvSpec(NamedTuple):
  """The static arguments `nnx.Conv` passed to its convolution."""

  window: tuple[int, ...]
  kernel_shape: tuple[int, ...]
  strides: Any
  padding: Any
  lhs_dilation: Any
  rhs_dilation: Any
  dimension_numbers: Any
  groups: int


def _name(path: Path) -> str:
  return "/".join(str(p) for p in path) or "<model>"


def _modules(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree) -> dict[Path, Any]:
  module = nnx.merge(graphdef, params, batch_stats)
  return {tuple(path): node for path, node in nnx.graph.iter_graph(module)
          if isinstance(node, nnx.Module)}


def _check_layer(path: Path, node: Any) -> None:
  """Raises UserError if a Linear/Conv is configured in a way the taps do not reproduce."""
  if type(node) is nnx.Conv:
    if node.mask is not None:
      raise UserError(f"ghost clipping cannot handle nnx.Conv {_name(path)} with a kernel mask; "
                      "use the vmap per-example gradients")
    if node.conv_general_dilated not in _CONV_FUNCTIONS:
      raise UserError(f"ghost clipping cannot handle nnx.Conv {_name(path)} with a custom "
                      "conv_general_dilated; use the vmap per-example gradients")
  elif node.dot_general is not lax.dot_general:
    raise UserError(f"ghost clipping cannot handle nnx.Linear {_name(path)} with a custom "
                    "dot_general; use the vmap per-example gradients")


def classify(graphdef: nnx.GraphDef, params: PyTree,
             batch_stats: PyTree) -> tuple[dict[Path, bool], list[Path]]:
  """Sorts the parameters into tapped layers and small per-example ones, or refuses the model.

  Returns:
    (layers, small): every `nnx.Linear`/`nnx.Conv` path → whether it has a bias; the flat
    paths (as `traverse_util.flatten_dict` gives them) of the other parameters.

  Raises:
    UserError: a BatchNorm, a parameter of another layer type, or an unsupported Linear/Conv.
  """
  modules = _modules(graphdef, params, batch_stats)
  for path, node in modules.items():
    if isinstance(node, nnx.BatchNorm):
      raise UserError(f"ghost clipping cannot handle nnx.BatchNorm {_name(path)}: it mixes the "
                      "examples of a batch; build the model with norm='group' or 'none'")
  layers, small = {}, []
  for param_path in traverse_util.flatten_dict(params):
    owner = modules.get(tuple(param_path[:-1]))
    if type(owner) in (nnx.Linear, nnx.Conv):
      _check_layer(param_path[:-1], owner)
      layers[param_path[:-1]] = owner.bias is not None
    elif isinstance(owner, SMALL_PARAM_LAYERS):
      small.append(param_path)
    else:
      kind = type(owner).__name__ if owner is not None else "an unknown owner"
      raise UserError(f"ghost clipping cannot handle parameter {_name(param_path)} of {kind}: "
                      "only nnx.Linear, nnx.Conv and GroupNorm/LayerNorm/RMSNorm layers are "
                      "supported; use the vmap per-example gradients")
  return layers, small


class _Tap:
  """Stands in for the Linear/Conv layers' dot/conv functions of one merged module.

  Records each layer's input and convolution arguments and adds `perturbations[path]` (zeros
  shaped like the output; None: record the output shape only) to its output.
  """

  def __init__(self, perturbations: dict[Path, jax.Array] | None):
    self.perturbations = perturbations
    self.inputs: dict[Path, jax.Array] = {}
    self.out_shapes: dict[Path, jax.ShapeDtypeStruct] = {}
    self.conv_specs: dict[Path, _ConvSpec] = {}

  def install(self, module: nnx.Module, layers: dict[Path, bool]) -> None:
    for path, node in nnx.graph.iter_graph(module):
      path = tuple(path)
      if path not in layers:
        continue
      if type(node) is nnx.Conv:
        node.conv_general_dilated = functools.partial(self._conv, path)
      else:
        node.dot_general = functools.partial(self._dot, path)

  def _record(self, path: Path, lhs: jax.Array, out: jax.Array) -> jax.Array:
    if path in self.inputs:
      raise UserError(f"ghost clipping cannot handle layer {_name(path)}, called twice in one "
                      "forward pass (shared weights); use the vmap per-example gradients")
    self.inputs[path] = lhs
    self.out_shapes[path] = jax.ShapeDtypeStruct(out.shape, out.dtype)
    return out if self.perturbations is None else out + self.perturbations[path]

  def _dot(self, path, lhs, rhs, dimension_numbers, precision=None, **kwargs):
    return self._record(path, lhs, lax.dot_general(lhs, rhs, dimension_numbers,
                                                   precision=precision, **kwargs))

  def _conv(self, path, lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
            dimension_numbers=None, feature_group_count=1, precision=None, **kwargs):
    self.conv_specs[path] = _ConvSpec(
        window=tuple(rhs.shape[:-2]), kernel_shape=tuple(rhs.shape), strides=window_strides,
        padding=padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, groups=feature_group_count)
    out = lax.conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
        dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        precision=precision, **kwargs)
    return self._record(path, lhs, out)


def _forward(tap: _Tap, layers: dict[Path, bool], graphdef: nnx.GraphDef, flat_params: dict,
             batch_stats: PyTree, x_one: jax.Array, train: bool) -> Any:
  """One example's forward pass (a batch of one, as `vmap(grad)` runs it) through the taps."""
  module = nnx.merge(graphdef, traverse_util.unflatten_dict(flat_params), batch_stats)
  tap.install(module, layers)
  out = module(x_one[None], train=train)
  return jax.tree.map(lambda v: v[0], out)


def _operands(a: jax.Array, g: jax.Array,
              spec: _ConvSpec | None) -> tuple[jax.Array, jax.Array]:
  """Recorded (B, 1, ...) input and output gradient → (B, T, G, d), (B, T, G, p)."""
  batch = a.shape[0]
  if spec is None:  # dense: every axis but the last is a position sharing the kernel
    return a.reshape(batch, -1, 1, a.shape[-1]), g.reshape(batch, -1, 1, g.shape[-1])
  x = a.reshape(batch, *a.shape[2:])  # drop each example's batch-of-one axis
  patches = ghost_clipping.conv_patches(
      x, spec.window, strides=spec.strides, padding=spec.padding,
      lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation,
      dimension_numbers=spec.dimension_numbers, groups=spec.groups)
  return patches, g.reshape(batch, -1, spec.groups, g.shape[-1] // spec.groups)


def _kernel_leaf(grad: jax.Array, spec: _ConvSpec | None) -> jax.Array:
  """(G, d, p) summed kernel gradient → the kernel's own shape."""
  if spec is None:
    return grad[0]
  return ghost_clipping.conv_kernel_from_patches(grad, spec.kernel_shape)


def _per_example_pass(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                      x: jax.Array, targets: PyTree, *, layers: dict[Path, bool],
                      small_paths: list[Path], loss_fn: Callable, train: bool):
  """The one vmapped forward + backward: per-example losses, outputs, layer inputs, layer
  output gradients, small parameters' gradients, and the convolutions' static arguments."""
  flat = traverse_util.flatten_dict(params)
  small = {path: flat[path] for path in small_paths}
  big = {path: value for path, value in flat.items() if path not in small}
  # Trace one example once (no computation) for the layers' output shapes and conv arguments.
  shapes = _Tap(None)
  jax.eval_shape(lambda f, s, xi: _forward(shapes, layers, graphdef, f, s, xi, train), flat,
                 batch_stats, jax.ShapeDtypeStruct(x.shape[1:], x.dtype))
  unused = sorted(_name(path) for path in set(layers) - set(shapes.inputs))
  if unused:
    raise UserError(f"ghost clipping cannot handle layers never called in the forward pass: "
                    f"{unused}; use the vmap per-example gradients")
  # (B, 1, ...) per layer. zeros_like(x): inside `shard_map` they vary over x's mesh axes, as
  # x does; invariant zeros would get their gradients (g_i) psummed over the devices.
  perturbations = {path: jnp.zeros_like(x, shape=(x.shape[0],) + s.shape, dtype=s.dtype)
                   for path, s in shapes.out_shapes.items()}

  def example_loss(small_params, perturbation, x_i, target_i):
    tap = _Tap(perturbation)
    out = _forward(tap, layers, graphdef, {**big, **small_params}, batch_stats, x_i, train)
    return loss_fn(out, target_i), (tap.inputs, out)

  grad_fn = jax.value_and_grad(example_loss, argnums=(0, 1), has_aux=True)
  (losses, (inputs, outputs)), (small_grads, out_grads) = jax.vmap(
      grad_fn, in_axes=(None, 0, 0, 0))(small, perturbations, x, targets)
  return losses, outputs, inputs, out_grads, small_grads, shapes.conv_specs


def ghost_clipped_sum(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                      x: jax.Array, targets: PyTree, mask: jax.Array, *,
                      loss_fn: Callable[[Any, Any], jax.Array], l2_clip_norm: float,
                      train: bool = True, allow_gram: bool = True) -> GhostOutputs:
  """Σ_i mask_i clip_C(∇θ loss_i) and the (B,) norms, by ghost norms and book-keeping.

  Equal to float rounding to `dpsgd_clip_and_sum(vmap(grad(loss_i)), mask, l2_clip_norm=C)`,
  non-finite examples included (they contribute 0, their norm is NaN or inf); same
  sensitivity (C add/remove, 2C replace-one: `privacy.ghost_clipping`).

  Args:
    graphdef, params, batch_stats: a model from `core.split` without BatchNorm.
    x: (B, ...) inputs; each example runs as a batch of one, as under `vmap(grad)`. Inside
      `jax.shard_map`, pass `params` cast to varying over x's axes (`lax.pcast`), as for
      `vmap(grad)`: the small parameters' per-example gradients are otherwise psummed.
    targets: pytree of (B, ...) per-example targets (e.g. (B,) int labels).
    mask: (B,) bool, False for padding rows.
    loss_fn: (output of one example, its target) → scalar loss; the output is the model's
      output pytree without the batch axis (for classifiers a `ClassifierOutput` of (K,)
      logits, (F,) features, hint).
    l2_clip_norm: C > 0 (may be traced).
    train: passed to the model (GroupNorm and no-norm models do not depend on it).
    allow_gram: False never uses the Gram (ghost-norm) form, whose rounding grows with
      cancellation (`privacy.ghost_clipping`): layers that would use it materialise their
      (B, layer) per-example gradients instead.

  Returns:
    `GhostOutputs`. Raises UserError (see the module docstring) for unsupported models.
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  layers, small_paths = classify(graphdef, params, batch_stats)
  losses, outputs, inputs, out_grads, small_grads, specs = _per_example_pass(
      graphdef, params, batch_stats, x, targets, layers=layers, small_paths=small_paths,
      loss_fn=loss_fn, train=train)
  sq_norms = ghost_clipping.tree_sq_norms(small_grads)  # (B,), or 0 without small params
  operands, kernel_norms, biases = {}, {}, {}
  for path, has_bias in layers.items():
    a, g = _operands(inputs[path], out_grads[path], specs.get(path))
    method = ghost_clipping.kernel_method(a.shape[1], a.shape[3], g.shape[3],
                                          allow_gram=allow_gram)
    kernel_norms[path] = ghost_clipping.kernel_sq_norms(a, g, method)
    operands[path] = (a, g)
    sq_norms = sq_norms + kernel_norms[path].sq_norms
    if has_bias:
      biases[path] = ghost_clipping.bias_grads(g).reshape(g.shape[0], -1)  # (B, out)
      sq_norms = sq_norms + jnp.sum(jnp.square(biases[path]), axis=1)
  weights, norms, keep = ghost_clipping.clip_weights(sq_norms, mask, l2_clip_norm)
  sums = {path: ghost_clipping.weighted_sum(grad, weights, keep)
          for path, grad in small_grads.items()}
  for path, (a, g) in operands.items():
    kernel = ghost_clipping.weighted_kernel_sum(a, g, kernel_norms[path], weights, keep)
    sums[path + ("kernel",)] = _kernel_leaf(kernel, specs.get(path))
    if path in biases:
      sums[path + ("bias",)] = ghost_clipping.weighted_sum(biases[path], weights, keep)
  return GhostOutputs(traverse_util.unflatten_dict(sums), norms, losses, outputs)


def ghost_clip_and_sum(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                       x: jax.Array, targets: PyTree, mask: jax.Array, *,
                       loss_fn: Callable[[Any, Any], jax.Array], l2_clip_norm: float,
                       allow_gram: bool = True) -> tuple[PyTree, jax.Array]:
  """(clipped_sum, norms) as `dpsgd_mechanism.dpsgd_clip_and_sum` returns them (see
  `ghost_clipped_sum`, which also returns the losses and outputs)."""
  out = ghost_clipped_sum(graphdef, params, batch_stats, x, targets, mask, loss_fn=loss_fn,
                          l2_clip_norm=l2_clip_norm, allow_gram=allow_gram)
  return out.clipped_sum, out.norms
