"""Generator restarts: leave a generator that has settled where the student cannot follow.

The disagreement generator (`generator_objective="disagreement"`) ascends D(x) = γ‖g̃(x)‖₁,
the student–teacher disagreement the released rows show. Healthy runs keep the windowed mean
of D near its low; in the runs that collapsed (docs/RESULTS.md, "Table 1 over three seeds")
the generator settled on dark speckled textures, D rose to about 1.5× its low and stayed
there while the student's test accuracy fell and never came back.

The rule below reads only the mean released disagreement of each evaluation window: a
function of the mechanism's outputs, with no teacher, no private data and no test data. A
restart draws a fresh generator (and a fresh Adam state for it); the student is kept. So a
restart is post-processing: every release is still charged once, no step is repeated, the
sound ε is that of the run without restarts.

The rule, per window mean w (the first window after the start and after each restart only
sets the scene, since a random generator's samples are not comparable with later ones):
  best := the lowest window mean since the last (re)start, the grace window excluded;
  w > ratio · best counts a strike, anything else resets the strikes (and may lower best);
  `patience` strikes in a row restart the generator, at most `max_restarts` times a run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

# fold_in tag of the restart keys under the run's init key (tags 0, 1: student and generator
# init via split; 2: the sample grid): restart r initialises from fold_in(fold_in(init, 3), r).
RESTART_KEY_TAG = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestartRule:
  """When a generator restarts (see the module docstring).

  Attributes:
    ratio: a window mean above ratio × the best window mean is a strike (> 1).
    patience: strikes in a row that restart the generator (>= 1).
    max_restarts: restarts allowed in one run (>= 1).
  """

  ratio: float
  patience: int
  max_restarts: int

  def __post_init__(self):
    if not (isinstance(self.ratio, (int, float)) and math.isfinite(self.ratio)
            and self.ratio > 1):
      raise ValueError(f"a restart ratio must be a finite number > 1, got {self.ratio!r}")
    for name in ("patience", "max_restarts"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RestartState:
  """What the rule remembers between windows (saved in every checkpoint's metadata).

  Attributes:
    best: the lowest window mean since the last (re)start (inf before the first counted one).
    strikes: windows in a row above ratio × best.
    restarts: restarts so far.
    windows: windows seen since the last (re)start.
    history: (step, window mean, restarted) of every window, for the run's outputs.
  """

  best: float = math.inf
  strikes: int = 0
  restarts: int = 0
  windows: int = 0
  history: tuple[tuple[int, float, bool], ...] = ()

  def to_json(self) -> dict[str, Any]:
    return {"best": None if math.isinf(self.best) else self.best, "strikes": self.strikes,
            "restarts": self.restarts, "windows": self.windows,
            "history": [list(h) for h in self.history]}

  @classmethod
  def from_json(cls, saved: dict[str, Any] | None) -> "RestartState":
    if not saved:
      return cls()
    best = saved.get("best")
    return cls(best=math.inf if best is None else float(best), strikes=int(saved["strikes"]),
               restarts=int(saved["restarts"]), windows=int(saved["windows"]),
               history=tuple((int(s), float(w), bool(r)) for s, w, r in saved["history"]))


def observe(rule: RestartRule, state: RestartState, window_mean: float, *,
            step: int) -> tuple[RestartState, bool]:
  """One window's mean released disagreement -> (new state, restart the generator now?).

  A non-finite mean (a diverged window) counts as a strike; it never becomes the best.
  """
  def logged(new: RestartState, restart: bool) -> RestartState:
    return dataclasses.replace(new, history=state.history + ((step, window_mean, restart),))

  if state.windows == 0:  # the grace window of a fresh generator
    return logged(dataclasses.replace(state, windows=1), False), False
  high = not math.isfinite(window_mean) or window_mean > rule.ratio * state.best
  if not high:
    best = min(state.best, window_mean)
    return logged(dataclasses.replace(state, best=best, strikes=0,
                                      windows=state.windows + 1), False), False
  strikes = state.strikes + 1
  if strikes >= rule.patience and state.restarts < rule.max_restarts:
    fresh = RestartState(restarts=state.restarts + 1)
    return logged(fresh, True), True
  return logged(dataclasses.replace(state, strikes=strikes, windows=state.windows + 1),
                False), False


def restart_key(init_key: jax.Array, restart: int) -> jax.Array:
  """The key that initialises the generator of restart `restart` (1, 2, ...)."""
  return jax.random.fold_in(jax.random.fold_in(init_key, RESTART_KEY_TAG), restart)
