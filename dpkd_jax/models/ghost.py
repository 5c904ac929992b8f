"""DP-SGD's clipped sum of a zoo model without per-example gradients (ghost clipping).

`ghost_clip_and_sum` returns what `privacy.dpsgd_mechanism.dpsgd_clip_and_sum` returns for the
per-example gradients of `vmap(grad)`: the sum over the batch of the clipped gradients and the
(B,) pre-clip norms, equal to float rounding, without an array of shape (B, num_params). The
formulas (ghost norms, mixed per layer, and book-keeping) and the sensitivity (C add/remove,
2C replace-one, unchanged) are in `privacy.ghost_clipping`; this module is the plumbing.

ONE batched forward and ONE batched backward pass over the whole (B, ...) batch (no `vmap` over
examples). `ghost_taps.Recorder` records every tapped layer's input and adds a zero tap to its
output; the pass differentiates Σ_i loss_i with respect to the taps only. When no op mixes the
examples, loss_i depends on example i alone, so row i of a tap's gradient is
g_i = ∂loss_i/∂z_i, the layer's output gradient of example i. Then:
  * `nnx.Linear` / `nnx.Conv`: a_i (the input; a convolution's input patches) and g_i give the
    per-example norms and the book-keeping sum a^T (w ⊙ g) (`privacy.ghost_clipping`);
  * per-channel affine layers (GroupNorm, LayerNorm, RMSNorm, InstanceNorm, BatchNorm with
    running averages): scale_i = Σ_t g_it x̂_it and bias_i = Σ_t g_it from the recorded
    normalised input x̂, (B, channels) each (t over the pooled map for a GroupNorm fused with
    its ReLU and 2×2 max-pool: x̂ and the tap are at each window's routed position, `ghost_taps`).
No parameter is differentiated, so no weight gradient, per-example or summed, is formed by the
pass; the only backward pass is the one to the taps (the clipped sum needs no second one).

That no op mixes the examples is proved, not assumed: the tapped forward is traced once and
`example_mixing.batch_axes` follows the batch axis through its jaxpr (BatchNorm's batch
statistics, a mean over the batch, a sort along it are refused with the op and source line).

Refused, with `UserError` naming the layer (or the op and its source line): BatchNorm in
training mode, a cross-example op, a parameter owned by any other layer type or read outside its
layer (weight tying), a Linear/Conv with a mask or a custom dot/conv function, a layer called
twice (shared weights) or never, a tapped layer whose rows are not the examples. No zoo model
with norm='group' or 'none' needs the per-example `vmap` path (`clipping='vmap'` remains the
DP-SGD default and handles any model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx, traverse_util

from dpkd_jax.errors import UserError
from dpkd_jax.models import example_mixing, ghost_taps
from dpkd_jax.privacy import clipped_sums
from dpkd_jax.privacy import ghost_clipping, validation

PyTree = Any
Path = tuple
# Parameter-owning layers whose per-example gradients come from their taps (per channel).
SMALL_PARAM_LAYERS = ghost_taps.AFFINE_LAYERS
_AFFINE_PARAMS = ("scale", "bias")
_FALLBACK = "; use clipping='vmap' (per-example gradients by vmap)"
# The largest kernel operand (B·C·O·T values) offered to the "batch_channels" per-example form.
_BATCH_CHANNELS_MAX_VALUES = 2**24


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


def _modules(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree) -> dict[Path, Any]:
  module = nnx.merge(graphdef, params, batch_stats)
  return {tuple(path): node for path, node in nnx.graph.iter_graph(module)
          if isinstance(node, nnx.Module)}


def classify(graphdef: nnx.GraphDef, params: PyTree,
             batch_stats: PyTree) -> tuple[dict[Path, bool], list[Path]]:
  """Sorts the parameters into tapped layers and per-channel affine ones, or refuses the model.

  Returns:
    (layers, small): every `nnx.Linear`/`nnx.Conv` path → whether it has a bias; the flat
    paths (as `traverse_util.flatten_dict` gives them) of the affine layers' scale and bias.

  Raises:
    UserError: a parameter of another layer type, or an unsupported Linear/Conv.
  """
  modules = _modules(graphdef, params, batch_stats)
  layers, small = {}, []
  for param_path in traverse_util.flatten_dict(params):
    owner = modules.get(tuple(param_path[:-1]))
    if type(owner) in (nnx.Linear, nnx.Conv):
      ghost_taps.check_layer(param_path[:-1], owner)
      layers[param_path[:-1]] = owner.bias is not None
    elif isinstance(owner, SMALL_PARAM_LAYERS) and param_path[-1] in _AFFINE_PARAMS:
      small.append(param_path)
    else:
      kind = type(owner).__name__ if owner is not None else "an unknown owner"
      raise UserError(f"ghost clipping cannot handle parameter {ghost_taps.name(param_path)} of "
                      f"{kind}: only nnx.Linear, nnx.Conv and the scale/bias of "
                      f"GroupNorm/LayerNorm/RMSNorm/InstanceNorm/BatchNorm layers are supported"
                      f"{_FALLBACK}")
  return layers, small


def _forward(recorder: ghost_taps.Recorder, graphdef: nnx.GraphDef, params: PyTree,
             batch_stats: PyTree, x: jax.Array, *, tapped: tuple[set, set],
             train: bool | None) -> Any:
  """The whole batch's forward pass through the taps (`train=None`: a model called `m(x)`)."""
  module = nnx.merge(graphdef, params, batch_stats)
  recorder.install(module, *tapped)
  return module(x) if train is None else module(x, train=train)


