"""Exact discrete Gaussian N_Z(0, σ²) in JAX, with integer arithmetic only.

Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020,
arXiv:2004.00010): Algorithm 1 (Bernoulli(exp(-γ)) for rational γ), Algorithm 2 (discrete
Laplace from Bernoulli and geometric draws) and Algorithm 3 (discrete Gaussian by rejection
from a discrete Laplace proposal). Every quantity is an int32 or uint32; the only source of
randomness is `jax.random.bits` (32 uniform bits), turned into exact uniform integers by
rejection, so no floating-point operation touches the noise (the weakness of float Gaussian
noise that Mironov 2012 exploits for the Laplace mechanism; docs/privacy.md).

σ is an exact positive rational P/Q (`fractions.Fraction`, Q <= `MAX_DENOMINATOR`). The
proposal is a discrete Laplace of scale t = P (>= σ: exact for any t > 0, CKS Algorithm 3 with
t = P instead of floor(σ) + 1 so that σ²/t = P/Q² stays rational with small terms); it is
accepted with probability exp(-(|y| - σ²/t)² / (2σ²)) = exp(-v² / (2c²)), v = |y|Q² - P,
c = P·Q. To keep every product inside int32 the exponent is split into three parts
(a, b = divmod(|v|, c)):

    v² / (2c²) = a²/2 + a·b/c + b²/(2c²),

three independent Bernoulli(exp(-part)) coins whose conjunction has the exact probability;
the last one runs Algorithm 1 with the coin Bernoulli(b/c)² · Bernoulli(1/2) (probability
b²/(2c²), each factor a ratio of small integers).

Range (JAX's x64 is off): the geometric part V of the Laplace proposal is capped at
`MAX_GEOMETRIC` (a larger V is rejected like any other proposal), so draws satisfy
|y| < t·(MAX_GEOMETRIC + 1) = 64·P. The sampler is therefore N_Z(0, σ²) conditioned on
|y| < 64·P (>= 64σ): the excluded mass is at most 2·exp(-2048)/(1 - exp(-64/σ)) <=
2(1 + σ/64)·exp(-2048) < exp(-1900) for every allowed σ (< 2^25), far below anything a float
can hold, and every intermediate stays below 2^31 when 64·P·Q² + P < 2^31 (`check_sigma`
refuses larger σ).
"""

from __future__ import annotations

import fractions
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

MAX_DENOMINATOR = 256
MAX_GEOMETRIC = 63  # V <= 63: |y| < 64·t.
_INT32_MAX = 2**31 - 1


def check_sigma(sigma: fractions.Fraction | int) -> fractions.Fraction:
  """σ as a Fraction P/Q with P, Q small enough for int32 arithmetic, else ValueError."""
  if isinstance(sigma, bool) or not isinstance(sigma, (int, fractions.Fraction)):
    raise TypeError(f"sigma must be an int or a fractions.Fraction, got {sigma!r}")
  sigma = fractions.Fraction(sigma)
  if sigma <= 0:
    raise ValueError(f"sigma must be > 0, got {sigma}")
  p, q = sigma.numerator, sigma.denominator
  if q > MAX_DENOMINATOR:
    raise ValueError(f"sigma's denominator must be <= {MAX_DENOMINATOR}, got {sigma}")
  if (MAX_GEOMETRIC + 1) * p * q * q + p > _INT32_MAX:
    raise ValueError(f"sigma={sigma} is too large for int32 arithmetic: need "
                     f"{MAX_GEOMETRIC + 1}·P·Q² + P < 2^31")
  return sigma


def max_abs_draw(sigma: fractions.Fraction | int) -> int:
  """The largest |y| the sampler can return for σ (the cap of the module docstring)."""
  sigma = check_sigma(sigma)
  return (MAX_GEOMETRIC + 1) * sigma.numerator - 1


