"""Replay of released (x, y_s) pairs: the student keeps learning from what was released before.

The disagreement generator drifts: it seeks the samples where the student disagrees with the
released targets, and once the student follows it there, it moves on. A student trained only
on the newest batch then forgets the regions the generator left (docs/RESULTS.md: test
accuracy swinging by 10 points between evaluations, and runs that never recover). Replaying
earlier pairs is the memory bank of data-free distillation (Binici et al., "Preventing
Catastrophic Forgetting and Distribution Mismatch in Knowledge Distillation via Synthetic
Data", WACV 2022).

Privacy: x is the generator's output (teacher-free) and y_s = s − γ·g̃ a function of the
released rows g̃ and the student, so the buffer holds released values and public
computation only. Replaying them is post-processing: no new row is released and the ε of
the run is that of the same run without replay.

The buffer is a ring of `size` rows: rows are written in release order at
(written + arange(B)) mod size, and each step draws its replay rows with replacement from
the rows written before that step, uniformly or class-balanced (`sample`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class ReplayBuffer:
  """Released pairs kept for the student.

  Attributes:
    images: (size, H, W, C) synthetic samples x.
    targets: (size, K) their noisy targets y_s at release time.
    written: int32 scalar, rows written so far (the ring holds min(written, size) of them).
  """

  images: jax.Array
  targets: jax.Array
  written: jax.Array

  @classmethod
  def empty(cls, size: int, image_shape: tuple[int, ...], num_classes: int) -> "ReplayBuffer":
    return cls(jnp.zeros((size,) + tuple(image_shape), jnp.float32),
               jnp.zeros((size, num_classes), jnp.float32), jnp.zeros((), jnp.int32))

  @property
  def size(self) -> int:
    return self.images.shape[0]

  def arrays(self) -> dict[str, jax.Array]:
    return {"images": self.images, "targets": self.targets, "written": self.written}

  def with_arrays(self, arrays: dict[str, jax.Array]) -> "ReplayBuffer":
    return ReplayBuffer(arrays["images"], arrays["targets"], arrays["written"])


SAMPLINGS = ("uniform", "class_balanced")


def sample(buffer: ReplayBuffer, key: jax.Array, count: int, *,
           sampling: str = "uniform") -> tuple[jax.Array, jax.Array, jax.Array]:
  """`count` rows drawn with replacement from the filled part of the ring.

  Args:
    buffer: the ring.
    key: this draw's key.
    count: rows to draw.
    sampling: "uniform" (every filled row alike) or "class_balanced": every class, as the
      argmax of the stored target names it, alike (each row weighs 1 / the number of filled
      rows of its class). The disagreement generator dwells on a few classes at a time
      (the student's class entropy on its batches is far below log K), so a uniform draw
      replays mostly the classes it visited last.

  Returns:
    (images (count, H, W, C), targets (count, K), weight): weight is 1.0, or 0.0 while the
    buffer is still empty (the rows are then zeros and must not count).
  """
  filled = jnp.minimum(buffer.written, buffer.size)
  weight = (filled > 0).astype(jnp.float32)
  if sampling == "uniform":
    index = jax.random.randint(key, (count,), 0, jnp.maximum(filled, 1))
  elif sampling == "class_balanced":
    is_filled = jnp.arange(buffer.size) < filled  # the ring fills from slot 0
    labels = jnp.argmax(buffer.targets, axis=-1)  # (size,)
    per_class = jnp.zeros(buffer.targets.shape[-1]).at[labels].add(is_filled)  # (K,)
    # Inverse CDF over the row weights: O(size + count log size) per draw (a categorical
    # draw would make count × size Gumbel variates).
    weights = jnp.where(is_filled, 1.0 / jnp.maximum(per_class[labels], 1.0), 0.0)
    cdf = jnp.cumsum(weights)  # (size,)
    u = jax.random.uniform(key, (count,)) * cdf[-1]
    index = jnp.minimum(jnp.searchsorted(cdf, u, side="right"),
                        jnp.maximum(filled, 1) - 1)  # u == total in float: the last filled row
  else:
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
  return buffer.images[index], buffer.targets[index], weight


def write(buffer: ReplayBuffer, images: jax.Array, targets: jax.Array) -> ReplayBuffer:
  """`buffer` with the (B, ...) `images` and (B, K) `targets` written after its last rows."""
  position = (buffer.written + jnp.arange(images.shape[0])) % buffer.size
  return ReplayBuffer(buffer.images.at[position].set(images.astype(buffer.images.dtype)),
                      buffer.targets.at[position].set(targets.astype(buffer.targets.dtype)),
                      buffer.written + images.shape[0])
