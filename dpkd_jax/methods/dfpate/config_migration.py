"""Saved DF-PATE configs: the format versions, and one migration of every older form to today's.

A run saves its config (`DFPATEConfig.to_json`) in its checkpoints and results.json; a resumed
run compares the saved config with its own after `migrate`, and `DFPATEConfig.from_json` loads
any saved form through it. The forms, oldest first:

  1  flat, no "version"; `validation_examples` at 0 and `secure_noise` at False left out
     (`V1_OMITTED`: the values a run had before the fields existed).
  2  every field written, "version": 2, the library's vocabulary (`V1_RENAMED`:
     teacher_learning_rate, student_learning_rate).

A dict of a newer version than `VERSION` is refused in one line (saved by a newer dpkd-jax).
"""

from __future__ import annotations

from typing import Any, Callable

from dpkd_jax import config_checks

VERSION = 2

# Version 1 left these out at their default (the value a run had before the field existed).
V1_OMITTED: dict[str, Any] = {"validation_examples": 0, "secure_noise": False}

# Fields version 2 renamed to the library's one vocabulary (docs/ARCHITECTURE.md#vocabulary):
# {version-1 name: version-2 name}. The CLI keeps the old names as flag aliases.
V1_RENAMED: dict[str, str] = {"teacher_lr": "teacher_learning_rate",
                              "student_lr": "student_learning_rate"}


def _v1_to_v2(saved: dict[str, Any]) -> dict[str, Any]:
  """Fills the fields version 1 left out and renames `V1_RENAMED`."""
  return {V1_RENAMED.get(name, name): value for name, value in {**V1_OMITTED, **saved}.items()}


# _STEPS[v] upgrades a version-v dict to version v + 1.
_STEPS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


def migrate(saved: dict[str, Any]) -> dict[str, Any]:
  """`saved` (any version) as a version-`VERSION` dict; `saved` itself is left as it is.

  Raises:
    ValueError: not a dict, or a bad or newer version.
  """
  return config_checks.upgrade_saved(saved, what="DF-PATE", current=VERSION, steps=_STEPS)
