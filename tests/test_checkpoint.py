"""Orbax checkpoint round trip, metadata, step selection and mismatch errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax.train import checkpoint


def _arrays(width=4):
  return {"w": jnp.arange(3 * width, dtype=jnp.float32).reshape(3, width),
          "nested": {"b": jnp.ones((2,), jnp.int32)},
          "key": jax.random.key_data(jax.random.key(7))}


def test_round_trip_arrays_and_metadata(tmp_path):
  arrays = _arrays()
  checkpoint.save(str(tmp_path), 5, arrays, {"model": "m", "epoch": 2})
  restored, meta = checkpoint.restore(str(tmp_path), jax.tree.map(jnp.zeros_like, arrays))
  jax.tree.map(np.testing.assert_array_equal, restored, arrays)
  assert meta == {"model": "m", "epoch": 2}
  assert checkpoint.latest_step(str(tmp_path)) == 5
  assert checkpoint.restore_metadata(str(tmp_path)) == meta


def test_latest_step_and_explicit_step(tmp_path):
  checkpoint.save(str(tmp_path), 1, _arrays(), {"epoch": 1})
  later = jax.tree.map(lambda x: x + 1, _arrays())
  checkpoint.save(str(tmp_path), 2, later, {"epoch": 2})
  restored, meta = checkpoint.restore(str(tmp_path), _arrays())
  assert meta["epoch"] == 2
  np.testing.assert_array_equal(restored["w"], later["w"])
  _, meta1 = checkpoint.restore(str(tmp_path), _arrays(), step=1)
  assert meta1["epoch"] == 1
  with pytest.raises(FileNotFoundError, match="step 9 not found"):
    checkpoint.restore(str(tmp_path), _arrays(), step=9)


def test_missing_directory(tmp_path):
  assert checkpoint.latest_step(str(tmp_path / "nothing")) is None
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    checkpoint.restore(str(tmp_path / "nothing"), _arrays())


def test_shape_mismatch_names_the_leaf(tmp_path):
  checkpoint.save(str(tmp_path), 1, _arrays(width=4), {})
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r"w: checkpoint shape \(3, 4\) != model shape \(3, 5\)"):
    checkpoint.restore(str(tmp_path), _arrays(width=5))


def test_structure_mismatch_names_missing_leaf(tmp_path):
  checkpoint.save(str(tmp_path), 1, _arrays(), {})
  target = dict(_arrays(), extra=jnp.zeros(3))
  with pytest.raises(checkpoint.CheckpointMismatchError, match="extra.*missing from checkpoint"):
    checkpoint.restore(str(tmp_path), target)
