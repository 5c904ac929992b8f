"""Exact discrete Laplace noise for integer releases (counts, votes), in integer arithmetic.

Why not float Laplace: a float32 Laplace sample added to an integer count leaks the count
through the set of floats it can land on (Mironov, CCS 2012): from a released count of 0 or 1
at ε = 1 the test |o − 1| − |o| > 1 in float32 tells them apart far beyond e^ε. An integer
count plus integer noise drawn exactly from its distribution has no such channel.

Distribution: DLap(t) on the integers, P(x) = tanh(1/(2t)) · exp(−|x| / t), scale t > 0. On
integer values of L1 sensitivity Δ it is pure (a · Δ)-DP with a = 1/t, and dp_accounting's
`DiscreteLaplaceDpEvent(noise_parameter=a, sensitivity=Δ)` prices exactly this pmf
(P(x) ∝ exp(−a|x|)). The scale is an exact rational t = num/den (`rational_scale`), rounded
UP from Δ/ε so that the executed a · Δ never exceeds the asked ε; `noise_parameter` rounds
1/t up to the next float for the event, so the charged ε never falls below the executed one.

Samplers (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy"):
* `bernoulli_exp`: Bernoulli(exp(−γ)) for rational γ = n/d ≥ 0 (Algorithm 1): for γ ≤ 1 draw
  A_K ~ Bernoulli(γ/K), K = 1, 2, ... until the first 0 and return "K odd"; for γ > 1, ⌊γ⌋
  Bernoulli(e^−1) draws that must all be 1, then Bernoulli(exp(−(γ − ⌊γ⌋))). Bernoulli(γ/K)
  is Bernoulli(n/d) AND Bernoulli(1/K) (independent draws), so no product d·K is formed.
* `sample`: DLap(num/den) (Algorithm 2): U uniform on [0, num), accept with probability
  exp(−U/num), V ~ Geometric(1 − e^−1) (count of Bernoulli(e^−1) successes), X = U + num·V,
  Y = ⌊X/den⌋, a fair sign B; reject (B = 1, Y = 0) (else 0 would be counted twice) and return
  (1 − 2B) · Y.
* Uniform integers come from 32 random bits with rejection (`uniform_below`): exactly uniform.
  `jax.random.randint` is biased for a range that is not a power of two (its source says so:
  it reduces twice the needed random bits modulo the range), so it is not used here.

Every loop is a `lax.while_loop` on int32 / uint32 values: jittable, vmappable (vmap runs the
lanes until the slowest is done; `sample` runs all its cells in one loop). Every draw has its
own key: loop iteration i uses `fold_in(key, i)` and each draw in it its own `fold_in` tag.
int32 holds every intermediate unless a geometric draw V exceeds about 2^31 / t (probability
exp(−2^31 / t), below e^−1000 for the largest admitted scale `MAX_SCALE`).

Library check: dp_accounting only accounts; jax_privacy ships no discrete Laplace; OpenDP's
exact samplers run host-side (Rust), outside jit; TensorFlow Privacy's discrete Gaussian is
a TF graph. None samples exactly inside a jitted JAX computation, hence this module.
"""

from __future__ import annotations

import fractions
import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from dpkd_jax.privacy import validation

# The scale's denominator: rounding Δ/ε up to a multiple of 1/1024 costs at most a relative
# ε/(1024 Δ) of the budget (unspent, never overspent).
MAX_DENOMINATOR = 1 << 10
# num = t · den must be a uint32 range for `uniform_below` and keep int32 sums safe.
MAX_SCALE = 1 << 20

# fold_in tags of the draws inside one iteration of a loop.
_TAG_NUMERATOR, _TAG_ONE_OVER_K = 0, 1
_TAG_WHOLE, _TAG_FRACTION = 0, 1


def rational_scale(l1_sensitivity: float, epsilon: float) -> fractions.Fraction:
  """The executed scale t = ⌈(Δ/ε) · 1024⌉ / 1024 >= Δ/ε, an exact rational (reduced).

  Args:
    l1_sensitivity: Δ > 0, an integer (the L1 move of integer counts).
    epsilon: ε > 0, the pure ε one release may cost.

  Returns:
    t with a = 1/t and a · Δ <= ε.
  """
  delta_1 = check_integer_sensitivity(l1_sensitivity)
  epsilon = validation.check_float("epsilon", epsilon, positive=True)
  exact = fractions.Fraction(delta_1) / fractions.Fraction(epsilon)  # float ε is a rational
  scale = fractions.Fraction(math.ceil(exact * MAX_DENOMINATOR), MAX_DENOMINATOR)
  return check_scale(scale)


def check_integer_sensitivity(l1_sensitivity: float) -> int:
  """Δ as a positive int; a float is accepted only when it is a whole number."""
  value = validation.check_float("l1_sensitivity", l1_sensitivity, positive=True)
  if value != math.floor(value):
    raise ValueError(f"l1_sensitivity must be a whole number for integer counts, got "
                     f"{l1_sensitivity!r}")
  return int(value)


