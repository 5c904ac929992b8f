"""Orbax checkpoints with a JSON metadata item and a shape check before restoring.

Layout: `<directory>/<step>/{arrays,meta}` managed by `ocp.CheckpointManager` (atomic writes,
`max_to_keep`, multi-host aware: only the primary process writes). `arrays` is a pytree of
arrays (no pickle anywhere); `meta` is a JSON dict (model name, dataset, shapes, ledger, ...).
Restoring checks the saved tree structure and leaf shapes against the caller's target first, so a
checkpoint of another model fails with a message naming the mismatching leaves instead of an
Orbax internal error.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any


class CheckpointMismatchError(ValueError):
  """The checkpoint on disk does not fit the model/state it is being restored into."""


def _manager(directory: str, max_to_keep: int | None = 2) -> ocp.CheckpointManager:
  # Explicit handlers so that item metadata (shapes) can be read before any restore.
  return ocp.CheckpointManager(
      os.path.abspath(directory),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
      item_handlers={
          "arrays": ocp.StandardCheckpointHandler(),
          "meta": ocp.JsonCheckpointHandler(),
      },
  )


def save(directory: str, step: int, arrays: PyTree, metadata: dict[str, Any],
         *, max_to_keep: int | None = 2) -> None:
  """Saves `arrays` and JSON `metadata` as checkpoint `step` (blocks until written)."""
  with _manager(directory, max_to_keep) as manager:
    manager.save(
        int(step),
        args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays),
            meta=ocp.args.JsonSave(metadata),
        ),
        force=True,
    )
    manager.wait_until_finished()


def latest_step(directory: str) -> int | None:
  """The newest saved step in `directory`, or None if there is none."""
  if not os.path.isdir(directory):
    return None
  with _manager(directory) as manager:
    return manager.latest_step()


def restore_metadata(directory: str, *, step: int | None = None) -> dict[str, Any]:
  """Reads only the JSON metadata of a checkpoint (cheap; used to rebuild the model)."""
  with _manager(directory) as manager:
    step = _resolve_step(manager, directory, step)
    restored = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])


def _resolve_step(manager: ocp.CheckpointManager, directory: str, step: int | None) -> int:
  steps = manager.all_steps()
  if not steps:
    raise FileNotFoundError(f"no checkpoint found in {os.path.abspath(directory)!r}")
  if step is None:
    return max(steps)
  if step not in steps:
    raise FileNotFoundError(
        f"checkpoint step {step} not found in {os.path.abspath(directory)!r}; available: {sorted(steps)}")
  return step


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


def _check_shapes(saved: PyTree, target: PyTree, directory: str) -> None:
  """Raises CheckpointMismatchError listing leaves whose path or shape differ."""
  saved_leaves = {_path_str(p): tuple(x.shape)
                  for p, x in jax.tree_util.tree_flatten_with_path(saved)[0]}
  target_leaves = {_path_str(p): tuple(np.shape(x))
                   for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
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


def restore(directory: str, target: PyTree, *, step: int | None = None) -> tuple[PyTree, dict[str, Any]]:
  """Restores (arrays, metadata) into the structure, shapes and dtypes of `target`.

  Args:
    directory: checkpoint directory given to `save`.
    target: a pytree like the saved `arrays` (concrete arrays or `jax.ShapeDtypeStruct`s).
    step: which step; default the latest.

  Returns:
    (arrays, metadata).

  Raises:
    FileNotFoundError: no checkpoint (or not that step).
    CheckpointMismatchError: saved tree paths or shapes differ from `target`.
  """
  with _manager(directory) as manager:
    step = _resolve_step(manager, directory, step)
    saved_tree = manager.item_metadata(step)["arrays"]
    saved_tree = getattr(saved_tree, "tree", saved_tree)  # handler metadata wraps the tree
    _check_shapes(saved_tree, target, directory)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            arrays=ocp.args.StandardRestore(abstract),
            meta=ocp.args.JsonRestore(),
        ),
    )
    return restored["arrays"], dict(restored["meta"])
