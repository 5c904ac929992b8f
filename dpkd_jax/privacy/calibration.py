"""Calibration: the noise multiplier or the number of steps that meets a target (ε, δ).

Both searches go through `dp_accounting.mechanism_calibration.calibrate_dp_mechanism`, with
`accounting.epsilon` as the accountant (so RR trees are composed correctly, see accounting.py).
A cheap geometric bracket is found first (with RDP where dp-accounting has it: not for Poisson
sampling under replace-one), so the PLD evaluations stay few; each of them is bounded in time
and memory anyway (`pld_grid`), and pure-Gaussian events are closed forms.

The RDP bracket evaluates fractional orders far from the answer, where dp_accounting's series
for a large sampling rate stops after 1000 terms and logs (absl) that it "failed to converge",
then leaves that order out: the bracket stays a valid upper bound, so inside the searches those
lines are dropped (`_quiet_rdp`); a user's own `epsilon(..., accountant="rdp")` still logs them.
"""

import contextlib
import functools
import logging
from typing import Callable

from dp_accounting import dp_event
from dp_accounting import mechanism_calibration
from dp_accounting import privacy_accountant

from dpkd_jax.privacy import accounting
from dpkd_jax.privacy import validation

_MAX_DOUBLINGS = 40  # The geometric bracket search spans 2**±40 of its start.


def _has_rdp(event: dp_event.DpEvent, delta: float) -> bool:
  """Whether the "rdp" accountant can evaluate `event` (not replace-one Poisson sampling)."""
  try:
    accounting.epsilon(event, delta=delta, accountant="rdp")
  except ValueError:
    return False
  return True


