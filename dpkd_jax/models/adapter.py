"""A fixed per-channel affine map in front of a classifier: an imported teacher's own input
normalisation, expressed in terms of the dataset's.

Every model here is fed `data.normalize` output, x = (u / 255 − m_d) / s_d per channel (m_d, s_d:
the dataset's `DatasetInfo.mean` / `.std`). A teacher trained elsewhere expects
x_t = (u / 255 − m_t) / s_t, so `InputAdapter` feeds its model x · scale + shift with
scale = s_d / s_t and shift = (m_d − m_t) / s_t (`affine_for`): exact, with no change to the
model's own layers (folding the map into the first convolution would be wrong at zero-padded
borders). scale and shift are `InputAffine` variables, not parameters: they land in the
`batch_stats` part of `core.split`, are restored from the checkpoint with the BatchNorm
statistics, and are never trained.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpkd_jax.models import core


class InputAffine(nnx.Variable):
  """A fixed (not trained) per-channel input scale or shift of an `InputAdapter`."""


def affine_for(dataset_mean: Sequence[float], dataset_std: Sequence[float],
               teacher_mean: Sequence[float],
               teacher_std: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
  """(scale, shift), each (C,) float32, mapping dataset-normalised inputs to the teacher's."""
  d_mean, d_std, t_mean, t_std = (np.asarray(v, np.float64) for v in
                                  (dataset_mean, dataset_std, teacher_mean, teacher_std))
  return ((d_std / t_std).astype(np.float32), ((d_mean - t_mean) / t_std).astype(np.float32))


class InputAdapter(nnx.Module):
  """`model(x · scale + shift)`: the wrapped classifier's output, unchanged otherwise.

  Args:
    model: any classifier of the zoo.
    channels: C, the input channels (scale and shift are (C,), identity until set).
  """

  def __init__(self, model: nnx.Module, *, channels: int):
    self.scale = InputAffine(jnp.ones((channels,), jnp.float32))
    self.shift = InputAffine(jnp.zeros((channels,), jnp.float32))
    self.model = model

  def __call__(self, x: jax.Array, *, train: bool = False) -> core.ClassifierOutput:
    return self.model(x * self.scale[...] + self.shift[...], train=train)  # (B, H, W, C)