def check_scale(scale: fractions.Fraction) -> fractions.Fraction:
  """Refuses a scale that is not a positive Fraction within the int32-safe bounds."""
  if not isinstance(scale, fractions.Fraction) or scale <= 0:
    raise ValueError(f"scale must be a positive fractions.Fraction, got {scale!r}")
  if scale.denominator > MAX_DENOMINATOR or scale > MAX_SCALE:
    raise ValueError(f"scale {scale} is outside the exact sampler's range (denominator <= "
                     f"{MAX_DENOMINATOR}, scale <= {MAX_SCALE}); use a larger epsilon")
  return scale


def noise_parameter(scale: fractions.Fraction) -> float:
  """a = 1/t as a float rounded UP (a larger a charges more ε: never under-reported)."""
  exact = 1 / check_scale(scale)
  value = float(exact)
  return value if fractions.Fraction(value) >= exact else math.nextafter(value, math.inf)


def pure_epsilon(scale: fractions.Fraction, l1_sensitivity: int) -> float:
  """The executed pure ε = Δ / t of one release (rounded up to a float)."""
  exact = check_integer_sensitivity(l1_sensitivity) / check_scale(scale)
  value = float(exact)
  return value if fractions.Fraction(value) >= exact else math.nextafter(value, math.inf)


def uniform_below(key: jax.Array, bound: jax.Array | int) -> jax.Array:
  """Exactly uniform uint32 in [0, bound) for 1 <= bound < 2^32 (traced or static).

  32-bit draws u are accepted when u < 2^32 − (2^32 mod bound), a multiple of `bound`, and
  reduced mod `bound`; each attempt i uses `fold_in(key, i)`. Acceptance >= 1/2 per attempt.
  """
  bound = jnp.asarray(bound, jnp.uint32)
  excess = (jnp.uint32(0) - bound) % bound  # 2^32 mod bound, in uint32 arithmetic

  def draw(attempt):
    return jax.random.bits(jax.random.fold_in(key, attempt), (), jnp.uint32)

  def rejected(state):
    _, u = state
    return (excess != 0) & (u >= jnp.uint32(0) - excess)

  def redraw(state):
    attempt, _ = state
    return attempt + 1, draw(attempt + 1)

  _, u = lax.while_loop(rejected, redraw, (jnp.int32(0), draw(0)))
  return u % bound


def bernoulli_rational(key: jax.Array, numerator: jax.Array | int,
                       denominator: jax.Array | int) -> jax.Array:
  """Bernoulli(n/d) for integers 0 <= n <= d, d >= 1: a uniform on [0, d) below n."""
  return uniform_below(key, denominator) < jnp.asarray(numerator, jnp.uint32)


def _bernoulli_exp_at_most_one(key, numerator, denominator):
  """Bernoulli(exp(−n/d)) for 0 <= n <= d (Algorithm 1, γ <= 1)."""

  def go_on(state):
    return ~state[2]

  def step(state):
    k, count, _ = state  # count = K of Algorithm 1
    draw_key = jax.random.fold_in(key, k)
    a = (bernoulli_rational(jax.random.fold_in(draw_key, _TAG_NUMERATOR), numerator,
                            denominator)
         & (uniform_below(jax.random.fold_in(draw_key, _TAG_ONE_OVER_K), count) == 0))
    return k + 1, count + a.astype(jnp.int32), ~a

  _, count, _ = lax.while_loop(go_on, step, (jnp.int32(0), jnp.int32(1), jnp.bool_(False)))
  return count % 2 == 1


def bernoulli_exp(key: jax.Array, numerator: jax.Array | int,
                  denominator: jax.Array | int) -> jax.Array:
  """Bernoulli(exp(−γ)) for rational γ = n/d >= 0 (integers n >= 0, d >= 1), exactly.

  Args:
    key: a `jax.random.key`.
    numerator: n (int, traced or static).
    denominator: d (int, traced or static).

  Returns:
    () bool.
  """
  numerator = jnp.asarray(numerator, jnp.int32)
  denominator = jnp.asarray(denominator, jnp.int32)
  whole = numerator // denominator
  whole_key = jax.random.fold_in(key, _TAG_WHOLE)

  def go_on(state):
    i, alive = state
    return alive & (i < whole)

  def step(state):  # ⌊γ⌋ Bernoulli(e^−1) draws; the first 0 ends with 0.
    i, _ = state
    return i + 1, _bernoulli_exp_at_most_one(jax.random.fold_in(whole_key, i), 1, 1)

  _, alive = lax.while_loop(go_on, step, (jnp.int32(0), jnp.bool_(True)))
  fraction = _bernoulli_exp_at_most_one(jax.random.fold_in(key, _TAG_FRACTION),
                                        numerator % denominator, denominator)
  return alive & fraction


# Phases of the one-loop form of Algorithm 2 (`_sample_one`).
_DRAW_U, _ACCEPT_U, _GEOMETRIC, _SIGN, _DONE = 0, 1, 2, 3, 4


def _accepted(word, bound):
  """(ok, word mod bound): the rejection step of `uniform_below` on one 32-bit word."""
  bound = jnp.asarray(bound, jnp.uint32)
  excess = (jnp.uint32(0) - bound) % bound
  return (excess == 0) | (word < jnp.uint32(0) - excess), word % bound