class _DropNonConvergence(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return "failed to converge" not in record.getMessage()


@contextlib.contextmanager
def _quiet_rdp_logs():
  """Drops the RDP series' "failed to converge" lines of absl's logger while inside."""
  absl_logger, drop = logging.getLogger("absl"), _DropNonConvergence()
  absl_logger.addFilter(drop)
  try:
    yield
  finally:
    absl_logger.removeFilter(drop)


def _quiet_rdp(search: Callable) -> Callable:
  """`search` with `_quiet_rdp_logs` around it (module docstring)."""

  @functools.wraps(search)
  def quiet(*args, **kwargs):
    with _quiet_rdp_logs():
      return search(*args, **kwargs)

  return quiet


class _EventTreeAccountant(privacy_accountant.PrivacyAccountant):
  """Lets `calibrate_dp_mechanism` evaluate what it composed with `accounting.epsilon`.

  The events are kept as given: the base class's `ledger` is rebuilt by dp_accounting's
  DpEventBuilder, which turns a `TaggedDpEvent` into a plain `SelfComposedDpEvent` and so
  would drop its neighbouring relation (a replace-one DP-SGD event would be evaluated as
  add/remove).
  """

  def __init__(self, accountant: str, interval: float | None):
    # Nominal relation: each event carries its own (neighbouring.py).
    super().__init__(accounting.NeighborRel.ADD_OR_REMOVE_ONE)
    self._accountant, self._interval = accountant, interval
    self._events: list[dp_event.DpEvent] = []

  def _maybe_compose(self, event, count, do_compose):
    if do_compose:
      self._events.append(event if count == 1 else dp_event.SelfComposedDpEvent(event, count))
    return None

  def get_epsilon(self, target_delta: float) -> float:
    return accounting.epsilon(dp_event.ComposedDpEvent(list(self._events)), delta=target_delta,
                              accountant=self._accountant,
                              value_discretization_interval=self._interval)


class CalibrationError(ValueError):
  """A target ε no noise (or no step count) meets: a setting to change, not a bug (the CLIs
  print it as one line)."""


def _bracket_noise(eps_of: Callable[[float], float], target: float,
                   start: float) -> tuple[float, float]:
  """Geometric search for lo < hi with eps_of(lo) > target >= eps_of(hi)."""
  hi = start
  if eps_of(hi) <= target:
    lo = hi / 2
    for _ in range(_MAX_DOUBLINGS):
      if not eps_of(lo) <= target:  # `not <=` also treats NaN as too large.
        return lo, hi
      hi, lo = lo, lo / 2
    raise CalibrationError(f"ε stays <= target_epsilon={target} down to noise {hi}: the "
                           "target is met by any noise (or the event does not depend on it); "
                           "give a smaller target_epsilon or the noise itself")
  for _ in range(_MAX_DOUBLINGS):
    lo, hi = hi, hi * 2
    if eps_of(hi) <= target:
      return lo, hi
  raise CalibrationError(f"target_epsilon={target} is unreachable: even noise {hi} gives "
                         f"ε={eps_of(hi)}; give a larger target_epsilon")


@_quiet_rdp
def calibrate_noise_multiplier(
    make_event: Callable[[float], dp_event.DpEvent], *, target_epsilon: float,
    delta: float, accountant: accounting.AccountantName = "pld",
    value_discretization_interval: float | None = None,
    relative_tolerance: float = 1e-3) -> float:
  """Smallest noise parameter whose run meets (target_epsilon, delta).

  Brackets with cheap RDP (PLD at tiny noise is very slow), then refines with
  `calibrate_dp_mechanism`, which guarantees ε(result) <= target_epsilon.

  Args:
    make_event: noise parameter -> whole-run event; ε must decrease with it.
    target_epsilon: ε target (> 0).
    delta: δ in (0, 1).
    accountant: "pld" or "rdp".
    value_discretization_interval: PLD grid step (None: automatic, see `accounting.epsilon`).
    relative_tolerance: search tolerance relative to the bracket's upper end.

  Returns:
    The noise parameter.
  """
  target = validation.check_float("target_epsilon", target_epsilon, positive=True)
  delta = validation.check_delta(delta)
  accounting.check_accountant(accountant, value_discretization_interval)
  validation.check_float("relative_tolerance", relative_tolerance, positive=True)
  hi = 1.0
  if accountant == "rdp" or _has_rdp(make_event(hi), delta):
    lo, hi = _bracket_noise(
        lambda s: accounting.epsilon(make_event(s), delta=delta, accountant="rdp"),
        target, start=hi)
  if accountant == "pld":  # PLD ε <= RDP ε: RDP's upper end is a good start.
    lo, hi = _bracket_noise(lambda s: accounting.epsilon(
        make_event(s), delta=delta,
        value_discretization_interval=value_discretization_interval),
                            target, start=hi)
  return float(mechanism_calibration.calibrate_dp_mechanism(
      lambda: _EventTreeAccountant(accountant, value_discretization_interval),
      make_event, target, delta,
      bracket_interval=mechanism_calibration.ExplicitBracketInterval(lo, hi),
      tol=relative_tolerance * hi))


@_quiet_rdp
def calibrate_steps(
    make_event: Callable[[int], dp_event.DpEvent], *, target_epsilon: float,
    delta: float, max_steps: int, accountant: accounting.AccountantName = "pld",
    value_discretization_interval: float | None = None) -> int:
  """Largest number of steps T <= max_steps with ε(T) <= target_epsilon.

  Args:
    make_event: steps -> whole-run event; ε must increase with steps.
    target_epsilon: ε target (> 0).
    delta: δ in (0, 1).
    max_steps: upper limit (>= 1).
    accountant: "pld" or "rdp".
    value_discretization_interval: PLD grid step (None: automatic).

  Returns:
    T.
  """
  target = validation.check_float("target_epsilon", target_epsilon, positive=True)
  delta = validation.check_delta(delta)
  max_steps = validation.check_int("max_steps", max_steps, minimum=1)
  accounting.check_accountant(accountant, value_discretization_interval)

  def fits(steps: int, which: str = accountant) -> bool:
    return accounting.epsilon(make_event(steps), delta=delta, accountant=which,
                   value_discretization_interval=(
                       value_discretization_interval)) <= target

  if not fits(1):
    raise CalibrationError(f"target_epsilon={target} is unreachable: one step already "
                           "exceeds it; give a larger target_epsilon")
  # Double with cheap RDP first where it exists; ε_PLD <= ε_RDP, so the RDP
  # answer is a lower end for PLD.
  lo = 1
  if _has_rdp(make_event(1), delta):
    while 2 * lo <= max_steps and fits(2 * lo, "rdp"):
      lo *= 2
  if not fits(lo):
    lo = 1
  while lo < max_steps and fits(min(2 * lo, max_steps)):
    lo = min(2 * lo, max_steps)
  if lo == max_steps:
    return max_steps
  steps = int(mechanism_calibration.calibrate_dp_mechanism(
      lambda: _EventTreeAccountant(accountant, value_discretization_interval),
      make_event, target, delta, discrete=True,
      bracket_interval=mechanism_calibration.ExplicitBracketInterval(
          lo, min(2 * lo, max_steps))))
  # calibrate_dp_mechanism is only within one step of the optimum: settle it.
  while steps > 1 and not fits(steps):
    steps -= 1
  while steps < max_steps and fits(steps + 1):
    steps += 1
  return steps


def calibrate_dpdfd_noise_multiplier(
    *, target_epsilon: float, delta: float, batch_size: int, steps: int,
    num_teachers: int = 1, teachers_per_record: int = 1,
    accountant: accounting.AccountantName = "pld") -> float:
  """σ of DPDFD's Algorithm 1 for (target_epsilon, delta) at fixed B, T >= 1.

  Args:
    target_epsilon, delta, accountant: as in `calibrate_noise_multiplier`.
    batch_size, steps, num_teachers, teachers_per_record: as in `accounting.dpdfd_event`.

  Returns:
    σ (noise std σ·C per coordinate).
  """
  validation.check_int("steps", steps, minimum=1)
  return calibrate_noise_multiplier(
      lambda sigma: accounting.dpdfd_event(noise_multiplier=sigma, batch_size=batch_size,
                                steps=steps, num_teachers=num_teachers,
                                teachers_per_record=teachers_per_record),
      target_epsilon=target_epsilon, delta=delta, accountant=accountant)


def calibrate_dpdfd_steps(
    *, target_epsilon: float, delta: float, noise_multiplier: float,
    batch_size: int, max_steps: int, num_teachers: int = 1, teachers_per_record: int = 1,
    accountant: accounting.AccountantName = "pld") -> int:
  """Most DPDFD steps (<= max_steps) meeting (target_epsilon, delta) at σ.

  Args:
    target_epsilon, delta, max_steps, accountant: as in `calibrate_steps`.
    noise_multiplier, batch_size, num_teachers, teachers_per_record: as in
      `accounting.dpdfd_event`.

  Returns:
    T.
  """
  return calibrate_steps(
      lambda steps: accounting.dpdfd_event(noise_multiplier=noise_multiplier,
                                batch_size=batch_size, steps=steps,
                                num_teachers=num_teachers,
                                teachers_per_record=teachers_per_record),
      target_epsilon=target_epsilon, delta=delta, max_steps=max_steps,
      accountant=accountant)
