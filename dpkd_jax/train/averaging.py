"""Parameter averaging: an optax wrapper whose state keeps an EMA of the iterates.

Averaging is post-processing of the private iterates (each is a function of the noisy
releases), so it costs no privacy and changes neither a mechanism nor its accounting. It lives
in the optimizer state, so a train step updates it, a checkpoint saves and seals it, and a
resumed run continues it. DP-SGD (`param_averaging_decay`) and DPDFD's student use it;
`released_parts` is the model a run evaluates and releases.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dpkd_jax.models import core
from dpkd_jax.train.state import TrainState

PyTree = Any


class ParamAveragingState(NamedTuple):
  """`param_averaging`'s state: the wrapped optimizer's, the step count and the average.

  Attributes:
    inner: the state of the wrapped transformation.
    count: () int32, the updates applied so far (t of the iterate p_t).
    average: the params' pytree: the bias-corrected EMA of p_{s+1}..p_t (s the start step),
      or p_t itself while t <= s + 1. The model a run evaluates, checkpoints and releases.
  """

  inner: optax.OptState
  count: jax.Array
  average: PyTree


def param_averaging(inner: optax.GradientTransformation, decay: float, *,
                    start_step: int = 0) -> optax.GradientTransformation:
  """`inner` (its updates unchanged) whose state also averages the iterates p_t = params +
  updates: an exponential moving average (De et al. 2022), bias-corrected, after `start_step`.

  With k = t - s iterates averaged, the average is Σ_{i<=k} d^(k-i) p_{s+i} / Σ_{i<=k} d^(k-i),
  Adam's debiased EMA (optax.ema(d, debias=True) of the iterates); kept as a running weighted
  mean, a_k = a_{k-1} + w_k (p - a_{k-1}) with w_k = (1 - d) / (1 - d^k), so that it never
  starts from zeros and a_1 = p_{s+1} exactly. jax_privacy warms its EMA up with
  min(d, (1 + k) / (10 + k)) instead; both forget the early iterates of a short run.
  optax has no EMA of the parameters (`optax.ema` averages the updates, and
  `optax.measure_with_ema` sees the updates only), hence this wrapper.

  Post-processing of the private iterates (each is a function of the noisy releases): the
  average costs no privacy and changes neither the mechanism nor the accounting. It lives in
  the optimizer state, so the train step updates it, the checkpoint saves and seals it, and a
  resumed run continues it.

  Args:
    inner: the optimizer (SGD, Adam...).
    decay: d in (0, 1).
    start_step: s >= 0; until then the average is the iterate.
  """
  if not 0.0 < decay < 1.0:
    raise ValueError(f"param_averaging decay must be in (0, 1), got {decay!r}")

  def init(params: PyTree) -> ParamAveragingState:
    # A copy: `average` and `params` are distinct buffers of a state donated to the step.
    return ParamAveragingState(inner.init(params), jnp.zeros((), jnp.int32),
                               jax.tree.map(jnp.copy, params))

  def update(updates: PyTree, state: ParamAveragingState, params: PyTree | None = None):
    if params is None:
      raise ValueError("param_averaging needs the params in update()")
    updates, inner_state = inner.update(updates, state.inner, params)
    count = state.count + 1
    k = count - start_step  # iterates averaged, this one included; <= 0 before the start
    # w_k = (1 - d) / (1 - d^k); expm1 keeps 1 - d^k accurate for d near 1 (e.g. 0.9999).
    weight = (1.0 - decay) / -jnp.expm1(jnp.maximum(k, 1) * math.log(decay))

    def average(a: jax.Array, p: jax.Array) -> jax.Array:
      return jnp.where(k <= 1, p, a + (weight * (p - a)).astype(a.dtype))  # k <= 1: exactly p

    new_params = optax.apply_updates(params, updates)
    return updates, ParamAveragingState(inner_state, count,
                                        jax.tree.map(average, state.average, new_params))

  return optax.GradientTransformation(init, update)


def averaged_params(state: TrainState) -> PyTree:
  """The parameters a run evaluates and releases: the average of `param_averaging` if the
  state's optimizer keeps one, else the last iterate."""
  if isinstance(state.opt_state, ParamAveragingState):
    return state.opt_state.average
  return state.params


def released_parts(state: TrainState) -> core.ModelParts:
  """`state.parts` with `averaged_params`. BatchNorm statistics are the state's own: running
  averages already, of the batches the last iterates saw."""
  return core.ModelParts(state.graphdef, averaged_params(state), state.batch_stats)
