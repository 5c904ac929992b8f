"""Noise seeds: secret by default.

A Gaussian or randomized-response release is only private if an observer cannot regenerate
the noise. A run whose noise derives from a public default seed (`--seed 0`) can be undone
by anyone who reads the command: subtract the regenerated noise and the "private" output is
the raw teacher signal. So every method resolves its seed here:

  * `seed=None` (the default everywhere) draws 62 bits from the operating system's entropy
    (`secrets`), which the run stores only in its checkpoint (as secret as the data);
  * an explicit integer is kept for reproducible research runs, and the run's results say
    that its noise is reproducible from a published seed (a documented, opt-in weakening).
"""

from __future__ import annotations

import secrets
from typing import NamedTuple

from dpkd_jax.train import distributed

# Fits in a signed 64-bit integer and in JSON numbers without loss of precision concerns
# for Python readers; 62 bits make guessing hopeless.
SEED_BITS = 62


class ResolvedSeed(NamedTuple):
  """A run's root seed and where it came from.

  Attributes:
    value: the integer that feeds `jax.random.key` (secret when `secret` is True).
    secret: True when drawn from OS entropy; False when the user passed it.
  """

  value: int
  secret: bool

  def public_description(self) -> str | int:
    """What results files may show: the seed itself only when the user chose it."""
    return "os-entropy (secret; stored only in the checkpoint)" if self.secret else self.value


def resolve_seed(seed: int | None) -> ResolvedSeed:
  """The run's root seed: `seed` if given, else 62 fresh bits of OS entropy.

  Args:
    seed: a non-negative integer for a reproducible run, or None for a secret seed.

  Returns:
    `ResolvedSeed(value, secret)`.

  Raises:
    ValueError: `seed` is negative or not an integer.
  """
  if seed is None:
    # Multi-host: every process must draw the same noise, so all take process 0's bits.
    return ResolvedSeed(distributed.broadcast_from_coordinator(secrets.randbits(SEED_BITS)), True)
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
  return ResolvedSeed(int(seed), False)
