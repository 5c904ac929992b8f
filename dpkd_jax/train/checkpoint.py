"""Orbax checkpoints with a JSON metadata item, a checksum, and a shape check before restoring.

Layout: `<directory>/<step>/{arrays,meta}` managed by `ocp.CheckpointManager` (atomic writes,
`max_to_keep` >= 2 so that a corrupt newest checkpoint leaves an older one to fall back to;
multi-host aware: only the primary process writes). `arrays` is a pytree of arrays (no pickle
anywhere); `meta` is a JSON dict (model name, dataset, shapes, ledger, ...).

Integrity: `save` stores in `meta` a SHA-256 over every array leaf (path, dtype, shape and bytes,
leaves in sorted path order, so container types do not matter), and beside the step a manifest
of its array files' SHA-256. Every restore first checks the files against the manifest, then
recomputes the leaf checksum on the arrays as stored (before any dtype cast), and raises
`CorruptCheckpointError`, a one-line `UserError`, on a mismatch or on any read error of the
step's files: a checkpoint with overwritten bytes is never used silently. Restoring also checks the saved tree paths and leaf
shapes against the caller's target first (`CheckpointMismatchError` names the leaves).
The checksum also covers `meta` (`meta_sha256`, over its canonical JSON): a changed root seed,
config or ledger in `<step>/meta/metadata` is refused like changed array bytes.

Owner-only: a checkpoint holds the run's secret root seed (`meta`) and noise key data (arrays),
so the checkpoint directory is created 0700 before Orbax writes into it (a step is never
visible to another account, not even while being written), and every directory under it is
then set to 0700 and every file to 0600.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from dpkd_jax import errors

PyTree = Any
CHECKSUM_KEY = "_dpkd_checksum"  # in `meta`; stripped from what `restore*` returns
MANIFEST_NAME = "dpkd_files.sha256.json"  # in the step directory, written after the save
META_FILE = os.path.join("meta", "metadata")  # Orbax's file of the JSON item, in the step dir
_MIN_KEPT = 2
DIR_MODE, FILE_MODE = 0o700, 0o600  # the seed and the noise state: owner-only


class CheckpointMismatchError(ValueError):
  """The checkpoint on disk does not fit the model/state it is being restored into."""


class CorruptCheckpointError(errors.UserError):
  """A checkpoint's files cannot be read or do not match the checksum stored at save time."""


class Verified(NamedTuple):
  """A checkpoint read and checked: `arrays` as stored (NumPy, Orbax containers), `meta`."""

  step: int
  arrays: PyTree
  meta: dict[str, Any]


def _manager(directory: str, max_to_keep: int | None = _MIN_KEPT) -> ocp.CheckpointManager:
  # Explicit handlers so that item metadata (shapes) can be read before any restore.
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, create=True,
          file_options=ocp.options.FileOptions(path_permission_mode=DIR_MODE)),
      item_handlers={
          "arrays": ocp.StandardCheckpointHandler(),
          "meta": ocp.JsonCheckpointHandler(),
      },
  )


