"""Saved SRR configs: the format versions, and one migration of every older form to today's.

A run saves its config (`SRRConfig.to_json`) in its checkpoints and results.json; a resumed run
compares the saved config with its own after `migrate`, and `SRRConfig.from_json` loads any
saved form through it. The forms, oldest first:

  1  flat, no "version"; the fields added after workdirs were first saved were left out while
     at their default (`V1_OMITTED`: the value a run had before the field existed).
  2  every field written, "version": 2, the library's vocabulary (`V1_RENAMED`:
     pretrain_learning_rate, student_learning_rate, generator_learning_rate).
  3  the paper's knobs at the top level, the engine's options nested under "engine"
     (`V3_ENGINE_FIELDS`, `options.EngineOptions`), "version": 3.

A dict of a newer version than `VERSION` is refused in one line (saved by a newer dpkd-jax).
"""

from __future__ import annotations

from typing import Any, Callable

from dpkd_jax import config_checks

VERSION = 3

# Version 1 left these out at their default (the value a run had before the field existed).
V1_OMITTED: dict[str, Any] = {"student_replay": False, "query_pool": 1,
                              "student_schedule": "cosine", "validation_examples": 0}

# Fields version 2 renamed to the library's one vocabulary (docs/ARCHITECTURE.md#vocabulary):
# {version-1 name: version-2 name}. The CLI keeps the old names as flag aliases.
V1_RENAMED: dict[str, str] = {"pretrain_lr": "pretrain_learning_rate",
                              "student_lr": "student_learning_rate",
                              "generator_lr": "generator_learning_rate"}


# The engine's options as version 3 nests them (the fields of `EngineOptions` then).
V3_ENGINE_FIELDS = ("student_loss", "student_schedule", "student_shift", "student_replay",
                    "query_pool")


def _v1_to_v2(saved: dict[str, Any]) -> dict[str, Any]:
  """Fills the fields version 1 left out and renames `V1_RENAMED`."""
  return {V1_RENAMED.get(name, name): value for name, value in {**V1_OMITTED, **saved}.items()}


def _v2_to_v3(saved: dict[str, Any]) -> dict[str, Any]:
  """Nests the engine's options under "engine"."""
  missing = [name for name in V3_ENGINE_FIELDS if name not in saved]
  if missing:
    raise ValueError(f"a saved SRR config (version 2) lacks {', '.join(missing)}: not a "
                     "config this library wrote")
  out = {name: value for name, value in saved.items() if name not in V3_ENGINE_FIELDS}
  return {**out, "engine": {name: saved[name] for name in V3_ENGINE_FIELDS}}


# _STEPS[v] upgrades a version-v dict to version v + 1.
_STEPS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}


def migrate(saved: dict[str, Any]) -> dict[str, Any]:
  """`saved` (any version) as a version-`VERSION` dict; `saved` itself is left as it is.

  Raises:
    ValueError: not a dict, or a bad or newer version.
  """
  return config_checks.upgrade_saved(saved, what="SRR", current=VERSION, steps=_STEPS)
