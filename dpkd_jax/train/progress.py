"""The progress bar of every run: compilation shown apart, readable numbers.

The first step of a run (or the first round, stage or epoch) compiles the jitted step, which
takes far longer than a steady step. A tqdm bar started before it would fold that time into its
rate and print an estimate of hours for a run of minutes. `StepBar` therefore prints one line
when it is made ("compiling ..."), and opens the tqdm bar only at the first update: its clock,
rate and ETA start after compilation, and its postfix says how long compilation took.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import tqdm


def readable(value: float) -> str:
  """A number a person can read at a glance: 3 significant digits (0.0123, 4.56, 2.27e+05)."""
  return f"{value:.3g}"


class StepBar:
  """A tqdm bar whose clock starts after the first (compiling) update.

  Same calls as the tqdm bar it wraps: `update(n)`, `set_postfix(...)`, `close()`, and use as
  a context manager.
  """

  def __init__(self, *, total: int, desc: str, initial: int = 0, disable: bool = False,
               unit: str = "it"):
    self._kwargs = dict(total=total, desc=desc, disable=disable, unit=unit)
    self._initial = initial
    self._bar: tqdm.tqdm | None = None
    self._postfix: dict[str, Any] = {}
    self._started = time.monotonic()
    if not disable and initial < total:
      first = "step" if unit == "it" else unit  # tqdm's default unit reads as "it"
      print(f"{desc}: compiling the first {first} (the bar starts after it) ...",
            file=sys.stderr, flush=True)

  def update(self, n: int = 1) -> None:
    if self._bar is None:
      compiled = time.monotonic() - self._started
      self._bar = tqdm.tqdm(initial=self._initial + n, **self._kwargs)
      self._postfix = {"first": f"{compiled:.0f} s", **self._postfix}
      self._bar.set_postfix(self._postfix)
    else:
      self._bar.update(n)

  def set_postfix(self, ordered_dict: dict[str, Any] | None = None, **kwargs: Any) -> None:
    self._postfix = {**({"first": self._postfix["first"]} if "first" in self._postfix else {}),
                     **(ordered_dict or {}), **kwargs}
    if self._bar is not None:
      self._bar.set_postfix(self._postfix)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()

  def __enter__(self) -> "StepBar":
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()