def _sample_cells(cell_keys, num: int, den: int):
  """(n,) DLap(num/den) draws, int32: Algorithm 2 with Algorithm 1's loops as phases.

  Nested while loops under vmap run every lane for the product of the nested maxima; one
  loop over phases, on all cells at once, runs for the longest cell's number of steps. Step i
  draws two 32-bit words per cell from `fold_in(fold_in(cell_key, i), 0 | 1)` (i is shared by
  all cells, so a finished cell's unused words never repeat a key); a phase whose uniform draw
  is rejected repeats with the next step's words (rejection keeps every uniform exact).
    _DRAW_U:    U uniform on [0, num).
    _ACCEPT_U:  Bernoulli(exp(−U/num)) as in `_bernoulli_exp_at_most_one`: A_K = [uniform
                on [0, num) < U] AND [uniform on [0, K) = 0]; K += 1 while A_K; accept U iff K
                is odd, else back to _DRAW_U.
    _GEOMETRIC: V += 1 for every Bernoulli(e^−1) success (γ = 1: A_K = [uniform on [0, K)
                = 0]) until the first failure.
    _SIGN:      B from one bit; Y = ⌊(U + num V) / den⌋; (B = 1, Y = 0) goes back to _DRAW_U.
  """
  whole, rest = divmod(num, den)  # num = whole · den + rest
  words = jax.vmap(lambda key, i, tag: jax.random.bits(
      jax.random.fold_in(jax.random.fold_in(key, i), tag), (), jnp.uint32),
                   in_axes=(0, None, None))

  def go_on(state):
    return jnp.any(state[1] != _DONE)

  def step(state):
    i, phase, u, k, v, value = state  # i: (); the rest (n,) int32
    first, second = words(cell_keys, i, 0), words(cell_keys, i, 1)  # (n,) uint32 each
    uniform_ok, uniform = _accepted(first, num)  # uniform on [0, num)
    inverse_ok, inverse = _accepted(second, k)  # uniform on [0, K)
    one = jnp.ones_like(k)
    # _DRAW_U
    drawn = (phase == _DRAW_U) & uniform_ok
    # _ACCEPT_U
    trial = (phase == _ACCEPT_U) & uniform_ok & inverse_ok
    success = (uniform < u.astype(jnp.uint32)) & (inverse == 0)
    accept_next = jnp.where(k % 2 == 1, _GEOMETRIC, _DRAW_U)
    # _GEOMETRIC
    geometric = (phase == _GEOMETRIC) & inverse_ok
    geometric_success = inverse == 0
    # _SIGN: Y = whole V + ⌊U / den⌋ + ⌊(U mod den + rest V) / den⌋ (no product num · V).
    y = whole * v + u // den + (u % den + rest * v) // den
    negative = (first & jnp.uint32(1)) == 1
    signed = phase == _SIGN
    restart = signed & negative & (y == 0)

    new_phase = jnp.select(
        [drawn, trial & ~success, geometric & ~geometric_success & (k % 2 == 0), restart,
         signed],
        [jnp.full_like(phase, _ACCEPT_U), accept_next, jnp.full_like(phase, _SIGN),
         jnp.full_like(phase, _DRAW_U), jnp.full_like(phase, _DONE)], phase)
    new_u = jnp.where(drawn, uniform.astype(jnp.int32), u)
    new_k = jnp.select(
        [drawn, trial & success, trial, geometric & geometric_success, geometric],
        [one, k + 1, one, k + 1, one], k)
    new_v = jnp.select([trial & ~success, geometric & ~geometric_success & (k % 2 == 1)],
                       [jnp.zeros_like(v), v + 1], v)
    new_value = jnp.where(signed & ~restart, jnp.where(negative, -y, y), value)
    return i + 1, new_phase, new_u, new_k, new_v, new_value

  zeros = jnp.zeros(cell_keys.shape, jnp.int32)
  state = (jnp.int32(0), zeros + _DRAW_U, zeros, zeros + 1, zeros, zeros)
  return lax.while_loop(go_on, step, state)[-1]


def sample(key: jax.Array, shape: tuple[int, ...], scale: fractions.Fraction) -> jax.Array:
  """i.i.d. DLap(scale) integers, P(x) ∝ exp(−|x| / scale); cell j uses `fold_in(key, j)`.

  Args:
    key: a `jax.random.key`, used once (split by cell index).
    shape: output shape (the argument order of `jax.random` and `discrete_gaussian.sample`).
    scale: t, an exact rational (`rational_scale`); static.

  Returns:
    int32 array of `shape`.
  """
  scale = check_scale(scale)
  cells = jnp.arange(math.prod(shape), dtype=jnp.uint32)
  cell_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, cells)
  return _sample_cells(cell_keys, scale.numerator, scale.denominator).reshape(shape)


def pmf(values, scale: fractions.Fraction):
  """P(x) = tanh(a/2) exp(−a|x|), a = 1/t, in float64 (for tests and docs)."""
  a = float(1 / check_scale(scale))
  return math.tanh(a / 2.0) * np.exp(-a * np.abs(np.asarray(values, np.float64)))