def _abstract(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda v: jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)), tree)


def _structure(graphdef, params, batch_stats, x, *, tapped, order, train):
  """Traces the tapped forward once (shapes only): the taps' shapes and the convolutions'
  arguments; refuses a layer never called, one whose rows are not the examples, and (B > 1) a
  model whose jaxpr mixes examples (`example_mixing`)."""
  recorder = ghost_taps.Recorder(None)

  def run(params, batch_stats, x):
    out = _forward(recorder, graphdef, params, batch_stats, x, tapped=tapped, train=train)
    missing = [ghost_taps.name(p) for p in order if p not in recorder.inputs]
    if missing:
      raise UserError(f"ghost clipping cannot handle layers never called in the forward pass: "
                      f"{missing}{_FALLBACK}")
    return out, [recorder.inputs[p] for p in order], [recorder.outputs[p] for p in order]

  args = (_abstract(params), _abstract(batch_stats), _abstract(x))
  closed, (out, inputs, outputs) = jax.make_jaxpr(run, return_shape=True)(*args)
  batch = jnp.shape(x)[0]
  for path, a, z in zip(order, inputs, outputs):
    if a.shape[:1] != (batch,) or z.shape[:1] != (batch,):
      raise UserError(f"ghost clipping cannot handle layer {ghost_taps.name(path)}: its input "
                      f"{a.shape} or output {z.shape} does not have the {batch} examples as its "
                      f"first axis{_FALLBACK}")
  _check_single_use(closed.jaxpr, args[0])
  if batch > 1:  # a batch of one cannot mix examples (and sizes could not find its axis)
    num_in = len(jax.tree.leaves(args[:2]))
    try:
      axes = example_mixing.batch_axes(closed.jaxpr, [None] * num_in + [0] * (
          len(closed.jaxpr.invars) - num_in))
    except example_mixing.MixingError as err:
      raise UserError(f"ghost clipping cannot handle this model: {err}{_FALLBACK}") from None
    num_out = len(jax.tree.leaves(out))
    # A model output may be example-independent (None: no tap reaches it); a tapped layer's
    # input and output must have the examples as rows, or a tap's row would not be one example.
    for axis, allowed, what in zip(axes, [(0, None)] * num_out + [(0,)] * (2 * len(order)), [
        "a model output"] * num_out + [f"the input of {ghost_taps.name(p)}" for p in order] + [
        f"the output of {ghost_taps.name(p)}" for p in order]):
      if axis not in allowed:
        found = "does not depend on them" if axis is None else f"has them along axis {axis}"
        raise UserError(f"ghost clipping cannot handle this model: {what} must have the "
                        f"examples along axis 0 but {found}{_FALLBACK}")
  return outputs, dict(recorder.conv_specs)


