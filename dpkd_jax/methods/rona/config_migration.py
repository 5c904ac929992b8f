"""Saved RONA configs: the format versions, and one migration of every older form to today's.

A run saves its config (`RONAConfig.to_json`) in its checkpoints and results.json; a resumed
run compares the saved config with its own after `migrate`, and `RONAConfig.from_json` loads
any saved form through it. The forms, oldest first:

  1  flat, no "version"; `validation_examples` left out at 0 (`V1_OMITTED`: the value a run
     had before the field existed).
  2  every field written, "version": 2, the library's vocabulary (`V1_RENAMED`:
     hint_l2_clip_norm, distill_l2_clip_norm).

A dict of a newer version than `VERSION` is refused in one line (saved by a newer dpkd-jax).
"""

from __future__ import annotations

from typing import Any, Callable

from dpkd_jax import config_checks

VERSION = 2

# Version 1 left these out at their default (the value a run had before the field existed).
V1_OMITTED: dict[str, Any] = {"validation_examples": 0}

# Fields version 2 renamed to the library's one vocabulary (docs/ARCHITECTURE.md#vocabulary):
# {version-1 name: version-2 name}. The CLI keeps the old names as flag aliases.
V1_RENAMED: dict[str, str] = {"hint_l2_bound": "hint_l2_clip_norm",
                              "distill_l2_bound": "distill_l2_clip_norm"}


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
  return config_checks.upgrade_saved(saved, what="RONA", current=VERSION, steps=_STEPS)
