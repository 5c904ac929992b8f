"""Noise seeds: secret by default, 64 bits, one root key.

A Gaussian or randomized-response release is only private if an observer cannot regenerate
the noise. A run whose noise derives from a public default seed (`--seed 0`) can be undone
by anyone who reads the command: subtract the regenerated noise and the "private" output is
the raw teacher signal. So every method resolves its seed here:

  * `seed=None` (the default everywhere) draws 64 bits from the operating system's entropy
    (`secrets`), which the run stores only in its checkpoint (as secret as the data);
  * an explicit integer in [0, 2**64) is kept for reproducible research runs, and the run's
    results say that its noise is reproducible from a published seed (a documented, opt-in
    weakening).

`root_key(seed)` is the ONE way a seed becomes a key. `jax.random.key(seed)` must not be used
for it: with x64 off it keeps only the low 32 bits (`key(2**40 + 5) == key(5)`), so a 64-bit
secret would shrink to a brute-forceable 32. `root_key` packs all 64 bits into the two words
of a threefry2x32 key; for a seed below 2**32 it equals `jax.random.key(seed)` bit for bit
(threefry's key data of `key(s)` is [0, s]), so explicit-seed runs reproduce exactly.

Multi-host: every process must draw the same noise, so a secret seed is process 0's,
broadcast with JAX's own `multihost_utils` (this package imports nothing else of dpkd_jax).
"""

from __future__ import annotations

import secrets
from typing import NamedTuple

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

# Two 32-bit words: the whole key data of a threefry2x32 key.
SEED_BITS = 64
_WORD = 2**32


class ResolvedSeed(NamedTuple):
  """A run's root seed and where it came from.

  Attributes:
    value: an integer in [0, 2**64) that `root_key` turns into the run's root key (secret
      when `secret` is True).
    secret: True when drawn from OS entropy; False when the user passed it.
  """

  value: int
  secret: bool

  def public_description(self) -> str | int:
    """What results files may show: the seed itself only when the user chose it."""
    return "os-entropy (secret; stored only in the checkpoint)" if self.secret else self.value


def _check_value(seed: int) -> int:
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (
      0 <= seed < 2**SEED_BITS):
    raise ValueError(f"seed must be an integer in [0, 2**{SEED_BITS}) or None, got {seed!r}")
  return int(seed)


def _words(value: int) -> np.ndarray:
  """(2,) uint32 [high, low] words of a 64-bit value: threefry2x32 key data."""
  return np.array([value // _WORD, value % _WORD], np.uint32)


def _from_process_0(value: int) -> int:
  """Process 0's `value` on every process (identity on one host)."""
  if jax.process_count() == 1:
    return value
  # uint32 words: x64 may be off; psum-based broadcast of non-negative words is exact.
  high, low = (int(w) for w in multihost_utils.broadcast_one_to_all(_words(value)))
  return high * _WORD + low


def resolve_seed(seed: int | None) -> ResolvedSeed:
  """The run's root seed: `seed` if given, else 64 fresh bits of OS entropy.

  Args:
    seed: an integer in [0, 2**64) for a reproducible run, or None for a secret seed.

  Returns:
    `ResolvedSeed(value, secret)`; feed it to `root_key`.

  Raises:
    ValueError: `seed` is not an integer in [0, 2**64).
  """
  if seed is None:
    return ResolvedSeed(_from_process_0(secrets.randbits(SEED_BITS)), True)
  return ResolvedSeed(_check_value(seed), False)


def root_key(seed: ResolvedSeed | int) -> jax.Array:
  """The threefry2x32 root key holding all 64 bits of `seed` (key data [high32, low32]).

  Equal to `jax.random.key(s)` for every s < 2**32, whatever the x64 flag.

  Args:
    seed: a `ResolvedSeed` or an integer in [0, 2**64).

  Returns:
    A scalar typed key (`jax.random.key` style).
  """
  value = seed.value if isinstance(seed, ResolvedSeed) else seed
  return jax.random.wrap_key_data(jnp.asarray(_words(_check_value(value))),
                                  impl="threefry2x32")