def _check_single_use(jaxpr, params: PyTree) -> None:
  """Refuses a parameter read anywhere but in its own layer (weight tying, `x @ fc.kernel.T`):
  its gradient would have a part that no tap sees. The layer's own op reads it once."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, _), uses in zip(leaves, example_mixing.input_uses(jaxpr)):
    if uses > 1:
      where = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
      raise UserError(f"ghost clipping cannot handle parameter {where}: it is used {uses} times "
                      f"in the forward pass (shared or read outside its layer){_FALLBACK}")


def _batched_pass(graphdef, params, batch_stats, x, targets, *, tapped, order, tap_shapes,
                  loss_fn, train):
  """The one batched forward + backward: per-example losses, outputs, each tapped layer's
  recorded input and output gradient (row i: ∂loss_i/∂z_i)."""
  # zeros_like(x): inside `shard_map` the taps vary over x's mesh axes, as x does; invariant
  # taps would get their gradients (the g_i) psummed over the devices.
  taps = [jnp.zeros_like(x, shape=s.shape, dtype=s.dtype) for s in tap_shapes]

  def total_loss(taps):
    recorder = ghost_taps.Recorder(dict(zip(order, taps)))
    out = _forward(recorder, graphdef, params, batch_stats, x, tapped=tapped, train=train)
    losses = jax.vmap(loss_fn)(out, targets)  # (B,): the loss alone is mapped, not the model
    return jnp.sum(losses), (losses, out, [recorder.inputs[p] for p in order])

  (_, (losses, outputs, inputs)), grads = jax.value_and_grad(total_loss, has_aux=True)(taps)
  return losses, outputs, dict(zip(order, inputs)), dict(zip(order, grads))


def _operands(a: jax.Array, g: jax.Array,
              spec: ghost_taps.ConvSpec | None) -> tuple[jax.Array, jax.Array]:
  """Recorded (B, ...) input and output gradient → (B, T, G, d), (B, T, G, p)."""
  batch = a.shape[0]
  if spec is None:  # dense: every axis but the last is a position sharing the kernel
    return a.reshape(batch, -1, 1, a.shape[-1]), g.reshape(batch, -1, 1, g.shape[-1])
  patches = ghost_clipping.conv_patches(
      a, spec.window, strides=spec.strides, padding=spec.padding,
      lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation,
      dimension_numbers=spec.dimension_numbers, groups=spec.groups)
  return patches, g.reshape(batch, -1, spec.groups, g.shape[-1] // spec.groups)


def _kernel_leaf(grad: jax.Array, spec: ghost_taps.ConvSpec | None) -> jax.Array:
  """(G, d, p) summed kernel gradient → the kernel's own shape."""
  if spec is None:
    return grad[0]
  return ghost_clipping.conv_kernel_from_patches(grad, spec.kernel_shape)


def _per_example_conv_grads(a: jax.Array, g: jax.Array, spec: ghost_taps.ConvSpec) -> jax.Array:
  """(B, *window, C/G, O) per-example kernel gradients by the exact form that measured fastest
  for the shape (`ghost_clipping.conv_grad_form`'s static rule: no timing while tracing)."""
  # Never "vmap_dw": its vjp is taken at a replicated zero kernel, which inside shard_map (the
  # DP-SGD step) would make the transpose sum over devices; it never won by much anyway.
  # "batch_channels" only while its kernel operand (B·C·O·T values) stays small.
  batch_channels = spec.groups == 1 and g.size * a.shape[-1] <= _BATCH_CHANNELS_MAX_VALUES
  form = ghost_clipping.conv_grad_form(spec.window, a.shape[-1], g.shape[-1],
                                       groups=spec.groups, batch_channels=batch_channels)
  return ghost_clipping.per_example_conv_kernel_grads(
      a, g, window=spec.window, strides=spec.strides, padding=spec.padding,
      lhs_dilation=spec.lhs_dilation, rhs_dilation=spec.rhs_dilation,
      dimension_numbers=spec.dimension_numbers, groups=spec.groups, form=form)