def _path_str(path: tuple[Any, ...]) -> str:
  """'a/0/mu/w' for a key path; Orbax stores NamedTuples/tuples as dicts/lists, so compare
  the bare names and indices rather than the container types."""
  parts = []
  for k in path:
    for attr in ("key", "idx", "name"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _leaves_by_path(tree: PyTree) -> dict[str, Any]:
  return {_path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def checksum(arrays: PyTree) -> str:
  """SHA-256 hex digest of every leaf's path, dtype, shape and C-order bytes (sorted paths)."""
  digest = hashlib.sha256()
  for path, leaf in sorted(_leaves_by_path(arrays).items()):
    value = np.ascontiguousarray(np.asarray(leaf))
    digest.update(f"{path}\0{value.dtype.str}\0{value.shape}\0".encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def meta_checksum(meta: dict[str, Any]) -> str:
  """SHA-256 hex digest of `meta`'s canonical JSON (sorted keys, no spaces; without the
  checksum entry itself): equal for a dict and its JSON round trip."""
  body = {k: v for k, v in meta.items() if k != CHECKSUM_KEY}
  text = json.dumps(body, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def make_private(directory: str) -> None:
  """`directory` and everything under it owner-only (directories 0700, files 0600)."""
  os.chmod(directory, DIR_MODE)
  for root, dirs, files in os.walk(directory):
    for name in dirs:
      os.chmod(os.path.join(root, name), DIR_MODE)
    for name in files:
      os.chmod(os.path.join(root, name), FILE_MODE)


def private_directory(directory: str) -> None:
  """Creates `directory` owner-only (missing parents get the umask's mode), or makes an
  existing one so, before anything secret is written into it."""
  os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
  os.chmod(directory, DIR_MODE)


def save(directory: str, step: int, arrays: PyTree, metadata: dict[str, Any],
         *, max_to_keep: int | None = _MIN_KEPT) -> str:
  """Saves host `arrays` and JSON `metadata` (plus their checksum) as checkpoint `step`.

  Blocks until written. `max_to_keep` must be None (all) or >= 2: a corrupt newest checkpoint
  must leave one to fall back to. Returns the checksum of the arrays stored.
  """
  if max_to_keep is not None and max_to_keep < _MIN_KEPT:
    raise ValueError(f"max_to_keep must be None or >= {_MIN_KEPT}, got {max_to_keep}")
  arrays = jax.device_get(arrays)
  digest = checksum(arrays)
  body = {k: v for k, v in metadata.items() if k != CHECKSUM_KEY}
  meta = {**body, CHECKSUM_KEY: {"sha256": digest, "meta_sha256": meta_checksum(body)}}
  if jax.process_index() == 0:
    private_directory(os.path.abspath(directory))
  with _manager(directory, max_to_keep) as manager:
    manager.save(
        int(step),
        args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays),
            meta=ocp.args.JsonSave(meta),
        ),
        force=True,
    )
    manager.wait_until_finished()
  if jax.process_index() == 0:
    step_dir = os.path.join(os.path.abspath(directory), str(int(step)))
    _write_manifest(step_dir)
    make_private(step_dir)
  return digest


def sha256_file(path: str) -> str:
  """Hex SHA-256 of the file at `path`, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _file_digests(step_dir: str) -> dict[str, str]:
  """SHA-256 of every file under `<step_dir>/arrays`, by path relative to `step_dir`."""
  digests = {}
  for root, _, files in os.walk(os.path.join(step_dir, "arrays")):
    for name in files:
      path = os.path.join(root, name)
      digests[os.path.relpath(path, step_dir)] = sha256_file(path)
  return digests


def _write_manifest(step_dir: str) -> None:
  # Lets a restore refuse a damaged file before TensorStore reads it: its decoding errors
  # print asynchronous "Event loop is closed" tracebacks that no caller can catch.
  with tempfile.NamedTemporaryFile("w", dir=step_dir, delete=False, suffix=".tmp") as f:
    json.dump(_file_digests(step_dir), f)
    f.flush()
    os.fsync(f.fileno())
  os.replace(f.name, os.path.join(step_dir, MANIFEST_NAME))


def _check_manifest(directory: str, step: int) -> None:
  """Raises CorruptCheckpointError if a file of the step's arrays differs from the manifest
  (no manifest: a crash between the save and its manifest, or an older format; the value
  checksum still applies)."""
  step_dir = os.path.join(os.path.abspath(directory), str(step))
  try:
    with open(os.path.join(step_dir, MANIFEST_NAME), encoding="utf-8") as f:
      expected = json.load(f)
  except FileNotFoundError:
    return
  except (OSError, ValueError) as err:
    raise _corrupt(directory, step, f"unreadable {MANIFEST_NAME}") from err
  actual = _file_digests(step_dir)
  for name in sorted(set(expected) | set(actual)):
    if expected.get(name) != actual.get(name):
      raise _corrupt(directory, step, f"file {name} differs from the one written at save time")


def all_steps(directory: str) -> list[int]:
  """Saved steps in `directory`, oldest first ([] if there are none)."""
  if not os.path.isdir(directory):
    return []
  with _manager(directory) as manager:
    return sorted(manager.all_steps())


def latest_step(directory: str) -> int | None:
  """The newest saved step in `directory`, or None if there is none."""
  steps = all_steps(directory)
  return steps[-1] if steps else None


def _resolve_step(directory: str, step: int | None) -> int:
  steps = all_steps(directory)
  if not steps:
    raise FileNotFoundError(f"no checkpoint found in {os.path.abspath(directory)!r}")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise FileNotFoundError(
        f"checkpoint step {step} not found in {os.path.abspath(directory)!r}; available: {steps}")
  return step


def _corrupt(directory: str, step: int, why: str) -> CorruptCheckpointError:
  where = os.path.join(os.path.abspath(directory), str(step))
  return CorruptCheckpointError(f"checkpoint {where!r} is corrupt ({why})")


def restore_metadata(directory: str, *, step: int | None = None) -> dict[str, Any]:
  """Reads only the JSON metadata of a checkpoint (cheap; used to rebuild the model)."""
  step = _resolve_step(directory, step)
  try:
    with _manager(directory) as manager:
      meta = dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
  except Exception as err:  # pylint: disable=broad-except
    raise _corrupt(directory, step, f"unreadable metadata: {type(err).__name__}") from err
  meta.pop(CHECKSUM_KEY, None)
  return meta


def read_moved_metadata(step_dir: str) -> dict[str, Any]:
  """The JSON metadata of one step directory moved out of its manager (see `quarantine`)."""
  with open(os.path.join(step_dir, "meta", "metadata"), encoding="utf-8") as f:
    meta = json.load(f)
  if not isinstance(meta, dict):
    raise ValueError(f"{step_dir!r}: metadata is not a JSON object")
  meta.pop(CHECKSUM_KEY, None)
  return meta


def read_verified(directory: str, step: int | None = None) -> Verified:
  """Reads checkpoint `step` (default newest) as stored and checks its checksum.

  Raises:
    FileNotFoundError: no checkpoint (or not that step).
    CorruptCheckpointError: a file cannot be read, or the arrays differ from the checksum.
  """
  step = _resolve_step(directory, step)
  _check_manifest(directory, step)
  try:
    with _manager(directory) as manager:
      restored = manager.restore(step, args=ocp.args.Composite(
          arrays=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    arrays, meta = restored["arrays"], dict(restored["meta"])
  except Exception as err:  # pylint: disable=broad-except
    # Whatever a damaged file makes Orbax/TensorStore raise counts as corruption.
    raise _corrupt(directory, step, f"unreadable: {type(err).__name__}") from err
  stored = meta.pop(CHECKSUM_KEY, None)
  if stored is None:  # written before checksums existed: readable, but cannot be verified
    warnings.warn(f"checkpoint {directory!r} step {step} has no checksum (older format): "
                  "its integrity cannot be verified", stacklevel=2)
  elif not isinstance(stored, dict) or stored.get("sha256") != checksum(arrays):
    raise _corrupt(directory, step, "its arrays do not match the checksum written at save time")
  elif "meta_sha256" in stored and stored["meta_sha256"] != meta_checksum(meta):
    # A checkpoint written before the metadata was covered has no entry: its arrays' checksum
    # still applies.
    path = os.path.join(os.path.abspath(directory), str(step), META_FILE)
    raise _corrupt(directory, step, f"{path!r} (root seed, config, ledger) differs from the "
                   "checksum written at save time")
  return Verified(step, arrays, meta)


def _check_shapes(saved: PyTree, target: PyTree, directory: str) -> None:
  """Raises CheckpointMismatchError listing leaves whose path or shape differ."""
  saved_leaves = {p: tuple(np.shape(x)) for p, x in _leaves_by_path(saved).items()}
  target_leaves = {p: tuple(np.shape(x)) for p, x in _leaves_by_path(target).items()}
  problems = []
  for path in sorted(set(saved_leaves) | set(target_leaves)):
    if path not in target_leaves:
      problems.append(f"{path}: in checkpoint {saved_leaves[path]}, not in the model")
    elif path not in saved_leaves:
      problems.append(f"{path}: in the model {target_leaves[path]}, missing from checkpoint")
    elif saved_leaves[path] != target_leaves[path]:
      problems.append(f"{path}: checkpoint shape {saved_leaves[path]} != model shape {target_leaves[path]}")
  if problems:
    shown = "\n  ".join(problems[:10])
    more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
    raise CheckpointMismatchError(
        f"checkpoint {os.path.abspath(directory)!r} does not match the requested model:\n  {shown}{more}")


def into_target(saved: PyTree, target: PyTree, directory: str) -> PyTree:
  """The verified `saved` arrays in the structure, dtypes and placement of `target`.

  Leaves are matched by path; a `jax.Array` (or `ShapeDtypeStruct` with a sharding) target leaf
  gets a device array on the target's sharding, anything else a NumPy array.
  """
  _check_shapes(saved, target, directory)
  by_path = _leaves_by_path(saved)

  def convert(path, leaf):
    value = np.asarray(by_path[_path_str(path)], dtype=np.dtype(leaf.dtype) if hasattr(
        leaf, "dtype") else None)
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) and sharding is not None:
      return jax.device_put(value, sharding)
    return value

  return jax.tree_util.tree_map_with_path(convert, target)


def restore(directory: str, target: PyTree, *, step: int | None = None) -> tuple[PyTree, dict[str, Any]]:
  """Restores (arrays, metadata) into the structure, shapes and dtypes of `target`.

  Args:
    directory: checkpoint directory given to `save`.
    target: a pytree like the saved `arrays` (concrete arrays or `jax.ShapeDtypeStruct`s).
    step: which step; default the latest (no fallback: a corrupt one raises).

  Returns:
    (arrays, metadata).

  Raises:
    FileNotFoundError: no checkpoint (or not that step).
    CorruptCheckpointError: unreadable, or the arrays differ from their checksum.
    CheckpointMismatchError: saved tree paths or shapes differ from `target`.
  """
  verified = read_verified(directory, step)
  return into_target(verified.arrays, target, directory), verified.meta


def quarantine(directory: str, step: int) -> str:
  """Moves checkpoint `step` out of `directory` (into `<directory>.corrupt/`) and returns where.

  Kept for inspection rather than deleted; the run can then save that step again. Only the
  coordinator process moves files; the others just return the destination.
  """
  target_dir = os.path.abspath(directory) + ".corrupt"
  destination = os.path.join(target_dir, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
  if jax.process_index() == 0:
    private_directory(target_dir)  # the moved step still holds the seed
    shutil.move(os.path.join(os.path.abspath(directory), str(step)), destination)
  return destination