# Phases of one lane (one output coordinate). Every phase but START and DONE runs CKS
# Algorithm 1 (K = 1; while coin & Bernoulli(1/K): K += 1; result: K odd) with its own coin.
START = 0  # draw U uniform in [0, t) and the sign bit
KEEP_U = 1  # Bernoulli(exp(-U/t)), coin Bernoulli(U/t); tails: reject the attempt
GEOMETRIC = 2  # V = heads of Bernoulli(exp(-1)) before the first tails (coin 1)
A_WHOLE = 3  # floor(a²/2) coins Bernoulli(exp(-1))
A_REST = 4  # Bernoulli(exp(-(a² mod 2)/2)), coin Bernoulli((a² mod 2)/2)
AB_WHOLE = 5  # floor(a·b/c) coins Bernoulli(exp(-1))
AB_REST = 6  # Bernoulli(exp(-(a·b mod c)/c)), coin Bernoulli((a·b mod c)/c)
B_SQUARED = 7  # Bernoulli(exp(-b²/(2c²))), coin Bernoulli(b/c)²·Bernoulli(1/2)
DONE = 8


class _Lanes(NamedTuple):
  """Per-coordinate state, every field (N,) int32 (or bool)."""

  phase: jax.Array
  k: jax.Array  # Algorithm 1's K of the running coin process
  u: jax.Array  # U of the Laplace proposal
  negative: jax.Array  # its sign bit
  v: jax.Array  # V (GEOMETRIC), then the number of exp(-1) coins passed (A/AB_WHOLE)
  y: jax.Array  # the proposal U + t·V with its sign
  a: jax.Array
  b: jax.Array


