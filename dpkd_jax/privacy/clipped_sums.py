"""One call per private gradient: `clipped_grad(loss_fn, ...)` (cf. jax_privacy's clipped_grad).

`clipped_grad(loss_fn, l2_clip_norm=C, batch_argnums=1)` turns a loss into a function
`clipped(params, *args, mask=None)` that returns Σ_i mask_i clip_C(∇ loss_i): the noiseless
half of DP-SGD's Gaussian mechanism (`dpsgd_mechanism.dpsgd_clip_and_sum`), over a batch whose
leading axis (B) is the examples. `loss_fn(params, *args)` is the user's batch loss; by default
each example is passed as a batch of one (`keep_batch_dim=True`, jax_privacy's convention), so a
model that expects (B, ...) inputs needs no change. Its sum has the sensitivity of every
clipped sum here: C when a record is added or removed, 2C when one is replaced
(`ClippedGrad.sensitivity(relation)`, the relation required). The noise, its σ and the
normaliser come from a plan (`dpsgd_optax.dpsgd_privatizer`), never from this object.

Padding: `mask` (B,) bool zeroes padded rows of a Poisson sample (`dpkd_jax.data.poisson_batch`
returns it). Microbatching: `microbatch_size=m` computes the sum m examples at a time
(`lax.map`, B divisible by m), to bound the (m, num_params) per-example gradients in memory;
the sum is the same. A model-aware clipped sum (ghost clipping: `dpkd_jax.models.ghost.
clipped_grad`) plugs in as `sum_fn`; its sensitivity is the same C / 2C.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from dpkd_jax.privacy import dpsgd_mechanism
from dpkd_jax.privacy import neighbouring
from dpkd_jax.privacy import validation

PyTree = Any
# (params, batch args (a tuple, leaves (b, ...)), the other args (a tuple, None where batched),
#  mask (b,), C) -> (clipped sum: params' pytree, pre-clip norms (b,), per-example aux or None)
SumFn = Callable[[PyTree, tuple, tuple, jax.Array, float], tuple[PyTree, jax.Array, Any]]


def _vmap_sum_fn(loss_fn: Callable, batch_argnums: tuple[int, ...], keep_batch_dim: bool,
                 has_aux: bool) -> SumFn:
  """Per-example gradients by `vmap(grad)`, clipped and summed by `dpsgd_clip_and_sum`."""

  def example_loss(params, batch_args, other_args):
    args = list(other_args)
    for position, value in zip(batch_argnums, batch_args):
      args[position - 1] = jax.tree.map(lambda v: v[None], value) if keep_batch_dim else value
    return loss_fn(params, *args)

  def sum_fn(params, batch_args, other_args, mask, l2_clip_norm):
    out = jax.vmap(jax.grad(example_loss, has_aux=has_aux), in_axes=(None, 0, None))(
        params, batch_args, other_args)  # params' pytree, leaves (b, ...) (and aux (b, ...))
    grads, aux = out if has_aux else (out, None)
    total, norms = dpsgd_mechanism.dpsgd_clip_and_sum(grads, mask, l2_clip_norm=l2_clip_norm)
    return total, norms, aux

  return sum_fn


@dataclasses.dataclass(frozen=True)
class ClippedGrad:
  """`clipped(params, *args, mask=None) -> clipped sum` (params' pytree, no batch axis).

  Attributes:
    sum_fn: the clipped sum of one (micro)batch (`SumFn`): `vmap(grad)` + `dpsgd_clip_and_sum`,
      or a model-aware one of the same sensitivity (ghost clipping).
    l2_clip_norm: C, the bound of every example's gradient (L2 over the whole pytree).
    batch_argnums: positions in `args` (counting `params` as 0) of the batched arguments.
    microbatch_size: examples per `lax.map` step, or None for the whole batch at once.
    has_aux: `loss_fn` returns (loss, aux); the call also returns aux, one row per example.
    return_norms: also return the (B,) pre-clip norms.
  Aux and norms are noiseless functions of the private batch: not covered by ε.
  """

  sum_fn: Callable
  l2_clip_norm: float
  batch_argnums: tuple[int, ...]
  microbatch_size: int | None = None
  has_aux: bool = False
  return_norms: bool = False

  def sensitivity(self, relation: str) -> float:
    """L2 sensitivity of the clipped sum: C (add-remove) or 2C (replace-one); no default."""
    neighbouring.check_relation(relation)
    return (2.0 if relation == neighbouring.REPLACE_ONE else 1.0) * self.l2_clip_norm

  def __call__(self, params: PyTree, *args, mask: jax.Array | None = None):
    positions = [n - 1 for n in self.batch_argnums]  # in `args`, which starts after params
    batch_args = tuple(args[p] for p in positions)
    other_args = tuple(None if i in positions else a for i, a in enumerate(args))
    size = jax.tree.leaves(batch_args)[0].shape[0]
    mask = jnp.ones((size,), bool) if mask is None else jnp.asarray(mask, bool)
    if mask.shape != (size,):
      raise ValueError(f"mask must have shape ({size},), got {mask.shape}")
    total, norms, aux = self._sum(params, batch_args, other_args, mask, size)
    out = (total,) + ((aux,) if self.has_aux else ()) + ((norms,) if self.return_norms else ())
    return out if len(out) > 1 else total

  def _sum(self, params, batch_args, other_args, mask, size):
    m = self.microbatch_size
    if m is None or m >= size:
      return self.sum_fn(params, batch_args, other_args, mask, self.l2_clip_norm)
    if size % m:
      raise ValueError(f"the batch of {size} examples is not divisible by microbatch_size={m}")
    # (b, ...) -> (b/m, m, ...): `lax.map` runs one chunk of m examples at a time.
    chunks = jax.tree.map(lambda v: v.reshape((size // m, m) + v.shape[1:]), (batch_args, mask))

    def one(chunk):
      return self.sum_fn(params, chunk[0], other_args, chunk[1], self.l2_clip_norm)

    sums, norms, aux = jax.lax.map(one, chunks)  # leaves (b/m, ...); norms, aux (b/m, m, ...)
    unchunk = lambda v: v.reshape((size,) + v.shape[2:])  # noqa: E731
    return (jax.tree.map(lambda s: jnp.sum(s, axis=0), sums), unchunk(norms),
            jax.tree.map(unchunk, aux))


def clipped_grad(loss_fn: Callable, *, l2_clip_norm: float,
                 batch_argnums: int | Sequence[int] = 1, keep_batch_dim: bool = True,
                 microbatch_size: int | None = None, has_aux: bool = False,
                 return_norms: bool = False, sum_fn: Callable | None = None) -> ClippedGrad:
  """The clipped-sum gradient of `loss_fn` (module docstring).

  Args:
    loss_fn: `loss_fn(params, *args) -> scalar` (or (scalar, aux) with `has_aux`), the loss of
      a batch (of one example here).
    l2_clip_norm: C > 0.
    batch_argnums: the positions (params = 0) of the arguments whose leading axis is the
      examples; the others are passed unchanged to every example.
    keep_batch_dim: pass each example as a batch of one ((1, ...)); False passes it unbatched.
    microbatch_size: examples per step of a `lax.map` over the batch (None: all at once).
    has_aux: the call returns (sum, aux) with aux per example ((B, ...) leaves, noiseless:
      diagnostics, not covered by ε), as jax.grad's `has_aux`.
    return_norms: the call also returns the (B,) pre-clip norms, last.
    sum_fn: a model-aware clipped sum `(params, batch_args, other_args, mask, C) -> (sum,
      norms, aux or None)` of the same sensitivity (e.g. ghost clipping), replacing `vmap(grad)`.

  Returns:
    A `ClippedGrad`: call it inside `jit`; `.sensitivity(relation)` gives C or 2C.
  """
  validation.check_float("l2_clip_norm", l2_clip_norm, positive=True)
  argnums = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
  if not argnums or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in argnums):
    raise ValueError(f"batch_argnums must be positions >= 1 (0 is params), got {batch_argnums!r}")
  if microbatch_size is not None:
    validation.check_int("microbatch_size", microbatch_size, minimum=1)
  return ClippedGrad(sum_fn or _vmap_sum_fn(loss_fn, argnums, keep_batch_dim, has_aux),
                     l2_clip_norm=l2_clip_norm, batch_argnums=argnums,
                     microbatch_size=microbatch_size, has_aux=has_aux, return_norms=return_norms)
