"""Mesh helpers on 8 fake CPU devices (see conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.train import sharding


def test_mesh_uses_all_devices():
  mesh = sharding.data_mesh()
  assert mesh.shape[sharding.DATA_AXIS] == len(jax.devices()) == 8


def test_shard_batch_splits_leading_axis_and_replicate_copies():
  mesh = sharding.data_mesh()
  batch = sharding.shard_batch(jnp.arange(16.0).reshape(16, 1), mesh)
  assert len(batch.addressable_shards) == 8
  assert {s.data.shape for s in batch.addressable_shards} == {(2, 1)}
  params = sharding.replicate({"w": jnp.ones((3,))}, mesh)
  assert {s.data.shape for s in params["w"].addressable_shards} == {(3,)}
  # A jitted reduction over the sharded batch gives the single-device answer.
  np.testing.assert_allclose(jax.jit(jnp.sum)(batch), np.arange(16.0).sum())


def test_check_divisible():
  mesh = sharding.data_mesh()
  sharding.check_divisible(64, mesh)
  with pytest.raises(ValueError, match="not divisible by the 8 devices"):
    sharding.check_divisible(12, mesh)
