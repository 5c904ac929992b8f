"""Model size and compute: parameter counts and XLA-measured FLOPs of a forward pass."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from dpkd_jax.models import core


def count_params(params: core.PyTree) -> int:
  """Number of scalars in a parameter pytree.

  Args:
    params: a pytree of arrays, or of `jax.ShapeDtypeStruct`s (e.g. from `nnx.eval_shape`), so
      large models can be counted without allocating them. Pass `ModelParts.params` to count
      trainable parameters only; BatchNorm running statistics live in `batch_stats`.

  Returns:
    The total number of elements of all leaves.
  """
  return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))


def _flops_from_analysis(analysis: Any) -> float | None:
  """Reads "flops" from a cost analysis; None where the backend gave no (valid) figure."""
  # JAX returns one dict; older releases returned a list with one dict per computation.
  if isinstance(analysis, Sequence) and not isinstance(analysis, Mapping):
    analysis = analysis[0] if analysis else None
  if not isinstance(analysis, Mapping) or "flops" not in analysis:
    return None
  flops = float(analysis["flops"])
  return flops if flops >= 0 else None  # XLA reports -1 for "unknown"


def flops_per_example(parts: core.ModelParts, input_shape: Sequence[int], *,
                      batch_size: int = 8) -> float:
  """FLOPs of one example's inference forward pass, from XLA's cost analysis.

  The jitted `core.apply(..., train=False)` is lowered for a batch of `batch_size` float32
  inputs (no data is allocated) and compiled; the compiled executable's cost analysis (after
  XLA's optimisations, e.g. padding-aware convolution counts) is preferred, falling back to the
  analysis of the lowered, unoptimised HLO when the backend gives none. XLA counts a
  multiply-add as 2 FLOPs, so a dense layer costs about 2·in·out per example.

  Args:
    parts: a model split with `core.split` (classifier or generator). Its arrays may be
      `jax.ShapeDtypeStruct`s (split an `nnx.eval_shape`d model): only shapes are needed.
    input_shape: shape of one input, without the batch axis: (H, W, C) for classifiers,
      (latent_dim,) for generators.
    batch_size: examples in the analysed batch; the figure is divided by it.

  Returns:
    FLOPs per example.

  Raises:
    ValueError: `batch_size` is not positive.
    RuntimeError: neither analysis reports FLOPs on this backend.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, got {batch_size!r}")

  def forward(params: core.PyTree, batch_stats: core.PyTree, x: jax.Array) -> Any:
    out, _ = core.apply(parts.graphdef, params, batch_stats, x, train=False)
    return out

  # Params are arguments, not closed-over constants, so XLA cannot fold them away.
  x = jax.ShapeDtypeStruct((batch_size, *input_shape), jnp.float32)
  lowered = jax.jit(forward).lower(parts.params, parts.batch_stats, x)
  flops = _flops_from_analysis(lowered.compile().cost_analysis())
  if flops is None:
    flops = _flops_from_analysis(lowered.cost_analysis())
  if flops is None:
    raise RuntimeError(f"XLA's cost analysis reports no FLOPs on backend {jax.default_backend()!r}")
  return flops / batch_size
