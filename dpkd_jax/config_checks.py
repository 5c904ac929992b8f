"""Checks of config fields, shared by every method's `__post_init__` (one place, one wording).

`dpkd_jax.privacy.validation` checks the parameters of mechanisms inside `privacy/` (which
imports nothing else of the library); this module checks the fields of configs and other
user-facing settings outside it (sharing its integer check, one wording). Every failure is a `ValueError` naming the field (the CLIs
turn it into one line and exit 2).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dpkd_jax.privacy import validation


def one_of(name: str, value: Any, known: Collection[Any]) -> None:
  """`value` must be one of `known` (a registry dict, tuple or set)."""
  if value not in known:
    raise ValueError(f"unknown {name} {value!r}; known: {sorted(known)}")


def integer(name: str, value: Any, *, minimum: int) -> int:
  """`value` as a Python int >= minimum (bools and floats refused)."""
  return validation.check_int(name, value, minimum=minimum)


def number(name: str, value: Any, *, positive: bool, allow_inf: bool = False) -> float | None:
  """`value` as a float >= 0 (> 0 if `positive`), finite unless `allow_inf`; None (unchecked)
  for a traced value."""
  return validation.check_float(name, value, positive=positive, allow_inf=allow_inf)


# The magnitudes a float setting may take: its square, its inverse square and their products
# with a step count (noise variances, sensitivities, RDP sums) stay finite in float64, and the
# value itself in float32 (what the steps compute in). Beyond them a value is a typo, not a
# setting (a clip norm of 1e10 emulating "no clipping" is inside).
MAX_MAGNITUDE = 1e30
MIN_MAGNITUDE = 1e-30


def representable(name: str, value: float) -> float:
  """`value` if it is 0, ±inf (each config decides on those), nan (left to the config) or
  of magnitude in [MIN_MAGNITUDE, MAX_MAGNITUDE]; else a ValueError naming `name`."""
  magnitude = abs(value)
  if magnitude == 0 or math.isinf(magnitude) or math.isnan(magnitude) or (
      MIN_MAGNITUDE <= magnitude <= MAX_MAGNITUDE):
    return value
  raise ValueError(f"{name}={value!r} is out of range: a number's magnitude must be 0 or in "
                   f"[{MIN_MAGNITUDE:g}, {MAX_MAGNITUDE:g}]")


def delta(value: Any) -> float:
  """δ as a float in the open interval (0, 1)."""
  return validation.check_delta(value)


def integers(config: Any, *names: str, minimum: int = 1) -> None:
  """Every `config.<name>` an integer >= minimum."""
  for name in names:
    integer(name, getattr(config, name), minimum=minimum)


def positive(config: Any, *names: str) -> None:
  """Every `config.<name>` a finite number > 0 (learning rates, bounds, temperatures)."""
  for name in names:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        value > 0 and math.isfinite(value)):
      raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def non_negative(config: Any, *names: str) -> None:
  """Every `config.<name>` a finite number >= 0 (loss weights, momenta)."""
  for name in names:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
        value >= 0 and math.isfinite(value)):
      raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def fraction(name: str, value: Any, *, open_low: bool = True, open_high: bool = True) -> None:
  """`value` in (0, 1) by default; `open_low=False` admits 0, `open_high=False` admits 1."""
  low_ok = value > 0 or (not open_low and value == 0)
  high_ok = value < 1 or (not open_high and value == 1)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low_ok and high_ok):
    interval = f"{'(' if open_low else '['}0, 1{')' if open_high else ']'}"
    raise ValueError(f"{name} must be in {interval}, got {value!r}")


def seed(value: Any) -> None:
  """A run's seed: None (a secret one is drawn) or an integer in [0, 2**64) (64-bit keys)."""
  if value is not None and integer("seed", value, minimum=0) >= 2**64:
    raise ValueError(f"seed must be < 2**64, got {value}")


def upgrade_saved(saved: Any, *, what: str, current: int,
                  steps: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]],
                  unversioned: Callable[[dict[str, Any]], int] = lambda saved: 1
                  ) -> dict[str, Any]:
  """A saved config of any format version as a version-`current` dict (`saved` is left as it
  is): `steps[v]` upgrades a version-v dict to v + 1; a dict without "version" is of version
  `unversioned(saved)`. `what` names the config in messages (e.g. "DPDFD").

  Raises:
    ValueError: not a dict, a version that is not an integer >= 1, or a newer version.
  """
  if not isinstance(saved, dict):
    raise ValueError(f"a saved {what} config is a JSON object, got {type(saved).__name__}")
  version = saved["version"] if "version" in saved else unversioned(saved)
  if isinstance(version, bool) or not isinstance(version, int) or version < 1:
    raise ValueError(f"a saved {what} config's version must be an integer >= 1, got "
                     f"{version!r}")
  if version > current:
    raise ValueError(f"this {what} config was saved in format version {version} by a newer "
                     f"dpkd-jax; this one reads versions up to {current}: upgrade dpkd-jax")
  out = copy.deepcopy(saved)
  out.pop("version", None)
  for step in range(version, current):
    out = steps[step](out)
  return {"version": current, **out}


def refuse_unknown_fields(what: str, *given: tuple[Mapping[str, Any], type]) -> None:
  """Each (values, dataclass) of a migrated saved config: a name the dataclass lacks is refused
  (a field of a newer or foreign dpkd-jax). `what` names the config (e.g. "DPDFD").

  Raises:
    ValueError: naming every unknown field.
  """
  unknown = sorted({name for values, cls in given
                    for name in set(values) - {f.name for f in dataclasses.fields(cls)}})
  if unknown:
    raise ValueError(f"a saved {what} config holds fields this dpkd-jax does not know: "
                     f"{', '.join(unknown)}")