def _layer_norms(a: jax.Array, g: jax.Array, spec: ghost_taps.ConvSpec | None, *,
                 allow_gram: bool
                 ) -> tuple[jax.Array | None, jax.Array, ghost_clipping.KernelNorms]:
  """One Linear/Conv layer's per-example kernel norms from its recorded input and output grad.

  Returns (a, g, norms): a and g are the (B, T, G, d), (B, T, G, p) operands of the book-keeping
  sum, or a is None when the
  layer is a convolution whose per-example gradients were materialised in the kernel's own
  layout (`ghost_clipping.per_example_conv_kernel_grads`, by the fastest measured form): their
  weighted sum is then the kernel gradient itself and no patch array is built.
  """
  if spec is not None:
    groups = spec.groups
    tokens = math.prod(g.shape[1:-1])
    in_features = a.shape[-1] // groups * math.prod(spec.window)
    method = ghost_clipping.kernel_method(tokens, in_features, g.shape[-1] // groups,
                                          allow_gram=allow_gram)
    if method == "per_example":
      grads = _per_example_conv_grads(a, g, spec)
      norms = ghost_clipping.KernelNorms(
          jnp.sum(jnp.square(grads.reshape(grads.shape[0], -1)), axis=1), grads)
      return None, g.reshape(g.shape[0], tokens, groups, -1), norms
  a, g = _operands(a, g, spec)
  method = ghost_clipping.kernel_method(a.shape[1], a.shape[3], g.shape[3], allow_gram=allow_gram)
  return a, g, ghost_clipping.kernel_sq_norms(a, g, method)


def _affine_grads(small_paths: list[Path], inputs: dict, grads: dict) -> dict[Path, jax.Array]:
  """(B, C) per-example gradients of the affine layers' scale (Σ_t g x̂) and bias (Σ_t g)."""
  out = {}
  for param_path in small_paths:
    xhat, g = inputs[param_path[:-1]], grads[param_path[:-1]]  # (B, ..., C) each
    positions = tuple(range(1, g.ndim - 1))
    out[param_path] = jnp.sum(g * xhat if param_path[-1] == "scale" else g, axis=positions)
  return out


