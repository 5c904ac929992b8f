"""Tests for dpkd_jax.privacy.seeds: secret-by-default root seeds."""

import pytest

from dpkd_jax.privacy import seeds


def test_none_draws_fresh_secret_seeds():
  drawn = [seeds.resolve_seed(None) for _ in range(4)]
  assert all(s.secret for s in drawn)
  assert len({s.value for s in drawn}) == 4  # 62-bit draws: a collision means no entropy
  assert all(0 <= s.value < 2**seeds.SEED_BITS for s in drawn)
  assert all(str(s.value) not in str(s.public_description()) for s in drawn)


def test_explicit_seed_is_kept_and_public():
  resolved = seeds.resolve_seed(7)
  assert resolved == seeds.ResolvedSeed(7, False)
  assert resolved.public_description() == 7


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_seed_raises(bad):
  with pytest.raises(ValueError, match="seed"):
    seeds.resolve_seed(bad)
