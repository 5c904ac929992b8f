"""RONA's release of one query batch of teacher knowledge: Frobenius bound B, then noise σB.

`release_knowledge` picks B by the bound mode and calls `privacy.mechanisms.sanitize`, the
mechanism itself (the only Gaussian draw of RONA):

    bound      B = running mean of ||aux_teacher(x)||_F (adaptive) or a fixed B
    release    k~ = clip_F(k, B) + N(0, σ²B²)        the only teacher-dependent value

Privacy of one release (replace-one sensitive record; `accounting.rona_event`): the teacher
may change arbitrarily, so every row of k may change; after the Frobenius clip both versions
lie in the ball of radius B, so the release moves by <= 2B, and noise std σB makes it a
Gaussian mechanism with noise multiplier σ/2, for any B that does not depend on sensitive
data. The adaptive B comes from the auxiliary teacher (trained on the public split only) on
the same public batch and from earlier public batches, never from the teacher.

`SanitizeConfig` (σ, bound mode, B) is built from the plan (`RONAPlan.sanitize_config`): the
step never reads σ or B from the run's config.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dpkd_jax.privacy import mechanisms
from dpkd_jax import config_checks

BOUND_MODES = ("adaptive", "fixed", "none")


def check_bound(bound_mode: str, l2_bound: float | None, *, name: str = "l2_bound") -> None:
  """A bound mode and its B: B given exactly in "fixed" mode, and then finite and > 0."""
  if bound_mode not in BOUND_MODES:
    raise ValueError(f"bound_mode must be one of {BOUND_MODES}, got {bound_mode!r}")
  if (bound_mode == "fixed") != (l2_bound is not None):
    raise ValueError(f"give {name} exactly with bound_mode='fixed', got bound_mode="
                     f"{bound_mode!r}, {name}={l2_bound!r}")
  if l2_bound is not None:
    config_checks.number(name, l2_bound, positive=True)


class BoundState(NamedTuple):
  """Running mean of the auxiliary teacher's knowledge norms: B = norm_sum / count."""

  norm_sum: jax.Array  # () float32
  count: jax.Array  # () float32

  @classmethod
  def zeros(cls) -> "BoundState":
    return cls(jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SanitizeConfig:
  """How one kind of teacher knowledge (hint or soft labels) is released.

  Attributes:
    noise_multiplier: σ >= 0: noise std σB on every coordinate.
    bound_mode: "adaptive" (B = running mean of the auxiliary teacher's norms, no privacy
      cost), "fixed" (B = `l2_bound`) or "none" (raw knowledge; only with σ = 0, non-private).
    l2_bound: B for "fixed"; must be None otherwise.
  """

  noise_multiplier: float
  bound_mode: str = "adaptive"
  l2_bound: float | None = None

  def __post_init__(self):
    config_checks.number("noise_multiplier", self.noise_multiplier, positive=False)
    check_bound(self.bound_mode, self.l2_bound)
    if self.bound_mode == "none" and self.noise_multiplier != 0:
      raise ValueError(f"bound_mode='none' releases raw teacher knowledge: it needs "
                       f"noise_multiplier=0 (non-private), got {self.noise_multiplier!r}")


def release_knowledge(config: SanitizeConfig, key: jax.Array, knowledge: jax.Array,
                      aux_knowledge: jax.Array | None, bound: BoundState
                      ) -> tuple[jax.Array, BoundState, jax.Array, jax.Array]:
  """The RONA sanitize of one query batch, with the bound chosen by `config.bound_mode`.

  Args:
    config: σ and the bound mode.
    key: used once, for the noise.
    knowledge: (S, ...) teacher knowledge, padding rows already zeroed.
    aux_knowledge: (S, ...) the auxiliary teacher's knowledge on the same rows (only its
      Frobenius norm is used, and only in adaptive mode; None in the other modes).
    bound: running-mean state before this batch.

  Returns:
    (noisy (S, ...) what the student may learn from, the updated bound state, B used, noise
    std σB).
  """
  if config.bound_mode == "none":
    return knowledge, bound, jnp.asarray(jnp.inf), jnp.zeros(())
  if config.bound_mode == "fixed":
    l2_bound = jnp.asarray(config.l2_bound, jnp.float32)
  else:
    aux_norm = jnp.sqrt(jnp.sum(jnp.square(aux_knowledge)))  # () Frobenius, public data only
    bound = BoundState(bound.norm_sum + aux_norm, bound.count + 1.0)
    l2_bound = bound.norm_sum / bound.count
  release = mechanisms.sanitize(key, knowledge, l2_clip_norm=l2_bound,
                                noise_multiplier=config.noise_multiplier)
  return release.noisy, bound, l2_bound, release.noise_stddev