def ghost_clipped_sum(graphdef: nnx.GraphDef, params: PyTree, batch_stats: PyTree,
                      x: jax.Array, targets: PyTree, mask: jax.Array, *,
                      loss_fn: Callable[[Any, Any], jax.Array], l2_clip_norm: float,
                      train: bool | None = True, allow_gram: bool = True) -> GhostOutputs:
  """Σ_i mask_i clip_C(∇θ loss_i) and the (B,) norms, by ghost norms and book-keeping.

  Equal to float rounding to `dpsgd_clip_and_sum(vmap(grad(loss_i)), mask, l2_clip_norm=C)`,
  non-finite examples included (they contribute 0, their norm is NaN or inf); same
  sensitivity (C add/remove, 2C replace-one: `privacy.ghost_clipping`).

  Args:
    graphdef, params, batch_stats: a model from `core.split` whose forward pass keeps the
      examples apart (no BatchNorm in training mode: checked, see the module docstring).
    x: (B, ...) inputs, run as one batch. Inside `jax.shard_map`, each device passes its own
      rows (the taps vary over x's mesh axes, so their gradients are not psummed).
    targets: pytree of (B, ...) per-example targets (e.g. (B,) int labels).
    mask: (B,) bool, False for padding rows.
    loss_fn: (output of one example, its target) → scalar loss; the output is the model's
      output pytree without the batch axis (for classifiers a `ClassifierOutput` of (K,)
      logits, (F,) features, hint). It is `vmap`ped over the batch's outputs.
    l2_clip_norm: C > 0 (may be traced).
    train: passed to the model (GroupNorm and no-norm models do not depend on it; BatchNorm
      is only accepted with train=False, when it uses its running averages); None calls a
      model without a `train` argument as `model(x)`.
    allow_gram: False never uses the Gram (ghost-norm) form, whose rounding grows with
      cancellation (`privacy.ghost_clipping`): layers that would use it materialise their
      (B, layer) per-example gradients instead.

  Returns:
    `GhostOutputs`. Raises UserError (see the module docstring) for unsupported models.
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  layers, small_paths = classify(graphdef, params, batch_stats)
  tapped = (set(layers), {path[:-1] for path in small_paths})
  order = sorted(tapped[0] | tapped[1], key=ghost_taps.name)
  tap_shapes, specs = _structure(graphdef, params, batch_stats, x, tapped=tapped, order=order,
                                 train=train)
  losses, outputs, inputs, out_grads = _batched_pass(
      graphdef, params, batch_stats, x, targets, tapped=tapped, order=order,
      tap_shapes=tap_shapes, loss_fn=loss_fn, train=train)
  small_grads = _affine_grads(small_paths, inputs, out_grads)
  sq_norms = ghost_clipping.tree_sq_norms(small_grads)  # (B,), or 0 without small params
  operands, kernel_norms, biases = {}, {}, {}
  for path, has_bias in layers.items():
    a, g, kernel_norms[path] = _layer_norms(inputs[path], out_grads[path], specs.get(path),
                                            allow_gram=allow_gram)
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
    sums[path + ("kernel",)] = (kernel if a is None  # already in the kernel's own layout
                                else _kernel_leaf(kernel, specs.get(path)))
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


def clipped_grad(graphdef: nnx.GraphDef, *, loss_fn: Callable[[Any, Any], jax.Array],
                 l2_clip_norm: float, batch_stats: PyTree | None = None,
                 train: bool | None = None, microbatch_size: int | None = None,
                 has_aux: bool = False, return_norms: bool = False
                 ) -> clipped_sums.ClippedGrad:
  """`privacy.clipped_grad` by ghost clipping: `clipped(params, x, targets, mask=None)`.

  The same clipped sum (to float rounding) and sensitivity (C add-remove, 2C replace-one) as
  the `vmap` path, without the (B, num_params) per-example gradients, for any nnx model this
  module accepts (Linear, Conv and per-channel norm layers, no example mixing: module
  docstring). The Gram form is never used (`allow_gram=False`, as DP-SGD's step).

  Args:
    graphdef: from `nnx.split(model, nnx.Param, ...)`; `params` are the pure dict of its Param
      state (`nnx.to_pure_dict`, as `core.split` gives them); batch_stats: the rest ({}).
    loss_fn: (one example's model output (no batch axis), its target) -> scalar.
    l2_clip_norm, microbatch_size, return_norms: as `privacy.clipped_grad`.
    train: the model's `train` argument, or None for a model called as `model(x)`.
    has_aux: the call also returns (losses (B,), the model's outputs, one row per example):
      noiseless, not covered by ε.

  Returns:
    A `privacy.ClippedGrad` (its `.sensitivity(relation)` is C or 2C).
  """
  stats = {} if batch_stats is None else batch_stats

  def sum_fn(params, batch_args, other_args, mask, clip_norm):
    del other_args  # the call's only arguments are x and targets, both batched
    out = ghost_clipped_sum(graphdef, params, stats, *batch_args, mask, loss_fn=loss_fn,
                            l2_clip_norm=clip_norm, train=train, allow_gram=False)
    return out.clipped_sum, out.norms, (out.losses, out.outputs) if has_aux else None

  return clipped_sums.clipped_grad(None, l2_clip_norm=l2_clip_norm, batch_argnums=(1, 2),
                                       microbatch_size=microbatch_size, has_aux=has_aux,
                                       return_norms=return_norms, sum_fn=sum_fn)
