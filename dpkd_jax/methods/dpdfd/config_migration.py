"""Saved DPDFD configs: the format versions, and one migration of every older form to today's.

A run saves its config (`DPDFDConfig.to_json`) in its checkpoints and results.json; a resumed
run compares the saved config with its own after `migrate`, and `DPDFDConfig.from_json` loads
any saved form through it. The forms, oldest first:

  1  flat: every field at the top level, no "version". A field added after workdirs were first
     saved was left out while at its default (`V1_OMITTED`: the value it had before it existed),
     so that those workdirs resumed. `dataclasses.asdict` of a config of that time is also a
     version-1 form (nothing left out).
  2  the paper's knobs at the top level, the engine's options nested under "engine"
     (`options.EngineOptions`), every field written, and "version": 2; the library's
     vocabulary (`V1_RENAMED`: l2_clip_norm, student_learning_rate, generator_learning_rate).

A dict with "engine" but no "version" is read as version 2. Each step below upgrades one
version to the next and says what it changes; `migrate` chains them. A dict of a newer
version than `VERSION` is refused in one line (saved by a newer dpkd-jax).
"""

from __future__ import annotations

from typing import Any, Callable

from dpkd_jax import config_checks

VERSION = 2

# Version 1 left these out at their default (the value a run had before the field existed).
V1_OMITTED: dict[str, Any] = {
    "param_averaging_decay": 0.0, "diversity_weight": 0.0, "released_balance_weight": 0.0,
    "class_conditional_weight": 0.0, "smoothness_weight": 0.0, "secure_noise": False,
    "secure_grid_bits": None, "validation_examples": 0, "generator_restart_ratio": 0.0,
    "generator_restart_patience": 2, "generator_max_restarts": 2, "replay_size": 0,
    "replay_batch": None, "replay_sampling": "uniform", "replay_memory": "ring",
    "teacher_ensemble_dir": None}

# Fields version 2 renamed to the library's one vocabulary (docs/ARCHITECTURE.md#vocabulary):
# {version-1 name: version-2 name}. The CLI keeps the old names as flag aliases.
V1_RENAMED: dict[str, str] = {"l2_norm_bound": "l2_clip_norm",
                              "student_lr": "student_learning_rate",
                              "generator_lr": "generator_learning_rate"}

# The engine's options as version 2 nests them (the fields of `EngineOptions` then).
V2_ENGINE_FIELDS = (
    "generator_objective", "probe_directions", "probe_step", "diversity_weight",
    "released_balance_weight", "class_conditional_weight", "smoothness_weight",
    "param_averaging_decay", "generator_restart_ratio", "generator_restart_patience",
    "generator_max_restarts", "replay_size", "replay_batch", "replay_sampling",
    "replay_memory")


def _v1_to_v2(saved: dict[str, Any]) -> dict[str, Any]:
  """Fills the fields version 1 left out, renames `V1_RENAMED`, and nests the engine's
  options under "engine"."""
  out = {V1_RENAMED.get(name, name): value for name, value in {**V1_OMITTED, **saved}.items()}
  missing = [name for name in V2_ENGINE_FIELDS if name not in out]
  if missing:
    raise ValueError(f"a saved DPDFD config (version 1) lacks {', '.join(missing)}: not a "
                     "config this library wrote")
  out["engine"] = {name: out.pop(name) for name in V2_ENGINE_FIELDS}
  return out


# _STEPS[v] upgrades a version-v dict to version v + 1.
_STEPS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def migrate(saved: dict[str, Any]) -> dict[str, Any]:
  """`saved` (any version) as a version-`VERSION` dict; `saved` itself is left as it is.

  Raises:
    ValueError: not a dict, a bad or newer version, or a version-1 dict without a field that
      version always wrote.
  """
  # Without "version": version 2 when the engine's options are nested, else version 1.
  return config_checks.upgrade_saved(
      saved, what="DPDFD", current=VERSION, steps=_STEPS,
      unversioned=lambda saved: 2 if isinstance(saved.get("engine"), dict) else 1)