def _uniforms(bits: jax.Array, n: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(bits % n, valid): exactly uniform in [0, n) where valid (bits below the largest
  multiple of n that fits in 2^32); n in [1, 2^31), uint32 arithmetic."""
  n = n.astype(jnp.uint32)
  limit = jnp.uint32(0xFFFFFFFF) - (jnp.uint32(0) - n) % n  # 2^32 - (2^32 mod n) - 1
  return (bits % n).astype(jnp.int32), bits <= limit


def _acceptance_parts(y: jax.Array, p: int, q: int) -> tuple[jax.Array, jax.Array]:
  """(a, b) = divmod(|v|, c), v = |y|·q² - p, c = p·q (module docstring)."""
  v = jnp.abs(jnp.abs(y) * (q * q) - p)
  return v // (p * q), v % (p * q)


def _step(lanes: _Lanes, bits: jax.Array, p: int, q: int) -> _Lanes:
  """One coin of every unfinished lane; bits: (4, N) uint32, fresh for this step."""
  t, c = p, p * q
  ph = lanes.phase
  one = jnp.ones_like(ph)
  a_sq, ab = lanes.a * lanes.a, lanes.a * lanes.b
  # The coin of the running process: up to three factors Bernoulli(num_i / den_i).
  den1 = jnp.select([ph == START, ph == KEEP_U, ph == A_REST, ph == AB_REST, ph == B_SQUARED],
                    [t * one, t * one, 2 * one, c * one, c * one], one)
  num1 = jnp.select([ph == KEEP_U, ph == A_REST, ph == AB_REST, ph == B_SQUARED],
                    [lanes.u, a_sq % 2, ab % c, lanes.b], one)
  den2 = jnp.select([ph == START, ph == B_SQUARED], [2 * one, c * one], one)
  num2 = jnp.where(ph == B_SQUARED, lanes.b, one)
  den3 = jnp.where(ph == B_SQUARED, 2 * one, one)
  r1, ok1 = _uniforms(bits[0], den1)
  r2, ok2 = _uniforms(bits[1], den2)
  r3, ok3 = _uniforms(bits[2], den3)
  rk, okk = _uniforms(bits[3], jnp.where(ph == START, one, lanes.k))
  heads = (r1 < num1) & (r2 < num2) & (r3 < 1) & (rk == 0)
  ended = ~heads  # the running process stops; its result is K odd
  result = lanes.k % 2 == 1
  k = jnp.where(heads, lanes.k + 1, 1)

  # Where each phase goes when its process ends (or, for START, at once).
  v_next = lanes.v + 1
  magnitude = lanes.u + t * lanes.v
  y = jnp.where(lanes.negative, -magnitude, magnitude)
  a_new, b_new = _acceptance_parts(y, p, q)
  after_geometric = jnp.where(lanes.negative & (magnitude == 0), START,
                              jnp.where(a_new * a_new // 2 > 0, A_WHOLE, A_REST))
  after_a = jnp.where(ab // c > 0, AB_WHOLE, AB_REST)
  nxt = jnp.select(
      [ph == START, ph == KEEP_U,
       (ph == GEOMETRIC) & result, ph == GEOMETRIC,
       (ph == A_WHOLE) & result & (v_next < a_sq // 2), (ph == A_WHOLE) & result,
       (ph == A_REST) & result,
       (ph == AB_WHOLE) & result & (v_next < ab // c), (ph == AB_WHOLE) & result,
       (ph == AB_REST) & result, (ph == B_SQUARED) & result],
      [KEEP_U * one, jnp.where(result, GEOMETRIC, START),
       jnp.where(v_next > MAX_GEOMETRIC, START, GEOMETRIC), after_geometric,
       A_WHOLE * one, A_REST * one,
       after_a,
       AB_WHOLE * one, AB_REST * one,
       B_SQUARED * one, DONE * one],
      START * one)  # any other ended process: tails, reject the attempt
  phase = jnp.where(ph == START, KEEP_U, jnp.where(ended, nxt, ph))
  v = jnp.select(
      [ph == KEEP_U, ended & (ph == GEOMETRIC) & result, ended & (ph == GEOMETRIC),
       ended & (ph == A_WHOLE) & result & (phase == A_WHOLE),
       ended & (ph == AB_WHOLE) & result & (phase == AB_WHOLE),
       ended & (phase == AB_WHOLE) & (ph != AB_WHOLE)],
      [jnp.zeros_like(ph), v_next, jnp.zeros_like(ph), v_next, v_next, jnp.zeros_like(ph)],
      lanes.v)
  leaving_geometric = ended & (ph == GEOMETRIC) & ~result
  new = _Lanes(
      phase=phase, k=jnp.where(ph == START, 1, k),
      u=jnp.where(ph == START, r1, lanes.u),
      negative=jnp.where(ph == START, r2 == 1, lanes.negative), v=v,
      y=jnp.where(leaving_geometric, y, lanes.y),
      a=jnp.where(leaving_geometric, a_new, lanes.a),
      b=jnp.where(leaving_geometric, b_new, lanes.b))
  # A lane whose uniform fell in the rejected top of 2^32, or that is done, stays as it was.
  valid = ok1 & ok2 & ok3 & okk & (ph != DONE)
  return jax.tree.map(lambda n, o: jnp.where(valid, n, o), new, lanes)


def sample(key: jax.Array, shape: tuple[int, ...],
           sigma: fractions.Fraction | int) -> jax.Array:
  """Independent exact N_Z(0, σ²) draws (conditioned on |y| < 64·P, module docstring).

  All coordinates run CKS Algorithms 1-3 side by side as one state machine in one
  `lax.while_loop` (one coin per coordinate per iteration; nested loops under `vmap` run
  every inner loop to the slowest coordinate and are orders of magnitude slower).

  Args:
    key: a `jax.random.key`; iteration i draws its (4, N) bits from `fold_in(key, i)`.
    shape: the output shape (N = its size).
    sigma: σ = P/Q > 0, an int or a Fraction (static: it shapes the integer arithmetic).

  Returns:
    int32 array of `shape`. Jittable (σ static) and vmappable over `key`.
  """
  sigma = check_sigma(sigma)
  p, q = sigma.numerator, sigma.denominator
  size = math.prod(int(dim) for dim in shape)
  zeros = jnp.zeros((size,), jnp.int32)
  lanes = _Lanes(phase=zeros + START, k=zeros + 1, u=zeros, negative=zeros.astype(bool),
                 v=zeros, y=zeros, a=zeros, b=zeros)

  def body(state):
    i, lanes = state
    bits = jax.random.bits(jax.random.fold_in(key, i), (4, size), jnp.uint32)
    return i + 1, _step(lanes, bits, p, q)

  _, lanes = lax.while_loop(lambda s: jnp.any(s[1].phase != DONE), body, (jnp.int32(0), lanes))
  return lanes.y.reshape(shape)
