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

Two memories (`MEMORIES`), each of `size` rows; each step draws its replay rows with
replacement from the rows written before that step, uniformly or class-balanced (`sample`):
  "ring": rows are written in release order at (written + arange(B)) mod size, so the
    memory holds the newest `size` rows. The generator dwells on a few classes at a time: a
    class it left a ring ago is gone from the memory.
  "per_class": one ring of size // K rows per class (the argmax of the stored target), so
    a class the generator visited once stays in the memory, whatever it made since.
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
    written: int32 scalar, rows written so far.
    class_written: None for a "ring" memory (it holds min(written, size) rows); for a
      "per_class" one, int32 (K,): rows of each class written so far, class c's ring being
      rows [c·cap, (c+1)·cap), cap = size // K.
  """

  images: jax.Array
  targets: jax.Array
  written: jax.Array
  class_written: jax.Array | None = None

  @classmethod
  def empty(cls, size: int, image_shape: tuple[int, ...], num_classes: int, *,
            memory: str = "ring") -> "ReplayBuffer":
    if memory not in MEMORIES:
      raise ValueError(f"memory must be one of {MEMORIES}, got {memory!r}")
    per_class = jnp.zeros((num_classes,), jnp.int32) if memory == "per_class" else None
    return cls(jnp.zeros((size,) + tuple(image_shape), jnp.float32),
               jnp.zeros((size, num_classes), jnp.float32), jnp.zeros((), jnp.int32),
               per_class)

  @property
  def size(self) -> int:
    return self.images.shape[0]

  @property
  def class_capacity(self) -> int:
    """Rows of each class's ring in a "per_class" memory."""
    return self.size // self.targets.shape[-1]

  def arrays(self) -> dict[str, jax.Array]:
    out = {"images": self.images, "targets": self.targets, "written": self.written}
    if self.class_written is not None:  # ring memories keep the layout they had
      out["class_written"] = self.class_written
    return out

  def with_arrays(self, arrays: dict[str, jax.Array]) -> "ReplayBuffer":
    return ReplayBuffer(arrays["images"], arrays["targets"], arrays["written"],
                        arrays.get("class_written"))


MEMORIES = ("ring", "per_class")
SAMPLINGS = ("uniform", "class_balanced")


def sample(buffer: ReplayBuffer, key: jax.Array, count: int, *,
           sampling: str = "uniform") -> tuple[jax.Array, jax.Array, jax.Array]:
  """`count` rows drawn with replacement from the filled rows of the memory.

  Args:
    buffer: the memory.
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
  if sampling not in SAMPLINGS:
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
  if buffer.class_written is not None:
    index, weight = _sample_per_class(buffer, key, count, sampling)
  else:
    index, weight = _sample_ring(buffer, key, count, sampling)
  return buffer.images[index], buffer.targets[index], weight


def _sample_ring(buffer: ReplayBuffer, key: jax.Array, count: int,
                 sampling: str) -> tuple[jax.Array, jax.Array]:
  """(count,) row indices into a "ring" memory, and the weight (0.0 while it is empty)."""
  filled = jnp.minimum(buffer.written, buffer.size)
  weight = (filled > 0).astype(jnp.float32)
  if sampling == "uniform":
    return jax.random.randint(key, (count,), 0, jnp.maximum(filled, 1)), weight
  is_filled, labels, per_class = _ring_classes(buffer)
  # Inverse CDF over the row weights: O(size + count log size) per draw (a categorical
  # draw would make count × size Gumbel variates).
  weights = jnp.where(is_filled, 1.0 / jnp.maximum(per_class[labels], 1.0), 0.0)
  cdf = jnp.cumsum(weights)  # (size,)
  u = jax.random.uniform(key, (count,)) * cdf[-1]
  index = jnp.minimum(jnp.searchsorted(cdf, u, side="right"),
                      jnp.maximum(filled, 1) - 1)  # u == total in float: the last filled row
  return index, weight


def _ring_classes(buffer: ReplayBuffer) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Of a "ring" memory: which slots are filled (size,), each slot's class (size,), the
  stored targets' argmax, and the filled slots per class (K,)."""
  is_filled = jnp.arange(buffer.size) < jnp.minimum(buffer.written, buffer.size)  # from slot 0
  labels = jnp.argmax(buffer.targets, axis=-1)
  per_class = jnp.zeros((buffer.targets.shape[-1],), jnp.int32).at[labels].add(is_filled)
  return is_filled, labels, per_class


def _sample_per_class(buffer: ReplayBuffer, key: jax.Array, count: int,
                      sampling: str) -> tuple[jax.Array, jax.Array]:
  """(count,) row indices into a "per_class" memory: a class (each filled row alike, or each
  filled class alike), then a filled row of its ring; and the weight."""
  cap = buffer.class_capacity
  filled = jnp.minimum(buffer.class_written, cap)  # (K,)
  weight = (filled.sum() > 0).astype(jnp.float32)
  class_weight = filled if sampling == "uniform" else (filled > 0)
  cdf = jnp.cumsum(class_weight.astype(jnp.float32))  # (K,)
  u = jax.random.uniform(jax.random.fold_in(key, 0), (count,)) * cdf[-1]
  last = jnp.argmax(cdf)  # the last filled class: where the non-decreasing cdf first peaks
  klass = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), last)  # (count,)
  row = jax.random.randint(jax.random.fold_in(key, 1), (count,), 0,
                           jnp.maximum(filled[klass], 1))
  return klass * cap + row, weight


def write(buffer: ReplayBuffer, images: jax.Array, targets: jax.Array) -> ReplayBuffer:
  """`buffer` with the (B, ...) `images` and (B, K) `targets` written after its last rows (of
  their class, in a "per_class" memory, whose class rings must hold B rows each)."""
  count = images.shape[0]
  class_written = buffer.class_written
  if class_written is None:
    position = (buffer.written + jnp.arange(count)) % buffer.size
  else:
    labels = jnp.argmax(targets, axis=-1)  # (B,)
    onehot = jax.nn.one_hot(labels, targets.shape[-1], dtype=jnp.int32)  # (B, K)
    rank = jnp.sum((jnp.cumsum(onehot, axis=0) - 1) * onehot, axis=-1)  # (B,) within class
    cap = buffer.class_capacity
    position = labels * cap + (class_written[labels] + rank) % cap
    class_written = class_written + onehot.sum(axis=0)
  return ReplayBuffer(buffer.images.at[position].set(images.astype(buffer.images.dtype)),
                      buffer.targets.at[position].set(targets.astype(buffer.targets.dtype)),
                      buffer.written + count, class_written)


def class_counts(buffer: ReplayBuffer) -> dict[str, list[int]]:
  """What the memory shows of the generator's classes (the stored targets' argmax), for the
  run's results: the rows it holds per class and, for a "per_class" memory, the rows written
  per class over the whole run (released targets only: post-processing)."""
  if buffer.class_written is not None:
    held = jnp.minimum(buffer.class_written, buffer.class_capacity)
    return {"replay_rows_held_per_class": [int(v) for v in held],
            "replay_rows_written_per_class": [int(v) for v in buffer.class_written]}
  return {"replay_rows_held_per_class": [int(v) for v in _ring_classes(buffer)[2]]}
