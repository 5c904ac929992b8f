"""Orbax checkpoint round trip, metadata, step selection, mismatch errors and checksums."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpkd_jax import errors
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


def _data_files(directory, step):
  """Array data files of checkpoint `step`, largest first (where array bytes live)."""
  root = os.path.join(directory, str(step), "arrays")
  files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
           if os.path.basename(d) == "d"]
  return sorted(files, key=os.path.getsize, reverse=True)


def _overwrite(path, offset, count=8):
  with open(path, "r+b") as f:
    f.seek(offset)
    f.write(b"\xff" * count)


def test_overwritten_array_bytes_are_refused_not_restored(tmp_path):
  # Before checksums, 8 bytes of 0xFF in an array file restored silently (inf/garbage).
  arrays = {"w": jnp.linspace(0.0, 1.0, 4096, dtype=jnp.float32).reshape(64, 64)}
  for offset_fraction in (0.25, 0.5, 0.75):
    directory = str(tmp_path / f"c{offset_fraction}")
    checkpoint.save(directory, 1, arrays, {"m": 1})
    data_file = _data_files(directory, 1)[0]
    _overwrite(data_file, int(os.path.getsize(data_file) * offset_fraction))
    with pytest.raises(checkpoint.CorruptCheckpointError, match=r"1' is corrupt") as err:
      checkpoint.restore(directory, arrays)
    assert isinstance(err.value, errors.UserError) and "\n" not in str(err.value)


def test_value_checksum_catches_what_the_file_manifest_cannot(tmp_path):
  # Without the manifest (a crash right after the save), the leaf checksum still applies.
  arrays = {"w": jnp.linspace(0.0, 1.0, 4096, dtype=jnp.float32).reshape(64, 64)}
  checkpoint.save(str(tmp_path), 1, arrays, {})
  os.remove(tmp_path / "1" / checkpoint.MANIFEST_NAME)
  data_file = _data_files(str(tmp_path), 1)[0]
  _overwrite(data_file, os.path.getsize(data_file) // 2)
  with pytest.raises(checkpoint.CorruptCheckpointError, match="do not match the checksum"):
    checkpoint.restore(str(tmp_path), arrays)


def test_unreadable_metadata_is_corrupt(tmp_path):
  checkpoint.save(str(tmp_path), 3, _arrays(), {"model": "m"})
  _overwrite(os.path.join(tmp_path, "3", "meta", "metadata"), 0)
  with pytest.raises(checkpoint.CorruptCheckpointError, match="unreadable"):
    checkpoint.restore_metadata(str(tmp_path))
  with pytest.raises(checkpoint.CorruptCheckpointError):
    checkpoint.restore(str(tmp_path), _arrays())


def test_checksum_is_stored_hidden_and_independent_of_container_types(tmp_path):
  x, y = jnp.ones((2, 3)), jnp.arange(4)
  assert checkpoint.checksum({"a": (x, y)}) == checkpoint.checksum({"a": [np.asarray(x), y]})
  assert checkpoint.checksum({"a": (x, y)}) != checkpoint.checksum({"a": (x, y + 1)})
  assert checkpoint.checksum({"a": x}) != checkpoint.checksum({"a": x.astype(jnp.int32)})
  digest = checkpoint.save(str(tmp_path), 1, {"a": (x, y)}, {"k": 1})
  assert digest == checkpoint.checksum({"a": (x, y)})
  assert checkpoint.restore_metadata(str(tmp_path)) == {"k": 1}
  verified = checkpoint.read_verified(str(tmp_path))
  assert verified.step == 1 and verified.meta == {"k": 1}


def test_restore_keeps_target_types_and_dtypes(tmp_path):
  arrays = {"j": jnp.ones((2,), jnp.float32), "n": np.arange(3, dtype=np.uint8)}
  checkpoint.save(str(tmp_path), 1, arrays, {})
  restored, _ = checkpoint.restore(str(tmp_path), arrays)
  assert isinstance(restored["j"], jax.Array) and isinstance(restored["n"], np.ndarray)
  assert restored["n"].dtype == np.uint8
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), arrays)
  restored, _ = checkpoint.restore(str(tmp_path), abstract)
  np.testing.assert_array_equal(restored["n"], arrays["n"])


def test_keeps_at_least_two_and_quarantine_moves_a_step(tmp_path):
  with pytest.raises(ValueError, match=">= 2"):
    checkpoint.save(str(tmp_path), 1, _arrays(), {}, max_to_keep=1)
  for step in (1, 2, 3):
    checkpoint.save(str(tmp_path / "c"), step, _arrays(), {"s": step})
  assert checkpoint.all_steps(str(tmp_path / "c")) == [2, 3]
  moved = checkpoint.quarantine(str(tmp_path / "c"), 3)
  assert checkpoint.all_steps(str(tmp_path / "c")) == [2]
  assert checkpoint.read_moved_metadata(moved) == {"s": 3}
  checkpoint.save(str(tmp_path / "c"), 3, _arrays(), {"s": 3})  # the step can be saved again
  assert checkpoint.latest_step(str(tmp_path / "c")) == 3


def _modes(directory):
  """{path relative to `directory`: permission bits} of it and everything under it."""
  found = {".": os.stat(directory).st_mode & 0o777}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      found[os.path.relpath(path, directory)] = os.stat(path).st_mode & 0o777
  return found


def test_checkpoints_holding_the_seed_are_owner_only(tmp_path):
  # Before: 0755 directories and 0644 files, the root seed readable by any local account.
  old = os.umask(0o022)
  try:
    directory = str(tmp_path / "checkpoints")
    for step in (1, 2):
      checkpoint.save(directory, step, _arrays(), {"root_seed": [12345, True]})
    checkpoint.quarantine(directory, 1)
  finally:
    os.umask(old)
  for where in (directory, directory + ".corrupt"):
    modes = _modes(where)
    assert len(modes) > 5  # the step's arrays and metadata files were walked
    for path, mode in modes.items():
      is_dir = os.path.isdir(os.path.join(where, path))
      expected = checkpoint.DIR_MODE if is_dir else checkpoint.FILE_MODE
      assert mode == expected, (path, oct(mode))


def test_a_changed_seed_in_the_metadata_is_refused_naming_the_file(tmp_path):
  # Before: one digit of the stored seed changed was restored silently.
  checkpoint.save(str(tmp_path), 1, _arrays(), {"root_seed": [12345, True], "epoch": 1})
  path = tmp_path / "1" / checkpoint.META_FILE
  text = path.read_text()
  assert "12345" in text
  path.write_text(text.replace("12345", "12346"))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="root seed") as err:
    checkpoint.read_verified(str(tmp_path))
  assert str(path) in str(err.value) and "\n" not in str(err.value)
  path.write_text(text)  # the original bytes read again
  assert checkpoint.read_verified(str(tmp_path)).meta == {"root_seed": [12345, True], "epoch": 1}


def test_metadata_checksum_survives_the_json_round_trip():
  meta = {"a": (1, 2), "b": float("inf"), "c": {"z": 1, "y": [0.1, None]}, "s": "é"}
  assert checkpoint.meta_checksum(meta) == checkpoint.meta_checksum(
      {"s": "é", "c": {"y": [0.1, None], "z": 1}, "b": float("inf"), "a": [1, 2]})
  assert checkpoint.meta_checksum(meta) != checkpoint.meta_checksum({**meta, "a": [1, 3]})
